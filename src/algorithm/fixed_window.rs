//! Fixed window counter, as envoyproxy/ratelimit counts: windows aligned to the Unix epoch
//! (`floor(now / window) * window`), a count per window, allowed while `count + hits <= limit`.
//! A limit of 0 therefore denies everything. A check-only call (0 hits) is denied when the
//! window is already used up, i.e. when one more hit would not be admitted.

use super::{Charge, Outcome};
use crate::clock::Micros;

/// The window the count belongs to, and the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    pub window_start: Micros,
    pub count: u64,
}

pub fn decide(
    state: State,
    now: Micros,
    limit: u64,
    window: Micros,
    hits: u64,
    charge: Charge,
) -> (State, Outcome) {
    let window = window.max(1);
    let window_start = now - now % window;
    let count = if state.window_start == window_start {
        state.count
    } else {
        0
    };
    let after = count.saturating_add(hits);
    let allowed = if hits == 0 {
        count < limit
    } else {
        after <= limit
    };
    let reset_after = window_start + window - now;
    let outcome = Outcome {
        allowed,
        remaining: if allowed {
            limit.saturating_sub(after)
        } else {
            0
        },
        reset_after,
        retry_after: if allowed { 0 } else { reset_after },
    };
    let count = if allowed || charge == Charge::Always {
        after
    } else {
        count
    };
    (
        State {
            window_start,
            count,
        },
        outcome,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Micros = 60_000_000;

    fn at(seconds: u64) -> Micros {
        seconds * 1_000_000
    }

    #[test]
    fn admits_up_to_the_limit_then_denies_without_consuming() {
        let mut state = State::default();
        for expected_remaining in [2, 1, 0] {
            let (next, outcome) = decide(state, at(2222), 3, MINUTE, 1, Charge::IfAllowed);
            assert!(outcome.allowed);
            assert_eq!(outcome.remaining, expected_remaining);
            state = next;
        }
        let (next, outcome) = decide(state, at(2222), 3, MINUTE, 1, Charge::IfAllowed);
        assert!(!outcome.allowed);
        assert_eq!(outcome.remaining, 0);
        assert_eq!(outcome.retry_after, at(58));
        assert_eq!(next, state);
    }

    #[test]
    fn reset_is_the_time_to_the_epoch_aligned_window_end() {
        let (_, outcome) = decide(State::default(), at(2222), 10, MINUTE, 1, Charge::IfAllowed);
        assert_eq!(outcome.reset_after, at(58));
        let (_, outcome) = decide(
            State::default(),
            at(2222) + 500_000,
            10,
            MINUTE,
            1,
            Charge::IfAllowed,
        );
        assert_eq!(outcome.reset_after, at(57) + 500_000);
    }

    #[test]
    fn a_new_window_starts_from_zero() {
        let (state, _) = decide(State::default(), at(59), 1, MINUTE, 1, Charge::IfAllowed);
        let (_, denied) = decide(state, at(59), 1, MINUTE, 1, Charge::IfAllowed);
        assert!(!denied.allowed);
        let (_, outcome) = decide(state, at(60), 1, MINUTE, 1, Charge::IfAllowed);
        assert!(outcome.allowed);
        assert_eq!(outcome.remaining, 0);
    }

    #[test]
    fn zero_requests_per_unit_denies_everything_even_a_check() {
        for hits in [0, 1, 5] {
            let (_, outcome) = decide(State::default(), at(10), 0, MINUTE, hits, Charge::IfAllowed);
            assert!(!outcome.allowed, "hits {hits}");
        }
    }

    #[test]
    fn check_only_passes_while_a_hit_would_be_admitted() {
        let (state, _) = decide(State::default(), at(10), 2, MINUTE, 1, Charge::IfAllowed);
        let (same, outcome) = decide(state, at(10), 2, MINUTE, 0, Charge::IfAllowed);
        assert!(outcome.allowed);
        assert_eq!(outcome.remaining, 1);
        assert_eq!(same, state);
        let (full, _) = decide(state, at(10), 2, MINUTE, 1, Charge::IfAllowed);
        let (_, outcome) = decide(full, at(10), 2, MINUTE, 0, Charge::IfAllowed);
        assert!(!outcome.allowed);
    }

    #[test]
    fn count_denied_consumes_even_when_over() {
        let (state, _) = decide(State::default(), at(10), 1, MINUTE, 1, Charge::Always);
        let (state, outcome) = decide(state, at(10), 1, MINUTE, 1, Charge::Always);
        assert!(!outcome.allowed);
        assert_eq!(state.count, 2);
    }
}
