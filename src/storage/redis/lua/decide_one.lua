-- Layout DecideOne (src/storage/redis/call/decide_one.rs): one charged hit of any algorithm
-- but the epoch fixed window, alone in its call (a sliding log only up to a limit of 64: its
-- state, this layout's answer, grows with its limit). The state is read, decided on, what
-- the hit consumed written, and the state found answered: tollgate works out the outcome from
-- it with the Rust algorithm and the request rule (the parity tests hold the two to the same
-- answers), so Redis builds no reply and decides nothing twice. A denied lone hit consumes
-- nothing unless counted, whether or not it vetoes. Each algorithm's written-out form of its
-- decision for a lone hit (`lone_hit`; the sliding log's only when it writes packed) decides
-- it there, on the state as stored, and writes what it consumed, keeping the counter's expiry
-- where the one found still holds; the general path below (parse, decide, encode) takes the
-- rest. A sliding window written as counters, or marked, is decided before, in
-- window_counters.lua.
-- KEYS[1]   the counter; written as counters, a sliding window's window counter after it
--           (window_counters.lua).
-- ARGV[1]   packed: algorithm code, now (ticks), limit, window (ticks), parameter (ticks),
--           hits, 1 with --count-denied else 0, tick (µs), grace (ms).
-- ARGV[2]   a bucket's or a sliding log's only, with --redis-state-layout packed: the expiry
--           (ms, as text) its lone hit writes it packed with (state.lua).
-- Returns   the counter's state as found (nil: none): as stored; a sliding window read in
--           both its layouts, their sum as its numbers, or written as counters, its counts
--           (window_counters.lua, decide_counted_window).
local DECIDE_ONE = '<i8i8i8i8i8i8i8i8i8'

local function decide_one(keys, argv)
  if fmod == nil then
    bind_globals()
  end
  local packed = argv[1]
  if packed == nil or #packed ~= 72 then
    return malformed('hit 1')
  end
  local code, now, limit, window, parameter, amount, charge, tick, grace =
    unpack_numbers(DECIDE_ONE, packed)
  local algorithm = ALGORITHMS[code]
  if algorithm == nil or window < 1 or tick < 1 then
    return malformed('hit 1')
  end
  if code == SLIDING_COUNTERS then
    if keys[2] == nil then
      return malformed('hit 1')
    end
    return decide_counted_window(keys, now, limit, window, amount, charge, tick, grace)
  end
  local raw = redis_call('GET', keys[1])
  -- is_marker, written out: a call costs Redis more than the comparisons, on every lone hit.
  if code == SLIDING_TEXT and (raw == MARKER or raw == '') then
    return decide_window(keys[1], nil, now, limit, window, amount, charge, tick, grace)
  end
  local lone_hit = algorithm.lone_hit
  if lone_hit
      and lone_hit(keys[1], raw, now, limit, window, parameter, amount, charge, tick, grace, argv[2])
  then
    return raw
  end
  local state = nil
  if raw then
    state = parse_state(raw)
  end
  local new_state, _, _, reset_after =
    algorithm.decide(state, now, limit, window, parameter, amount, charge == 1)
  if new_state == nil then
    return raw
  end
  redis_call('SET', keys[1], encode_state(new_state), 'PX', ttl_ms(reset_after * tick, grace))
  return raw
end
