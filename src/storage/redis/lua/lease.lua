-- Layout Lease (src/storage/redis/call/lease.rs): a replica takes part of a fixed window's
-- budget (aligned on the epoch) to decide from without a call per hit. The grant is counted
-- as hits are, so the counter never hands out more than its limit, whoever holds it; the
-- lease tally (a hash beside the counter) records what each holder was granted, which bounds
-- what it can give back (lease_return.lua).
-- KEYS[1]   the counter: its key with the window's number appended.
-- KEYS[2]   its lease tally.
-- ARGV      limit; hits asked for; the counter's time to live in ms were it created now (to
--           its window's end, and the grace); the holder's name; what the holder believes
--           the tally holds for it (granted, less what it asked to give back).
-- Returns   {hits granted (at most those asked for, never past the limit), the count after,
--           the number of holders the tally names, 1 if the tally holds at least what the
--           holder believes else 0 (the counter was reset, flushed or rolled back since: the
--           holder's earlier slices of this window are stale)}.
local function lease(keys, argv)
  if fmod == nil then
    bind_globals()
  end
  local limit, want, holder, expected = tonumber(argv[1]), tonumber(argv[2]), argv[4], tonumber(argv[5])
  if limit == nil or want == nil or holder == nil or expected == nil then
    return malformed('lease')
  end
  local intact = 0
  if tonumber(redis.call('HGET', keys[2], holder) or 0) >= expected then
    intact = 1
  end
  local count = tonumber(redis.call('GET', keys[1]) or 0)
  local granted = min(want, max(limit - count, 0))
  if granted > 0 then
    local amount = string.format('%d', granted)
    count = redis.call('INCRBY', keys[1], amount)
    if count == granted then
      redis.call('PEXPIRE', keys[1], argv[3])
    end
    redis.call('HINCRBY', keys[2], holder, amount)
    redis.call('PEXPIRE', keys[2], argv[3])
  end
  return { granted, count, redis.call('HLEN', keys[2]), intact }
end
