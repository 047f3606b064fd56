//! Sliding window counter, as Cloudflare describes it
//! (<https://blog.cloudflare.com/counting-things-a-lot-of-different-things/>): the counts of
//! the current and the previous epoch-aligned window, with the previous one weighted by the
//! share of it that a window ending now still covers:
//! `estimate = previous × (window − elapsed) / window + current`, allowed while
//! `estimate + hits <= limit` (compared exactly, multiplied through by `window`).
//!
//! Guarantee: smooth where fixed windows let `2 × limit` through at a boundary, with two
//! numbers of state. It is an estimate: hits bunched at the end of one window followed by
//! steady traffic can still reach up to `2 × limit − 1` in one window-long interval
//! (measured in the property test and documented in docs/algorithms.md).

use super::outcome::{Charge, Outcome, never_retry, to_u64};
use crate::clock::Micros;

/// The current window's start and the counts of it and of the window before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    pub window_start: Micros,
    pub current: u64,
    pub previous: u64,
}

pub fn decide(
    state: Option<&State>,
    now: Micros,
    limit: u64,
    window: Micros,
    hits: u64,
    charge: Charge,
) -> (Option<State>, Outcome) {
    let current = roll(state, now, window);
    // A clock stepping back into an earlier window counts as the start of the stored one.
    let now = now.max(current.window_start);
    let elapsed = now - current.window_start;
    let (n, w) = (u128::from(limit), u128::from(window));
    // Weighted previous count, times `window`.
    let carried = u128::from(current.previous) * (w - u128::from(elapsed));
    let fits = |count: u64| carried + u128::from(count) * w <= n * w;
    let allowed = fits(current.current.saturating_add(hits.max(1)));
    let consumed = charge.consumed(allowed, hits);
    // Only `--count-denied` can push a count past the limit; a window counts at most `limit`,
    // which keeps `previous × window` exact in the Redis script (see `Params::tick`).
    let next = State {
        current: current.current.saturating_add(consumed).min(limit),
        ..current
    };
    let capacity = to_u64((n * w).saturating_sub(carried) / w);
    let reset_after = if next.current > 0 {
        next.window_start + 2 * window - now
    } else if next.previous > 0 {
        next.window_start + window - now
    } else {
        0
    };
    let outcome = Outcome {
        allowed,
        remaining: if allowed {
            capacity.saturating_sub(next.current)
        } else {
            0
        },
        reset_after,
        retry_after: if allowed {
            0
        } else {
            retry_after(&current, elapsed, limit, window, hits.max(1))
                .unwrap_or_else(|| never_retry(reset_after, window))
        },
    };
    ((consumed > 0).then_some(next), outcome)
}

/// The state as seen from the window containing `now`.
fn roll(state: Option<&State>, now: Micros, window: Micros) -> State {
    let start = now - now % window;
    match state {
        Some(state) if state.window_start >= start => *state,
        Some(state) if state.window_start + window == start => State {
            window_start: start,
            current: 0,
            previous: state.current,
        },
        _ => State {
            window_start: start,
            current: 0,
            previous: 0,
        },
    }
}

/// The earliest delay after which `need` hits fit, or `None` if they never can.
fn retry_after(
    state: &State,
    elapsed: Micros,
    limit: u64,
    window: Micros,
    need: u64,
) -> Option<Micros> {
    if need > limit {
        return None;
    }
    let w = u128::from(window);
    let to_next = window - elapsed;
    // Still in this window: wait until the previous window's weight has shrunk enough.
    if state.current + need <= limit && state.previous > 0 {
        let room = u128::from(limit - state.current - need) * w / u128::from(state.previous);
        let wait = u128::from(to_next).saturating_sub(room);
        if wait < u128::from(to_next) {
            return Some(to_u64(wait));
        }
    }
    // In the next window, this window's count becomes the weighted one.
    if state.current == 0 {
        return Some(to_next);
    }
    let room = u128::from(limit - need) * w / u128::from(state.current);
    let into_next = w.saturating_sub(room);
    if into_next < w {
        return Some(to_next + to_u64(into_next));
    }
    Some(to_next + window)
}

