//! Leases of a bucket's budget (docs/design.md, "Leases"): a replica takes hits of a token
//! bucket or a GCRA limit at once, and admits them over a slice's life without asking again.
//!
//! Exact because each hit taken is one the bucket would admit at every instant of the life:
//! taken as if it arrived at the life's end, and allowed now. Whenever within the life the
//! replica admits it, the admitted hits of every replica, at their instants, are ones the
//! bucket admits (in any interval of length t, at most `burst + limit × t / window`). What
//! the life's refill would add is held back for it; a bucket that stays busy loses nothing by
//! that, one leased from idle holds back that much of its burst while leases last.
//!
//! A fixed window needs none of this (its budget is a count per window: the lease layout
//! counts the hits taken), and the other algorithms cannot be leased: a sliding window's
//! budget depends on when each hit of the window before falls out, and a sliding log's on
//! each hit's instant, which a hit taken ahead does not have.

pub use super::outcome::Taken;
use super::{Algorithm, Params, State, gcra, token_bucket};
use crate::clock::Micros;

/// Takes up to `want` hits of a bucket's budget at `now`, to be admitted until `now + life`
/// at the latest (µs). The new state, if the lease took any, and what it took; nothing for an
/// algorithm that is not a bucket.
pub fn lease(
    params: &Params,
    stored: Option<&State>,
    now: Micros,
    want: u64,
    life: Micros,
) -> (Option<State>, Taken) {
    let (tick, window) = params.in_ticks();
    // The life in ticks, rounded up past the tick `now` falls in: the lease is decided at the
    // start of that tick, and its hits must be good until `now + life`.
    let life = life.div_ceil(tick).saturating_add(1);
    let (now_in_ticks, limit) = (now / tick, params.requests);
    let (state, taken) = match params.algorithm {
        Algorithm::TokenBucket { burst } => {
            let stored = match stored {
                Some(State::TokenBucket(state)) => Some(state),
                _ => None,
            };
            let (state, taken) =
                token_bucket::lease(stored, now_in_ticks, limit, window, burst, want, life);
            (state.map(State::TokenBucket), taken)
        }
        Algorithm::Gcra { burst } => {
            let stored = match stored {
                Some(State::Gcra(state)) => Some(state),
                _ => None,
            };
            let (state, taken) =
                gcra::lease(stored, now_in_ticks, limit, window, burst, want, life);
            (state.map(State::Gcra), taken)
        }
        _ => return (None, Taken::default()),
    };
    let taken = Taken {
        reset_after: taken.reset_after.saturating_mul(tick),
        ..taken
    };
    (state, taken)
}

/// Whether `params` is a bucket, whose budget `lease` takes.
pub fn is_bucket(params: &Params) -> bool {
    matches!(
        params.algorithm,
        Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. }
    )
}

/// The shortest life worth a lease of a bucket: a slice of a shorter one would need a call
/// every few ms.
pub const SHORTEST_LIFE: Micros = 20_000;

/// The longest a slice of a bucket's budget is used (µs), at most `longest`: half its burst's
/// worth of refill, so that a lease can take the other half. `None` if that is under
/// `SHORTEST_LIFE` or one hit's refill (too small a burst to be worth a lease).
pub fn slice_life(params: &Params, longest: Micros) -> Option<Micros> {
    let burst = match params.algorithm {
        Algorithm::TokenBucket { burst } | Algorithm::Gcra { burst } => burst,
        _ => return None,
    };
    let requests = u128::from(params.requests.max(1));
    let interval = u128::from(params.window).div_ceil(requests);
    let tolerance = u128::from(burst) * u128::from(params.window) / requests;
    let life = u64::try_from(tolerance / 2)
        .unwrap_or(u64::MAX)
        .min(longest);
    (life >= SHORTEST_LIFE && u128::from(life) >= interval).then_some(life)
}

#[cfg(test)]
mod tests;
