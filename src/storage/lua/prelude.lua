-- tollgate counter script, part 1 of 7: shared helpers. The parts are concatenated, in the
-- order of src/storage/script.rs, into one script loaded once (SCRIPT LOAD) and called by
-- EVALSHA.
--
-- Exactness: Lua numbers are doubles, exact for integers up to 2^53. Every value below stays
-- within 2^52 (src/algorithm/mod.rs: EXACT_BOUND, Params::tick), products that could exceed
-- it are guarded by a comparison first, and division goes through math.fmod, which is exact,
-- so each function returns exactly what its Rust twin in src/algorithm/ returns.
-- Conventions, as in Rust: times in ticks; a function returns
-- new_state (nil: leave it), allowed, remaining, reset_after, retry_after.

-- floor(a / b) for non-negative integers.
local function idiv(a, b)
  return (a - math.fmod(a, b)) / b
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
  return math.max(reset_after, window)
end

-- A limit that admits nothing, ever (requests_per_unit: 0).
local function never(window)
  return nil, false, 0, window, window
end

-- Hits a call consumes.
local function consumed_by(allowed, charge, hits)
  if allowed or charge then
    return hits
  end
  return 0
end
