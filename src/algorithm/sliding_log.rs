//! Sliding log: exact. The admitted hits of the last `window`, as runs of (instant, hits); a
//! call is allowed when those plus its own stay within the limit and, with `min_interval`, when
//! the last admitted hit is at least that long ago (the minimum gap of rolling-rate-limiter).
//! Hits that arrive together are 0 apart, so with a `min_interval` a call of more than one hit
//! is never admitted.
//!
//! Guarantee: at most `limit` in *any* window-long interval, no two admitted hits closer than
//! `min_interval`. Memory is one run per instant at which hits were admitted, at most `limit`
//! runs, hence the config's cap on its limit (`MAX_LIMIT`). `remaining` is the room left in the
//! window; with a `min_interval` the next hit must still wait for the gap.

use std::collections::VecDeque;

use super::outcome::{Charge, Outcome, never_retry};
use crate::clock::Micros;

/// The largest limit a sliding log accepts: its state holds up to one entry per admitted hit
/// (16 bytes here, ~60 in a Redis sorted set), so 10,000 keeps a key well under 1 MB anywhere.
pub const MAX_LIMIT: u64 = 10_000;

/// Admitted hits inside the window as (instant, hits at that instant), oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    pub runs: VecDeque<(Micros, u64)>,
}

impl State {
    fn newest(&self) -> Option<Micros> {
        self.runs.back().map(|&(at, _)| at)
    }
}

pub fn decide(
    state: Option<&State>,
    now: Micros,
    limit: u64,
    window: Micros,
    min_interval: Micros,
    hits: u64,
    charge: Charge,
) -> (Option<State>, Outcome) {
    let mut log = state.cloned().unwrap_or_default();
    // A log never runs backwards: a clock that steps back counts as standing still.
    let now = log.newest().map_or(now, |newest| now.max(newest));
    let expired = |at: Micros| at.saturating_add(window) <= now;
    // Expired runs go, but the newest stays while the gap still needs it.
    while log.runs.front().is_some_and(|&(at, _)| {
        expired(at) && (log.runs.len() > 1 || at.saturating_add(min_interval) <= now)
    }) {
        log.runs.pop_front();
    }
    let count: u64 = log
        .runs
        .iter()
        .filter(|&&(at, _)| !expired(at))
        .map(|&(_, n)| n)
        .sum();
    let need = hits.max(1);
    let gap_ok = log.newest().is_none_or(|last| now - last >= min_interval);
    let bunched = min_interval > 0 && hits > 1;
    let allowed = count.saturating_add(need) <= limit && gap_ok && !bunched;
    let consumed = charge.consumed(allowed, hits);
    let retry =
        (!allowed).then(|| retry_after(&log, now, limit, window, min_interval, need, bunched));
    append(&mut log, now, consumed, limit);
    let reset_after = log.newest().map_or(0, |newest| {
        newest
            .saturating_add(window.max(min_interval))
            .saturating_sub(now)
    });
    let outcome = Outcome {
        allowed,
        remaining: if allowed {
            limit.saturating_sub(count + consumed)
        } else {
            0
        },
        reset_after,
        retry_after: match retry {
            None => 0,
            Some(Some(wait)) => wait,
            Some(None) => never_retry(reset_after, window),
        },
    };
    ((consumed > 0).then_some(log), outcome)
}

/// Records `hits` at `now`. Only `--count-denied` can push the log past the limit; the newest
/// `limit` hits decide every later admission on their own, so older ones go and memory stays
/// bounded whatever a request's `hits_addend`.
fn append(log: &mut State, now: Micros, hits: u64, limit: u64) {
    if hits == 0 {
        return;
    }
    match log.runs.back_mut() {
        Some((at, n)) if *at == now => *n = n.saturating_add(hits),
        _ => log.runs.push_back((now, hits)),
    }
    let cap = limit.max(1);
    let mut total: u64 = log.runs.iter().map(|&(_, n)| n).sum();
    while total > cap {
        let Some(front) = log.runs.front_mut() else {
            break;
        };
        let drop = (total - cap).min(front.1);
        front.1 -= drop;
        total -= drop;
        if front.1 == 0 {
            log.runs.pop_front();
        }
    }
}

