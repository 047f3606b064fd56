-- The counter entry point, count(KEYS, ARGV): calls whose every hit is a fixed window aligned
-- on the epoch, the reference's only algorithm and tollgate's default. Such a counter is one
-- integer per window, under its key with the window's number appended (tollgate appends it:
-- storage/redis/script.rs), so counting is INCRBY, and everything else about the decision
-- (remaining, reset, retry) is worked out by tollgate from the counts this returns, with the
-- Rust algorithm itself. The general entry point (apply.lua) reads and writes the same
-- layout (its `fixed_count` algorithm), so a counter means the same whichever decides.
--
-- KEYS      the counter of each hit (all in one slot; a counter may appear more than once);
--           or none, for a call across the slots of one node (keys then follow the hits).
-- One hit alone (the common call) has its own short arguments: see apply_one.
-- ARGV[1]   "apply", "distinct" (an apply whose counters are all different, declared as
--           keys, and whose denied hits consume nothing; its hits come packed: see
--           apply_distinct), or "refund" (give back hits a committed call consumed).
-- ARGV[2]   "1" with --count-denied (denied hits consume too), else "0".
-- ARGV[3]   "1" when these are all the hits of the request (the whole veto rule applies
--           here), else "0" (see apply.lua).
-- ARGV[4]   n, the number of hits.
-- ARGV[5..] 5 per hit: limit, hits, the counter's time to live in ms were it created now,
--           role (e enforced|q quota|s shadow), descriptor index (a descriptor's hits are
--           adjacent). "distinct" has them packed instead: see apply_distinct.
-- then      when KEYS is empty: the n counters, in hit order.
-- Returns   for "apply", {committed (1|0), then per hit the count its counter held before
--           the hit (after the hits before it in this call)}, for "distinct" the same with
--           committed last, and for one hit alone the integer count * 2 + committed; for
--           "refund", {1, then per hit its counter's count after the refund}.
-- Writes    only after every counter is read, except for one hit alone, which is one slot.

-- Numbers passed to redis.call are formatted here: Lua's own conversion writes numbers past
-- 10^14 in exponent notation.

-- The count of a counter, 0 when it does not exist.
local function count_of(key)
  return tonumber(redis.call('GET', key) or 0)
end

-- The reply to one hit: its count before and whether the call committed, packed into one
-- integer (a table reply costs Redis a sixth of this whole call), while that stays exact.
local function packed(committed, before)
  if before >= 2251799813685248 then -- 2^51: before * 2 + 1 must stay below 2^53
    return { committed, before }
  end
  return before * 2 + committed
end

-- One hit alone, the common call, with its own short arguments: limit, hits, time to live,
-- and what a denial does ("v": vetoes, the call commits nothing; "u": is undone, the call
-- commits; "c": counts too, --count-denied). INCRBY first, undone when denied (the rare case).
local function apply_one(key, ARGV)
  local limit, amount, denial = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[4]
  if limit == nil or amount == nil then
    return redis.error_reply('ERR tollgate: malformed hit 1')
  end
  if amount == 0 then
    local count = count_of(key)
    if count + 1 > limit and denial == 'v' then
      return packed(0, count)
    end
    return packed(1, count)
  end
  local after = redis.call('INCRBY', key, ARGV[2])
  if after == amount then
    redis.call('PEXPIRE', key, ARGV[3])
  end
  local before = after - amount
  if after <= limit and before < 2251799813685248 then
    return before * 2 + 1 -- packed(1, before), inline on the path nearly every call takes
  end
  if after <= limit then
    return packed(1, before)
  end
  if denial == 'c' then
    if after > MAX_COUNT then
      redis.call('SET', key, string.format('%d', MAX_COUNT), 'KEEPTTL')
    end
    return packed(1, before)
  end
  if before == 0 then
    redis.call('DEL', key)
  else
    redis.call('DECRBY', key, ARGV[2])
  end
  if denial == 'v' then
    return packed(0, before)
  end
  return packed(1, before)
end

-- Gives back each counter's hits (whatever happened since: the count is per window).
local function refund(keys, ARGV, count)
  local totals, order = {}, {}
  for i = 1, count do
    local key = keys[i]
    if totals[key] == nil then
      totals[key] = 0
      order[#order + 1] = key
    end
    totals[key] = totals[key] + tonumber(ARGV[5 * i + 1])
  end
  local after = {}
  for _, key in ipairs(order) do
    after[key] = count_of(key)
  end
  for _, key in ipairs(order) do
    if after[key] > 0 and totals[key] > 0 then
      after[key] = max(after[key] - totals[key], 0)
      redis.call('SET', key, string.format('%d', after[key]), 'KEEPTTL')
    end
  end
  local out = { 1 }
  for i = 1, count do
    out[i + 1] = after[keys[i]]
  end
  return out
end

-- Several hits on different counters (one request's descriptors), --count-denied off. As in
-- the general path below, every counter is read (one MGET) before any is written, and a call
-- that commits nothing writes nothing; but with no counter twice, each hit's count is what
-- was read, so the bookkeeping is by position, and an allowed hit is counted by INCRBY (with
-- its expiry when the counter is new) rather than a SET of a formatted number.
-- The hits come packed into one argument (prelude.lua), 5 numbers per hit: limit, hits, time
-- to live in ms were the counter created now, role (ROLE_TAGS), descriptor index; then, as
-- text, the hits every hit counts when they all count the same (the usual case: INCRBY takes
-- it as is), else "". The reply is the MGET's own table, each count turned into a number in
-- place, with committed (1|0) appended: per counter, a table store and a reply element are a
-- fair part of what this call costs Redis, so it builds no other table unless a hit is denied.
local MAX_DISTINCT = 1000 -- 5 numbers each must fit Lua's stack as one unpack's results
local distinct_formats = {}

local function distinct_format(n)
  local format = distinct_formats[n]
  if format == nil then
    format = '<' .. string.rep('i8', 5 * n)
    distinct_formats[n] = format
  end
  return format
end

-- Which hits fit (before + max(hits, 1) <= limit), and their roles and descriptors laid out
-- for vetoes (first 0, stride 2, role at 1, descriptor at 2).
local function denial_inputs(counts, hits, n)
  local allowed, tags = {}, {}
  for i = 1, n do
    local at = 5 * i - 5
    allowed[i] = counts[i] + max(hits[at + 2], 1) <= hits[at + 1]
    tags[2 * i - 1], tags[2 * i] = ROLE_TAGS[hits[at + 4]], hits[at + 5]
  end
  return allowed, tags
end

local function apply_distinct(keys, packed, amount_text, n, complete)
  local counts = redis.call('MGET', unpack(keys))
  local hits = { unpack_numbers(distinct_format(n), packed) }
  local denied, missing = false, nil
  for i = 1, n do
    local raw = counts[i]
    local before = tonumber(raw or 0)
    if before == nil then
      return redis.error_reply('ERR tollgate: malformed counter ' .. i)
    end
    if not raw then
      missing = missing or {}
      missing[i] = true
    end
    counts[i] = before
    local at = 5 * i - 5
    if before + max(hits[at + 2], 1) > hits[at + 1] then
      denied = true
    end
  end
  local allowed = nil
  if denied then
    local tags
    allowed, tags = denial_inputs(counts, hits, n)
    if vetoes(tags, n, allowed, 0, 2, 1, 2, complete) then
      counts[n + 1] = 0
      return counts
    end
  end
  for i = 1, n do
    local amount = hits[5 * i - 3]
    if amount > 0 and (allowed == nil or allowed[i]) then
      redis.call('INCRBY', keys[i], amount_text or string.format('%d', amount))
      if missing and missing[i] then
        redis.call('PEXPIRE', keys[i], hits[5 * i - 2])
      end
    end
  end
  counts[n + 1] = 1
  return counts
end

local function count(KEYS, ARGV)
  if fmod == nil then
    bind_globals()
  end
  if #ARGV == 4 then
    return apply_one(KEYS[1], ARGV)
  end
  local mode, charge, complete = ARGV[1], ARGV[2] == '1', ARGV[3] == '1'
  local n = tonumber(ARGV[4])
  if mode == 'distinct' then
    if n == nil or n > MAX_DISTINCT or #KEYS ~= n or #ARGV ~= 6 or #ARGV[5] ~= 40 * n then
      return redis.error_reply('ERR tollgate: malformed call')
    end
    local amount_text = ARGV[6]
    if amount_text == '' then
      amount_text = nil
    end
    return apply_distinct(KEYS, ARGV[5], amount_text, n, complete)
  end
  local keys_in_argv = n ~= nil and #KEYS == 0 and #ARGV == 4 + 6 * n
  if n == nil or not (keys_in_argv or (#KEYS == n and #ARGV == 4 + 5 * n)) then
    return redis.error_reply('ERR tollgate: malformed call')
  end
  local keys = KEYS
  if keys_in_argv then
    keys = {}
    for i = 1, n do
      keys[i] = ARGV[4 + 5 * n + i]
    end
  end
  if mode == 'refund' then
    return refund(keys, ARGV, n)
  end

  -- Every counter read first (declared keys share a slot, so one MGET reads them all; a
  -- cross-slot call reads them one by one); each hit then sees the count the hits before it
  -- left.
  local counts, stored, existed, allowed, out = {}, {}, {}, {}, { 1 }
  local found = nil
  if not keys_in_argv then
    found = redis.call('MGET', unpack(keys))
  end
  for i = 1, n do
    local key = keys[i]
    if stored[key] == nil then
      local value
      if found then
        value = found[i]
      else
        value = redis.call('GET', key)
      end
      existed[key] = value ~= false
      stored[key] = tonumber(value or 0)
      counts[key] = stored[key]
    end
    local base = 5 * i
    local limit, amount = tonumber(ARGV[base]), tonumber(ARGV[base + 1])
    local before = counts[key]
    out[i + 1] = before
    allowed[i] = before + max(amount, 1) <= limit
    if allowed[i] or charge then
      counts[key] = min(before + amount, MAX_COUNT)
    end
  end

  -- The veto rule (prelude.lua), with --count-denied off.
  if not charge and vetoes(ARGV, n, allowed, 5, 5, 3, 4, complete) then
    out[1] = 0
    return out
  end

  for i = 1, n do
    local key = keys[i]
    local added = counts[key] - stored[key]
    if added > 0 and existed[key] then
      local by = ARGV[5 * i + 1]
      if added ~= tonumber(by) then
        by = string.format('%d', added)
      end
      redis.call('INCRBY', key, by)
    elseif added > 0 then
      -- Read as missing a moment ago, in this same atomic call: created with its expiry.
      redis.call('SET', key, string.format('%d', counts[key]), 'PX', ARGV[5 * i + 2])
    end
    stored[key] = counts[key]
  end
  return out
end
