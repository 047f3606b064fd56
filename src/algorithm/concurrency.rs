//! Concurrency: requests in flight. A charge takes its hits as *holds* at its instant, and
//! Envoy gives them back when the stream ends (a refund, `is_negative_hits`); a hold never
//! given back is released once it is `window` old (the longest hold: `unit` ×
//! `unit_multiplier`), so a lost refund (a proxy restarted mid-stream) cannot leak the limit.
//!
//! State: the holds as a sliding log's runs of (instant, hits), oldest first, whose window is
//! the longest hold; a take is decided as the sliding log decides a hit (no minimum
//! interval). What differs is what a take and a refund mean:
//! - a denied take holds nothing, whatever the charge: a request refused is not in flight
//!   (`--count-denied` and `charges: usage` do not apply);
//! - a refund gives back the *oldest* live holds. Refunds name no hold, and giving back the
//!   oldest keeps the holds left the newest ones, so none of them expires while a request
//!   that took it is still in flight, as long as every request ends within the longest hold
//!   (the proof is the property test below).
//!
//! Guarantee: while every request gives back within the longest hold, never more than
//! `limit` hits are held by requests in flight; a request that never gives back holds its
//! hits for the longest hold, no longer. `remaining` is what is free now; `reset_after` is
//! when every hold now held has expired; a denied take's `retry_after` is when enough of the
//! oldest holds expire, the latest it can have to wait (a refund frees a hold sooner).

use super::outcome::{Charge, Outcome};
use super::sliding_log::{self, State};
use crate::clock::Micros;

/// The largest limit a concurrency rule accepts: its state holds up to one run per take in
/// flight, as a sliding log's.
pub const MAX_LIMIT: u64 = sliding_log::MAX_LIMIT;

/// Takes `hits` holds at `now` when they fit within `limit` beside the holds of the last
/// `longest` µs; a check (0 hits) asks whether one more would.
pub fn decide(
    state: Option<&State>,
    now: Micros,
    limit: u64,
    longest: Micros,
    hits: u64,
    _charge: Charge,
) -> (Option<State>, Outcome) {
    sliding_log::decide(state, now, limit, longest, 0, hits, Charge::IfAllowed)
}

/// `state` with its `count` oldest live holds given back at `now` (a request's stream
/// ended). Holds that have expired are dropped first: they were released already, and
/// giving one of them back would leave a live hold in place of the one returned.
pub fn refund(state: &State, now: Micros, longest: Micros, count: u64) -> State {
    let mut holds = state.clone();
    while holds
        .runs
        .front()
        .is_some_and(|&(at, _)| at.saturating_add(longest) <= now)
    {
        holds.runs.pop_front();
    }
    let mut left = count;
    while left > 0 {
        let Some(oldest) = holds.runs.front_mut() else {
            break;
        };
        let taken = oldest.1.min(left);
        oldest.1 -= taken;
        left -= taken;
        if oldest.1 == 0 {
            holds.runs.pop_front();
        }
    }
    holds
}

