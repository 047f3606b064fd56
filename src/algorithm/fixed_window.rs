//! Fixed window counter, as envoyproxy/ratelimit counts: a count per window, allowed while
//! `count + hits <= limit`, so a limit of 0 denies everything. Windows are aligned to the Unix
//! epoch (`floor(now / window) * window`) or, with `anchor: first_hit`, start at a counter's
//! first admitted hit. Guarantee: at most `limit` per window, but up to `2 × limit` in a
//! window-long interval that straddles a boundary.

use super::outcome::{Charge, MAX_COUNT, Outcome};
use crate::clock::Micros;

/// Where a fixed window starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Anchor {
    /// Aligned to the Unix epoch, as the reference (every counter's minute starts at :00).
    #[default]
    Epoch,
    /// At the counter's first hit, as Limitador (each counter's own minute).
    FirstHit,
}

impl Anchor {
    pub const ALL: [Anchor; 2] = [Anchor::Epoch, Anchor::FirstHit];

    pub fn name(self) -> &'static str {
        match self {
            Anchor::Epoch => "epoch",
            Anchor::FirstHit => "first_hit",
        }
    }
}

/// The window the count belongs to, and the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    pub window_start: Micros,
    pub count: u64,
}

pub fn decide(
    state: Option<&State>,
    now: Micros,
    limit: u64,
    window: Micros,
    anchor: Anchor,
    hits: u64,
    charge: Charge,
) -> (Option<State>, Outcome) {
    let current = match state {
        // `now` before the start (a clock stepping back) stays in the window: never reset early.
        Some(state) if now < state.window_start.saturating_add(window) => *state,
        _ => State {
            window_start: match anchor {
                Anchor::Epoch => now - now % window,
                Anchor::FirstHit => now,
            },
            count: 0,
        },
    };
    let allowed = current.count.saturating_add(hits.max(1)) <= limit;
    let consumed = charge.consumed(allowed, hits);
    let count = current.count.saturating_add(consumed).min(MAX_COUNT);
    let reset_after = current
        .window_start
        .saturating_add(window)
        .saturating_sub(now);
    let outcome = Outcome {
        allowed,
        remaining: if allowed {
            limit.saturating_sub(count)
        } else {
            0
        },
        reset_after,
        retry_after: if allowed { 0 } else { reset_after },
    };
    let state = (consumed > 0).then_some(State {
        window_start: current.window_start,
        count,
    });
    (state, outcome)
}

/// Gives back `count` hits consumed at `at`. Exact whatever happened since: the count belongs
/// to the window of that instant, and a window that has ended holds nothing to give back. A
/// window left empty is forgotten, as if never opened (with `anchor: first_hit` the refunded
/// hit must not have started it).
pub fn give_back(state: &State, at: Micros, window: Micros, count: u64) -> State {
    let mut state = *state;
    if state.window_start <= at && at < state.window_start.saturating_add(window) {
        state.count = state.count.saturating_sub(count);
        if state.count == 0 {
            return State::default();
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::{max_in_aligned_window, run, secs};
    use proptest::prelude::*;

    const MINUTE: Micros = 60_000_000;

    fn at(seconds: u64) -> Micros {
        seconds * 1_000_000
    }

    fn epoch(
        state: Option<&State>,
        now: Micros,
        limit: u64,
        hits: u64,
    ) -> (Option<State>, Outcome) {
        decide(
            state,
            now,
            limit,
            MINUTE,
            Anchor::Epoch,
            hits,
            Charge::IfAllowed,
        )
    }

    #[test]
    fn admits_up_to_the_limit_then_denies_without_consuming() {
        let mut state = None;
        for expected_remaining in [2, 1, 0] {
            let (next, outcome) = epoch(state.as_ref(), at(2222), 3, 1);
            assert!(outcome.allowed);
            assert_eq!(outcome.remaining, expected_remaining);
            state = next;
        }
        let (next, outcome) = epoch(state.as_ref(), at(2222), 3, 1);
        assert!(!outcome.allowed);
        assert_eq!((outcome.remaining, outcome.retry_after), (0, at(58)));
        assert_eq!(next, None);
    }

    #[test]
    fn reset_is_the_time_to_the_epoch_aligned_window_end() {
        assert_eq!(epoch(None, at(2222), 10, 1).1.reset_after, at(58));
        assert_eq!(
            epoch(None, at(2222) + 500_000, 10, 1).1.reset_after,
            at(57) + 500_000
        );
    }

    #[test]
    fn a_new_window_starts_from_zero() {
        let (state, _) = epoch(None, at(59), 1, 1);
        assert!(!epoch(state.as_ref(), at(59), 1, 1).1.allowed);
        let (_, outcome) = epoch(state.as_ref(), at(60), 1, 1);
        assert!(outcome.allowed);
        assert_eq!(outcome.remaining, 0);
    }

    #[test]
    fn first_hit_anchor_starts_the_window_at_the_first_admitted_hit() {
        let hit = |state: Option<&State>, now| {
            decide(
                state,
                now,
                1,
                MINUTE,
                Anchor::FirstHit,
                1,
                Charge::IfAllowed,
            )
        };
        let (state, first) = hit(None, at(2222));
        assert_eq!(first.reset_after, at(60));
        assert!(!hit(state.as_ref(), at(2281)).1.allowed);
        let (_, next) = hit(state.as_ref(), at(2282));
        assert!(next.allowed);
        assert_eq!(next.reset_after, at(60));
    }

    #[test]
    fn zero_requests_per_unit_denies_everything_even_a_check() {
        for hits in [0, 1, 5] {
            assert!(!epoch(None, at(10), 0, hits).1.allowed, "hits {hits}");
        }
    }

    #[test]
    fn check_only_passes_while_a_hit_would_be_admitted_and_changes_nothing() {
        let (state, _) = epoch(None, at(10), 2, 1);
        let (unchanged, outcome) = epoch(state.as_ref(), at(10), 2, 0);
        assert!(outcome.allowed);
        assert_eq!((outcome.remaining, unchanged), (1, None));
        let (full, _) = epoch(state.as_ref(), at(10), 2, 1);
        assert!(!epoch(full.as_ref(), at(10), 2, 0).1.allowed);
    }

    #[test]
    fn count_denied_consumes_even_when_over() {
        let (state, _) = decide(None, at(10), 1, MINUTE, Anchor::Epoch, 1, Charge::Always);
        let (state, outcome) = decide(
            state.as_ref(),
            at(10),
            1,
            MINUTE,
            Anchor::Epoch,
            1,
            Charge::Always,
        );
        assert!(!outcome.allowed);
        assert_eq!(state.map(|s| s.count), Some(2));
    }

    proptest! {
        #[test]
        fn never_more_than_the_limit_inside_one_aligned_window(
            limit in 0u64..20,
            window_s in 1u64..120,
            hits in proptest::collection::vec((0u64..10_000_000, 0u64..4), 1..300),
        ) {
            let window = secs(window_s);
            let trace = run(
                |state, now, hits| decide(state, now, limit, window, Anchor::Epoch, hits, Charge::IfAllowed),
                &hits,
            );
            prop_assert!(max_in_aligned_window(&trace, window) <= limit);
            crate::algorithm::testing::check_common(&trace);
        }
    }
}
