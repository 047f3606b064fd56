//! What every algorithm answers and the integer helpers the five share. A leaf of the
//! algorithm layer: the algorithms import it, and `algorithm/mod.rs` re-exports it.

use crate::clock::Micros;

/// Whether a denied call still consumes: `IfAllowed` is tollgate's default (a rejected
/// request consumes nothing); `Always` is `--count-denied`, the reference's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    IfAllowed,
    Always,
}

impl Charge {
    /// Hits a call consumes.
    pub(crate) fn consumed(self, allowed: bool, hits: u64) -> u64 {
        if allowed || self == Charge::Always {
            hits
        } else {
            0
        }
    }
}

/// The answer for one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    pub allowed: bool,
    /// Hits still admissible right now, after this call. For a denied call (from
    /// `algorithm::decide` and the stores), the room it found: fewer hits than it asked for,
    /// which the metrics split by; the wire reports 0 for it, as the reference does.
    pub remaining: u64,
    /// Time until the full limit is available again.
    pub reset_after: Micros,
    /// When denied: time until the same hits could be admitted; 0 when allowed.
    pub retry_after: Micros,
}

/// The largest count a fixed window stores (`--count-denied` keeps adding to a count that is
/// already over): far above any limit, and exact as a Lua number.
pub const MAX_COUNT: u64 = 1 << 52;

/// The `retry_after` of a call that can never be admitted (more hits than the limit or the
/// burst): at least a window, so that a client honouring it does not retry in a loop.
pub(crate) fn never_retry(reset_after: Micros, window: Micros) -> Micros {
    reset_after.max(window)
}

/// The outcome for a limit that admits nothing, ever (`requests_per_unit: 0`).
pub(crate) fn never(window: Micros) -> Outcome {
    Outcome {
        allowed: false,
        remaining: 0,
        reset_after: window,
        retry_after: window,
    }
}

/// `a / b` rounded up, for times: never tell a client to come back too early.
pub(crate) fn div_ceil_u128(a: u128, b: u128) -> u128 {
    if b == 0 { 0 } else { a.div_ceil(b) }
}

/// Narrows a computed duration or count, saturating.
pub(crate) fn to_u64(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// What a lease took: the hits granted, those left to take at once after it, and the time
/// until the bucket is full again (ticks inside an algorithm, µs out of `leased::lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Taken {
    pub granted: u64,
    pub remaining: u64,
    pub reset_after: Micros,
}
