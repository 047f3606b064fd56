//! One hit alone on a counter of any algorithm but the fixed window aligned on the epoch
//! (which is a counter: `counter.rs`), and for a sliding log only a short one. lua/apply.lua's
//! `apply_one` reads the state, decides, writes what the hit consumed and answers the state it
//! found; the outcome is worked out here from that state by the Rust algorithm, which the Lua
//! port matches exactly (tests/redis_parity.rs). Redis then spends nothing on building a reply
//! or on a second decision for a denied hit's room, about a fifth of what the call cost it.

use redis::Value;

use crate::algorithm::{
    self, Algorithm, Charge, EXACT_BOUND, Params, State, fixed_window, gcra, sliding_log,
    sliding_window, token_bucket,
};
use crate::clock::Micros;
use crate::storage::{Hit, Role, StoreError};

/// The longest sliding log whose lone hits go this way. The answer is as long as the state, two
/// numbers per run of hits, and a log holds up to its limit in runs: past this, the general
/// 8-number answer costs Redis less than sending the log, and tollgate less than parsing it.
const LONGEST_LOG: u64 = 64;

/// Whether a lone hit on a counter with `params` goes this way.
pub fn takes(params: &Params) -> bool {
    match params.algorithm {
        Algorithm::SlidingLog { .. } => params.requests <= LONGEST_LOG,
        _ => true,
    }
}

/// The tick the counter code counts `params` in (`Params::tick`; a limit no tick keeps exact
/// is refused by the config, so the fallback is never used in practice).
pub fn tick(params: &Params) -> Micros {
    params.tick().unwrap_or(1_000_000)
}

/// Whether a denied hit of this role makes the call commit nothing (the veto rule of
/// `storage::rejects` for one hit; `complete`: the call holds the whole request).
pub fn denial_vetoes(role: Role, complete: bool) -> bool {
    match role {
        Role::Enforced => true,
        Role::Quota => complete,
        Role::Shadow => false,
    }
}

/// Turns the state the script found (its reply: nil or the stored numbers) into the general
/// reply (lua/apply.lua): the instant, committed, then allowed, remaining, reset_after,
/// retry_after and the first two numbers of the state the counter holds after the call.
pub fn general_reply(
    hit: &Hit,
    reply: &Value,
    instant: Micros,
    charge: Charge,
    complete: bool,
) -> Result<Vec<i64>, StoreError> {
    let found = found_state(hit.params.algorithm, reply)?;
    let decided = algorithm::decide(&hit.params, found.as_ref(), instant, hit.hits, charge);
    let outcome = decided.outcome;
    let committed =
        outcome.allowed || charge == Charge::Always || !denial_vetoes(hit.role, complete);
    let after = match decided.state {
        Some(state) if committed => Some(state),
        _ => found,
    };
    let clamp = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    let numbers = after.as_ref().map(numbers).unwrap_or_default();
    let number = |index: usize| numbers.get(index).map_or(-1, |&n| clamp(n));
    Ok(vec![
        clamp(instant),
        i64::from(committed),
        i64::from(outcome.allowed),
        clamp(outcome.remaining),
        clamp(outcome.reset_after),
        clamp(outcome.retry_after),
        number(0),
        number(1),
    ])
}

/// The state in the script's reply: nil (no counter) or its numbers separated by spaces, each
/// within `EXACT_BOUND` (Lua reads them as doubles: a larger one is not what Lua decided on).
fn found_state(algorithm: Algorithm, reply: &Value) -> Result<Option<State>, StoreError> {
    let malformed = || {
        let shown: String = format!("{reply:?}").chars().take(200).collect();
        StoreError::MalformedReply(format!("counter script answered {shown}"))
    };
    let text = match reply {
        Value::Nil => return Ok(None),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).map_err(|_| malformed())?,
        Value::SimpleString(text) => text.as_str(),
        _ => return Err(malformed()),
    };
    let number = |text: &str| match text.parse::<u64>() {
        Ok(number) if u128::from(number) <= EXACT_BOUND => Ok(number),
        _ => Err(malformed()),
    };
    // A sliding log whose every run was given back is stored empty.
    let numbers = if text.is_empty() {
        Vec::new()
    } else {
        text.split(' ')
            .map(number)
            .collect::<Result<Vec<u64>, StoreError>>()?
    };
    from_numbers(algorithm, &numbers)
        .map(Some)
        .ok_or_else(malformed)
}

