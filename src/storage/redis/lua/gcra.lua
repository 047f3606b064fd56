-- GCRA (code 5): src/algorithm/gcra.rs in Lua.
-- state: {tat, remainder}: the theoretical arrival time, tat + remainder / limit ticks;
-- parameter: burst. Rust keeps the TAT in absolute ticks of 1/limit (now × limit passes
-- 2^53); here it is kept relative to now (`ahead`), which is at most burst × window ≤ 2^52.

local gcra = {}

-- How far the TAT is ahead of `now`, in ticks of 1/limit (0: a full bucket).
local function gcra_ahead(state, now, limit)
  if state and state[1] >= now then
    return (state[1] - now) * limit + min(state[2], limit - 1)
  end
  return 0
end

-- How far the TAT is ahead once `consumed` hits are taken from `ahead`: under --count-denied
-- it stops at a full burst ahead (as Rust's min).
local function gcra_ahead_after(ahead, consumed, window, burst, tolerance)
  if consumed > burst then
    return max(ahead, tolerance)
  end
  return min(ahead + consumed * window, max(ahead, tolerance))
end

function gcra.decide(state, now, limit, window, burst, hits, charge)
  if limit == 0 then
    return never(window)
  end
  local ahead = gcra_ahead(state, now, limit)
  local tolerance = burst * window
  local need = max(hits, 1)
  local allowed = need <= burst and ahead + need * window <= tolerance
  local consumed = consumed_by(allowed, charge, hits)
  local new_ahead = gcra_ahead_after(ahead, consumed, window, burst, tolerance)
  local reset_after = div_ceil(new_ahead, limit)
  local new_state = nil
  if consumed > 0 then
    local whole = idiv(new_ahead, limit)
    new_state = { now + whole, new_ahead - whole * limit }
  end
  if allowed then
    return new_state, true, idiv(max(tolerance - new_ahead, 0), window), reset_after, 0
  end
  local retry
  if need > burst then
    retry = never_retry(reset_after, window)
  else
    retry = div_ceil(ahead + need * window - tolerance, limit)
  end
  return new_state, false, 0, reset_after, retry
end

function gcra.give_back(state, at, limit, window, burst, count)
  if limit == 0 or state[1] < at then
    return
  end
  local ahead = (state[1] - at) * limit + state[2]
  if count >= burst then
    ahead = 0
  else
    ahead = max(ahead - count * window, 0)
  end
  local whole = idiv(ahead, limit)
  state[1], state[2] = at + whole, ahead - whole * limit
end

-- A refund (is_negative_hits) gives back as a veto's give-back does, at now.
gcra.refund = gcra.give_back

-- A lease (src/algorithm/leased.rs): up to `want` hits as if they arrived at the end of the
-- next `life` ticks and were admitted now.
-- -> new_state (nil: none taken), granted, remaining, reset_after
function gcra.lease(state, now, limit, window, burst, want, life)
  if limit == 0 then
    return nil, 0, 0, 0
  end
  local ahead = gcra_ahead(state, now, limit)
  local tolerance = burst * window
  local from = max(ahead, life * limit)
  local granted = 0
  if from < tolerance then
    granted = min(want, idiv(tolerance - from, window))
  end
  if granted <= 0 then
    return nil, 0, idiv(max(tolerance - ahead, 0), window), div_ceil(ahead, limit)
  end
  local new_ahead = from + granted * window
  local whole = idiv(new_ahead, limit)
  local new_state = { now + whole, new_ahead - whole * limit }
  return new_state, granted, idiv(max(tolerance - new_ahead, 0), window), div_ceil(new_ahead, limit)
end

-- A lone hit, as decide_one.lua calls it: `gcra.decide` written out, without the general
-- path's tables and calls, which cost Redis a measurable share of the call
-- (docs/performance.md). Returns false when `raw` is not a GCRA state, for the general path
-- to deal with.
function gcra.lone_hit(key, raw, now, limit, window, burst, amount, charge, tick, grace, packed)
  local ahead = 0
  if raw then
    local tat, remainder = read_pair(raw)
    if tat == nil then
      return false
    end
    if tat >= now then
      ahead = (tat - now) * limit + min(remainder, limit - 1)
    end
  end
  local tolerance = burst * window
  -- Compared by hits first: amount × window could pass 2^53.
  if limit == 0 or amount <= 0
      or (charge ~= 1 and not (amount <= burst and ahead + amount * window <= tolerance)) then
    return true
  end
  -- gcra_ahead_after and idiv written out for a hit within the burst: each call costs Redis
  -- more than the arithmetic.
  local new_ahead = ahead + amount * window
  if new_ahead > tolerance then
    new_ahead = gcra_ahead_after(ahead, amount, window, burst, tolerance)
  end
  local whole = (new_ahead - fmod(new_ahead, limit)) / limit
  local tat, remainder = now + whole, new_ahead - whole * limit
  -- Packed, unless ahead by more than a full burst (a denied hit counted under
  -- --count-denied, on a burst lowered or a limit raised since, or hits decided late), which
  -- lasts longer than the expiry given.
  if packed and new_ahead <= tolerance then
    redis_call('SET', key, pack_numbers(PACKED_PAIR, PACKED_TAG, tat, remainder), 'PX', packed)
    return true
  end
  local reset_after = whole
  if whole * limit < new_ahead then
    reset_after = whole + 1
  end
  redis_call('SET', key, string_format('%d %d', tat, remainder),
    'PX', string_format('%d', ttl_ms(reset_after * tick, grace)))
  return true
end

ALGORITHMS[5] = gcra
