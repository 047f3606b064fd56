-- A counter's state as Redis stores it: its numbers (src/algorithm/state.rs, State::numbers)
-- separated by spaces, under its key; a fixed window aligned on the epoch is one integer per
-- window, under its key with the window's number appended. Where a lone hit wrote it packed
-- (`--redis-state-layout packed`; `lone_hit` in gcra.lua, token_bucket.lua and
-- sliding_log.lua), a state is a tag byte no text starts with, then each number as a
-- little-endian 64-bit integer, kept for the expiry tollgate sends, so that Redis formats no
-- number: a bucket's two numbers are PACKED_PAIR (kept for the longest the bucket can take to
-- fill, then the grace), a sliding log's runs PACKED_LOG_TAG and theirs (kept as its text would
-- be). Every path reads both forms, and fails on a tag with neither after it; only a packed
-- lone hit writes the packed one.
local PACKED_PAIR, PACKED_TAG, PACKED_LENGTH = '<i1i8i8', -1, 17

-- A state of two numbers, packed or as text: its numbers, or nil for any other value. A
-- packed number out of a state's range (no tollgate writes one) fails the call, as tollgate
-- refuses it: read as anything else, its bytes would be taken for digits.
local function read_pair(raw)
  if #raw == PACKED_LENGTH then
    local tag, a, b = unpack_numbers(PACKED_PAIR, raw)
    if tag == PACKED_TAG then
      if a < 0 or b < 0 or a > MAX_COUNT or b > MAX_COUNT then
        error('a packed state out of range')
      end
      return a, b
    end
  end
  local a, b = string_match(raw, '^(%d+) (%d+)$')
  if a then
    return to_number(a), to_number(b)
  end
end

-- A packed log: PACKED_LOG_TAG, then each run's instant and hits, at most LONGEST_PACKED_LOG
-- runs (only a log of a limit that small takes lone hits: numbers.rs, LONGEST_LOG). Read by
-- one unpack with the tag, which tells it from a text as long, and unsigned, so that a
-- negative number reads past MAX_COUNT. The formats by length (read) and by count of numbers
-- (written), made once each.
local PACKED_LOG_TAG, LONGEST_PACKED_LOG = -2, 64
local PACKED_LOG_LONGEST = 1 + 16 * LONGEST_PACKED_LOG
local PACKED_LOG_TAG_BYTE, PACKED_LOG_RUN, PACKED_RUN = '\254', '<i1i8i8', '<I8I8'
local PACKED_LOG_READS, PACKED_LOG_WRITES = {}, {}

-- The format a packed log `length` bytes long is read by; nil when none is that long.
local function packed_log_read(length)
  if length % 16 ~= 1 or length > PACKED_LOG_LONGEST then
    return nil
  end
  local format = '<i1' .. string.rep('I8', (length - 1) / 8)
  PACKED_LOG_READS[length] = format
  return format
end

local function packed_log_write(count)
  local format = '<i1' .. string.rep('i8', count)
  PACKED_LOG_WRITES[count] = format
  return format
end

-- A log's numbers, when `raw` is one packed: unpacked, its tag first and the position after
-- it last (`parse_state` copies the numbers between); else nil.
local function unpack_packed_log(raw)
  local length = #raw
  local format = PACKED_LOG_READS[length] or packed_log_read(length)
  if format == nil then
    return nil
  end
  local numbers = { unpack_numbers(format, raw) }
  if numbers[1] ~= PACKED_LOG_TAG then
    return nil
  end
  return numbers
end

-- The usual states, two or three numbers, are written by one format each; a sliding log's
-- can hold thousands: more than one call can take.
local STATE_FORMATS = { '%d', '%d %d', '%d %d %d' }

-- The usual states are taken apart by one match each; a sliding log's number by number.
local function parse_state(raw)
  local a, b = read_pair(raw)
  if a then
    return { a, b }
  end
  local c
  a, b, c = string_match(raw, '^(%d+) (%d+) (%d+)$')
  if a then
    return { to_number(a), to_number(b), to_number(c) }
  end
  local numbers = #raw % 16 == 1 and unpack_packed_log(raw)
  if numbers then
    local state = {}
    for i = 2, #numbers - 1 do
      if numbers[i] > MAX_COUNT then
        error('a packed state out of range')
      end
      state[i - 1] = numbers[i]
    end
    return state
  end
  -- A tag with no packed form after it: its bytes would be taken for digits. (A log given
  -- back entirely is stored empty.)
  local tag = string.byte(raw, 1)
  if tag and tag >= 254 then
    error('a packed state malformed')
  end
  local state = {}
  for number in string.gmatch(raw, '%d+') do
    state[#state + 1] = to_number(number)
  end
  return state
end

-- The state under `key`, or false.
local function read_state(key)
  local raw = redis_call('GET', key)
  if not raw then
    return false
  end
  return parse_state(raw)
end

local function encode_state(state)
  local format = STATE_FORMATS[#state]
  if format then
    return string_format(format, state[1], state[2], state[3]) -- extra arguments are ignored
  end
  local parts = {}
  for i, number in ipairs(state) do
    parts[i] = string_format('%d', number)
  end
  return table.concat(parts, ' ')
end

-- How long a counter is kept: until its limit is fully available again (`reset_after` µs),
-- then the grace (ms; src/storage/redis/clock.rs).
local function ttl_ms(reset_after, grace)
  return max(div_ceil(reset_after, 1000), 1) + grace
end