/// Gives back `count` holds a vetoed request took at `at`: from the holds logged at `at`,
/// exactly, as a sliding log's. The take may have been logged at a later instant (a log
/// never runs backwards, and another replica's clock can be a little ahead of this one's),
/// where nothing is at `at`: the oldest live holds go back then, as a refund's would, so
/// that the count, which is what admits, comes down at once rather than the hold leaking for
/// the longest hold (a hold left in place of an older one lives longer: under-admission).
pub fn give_back(state: &State, at: Micros, longest: Micros, count: u64) -> State {
    if state.runs.iter().any(|&(instant, _)| instant == at) {
        sliding_log::give_back(state, at, count)
    } else {
        refund(state, at, longest, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::{BASE, secs};
    use proptest::prelude::*;

    const HOLD: Micros = 60_000_000;

    fn take(state: Option<&State>, now: Micros, hits: u64) -> (Option<State>, Outcome) {
        decide(state, now, 2, HOLD, hits, Charge::IfAllowed)
    }

    #[test]
    fn two_in_flight_and_the_third_waits_for_a_give_back() {
        let (state, first) = take(None, BASE, 1);
        let (state, second) = take(state.as_ref(), BASE + secs(1), 1);
        assert_eq!((first.remaining, second.remaining), (1, 0));
        let state = state.unwrap();
        let (_, third) = take(Some(&state), BASE + secs(2), 1);
        assert!(!third.allowed);
        assert_eq!(
            third.retry_after,
            secs(58),
            "the oldest hold expires at 60 s"
        );
        let freed = refund(&state, BASE + secs(3), HOLD, 1);
        let (_, third) = take(Some(&freed), BASE + secs(3), 1);
        assert!(third.allowed);
        assert_eq!(third.remaining, 0);
    }

    #[test]
    fn a_denied_take_holds_nothing_even_when_denied_hits_count() {
        let (state, _) = take(None, BASE, 2);
        let (written, denied) = decide(state.as_ref(), BASE, 2, HOLD, 1, Charge::Always);
        assert!(!denied.allowed);
        assert_eq!(written, None);
    }

    #[test]
    fn a_hold_never_given_back_is_released_after_the_longest_hold() {
        let (state, _) = take(None, BASE, 2);
        let (_, still) = take(state.as_ref(), BASE + HOLD - 1, 1);
        assert!(!still.allowed);
        let (_, released) = take(state.as_ref(), BASE + HOLD, 1);
        assert!(released.allowed);
    }

    #[test]
    fn a_refund_gives_back_the_oldest_live_hold() {
        let (state, _) = take(None, BASE, 1);
        let (state, _) = take(state.as_ref(), BASE + secs(30), 1);
        let state = state.unwrap();
        let left = refund(&state, BASE + secs(40), HOLD, 1);
        assert_eq!(Vec::from(left.runs), vec![(BASE + secs(30), 1)]);
        // The hold of 0 s has expired by 70 s: the refund takes the live one, not it.
        let left = refund(&state, BASE + secs(70), HOLD, 1);
        assert!(left.runs.is_empty());
    }

    #[test]
    fn a_refund_of_more_than_is_held_empties_it() {
        let (state, _) = take(None, BASE, 2);
        let left = refund(&state.unwrap(), BASE, HOLD, 5);
        assert!(left.runs.is_empty());
    }

    #[test]
    fn a_vetoed_take_goes_back_from_its_instant_or_else_from_the_oldest_hold() {
        let (state, _) = take(None, BASE, 1);
        let (state, _) = take(state.as_ref(), BASE + secs(5), 1);
        let state = state.unwrap();
        let exact = give_back(&state, BASE + secs(5), HOLD, 1);
        assert_eq!(Vec::from(exact.runs), vec![(BASE, 1)]);
        // A take at 3 s logged at 5 s (the log does not run backwards): nothing at 3 s, the
        // oldest goes, and the count is right at once.
        let logged_later = give_back(&state, BASE + secs(3), HOLD, 1);
        assert_eq!(Vec::from(logged_later.runs), vec![(BASE + secs(5), 1)]);
    }

    /// One request of the interleaving: when it takes (µs after the previous request's
    /// take), how many hits, and after how long it gives them back (`None`: never, a lost
    /// refund), always within the longest hold.
    fn requests() -> impl Strategy<Value = Vec<(Micros, u64, Option<Micros>)>> {
        proptest::collection::vec(
            (
                0u64..20_000_000,
                1u64..3,
                prop_oneof![3 => (1u64..HOLD).prop_map(Some), 1 => Just(None)],
            ),
            1..80,
        )
    }

    proptest! {
        /// The guarantee over interleavings of takes, give-backs, expiries and lost
        /// refunds: at every event, the hits held by requests in flight (taken, admitted,
        /// not given back, younger than the longest hold) are at most the limit; and a
        /// request that never gives back stops holding after the longest hold.
        #[test]
        fn never_more_than_the_limit_held_by_requests_in_flight(
            limit in 1u64..6,
            requests in requests(),
        ) {
            // Every event in time order: a take (index) or a give-back (index).
            let mut events: Vec<(Micros, bool, usize)> = Vec::new();
            let mut at = BASE;
            for (index, &(gap, _, hold)) in requests.iter().enumerate() {
                at += gap;
                events.push((at, false, index));
                if let Some(hold) = hold {
                    events.push((at + hold, true, index));
                }
            }
            // Give-backs before takes at one instant: a stream that ends makes room.
            events.sort_by_key(|&(at, gives_back, index)| (at, !gives_back, index));
            let mut state: Option<State> = None;
            let mut admitted: Vec<Option<Micros>> = vec![None; requests.len()];
            let mut returned = vec![false; requests.len()];
            for (now, gives_back, index) in events {
                let hits = requests[index].1;
                if gives_back {
                    if admitted[index].is_some() {
                        returned[index] = true;
                        state = state.map(|s| refund(&s, now, HOLD, hits));
                    }
                } else {
                    let (written, outcome) = decide(state.as_ref(), now, limit, HOLD, hits, Charge::Always);
                    if outcome.allowed {
                        admitted[index] = Some(now);
                    }
                    state = written.or(state);
                }
                let in_flight: u64 = requests
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| !returned[i] && admitted[i].is_some_and(|taken| taken + HOLD > now))
                    .map(|(_, request)| request.1)
                    .sum();
                prop_assert!(in_flight <= limit, "{in_flight} held at {now}, limit {limit}");
                // Whatever is held in the state is within the longest hold.
                let (_, check) = decide(state.as_ref(), now + HOLD, limit, HOLD, 0, Charge::IfAllowed);
                prop_assert_eq!(check.remaining, limit);
            }
        }
    }
}
