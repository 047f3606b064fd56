-- Layout Count (src/storage/redis/call/count.rs): hits on fixed windows aligned on the epoch
-- only, any number, a counter possibly named twice. The usual call (distinct counters, every
-- hit counting the same, more than 0) is written first: INCRBY on each counter in turn, whose
-- replies decide it; at the first counter over its limit (or that is not a count) what was
-- added is taken back, and the call is decided as below. Otherwise every counter is read
-- before any is written (one MGET, or one GET each across slots), the request rule (rule.lua)
-- applied, and each changed counter written once, by INCRBY of what the call added (created
-- with its expiry): a call that commits nothing leaves every counter reading as it did (a
-- counter that held 0 may be gone).
-- KEYS      the counters, with their windows' numbers appended (all in one slot); none for
--           the cross-slot twin, whose counters follow ARGV[2].
-- ARGV[1]   packed (prelude.lua's `numbers`): 1 with --count-denied else 0, 1 when these are
--           all the hits of the request else 0, 1 when a counter is named twice else 0, n;
--           then per hit: limit, hits, time to live in ms were the counter created now, role
--           (rule.lua), descriptor index, and, only when a counter is named twice, the number
--           of the hit before it on the same counter (0: none) and 1 when a later hit names
--           the same counter (else 0: this hit writes the counter).
-- ARGV[2]   the hits every hit counts, as text, when they all count the same (the usual
--           case: INCRBY takes it as is), else "".
-- Returns   per hit, the count its counter held before the call (INCRBY's or MGET's, each
--           count a number in place: per counter, a table store and a reply element are a
--           fair part of what this call costs Redis), then committed (1|0).
-- Cost      the usual call, nothing denied, does nothing per counter but INCRBY it (and
--           PEXPIRE it when new): reading every counter first cost Redis a fair share of the
--           call. A call denied at its k-th counter pays 2k commands more than reading first
--           (docs/performance.md).

-- Reads every hit's counter into `found` (a number in place); which counters are new; once a
-- hit is denied, which hits were allowed (nil: all). With counters named twice, each hit sees
-- what the hits before it left (`chain`, by hit), and only a counter's last hit writes it.
local function decide_counts(h, n, stride, found, repeats, charge)
  local allowed, missing, chain = nil, nil, nil
  for i = 1, n do
    local at = stride * i - stride
    local raw = found[i]
    local held = to_number(raw or 0)
    if held == nil then
      return malformed('counter ' .. i)
    end
    found[i] = held
    if not raw then
      missing = missing or {}
      missing[i] = true
    end
    local amount, before = h[at + 2], held
    if repeats and h[at + 6] > 0 then
      before = chain[h[at + 6]]
    end
    -- A check (0 hits) fits where one hit would; inline, as calling max costs Redis more.
    local fits = before + (amount > 0 and amount or 1) <= h[at + 1]
    if not fits and allowed == nil then
      allowed = {}
      for j = 1, i - 1 do
        allowed[j] = true
      end
    end
    if allowed then
      allowed[i] = fits
    end
    if repeats and h[at + 7] == 1 then
      chain = chain or {}
      chain[i] = before
      if fits or charge then
        chain[i] = min(before + amount, MAX_COUNT)
      end
    end
  end
  return nil, allowed, missing, chain
end

-- What the last hit on a counter writes: the count the call added to it.
local function added_by(h, at, i, found, allowed, chain, repeats, charge)
  local final = found[i]
  if repeats and h[at + 6] > 0 then
    final = chain[h[at + 6]]
  end
  if allowed == nil or allowed[i] or charge then
    final = min(final + h[at + 2], MAX_COUNT)
  end
  return final - found[i]
end

-- Takes back what `count_at_once` added to the first `last` counters: a counter that held
-- nothing is deleted (it may have held 0 with an expiry, which reads as nothing too).
local function take_back(keys, counts, last, by)
  for i = 1, last do
    if counts[i] == 0 then
      redis_call('DEL', keys[i])
    else
      redis_call('DECRBY', keys[i], by)
    end
  end
end

-- The usual call (distinct counters, each hit counting `amount` > 0), decided from INCRBY's
-- replies instead of a read first: every counter is added to in turn, and the call is over
-- when every hit fits (with --count-denied, when no counter passes MAX_COUNT). Otherwise, at
-- the first that does not, or that cannot be added to, what was added is taken back and nil
-- returned, so that the call is decided as if this had not run.
local function count_at_once(keys, h, n, stride, by, amount, charge)
  local counts = {}
  for i = 1, n do
    local after = redis_pcall('INCRBY', keys[i], by)
    if type(after) ~= 'number' then
      take_back(keys, counts, i - 1, by)
      return nil
    end
    counts[i] = after - amount
    if after > (charge and MAX_COUNT or h[stride * i - stride + 1]) then
      take_back(keys, counts, i, by)
      return nil
    end
  end
  for i = 1, n do
    if counts[i] == 0 then
      redis_call('PEXPIRE', keys[i], h[stride * i - stride + 3])
    end
  end
  counts[n + 1] = 1
  return counts
end

local function count(keys, argv, declared)
  if fmod == nil then
    bind_globals()
  end
  local packed = argv[1]
  if packed == nil or #packed < 32 then
    return malformed('call')
  end
  local charge_flag, complete, repeats_flag, n = unpack_numbers('<i8i8i8i8', packed)
  local charge, repeats = charge_flag == 1, repeats_flag == 1
  local stride = 5
  if repeats then
    stride = 7
  end
  if #packed ~= 8 * (4 + stride * n) or #keys ~= n then
    return malformed('call')
  end
  local h = numbers(packed, 33, stride * n)
  local amount_text = argv[2]
  if not repeats and amount_text ~= '' then
    local amount = to_number(amount_text)
    if amount and amount > 0 then
      local counts = count_at_once(keys, h, n, stride, amount_text, amount, charge)
      if counts then
        return counts
      end
    end
  end
  local found
  if declared then
    found = redis_call('MGET', unpack(keys))
  else
    found = {}
    for i = 1, n do
      found[i] = redis_call('GET', keys[i])
    end
  end
  local failed, allowed, missing, chain = decide_counts(h, n, stride, found, repeats, charge)
  if failed then
    return failed
  end
  if allowed and not charge and vetoes(h, n, allowed, 0, stride, 4, 5, complete == 1) then
    found[n + 1] = 0
    return found
  end
  for i = 1, n do
    local at = stride * i - stride
    if not (repeats and h[at + 7] == 1) then
      local added = h[at + 2]
      if allowed or charge or repeats then
        added = added_by(h, at, i, found, allowed, chain, repeats, charge)
      end
      if added > 0 then
        local by = amount_text
        if by == '' or added ~= h[at + 2] then
          by = string_format('%d', added)
        end
        redis_call('INCRBY', keys[i], by)
        if missing and missing[i] then
          redis_call('PEXPIRE', keys[i], h[at + 3])
        end
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
