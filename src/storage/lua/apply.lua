-- Part 7: the entry point. Decides every hit of one request (or, on a cluster, of the hits of
-- one request that live on one node) atomically, as src/storage/memory.rs does in-process.
--
-- KEYS      the counter of each hit (a counter may appear more than once), all in one slot;
--           or none, for a call across the slots of one node (the allow-cross-slot-keys
--           variant, Redis 7+, sent to the node by address).
-- ARGV[1]   "apply", or "refund": give back hits a committed call consumed, because another
--           group of the same request vetoed it.
-- ARGV[2]   now in µs; "" to take it from Redis TIME (tests pass explicit instants). For
--           "refund", the `now` the committed call returned.
-- ARGV[3]   "1" with --count-denied (denied hits consume too), else "0".
-- ARGV[4]   "1" when these are all the hits of the request, so the whole veto rule applies
--           here; "0" when other calls hold the rest (only an enforced denial vetoes here,
--           the caller refunds when the whole request turns out vetoed).
-- ARGV[5]   n, the number of hits.
-- ARGV[6..] 10 per hit: algorithm (fw|sw|sl|tb|gcra), requests, window µs, tick µs, parameter
--           (anchor, min_interval in ticks, or burst), hits, role (e enforced|q quota|s
--           shadow), descriptor index (a descriptor's hits are adjacent), and for "refund" the
--           two numbers the apply call reported for the counter (else -1 -1).
-- then      when KEYS is empty: the n counters, in hit order.
-- Returns   {now µs, committed (1|0), then 6 per hit: allowed (1|0), remaining,
--           reset_after µs, retry_after µs, and the first two numbers of the counter's state
--           after the call (-1 when it has none), which a refund checks.
-- State     one string per counter, its numbers separated by spaces; expires once the limit
--           is fully available again (PX), an hour later with an explicit clock, which does
--           not run with Redis's.
-- Writes    only after every counter is read: a cross-slot call that finds a counter not on
--           its node fails on the read of that counter (Redis refuses the access), having
--           changed nothing, so the caller can send its hits again one slot at a time.

local ALGORITHMS = {
  fw = fixed_window,
  sw = sliding_window,
  sl = sliding_log,
  tb = token_bucket,
  gcra = gcra,
}

local mode = ARGV[1]
local explicit_clock = ARGV[2] ~= ''
local now
if explicit_clock then
  now = tonumber(ARGV[2])
else
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local charge = ARGV[3] == '1'
local complete = ARGV[4] == '1'

local count = tonumber(ARGV[5])
local keys_in_argv = count ~= nil and #KEYS == 0 and #ARGV == 5 + 11 * count
if count == nil or not (keys_in_argv or (#KEYS == count and #ARGV == 5 + 10 * count)) then
  return redis.error_reply('ERR tollgate: malformed call')
end
local hits = {}
for i = 1, count do
  local base = 5 + (i - 1) * 10
  local key = KEYS[i]
  if keys_in_argv then
    key = ARGV[5 + 10 * count + i]
  end
  local hit = {
    key = key,
    algorithm = ALGORITHMS[ARGV[base + 1]],
    requests = tonumber(ARGV[base + 2]),
    window = tonumber(ARGV[base + 3]),
    tick = tonumber(ARGV[base + 4]),
    parameter = tonumber(ARGV[base + 5]),
    hits = tonumber(ARGV[base + 6]),
    role = ARGV[base + 7],
    descriptor = ARGV[base + 8],
    expect_1 = tonumber(ARGV[base + 9]),
    expect_2 = tonumber(ARGV[base + 10]),
  }
  if hit.algorithm == nil or hit.requests == nil or hit.window == nil or hit.tick == nil
    or hit.tick < 1 or hit.parameter == nil or hit.hits == nil or hit.descriptor == nil then
    return redis.error_reply('ERR tollgate: malformed hit ' .. i)
  end
  hits[i] = hit
end

local function read_state(key)
  local raw = redis.call('GET', key)
  if not raw then
    return false
  end
  local state = {}
  for number in string.gmatch(raw, '%d+') do
    state[#state + 1] = tonumber(number)
  end
  return state
end

local function encode(state)
  local parts = {}
  for i, number in ipairs(state) do
    parts[i] = string.format('%d', number)
  end
  return table.concat(parts, ' ')
end

local function ttl_ms(reset_after)
  local ms = math.max(div_ceil(reset_after, 1000), 1)
  if explicit_clock then
    ms = ms + 3600000
  end
  return ms
end

-- Runs a hit's algorithm in its ticks; times come back in µs (as algorithm::decide).
local function decide(hit, state, at, count)
  local tick = hit.tick
  local window = math.max(idiv(hit.window, tick), 1)
  local new_state, allowed, remaining, reset_after, retry_after =
    hit.algorithm(state or nil, idiv(at, tick), hit.requests, window, hit.parameter, count, charge)
  return {
    state = new_state,
    allowed = allowed,
    remaining = remaining,
    reset_after = reset_after * tick,
    retry_after = retry_after * tick,
  }
end

-- `final` maps a key to its state after the call (false: none).
local function reply(at, committed, decisions, final)
  local out = { at, committed }
  for i, d in ipairs(decisions) do
    local allowed = 0
    if d.allowed then
      allowed = 1
    end
    local state = final[hits[i].key]
    out[#out + 1] = allowed
    out[#out + 1] = d.remaining
    out[#out + 1] = d.reset_after
    out[#out + 1] = d.retry_after
    out[#out + 1] = (state and state[1]) or -1
    out[#out + 1] = (state and state[2]) or -1
  end
  return out
end

-- Gives `count` hits back to a counter's state, in place (the inverse of consuming them at
-- instant `at`, in ticks).
local function give_back(hit, state, at, count)
  local window = math.max(idiv(hit.window, hit.tick), 1)
  local algorithm = hit.algorithm
  if algorithm == fixed_window then
    if state[1] <= at and at < state[1] + window then
      state[2] = math.max(state[2] - count, 0)
    end
  elseif algorithm == sliding_window then
    local start = at - math.fmod(at, window)
    if state[1] == start then
      state[2] = math.max(state[2] - count, 0)
    elseif state[1] == start + window then
      state[3] = math.max(state[3] - count, 0)
    end
  elseif algorithm == sliding_log then
    for i = #state - 1, 1, -2 do
      if state[i] == at then
        state[i + 1] = math.max(state[i + 1] - count, 0)
        if state[i + 1] == 0 then
          table.remove(state, i + 1)
          table.remove(state, i)
        end
        break
      end
    end
  elseif algorithm == token_bucket then
    local capacity = hit.parameter * window
    if count >= hit.parameter then
      state[1] = capacity
    else
      state[1] = math.min(state[1] + count * window, capacity)
    end
  elseif algorithm == gcra then
    if state[1] >= at then
      local ahead = (state[1] - at) * hit.requests + state[2]
      if count >= hit.parameter then
        ahead = 0
      else
        ahead = math.max(ahead - count * window, 0)
      end
      local whole = idiv(ahead, hit.requests)
      state[1], state[2] = at + whole, ahead - whole * hit.requests
    end
  end
end

if mode == 'refund' then
  -- One give-back per counter, of all its hits in the request. A token bucket's or GCRA's
  -- state absorbs consumption into its refill cap or TAT floor once time passes, so giving
  -- back to a state that changed since could hand out hits nobody paid for: those refund only
  -- if the counter is still exactly as the apply call left it (else they under-admit briefly).
  -- Windows and logs record consumption at its instant, so their give-back is exact anyway.
  local totals, order = {}, {}
  for _, hit in ipairs(hits) do
    if totals[hit.key] == nil then
      totals[hit.key] = 0
      order[#order + 1] = hit
    end
    totals[hit.key] = totals[hit.key] + hit.hits
  end
  local final = {}
  for _, hit in ipairs(order) do
    final[hit.key] = read_state(hit.key)
  end
  for _, hit in ipairs(order) do
    local state = final[hit.key]
    local unchanged = state and state[1] == hit.expect_1 and state[2] == hit.expect_2
    local exact = hit.algorithm ~= token_bucket and hit.algorithm ~= gcra
    if state and totals[hit.key] > 0 and (exact or unchanged) then
      give_back(hit, state, idiv(now, hit.tick), totals[hit.key])
      redis.call('SET', hit.key, encode(state), 'KEEPTTL')
    end
  end
  -- Refunded hits report a check on their counter as it now is.
  local decisions = {}
  for i, hit in ipairs(hits) do
    decisions[i] = decide(hit, final[hit.key], now, 0)
  end
  return reply(now, 0, decisions, final)
end

-- Each hit sees the state left by the hits before it (a counter named twice counts twice).
local stored, after, expires, decisions = {}, {}, {}, {}
for i, hit in ipairs(hits) do
  if stored[hit.key] == nil then
    stored[hit.key] = read_state(hit.key)
  end
  local state = after[hit.key]
  if state == nil then
    state = stored[hit.key]
  end
  decisions[i] = decide(hit, state, now, hit.hits)
  if decisions[i].state then
    after[hit.key] = decisions[i].state
    expires[hit.key] = decisions[i].reset_after
  end
end

-- The veto rule of src/storage/mod.rs (rejects): an enforced descriptor over, or, when this is
-- the whole request, every quota descriptor over.
local vetoed = false
if not charge then
  local quota, quota_over = 0, 0
  local i = 1
  while i <= #hits do
    local descriptor, role, over = hits[i].descriptor, hits[i].role, false
    while i <= #hits and hits[i].descriptor == descriptor do
      if not decisions[i].allowed then
        over = true
      end
      i = i + 1
    end
    if role == 'e' and over then
      vetoed = true
    elseif role == 'q' then
      quota = quota + 1
      if over then
        quota_over = quota_over + 1
      end
    end
  end
  if complete and quota > 0 and quota == quota_over then
    vetoed = true
  end
end

if vetoed then
  -- Nothing consumed: allowed hits report a check on their unchanged counters.
  for i, hit in ipairs(hits) do
    if decisions[i].allowed then
      decisions[i] = decide(hit, stored[hit.key], now, 0)
    end
  end
  return reply(now, 0, decisions, stored)
end

local final = {}
for key, state in pairs(stored) do
  final[key] = state
end
for key, state in pairs(after) do
  redis.call('SET', key, encode(state), 'PX', string.format('%d', ttl_ms(expires[key])))
  final[key] = state
end
return reply(now, 1, decisions, final)
