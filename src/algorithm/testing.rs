//! Helpers for the algorithms' property tests: run a random sequence of calls through one
//! pure function with explicit instants, and check the invariants every algorithm shares.

use super::Outcome;
use crate::clock::Micros;

/// A realistic instant to start from (November 2025), so epoch alignment is exercised.
pub const BASE: Micros = 1_763_000_000_000_000;

pub fn secs(seconds: u64) -> Micros {
    seconds * 1_000_000
}

/// One call of a trace.
#[derive(Debug, Clone)]
pub struct Hit {
    pub at: Micros,
    pub hits: u64,
    pub outcome: Outcome,
    /// Whether the call asked to store a new state.
    pub wrote: bool,
    /// A check (0 hits) just before and just after the call, at the same instant.
    pub probe_before: Outcome,
    pub probe_after: Outcome,
}

/// Runs `steps` (gap since the previous call in µs, hits) from `BASE`.
pub fn run<S: Clone>(
    decide: impl Fn(Option<&S>, Micros, u64) -> (Option<S>, Outcome),
    steps: &[(Micros, u64)],
) -> Vec<Hit> {
    let mut now = BASE;
    let mut state: Option<S> = None;
    let mut trace = Vec::with_capacity(steps.len());
    for &(gap, hits) in steps {
        now += gap;
        let probe_before = decide(state.as_ref(), now, 0).1;
        let (written, outcome) = decide(state.as_ref(), now, hits);
        let wrote = written.is_some();
        if let Some(new) = written {
            state = Some(new);
        }
        let probe_after = decide(state.as_ref(), now, 0).1;
        trace.push(Hit {
            at: now,
            hits,
            outcome,
            wrote,
            probe_before,
            probe_after,
        });
    }
    trace
}

/// Invariants of every algorithm: a denied call or a check changes nothing; a call never
/// makes more hits available at the same instant; a check agrees with what it reports.
pub fn check_common(trace: &[Hit]) {
    for hit in trace {
        if !hit.outcome.allowed || hit.hits == 0 {
            assert!(!hit.wrote, "a denied call or a check wrote state: {hit:?}");
            assert_eq!(hit.probe_after, hit.probe_before, "{hit:?}");
        }
        assert!(
            hit.probe_after.remaining <= hit.probe_before.remaining,
            "remaining grew: {hit:?}"
        );
        if hit.outcome.allowed {
            assert_eq!(hit.outcome.retry_after, 0);
        } else {
            assert_eq!(hit.outcome.remaining, 0);
        }
    }
}

/// The largest number of admitted hits in any half-open interval `[t, t + length)`.
pub fn max_in_any_interval(trace: &[Hit], length: Micros) -> u64 {
    let admitted: Vec<(Micros, u64)> = trace
        .iter()
        .filter(|hit| hit.outcome.allowed && hit.hits > 0)
        .map(|hit| (hit.at, hit.hits))
        .collect();
    let mut best = 0;
    let mut sum = 0;
    let mut start = 0;
    for end in 0..admitted.len() {
        sum += admitted[end].1;
        while admitted[end].0 - admitted[start].0 >= length {
            sum -= admitted[start].1;
            start += 1;
        }
        best = best.max(sum);
    }
    best
}

/// The largest number of admitted hits inside one epoch-aligned window.
pub fn max_in_aligned_window(trace: &[Hit], window: Micros) -> u64 {
    let mut per_window = std::collections::HashMap::<u64, u64>::new();
    for hit in trace.iter().filter(|hit| hit.outcome.allowed) {
        *per_window.entry(hit.at / window).or_default() += hit.hits;
    }
    per_window.values().copied().max().unwrap_or(0)
}

/// Sends one hit at each instant a client keeping exactly to `limit` per `window` would, on a
/// µs clock (the k-th at ceil(k·window/limit)), and returns the first denied hit, if any.
pub fn first_denial_at_the_rate<S: Clone>(
    decide: impl Fn(Option<&S>, Micros) -> (Option<S>, Outcome),
    limit: u64,
    window: Micros,
    calls: u64,
) -> Option<u64> {
    let mut state: Option<S> = None;
    for k in 0..calls {
        let offset = (u128::from(k) * u128::from(window)).div_ceil(u128::from(limit));
        let (next, outcome) = decide(state.as_ref(), BASE + u64::try_from(offset).ok()?);
        if !outcome.allowed {
            return Some(k);
        }
        state = next.or(state);
    }
    None
}