/// Gives back `count` hits consumed at `at`. Exact whatever happened since: they are in the
/// count of their window, which is the current one or, once the state has rolled on by one
/// window, the previous one; further back they no longer weigh on anything.
pub fn give_back(state: &State, at: Micros, window: Micros, count: u64) -> State {
    let mut state = *state;
    let start = at - at % window;
    if state.window_start == start {
        state.current = state.current.saturating_sub(count);
    } else if state.window_start == start + window {
        state.previous = state.previous.saturating_sub(count);
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::{
        BASE, check_common, max_in_aligned_window, max_in_any_interval, run, secs,
    };
    use proptest::prelude::*;

    const MINUTE: Micros = 60_000_000;

    fn call(state: Option<&State>, now: Micros, limit: u64, hits: u64) -> (Option<State>, Outcome) {
        decide(state, now, limit, MINUTE, hits, Charge::IfAllowed)
    }

    #[test]
    fn the_previous_window_counts_by_its_remaining_overlap() {
        let start = BASE - BASE % MINUTE;
        // 10 hits at the end of one minute (limit 10).
        let mut state = None;
        for _ in 0..10 {
            let (next, outcome) = call(state.as_ref(), start + secs(59), 10, 1);
            assert!(outcome.allowed);
            state = next;
        }
        // 15 s into the next minute, 45/60 of those 10 still count: 7.5, so 2 more fit.
        let now = start + secs(75);
        let (state, first) = call(state.as_ref(), now, 10, 1);
        assert_eq!((first.allowed, first.remaining), (true, 1));
        let (state, second) = call(state.as_ref(), now, 10, 1);
        assert_eq!((second.allowed, second.remaining), (true, 0));
        let (_, third) = call(state.as_ref(), now, 10, 1);
        assert!(!third.allowed);
        // 7.5 + 2 = 9.5 now; one more fits once the carried part is ≤ 7, i.e. at 18 s: 3 s on.
        assert_eq!(third.retry_after, secs(3));
        let (_, later) = call(state.as_ref(), now + secs(3), 10, 1);
        assert!(later.allowed);
        let (_, earlier) = call(state.as_ref(), now + secs(3) - 1, 10, 1);
        assert!(!earlier.allowed);
    }

    #[test]
    fn a_clock_stepping_back_into_the_previous_window_neither_panics_nor_resets() {
        let start = BASE - BASE % MINUTE;
        let (state, _) = call(None, start + MINUTE, 1, 1);
        let (_, outcome) = call(state.as_ref(), start + MINUTE - 1, 1, 1);
        // Treated as the start of the stored minute: the hit there weighs until the end of
        // the next one.
        assert_eq!((outcome.allowed, outcome.retry_after), (false, 2 * MINUTE));
    }

    #[test]
    fn a_call_that_can_never_pass_is_told_to_wait_at_least_a_window() {
        let (_, outcome) = call(None, BASE, 0, 1);
        assert_eq!((outcome.allowed, outcome.retry_after), (false, MINUTE));
    }

    #[test]
    fn reset_counts_until_both_windows_are_empty() {
        let start = BASE - BASE % MINUTE;
        let (_, outcome) = call(None, start + secs(20), 5, 1);
        assert_eq!(outcome.reset_after, secs(100));
    }

    proptest! {
        #[test]
        fn over_admission_in_any_window_long_interval_stays_under_twice_the_limit(
            limit in 1u64..20,
            window_s in 1u64..30,
            steps in proptest::collection::vec((0u64..3_000_000, 0u64..3), 1..300),
        ) {
            let window = secs(window_s);
            let trace = run(|s, now, hits| decide(s, now, limit, window, hits, Charge::IfAllowed), &steps);
            check_common(&trace);
            prop_assert!(max_in_any_interval(&trace, window) < 2 * limit);
            prop_assert!(max_in_aligned_window(&trace, window) <= limit);
        }

        #[test]
        fn retry_after_is_exactly_when_the_hits_fit(
            limit in 1u64..20,
            steps in proptest::collection::vec((0u64..20_000_000, 1u64..3), 1..60),
        ) {
            let mut state = None;
            let mut now = BASE;
            for (gap, hits) in steps {
                now += gap;
                let (next, outcome) = call(state.as_ref(), now, limit, hits);
                if !outcome.allowed && hits <= limit {
                    let wait = outcome.retry_after;
                    prop_assert!(call(state.as_ref(), now + wait, limit, hits).1.allowed);
                    prop_assert!(wait == 0 || !call(state.as_ref(), now + wait - 1, limit, hits).1.allowed);
                }
                if let Some(next) = next {
                    state = Some(next);
                }
            }
        }
    }

    #[test]
    fn the_measured_worst_case_is_near_twice_the_limit() {
        // Adversarial: the whole limit at the last instant of one window, then one hit every
        // millisecond of the next. This is the bound docs/algorithms.md states.
        let limit = 100;
        let start = BASE - BASE % MINUTE;
        let mut steps = vec![(start + MINUTE - 1 - BASE, limit)];
        steps.extend(std::iter::repeat_n((1_000, 1), 60_000));
        let trace = run(
            |s, now, hits| decide(s, now, limit, MINUTE, hits, Charge::IfAllowed),
            &steps,
        );
        let worst = max_in_any_interval(&trace, MINUTE);
        assert!(worst > limit && worst < 2 * limit, "{worst}");
        assert_eq!(worst, 199);
    }
}
