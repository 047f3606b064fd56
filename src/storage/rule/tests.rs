use super::*;
use crate::algorithm::{Algorithm, Params};
use crate::clock::MICROS_PER_SECOND;
use crate::storage::keys::{EntryValue, counter_key};

const NOW: Micros = 1_000_020 * MICROS_PER_SECOND;

fn hit(descriptor: usize, user: &str, requests: u64, hits: u64, role: Role) -> Hit {
    let params = Params {
        algorithm: Algorithm::default(),
        requests,
        window: 60 * MICROS_PER_SECOND,
    };
    Hit {
        descriptor,
        key: counter_key("d", [("user", EntryValue::Actual(user))], &params),
        params,
        hits,
        role,
        charge: Charge::IfAllowed,
        lease: crate::limit::Lease::AsConfigured,
    }
}

/// `hit` counted whether admitted or not (usage, `--count-denied`).
fn always(hit: Hit) -> Hit {
    Hit {
        charge: Charge::Always,
        ..hit
    }
}

/// A fixed window holding `count` in the current minute.
fn holding(count: u64) -> State {
    State::FixedWindow(algorithm::fixed_window::State {
        window_start: NOW - NOW % (60 * MICROS_PER_SECOND),
        count,
    })
}

fn summary(decided: &Decided) -> Vec<(bool, u64)> {
    decided
        .outcomes
        .iter()
        .map(|o| (o.allowed, o.remaining))
        .collect()
}

fn counts(decided: &Decided) -> Vec<Option<u64>> {
    decided
        .writes
        .iter()
        .map(|write| match write {
            Some((State::FixedWindow(state), _)) => Some(state.count),
            _ => None,
        })
        .collect()
}

#[test]
fn a_vetoed_request_consumes_nothing_and_its_admitted_hits_report_a_check() {
    let hits = [
        hit(0, "a", 5, 1, Role::Enforced),
        hit(1, "b", 1, 1, Role::Enforced),
    ];
    let (a, b) = (holding(1), holding(1));
    let decided = decide(&hits, &[Some(&a), Some(&b)], NOW, true);
    assert!(!decided.committed);
    assert_eq!(summary(&decided), [(true, 4), (false, 0)]);
    assert_eq!(counts(&decided), [None, None]);
}

#[test]
fn count_denied_consumes_on_every_descriptor() {
    let hits = [
        always(hit(0, "a", 5, 1, Role::Enforced)),
        always(hit(1, "b", 1, 1, Role::Enforced)),
    ];
    let (a, b) = (holding(1), holding(1));
    let decided = decide(&hits, &[Some(&a), Some(&b)], NOW, true);
    assert!(decided.committed);
    assert_eq!(summary(&decided), [(true, 3), (false, 0)]);
    assert_eq!(counts(&decided), [Some(2), Some(2)]);
}

#[test]
fn usage_counts_past_the_limit_and_vetoes_what_the_request_asked_to_admit() {
    let hits = [
        hit(0, "a", 5, 1, Role::Enforced),
        always(hit(1, "tokens", 10, 4, Role::Enforced)),
    ];
    let (a, tokens) = (holding(1), holding(8));
    let decided = decide(&hits, &[Some(&a), Some(&tokens)], NOW, true);
    assert!(!decided.committed);
    // The admission reports a check; the usage is counted in full and answered over.
    assert_eq!(summary(&decided), [(true, 4), (false, 2)]);
    assert_eq!(counts(&decided), [None, Some(12)]);
}

#[test]
fn a_veto_keeps_a_usage_charge_that_an_earlier_hit_named_on_the_same_counter() {
    let hits = [
        hit(0, "a", 3, 2, Role::Enforced),
        always(hit(1, "a", 3, 2, Role::Enforced)),
        hit(2, "b", 1, 2, Role::Enforced),
    ];
    let decided = decide(&hits, &[None, None, None], NOW, true);
    assert!(!decided.committed);
    // Kept alone, the usage finds the counter empty and leaves 2; it keeps the denial the
    // veto (and the answer's overall code) went by, with the room it found then.
    assert_eq!(summary(&decided), [(true, 3), (false, 1), (false, 1)]);
    assert_eq!(counts(&decided), [None, Some(2), None]);
}

