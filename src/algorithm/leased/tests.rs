//! Leases of a bucket against the bucket's own guarantee: replicas taking leases, admitting
//! their hits at random instants within each slice's life, giving the unused back, among
//! per-request decisions, never admit more than `burst + limit × t / window` in any interval
//! of length t. And a token bucket and a GCRA limit lease alike.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;

use super::*;
use crate::algorithm::testing::{BASE, Hit as Admitted, max_in_any_interval, secs};
use crate::algorithm::{Charge, Outcome, decide, given_back};

/// A replica's slice: hits left, usable before `until`; the state its lease left and what
/// it granted, which a return needs.
#[derive(Clone)]
struct Slice {
    left: u64,
    until: Micros,
    at: Micros,
    after: Option<State>,
    granted: u64,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// Time passes.
    Advance(Micros),
    /// A hit decided by the store.
    Request(u64),
    /// A replica takes a lease of `want` for `life` µs (its old slice, if any, is dropped).
    Lease {
        replica: usize,
        want: u64,
        life: Micros,
    },
    /// A replica admits a hit from its slice, if it still may.
    Use(usize),
    /// A replica gives back what its slice holds unused.
    Return(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..400_000).prop_map(Step::Advance),
        2 => (0u64..3).prop_map(Step::Request),
        2 => (0usize..3, 1u64..20, 1u64..2_000_000)
            .prop_map(|(replica, want, life)| Step::Lease { replica, want, life }),
        8 => (0usize..3).prop_map(Step::Use),
        1 => (0usize..3).prop_map(Step::Return),
    ]
}

fn admitted(at: Micros, hits: u64) -> Admitted {
    let outcome = Outcome {
        allowed: true,
        ..Outcome::default()
    };
    Admitted {
        at,
        hits,
        outcome,
        wrote: true,
        probe_before: outcome,
        probe_after: outcome,
    }
}

/// Runs the steps on one counter of `params`: the hits admitted, in order, and every
/// lease's answer.
fn run(params: &Params, steps: &[Step]) -> (Vec<Admitted>, Vec<Taken>) {
    let mut now = BASE;
    let mut state: Option<State> = None;
    let mut slices: [Option<Slice>; 3] = [None, None, None];
    let (mut trace, mut taken) = (Vec::new(), Vec::new());
    for &step in steps {
        match step {
            Step::Advance(by) => now += by,
            Step::Request(hits) => {
                let transition = decide(params, state.as_ref(), now, hits, Charge::IfAllowed);
                if transition.outcome.allowed && hits > 0 {
                    trace.push(admitted(now, hits));
                }
                state = transition.state.or(state);
            }
            Step::Lease {
                replica,
                want,
                life,
            } => {
                let (after, took) = lease(params, state.as_ref(), now, want, life);
                taken.push(took);
                if after.is_some() {
                    state = after.clone();
                    slices[replica] = Some(Slice {
                        left: took.granted,
                        until: now + life,
                        at: now,
                        after,
                        granted: took.granted,
                    });
                }
            }
            Step::Use(replica) => {
                if let Some(slice) = &mut slices[replica]
                    && slice.left > 0
                    && now < slice.until
                {
                    slice.left -= 1;
                    trace.push(admitted(now, 1));
                }
            }
            Step::Return(replica) => {
                if let Some(slice) = slices[replica].take() {
                    let back = slice.left.min(slice.granted);
                    let given = given_back::give_back(
                        params,
                        state.as_ref(),
                        slice.after.as_ref(),
                        slice.at,
                        back,
                    );
                    state = given.or(state);
                }
            }
        }
    }
    (trace, taken)
}

fn params(algorithm: Algorithm, requests: u64, window_s: u64) -> Params {
    Params {
        algorithm,
        requests,
        window: secs(window_s),
    }
}

