//! Counting algorithms: each is data (from the config) plus a pure function of
//! (stored state, now, limit, hits) → (new state, outcome). Stores call `decide`; nothing here
//! reads a clock or touches storage, so every algorithm is tested with explicit instants.

pub mod fixed_window;

use crate::clock::Micros;

/// How a limit is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Epoch-aligned fixed windows, the reference's semantics.
    #[default]
    FixedWindow,
}

impl Algorithm {
    /// A short, stable tag for counter keys: changing the algorithm of a rule starts fresh
    /// counters instead of reading state of another shape.
    pub fn key_tag(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    /// Hits still admissible after this call.
    pub remaining: u64,
    /// Time until the full limit is available again.
    pub reset_after: Micros,
    /// When denied: the earliest time after which the same hits could be admitted; 0 if allowed.
    pub retry_after: Micros,
}

/// Stored state of one counter, whatever its algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    FixedWindow(fixed_window::State),
}

/// The new state to store, the outcome, and when the state may be forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub state: State,
    pub expires_at: Micros,
}

/// What one counter is asked: `hits` against `requests` per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub algorithm: Algorithm,
    pub requests: u64,
    pub window: Micros,
}

/// Runs the algorithm of `params` on `state` (None: never seen or forgotten).
pub fn decide(
    params: &Params,
    state: Option<&State>,
    now: Micros,
    hits: u64,
    charge: Charge,
) -> Decision {
    match params.algorithm {
        Algorithm::FixedWindow => {
            let previous = match state {
                Some(State::FixedWindow(state)) => *state,
                None => fixed_window::State::default(),
            };
            let (state, outcome) =
                fixed_window::decide(previous, now, params.requests, params.window, hits, charge);
            Decision {
                outcome,
                expires_at: state.window_start.saturating_add(params.window),
                state: State::FixedWindow(state),
            }
        }
    }
}
