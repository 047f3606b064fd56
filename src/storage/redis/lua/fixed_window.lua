-- Fixed window (code 1): src/algorithm/fixed_window.rs in Lua.
-- state: {window_start, count}; parameter: anchor (0 epoch-aligned, 1 first hit).

local fixed_window = {}

function fixed_window.decide(state, now, limit, window, anchor, hits, charge)
  local start, count
  if state and now < state[1] + window then
    start, count = state[1], state[2]
  else
    if anchor == 0 then
      start = now - fmod(now, window)
    else
      start = now
    end
    count = 0
  end
  local allowed = count + max(hits, 1) <= limit
  local consumed = consumed_by(allowed, charge, hits)
  local new_count = min(count + consumed, MAX_COUNT)
  local reset_after = max(start + window - now, 0)
  local new_state = nil
  if consumed > 0 then
    new_state = { start, new_count }
  end
  if allowed then
    return new_state, true, max(limit - new_count, 0), reset_after, 0
  end
  return new_state, false, 0, reset_after, reset_after
end

function fixed_window.give_back(state, at, _, window, _, count)
  if state[1] <= at and at < state[1] + window then
    state[2] = max(state[2] - count, 0)
    if state[2] == 0 then
      state[1] = 0
    end
  end
end

-- A refund (is_negative_hits) gives back as a veto's give-back does, at now.
fixed_window.refund = fixed_window.give_back

-- A lone hit on a window anchored on its first hit (anchor 1), as decide_one.lua calls it:
-- `fixed_window.decide` written out, without the general path's tables and calls. Within a
-- window the counter's expiry does not move (its window's end, then the grace), so a hit in
-- the window it found keeps it (KEEPTTL) instead of setting it again (PX), which costs Redis
-- a measurable share of the call (docs/performance.md). Returns false for a window aligned on
-- the epoch, or when `raw` is not a window's state, for the general path to deal with.
function fixed_window.lone_hit(key, raw, now, limit, window, anchor, amount, charge, tick, grace)
  if anchor ~= 1 then
    return false
  end
  local start, count = now, 0
  local same = false
  if raw then
    local a, b = string_match(raw, '^(%d+) (%d+)$')
    if a == nil then
      return false
    end
    local found_start = to_number(a)
    if now < found_start + window then
      start, count, same = found_start, to_number(b), true
    end
  end
  if amount > 0 and (count + amount <= limit or charge == 1) then
    local text = string_format('%d %d', start, min(count + amount, MAX_COUNT))
    if same then
      redis_call('SET', key, text, 'KEEPTTL')
    else
      redis_call('SET', key, text, 'PX', string_format('%d', ttl_ms(window * tick, grace)))
    end
  end
  return true
end

ALGORITHMS[1] = fixed_window

-- The same window aligned on the epoch, stored as one integer per window (code 0; the
-- layouts of count_one.lua and count.lua count it by INCRBY): the key names the window, so
-- the state is {count}.
local fixed_count = {}

function fixed_count.decide(state, now, limit, window, _, hits, charge)
  local start = now - fmod(now, window)
  local full = nil
  if state then
    full = { start, state[1] }
  end
  local new_state, allowed, remaining, reset_after, retry_after =
    fixed_window.decide(full, now, limit, window, 0, hits, charge)
  if new_state then
    new_state = { new_state[2] }
  end
  return new_state, allowed, remaining, reset_after, retry_after
end

function fixed_count.give_back(state, _, _, _, _, count)
  state[1] = max(state[1] - count, 0)
end

fixed_count.refund = fixed_count.give_back

ALGORITHMS[0] = fixed_count