#[test]
fn shadow_never_vetoes_and_quota_vetoes_only_when_every_quota_descriptor_is_over() {
    let shadowed = [
        hit(0, "a", 5, 1, Role::Enforced),
        hit(1, "s", 0, 1, Role::Shadow),
    ];
    let decided = decide(&shadowed, &[None, None], NOW, true);
    assert!(decided.committed);
    let one_quota_over = [
        hit(0, "a", 5, 1, Role::Enforced),
        hit(1, "q1", 0, 1, Role::Quota),
        hit(2, "q2", 5, 1, Role::Quota),
    ];
    let decided = decide(&one_quota_over, &[None; 3], NOW, true);
    assert!(decided.committed);
    assert_eq!(summary(&decided), [(true, 4), (false, 0), (true, 4)]);
    let all_quota_over = [
        hit(0, "a", 5, 1, Role::Enforced),
        hit(1, "q1", 0, 1, Role::Quota),
    ];
    let decided = decide(&all_quota_over, &[None; 2], NOW, true);
    assert!(!decided.committed);
    // A call holding part of the request cannot know every quota descriptor is over.
    let part = decide(&all_quota_over, &[None; 2], NOW, false);
    assert!(part.committed);
}

#[test]
fn the_same_counter_twice_counts_twice_and_is_written_once_by_its_last_hit() {
    let hits = [
        hit(0, "a", 2, 1, Role::Enforced),
        hit(1, "a", 2, 1, Role::Enforced),
    ];
    let decided = decide(&hits, &[None, None], NOW, true);
    assert_eq!(summary(&decided), [(true, 1), (true, 0)]);
    assert_eq!(counts(&decided), [None, Some(2)]);
    assert_eq!(
        decided.state_after(&hits, &[None, None], 0),
        Some(holding(2))
    );
}

#[test]
fn a_denial_after_an_admission_of_the_same_counter_vetoes_both() {
    let hits = [
        hit(0, "a", 1, 1, Role::Enforced),
        hit(1, "a", 1, 1, Role::Enforced),
    ];
    let decided = decide(&hits, &[None, None], NOW, true);
    assert!(!decided.committed);
    // The first hit reports a check on the counter as found: one left.
    assert_eq!(summary(&decided), [(true, 1), (false, 0)]);
    assert_eq!(decided.state_after(&hits, &[None, None], 1), None);
}

#[test]
fn a_denial_vetoes_a_lone_hit_as_the_rule_says_for_one_descriptor() {
    for role in [Role::Enforced, Role::Quota, Role::Shadow] {
        let full = holding(1);
        let hits = [hit(0, "a", 1, 1, role)];
        let whole = decide(&hits, &[Some(&full)], NOW, true);
        assert_eq!(!whole.committed, rejects([(role, true)]), "{role:?}");
        let part = decide(&hits, &[Some(&full)], NOW, false);
        assert_eq!(!part.committed, role == Role::Enforced, "{role:?}");
    }
}

#[test]
fn a_lone_hit_is_decided_as_beside_a_hit_that_cannot_change_its_outcome() {
    // A lone hit takes its own path (`decide_one`); beside an admitted shadow hit on another
    // counter it takes the general one. Both must give it the same outcome and write.
    let bystander = hit(1, "other", 5, 1, Role::Shadow);
    for role in [Role::Enforced, Role::Quota, Role::Shadow, Role::Refund] {
        for held in [None, Some(holding(0)), Some(holding(2)), Some(holding(3))] {
            for charge in [Charge::IfAllowed, Charge::Always] {
                for complete in [true, false] {
                    let lone = Hit {
                        charge: if role == Role::Refund {
                            Charge::IfAllowed
                        } else {
                            charge
                        },
                        ..hit(0, "a", 3, 2, role)
                    };
                    let alone =
                        decide(std::slice::from_ref(&lone), &[held.as_ref()], NOW, complete);
                    // Beside a hit a veto would undo only when the lone one is too.
                    let bystander = Hit {
                        charge: lone.charge,
                        ..bystander.clone()
                    };
                    let pair = [lone, bystander];
                    let beside = decide(&pair, &[held.as_ref(), None], NOW, complete);
                    let case = format!("{role:?} {held:?} {charge:?} complete={complete}");
                    assert_eq!(alone.outcomes[0], beside.outcomes[0], "{case}");
                    assert_eq!(alone.committed, beside.committed, "{case}");
                    assert_eq!(alone.writes[0], beside.writes[0], "{case}");
                }
            }
        }
    }
}
