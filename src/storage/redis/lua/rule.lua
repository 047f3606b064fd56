-- The request rule of src/storage/rule.rs, written once for every layout that decides several
-- hits together: a request (or the part of it a call holds, `complete` false) is vetoed when an
-- enforced descriptor is over, or, when the call holds the whole request, when it has quota
-- descriptors and every one is over; shadow hits never veto. A descriptor is over when any of
-- its hits is denied; its hits are adjacent.
-- A hit's role, as packed (call/numbers.rs, `role_code`): 0 enforced, 1 quota, 2 shadow,
-- 3 refund (never over: a refund is answered allowed); with ALWAYS added (`role_and_charge`)
-- for a charge that counts whether admitted or not.
local ENFORCED, QUOTA, ALWAYS = 0, 1, 4

-- `allowed[i]` says whether hit i fits; its role and descriptor index are h[at(i) + role_at]
-- and h[at(i) + descriptor_at], at(i) = first + (i - 1) * stride.
local function vetoes(h, n, allowed, first, stride, role_at, descriptor_at, complete)
  local quota, quota_over = 0, 0
  local i = 1
  while i <= n do
    local at = first + (i - 1) * stride
    local descriptor, role, over = h[at + descriptor_at], h[at + role_at] % ALWAYS, false
    while i <= n and h[first + (i - 1) * stride + descriptor_at] == descriptor do
      over = over or not allowed[i]
      i = i + 1
    end
    if role == ENFORCED and over then
      return true
    elseif role == QUOTA then
      quota = quota + 1
      if over then
        quota_over = quota_over + 1
      end
    end
  end
  return complete and quota > 0 and quota == quota_over
end
