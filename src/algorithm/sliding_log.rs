//! Sliding log: exact. One timestamp per admitted hit; a call is allowed when the hits of the
//! last `window` plus its own stay within the limit and, with `min_interval`, when the last
//! admitted hit is at least that long ago (the minimum gap of rolling-rate-limiter). Hits that
//! arrive together are 0 apart, so with a `min_interval` a call of more than one hit is never
//! admitted.
//!
//! Guarantee: at most `limit` in *any* window-long interval, no two admitted hits closer than
//! `min_interval`. Memory is one timestamp per admitted hit in the window, hence the config's
//! cap on its limit (`MAX_LIMIT`).

use std::collections::VecDeque;

use super::{Charge, Outcome};
use crate::clock::Micros;

/// The largest limit a sliding log accepts: its state holds one timestamp per admitted hit
/// (8 bytes here, ~60 in a Redis sorted set), so 10,000 keeps a key under ~1 MB anywhere.
pub const MAX_LIMIT: u64 = 10_000;

/// Timestamps of admitted hits inside the window, oldest first, one per hit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    pub hits: VecDeque<Micros>,
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
    // A hit at t counts while t > now − window; the newest is kept while the gap needs it.
    let expired = |t: Micros| t.saturating_add(window) <= now;
    while log.hits.front().is_some_and(|&t| {
        expired(t) && (log.hits.len() > 1 || t.saturating_add(min_interval) <= now)
    }) {
        log.hits.pop_front();
    }
    let count = log.hits.iter().filter(|&&t| !expired(t)).count() as u64;
    let need = hits.max(1);
    let gap_ok = |at: Micros| {
        log.hits
            .back()
            .is_none_or(|&last| at.saturating_sub(last) >= min_interval)
    };
    let bunched = min_interval > 0 && hits > 1;
    let allowed = count + need <= limit && gap_ok(now) && !bunched;
    let consumed = if allowed || charge == Charge::Always {
        hits
    } else {
        0
    };
    let retry =
        (!allowed).then(|| retry_after(&log, now, limit, window, min_interval, need, bunched));
    log.hits.extend(std::iter::repeat_n(
        now,
        usize::try_from(consumed).unwrap_or(0),
    ));
    // Only `--count-denied` can push the log past the limit. The newest `limit` entries decide
    // every later admission on their own, so the older ones can go: memory stays bounded.
    while log.hits.len() as u64 > limit.max(1) {
        log.hits.pop_front();
    }
    let reset_after = log.hits.back().map_or(0, |&newest| {
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
        retry_after: retry
            .flatten()
            .unwrap_or(if allowed { 0 } else { reset_after }),
    };
    ((consumed > 0).then_some(log), outcome)
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
    let live: Vec<Micros> = log
        .hits
        .iter()
        .copied()
        .filter(|&t| t.saturating_add(window) > now)
        .collect();
    let to_expire = (live.len() as u64 + need).saturating_sub(limit);
    let for_room = match to_expire.checked_sub(1) {
        Some(index) => live
            .get(usize::try_from(index).ok()?)?
            .saturating_add(window)
            .saturating_sub(now),
        None => 0,
    };
    let for_gap = log.hits.back().map_or(0, |&last| {
        last.saturating_add(min_interval).saturating_sub(now)
    });
    Some(for_room.max(for_gap))
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
        assert_eq!(s.map(|s| s.hits.len()), Some(2));
    }

    #[test]
    fn count_denied_keeps_the_log_bounded_and_denying() {
        let call = |s: Option<&State>, now| decide(s, now, 3, secs(60), 0, 1, Charge::Always);
        let mut state = None;
        for second in 0..100 {
            let (next, _) = call(state.as_ref(), BASE + secs(second) / 10);
            state = next.or(state);
        }
        assert_eq!(state.as_ref().map(|s| s.hits.len()), Some(3));
        // The newest three hits (at 9.7 … 9.9 s) keep the limit exhausted until 69.7 s.
        assert!(!call(state.as_ref(), BASE + secs(69)).1.allowed);
        assert!(call(state.as_ref(), BASE + secs(70)).1.allowed);
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
    }
}
