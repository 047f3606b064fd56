-- Layout Apply (src/storage/redis/call/apply.rs): any hits, any algorithms, decided and
-- answered here, atomically, as src/storage/memory/ does in-process (and by the same rule,
-- rule.lua): every counter read before any is written, each hit decided on the state the hits
-- before it left, and a vetoed call writes nothing but what a veto keeps: its refunds (role
-- REFUND: the hits go back, answered allowed, never vetoing) and the charges that count
-- whether admitted or not (ALWAYS added to the role), decided again on their own chain.
-- KEYS      the counter of each hit (all in one slot; a counter may appear more than once; a
--           fixed window aligned on the epoch with its window's number appended), then the
--           window's counter of each sliding window written as counters (window_counters.lua);
--           none for the cross-slot twin, whose counters follow ARGV[1].
-- ARGV[1]   packed: now (µs), 1 when every charge (hit not a refund) counts whether
--           admitted or not (--count-denied) else 0, 1 when these are all the hits of the
--           request else 0 (only an enforced denial vetoes a part: the caller refunds when the
--           whole request turns out vetoed), grace (ms), n; then 9 per hit: algorithm code,
--           requests, window (µs), tick (µs), parameter (ticks), hits, role (rule.lua; with
--           ALWAYS added for a charge that counts whether admitted or not, when the call does
--           not say it of every charge), descriptor index, the number of the hit before it on
--           the same counter (0: none).
-- Returns   {committed (1|0), then 6 per hit: allowed (1|0), remaining (when denied: the
--           room found), reset_after µs, retry_after µs, and the first two numbers of the
--           counter's state after the call (-1: none), which a later refund may require}.
-- Writes    only after every counter is read: a cross-slot call that finds a counter not on
--           its node fails on the read of that counter (Redis refuses the access), having
--           changed nothing, so the caller can send its hits again one slot at a time.
local PER_APPLY = 9
-- A refund's role code (call/numbers.rs, `role_code`).
local REFUND = 3

-- Runs a hit's algorithm in its ticks at `now` µs: new state, allowed, remaining (when
-- denied, the room a check finds), reset_after µs, retry_after µs.
local function decide_in_ticks(h, at, state, now, hits, charge)
  local algorithm, limit, tick = ALGORITHMS[h[at + 1]], h[at + 2], h[at + 4]
  local window = max(idiv(h[at + 3], tick), 1)
  local now_ticks = idiv(now, tick)
  local new_state, allowed, remaining, reset_after, retry_after =
    algorithm.decide(state or nil, now_ticks, limit, window, h[at + 5], hits, charge)
  if not allowed and hits > 0 then
    local _, _, room = algorithm.decide(state or nil, now_ticks, limit, window, h[at + 5], 0, charge)
    remaining = room
  end
  return new_state, allowed, remaining, reset_after * tick, retry_after * tick
end

-- A refund hit (is_negative_hits) at `now` µs: the state after its hits went back (nil:
-- nothing to change), then a check on the counter after it, allowed whatever it finds.
local function refund_in_ticks(h, at, state, now)
  local algorithm, limit, tick = ALGORITHMS[h[at + 1]], h[at + 2], h[at + 4]
  local window = max(idiv(h[at + 3], tick), 1)
  local now_ticks = idiv(now, tick)
  local new_state = nil
  if state and h[at + 6] > 0 then
    new_state = {}
    for j = 1, #state do
      new_state[j] = state[j]
    end
    algorithm.refund(new_state, now_ticks, limit, window, h[at + 5], h[at + 6])
  end
  local _, _, remaining, reset_after, retry_after =
    algorithm.decide(new_state or state or nil, now_ticks, limit, window, h[at + 5], 0, false)
  return new_state, true, remaining, reset_after * tick, retry_after * tick
end

local function record(out, i, allowed, remaining, reset_after, retry_after, state)
  local base = 1 + (i - 1) * 6
  if allowed then
    out[base + 1] = 1
  else
    out[base + 1] = 0
  end
  out[base + 2], out[base + 3], out[base + 4] = remaining, reset_after, retry_after
  out[base + 5] = (state and state[1]) or -1
  out[base + 6] = (state and state[2]) or -1
end

-- The last hit on each counter writes the state `left` by it over what read_counter found
-- (`parts`, by the counter's first hit), with the expiry of the last hit that changed it
-- (`expires`, µs from now; a counter none changed is not written); every hit reports its
-- counter's state after the call.
local function write_counters(keys, h, n, parts, left, expires, grace, out)
  local first_of, last_of, write_expiry = {}, {}, {}
  for i = 1, n do
    local earlier = h[PER_APPLY * (i - 1) + 9]
    local first = i
    if earlier > 0 then
      first = first_of[earlier]
    end
    first_of[i], last_of[first] = first, i
    if expires[i] then
      write_expiry[first] = expires[i]
    end
  end
  for i = 1, n do
    local first = first_of[i]
    local final = left[last_of[first]]
    if last_of[first] == i and write_expiry[first] then
      write_counter(keys[i], parts[first], final, ttl_ms(write_expiry[first], grace))
    end
    local base = 1 + (i - 1) * 6
    out[base + 5], out[base + 6] = (final and final[1]) or -1, (final and final[2]) or -1
  end
end

local function apply(keys, argv)
  if fmod == nil then
    bind_globals()
  end
  local packed = argv[1]
  if packed == nil or #packed < 40 then
    return malformed('call')
  end
  local now, charge_flag, complete_flag, grace, n = unpack_numbers('<i8i8i8i8i8', packed)
  if #packed ~= 8 * (5 + PER_APPLY * n) then
    return malformed('call')
  end
  local h = numbers(packed, 41, PER_APPLY * n)
  local counters_at, declared = window_counters_at(h, n, PER_APPLY)
  if #keys ~= declared then
    return malformed('call')
  end
  -- Per hit: whether its charge counts whether admitted or not; and whether a veto would
  -- undo any hit (a call whose every hit it keeps is never vetoed).
  local always, undone = {}, false
  for i = 1, n do
    local at = PER_APPLY * (i - 1)
    if ALGORITHMS[h[at + 1]] == nil or h[at + 4] < 1 or h[at + 9] >= i then
      return malformed('hit ' .. i)
    end
    local refund = h[at + 7] == REFUND
    always[i] = h[at + 7] >= ALWAYS or (charge_flag == 1 and not refund)
    undone = undone or not (always[i] or refund)
  end
  -- Per hit: the state its counter was found in, the state it leaves it in, when that may be
  -- forgotten (µs from now; nil: it wrote nothing), and the outcome.
  local found, parts, left, expires, allowed = {}, {}, {}, {}, {}
  local out = { 0 }
  local denied = false
  for i = 1, n do
    local at = PER_APPLY * (i - 1)
    local earlier, before = h[at + 9], nil
    if earlier > 0 then
      found[i], before = found[earlier], left[earlier]
    else
      local tick = h[at + 4]
      found[i], parts[i] =
        read_counter(keys[i], h[at + 1], keys[counters_at[i]], idiv(now, tick), max(idiv(h[at + 3], tick), 1), h[at + 2])
      before = found[i]
    end
    local new_state, ok, remaining, reset_after, retry_after
    if h[at + 7] == REFUND then
      new_state, ok, remaining, reset_after, retry_after = refund_in_ticks(h, at, before, now)
    else
      new_state, ok, remaining, reset_after, retry_after =
        decide_in_ticks(h, at, before, now, h[at + 6], always[i])
    end
    allowed[i] = ok
    denied = denied or not ok
    record(out, i, ok, remaining, reset_after, retry_after, nil)
    if new_state then
      left[i], expires[i] = new_state, reset_after
    else
      left[i] = before
    end
  end

  if denied and undone and vetoes(h, n, allowed, 0, PER_APPLY, 7, 8, complete_flag == 1) then
    -- Nothing consumed but what a veto keeps: each other charge admitted reports a check on
    -- its counter as the kept hits before it left it; each kept hit is applied again on that
    -- chain.
    local kept, wrote = {}, {}
    for i = 1, n do
      local at = PER_APPLY * (i - 1)
      local earlier, before = h[at + 9], found[i]
      if earlier > 0 then
        before = kept[earlier]
      end
      kept[i] = before
      if h[at + 7] == REFUND or always[i] then
        local new_state, ok, remaining, reset_after, retry_after
        if always[i] then
          new_state, ok, remaining, reset_after, retry_after =
            decide_in_ticks(h, at, before, now, h[at + 6], true)
        else
          new_state, ok, remaining, reset_after, retry_after = refund_in_ticks(h, at, before, now)
        end
        -- A hit denied at first keeps its denial, which the veto went by.
        if allowed[i] then
          record(out, i, ok, remaining, reset_after, retry_after, nil)
        end
        if new_state then
          kept[i], wrote[i] = new_state, reset_after
        end
      elseif allowed[i] then
        local _, ok, remaining, reset_after, retry_after = decide_in_ticks(h, at, before or nil, now, 0, false)
        record(out, i, ok, remaining, reset_after, retry_after, nil)
      end
    end
    write_counters(keys, h, n, parts, kept, wrote, grace, out)
    return out
  end

  write_counters(keys, h, n, parts, left, expires, grace, out)
  out[1] = 1
  return out
end

local function apply_cross_slot(_, argv)
  return apply(keys_from(argv, 2), argv)
end
