//! The numbers every layout sends and reads: packed arguments, the codes the Lua library
//! knows algorithms and roles by, and a stored state's text. One encoding of each.

use redis::Value;

use crate::algorithm::{
    Algorithm, Anchor, Charge, EXACT_BOUND, Params, State, fixed_window, gcra, sliding_log,
    sliding_window, token_bucket,
};
use crate::clock::Micros;
use crate::storage::{Hit, Role, StoreError};

/// The longest sliding log whose lone hits go by `Layout::DecideOne`, and so the most runs a
/// packed log holds. That layout answers the state, two numbers per run of hits, and a log
/// holds up to its limit in runs: past this, Apply's answer of six numbers costs Redis less
/// than sending the log, and tollgate less than parsing it.
pub const LONGEST_LOG: u64 = 64;

/// Numbers packed into one argument as the Lua code reads them (prelude.lua's `numbers`):
/// each a little-endian signed 64-bit integer. One argument holding n numbers costs Redis one
/// argument object and one Lua string, where n arguments cost n of each and n conversions
/// from text. Every number tollgate sends is below 2^52 (the bound of src/algorithm's
/// exactness) save a time to live past 140,000 years, which is held there: Lua's numbers are
/// exact only below 2^53. -1 (a state number the counter does not have) is sent as is.
pub fn packed(numbers: impl IntoIterator<Item = i64>) -> Vec<u8> {
    const EXACT: i64 = 1 << 52;
    numbers
        .into_iter()
        .flat_map(|number| number.min(EXACT).to_le_bytes())
        .collect()
}

