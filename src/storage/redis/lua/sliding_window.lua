-- Sliding window counter (code 2): src/algorithm/sliding_window.rs in Lua.
-- state: {window_start, current, previous}; counts are at most the limit, so every product
-- below is at most limit × window.

-- The earliest delay after which `need` hits fit, or nil if never.
local function sliding_window_retry(current, previous, elapsed, limit, window, need)
  if need > limit then
    return nil
  end
  local to_next = window - elapsed
  if current + need <= limit and previous > 0 then
    local room = idiv((limit - current - need) * window, previous)
    local wait = max(to_next - room, 0)
    if wait < to_next then
      return wait
    end
  end
  if current == 0 then
    return to_next
  end
  local room = idiv((limit - need) * window, current)
  local into_next = max(window - room, 0)
  if into_next < window then
    return to_next + into_next
  end
  return to_next + window
end

local sliding_window = {}

-- When the limit is whole again, from `now` in the window that starts at `start`, with
-- `current` counted in it and `previous` in the one before.
local function sliding_window_reset(start, now, window, current, previous)
  if current > 0 then
    return start + 2 * window - now
  elseif previous > 0 then
    return start + window - now
  end
  return 0
end

-- Whether `need` hits fit with `current` counted in the window and `previous` in the one
-- before, `elapsed` ticks into it. Compared by count first: (current + need) × window could
-- pass 2^53.
function sliding_window.admits(current, previous, elapsed, limit, window, need)
  return current + need <= limit and previous * (window - elapsed) + (current + need) * window <= limit * window
end

function sliding_window.decide(state, now, limit, window, _, hits, charge)
  local start = now - fmod(now, window)
  local current, previous = 0, 0
  if state and state[1] >= start then
    start, current, previous = state[1], state[2], state[3]
  elseif state and state[1] + window == start then
    previous = state[2]
  end
  now = max(now, start)
  local elapsed = now - start
  local carried = previous * (window - elapsed)
  local need = max(hits, 1)
  -- sliding_window.admits, written out: a call costs Redis more than the comparison.
  local allowed = current + need <= limit and carried + (current + need) * window <= limit * window
  local consumed = consumed_by(allowed, charge, hits)
  local next_current = min(current + consumed, limit)
  local capacity = idiv(max(limit * window - carried, 0), window)
  local reset_after = sliding_window_reset(start, now, window, next_current, previous)
  local new_state = nil
  if consumed > 0 then
    new_state = { start, next_current, previous }
  end
  if allowed then
    return new_state, true, max(capacity - next_current, 0), reset_after, 0
  end
  local retry = sliding_window_retry(current, previous, elapsed, limit, window, need)
  if retry == nil then
    retry = never_retry(reset_after, window)
  end
  return new_state, false, 0, reset_after, retry
end

function sliding_window.give_back(state, at, _, window, _, count)
  local start = at - fmod(at, window)
  if state[1] == start then
    state[2] = max(state[2] - count, 0)
  elseif state[1] == start + window then
    state[3] = max(state[3] - count, 0)
  end
end

-- A refund (is_negative_hits) gives back as a veto's give-back does, at now.
sliding_window.refund = sliding_window.give_back

-- A lone hit on a window written as text, as decide_one.lua calls it: `sliding_window.decide`
-- written out, without the general path's tables and calls, which cost Redis a measurable
-- share of the call (docs/performance.md). A state written with a count in its window expires
-- two windows after the window's start, then the grace, whoever wrote it, so a hit in the
-- window it found keeps that expiry (KEEPTTL) instead of setting it again (PX). A state
-- without one (a refund took its count back, or a limit of 0 counted a denied hit as 0) was
-- written with a shorter expiry, which the hit must not keep. Returns false when `raw` is not
-- a window's text (the marker is dealt with before), for the general path to deal with.
function sliding_window.lone_hit(key, raw, now, limit, window, _, amount, charge, tick, grace)
  local start = now - fmod(now, window)
  local current, previous, keep = 0, 0, false
  if raw then
    local found_start, found_current, found_previous = string_match(raw, '^(%d+) (%d+) (%d+)$')
    if found_start == nil then
      return false
    end
    found_start = to_number(found_start)
    if found_start >= start then
      start, current, previous = found_start, to_number(found_current), to_number(found_previous)
      keep = current > 0
    elseif found_start + window == start then
      previous = to_number(found_current)
    end
  end
  if amount <= 0 then
    return true
  end
  now = max(now, start)
  local elapsed = now - start
  -- sliding_window.admits, written out.
  if charge ~= 1 and not (current + amount <= limit
      and previous * (window - elapsed) + (current + amount) * window <= limit * window) then
    return true
  end
  local next_current = min(current + amount, limit)
  local text = string_format('%d %d %d', start, next_current, previous)
  if keep then
    redis_call('SET', key, text, 'KEEPTTL')
    return true
  end
  local reset_after = sliding_window_reset(start, now, window, next_current, previous)
  redis_call('SET', key, text, 'PX', string_format('%d', ttl_ms(reset_after * tick, grace)))
  return true
end

ALGORITHMS[2] = sliding_window
