//! `Layout::DecideOne` (lua/decide_one.lua): one charged hit of any algorithm but the epoch
//! fixed window, alone in its call. Redis reads the state, decides, writes what the hit
//! consumed and answers the state it found (a sliding window written as counters, its counts
//! as one integer); the outcome (remaining, reset, retry, a denied hit's room) is worked out
//! here from that state by the Rust algorithm and the request rule, which the parity tests
//! hold to the Lua port's answers.

use redis::{Cmd, Value};

use super::numbers::{LONGEST_LOG, n, packed, state_of, tick, window_counts};
use super::{Call, Reply, StateLayout};
use crate::algorithm::{Algorithm, Charge, Params};
use crate::storage::{StoreError, rule};

/// Whether a lone hit on a counter with `params` goes this way.
pub fn takes(params: &Params) -> bool {
    match params.algorithm {
        Algorithm::SlidingLog { .. } | Algorithm::Concurrency => params.requests <= LONGEST_LOG,
        Algorithm::FixedWindow { .. }
        | Algorithm::SlidingWindow
        | Algorithm::TokenBucket { .. }
        | Algorithm::Gcra { .. } => true,
    }
}

pub fn encode(call: &Call<'_>, command: &mut Cmd) {
    let Some(hit) = call.hits.first() else {
        return;
    };
    let params = &hit.params;
    let tick = tick(params);
    command.arg(
        packed([
            call.code(params),
            n(call.instant() / tick),
            n(params.requests),
            n((params.window / tick).max(1)),
            n(params.algorithm.parameter_in_ticks(tick)),
            n(hit.hits),
            i64::from(hit.charge == Charge::Always),
            n(tick),
            n(call.grace_ms),
        ])
        .as_slice(),
    );
    if call.state_layout == StateLayout::Packed
        && let Some(expiry) = packed_expiry_ms(params, call.grace_ms)
    {
        command.arg(expiry.to_string());
    }
}

/// The expiry a lone hit writes its state packed with (`StateLayout::Packed`), worked out here
/// once per call so that Redis formats no number; then the grace. `None`: a limit of 0 (a
/// bucket's never writes), an algorithm never written packed, or an expiry past `u64` ms
/// (the hit is then written as text, with the expiry Redis works out).
/// - A bucket: the longest it can take to fill, a full burst at the limit's rate, in whole ms.
/// - A sliding log: exactly what the text layout writes, as every write of a lone hit leaves
///   its newest run at the instant decided: the longer of the window and the minimum interval.
pub fn packed_expiry_ms(params: &Params, grace_ms: u64) -> Option<u64> {
    let tick = tick(params);
    let window = (params.window / tick).max(1);
    let kept = match params.algorithm {
        Algorithm::TokenBucket { burst } | Algorithm::Gcra { burst } => {
            if params.requests == 0 {
                return None;
            }
            (u128::from(burst) * u128::from(window)).div_ceil(u128::from(params.requests))
        }
        Algorithm::SlidingLog { .. } => {
            u128::from(window.max(params.algorithm.parameter_in_ticks(tick)))
        }
        // A concurrency limit's lone hit takes the general path, which writes text.
        Algorithm::FixedWindow { .. } | Algorithm::SlidingWindow | Algorithm::Concurrency => {
            return None;
        }
    };
    let kept_ms = u64::try_from((kept * u128::from(tick)).div_ceil(1000).max(1)).ok()?;
    kept_ms.checked_add(grace_ms)
}

pub fn decode(call: &Call<'_>, reply: Value) -> Result<Reply, StoreError> {
    let [hit] = call.hits else {
        return Err(call.malformed(super::Layout::DecideOne, &reply));
    };
    let found = match reply {
        Value::Int(counts) if hit.params.algorithm == Algorithm::SlidingWindow => {
            Some(window_counts(&hit.params, call.instant(), counts)?)
        }
        reply => state_of(hit.params.algorithm, &reply)?,
    };
    let found = [found.as_ref()];
    let decided = rule::decide(call.hits, &found, call.instant(), call.complete);
    let after = decided.state_after(call.hits, &found, 0);
    Ok(Reply {
        committed: decided.committed,
        outcomes: decided.outcomes.into_vec(),
        after: vec![after],
    })
}