/// When `need` hits would be admitted: once enough old hits leave the window and the gap
/// since the last one is long enough. `None` if never.
fn retry_after(
    log: &State,
    now: Micros,
    limit: u64,
    window: Micros,
    min_interval: Micros,
    need: u64,
    bunched: bool,
) -> Option<Micros> {
    if need > limit || bunched {
        return None;
    }
    let live = log
        .runs
        .iter()
        .filter(|&&(at, _)| at.saturating_add(window) > now);
    let count: u64 = live.clone().map(|&(_, n)| n).sum();
    let mut to_expire = (count + need).saturating_sub(limit);
    let mut for_room = 0;
    for &(at, n) in live {
        if to_expire == 0 {
            break;
        }
        to_expire = to_expire.saturating_sub(n);
        for_room = at.saturating_add(window).saturating_sub(now);
    }
    let for_gap = log.newest().map_or(0, |last| {
        last.saturating_add(min_interval).saturating_sub(now)
    });
    Some(for_room.max(for_gap))
}

/// Gives back `count` hits consumed at `at`. Exact whatever happened since: the log records
/// them at their instant (the newest run at `at`), and once that run has left the log they no
/// longer count.
pub fn give_back(state: &State, at: Micros, count: u64) -> State {
    let mut log = state.clone();
    if let Some(index) = log.runs.iter().rposition(|&(instant, _)| instant == at) {
        let hits = &mut log.runs[index].1;
        *hits = hits.saturating_sub(count);
        if *hits == 0 {
            log.runs.remove(index);
        }
    }
    log
}

