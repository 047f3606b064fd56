-- Layout CountOne (src/storage/redis/call/count_one.rs): one charged hit on a fixed window
-- aligned on the epoch, the reference's only algorithm and tollgate's default, alone in its
-- call. The counter is one integer per window, so counting is INCRBY (created with its
-- expiry), undone when over the limit.
-- KEYS[1]   the counter: its key with the window's number appended.
-- ARGV      limit; hits, as text (INCRBY takes it as is); the counter's time to live in ms
--           were it created now (to its window's end, and the grace); "1" with
--           --count-denied (a denied hit counts too), else "0".
-- Returns   the count the counter held before the hit. Whether the hit was admitted, and
--           everything else about the decision, tollgate works out from it by the request
--           rule (src/storage/rule.rs); a lone hit consumes nothing when denied whether or
--           not it vetoes, so nothing here depends on its role.
local function count_one(keys, argv)
  if fmod == nil then
    bind_globals()
  end
  local key, limit, amount = keys[1], to_number(argv[1]), to_number(argv[2])
  if limit == nil or amount == nil then
    return malformed('hit 1')
  end
  if amount == 0 then
    return to_number(redis_call('GET', key) or 0)
  end
  local after = redis_call('INCRBY', key, argv[2])
  if after == amount then
    redis_call('PEXPIRE', key, argv[3])
  end
  local before = after - amount
  if after <= limit then
    return before
  end
  if argv[4] == '1' then
    if after > MAX_COUNT then
      redis_call('SET', key, string_format('%d', MAX_COUNT), 'KEEPTTL')
    end
  elseif before == 0 then
    redis_call('DEL', key)
  else
    redis_call('DECRBY', key, argv[2])
  end
  return before
end
