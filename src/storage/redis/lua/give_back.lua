-- Layout GiveBack (src/storage/redis/call/give_back.rs): gives back hits that a committed
-- call consumed, because the request turned out vetoed elsewhere (another node of a cluster,
-- the other store of --store-per-second). Each counter takes back all its hits at once, under
-- its algorithm's refund rule (Refund in src/algorithm/mod.rs): a counter sent with the two
-- numbers the consuming call left takes its refund only if it still holds them (compare and
-- set); one sent without takes it whatever happened since. A refund never creates a counter
-- and keeps its expiry.
-- KEYS      the counter of each hit (all in one slot), then window counters, as for Apply.
-- ARGV[1]   packed: the instant the consuming call decided at (µs), n; then 10 per hit:
--           algorithm code, requests, window (µs), tick (µs), parameter (ticks), hits to give
--           back, the number of the hit before it on the same counter (0: none), 1 when the
--           refund requires the state below else 0, and the state's first two numbers.
-- Returns   6 per hit, as Apply's: a check (0 hits) on its counter after the refund.
local PER_GIVE_BACK = 10

local function give_back(keys, argv)
  if fmod == nil then
    bind_globals()
  end
  local packed = argv[1]
  if packed == nil or #packed < 16 then
    return malformed('call')
  end
  local at_us, n = unpack_numbers('<i8i8', packed)
  if #packed ~= 8 * (2 + PER_GIVE_BACK * n) then
    return malformed('call')
  end
  local h = numbers(packed, 17, PER_GIVE_BACK * n)
  local counters_at, declared = window_counters_at(h, n, PER_GIVE_BACK)
  if #keys ~= declared then
    return malformed('call')
  end
  local totals, first_of = {}, {}
  for i = 1, n do
    local at = PER_GIVE_BACK * (i - 1)
    if ALGORITHMS[h[at + 1]] == nil or h[at + 4] < 1 or h[at + 7] >= i then
      return malformed('hit ' .. i)
    end
    local earlier = h[at + 7]
    local first = i
    if earlier > 0 then
      first = first_of[earlier]
    end
    first_of[i] = first
    totals[first] = (totals[first] or 0) + h[at + 6]
  end
  local states = {}
  for i = 1, n do
    if first_of[i] == i then
      local at = PER_GIVE_BACK * (i - 1)
      local tick = h[at + 4]
      local window = max(idiv(h[at + 3], tick), 1)
      local state, found = read_counter(keys[i], h[at + 1], keys[counters_at[i]], idiv(at_us, tick), window, h[at + 2])
      local required = h[at + 8] == 1
      local unchanged = state and state[1] == h[at + 9] and state[2] == h[at + 10]
      if state and totals[i] > 0 and (not required or unchanged) then
        ALGORITHMS[h[at + 1]].give_back(state, idiv(at_us, tick), h[at + 2], window, h[at + 5], totals[i])
        write_counter(keys[i], found, state, nil)
      end
      states[i] = state
    end
  end
  -- Refunded hits report a check on their counter as it now is.
  local out = {}
  for i = 1, n do
    local at = PER_GIVE_BACK * (i - 1)
    local state = states[first_of[i]]
    local tick = h[at + 4]
    local window = max(idiv(h[at + 3], tick), 1)
    local _, allowed, remaining, reset_after, retry_after =
      ALGORITHMS[h[at + 1]].decide(state or nil, idiv(at_us, tick), h[at + 2], window, h[at + 5], 0, false)
    local base = (i - 1) * 6
    if allowed then
      out[base + 1] = 1
    else
      out[base + 1] = 0
    end
    out[base + 2], out[base + 3], out[base + 4] = remaining, reset_after * tick, retry_after * tick
    out[base + 5], out[base + 6] = (state and state[1]) or -1, (state and state[2]) or -1
  end
  return out
end
