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

ALGORITHMS[3] = sliding_log
