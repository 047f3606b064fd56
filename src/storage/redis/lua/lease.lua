-- Layout Lease (src/storage/redis/call/lease.rs): a replica takes part of a fixed window's
-- budget (aligned on the epoch) to decide from without a call per hit. The grant is counted
-- as hits are, so the counter never hands out more than its limit, whoever holds it; the
-- lease tally (a hash beside the counter) records what each holder was granted, which bounds
-- what it can give back (lease_return.lua).
-- KEYS[1]   the counter: its key with the window's number appended.
-- KEYS[2]   its lease tally.
-- ARGV      limit; hits asked for; the counter's time to live in ms were it created now (to
--           its window's end, and the grace); the holder's name.
-- Returns   {hits granted (at most those asked for, never past the limit), the count after,
--           the number of holders the tally names}.
local function lease(keys, argv)
  if fmod == nil then
    bind_globals()
  end
  local limit, want, holder = tonumber(argv[1]), tonumber(argv[2]), argv[4]
  if limit == nil or want == nil or holder == nil then
    return malformed('lease')
  end
  local count = tonumber(redis.call('GET', keys[1]) or 0)
  local granted = min(want, max(limit - count, 0))
  if granted > 0 then
    count = redis.call('INCRBY', keys[1], granted)
    if count == granted then
      redis.call('PEXPIRE', keys[1], argv[3])
    end
    redis.call('HINCRBY', keys[2], holder, granted)
    redis.call('PEXPIRE', keys[2], argv[3])
  end
  return { granted, count, redis.call('HLEN', keys[2]) }
end
