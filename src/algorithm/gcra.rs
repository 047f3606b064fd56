//! GCRA, the generic cell rate algorithm (as redis-cell and go-redis/redis_rate use it;
//! <https://brandur.org/rate-limiting>): one theoretical arrival time (TAT) per key. Each hit
//! pushes the TAT one emission interval (`window / limit`) further; a call is allowed while the
//! new TAT is at most `burst` intervals ahead of now. Same admissions as a token bucket of
//! `burst` tokens refilled at `limit` per `window`, with one number of state.
//!
//! Exact in integers: the TAT is kept as whole µs plus a remainder in 1/`limit` µs, so an
//! emission interval of, say, 1 s / 3 loses nothing to rounding.

use super::outcome::{Charge, Outcome, Taken, div_ceil_u128, never, never_retry, to_u64};
use crate::clock::Micros;

/// The theoretical arrival time: `tat + remainder / limit` µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    pub tat: Micros,
    pub remainder: u64,
}

pub fn decide(
    state: Option<&State>,
    now: Micros,
    limit: u64,
    window: Micros,
    burst: u64,
    hits: u64,
    charge: Charge,
) -> (Option<State>, Outcome) {
    if limit == 0 {
        return (None, never(window));
    }
    // In ticks of 1/limit µs: one hit is `window` ticks, and the tolerance `burst` hits.
    let n = u128::from(limit);
    let now_ticks = u128::from(now) * n;
    let tat = tat_at(state, now_ticks, limit);
    let (interval, tolerance) = (u128::from(window), u128::from(burst) * u128::from(window));
    let need = u128::from(hits.max(1)) * interval;
    let allowed = tat + need - now_ticks <= tolerance;
    let consumed = charge.consumed(allowed, hits);
    // `--count-denied` can charge more than the burst: the TAT then stops at a full burst
    // ahead, as a token bucket stops at empty, so a flood is not paid back forever.
    let new_tat = (tat + u128::from(consumed) * interval).min(tat.max(now_ticks + tolerance));
    let ahead = new_tat - now_ticks;
    let reset_after = to_u64(div_ceil_u128(ahead, n));
    let retry_after = if allowed {
        0
    } else if need > tolerance {
        never_retry(reset_after, window)
    } else {
        to_u64(div_ceil_u128(tat + need - now_ticks - tolerance, n))
    };
    let outcome = Outcome {
        allowed,
        remaining: if allowed {
            to_u64(tolerance.saturating_sub(ahead) / interval)
        } else {
            0
        },
        reset_after,
        retry_after,
    };
    let state = (consumed > 0).then(|| State {
        tat: to_u64(new_tat / n),
        remainder: to_u64(new_tat % n),
    });
    (state, outcome)
}

/// The TAT in ticks of 1/`limit` µs, never before `now_ticks` (a TAT behind now is a full
/// bucket).
fn tat_at(state: Option<&State>, now_ticks: u128, limit: u64) -> u128 {
    let n = u128::from(limit);
    let stored = state.map_or(0, |s| {
        u128::from(s.tat) * n + u128::from(s.remainder.min(limit - 1))
    });
    stored.max(now_ticks)
}

/// Takes up to `want` hits for a lease whose slice is used over the next `life` ticks
/// (`leased::lease`): as if they arrived at the end of the life (the TAT moves to it at the
/// least) and were admitted now, so each is one the bucket admits at every instant of the
/// life. A lease that takes nothing changes nothing. Answers as `token_bucket::lease`.
pub fn lease(
    state: Option<&State>,
    now: Micros,
    limit: u64,
    window: Micros,
    burst: u64,
    want: u64,
    life: Micros,
) -> (Option<State>, Taken) {
    if limit == 0 {
        return (None, Taken::default());
    }
    let n = u128::from(limit);
    let now_ticks = u128::from(now) * n;
    let tat = tat_at(state, now_ticks, limit);
    let (interval, tolerance) = (u128::from(window), u128::from(burst) * u128::from(window));
    let from = tat.max(now_ticks + u128::from(life) * n);
    let room = (now_ticks + tolerance).saturating_sub(from) / interval;
    let granted = u128::from(want).min(room);
    let new_tat = if granted > 0 {
        from + granted * interval
    } else {
        tat
    };
    let ahead = new_tat - now_ticks;
    let taken = Taken {
        granted: to_u64(granted),
        remaining: to_u64(tolerance.saturating_sub(ahead) / interval),
        reset_after: to_u64(div_ceil_u128(ahead, n)),
    };
    let state = (granted > 0).then(|| State {
        tat: to_u64(new_tat / n),
        remainder: to_u64(new_tat % n),
    });
    (state, taken)
}

