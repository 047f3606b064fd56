-- Sliding log (code 3): src/algorithm/sliding_log.rs in Lua.
-- state: {at_1, hits_1, at_2, hits_2, ...}: runs of admitted hits, oldest first; at most
-- `limit` hits in all (the config caps a sliding log's limit at 10,000).
-- parameter: min_interval in ticks.

-- Records `hits` at `now`, keeping the newest `limit` hits.
local function sliding_log_append(runs, now, hits, limit)
  if hits == 0 then
    return
  end
  if #runs > 0 and runs[#runs][1] == now then
    runs[#runs][2] = runs[#runs][2] + hits
  else
    runs[#runs + 1] = { now, hits }
  end
  local cap = max(limit, 1)
  local total = 0
  for _, run in ipairs(runs) do
    total = total + run[2]
  end
  while total > cap and #runs > 0 do
    local drop = min(total - cap, runs[1][2])
    runs[1][2] = runs[1][2] - drop
    total = total - drop
    if runs[1][2] == 0 then
      table.remove(runs, 1)
    end
  end
end

-- Hits of the runs still inside the window.
local function sliding_log_count(runs, now, window)
  local count = 0
  for _, run in ipairs(runs) do
    if run[1] + window > now then
      count = count + run[2]
    end
  end
  return count
end

-- When `need` hits would be admitted, or nil if never.
local function sliding_log_retry(runs, now, limit, window, min_interval, need, bunched)
  if need > limit or bunched then
    return nil
  end
  local count = sliding_log_count(runs, now, window)
  local to_expire = max(count + need - limit, 0)
  local for_room = 0
  for _, run in ipairs(runs) do
    if run[1] + window > now then
      if to_expire == 0 then
        break
      end
      to_expire = max(to_expire - run[2], 0)
      for_room = max(run[1] + window - now, 0)
    end
  end
  local for_gap = 0
  if #runs > 0 then
    for_gap = max(runs[#runs][1] + min_interval - now, 0)
  end
  return max(for_room, for_gap)
end

local sliding_log = {}

function sliding_log.decide(state, now, limit, window, min_interval, hits, charge)
  local all = {}
  if state then
    for i = 1, #state - 1, 2 do
      all[#all + 1] = { state[i], state[i + 1] }
    end
  end
  if #all > 0 then
    now = max(now, all[#all][1])
  end
  -- Expired runs go, but the newest stays while the gap still needs it.
  local first = 1
  while first <= #all and all[first][1] + window <= now
    and (#all - first + 1 > 1 or all[first][1] + min_interval <= now) do
    first = first + 1
  end
  local runs = {}
  for i = first, #all do
    runs[#runs + 1] = all[i]
  end
  local count = sliding_log_count(runs, now, window)
  local need = max(hits, 1)
  local gap_ok = #runs == 0 or now - runs[#runs][1] >= min_interval
  local bunched = min_interval > 0 and hits > 1
  local allowed = count + need <= limit and gap_ok and not bunched
  local consumed = consumed_by(allowed, charge, hits)
  local retry = nil
  if not allowed then
    retry = sliding_log_retry(runs, now, limit, window, min_interval, need, bunched)
  end
  sliding_log_append(runs, now, consumed, limit)
  local reset_after = 0
  if #runs > 0 then
    reset_after = max(runs[#runs][1] + max(window, min_interval) - now, 0)
  end
  local new_state = nil
  if consumed > 0 then
    new_state = {}
    for _, run in ipairs(runs) do
      new_state[#new_state + 1] = run[1]
      new_state[#new_state + 1] = run[2]
    end
  end
  if allowed then
    return new_state, true, max(limit - (count + consumed), 0), reset_after, 0
  end
  if retry == nil then
    retry = never_retry(reset_after, window)
  end
  return new_state, false, 0, reset_after, retry
end

function sliding_log.give_back(state, at, _, _, _, count)
  for j = #state - 1, 1, -2 do
    if state[j] == at then
      state[j + 1] = max(state[j + 1] - count, 0)
      if state[j + 1] == 0 then
        table.remove(state, j + 1)
        table.remove(state, j)
      end
      return
    end
  end
end

-- A refund (is_negative_hits): the newest `count` hits leave the log, as if never logged.
function sliding_log.refund(state, _, _, _, _, count)
  while count > 0 and #state >= 2 do
    local taken = min(state[#state], count)
    state[#state] = state[#state] - taken
    count = count - taken
    if state[#state] == 0 then
      state[#state] = nil
      state[#state] = nil
    end
  end
end

-- A lone hit decided by `decide` on the state parsed, and written packed.
local function sliding_log_decide_packed(key, raw, now, limit, window, min_interval, hits, charge,
                                         packed)
  local state = nil
  if raw then
    state = parse_state(raw)
  end
  local new_state = sliding_log.decide(state, now, limit, window, min_interval, hits, charge)
  if new_state then
    local format = PACKED_LOG_WRITES[#new_state] or packed_log_write(#new_state)
    redis_call('SET', key, pack_numbers(format, PACKED_LOG_TAG, unpack_list(new_state)), 'PX',
      packed)
  end
  return true
end

-- A lone hit, packed only (`packed`, the expiry, given: every write of a lone hit leaves the
-- newest run at `now`, so its expiry is always the window or the minimum interval, then the
-- grace, which tollgate works out). On a packed log it is `decide` written out on the stored
-- bytes, run by run (the runs at bytes 16i - 14 .. 16i + 1): what the hit keeps of the log is
-- a piece of them, so no table is made (a table, and each function call, cost Redis more than
-- the decision). A text log, no log, or a write that must drop the oldest hits to keep the
-- newest `limit` (sliding_log_append) is decided by `decide` and written packed.
function sliding_log.lone_hit(key, raw, now, limit, window, min_interval, hits, charge, _, _,
                              packed)
  if not packed then
    return false
  end
  local length = raw and #raw or 0
  if length < 17 or length % 16 ~= 1 or length > PACKED_LOG_LONGEST then
    return sliding_log_decide_packed(key, raw, now, limit, window, min_interval, hits, charge == 1,
      packed)
  end
  local tag = unpack_numbers('<i1', raw)
  if tag ~= PACKED_LOG_TAG then
    return sliding_log_decide_packed(key, raw, now, limit, window, min_interval, hits, charge == 1,
      packed)
  end
  local runs = (length - 1) / 16
  local newest, newest_hits = unpack_numbers(PACKED_RUN, raw, length - 15)
  if newest > MAX_COUNT or newest_hits > MAX_COUNT then
    error('a packed state out of range')
  end
  if newest > now then
    now = newest
  end
  -- Expired runs go (`first`: the oldest kept; runs are oldest first, so the expired ones are
  -- the first ones), but the newest stays while the gap still needs it. `count`: the hits
  -- kept.
  local first, count = 1, 0
  for i = 1, runs - 1 do
    local at, run = unpack_numbers(PACKED_RUN, raw, 16 * i - 14)
    if at > MAX_COUNT or run > MAX_COUNT then
      error('a packed state out of range')
    end
    if at + window <= now then
      first = i + 1
    else
      count = count + run
    end
  end
  -- Kept past the window, the newest run still counts here: it is kept only while the gap
  -- since it is too short, which denies the hit whatever the count.
  if first == runs and newest + window <= now and newest + min_interval <= now then
    first = runs + 1
  else
    count = count + newest_hits
  end
  local need = hits
  if need < 1 then
    need = 1
  end
  local gap_ok = first > runs or now - newest >= min_interval
  local allowed = count + need <= limit and gap_ok and not (min_interval > 0 and hits > 1)
  if hits <= 0 or not (allowed or charge == 1) then
    return true
  end
  if count + hits > limit then
    return sliding_log_decide_packed(key, raw, now, limit, window, min_interval, hits, charge == 1,
      packed)
  end
  local value
  if first > runs then
    value = pack_numbers(PACKED_LOG_RUN, PACKED_LOG_TAG, now, hits)
  elseif newest == now then
    value = PACKED_LOG_TAG_BYTE .. string_sub(raw, 16 * first - 14, length - 8)
      .. pack_numbers('<i8', newest_hits + hits)
  else
    value = PACKED_LOG_TAG_BYTE .. string_sub(raw, 16 * first - 14, length)
      .. pack_numbers('<i8i8', now, hits)
  end
  redis_call('SET', key, value, 'PX', packed)
  return true
end

ALGORITHMS[3] = sliding_log