proptest! {
    #[test]
    fn leased_hits_admitted_within_their_life_keep_the_buckets_bound(
        limit in 1u64..40,
        window_s in 1u64..5,
        burst in 1u64..30,
        steps in proptest::collection::vec(step(), 1..400),
        span_ms in 1u64..6_000,
    ) {
        for algorithm in [Algorithm::TokenBucket { burst }, Algorithm::Gcra { burst }] {
            let params = params(algorithm, limit, window_s);
            let (trace, _) = run(&params, &steps);
            let t = span_ms * 1_000;
            let bound = burst
                + (u128::from(limit) * u128::from(t)).div_ceil(u128::from(params.window)) as u64;
            let most = max_in_any_interval(&trace, t);
            prop_assert!(most <= bound, "{algorithm}: {most} admitted in {t} µs, bound {bound}");
        }
    }

    #[test]
    fn a_token_bucket_and_a_gcra_limit_lease_alike(
        limit in 1u64..40,
        window_s in 1u64..5,
        burst in 1u64..30,
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        // Without returns: a return goes by the state being exactly as the lease left it, and
        // the two states tell apart instants a GCRA's TAT does not (a bucket's last update).
        let steps: Vec<Step> =
            steps.into_iter().filter(|step| !matches!(step, Step::Return(_))).collect();
        let bucket = run(&params(Algorithm::TokenBucket { burst }, limit, window_s), &steps);
        let gcra = run(&params(Algorithm::Gcra { burst }, limit, window_s), &steps);
        prop_assert_eq!(bucket.1, gcra.1);
        let instants = |trace: &[Admitted]| trace.iter().map(|hit| hit.at).collect::<Vec<_>>();
        prop_assert_eq!(instants(&bucket.0), instants(&gcra.0));
    }
}

#[test]
fn a_lease_holds_back_its_lifes_refill() {
    // 10 a second, a burst of 10, full: a lease for half a second (and the µs it starts in)
    // takes the 4 tokens the bucket holds beyond what the life's refill would add, and leaves
    // just under one, full again in 0.9 s.
    let params = params(Algorithm::TokenBucket { burst: 10 }, 10, 1);
    let (state, taken) = lease(&params, None, BASE, 100, 500_000);
    let expected = Taken {
        granted: 4,
        remaining: 0,
        reset_after: 900_001,
    };
    assert_eq!(taken, expected);
    assert_eq!(
        decide(&params, state.as_ref(), BASE, 0, Charge::IfAllowed)
            .outcome
            .remaining,
        0
    );
    // Half a second on, the refill has put 5 back: a per-request hit finds them, and so does
    // the next lease, less its own life's refill.
    let later = BASE + 500_000;
    let check = decide(&params, state.as_ref(), later, 0, Charge::IfAllowed);
    assert_eq!(check.outcome.remaining, 5);
    let (_, again) = lease(&params, state.as_ref(), later, 100, 500_000);
    assert_eq!(again.granted, 4);
    // A life of a whole burst's refill leaves nothing to take.
    let (unchanged, none) = lease(&params, None, BASE, 100, 1_000_000);
    assert_eq!((unchanged, none.granted), (None, 0));
}

#[test]
fn only_buckets_are_leased() {
    let window = params(Algorithm::default(), 100, 1);
    assert_eq!(
        lease(&window, None, BASE, 10, 1_000),
        (None, Taken::default())
    );
    assert!(!is_bucket(&window));
    let bucket = params(Algorithm::Gcra { burst: 100 }, 100, 1);
    assert!(is_bucket(&bucket));
    // A burst of 100 at 100 a second is a second of tolerance: half of it, at most `longest`.
    assert_eq!(slice_life(&bucket, 2_000_000), Some(500_000));
    assert_eq!(slice_life(&bucket, 200_000), Some(200_000));
    // A burst of 2 at 100 a second: 10 ms of life, too short.
    let small = params(Algorithm::Gcra { burst: 2 }, 100, 1);
    assert_eq!(slice_life(&small, 2_000_000), None);
}
