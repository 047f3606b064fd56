-- Layout LeaseReturn (src/storage/redis/call/lease_return.rs): a holder gives back what it
-- was granted (lease.lua) and did not use, while the window is current. At most what the
-- tally says it still holds, and at most the count: after a reset, a flush or a failover
-- that lost the grant, nothing that others counted since is taken away.
-- KEYS[1]   the counter; KEYS[2] its lease tally.
-- ARGV      hits to give back; the holder's name.
-- Returns   the hits given back.
local function lease_return(keys, argv)
  if fmod == nil then
    bind_globals()
  end
  local unused, holder = to_number(argv[1]), argv[2]
  if unused == nil or holder == nil then
    return malformed('lease_return')
  end
  local held = to_number(redis_call('HGET', keys[2], holder) or 0)
  local count = to_number(redis_call('GET', keys[1]) or 0)
  local back = min(unused, held, count)
  if back <= 0 then
    return 0
  end
  local amount = string_format('%d', back)
  if back == held then
    redis_call('HDEL', keys[2], holder)
  else
    redis_call('HINCRBY', keys[2], holder, '-' .. amount)
  end
  redis_call('DECRBY', keys[1], amount)
  return back
end
