//! Properties every algorithm shares through `decide` and `give_back`: a refund right after
//! the consuming call restores the counter as if the call had never been made; an
//! `IfUnchanged` algorithm refunds only an unchanged state; an `Exact` one refunds whatever
//! happened since, and never more than was consumed.

use proptest::prelude::*;

use super::given_back::give_back;
use super::testing::{BASE, secs};
use super::*;

#[test]
fn a_stored_state_stays_small() {
    // The memory store's bytes per counter (docs/performance.md) rest on this.
    assert_eq!(std::mem::size_of::<State>(), 32);
}

#[test]
fn names_and_tags_are_declared_once_and_parse_back() {
    for algorithm in Algorithm::ALL {
        assert_eq!(algorithm.name().parse::<Algorithm>(), Ok(algorithm));
    }
    assert_eq!(
        "leaky_bucket".parse::<Algorithm>(),
        Err("expected one of fixed_window|sliding_window|sliding_log|token_bucket|gcra|concurrency, got \"leaky_bucket\"".to_owned())
    );
    let tags: std::collections::HashSet<_> = Algorithm::ALL.map(Algorithm::key_tag).into();
    assert_eq!(tags.len(), Algorithm::ALL.len());
    assert_eq!(
        Algorithm::Gcra { burst: 5 }.to_string(),
        "gcra burst=5",
        "Display shows every parameter"
    );
}

#[test]
fn parameters_of_another_algorithm_are_refused_naming_their_owners() {
    let burst = Parameters {
        burst: Some(3),
        ..Parameters::default()
    };
    let error = Algorithm::default()
        .configure(10, secs(60), &burst)
        .unwrap_err();
    assert_eq!(error.parameter, Some(Parameter::Burst));
    assert_eq!(
        error.to_string(),
        "burst: only applies to token_bucket and gcra, not fixed_window"
    );
    assert_eq!(
        Algorithm::TokenBucket { burst: 0 }.configure(10, secs(60), &Parameters::default()),
        Ok(Algorithm::TokenBucket { burst: 10 }),
        "burst defaults to the limit"
    );
}

/// An algorithm with random parameters, as a rule could configure it.
fn params() -> impl Strategy<Value = Params> {
    (0usize..6, 1u64..20, 1u64..60, 1u64..20, 0u64..3).prop_map(
        |(which, requests, window_s, burst, gap_s)| {
            let algorithm = match which {
                0 => Algorithm::FixedWindow {
                    anchor: Anchor::ALL[(burst % 2) as usize],
                },
                1 => Algorithm::SlidingWindow,
                2 => Algorithm::SlidingLog {
                    min_interval: secs(gap_s),
                },
                3 => Algorithm::TokenBucket { burst },
                4 => Algorithm::Gcra { burst },
                _ => Algorithm::Concurrency,
            };
            Params {
                algorithm,
                requests,
                window: secs(window_s),
            }
        },
    )
}

fn steps() -> impl Strategy<Value = Vec<(Micros, u64)>> {
    proptest::collection::vec((0u64..4_000_000, 0u64..3), 0..40)
}

/// Runs `steps` from `BASE`; the state and the instant after them.
fn replay(params: &Params, steps: &[(Micros, u64)]) -> (Option<State>, Micros) {
    let mut state = None;
    let mut now = BASE;
    for &(gap, hits) in steps {
        now += gap;
        if let Some(next) = decide(params, state.as_ref(), now, hits, Charge::IfAllowed).state {
            state = Some(next);
        }
    }
    (state, now)
}

/// The outcomes of `probes` (gap, hits) applied in turn from `state` at `now`.
fn outcomes(
    params: &Params,
    mut state: Option<State>,
    mut now: Micros,
    probes: &[(Micros, u64)],
) -> Vec<Outcome> {
    probes
        .iter()
        .map(|&(gap, hits)| {
            now += gap;
            let step = decide(params, state.as_ref(), now, hits, Charge::IfAllowed);
            if let Some(next) = step.state {
                state = Some(next);
            }
            step.outcome
        })
        .collect()
}

proptest! {
    #[test]
    fn a_refund_right_after_the_call_is_as_if_it_was_never_made(
        params in params(),
        before in steps(),
        hits in 1u64..4,
        after in steps(),
    ) {
        let (state, now) = replay(&params, &before);
        let step = decide(&params, state.as_ref(), now, hits, Charge::IfAllowed);
        prop_assume!(step.outcome.allowed);
        let Some(consumed) = step.state else {
            return Err(TestCaseError::fail("an admitted hit wrote no state"));
        };
        let refunded = give_back(&params, Some(&consumed), Some(&consumed), now, hits);
        prop_assert!(refunded.is_some(), "an unchanged counter always takes its refund");
        prop_assert_eq!(
            outcomes(&params, refunded, now, &after),
            outcomes(&params, state, now, &after)
        );
    }

    #[test]
    fn a_changed_counter_is_refunded_only_when_the_algorithm_is_exact_and_never_beyond_what_was_consumed(
        params in params(),
        before in steps(),
        hits in 1u64..4,
        between in proptest::collection::vec((1u64..2_000_000, 1u64..3), 1..5),
    ) {
        let (state, now) = replay(&params, &before);
        let step = decide(&params, state.as_ref(), now, hits, Charge::IfAllowed);
        prop_assume!(step.outcome.allowed);
        let consumed = step.state;
        let mut changed = consumed.clone();
        let mut later = now;
        for &(gap, more) in &between {
            later += gap;
            if let Some(next) = decide(&params, changed.as_ref(), later, more, Charge::IfAllowed).state {
                changed = Some(next);
            }
        }
        prop_assume!(changed != consumed);
        let refunded = give_back(&params, changed.as_ref(), consumed.as_ref(), now, hits);
        match params.algorithm.refund() {
            Refund::IfUnchanged => prop_assert_eq!(refunded, None),
            Refund::Exact => {
                let check = |state: Option<&State>| decide(&params, state, later, 0, Charge::IfAllowed).outcome.remaining;
                let (with, without) = (check(refunded.as_ref().or(changed.as_ref())), check(changed.as_ref()));
                prop_assert!(with >= without && with - without <= hits, "{without} → {with} for {hits} given back");
            }
        }
    }
}
