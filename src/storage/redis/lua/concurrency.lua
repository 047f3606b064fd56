-- Concurrency (code 7): src/algorithm/concurrency.rs in Lua. The holds are a sliding log's
-- runs (sliding_log.lua) whose window is the longest hold: a take is decided as a sliding
-- log's hit with no minimum interval, and a denied take holds nothing, whatever the charge;
-- a refund (is_negative_hits: a stream ended) gives back the oldest live holds.
local concurrency = {}

function concurrency.decide(state, now, limit, window, _, hits, _)
  return sliding_log.decide(state, now, limit, window, 0, hits, false)
end

-- The `count` oldest live holds leave `state` (flat: at, hits, at, hits, …, oldest first):
-- the expired ones go first, released already.
function concurrency.refund(state, now, _, window, _, count)
  local first = 1
  while first < #state and state[first] + window <= now do
    first = first + 2
  end
  while count > 0 and first < #state do
    local taken = min(state[first + 1], count)
    state[first + 1] = state[first + 1] - taken
    count = count - taken
    if state[first + 1] == 0 then
      first = first + 2
    end
  end
  local kept = {}
  for j = first, #state do
    kept[#kept + 1] = state[j]
  end
  for j = 1, #state do
    state[j] = kept[j]
  end
end

-- A vetoed request's holds go back from those logged at its instant, else (its take was
-- logged later than the call's instant) as a refund's do (concurrency.rs, `give_back`).
function concurrency.give_back(state, at, limit, window, parameter, count)
  for j = 1, #state - 1, 2 do
    if state[j] == at then
      sliding_log.give_back(state, at, limit, window, parameter, count)
      return
    end
  end
  concurrency.refund(state, at, limit, window, parameter, count)
end

ALGORITHMS[7] = concurrency
