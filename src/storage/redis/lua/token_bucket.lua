-- Token bucket (code 4): src/algorithm/token_bucket.rs in Lua.
-- state: {level, updated}: the level in units of 1/window token (a token is `window` units,
-- one tick of refill adds `limit` units); parameter: burst. burst × window ≤ 2^52.

local token_bucket = {}

-- The level at `now` and the instant it is kept at (Rust's level_at).
local function bucket_level(state, now, limit, capacity)
  if not state then
    return capacity, now
  end
  -- A product past 2^53 is inexact but far above capacity, so the min is still exact.
  return min(state[1] + max(now - state[2], 0) * limit, capacity), max(state[2], now)
end

function token_bucket.decide(state, now, limit, window, burst, hits, charge)
  if limit == 0 then
    return never(window)
  end
  local capacity = burst * window
  local level, updated = bucket_level(state, now, limit, capacity)
  local need = max(hits, 1)
  -- Compared by hits first: need × window could pass 2^53.
  local allowed = need <= burst and need * window <= level
  local consumed = consumed_by(allowed, charge, hits)
  local level_after = 0
  if consumed <= burst then
    level_after = max(level - consumed * window, 0)
  end
  local reset_after = div_ceil(capacity - level_after, limit)
  local new_state = nil
  if consumed > 0 then
    new_state = { level_after, updated }
  end
  if allowed then
    return new_state, true, idiv(level_after, window), reset_after, 0
  end
  local retry
  if need > burst then
    retry = never_retry(reset_after, window)
  else
    retry = div_ceil(need * window - level, limit)
  end
  return new_state, false, 0, reset_after, retry
end

function token_bucket.give_back(state, _, _, window, burst, count)
  local capacity = burst * window
  if count >= burst then
    state[1] = capacity
  else
    state[1] = min(state[1] + count * window, capacity)
  end
end

-- A refund (is_negative_hits) gives back as a veto's give-back does, at now.
token_bucket.refund = token_bucket.give_back

-- A lease (src/algorithm/leased.rs): up to `want` tokens that the bucket would hand out at
-- every instant of the next `life` ticks, the life's refill held back.
-- -> new_state (nil: none taken), granted, remaining, reset_after
function token_bucket.lease(state, now, limit, window, burst, want, life)
  if limit == 0 then
    return nil, 0, 0, 0
  end
  local capacity = burst * window
  local level, updated = bucket_level(state, now, limit, capacity)
  local usable = min(level, max(capacity - life * limit, 0))
  local granted = min(want, idiv(usable, window))
  if granted <= 0 then
    return nil, 0, idiv(level, window), div_ceil(capacity - level, limit)
  end
  local level_after = usable - granted * window
  return { level_after, updated }, granted, idiv(level_after, window), div_ceil(capacity - level_after, limit)
end

-- A lone hit, as decide_one.lua calls it: `token_bucket.decide` written out, without the
-- general path's tables and calls, which cost Redis a measurable share of the call
-- (docs/performance.md). Returns false when `raw` is not a bucket's state, for the general
-- path to deal with.
function token_bucket.lone_hit(key, raw, now, limit, window, burst, amount, charge, tick, grace,
    packed)
  local capacity = burst * window
  local level, updated = capacity, now
  if raw then
    local found_level, found_updated = read_pair(raw)
    if found_level == nil then
      return false
    end
    level = min(found_level + max(now - found_updated, 0) * limit, capacity)
    updated = max(found_updated, now)
  end
  -- Compared by hits first: amount × window could pass 2^53.
  if limit == 0 or amount <= 0
      or (charge ~= 1 and not (amount <= burst and amount * window <= level)) then
    return true
  end
  local level_after = 0
  if amount <= burst then
    level_after = max(level - amount * window, 0)
  end
  if packed then
    redis_call('SET', key, pack_numbers(PACKED_PAIR, PACKED_TAG, level_after, updated),
      'PX', packed)
    return true
  end
  redis_call('SET', key, string_format('%d %d', level_after, updated),
    'PX', string_format('%d', ttl_ms(div_ceil(capacity - level_after, limit) * tick, grace)))
  return true
end

ALGORITHMS[4] = token_bucket
