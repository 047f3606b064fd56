//! Counting algorithms: each is data (from the config) plus pure functions of (stored state,
//! now, limit, hits): `decide` → (new state, outcome); `give_back` → the state with consumed
//! hits returned (when another part of a vetoed request was counted elsewhere) and `refund`
//! → the hits a client gives back (both in `given_back.rs`). Stores call them; nothing here
//! reads a clock or touches storage, so every algorithm is tested with explicit instants.
//! Each Redis Lua port (`storage/redis/lua/<name>.lua`) has the same functions under the
//! same names.
//!
//! Everything that names an algorithm is in this file, in exhaustive `match`es: its config
//! name and parameters (`FromStr`, `Display`, `configure`), the tag that keys its counters and
//! picks its Lua port, its state, its resolution and how it refunds. docs/design.md lists the
//! files a new algorithm touches.
//!
//! Shared rules, which the Lua ports repeat:
//! - Time is in microseconds; arithmetic is integer (u128 where products can be large), so a
//!   decision is exact and reproducible.
//! - `hits == 0` is a check: allowed when one more hit would be admitted now, and it never
//!   changes state.
//! - A denied call changes nothing, unless `Charge::Always` (`--count-denied`).
//! - `remaining` is how many more hits would be admitted right now; `reset_after` is the time
//!   until the full limit is available again; `retry_after` (denied only) is the time until the
//!   same hits would be admitted. A call that can never be admitted (more hits than the limit
//!   or burst) reports the longer of `reset_after` and one window.

pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod given_back;
pub mod leased;
pub mod outcome;
pub mod parameter;
pub mod sliding_log;
pub mod sliding_window;
pub mod state;
pub mod token_bucket;

use std::fmt;
use std::str::FromStr;

use crate::clock::Micros;
pub use fixed_window::Anchor;
pub use outcome::{Charge, MAX_COUNT, Outcome};
pub use parameter::{Parameter, ParameterError, Parameters};
pub use state::State;

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
    /// Requests in flight: a take holds its hits until the client gives them back, or until
    /// they are a window old (the longest hold).
    Concurrency,
}

impl Default for Algorithm {
    fn default() -> Self {
        Algorithm::FixedWindow {
            anchor: Anchor::Epoch,
        }
    }
}

/// How a counter takes back hits that a vetoed request consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refund {
    /// Whatever happened since: the state records consumption at its instant.
    Exact,
    /// Only while the state is exactly as the consuming call left it (compare and set): the
    /// state absorbs consumption into a refill cap or a floor as time passes, so a later
    /// give-back could hand out hits nobody paid for. A skipped refund under-admits briefly.
    IfUnchanged,
}

impl Algorithm {
    /// Every algorithm, with default parameters, in the order the docs list them.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow {
            anchor: Anchor::Epoch,
        },
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog { min_interval: 0 },
        Algorithm::TokenBucket { burst: 0 },
        Algorithm::Gcra { burst: 0 },
        Algorithm::Concurrency,
    ];

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// A short, stable tag: it keys the counters (each algorithm keeps state of its own shape,
    /// so changing a rule's algorithm starts fresh counters) and names the Lua port.
    pub fn key_tag(self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } => "fw",
            Algorithm::SlidingWindow => "sw",
            Algorithm::SlidingLog { .. } => "sl",
            Algorithm::TokenBucket { .. } => "tb",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::Concurrency => "cc",
        }
    }

    /// The parameters this algorithm takes.
    pub fn parameters(self) -> &'static [Parameter] {
        match self {
            Algorithm::FixedWindow { .. } => &[Parameter::Anchor],
            Algorithm::SlidingWindow | Algorithm::Concurrency => &[],
            Algorithm::SlidingLog { .. } => &[Parameter::MinInterval],
            Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } => &[Parameter::Burst],
        }
    }

    pub fn refund(self) -> Refund {
        match self {
            Algorithm::FixedWindow { .. }
            | Algorithm::SlidingWindow
            | Algorithm::SlidingLog { .. }
            | Algorithm::Concurrency => Refund::Exact,
            Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } => Refund::IfUnchanged,
        }
    }

    /// The one number of parameter the Lua port takes, in ticks of `tick` µs.
    pub fn parameter_in_ticks(self, tick: Micros) -> u64 {
        match self {
            Algorithm::FixedWindow { anchor } => u64::from(anchor == Anchor::FirstHit),
            Algorithm::SlidingWindow | Algorithm::Concurrency => 0,
            Algorithm::SlidingLog { min_interval } => min_interval.div_ceil(tick.max(1)),
            Algorithm::TokenBucket { burst } | Algorithm::Gcra { burst } => burst,
        }
    }

    /// This algorithm (from `FromStr`) with the rule's parameters, checked against a limit of
    /// `requests` per `window` µs. A parameter of another algorithm is a mistake worth
    /// reporting, not ignoring.
    pub fn configure(
        self,
        requests: u64,
        window: Micros,
        given: &Parameters,
    ) -> Result<Algorithm, ParameterError> {
        if let Some(&foreign) = Parameter::ALL
            .iter()
            .find(|&&p| given.is_given(p) && !self.parameters().contains(&p))
        {
            let owners: Vec<&str> = Algorithm::ALL
                .into_iter()
                .filter(|algorithm| algorithm.parameters().contains(&foreign))
                .map(Algorithm::name)
                .collect();
            return Err(ParameterError {
                parameter: Some(foreign),
                field: foreign.name(),
                reason: format!(
                    "only applies to {}, not {}",
                    owners.join(" and "),
                    self.name()
                ),
            });
        }
        let configured = match self {
            Algorithm::FixedWindow { .. } => Algorithm::FixedWindow {
                anchor: given.anchor.unwrap_or_default(),
            },
            Algorithm::SlidingWindow => Algorithm::SlidingWindow,
            Algorithm::SlidingLog { .. } => {
                if requests > sliding_log::MAX_LIMIT {
                    return Err(ParameterError {
                        parameter: None,
                        field: "requests_per_unit",
                        reason: format!(
                            "sliding_log keeps one timestamp per admitted hit, so its limit is capped at {} (got {requests}); use sliding_window or gcra for larger limits",
                            sliding_log::MAX_LIMIT
                        ),
                    });
                }
                Algorithm::SlidingLog {
                    min_interval: given.min_interval.unwrap_or(0),
                }
            }
            Algorithm::TokenBucket { .. } => Algorithm::TokenBucket {
                burst: given.burst_or(requests)?,
            },
            Algorithm::Gcra { .. } => Algorithm::Gcra {
                burst: given.burst_or(requests)?,
            },
            Algorithm::Concurrency => {
                if requests > concurrency::MAX_LIMIT {
                    return Err(ParameterError {
                        parameter: None,
                        field: "requests_per_unit",
                        reason: format!(
                            "concurrency keeps one entry per take in flight, so its limit is capped at {} (got {requests})",
                            concurrency::MAX_LIMIT
                        ),
                    });
                }
                Algorithm::Concurrency
            }
        };
        let params = Params {
            algorithm: configured,
            requests,
            window,
        };
        if params.tick().is_none() {
            let field = match configured {
                Algorithm::SlidingWindow => "requests_per_unit",
                _ => "burst",
            };
            return Err(ParameterError {
                parameter: None,
                field,
                reason: format!(
                    "{field} × window in seconds must be at most 2^52 for {} to count exactly; use a shorter unit with a proportional limit",
                    configured.name()
                ),
            });
        }
        Ok(configured)
    }

    /// The number that the counts of this algorithm multiply by a window (see `Params::tick`);
    /// `None` for those that never do.
    fn window_factor(self, requests: u64) -> Option<u64> {
        match self {
            Algorithm::SlidingWindow => Some(requests),
            Algorithm::TokenBucket { burst } | Algorithm::Gcra { burst } => Some(burst),
            Algorithm::FixedWindow { .. }
            | Algorithm::SlidingLog { .. }
            | Algorithm::Concurrency => None,
        }
    }
}