/// Gives back `count` hits consumed at `at`: the TAT moves back by their intervals, never
/// behind `at`. Like a token bucket, only right while the state is as the consuming call left
/// it (`Refund::IfUnchanged`): a TAT that has fallen behind now has absorbed the difference.
pub fn give_back(
    state: &State,
    at: Micros,
    limit: u64,
    window: Micros,
    burst: u64,
    count: u64,
) -> State {
    if limit == 0 || state.tat < at {
        return *state;
    }
    let n = u128::from(limit);
    let ahead = u128::from(state.tat - at) * n + u128::from(state.remainder);
    let ahead = if count >= burst {
        0
    } else {
        ahead.saturating_sub(u128::from(count) * u128::from(window))
    };
    State {
        tat: at.saturating_add(to_u64(ahead / n)),
        remainder: to_u64(ahead % n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::{
        BASE, check_common, first_denial_at_the_rate, max_in_any_interval, run, secs,
    };
    use crate::algorithm::token_bucket;
    use proptest::prelude::*;

    #[test]
    fn burst_at_once_then_one_per_emission_interval() {
        let call = |s: Option<&State>, now| decide(s, now, 3, secs(1), 3, 1, Charge::IfAllowed);
        let mut state = None;
        for remaining in [2, 1, 0] {
            let (next, outcome) = call(state.as_ref(), BASE);
            assert_eq!((outcome.allowed, outcome.remaining), (true, remaining));
            state = next;
        }
        let (_, empty) = call(state.as_ref(), BASE);
        // One third of a second, rounded up to the µs.
        assert_eq!((empty.allowed, empty.retry_after), (false, 333_334));
        assert!(!call(state.as_ref(), BASE + 333_333).1.allowed);
        assert!(call(state.as_ref(), BASE + 333_334).1.allowed);
    }

    proptest! {
        #[test]
        fn admits_exactly_what_the_token_bucket_admits(
            limit in 1u64..50,
            window_s in 1u64..30,
            burst in 1u64..20,
            steps in proptest::collection::vec((0u64..3_000_000, 0u64..4), 1..300),
        ) {
            let window = secs(window_s);
            let gcra = run(|s, now, hits| decide(s, now, limit, window, burst, hits, Charge::IfAllowed), &steps);
            let bucket = run(
                |s, now, hits| token_bucket::decide(s, now, limit, window, burst, hits, Charge::IfAllowed),
                &steps,
            );
            check_common(&gcra);
            for (g, b) in gcra.iter().zip(&bucket) {
                prop_assert_eq!(g.outcome, b.outcome);
            }
            let bound = burst + (u128::from(limit) * 60_000_000).div_ceil(u128::from(window)) as u64;
            prop_assert!(max_in_any_interval(&gcra, secs(60)) <= bound);
        }

        #[test]
        fn a_client_sending_exactly_at_the_rate_is_never_denied(
            limit in 1u64..1_000,
            window_s in 1u64..3_600,
            burst in 1u64..10,
            calls in 1u64..2_000,
        ) {
            // On a µs clock the k-th hit comes at ceil(k·window/limit): up to 1 µs late, so
            // the gap to the next can be 1 µs short of an interval. A burst of 2 absorbs that;
            // a burst of 1 can only be met by a client whose interval is a whole µs.
            let window = secs(window_s);
            let burst = if burst == 1 && !window.is_multiple_of(limit) { 2 } else { burst };
            let denied = first_denial_at_the_rate(
                |state, now| decide(state, now, limit, window, burst, 1, Charge::IfAllowed),
                limit,
                window,
                calls,
            );
            prop_assert_eq!(denied, None);
        }
    }
}
