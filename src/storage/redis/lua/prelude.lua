-- tollgate counter code: shared helpers. src/storage/redis/library.rs joins this prelude, one
-- file per algorithm and apply.lua into a Redis function library (FUNCTION LOAD once, FCALL per
-- call) and, for servers without functions (Redis before 7), into a script (EVALSHA).
--
-- Exactness: Lua numbers are doubles, exact for integers up to 2^53. Every value below stays
-- within 2^52 (src/algorithm/mod.rs: EXACT_BOUND, Params::tick), products that could exceed
-- it are guarded by a comparison first, and division goes through math.fmod, which is exact,
-- so each function returns exactly what its Rust twin in src/algorithm/ returns.
-- Each algorithm file defines a table with the two functions of its Rust twin, under the
-- same names, and registers it in ALGORITHMS by its key tag (Algorithm::key_tag):
--   decide(state, now, limit, window, parameter, hits, charge)
--     -> new_state (nil: leave it), allowed, remaining, reset_after, retry_after
--   give_back(state, at, limit, window, parameter, count)
--     -> nothing; returns `count` hits consumed at `at` to `state`, in place
-- Times are in ticks; `parameter` is Algorithm::parameter_in_ticks; a state is its list of
-- numbers, as stored.

-- The algorithms by key tag; apply.lua refuses a tag it does not find here.
local ALGORITHMS = {}

-- math's functions and struct.unpack, as upvalues: looking one up as a global (the
-- environment, then the library table) costs Redis more than the arithmetic around it. A
-- library cannot read globals other than `redis` while it loads, so each entry point binds
-- them on its first call.
local max, min, fmod, unpack_numbers
local function bind_globals()
  max, min, fmod, unpack_numbers = math.max, math.min, math.fmod, struct.unpack
end

-- A hit's role as tollgate packs it, and as the veto rule (vetoes) reads it.
local ROLE_TAGS = { [0] = 'e', [1] = 'q', [2] = 's' }

-- Numbers tollgate packs into one argument are read by struct.unpack with a format of one
-- 'i8' per number after '<': each a little-endian signed 64-bit integer (exact in Lua up to
-- 2^53; tollgate sends none past 2^52). One argument holding n numbers costs Redis one
-- argument object and one Lua string, where n arguments cost n of each and n conversions from
-- text: on a call of a few numbers, about a sixth of what the call cost.

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

-- The veto rule of src/storage/mod.rs (rejects): an enforced descriptor over, or, when the
-- call holds the whole request (`complete`), every quota descriptor over. `allowed[i]` says
-- whether hit i fits; its role (e|q|s) and descriptor index are ARGV[at(i) + role_at] and
-- ARGV[at(i) + descriptor_at], at(i) = first + (i - 1) * stride (a descriptor's hits are
-- adjacent).
local function vetoes(ARGV, n, allowed, first, stride, role_at, descriptor_at, complete)
  local quota, quota_over = 0, 0
  local i = 1
  while i <= n do
    local at = first + (i - 1) * stride
    local descriptor, role, over = ARGV[at + descriptor_at], ARGV[at + role_at], false
    while i <= n and ARGV[first + (i - 1) * stride + descriptor_at] == descriptor do
      over = over or not allowed[i]
      i = i + 1
    end
    if role == 'e' and over then
      return true
    elseif role == 'q' then
      quota = quota + 1
      if over then
        quota_over = quota_over + 1
      end
    end
  end
  return complete and quota > 0 and quota == quota_over
end

-- Hits a call consumes (Charge::consumed).
local function consumed_by(allowed, charge, hits)
  if allowed or charge then
    return hits
  end
  return 0
end