/// A state as the list of numbers the counter code stores (in ticks, as the algorithm counts).
fn numbers(state: &State) -> Vec<u64> {
    match state {
        State::FixedWindow(s) => vec![s.window_start, s.count],
        State::SlidingWindow(s) => vec![s.window_start, s.current, s.previous],
        State::SlidingLog(s) => s.runs.iter().flat_map(|&(at, n)| [at, n]).collect(),
        State::TokenBucket(s) => vec![s.level, s.updated],
        State::Gcra(s) => vec![s.tat, s.remainder],
    }
}

/// The state of `algorithm` from its stored numbers; `None` when they do not have its shape.
fn from_numbers(algorithm: Algorithm, numbers: &[u64]) -> Option<State> {
    Some(match (algorithm, numbers) {
        (Algorithm::FixedWindow { .. }, &[window_start, count]) => {
            State::FixedWindow(fixed_window::State {
                window_start,
                count,
            })
        }
        (Algorithm::SlidingWindow, &[window_start, current, previous]) => {
            State::SlidingWindow(sliding_window::State {
                window_start,
                current,
                previous,
            })
        }
        (Algorithm::SlidingLog { .. }, runs) if runs.len() % 2 == 0 => {
            State::SlidingLog(Box::new(sliding_log::State {
                runs: runs.chunks_exact(2).map(|run| (run[0], run[1])).collect(),
            }))
        }
        (Algorithm::TokenBucket { .. }, &[level, updated]) => {
            State::TokenBucket(token_bucket::State { level, updated })
        }
        (Algorithm::Gcra { .. }, &[tat, remainder]) => State::Gcra(gcra::State { tat, remainder }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Anchor;
    use crate::storage::keys::{EntryValue, counter_key};

    /// A GCRA of 2 per second with a burst of 2: one hit is half a second of TAT.
    const GCRA: Algorithm = Algorithm::Gcra { burst: 2 };
    const NOW: Micros = 1_795_000_000_000_000;
    const FULL: &str = "1795000001000000 0";

    fn hit(algorithm: Algorithm, role: Role) -> Hit {
        let params = Params {
            algorithm,
            requests: 2,
            window: 1_000_000,
        };
        Hit {
            descriptor: 0,
            key: counter_key("d", [("user", EntryValue::Actual("a"))], &params),
            params,
            hits: 1,
            role,
        }
    }

    /// The reply to one GCRA hit of `role` that found `found` (`None`: no counter).
    fn answer(
        role: Role,
        found: Option<&str>,
        charge: Charge,
        complete: bool,
    ) -> Result<Vec<i64>, StoreError> {
        let reply = found.map_or(Value::Nil, |text| {
            Value::BulkString(text.as_bytes().to_vec())
        });
        general_reply(&hit(GCRA, role), &reply, NOW, charge, complete)
    }

    const AT: i64 = NOW as i64;

    #[test]
    fn a_counter_never_seen_is_decided_as_new() {
        // Admitted with one left; the TAT half a second ahead (µs ticks, remainder 0).
        assert_eq!(
            answer(Role::Enforced, None, Charge::IfAllowed, true).unwrap(),
            [AT, 1, 1, 1, 500_000, 0, AT + 500_000, 0]
        );
    }

    #[test]
    fn a_denial_vetoes_by_the_veto_rule_and_reports_the_state_found() {
        // Denied, retry in half a second, the state as found; committed by role.
        let denied = |committed| [AT, committed, 0, 0, 1_000_000, 500_000, AT + 1_000_000, 0];
        let full = Some(FULL);
        assert_eq!(
            answer(Role::Enforced, full, Charge::IfAllowed, true).unwrap(),
            denied(0)
        );
        assert_eq!(
            answer(Role::Quota, full, Charge::IfAllowed, true).unwrap(),
            denied(0)
        );
        assert_eq!(
            answer(Role::Quota, full, Charge::IfAllowed, false).unwrap(),
            denied(1),
            "a quota denial alone in a call that is not the whole request leaves it to the caller"
        );
        assert_eq!(
            answer(Role::Shadow, full, Charge::IfAllowed, true).unwrap(),
            denied(1)
        );
        // --count-denied: the hit consumes, but the TAT stops a full burst ahead.
        assert_eq!(
            answer(Role::Enforced, full, Charge::Always, true).unwrap(),
            denied(1)
        );
    }

    #[test]
    fn a_state_of_the_wrong_shape_is_a_malformed_reply() {
        for raw in ["1 2 3", "x 1", "", "1  2", "-1 2", "9007199254740993 0"] {
            let result = answer(Role::Enforced, Some(raw), Charge::IfAllowed, true);
            assert!(
                matches!(result, Err(StoreError::MalformedReply(_))),
                "{raw:?}: {result:?}"
            );
        }
        let first_hit = Algorithm::FixedWindow {
            anchor: Anchor::FirstHit,
        };
        let result = general_reply(
            &hit(first_hit, Role::Enforced),
            &Value::Int(3),
            NOW,
            Charge::IfAllowed,
            true,
        );
        assert!(matches!(result, Err(StoreError::MalformedReply(_))));
        let log = Algorithm::SlidingLog { min_interval: 0 };
        assert_eq!(
            found_state(log, &Value::BulkString(Vec::new())).unwrap(),
            Some(State::SlidingLog(Box::default())),
            "a log given back entirely"
        );
        assert!(found_state(log, &Value::BulkString(b"1 2 3".to_vec())).is_err());
    }

    #[test]
    fn a_denial_vetoes_as_the_veto_rule_says_for_a_request_of_one_descriptor() {
        for role in [Role::Enforced, Role::Quota, Role::Shadow] {
            assert_eq!(
                denial_vetoes(role, true),
                crate::storage::rejects([(role, true)]),
                "{role:?}"
            );
            // A call holding part of the request: only an enforced denial is final there.
            assert_eq!(
                denial_vetoes(role, false),
                role == Role::Enforced,
                "{role:?}"
            );
        }
    }

    #[test]
    fn a_long_sliding_log_takes_the_general_answer() {
        let log = |requests| Params {
            algorithm: Algorithm::SlidingLog { min_interval: 0 },
            requests,
            window: 1_000_000,
        };
        assert!(takes(&log(LONGEST_LOG)));
        assert!(!takes(&log(LONGEST_LOG + 1)));
        assert!(takes(&Params {
            requests: 1_000_000,
            ..hit(GCRA, Role::Enforced).params
        }));
    }

    #[test]
    fn numbers_and_states_convert_both_ways() {
        let states = [
            (GCRA, vec![5, 1]),
            (Algorithm::TokenBucket { burst: 2 }, vec![7, 9]),
            (Algorithm::SlidingWindow, vec![10, 2, 3]),
            (Algorithm::SlidingLog { min_interval: 0 }, vec![1, 2, 3, 4]),
            (
                Algorithm::FixedWindow {
                    anchor: Anchor::FirstHit,
                },
                vec![4, 6],
            ),
        ];
        for (algorithm, stored) in states {
            let state = from_numbers(algorithm, &stored).unwrap();
            assert_eq!(numbers(&state), stored, "{algorithm:?}");
        }
        assert_eq!(from_numbers(Algorithm::SlidingWindow, &[1, 2]), None);
    }
}
