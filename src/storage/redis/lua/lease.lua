-- Layout Lease (src/storage/redis/call/lease.rs): a replica takes part of a busy counter's
-- budget to decide from without a call per hit. A fixed window's (aligned on the epoch) is
-- counted as hits are, so the counter never hands out more than its limit, whoever holds it;
-- a bucket's (token bucket, GCRA) is taken by its algorithm's `lease` (src/algorithm/
-- leased.rs): hits the bucket admits at every instant of the slice's life. Beside the counter,
-- the lease tally (a hash): a fixed window's records what each holder was granted, which
-- bounds what it can give back of a window (lease_return.lua) and tells a holder whether the
-- counter was reset; a bucket's names each holder with the end of its last slice's life, so
-- that holders whose slices have ended (a replica gone) are no longer counted. A bucket's
-- slices need no reset check: each ends with its life.
-- KEYS[1]   the counter: a fixed window's key with the window's number appended; a bucket's
--           key.
-- KEYS[2]   its lease tally.
-- ARGV[1]   packed: algorithm code, requests, window (µs), tick (µs), parameter (ticks), hits
--           asked for, the instant (µs), the slice's life (µs), the counter's time to live in
--           ms were it created now (a fixed window: to its end, and the grace) or the grace
--           (a bucket: its state lives until it is full, then the grace), and what the holder
--           believes the tally holds for it (granted, less what it asked to give back).
-- ARGV[2]   the holder's name.
-- Returns   {hits granted (at most those asked for, never past the limit), the hits nobody
--           holds after (what a hit decided now would find; a fixed window's below 0 when a
--           charge that counts whether admitted or not took it past its limit), the number
--           of holders the tally
--           names (a bucket's: whose slices still live), 1 if the tally holds at least what the
--           holder believes else 0 (a fixed window reset, flushed or rolled back since: the
--           holder's earlier slices are stale; always 1 for a bucket),
--           the bucket's state after (its two numbers; -1 -1 for a fixed window), the time
--           until the full limit is available again (µs)}.
local PER_LEASE = 10

-- The holders a bucket's tally names whose slices live past `at`; those whose have ended
-- are taken out.
local function live_holders(tally, at)
  local entries, live = redis_call('HGETALL', tally), 0
  for i = 1, #entries, 2 do
    if to_number(entries[i + 1]) > at then
      live = live + 1
    else
      redis_call('HDEL', tally, entries[i])
    end
  end
  return live
end

local function lease(keys, argv)
  if fmod == nil then
    bind_globals()
  end
  local packed, holder = argv[1], argv[2]
  if packed == nil or holder == nil or #packed ~= 8 * PER_LEASE or #keys ~= 2 then
    return malformed('lease')
  end
  local h = numbers(packed, 1, PER_LEASE)
  local code, limit, window_us, tick, parameter = h[1], h[2], h[3], h[4], h[5]
  local want, at, life, ttl, expected = h[6], h[7], h[8], h[9], h[10]
  if (code ~= 0 and ALGORITHMS[code] == nil) or tick < 1 or window_us < 1 then
    return malformed('lease')
  end
  local intact, holders = 1, 0
  local granted, remaining, reset_after, state = 0, 0, 0, nil
  if code == 0 then
    if to_number(redis_call('HGET', keys[2], holder) or 0) < expected then
      intact = 0
    end
    local count = to_number(redis_call('GET', keys[1]) or 0)
    granted = min(want, max(limit - count, 0))
    if granted > 0 then
      count = redis_call('INCRBY', keys[1], string_format('%d', granted))
      if count == granted then
        redis_call('PEXPIRE', keys[1], ttl)
      end
    end
    -- Below 0 when a charge that counts whether admitted or not took the count past the
    -- limit: the caller then drops what it holds.
    remaining, reset_after = limit - count, window_us - fmod(at, window_us)
    if granted > 0 then
      redis_call('HINCRBY', keys[2], holder, string_format('%d', granted))
      redis_call('PEXPIRE', keys[2], ttl)
    end
    holders = redis_call('HLEN', keys[2])
  else
    local window = max(idiv(window_us, tick), 1)
    local life_ticks = idiv(life + tick - 1, tick) + 1
    state, granted, remaining, reset_after = ALGORITHMS[code].lease(read_state(keys[1]) or nil,
      idiv(at, tick), limit, window, parameter, want, life_ticks)
    reset_after = reset_after * tick
    local grace = ttl
    if state then
      redis_call('SET', keys[1], encode_state(state), 'PX', ttl_ms(reset_after, grace))
      redis_call('HSET', keys[2], holder, string_format('%d', at + life))
      redis_call('PEXPIRE', keys[2], div_ceil(life, 1000) + grace)
    end
    holders = live_holders(keys[2], at)
  end
  local first, second = -1, -1
  if state then
    first, second = state[1], state[2]
  end
  return { granted, remaining, holders, intact, first, second, reset_after }
end
