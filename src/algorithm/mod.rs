//! Counting algorithms: each is data (from the config) plus a pure function of
//! (stored state, now, limit, hits) → (new state, outcome). Stores call `decide`; nothing here
//! reads a clock or touches storage, so every algorithm is tested with explicit instants.
//!
//! Shared rules, which the Redis scripts repeat:
//! - Time is in microseconds; arithmetic is integer (u128 where products can be large), so a
//!   decision is exact and reproducible.
//! - `hits == 0` is a check: allowed when one more hit would be admitted now, and it never
//!   changes state.
//! - A denied call changes nothing, unless `Charge::Always` (`--count-denied`).
//! - `remaining` is how many more hits would be admitted right now; `reset_after` is the time
//!   until the full limit is available again; `retry_after` (denied only) is the time until the
//!   same hits would be admitted. A call that can never be admitted (more hits than the limit
//!   or burst) reports the longer of `reset_after` and one window.

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

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

/// How a limit is counted, with the parameters that only some algorithms have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// A count per window; the reference's semantics.
    FixedWindow { anchor: Anchor },
    /// Two adjacent fixed windows, the previous one weighted by how much of it still overlaps.
    SlidingWindow,
    /// Exact: one timestamp per admitted hit, plus a minimum gap between hits.
    SlidingLog { min_interval: Micros },
    /// A bucket of `burst` tokens refilled continuously at `requests` per window.
    TokenBucket { burst: u64 },
    /// The generic cell rate algorithm: a token bucket kept as one theoretical arrival time.
    Gcra { burst: u64 },
}

impl Default for Algorithm {
    fn default() -> Self {
        Algorithm::FixedWindow {
            anchor: Anchor::Epoch,
        }
    }
}

impl Algorithm {
    /// A short, stable tag for counter keys: each algorithm keeps state of its own shape, so
    /// changing a rule's algorithm starts fresh counters.
    pub fn key_tag(self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } => "fw",
            Algorithm::SlidingWindow => "sw",
            Algorithm::SlidingLog { .. } => "sl",
            Algorithm::TokenBucket { .. } => "tb",
            Algorithm::Gcra { .. } => "gcra",
        }
    }

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::Gcra { .. } => "gcra",
        }
    }
}

/// Whether a denied call still consumes: `IfAllowed` is tollgate's default (a rejected
/// request consumes nothing); `Always` is `--count-denied`, the reference's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    IfAllowed,
    Always,
}

/// The answer for one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    pub allowed: bool,
    /// Hits still admissible right now, after this call.
    pub remaining: u64,
    /// Time until the full limit is available again.
    pub reset_after: Micros,
    /// When denied: time until the same hits could be admitted; 0 when allowed.
    pub retry_after: Micros,
}

/// Stored state of one counter, whatever its algorithm. Kept to 32 bytes (the memory store
/// holds a million of them): the sliding log's queue is boxed, being a heap buffer anyway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    FixedWindow(fixed_window::State),
    SlidingWindow(sliding_window::State),
    SlidingLog(Box<sliding_log::State>),
    TokenBucket(token_bucket::State),
    Gcra(gcra::State),
}

/// The outcome, the state to store (`None`: leave it as it is) and when the stored state may
/// be forgotten (the limit is then fully available again, so no state means the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub state: Option<State>,
    pub expires_at: Micros,
}

/// What one counter is asked: `hits` against `requests` per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub algorithm: Algorithm,
    pub requests: u64,
    pub window: Micros,
}

/// Every intermediate value of a decision stays at or below this, so that the Redis scripts,
/// whose Lua numbers are doubles (exact to 2^53), compute exactly what the Rust functions do.
/// One bit below 2^53 leaves room for the sum of two such values.
pub const EXACT_BOUND: u128 = 1 << 52;

/// The time resolutions an algorithm may count in, finest first (windows are whole seconds,
/// so each divides every window).
const TICKS: [Micros; 3] = [1, 1_000, 1_000_000];

impl Params {
    /// The resolution, in µs, this limit counts time in. Algorithms that multiply a count by
    /// a window (sliding window: limit × window; token bucket and GCRA: burst × window) use
    /// the finest tick that keeps that product within `EXACT_BOUND`: microseconds for every
    /// everyday limit, milliseconds or seconds for, say, a million per day. `None`: not even
    /// whole seconds are exact (the config rejects such a limit).
    pub fn tick(&self) -> Option<Micros> {
        let factor = match self.algorithm {
            Algorithm::SlidingWindow => self.requests,
            Algorithm::TokenBucket { burst } | Algorithm::Gcra { burst } => burst,
            Algorithm::FixedWindow { .. } | Algorithm::SlidingLog { .. } => return Some(1),
        };
        TICKS
            .into_iter()
            .find(|&tick| u128::from(factor.max(1)) * u128::from(self.window / tick) <= EXACT_BOUND)
    }
}

/// The largest count a fixed window stores (`--count-denied` keeps adding to a count that is
/// already over): far above any limit, and exact as a Lua number.
pub const MAX_COUNT: u64 = 1 << 52;

/// Runs the algorithm of `params` on `state` (None: never seen, forgotten, or state of
/// another algorithm).
pub fn decide(
    params: &Params,
    state: Option<&State>,
    now: Micros,
    hits: u64,
    charge: Charge,
) -> Decision {
    // Algorithms count in ticks (see `Params::tick`); times go in and come out in µs. A tick
    // count is rounded down and a duration up, so a client is never told to come back early.
    let tick = params.tick().unwrap_or(TICKS[TICKS.len() - 1]);
    let (n, w) = (params.requests, (params.window / tick).max(1));
    let now_in_ticks = now / tick;
    // Each arm: take the stored state if it has this algorithm's shape, run the pure function,
    // wrap the new state back.
    macro_rules! run {
        ($variant:ident, $module:ident($($parameter:expr),*)) => {{
            let previous = match state {
                Some(State::$variant(stored)) => Some(std::borrow::Borrow::borrow(stored)),
                _ => None,
            };
            let (new, outcome) =
                $module::decide(previous, now_in_ticks, n, w, $($parameter,)* hits, charge);
            (new.map(Into::into).map(State::$variant), outcome)
        }};
    }
    let (state, in_ticks) = match params.algorithm {
        Algorithm::FixedWindow { anchor } => run!(FixedWindow, fixed_window(anchor)),
        Algorithm::SlidingWindow => run!(SlidingWindow, sliding_window()),
        Algorithm::SlidingLog { min_interval } => run!(SlidingLog, sliding_log(min_interval)),
        Algorithm::TokenBucket { burst } => run!(TokenBucket, token_bucket(burst)),
        Algorithm::Gcra { burst } => run!(Gcra, gcra(burst)),
    };
    let outcome = Outcome {
        reset_after: in_ticks.reset_after.saturating_mul(tick),
        retry_after: in_ticks.retry_after.saturating_mul(tick),
        ..in_ticks
    };
    Decision {
        expires_at: now.saturating_add(outcome.reset_after),
        outcome,
        state,
    }
}

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

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::State;

    #[test]
    fn a_stored_state_stays_small() {
        // The memory store's bytes per counter (docs/performance.md) rest on this.
        assert_eq!(std::mem::size_of::<State>(), 32);
    }
}
