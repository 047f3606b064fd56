//! Token bucket: `burst` tokens, refilled continuously at `limit` tokens per `window`; a call
//! takes one token per hit. Kept exactly in integers by counting tokens in units of
//! 1/`window` (so one µs of refill adds `limit` units and a token is `window` units).
//!
//! Guarantee: in any interval of length t, at most `burst + limit × t / window` admitted; a
//! client sending exactly at the rate is never denied; `burst` at once after a quiet period.
//! State: two numbers (tokens, last update).

use super::outcome::{Charge, Outcome, Taken, div_ceil_u128, never, never_retry, to_u64};
use crate::clock::Micros;

/// The bucket's level, in units of 1/`window` token, at `updated`. At most `burst × window`,
/// which `Params::tick` keeps within 2^52, so it is stored in 64 bits (the arithmetic is in
/// 128); were it ever larger, the stored level saturates, which only under-admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    pub level: u64,
    pub updated: Micros,
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
    let (rate, token) = (u128::from(limit), u128::from(window));
    let capacity = u128::from(burst) * token;
    let (level, updated) = level_at(state, now, rate, capacity);
    let need = u128::from(hits.max(1)) * token;
    let allowed = need <= level;
    let consumed = charge.consumed(allowed, hits);
    let level_after = level.saturating_sub(u128::from(consumed) * token);
    let refill = |missing: u128| to_u64(div_ceil_u128(missing, rate));
    let reset_after = refill(capacity - level_after);
    let retry_after = if allowed {
        0
    } else if need > capacity {
        never_retry(reset_after, window)
    } else {
        refill(need - level)
    };
    let outcome = Outcome {
        allowed,
        remaining: if allowed {
            to_u64(level_after / token)
        } else {
            0
        },
        reset_after,
        retry_after,
    };
    let state = (consumed > 0).then_some(State {
        level: to_u64(level_after),
        updated,
    });
    (state, outcome)
}

/// The level at `now`, refilled at `rate` since the last update up to `capacity` (a clock
/// stepping back refills nothing; no state: full), and the instant it is then kept at.
fn level_at(state: Option<&State>, now: Micros, rate: u128, capacity: u128) -> (u128, Micros) {
    match state {
        Some(state) => {
            let refill = u128::from(now.saturating_sub(state.updated)) * rate;
            let level = (u128::from(state.level) + refill).min(capacity);
            (level, state.updated.max(now))
        }
        None => (capacity, now),
    }
}

/// Takes up to `want` tokens for a lease whose slice is used over the next `life` ticks
/// (`leased::lease`): only tokens the bucket would hand out at every instant of that life, so
/// what the refill of the life would add is held back (the level is capped at the capacity
/// less it). A lease that takes nothing changes nothing. Answers the state, the tokens taken,
/// those left, and the ticks until the bucket is full.
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
    let (rate, token) = (u128::from(limit), u128::from(window));
    let capacity = u128::from(burst) * token;
    let (level, updated) = level_at(state, now, rate, capacity);
    let usable = level.min(capacity.saturating_sub(u128::from(life) * rate));
    let granted = u128::from(want).min(usable / token);
    let level_after = if granted > 0 {
        usable - granted * token
    } else {
        level
    };
    let taken = Taken {
        granted: to_u64(granted),
        remaining: to_u64(level_after / token),
        reset_after: to_u64(div_ceil_u128(capacity - level_after, rate)),
    };
    let state = (granted > 0).then_some(State {
        level: to_u64(level_after),
        updated,
    });
    (state, taken)
}

/// Gives back `count` tokens. Only right while the bucket is as the consuming call left it:
/// once time has passed, the refill cap may have absorbed part of what was taken, and giving
/// it all back would hand out tokens nobody paid for (hence `Refund::IfUnchanged`).
pub fn give_back(state: &State, window: Micros, burst: u64, count: u64) -> State {
    let capacity = u128::from(burst) * u128::from(window);
    let level = if count >= burst {
        capacity
    } else {
        (u128::from(state.level) + u128::from(count) * u128::from(window)).min(capacity)
    };
    State {
        level: to_u64(level),
        ..*state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::{
        BASE, check_common, first_denial_at_the_rate, max_in_any_interval, run, secs,
    };
    use proptest::prelude::*;

    #[test]
    fn burst_at_once_then_one_per_interval() {
        let call = |s: Option<&State>, now| decide(s, now, 1, secs(2), 5, 1, Charge::IfAllowed);
        let mut state = None;
        for remaining in (0..5).rev() {
            let (next, outcome) = call(state.as_ref(), BASE);
            assert_eq!((outcome.allowed, outcome.remaining), (true, remaining));
            state = next;
        }
        let (_, empty) = call(state.as_ref(), BASE);
        assert_eq!(
            (empty.allowed, empty.retry_after, empty.reset_after),
            (false, secs(2), secs(10))
        );
        let (_, early) = call(state.as_ref(), BASE + secs(2) - 1);
        assert!(!early.allowed);
        let (state, refilled) = call(state.as_ref(), BASE + secs(2));
        assert_eq!((refilled.allowed, refilled.remaining), (true, 0));
        assert!(!call(state.as_ref(), BASE + secs(3)).1.allowed);
    }

    proptest! {
        #[test]
        fn admitted_stays_within_burst_plus_rate_times_t(
            limit in 1u64..20,
            window_s in 1u64..30,
            burst in 1u64..20,
            steps in proptest::collection::vec((0u64..3_000_000, 0u64..3), 1..300),
            span_s in 1u64..90,
        ) {
            let window = secs(window_s);
            let trace = run(|s, now, hits| decide(s, now, limit, window, burst, hits, Charge::IfAllowed), &steps);
            check_common(&trace);
            // Any half-open interval of length t holds at most burst + limit·t/window, rounded
            // up for the hit at the interval's end.
            let t = secs(span_s);
            let bound = burst + (u128::from(limit) * u128::from(t)).div_ceil(u128::from(window)) as u64;
            prop_assert!(max_in_any_interval(&trace, t) <= bound);
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
