//! Hits going back to a counter: `give_back`, what a vetoed request consumed (a cluster node or
//! the per-second store committed before another part vetoed), under each algorithm's
//! `Refund` rule; and `refund`, what a client returns (Envoy's `is_negative_hits`).

use super::{
    Algorithm, Charge, Outcome, Params, Refund, State, Transition, concurrency, decide,
    fixed_window, gcra, sliding_log, sliding_window, token_bucket,
};
use crate::clock::Micros;

/// Gives `hits` consumed at `at` back to `stored`, under the algorithm's `Refund` rule:
/// `consumed` is the state the consuming call left, which an `IfUnchanged` algorithm requires
/// `stored` to still be. `None`: nothing to change (no state, another algorithm's state, or
/// the rule says no).
pub fn give_back(
    params: &Params,
    stored: Option<&State>,
    consumed: Option<&State>,
    at: Micros,
    hits: u64,
) -> Option<State> {
    let stored = stored?;
    if hits == 0 || (params.algorithm.refund() == Refund::IfUnchanged && Some(stored) != consumed) {
        return None;
    }
    returned(params, stored, at, hits, Returned::ConsumedAt)
}

/// A refund the client asks for (Envoy's `is_negative_hits`): `hits` go back to the budget at
/// `now`, never below an empty counter nor above a full one. Each algorithm gives back what
/// the hits would not have taken had they never been spent:
/// - fixed window: off the current window's count, whichever window the hits were spent in
///   (as the reference does: a refund after the window ended can give the new window more);
/// - sliding window: off the current window's count (hits of the window before weigh less
///   each instant and are gone within a window);
/// - sliding log: the newest entries, so the minimum interval counts from the hit before;
/// - concurrency: the oldest live holds (`concurrency::refund` says why);
/// - token bucket: tokens back into the bucket, up to its burst;
/// - GCRA: the theoretical arrival time moves back by the hits' emission interval, never
///   before now (a full bucket).
///
/// The answer is a check on the counter after the refund, allowed whatever it finds: a
/// refund is never denied. No state: nothing was spent, nothing to give back.
pub fn refund(params: &Params, stored: Option<&State>, now: Micros, hits: u64) -> Transition {
    let state = stored.and_then(|stored| match hits {
        0 => None,
        _ => returned(params, stored, now, hits, Returned::Refund),
    });
    let after = state.as_ref().or(stored);
    let check = decide(params, after, now, 0, Charge::IfAllowed);
    Transition {
        outcome: Outcome {
            allowed: true,
            ..check.outcome
        },
        expires_at: check.expires_at,
        state,
    }
}

/// Which hits a log gives back: those logged at the given instant (a veto's give-back), or a
/// client's refund (a sliding log's newest, concurrency's oldest live holds).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Returned {
    ConsumedAt,
    Refund,
}

/// `stored` with `hits` given back at `at` (see `give_back` and `refund`).
fn returned(
    params: &Params,
    stored: &State,
    at: Micros,
    hits: u64,
    which: Returned,
) -> Option<State> {
    let (tick, w) = params.in_ticks();
    let (n, at) = (params.requests, at / tick);
    // Each arm: the stored state must have the algorithm's own shape (a rule that changed
    // its algorithm keys new counters, so it does but for a bug).
    let algorithm = params.algorithm;
    Some(match stored {
        State::FixedWindow(state) => {
            let Algorithm::FixedWindow { .. } = algorithm else {
                return None;
            };
            State::FixedWindow(fixed_window::give_back(state, at, w, hits))
        }
        State::SlidingWindow(state) => {
            let Algorithm::SlidingWindow = algorithm else {
                return None;
            };
            State::SlidingWindow(sliding_window::give_back(state, at, w, hits))
        }
        State::SlidingLog(state) => State::SlidingLog(Box::new(match (algorithm, which) {
            (Algorithm::SlidingLog { .. }, Returned::ConsumedAt) => {
                sliding_log::give_back(state, at, hits)
            }
            (Algorithm::SlidingLog { .. }, Returned::Refund) => sliding_log::refund(state, hits),
            (Algorithm::Concurrency, Returned::ConsumedAt) => {
                concurrency::give_back(state, at, w, hits)
            }
            (Algorithm::Concurrency, Returned::Refund) => concurrency::refund(state, at, w, hits),
            _ => return None,
        })),
        State::TokenBucket(state) => {
            let Algorithm::TokenBucket { burst } = algorithm else {
                return None;
            };
            State::TokenBucket(token_bucket::give_back(state, w, burst, hits))
        }
        State::Gcra(state) => {
            let Algorithm::Gcra { burst } = algorithm else {
                return None;
            };
            State::Gcra(gcra::give_back(state, at, n, w, burst, hits))
        }
    })
}
