-- Layout Count (src/storage/redis/call/count.rs): hits on fixed windows aligned on the epoch
-- only, any number, a counter possibly named twice. Every counter is read before any is
-- written (one MGET, or one GET each across slots), the request rule (rule.lua) applied, and
-- each changed counter written once, by INCRBY of what the call added (created with its
-- expiry): a call that commits nothing writes nothing.
-- KEYS      the counters, with their windows' numbers appended (all in one slot); none for
--           the cross-slot twin, whose counters follow ARGV[2].
-- ARGV[1]   packed (prelude.lua's `numbers`): 1 with --count-denied else 0, 1 when these are
--           all the hits of the request else 0, n; then 6 per hit: limit, hits, time to live
--           in ms were the counter created now, role (rule.lua), descriptor index, and the
--           number of the hit before it on the same counter (0: none).
-- ARGV[2]   the hits every hit counts, as text, when they all count the same (the usual
--           case: INCRBY takes it as is), else "".
-- Returns   per hit, the count its counter held before the call (MGET's own table, each
--           count a number in place: per counter, a table store and a reply element are a
--           fair part of what this call costs Redis), then committed (1|0).
local PER_COUNT = 6

local function count(keys, argv, declared)
  if fmod == nil then
    bind_globals()
  end
  local packed = argv[1]
  if packed == nil or #packed < 24 then
    return malformed('call')
  end
  local charge, complete, n = unpack_numbers('<i8i8i8', packed)
  if #packed ~= 8 * (3 + PER_COUNT * n) or #keys ~= n then
    return malformed('call')
  end
  local h = numbers(packed, 25, PER_COUNT * n)
  local found
  if declared then
    found = redis.call('MGET', unpack(keys))
  else
    found = {}
    for i = 1, n do
      found[i] = redis.call('GET', keys[i])
    end
  end
  -- Per hit: the count it leaves its counter with, and the first hit on its counter.
  local after, first, allowed, denied, missing = {}, {}, {}, false, nil
  for i = 1, n do
    local at = PER_COUNT * (i - 1)
    local limit, amount, earlier = h[at + 1], h[at + 2], h[at + 6]
    local raw = found[i]
    local held = tonumber(raw or 0)
    if held == nil then
      return malformed('counter ' .. i)
    end
    found[i] = held
    local before = held
    if earlier > 0 then
      before, first[i] = after[earlier], first[earlier]
    else
      first[i] = i
      if not raw then
        missing = missing or {}
        missing[i] = true
      end
    end
    allowed[i] = before + max(amount, 1) <= limit
    if allowed[i] or charge == 1 then
      after[i] = min(before + amount, MAX_COUNT)
    else
      after[i] = before
      denied = true
    end
  end
  if denied and vetoes(h, n, allowed, 0, PER_COUNT, 4, 5, complete == 1) then
    found[n + 1] = 0
    return found
  end
  -- The last hit on each counter writes what the call added to it.
  local superseded = {}
  for i = 1, n do
    local earlier = h[PER_COUNT * (i - 1) + 6]
    if earlier > 0 then
      superseded[earlier] = true
    end
  end
  local amount_text = argv[2]
  for i = 1, n do
    local at = PER_COUNT * (i - 1)
    local added = after[i] - found[i]
    if not superseded[i] and added > 0 then
      local by = amount_text
      if by == '' or added ~= h[at + 2] then
        by = string.format('%d', added)
      end
      redis.call('INCRBY', keys[i], by)
      if missing and missing[first[i]] then
        redis.call('PEXPIRE', keys[i], h[PER_COUNT * (first[i] - 1) + 3])
      end
    end
  end
  found[n + 1] = 1
  return found
end

local function count_declared(keys, argv)
  return count(keys, argv, true)
end

local function count_cross_slot(_, argv)
  return count(keys_from(argv, 3), argv, false)
end