/// Parses a config name into its algorithm with default parameters (`configure` sets them).
impl FromStr for Algorithm {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.into_iter().map(Algorithm::name).collect();
                format!("expected one of {}, got {name:?}", names.join("|"))
            })
    }
}

/// The name, then every parameter: `token_bucket burst=5`, `sliding_log min_interval=3000000us`.
impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match *self {
            Algorithm::FixedWindow { anchor } if anchor != Anchor::Epoch => {
                write!(f, " anchor={}", anchor.name())
            }
            Algorithm::FixedWindow { .. } | Algorithm::SlidingWindow | Algorithm::Concurrency => {
                Ok(())
            }
            Algorithm::SlidingLog { min_interval } => write!(f, " min_interval={min_interval}us"),
            Algorithm::TokenBucket { burst } | Algorithm::Gcra { burst } => {
                write!(f, " burst={burst}")
            }
        }
    }
}

/// What one call does to a counter: the outcome, the state to store (`None`: leave it as it
/// is) and when the stored state may be forgotten (the limit is then fully available again,
/// so no state means the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
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
        let Some(factor) = self.algorithm.window_factor(self.requests) else {
            return Some(1);
        };
        TICKS
            .into_iter()
            .find(|&tick| u128::from(factor.max(1)) * u128::from(self.window / tick) <= EXACT_BOUND)
    }

    /// The tick and the window in ticks, as every algorithm counts.
    fn in_ticks(&self) -> (Micros, Micros) {
        let tick = self.tick().unwrap_or(TICKS[TICKS.len() - 1]);
        (tick, (self.window / tick).max(1))
    }
}

/// Runs the algorithm of `params` on `state` (None: never seen, forgotten, or state of
/// another algorithm).
pub fn decide(
    params: &Params,
    state: Option<&State>,
    now: Micros,
    hits: u64,
    charge: Charge,
) -> Transition {
    // Algorithms count in ticks (see `Params::tick`); times go in and come out in µs. A tick
    // count is rounded down and a duration up, so a client is never told to come back early.
    let previous_state = state;
    let (tick, w) = params.in_ticks();
    let n = params.requests;
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
        // Holds are kept as a sliding log's runs.
        Algorithm::Concurrency => run!(SlidingLog, concurrency()),
    };
    let mut outcome = Outcome {
        reset_after: in_ticks.reset_after.saturating_mul(tick),
        retry_after: in_ticks.retry_after.saturating_mul(tick),
        ..in_ticks
    };
    // A denied call reports the room it found (what a check finds now), fewer hits than it
    // asked for: the metrics split its hits into near and over by it (see `Outcome`).
    if !outcome.allowed && hits > 0 {
        outcome.remaining = decide(params, previous_state, now, 0, charge)
            .outcome
            .remaining;
    }
    Transition {
        expires_at: now.saturating_add(outcome.reset_after),
        outcome,
        state,
    }
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests;
