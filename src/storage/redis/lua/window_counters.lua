-- How counters are read and written. Most keep their state as text under their key
-- (state.lua). A sliding window has two layouts:
--   * text (code 2): its state under its key, `start current previous`, as every build
--     before the counters layout writes it;
--   * counters (code 6): one integer per window under its key with the window's number
--     appended, current + PACK × previous. The previous window's count is copied in when the
--     counter is created, so that a hit reads and writes one key (GET, INCRBY), as a fixed
--     window's. Creating it also closes the previous window's counter, if any (adds CLOSED):
--     a hit decided late, in a window whose successor has begun, finds its counter closed (or
--     none, and the next one's), and counts in the next window, as the algorithm decides on a
--     state of a later window. And it marks the key of the text (MARKER, kept as long as the
--     counter):
--     from then on every replica writes that limit's counters, whatever its layout, and the
--     counts the text held move into the counter.
-- So each layout reads its own first: a replica writing text finds text (or nothing) and
-- does what every earlier build does, unless it finds the marker; one writing counters finds
-- its window's counter, unless the window has none yet. Both layouts count against one
-- counter exactly, and the layout can be switched replica by replica
-- (--redis-sliding-window-layout) once no replica runs an earlier build, which would not
-- know the marker (its calls then fail, rather than miss the counters).
-- A call declares, after its hits' keys, the counter of the window of its instant for each
-- hit that writes counters, in the hits' order (src/storage/redis/call/mod.rs,
-- `window_counter`); other counters are named here when needed (a window's first counted
-- hit, a late one, a marked text), which costs Redis more than a declared key but is rare
-- (an argument costs Redis about as much as the number formatting a name takes).

local SLIDING_TEXT, SLIDING_COUNTERS = 2, 6
ALGORITHMS[SLIDING_COUNTERS] = ALGORITHMS[SLIDING_TEXT]