/// `state` without its newest `count` hits (a refund: as if they had never been logged).
pub fn refund(state: &State, count: u64) -> State {
    let mut log = state.clone();
    let mut left = count;
    while left > 0 {
        let Some(newest) = log.runs.back_mut() else {
            break;
        };
        let taken = newest.1.min(left);
        newest.1 -= taken;
        left -= taken;
        if newest.1 == 0 {
            log.runs.pop_back();
        }
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::{BASE, check_common, max_in_any_interval, run, secs};
    use proptest::prelude::*;

    #[test]
    fn ten_a_minute_and_never_two_within_three_seconds() {
        let call =
            |s: Option<&State>, now| decide(s, now, 10, secs(60), secs(3), 1, Charge::IfAllowed);
        let (state, first) = call(None, BASE);
        assert!(first.allowed);
        let (_, too_soon) = call(state.as_ref(), BASE + secs(1));
        assert!(!too_soon.allowed);
        assert_eq!(too_soon.retry_after, secs(2));
        let (_, later) = call(state.as_ref(), BASE + secs(3));
        assert!(later.allowed);
        assert_eq!(later.remaining, 8);
    }

    #[test]
    fn the_window_slides_hit_by_hit() {
        let call = |s: Option<&State>, now| decide(s, now, 2, secs(10), 0, 1, Charge::IfAllowed);
        let (s, _) = call(None, BASE);
        let (s, _) = call(s.as_ref(), BASE + secs(4));
        let (_, full) = call(s.as_ref(), BASE + secs(9));
        assert!(!full.allowed);
        assert_eq!(full.retry_after, secs(1));
        let (s, freed) = call(s.as_ref(), BASE + secs(10));
        assert!(freed.allowed);
        assert_eq!(freed.reset_after, secs(10));
        assert_eq!(s.map(|s| s.runs.len()), Some(2));
    }

    #[test]
    fn hits_at_one_instant_share_one_entry() {
        let (state, outcome) = decide(None, BASE, 10_000, secs(60), 0, 10_000, Charge::IfAllowed);
        assert_eq!((outcome.allowed, outcome.remaining), (true, 0));
        assert_eq!(state.map(|s| s.runs.len()), Some(1));
    }

    #[test]
    fn count_denied_keeps_the_log_bounded_and_denying() {
        let call =
            |s: Option<&State>, now, hits| decide(s, now, 3, secs(60), 0, hits, Charge::Always);
        let (mut state, _) = call(None, BASE, 1_000_000_000);
        for tenth in 1..100 {
            let (next, _) = call(state.as_ref(), BASE + secs(tenth) / 10, 1);
            state = next.or(state);
        }
        let total: u64 = state
            .as_ref()
            .map_or(0, |s| s.runs.iter().map(|r| r.1).sum());
        assert_eq!(total, 3);
        // The newest three hits (at 9.7 … 9.9 s) keep the limit exhausted until 69.7 s.
        assert!(!call(state.as_ref(), BASE + secs(69), 1).1.allowed);
        assert!(call(state.as_ref(), BASE + secs(70), 1).1.allowed);
    }

    #[test]
    fn a_call_that_can_never_pass_is_told_to_wait_at_least_a_window() {
        let (_, outcome) = decide(None, BASE, 2, secs(60), 0, 5, Charge::IfAllowed);
        assert_eq!((outcome.allowed, outcome.retry_after), (false, secs(60)));
    }

    #[test]
    fn a_clock_stepping_back_counts_as_standing_still() {
        let (state, _) = decide(None, BASE, 2, secs(60), 0, 1, Charge::IfAllowed);
        let (state, earlier) = decide(
            state.as_ref(),
            BASE - secs(5),
            2,
            secs(60),
            0,
            1,
            Charge::IfAllowed,
        );
        assert_eq!((earlier.allowed, earlier.remaining), (true, 0));
        assert_eq!(state.map(|s| s.runs), Some(VecDeque::from([(BASE, 2)])));
    }

    proptest! {
        #[test]
        fn never_more_than_the_limit_in_any_interval_and_never_two_within_the_gap(
            limit in 1u64..15,
            window_s in 1u64..30,
            gap_ms in prop_oneof![Just(0u64), 1u64..5_000],
            steps in proptest::collection::vec((0u64..3_000_000, 0u64..3), 1..300),
        ) {
            let (window, gap) = (secs(window_s), gap_ms * 1_000);
            let trace = run(|s, now, hits| decide(s, now, limit, window, gap, hits, Charge::IfAllowed), &steps);
            check_common(&trace);
            prop_assert!(max_in_any_interval(&trace, window) <= limit);
            let admitted: Vec<Micros> = trace
                .iter()
                .filter(|h| h.outcome.allowed && h.hits > 0)
                .flat_map(|h| std::iter::repeat_n(h.at, h.hits as usize))
                .collect();
            prop_assert!(admitted.windows(2).all(|pair| pair[1] - pair[0] >= gap));
        }

        #[test]
        fn retry_after_is_exactly_when_the_hits_fit(
            limit in 1u64..8,
            gap_ms in prop_oneof![Just(0u64), 1u64..5_000],
            steps in proptest::collection::vec((0u64..4_000_000, 1u64..3), 1..60),
        ) {
            let gap = gap_ms * 1_000;
            let call = |s: Option<&State>, now, hits| decide(s, now, limit, secs(10), gap, hits, Charge::IfAllowed);
            let mut state = None;
            let mut now = BASE;
            for (step, hits) in steps {
                now += step;
                let (next, outcome) = call(state.as_ref(), now, hits);
                if !outcome.allowed && hits <= limit && (gap == 0 || hits == 1) {
                    let wait = outcome.retry_after;
                    prop_assert!(call(state.as_ref(), now + wait, hits).1.allowed);
                    prop_assert!(wait == 0 || !call(state.as_ref(), now + wait - 1, hits).1.allowed);
                }
                state = next.or(state);
            }
        }
    }
}
