-- The entry point, apply(KEYS, ARGV): the body of the script (EVAL) and of the library's
-- functions (FCALL), which differ only in how they are called. Decides every hit of one
-- request (or, on a cluster, of the hits of one request that live on one node) atomically,
-- as src/storage/memory.rs does in-process.
--
-- One hit alone, applied, skips the general bookkeeping: apply_one (packed arguments, answers
-- the state found), or for a long sliding log apply_one_answered (packed arguments, this
-- answer).
--
-- KEYS      the counter of each hit (a counter may appear more than once), all in one slot;
--           or none, for a call across the slots of one node (the allow-cross-slot-keys
--           variant, Redis 7+, sent to the node by address).
-- ARGV[1]   "apply", or "refund": give back hits a committed call consumed, because another
--           group of the same request vetoed it.
-- ARGV[2]   the instant to decide at, in µs (tollgate's clock). For "refund", the instant of
--           the apply call.
-- ARGV[3]   "1" with --count-denied (denied hits consume too), else "0".
-- ARGV[4]   "1" when these are all the hits of the request, so the whole veto rule applies
--           here; "0" when other calls hold the rest (only an enforced denial vetoes here,
--           the caller refunds when the whole request turns out vetoed).
-- ARGV[5]   n, the number of hits.
-- ARGV[6]   ms to keep counters past the time their limit is fully available again: the
--           grace (src/storage/redis/clock.rs), so that a hit decided before that time and
--           arriving late still finds the counter; an hour with an explicit clock, which does
--           not run with Redis's.
-- ARGV[7..] 10 per hit: algorithm (its key tag, a key of ALGORITHMS), requests, window µs,
--           tick µs, parameter (Algorithm::parameter_in_ticks), hits, role (e enforced|q
--           quota|s shadow), descriptor index (a descriptor's hits are adjacent), and for
--           "refund" of an algorithm that refunds only an unchanged counter
--           (Refund::IfUnchanged) the two numbers the apply call reported for the counter;
--           otherwise "" "" (refund whatever happened since).
-- then      when KEYS is empty: the n counters, in hit order.
-- Returns   {now µs, committed (1|0), then 6 per hit: allowed (1|0), remaining (when denied:
--           the room found),
--           reset_after µs, retry_after µs, and the first two numbers of the counter's state
--           after the call (-1 when it has none), which a refund checks.
-- State     one string per counter, its numbers separated by spaces (a fixed window aligned on
--           the epoch: one integer per window, see counter.lua); expires once the limit is
--           fully available again (PX), plus ARGV[6].
-- Writes    only after every counter is read: a cross-slot call that finds a counter not on
--           its node fails on the read of that counter (Redis refuses the access), having
--           changed nothing, so the caller can send its hits again one slot at a time.

-- A state is its numbers separated by spaces; FORMATS[n] writes the usual short ones in one
-- call (a sliding log's can hold thousands: more than one call can take).
local FORMATS = { '%d', '%d %d', '%d %d %d' }

-- The usual states, two or three numbers, are taken apart by one match each; a sliding log's
-- number by number.
local function parse_state(raw)
  local a, b = string.match(raw, '^(%d+) (%d+)$')
  if a then
    return { tonumber(a), tonumber(b) }
  end
  local c
  a, b, c = string.match(raw, '^(%d+) (%d+) (%d+)$')
  if a then
    return { tonumber(a), tonumber(b), tonumber(c) }
  end
  local state = {}
  for number in string.gmatch(raw, '%d+') do
    state[#state + 1] = tonumber(number)
  end
  return state
end

local function read_state(key)
  local raw = redis.call('GET', key)
  if not raw then
    return false
  end
  return parse_state(raw)
end

local function encode(state)
  local format = FORMATS[#state]
  if format then
    return string.format(format, state[1], state[2], state[3]) -- extra arguments are ignored
  end
  local parts = {}
  for i, number in ipairs(state) do
    parts[i] = string.format('%d', number)
  end
  return table.concat(parts, ' ')
end


-- One hit alone, the common call (a long sliding log excepted: tollgate sends it the general
-- way): its numbers packed into one argument, in the algorithm's ticks, and the reply is the
-- state the call found, from which tollgate works out the outcome with the Rust algorithm
-- itself (src/storage/redis/found.rs; the parity tests hold the two to the same answers).
-- Redis only reads, decides whether to write, and writes: the general reply and a second
-- decision for a denied hit's room were about a fifth of what the call cost it.
-- ARGV      tag, then 8 numbers packed into one argument (prelude.lua): now (ticks),
--           limit, window (ticks), parameter (ticks), hits, 1 with --count-denied (else 0),
--           tick (µs), ms to keep the counter past its reset (as ARGV[6]).
-- Returns   the counter's state as found (nil: none). A denied hit consumes nothing unless
--           counted (so nothing is written); whether it vetoes is tollgate's to say.
local ONE_HIT = '<i8i8i8i8i8i8i8i8'
local function apply_one(key, algorithm, packed)
  local now, limit, window, parameter, amount, charge, tick, slack =
    unpack_numbers(ONE_HIT, packed)
  if window < 1 or tick < 1 then
    return redis.error_reply('ERR tollgate: malformed hit 1')
  end
  local raw = redis.call('GET', key)
  local state = nil
  if raw then
    state = parse_state(raw)
  end
  local new_state, _, _, reset_after =
    algorithm.decide(state, now, limit, window, parameter, amount, charge == 1)
  if new_state then
    local ttl = max(div_ceil(reset_after * tick, 1000), 1) + slack
    redis.call('SET', key, encode(new_state), 'PX', ttl)
  end
  return raw
end

-- One hit alone of a long sliding log (its state, what apply_one answers, would be longer
-- than this answer): decided and answered here, as apply does, without apply's per-hit tables
-- or veto bookkeeping (a single hit is vetoed only when denied, and then consumes nothing
-- anyway).
-- ARGV      tag, then 10 numbers packed into one argument (prelude.lua): now (µs), limit,
--           window (µs), tick (µs), parameter (ticks), hits, 1 with --count-denied (else 0),
--           1 when this is the whole request (else 0), role (ROLE_TAGS), ms to keep the
--           counter past its reset (as ARGV[6]).
-- Returns   apply's answer for one hit.
local ANSWERED_HIT = '<i8i8i8i8i8i8i8i8i8i8'
local function apply_one_answered(key, algorithm, packed)
  local now, limit, window_us, tick, parameter, amount, charge_flag, complete_flag, role_code,
    slack = unpack_numbers(ANSWERED_HIT, packed)
  local role = ROLE_TAGS[role_code]
  if tick < 1 or role == nil then
    return redis.error_reply('ERR tollgate: malformed hit 1')
  end
  local charge, complete = charge_flag == 1, complete_flag == 1
  local window = max(idiv(window_us, tick), 1)
  local at = idiv(now, tick)
  local state = read_state(key) or nil
  local new_state, allowed, remaining, reset_after, retry_after =
    algorithm.decide(state, at, limit, window, parameter, amount, charge)
  if not allowed and amount > 0 then
    local _, _, room = algorithm.decide(state, at, limit, window, parameter, 0, charge)
    remaining = room
  end
  local committed = 1
  if not allowed and not charge and (role == 'e' or (role == 'q' and complete)) then
    committed = 0
  elseif new_state then
    local ttl = max(div_ceil(reset_after * tick, 1000), 1) + slack
    redis.call('SET', key, encode(new_state), 'PX', ttl)
    state = new_state
  end
  local ok = 0
  if allowed then
    ok = 1
  end
  return { now, committed, ok, remaining, reset_after * tick, retry_after * tick,
    (state and state[1]) or -1, (state and state[2]) or -1 }
end

local function apply(KEYS, ARGV)
  if fmod == nil then
    bind_globals()
  end
  if #ARGV == 2 and #KEYS == 1 then
    -- One hit alone: its numbers packed, 8 for apply_one, 10 for a long sliding log.
    local algorithm = ALGORITHMS[ARGV[1]]
    if algorithm == nil then
      return redis.error_reply('ERR tollgate: unknown algorithm ' .. tostring(ARGV[1]) .. ' in hit 1')
    end
    if #ARGV[2] == 64 then
      return apply_one(KEYS[1], algorithm, ARGV[2])
    elseif #ARGV[2] == 80 then
      return apply_one_answered(KEYS[1], algorithm, ARGV[2])
    end
    return redis.error_reply('ERR tollgate: malformed hit 1')
  end
  local mode = ARGV[1]
  local now = tonumber(ARGV[2])
  local slack = tonumber(ARGV[6])
  local charge = ARGV[3] == '1'
  local complete = ARGV[4] == '1'

  local count = tonumber(ARGV[5])
  local keys_in_argv = count ~= nil and #KEYS == 0 and #ARGV == 6 + 11 * count
  if now == nil or slack == nil or count == nil
    or not (keys_in_argv or (#KEYS == count and #ARGV == 6 + 10 * count)) then
    return redis.error_reply('ERR tollgate: malformed call')
  end

  -- The hits, one array per field (cheaper in Lua than a table per hit).
  local keys, algorithms, requests, windows, ticks, parameters, amounts = {}, {}, {}, {}, {}, {}, {}
  local key_base = 0
  if keys_in_argv then
    key_base = 6 + 10 * count
  end
  for i = 1, count do
    local base = 6 + (i - 1) * 10
    if keys_in_argv then
      keys[i] = ARGV[key_base + i]
    else
      keys[i] = KEYS[i]
    end
    algorithms[i] = ALGORITHMS[ARGV[base + 1]]
    if algorithms[i] == nil then
      return redis.error_reply('ERR tollgate: unknown algorithm ' .. tostring(ARGV[base + 1]) .. ' in hit ' .. i)
    end
    requests[i] = tonumber(ARGV[base + 2])
    windows[i] = tonumber(ARGV[base + 3])
    ticks[i] = tonumber(ARGV[base + 4])
    parameters[i] = tonumber(ARGV[base + 5])
    amounts[i] = tonumber(ARGV[base + 6])
    if requests[i] == nil or windows[i] == nil or ticks[i] == nil
      or ticks[i] < 1 or parameters[i] == nil or amounts[i] == nil or ARGV[base + 8] == nil then
      return redis.error_reply('ERR tollgate: malformed hit ' .. i)
    end
  end

  local function ttl_ms(reset_after)
    return max(div_ceil(reset_after, 1000), 1) + slack
  end

  -- Runs hit i's algorithm in its ticks: new state, allowed, remaining, reset_after µs,
  -- retry_after µs (as algorithm::decide: a denied call's remaining is the room it found,
  -- what a check finds now).
  local function decide_hit(i, state, at, hits)
    local tick = ticks[i]
    local window = max(idiv(windows[i], tick), 1)
    local algorithm = algorithms[i]
    local now_ticks = idiv(at, tick)
    local new_state, allowed, remaining, reset_after, retry_after =
      algorithm.decide(state or nil, now_ticks, requests[i], window, parameters[i], hits, charge)
    if not allowed and hits > 0 then
      local _, _, room = algorithm.decide(state or nil, now_ticks, requests[i], window, parameters[i], 0, charge)
      remaining = room
    end
    return new_state, allowed, remaining, reset_after * tick, retry_after * tick
  end

  -- The reply: 2 + 6 per hit; `out` holds the decisions, `state_of(key)` the counter's state
  -- after the call (false: none).
  local out = { now, 0 }
  local function record(i, allowed, remaining, reset_after, retry_after)
    local base = 2 + (i - 1) * 6
    if allowed then
      out[base + 1] = 1
    else
      out[base + 1] = 0
    end
    out[base + 2] = remaining
    out[base + 3] = reset_after
    out[base + 4] = retry_after
  end
  local function finish(final)
    for i = 1, count do
      local state = final[keys[i]]
      local base = 2 + (i - 1) * 6
      out[base + 5] = (state and state[1]) or -1
      out[base + 6] = (state and state[2]) or -1
    end
    return out
  end

  -- Gives `count` hits back to a counter's state, in place (the inverse of consuming them at
  -- instant `at`, in µs).
  local function give_back(i, state, at, count)
    local window = max(idiv(windows[i], ticks[i]), 1)
    algorithms[i].give_back(state, idiv(at, ticks[i]), requests[i], window, parameters[i], count)
  end

  if mode == 'refund' then
    -- One give-back per counter, of all its hits in the request, under the algorithm's refund
    -- rule (Refund in src/algorithm/mod.rs): a counter sent with the two numbers the apply call
    -- left takes its refund only if it still holds them (compare and set); one sent with ""
    -- takes it whatever happened since.
    local totals, order = {}, {}
    for i = 1, count do
      local key = keys[i]
      if totals[key] == nil then
        totals[key] = 0
        order[#order + 1] = i
      end
      totals[key] = totals[key] + amounts[i]
    end
    local final = {}
    for _, i in ipairs(order) do
      final[keys[i]] = read_state(keys[i])
    end
    for _, i in ipairs(order) do
      local key = keys[i]
      local state = final[key]
      local base = 6 + (i - 1) * 10
      local first, second = ARGV[base + 9], ARGV[base + 10]
      local unconditional = first == '' and second == ''
      local unchanged = state and state[1] == tonumber(first) and state[2] == tonumber(second)
      if state and totals[key] > 0 and (unconditional or unchanged) then
        give_back(i, state, now, totals[key])
        redis.call('SET', key, encode(state), 'KEEPTTL')
      end
    end
    -- Refunded hits report a check on their counter as it now is.
    for i = 1, count do
      local _, allowed, remaining, reset_after, retry_after = decide_hit(i, final[keys[i]], now, 0)
      record(i, allowed, remaining, reset_after, retry_after)
    end
    return finish(final)
  end

  -- Each hit sees the state left by the hits before it (a counter named twice counts twice).
  local stored, after, expires, allowed = {}, {}, {}, {}
  for i = 1, count do
    local key = keys[i]
    local state = after[key]
    if state == nil then
      state = stored[key]
      if state == nil then
        state = read_state(key)
        stored[key] = state
      end
    end
    local new_state, ok, remaining, reset_after, retry_after = decide_hit(i, state, now, amounts[i])
    allowed[i] = ok
    record(i, ok, remaining, reset_after, retry_after)
    if new_state then
      after[key] = new_state
      expires[key] = reset_after
    end
  end

  -- The veto rule (prelude.lua), with --count-denied off.
  local vetoed = not charge and vetoes(ARGV, count, allowed, 6, 10, 7, 8, complete)

  if vetoed then
    -- Nothing consumed: allowed hits report a check on their unchanged counters.
    for i = 1, count do
      if allowed[i] then
        local _, ok, remaining, reset_after, retry_after = decide_hit(i, stored[keys[i]], now, 0)
        record(i, ok, remaining, reset_after, retry_after)
      end
    end
    return finish(stored)
  end

  for key, state in pairs(after) do
    redis.call('SET', key, encode(state), 'PX', ttl_ms(expires[key]))
    stored[key] = state
  end
  out[2] = 1
  return finish(stored)
end