/// A count, time or limit as a packed number.
pub fn n(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The code the Lua library registers an algorithm's port under (`ALGORITHMS[code]`). A
/// fixed window aligned on the epoch is stored as one integer per window (code 0); with its
/// window started at the first hit, as its two numbers (code 1). A sliding window written as
/// one integer per window is `SLIDING_WINDOW_COUNTERS` (`Call::code`).
pub fn code(algorithm: Algorithm) -> i64 {
    match algorithm {
        Algorithm::FixedWindow {
            anchor: Anchor::Epoch,
        } => 0,
        Algorithm::FixedWindow {
            anchor: Anchor::FirstHit,
        } => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::SlidingLog { .. } => 3,
        Algorithm::TokenBucket { .. } => 4,
        Algorithm::Gcra { .. } => 5,
        Algorithm::Concurrency => 7,
    }
}

/// A sliding window whose hits are written as one integer per window
/// (`SlidingWindowLayout::Counters`; lua/window_counters.lua).
pub const SLIDING_WINDOW_COUNTERS: i64 = 6;

/// Such an integer holds the window's count plus this many times the previous window's
/// (lua/window_counters.lua, `PACK`): counts stay below it, so the layout is written only for
/// limits below it.
pub const WINDOW_COUNTS: u64 = 1 << 26;

/// A role as rule.lua reads it.
pub fn role_code(role: Role) -> i64 {
    match role {
        Role::Enforced => 0,
        Role::Quota => 1,
        Role::Shadow => 2,
        Role::Refund => 3,
    }
}

/// A hit's role, with `ALWAYS` (rule.lua) added for a charge that counts whether admitted or
/// not: how the layouts that carry hits of either charge (Apply) send both.
pub fn role_and_charge(hit: &Hit) -> i64 {
    // The limiter never makes a refund count whatever its fate; Lua would read one as a
    // charge.
    debug_assert!(hit.role != Role::Refund || hit.charge == Charge::IfAllowed);
    let always = match hit.charge {
        Charge::IfAllowed => 0,
        Charge::Always => 4,
    };
    role_code(hit.role) + always
}

/// Whether a counter is one integer per window (a fixed window aligned on the epoch).
pub fn is_counter(params: &Params) -> bool {
    code(params.algorithm) == 0
}

/// The tick the counter code counts `params` in (`Params::tick`; a limit no tick keeps exact
/// is refused by the config, so the fallback is never used in practice).
pub fn tick(params: &Params) -> Micros {
    params.tick().unwrap_or(1_000_000)
}

/// The number of the window `instant` falls in, appended to a counter's key.
pub fn window_number(params: &Params, instant: Micros) -> u64 {
    instant / params.window.max(1)
}

/// Where the window `instant` falls in starts.
pub fn window_start(params: &Params, instant: Micros) -> Micros {
    window_number(params, instant) * params.window.max(1)
}

/// How long a counter created at `instant` lives: to the end of its window, in whole ms, then
/// `grace_ms`.
pub fn counter_ttl_ms(params: &Params, instant: Micros, grace_ms: u64) -> u64 {
    let end = window_start(params, instant) + params.window.max(1);
    (end - instant).div_ceil(1000).max(1) + grace_ms
}

/// A state as Redis stores it: a list of numbers, in the ticks its algorithm counts in. Both
/// directions match exhaustively: a new algorithm is pointed at here.
pub fn state_numbers(state: &State) -> Vec<u64> {
    match state {
        State::FixedWindow(s) => vec![s.window_start, s.count],
        State::SlidingWindow(s) => vec![s.window_start, s.current, s.previous],
        State::SlidingLog(s) => s.runs.iter().flat_map(|&(at, n)| [at, n]).collect(),
        State::TokenBucket(s) => vec![s.level, s.updated],
        State::Gcra(s) => vec![s.tat, s.remainder],
    }
}

/// The state of `algorithm` from its numbers; `None` when they do not have its shape.
pub fn state_from_numbers(algorithm: Algorithm, numbers: &[u64]) -> Option<State> {
    Some(match algorithm {
        Algorithm::FixedWindow { .. } => {
            let &[window_start, count] = numbers else {
                return None;
            };
            State::FixedWindow(fixed_window::State {
                window_start,
                count,
            })
        }
        Algorithm::SlidingWindow => {
            let &[window_start, current, previous] = numbers else {
                return None;
            };
            State::SlidingWindow(sliding_window::State {
                window_start,
                current,
                previous,
            })
        }
        // A concurrency limit's holds are a sliding log's runs.
        Algorithm::SlidingLog { .. } | Algorithm::Concurrency => {
            if !numbers.len().is_multiple_of(2) {
                return None;
            }
            let runs = numbers
                .chunks_exact(2)
                .map(|run| (run[0], run[1]))
                .collect();
            State::SlidingLog(Box::new(sliding_log::State { runs }))
        }
        Algorithm::TokenBucket { .. } => {
            let &[level, updated] = numbers else {
                return None;
            };
            State::TokenBucket(token_bucket::State { level, updated })
        }
        Algorithm::Gcra { .. } => {
            let &[tat, remainder] = numbers else {
                return None;
            };
            State::Gcra(gcra::State { tat, remainder })
        }
    })
}

/// A state as a lone hit writes it packed (`StateLayout::Packed`; lua/state.lua): a tag byte
/// no text starts with, then each number as a little-endian 64-bit integer. The tag says the
/// shape: 0xFF, a bucket's two numbers (`PACKED_PAIR`); 0xFE, a sliding log's runs, two
/// numbers each (`PACKED_LOG_TAG`), at most `LONGEST_LOG` of them (no other log takes lone hits).
/// `None` for any other value.
pub fn packed_numbers(bytes: &[u8]) -> Option<Vec<i64>> {
    let (&tag, numbers) = bytes.split_first()?;
    let fits = match tag {
        0xFF => numbers.len() == 16,
        0xFE => numbers.len().is_multiple_of(16) && numbers.len() as u64 <= 16 * LONGEST_LOG,
        _ => false,
    };
    if !fits {
        return None;
    }
    numbers
        .chunks_exact(8)
        .map(|number| number.first_chunk().map(|bytes| i64::from_le_bytes(*bytes)))
        .collect()
}

/// The state of a counter as Redis answered it: nil (no counter), its numbers separated by
/// spaces or packed (`packed_numbers`), each within `EXACT_BOUND` (Lua reads them as
/// doubles: a larger one is not what Lua decided on).
pub fn state_of(algorithm: Algorithm, reply: &Value) -> Result<Option<State>, StoreError> {
    let malformed = || {
        let shown: String = format!("{reply:?}").chars().take(200).collect();
        StoreError::MalformedReply(format!("counter code answered {shown}"))
    };
    let exact = |number: u64| {
        Some(number)
            .filter(|&number| u128::from(number) <= EXACT_BOUND)
            .ok_or_else(malformed)
    };
    let integer = |number: i64| {
        u64::try_from(number)
            .map_err(|_| malformed())
            .and_then(exact)
    };
    let text_numbers = |text: &str| -> Result<Vec<u64>, StoreError> {
        // A sliding log whose every run was given back is stored empty.
        if text.is_empty() {
            return Ok(Vec::new());
        }
        text.split(' ')
            .map(|number| {
                number
                    .parse::<u64>()
                    .map_err(|_| malformed())
                    .and_then(exact)
            })
            .collect()
    };
    let numbers = match reply {
        Value::Nil => return Ok(None),
        // A sliding window read in both its layouts: their sum, as its numbers.
        Value::Array(values) => values
            .iter()
            .map(|value| match value {
                Value::Int(number) => integer(*number),
                _ => Err(malformed()),
            })
            .collect::<Result<Vec<u64>, StoreError>>()?,
        Value::BulkString(bytes) => match packed_numbers(bytes) {
            Some(numbers) => numbers
                .into_iter()
                .map(integer)
                .collect::<Result<Vec<u64>, StoreError>>()?,
            None => text_numbers(std::str::from_utf8(bytes).map_err(|_| malformed())?)?,
        },
        Value::SimpleString(text) => text_numbers(text)?,
        _ => return Err(malformed()),
    };
    state_from_numbers(algorithm, &numbers)
        .map(Some)
        .ok_or_else(malformed)
}

/// A sliding window's counts at `instant` as a lone hit written as counters answers them
/// (lua/window_counters.lua, `decide_counted_window`): current + `WINDOW_COUNTS` × previous,
/// in the window `instant` falls in.
pub fn window_counts(params: &Params, instant: Micros, counts: i64) -> Result<State, StoreError> {
    let counts = u64::try_from(counts)
        .ok()
        .filter(|&counts| counts < WINDOW_COUNTS * WINDOW_COUNTS)
        .ok_or_else(|| StoreError::MalformedReply(format!("a sliding window answered {counts}")))?;
    let tick = tick(params);
    let window = (params.window / tick).max(1);
    Ok(State::SlidingWindow(sliding_window::State {
        window_start: instant / tick / window * window,
        current: counts % WINDOW_COUNTS,
        previous: counts / WINDOW_COUNTS,
    }))
}

/// The integers of an array reply.
pub fn integers(reply: Value) -> Result<Vec<i64>, StoreError> {
    redis::from_redis_value(reply)
        .map_err(|error| StoreError::MalformedReply(format!("counter code answered: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_of_the_wrong_shape_is_a_malformed_reply() {
        let gcra = Algorithm::Gcra { burst: 2 };
        for raw in ["1 2 3", "x 1", "", "1  2", "-1 2", "9007199254740993 0"] {
            let result = state_of(gcra, &Value::BulkString(raw.as_bytes().to_vec()));
            assert!(
                matches!(result, Err(StoreError::MalformedReply(_))),
                "{raw:?}: {result:?}"
            );
        }
        assert!(state_of(gcra, &Value::Int(3)).is_err());
        let log = Algorithm::SlidingLog { min_interval: 0 };
        assert_eq!(
            state_of(log, &Value::BulkString(Vec::new())).unwrap(),
            Some(State::SlidingLog(Box::default())),
            "a log given back entirely"
        );
        assert_eq!(state_of(gcra, &Value::Nil).unwrap(), None);
    }

    #[test]
    fn a_state_packed_is_read_as_its_numbers_and_nothing_else_is() {
        let gcra = Algorithm::Gcra { burst: 2 };
        let log = Algorithm::SlidingLog { min_interval: 0 };
        let packed = |tag: u8, numbers: &[i64]| {
            let mut bytes = vec![tag];
            for number in numbers {
                bytes.extend(number.to_le_bytes());
            }
            bytes
        };
        assert_eq!(
            state_of(
                gcra,
                &Value::BulkString(packed(0xFF, &[1_700_000_000_000_123, 2]))
            )
            .unwrap(),
            Some(State::Gcra(gcra::State {
                tat: 1_700_000_000_000_123,
                remainder: 2
            }))
        );
        assert_eq!(
            state_of(log, &Value::BulkString(packed(0xFE, &[10, 1, 12, 3]))).unwrap(),
            Some(State::SlidingLog(Box::new(sliding_log::State {
                runs: [(10, 1), (12, 3)].into()
            })))
        );
        let longest = state_of(
            log,
            &Value::BulkString(packed(0xFE, &[1; 2 * LONGEST_LOG as usize])),
        );
        assert!(
            matches!(longest, Ok(Some(State::SlidingLog(_)))),
            "{longest:?}"
        );
        assert_eq!(
            state_of(log, &Value::BulkString(packed(0xFE, &[]))).unwrap(),
            Some(State::SlidingLog(Box::default()))
        );
        assert_eq!(packed_numbers(&packed(0xFF, &[-1, 7])), Some(vec![-1, 7]));
        for (algorithm, bytes) in [
            (gcra, packed(0xFF, &[-1, 7])),
            (gcra, packed(0xFF, &[1 << 53, 0])),
            (gcra, packed(0xFF, &[1, 2])[..16].to_vec()),
            (gcra, [packed(0xFF, &[1, 2]), vec![0]].concat()),
            (gcra, packed(0xFD, &[1, 2])),
            (log, packed(0xFF, &[1, 2, 3, 4])),
            (log, packed(0xFE, &[1, 2, 3])),
            (log, packed(0xFE, &[1, 2])[..16].to_vec()),
            (log, packed(0xFE, &[1, -2])),
            (log, packed(0xFE, &[1; 2 * LONGEST_LOG as usize + 2])),
        ] {
            assert!(
                matches!(
                    state_of(algorithm, &Value::BulkString(bytes.clone())),
                    Err(StoreError::MalformedReply(_))
                ),
                "{bytes:?}"
            );
        }
        assert_eq!(
            packed_numbers(b"12345678901234 12"),
            None,
            "a text of 17 bytes"
        );
    }

    #[test]
    fn numbers_and_states_convert_both_ways() {
        let states = [
            (Algorithm::Gcra { burst: 2 }, vec![5, 1]),
            (Algorithm::TokenBucket { burst: 2 }, vec![7, 9]),
            (Algorithm::SlidingWindow, vec![10, 2, 3]),
            (Algorithm::SlidingLog { min_interval: 0 }, vec![1, 2, 3, 4]),
            (Algorithm::SlidingLog { min_interval: 0 }, vec![]),
            (
                Algorithm::FixedWindow {
                    anchor: Anchor::FirstHit,
                },
                vec![4, 6],
            ),
        ];
        for (algorithm, stored) in states {
            let state = state_from_numbers(algorithm, &stored).unwrap();
            assert_eq!(state_numbers(&state), stored, "{algorithm:?}");
        }
        assert_eq!(state_from_numbers(Algorithm::SlidingWindow, &[1, 2]), None);
        assert_eq!(
            state_from_numbers(Algorithm::SlidingLog { min_interval: 0 }, &[1, 2, 3]),
            None
        );
    }

    #[test]
    fn a_sliding_window_s_counts_are_its_window_s_and_the_previous_one_s() {
        let params = Params {
            algorithm: Algorithm::SlidingWindow,
            requests: 10,
            window: 10_000_000,
        };
        // 25 s in: the window that started at 20 s, in µs ticks.
        let counts = window_counts(&params, 25_000_000, 3 + 7 * WINDOW_COUNTS as i64).unwrap();
        assert_eq!(
            state_numbers(&counts),
            [20_000_000, 3, 7],
            "current + WINDOW_COUNTS × previous"
        );
        for malformed in [-1, (WINDOW_COUNTS * WINDOW_COUNTS) as i64] {
            assert!(window_counts(&params, 0, malformed).is_err(), "{malformed}");
        }
    }

    #[test]
    fn numbers_are_packed_little_endian_and_held_to_the_exact_bound() {
        assert_eq!(
            packed([1, -1]),
            [
                1, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255
            ]
        );
        assert_eq!(packed([i64::MAX]), (1i64 << 52).to_le_bytes());
    }
}