-- A counter holds current + PACK × previous (+ CLOSED once the next window's exists): counts
-- below PACK (tollgate writes this layout for limits below it), sums below 2^53.
local PACK = 67108864
local CLOSED = 4503599627370496
local MARKER = 'counters'

-- Whether a sliding window's text is the marker. An earlier build's give-back on a marked
-- limit rewrites it empty before its call fails; that is the marker too.
local function is_marker(text)
  return text == MARKER or text == ''
end

-- A counter's value as its current count, its previous count and whether it is closed.
local function unpack_counter(value)
  local closed = value >= CLOSED
  if closed then
    value = value - CLOSED
  end
  local previous = idiv(value, PACK)
  return value - previous * PACK, previous, closed
end

-- The counts a sliding window's text state holds for the window that starts at `start`.
local function stated_counts(state, start, window)
  if state then
    if state[1] == start then
      return state[2], state[3]
    elseif state[1] + window == start then
      return 0, state[2]
    end
  end
  return 0, 0
end

-- The name of window `number`'s counter.
local function counter_name(key, number)
  return string_format('%s:%d', key, number)
end

-- A sliding window at `now` (ticks), its text under `key` and the counter of now's window
-- under `counter` (nil: named here; `missing`: known not to exist), both layouts read: the
-- state a decision sees (nil: nothing stored) and what a write needs to know of where it came
-- from.
local function read_window(key, counter, now, window, limit, missing)
  if limit >= PACK then
    -- Counts past PACK do not fit a counter. Such a limit is written as text (src/storage/
    -- redis/call/mod.rs, Call::code) unless it was raised while its hits were counted: its
    -- calls fail until its counters and marker expire, two windows after its last counted
    -- hit, rather than count past what a counter holds.
    error({ err = 'ERR tollgate: a sliding window limit of 2^26 or more cannot count in its counters; they expire within two windows' })
  end
  local number = idiv(now, window)
  counter = counter or counter_name(key, number)
  local text, value
  if missing then
    text, value = redis_call('GET', key), false
  else
    local got = redis_call('MGET', key, counter)
    text, value = got[1], got[2]
  end
  local found = { counter = counter, marked = is_marker(text) }
  local state = text and not found.marked and parse_state(text)
  local current, previous, closed, before = 0, 0, true, false
  while closed do
    if value then
      current, previous, closed = unpack_counter(to_number(value))
      if closed then
        -- The next window has begun: the hit counts there.
        number = number + 1
        found.counter = counter_name(key, number)
        value = redis_call('GET', found.counter)
      end
    else
      -- No counter for the window: the next window's if it has begun (a hit decided late
      -- counts there), else the previous window's count is that window's own.
      local before_name, after_name = counter_name(key, number - 1), counter_name(key, number + 1)
      local around = redis_call('MGET', before_name, after_name)
      if around[2] then
        number, found.counter, value = number + 1, after_name, around[2]
      else
        -- (A closed counter whose successor is gone, expired or deleted, counts no more.)
        found.before, before, closed, current = before_name, around[1], false, 0
        if before then
          local count, _, before_closed = unpack_counter(to_number(before))
          previous, found.open_before = count, not before_closed
        end
      end
    end
  end
  found.exists = value ~= false
  if state and state[1] > number * window then
    -- Text of a later window (a replica's clock far ahead): that window's.
    return read_window(key, nil, state[1], window, limit)
  end
  local start = number * window
  found.stated_current, found.stated_previous = stated_counts(state, start, window)
  found.counted_current, found.counted_previous = current, previous
  if not (state or value or before) then
    return nil, found
  end
  return { start, found.stated_current + current, found.stated_previous + previous }, found
end

-- Writes what changed from `found` (read by read_window: the call writes counters, or the
-- text was marked) to `after` (a state at the same start): hits gained to the window's
-- counter, hits given back off the counters first, then the text. `ttl` (ms): the expiry of
-- what is created or rewritten; nil: keep it.
local function write_window(key, found, after, ttl)
  local stated_current, stated_previous = found.stated_current, found.stated_previous
  local current, previous = found.counted_current, found.counted_previous
  local gained = after[2] - stated_current - current
  local gained_before = after[3] - stated_previous - previous
  if gained < 0 then
    local taken = min(-gained, current)
    current, stated_current = current - taken, stated_current + gained + taken
  else
    current = current + gained
  end
  if gained_before < 0 then
    local taken = min(-gained_before, previous)
    previous, stated_previous = previous - taken, stated_previous + gained_before + taken
  end
  if found.exists then
    local change = current - found.counted_current + PACK * (previous - found.counted_previous)
    if change ~= 0 then
      redis_call('INCRBY', found.counter, change)
    end
  elseif current > 0 then
    -- The window's first counted hit: the counts of the text and of the previous window's
    -- counter move in, that counter (if any) is closed, the text marked.
    local total = min(current + stated_current, PACK - 1) + PACK * min(previous + stated_previous, PACK - 1)
    redis_call('SET', found.counter, total, 'PX', ttl)
    if found.open_before then
      redis_call('INCRBY', found.before, CLOSED)
    end
    redis_call('SET', key, MARKER, 'PX', ttl)
    return
  elseif previous < found.counted_previous then
    redis_call('DECRBY', found.before, found.counted_previous - previous)
  end
  if stated_current ~= found.stated_current or stated_previous ~= found.stated_previous then
    local text = string_format('%d %d %d', after[1], stated_current, stated_previous)
    if ttl then
      redis_call('SET', key, text, 'PX', ttl)
    else
      redis_call('SET', key, text, 'KEEPTTL')
    end
  end
end

-- A counter of algorithm `code` at `now` (ticks), under `key` (a sliding window written as
-- counters: its window's counter under `counter`): its state (nil or false: none), what a
-- write needs of it (nil: the state as text is all), and that text. A sliding window written
-- as text is read as text unless marked.
local function read_counter(key, code, counter, now, window, limit)
  if code == SLIDING_COUNTERS then
    return read_window(key, counter, now, window, limit)
  end
  local raw = redis_call('GET', key)
  if code == SLIDING_TEXT and is_marker(raw) then
    return read_window(key, nil, now, window, limit)
  end
  return raw and parse_state(raw), nil, raw
end

-- Stores `after`, read as `found` by read_counter, with `ttl` ms to live (nil: keep it).
local function write_counter(key, found, after, ttl)
  if found then
    write_window(key, found, after, ttl)
  elseif ttl then
    redis_call('SET', key, encode_state(after), 'PX', ttl)
  else
    redis_call('SET', key, encode_state(after), 'KEEPTTL')
  end
end

-- A lone hit on a sliding window read in both layouts, its text under `key` and the counter of
-- now's window under `counter` (nil: named here; `missing`: known not to exist): the state
-- found, the layouts' sum.
local function decide_window(key, counter, now, limit, window, amount, charge, tick, grace, missing)
  local state, found = read_window(key, counter, now, window, limit, missing)
  local new_state, _, _, reset_after =
    sliding_window.decide(state, now, limit, window, 0, amount, charge == 1)
  if new_state then
    write_window(key, found, new_state, ttl_ms(reset_after * tick, grace))
  end
  return state
end

-- A lone hit on a sliding window written as counters (Layout DecideOne), at `now` (ticks),
-- its text at keys[1] and its window's counter at keys[2]. Finding that counter open, it is
-- decided on that one key here, without the tables read_window builds (what a lone hit costs
-- Redis is most of what tollgate asks of it), and the counts found are answered, current +
-- PACK × previous; otherwise as any counter (read_window), answering the layouts' sum as its
-- three numbers (src/storage/redis/call/decide_one.rs; nil: nothing stored).
local function decide_counted_window(keys, now, limit, window, amount, charge, tick, grace)
  local value = redis_call('GET', keys[2])
  if value then
    local current, previous, closed = unpack_counter(to_number(value))
    if not closed then
      local elapsed = fmod(now, window)
      local consumed = amount
      if charge ~= 1 and not sliding_window.admits(current, previous, elapsed, limit, window, max(amount, 1)) then
        consumed = 0
      end
      local gained = min(current + consumed, limit) - current
      if gained > 0 then
        redis_call('INCRBY', keys[2], gained)
      end
      return current + PACK * previous
    end
  end
  return decide_window(keys[1], keys[2], now, limit, window, amount, charge, tick, grace, not value)
end

-- Where the counter of each hit written as counters is among a call's keys, after its `n`
-- hits' (nil: none), from its algorithm code at h[stride × (i - 1) + 1]; and how many keys
-- the call declares in all.
local function window_counters_at(h, n, stride)
  local at, next_at = {}, n + 1
  for i = 1, n do
    if h[stride * (i - 1) + 1] == SLIDING_COUNTERS then
      at[i], next_at = next_at, next_at + 1
    end
  end
  return at, next_at - 1
end
