-- tollgate counter code: shared helpers. src/storage/redis/library.rs joins this prelude, the
-- request rule (rule.lua), the state format (state.lua), one file per algorithm and one file
-- per call layout (the layouts of src/storage/redis/call/) into a Redis function library
-- (FUNCTION LOAD once, FCALL per call) and, for servers without functions (Redis before 7),
-- into one script per function (EVALSHA).
--
-- Exactness: Lua numbers are doubles, exact for integers up to 2^53. Every value below stays
-- within 2^52 (src/algorithm/mod.rs: EXACT_BOUND, Params::tick), products that could exceed
-- it are guarded by a comparison first, and division goes through math.fmod, which is exact,
-- so each function returns exactly what its Rust twin in src/algorithm/ returns.
-- Each algorithm file defines a table with the functions of its Rust twin, under the same
-- names, and registers it in ALGORITHMS by its code (src/storage/redis/call/numbers.rs,
-- `code`):
--   decide(state, now, limit, window, parameter, hits, charge)
--     -> new_state (nil: leave it), allowed, remaining, reset_after, retry_after
--   give_back(state, at, limit, window, parameter, count)
--     -> nothing; returns `count` hits consumed at `at` to `state`, in place
--   refund(state, now, limit, window, parameter, count)
--     -> nothing; gives `count` hits back at `now` (algorithm::refund), in place
-- and its decision for a lone hit written out (decide_one.lua):
--   lone_hit(key, raw, now, limit, window, parameter, hits, charge, tick, grace, packed)
--     -> false when `raw` (the value stored, or nil) is not of its usual form; else true,
--        what the hit consumed written under `key` (packed, when `packed`, the expiry to
--        write it with, is given; state.lua). The sliding log's takes only packed hits.
-- Times are in ticks; `parameter` is Algorithm::parameter_in_ticks; a state is its list of
-- numbers, as stored (state.lua).

-- The algorithms by code; a layout refuses a code it does not find here.
local ALGORITHMS = {}

-- The largest count a fixed window stores (algorithm::MAX_COUNT, 2^52).
local MAX_COUNT = 4503599627370496

-- redis.call and the functions numbers are unpacked, parsed, formatted and compared by, as
-- upvalues: looking one up as a global (the environment, then the library table) costs Redis
-- more than the arithmetic around it. A library cannot read globals other than `redis` while
-- it loads, so each layout binds them on its first call.
local max, min, fmod, unpack_numbers, string_match, to_number, string_format, redis_call
local redis_pcall, pack_numbers, unpack_list, string_sub
local function bind_globals()
  max, min, fmod, unpack_numbers = math.max, math.min, math.fmod, struct.unpack
  string_match, to_number, string_format = string.match, tonumber, string.format
  redis_call, redis_pcall, pack_numbers = redis.call, redis.pcall, struct.pack
  unpack_list, string_sub = unpack, string.sub
end

-- The numbers of a call come packed into one argument (src/storage/redis/call/numbers.rs),
-- each a little-endian signed 64-bit integer (exact in Lua up to 2^53; tollgate sends none
-- past 2^52), read by struct.unpack. `numbers(packed, from, count)` reads `count` of them
-- starting at byte `from` (1-based) into a list, a bounded number per unpack (Lua's stack
-- holds about 8,000 results).
local FORMATS = {}
local CHUNK = 4000
local function numbers(packed, from, count)
  if count <= CHUNK then
    -- One unpack holds them all (its last result, the position after them, is left at the
    -- end of the list: copying the numbers out would cost more than it).
    local format = FORMATS[count]
    if format == nil then
      format = '<' .. string.rep('i8', count)
      FORMATS[count] = format
    end
    return { unpack_numbers(format, packed, from) }
  end
  local out, at = {}, from
  while #out < count do
    local take = min(count - #out, CHUNK)
    local format = FORMATS[take]
    if format == nil then
      format = '<' .. string.rep('i8', take)
      FORMATS[take] = format
    end
    local chunk = { unpack_numbers(format, packed, at) }
    for i = 1, take do
      out[#out + 1] = chunk[i]
    end
    at = chunk[take + 1]
  end
  return out
end

-- The keys of a cross-slot call, which declares none (Redis requires declared keys to share a
-- slot): the arguments from `first` on.
local function keys_from(argv, first)
  local keys = {}
  for i = first, #argv do
    keys[#keys + 1] = argv[i]
  end
  return keys
end

local function malformed(what)
  return redis.error_reply('ERR tollgate: malformed ' .. what)
end

-- floor(a / b) for non-negative integers.
local function idiv(a, b)
  return (a - fmod(a, b)) / b
end

-- ceil(a / b) for non-negative integers; 0 when b is 0.
local function div_ceil(a, b)
  if b == 0 then
    return 0
  end
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- A call that can never be admitted waits at least a window.
local function never_retry(reset_after, window)
  return max(reset_after, window)
end

-- A limit that admits nothing, ever (requests_per_unit: 0).
local function never(window)
  return nil, false, 0, window, window
end

-- Hits a call consumes (Charge::consumed).
local function consumed_by(allowed, charge, hits)
  if allowed or charge then
    return hits
  end
  return 0
end
