use redis::Value;

use super::*;
use crate::algorithm::{Algorithm, Anchor, Params};
use crate::clock::MICROS_PER_SECOND;
use crate::storage::Role;
use crate::storage::keys::{EntryValue, counter_key};

const NOW: Micros = 1_795_000_000 * MICROS_PER_SECOND;

fn hit(user: &str, algorithm: Algorithm, requests: u64) -> Hit {
    let params = Params {
        algorithm,
        requests,
        window: MICROS_PER_SECOND,
    };
    Hit {
        descriptor: 0,
        key: counter_key("d", [("user", EntryValue::Actual(user))], &params),
        params,
        hits: 1,
        role: Role::Enforced,
        charge: crate::algorithm::Charge::IfAllowed,
        lease: crate::limit::Lease::AsConfigured,
    }
}

fn call<'a>(op: Op<'a>, hits: &'a [Hit], node: Option<(&'a str, u16)>) -> Call<'a> {
    Call {
        op,
        hits,
        node,
        complete: true,
        prefix: "",
        grace_ms: 110,
        sliding_window: SlidingWindowLayout::Text,
        state_layout: StateLayout::Text,
    }
}

const EPOCH: Algorithm = Algorithm::FixedWindow {
    anchor: Anchor::Epoch,
};
const GCRA: Algorithm = Algorithm::Gcra { burst: 2 };

#[test]
fn each_call_takes_the_cheapest_layout_that_carries_it() {
    let apply = Op::Apply { now: NOW };
    let give_back = Op::GiveBack {
        at: NOW,
        expected: &[],
    };
    let counter = [hit("a", EPOCH, 5)];
    let counters = [hit("a", EPOCH, 5), hit("b", EPOCH, 5)];
    let gcra = [hit("a", GCRA, 5)];
    let mixed = [hit("a", EPOCH, 5), hit("b", GCRA, 5)];
    let short_log = [hit("a", Algorithm::SlidingLog { min_interval: 0 }, 64)];
    let long_log = [hit("a", Algorithm::SlidingLog { min_interval: 0 }, 65)];
    let node = Some(("127.0.0.1", 7000));
    let cases = [
        (call(apply, &counter, None), Layout::CountOne),
        (call(apply, &counters, None), Layout::Count),
        (call(apply, &counters, node), Layout::Count),
        (call(apply, &gcra, None), Layout::DecideOne),
        (call(apply, &short_log, None), Layout::DecideOne),
        (call(apply, &long_log, None), Layout::Apply),
        (call(apply, &mixed, None), Layout::Apply),
        (call(apply, &mixed, node), Layout::Apply),
        (call(give_back, &counter, None), Layout::GiveBack),
        (call(give_back, &mixed, None), Layout::GiveBack),
    ];
    for (call, layout) in cases {
        assert_eq!(Layout::of(&call), layout, "{:?}", call.hits);
        assert!(layout.entry(call.node.is_some()).is_some());
    }
}

#[test]
fn a_counter_of_one_integer_per_window_is_keyed_by_its_window_and_a_state_by_its_key() {
    let hits = [hit("a", EPOCH, 5), hit("b", GCRA, 5)];
    let mut call = call(Op::Apply { now: NOW + 1 }, &hits, None);
    call.prefix = "team:";
    assert_eq!(
        call.key(&hits[0]),
        format!("team:{}:1795000000", hits[0].key.as_str())
    );
    assert_eq!(call.key(&hits[1]), format!("team:{}", hits[1].key.as_str()));
}

#[test]
fn a_counter_named_twice_is_told_by_the_position_of_its_earlier_hit() {
    let hits = [
        hit("a", EPOCH, 5),
        hit("b", EPOCH, 5),
        hit("a", EPOCH, 5),
        hit("a", EPOCH, 5),
    ];
    let call = call(Op::Apply { now: NOW }, &hits, None);
    assert_eq!(call.earlier().collect::<Vec<_>>(), [0, 0, 1, 3]);
}

#[test]
fn count_ones_reply_is_decided_by_the_request_rule() {
    let hits = [hit("a", EPOCH, 2)];
    let call = call(Op::Apply { now: NOW }, &hits, None);
    let reply = Layout::CountOne.decode(&call, Value::Int(1)).unwrap();
    assert!(reply.committed);
    assert_eq!(
        (reply.outcomes[0].allowed, reply.outcomes[0].remaining),
        (true, 0)
    );
    let full = Layout::CountOne.decode(&call, Value::Int(2)).unwrap();
    assert!(!full.committed && !full.outcomes[0].allowed);
    assert!(Layout::CountOne.decode(&call, Value::Int(-1)).is_err());
    assert!(Layout::CountOne.decode(&call, Value::Nil).is_err());
}

#[test]
fn a_count_reply_that_disagrees_with_the_rule_is_malformed() {
    let hits = [hit("a", EPOCH, 1), hit("b", EPOCH, 1)];
    let call = call(Op::Apply { now: NOW }, &hits, None);
    let counts =
        |a, b, committed| Value::Array(vec![Value::Int(a), Value::Int(b), Value::Int(committed)]);
    assert!(
        Layout::Count
            .decode(&call, counts(0, 0, 1))
            .unwrap()
            .committed
    );
    assert!(
        !Layout::Count
            .decode(&call, counts(0, 1, 0))
            .unwrap()
            .committed
    );
    assert!(matches!(
        Layout::Count.decode(&call, counts(0, 1, 1)),
        Err(StoreError::MalformedReply(_))
    ));
    assert!(Layout::Count.decode(&call, counts(0, 0, 1)).is_ok());
    assert!(
        Layout::Count
            .decode(&call, Value::Array(vec![Value::Int(0)]))
            .is_err()
    );
}

#[test]
fn a_sliding_window_is_written_as_counters_only_when_asked_and_its_counts_fit() {
    let small = [hit("a", Algorithm::SlidingWindow, 100)];
    let large = [hit("a", Algorithm::SlidingWindow, numbers::WINDOW_COUNTS)];
    let mut counting = call(
        Op::Apply {
            now: 5 * MICROS_PER_SECOND,
        },
        &small,
        None,
    );
    counting.sliding_window = SlidingWindowLayout::Counters;
    assert_eq!(counting.code(&small[0].params), 6);
    assert_eq!(
        counting.window_counter(&small[0]).as_deref(),
        Some(format!("{}:5", small[0].key.as_str()).as_str()),
        "its key with the number of the call's window"
    );
    counting.hits = &large;
    assert_eq!(
        counting.code(&large[0].params),
        2,
        "counts past 2^26 stay text"
    );
    assert_eq!(counting.window_counter(&large[0]), None);
    let text = call(
        Op::Apply {
            now: 5 * MICROS_PER_SECOND,
        },
        &small,
        None,
    );
    assert_eq!(text.code(&small[0].params), 2);
    assert_eq!(text.window_counter(&small[0]), None);
}

/// A packed bucket is kept for a full burst's fill at its rate, in whole ms, then the grace:
/// what lua/state.lua's `ttl_ms` gives the emptiest bucket, in the same ticks. A packed
/// sliding log is kept as its text is: the longer of its window and its minimum interval.
#[test]
fn a_packed_state_is_kept_for_its_longest_life_then_the_grace() {
    let day = 86_400 * MICROS_PER_SECOND;
    let bucket = |algorithm, requests, window| Params {
        algorithm,
        requests,
        window,
    };
    let token_bucket = |burst| Algorithm::TokenBucket { burst };
    let gcra = |burst| Algorithm::Gcra { burst };
    let log = |min_interval| Algorithm::SlidingLog { min_interval };
    let daily = bucket(token_bucket(3_000_001), 2_000_000, day);
    assert_eq!(daily.tick(), Some(1_000), "counted in ms ticks");
    let huge = bucket(token_bucket(100_000_000), 7, day);
    assert_eq!(
        huge.tick(),
        Some(MICROS_PER_SECOND),
        "counted in second ticks"
    );
    let cases = [
        // 3 tokens at 3 a second: 1 s.
        (
            bucket(token_bucket(3), 3, MICROS_PER_SECOND),
            Some(1_000 + 110),
        ),
        // 7 hits at 3 in 10 s: 23.33… s, rounded up to the µs tick, then to the ms.
        (
            bucket(gcra(7), 3, 10 * MICROS_PER_SECOND),
            Some(23_334 + 110),
        ),
        // 3,000,001 at 2,000,000 a day: 129,600,043.2 ms ticks, rounded up to the tick.
        (daily, Some(129_600_044 + 110)),
        // 100,000,000 at 7 a day: 1,234,285,714,285.7 s ticks, rounded up to the tick (in µs,
        // 1,234,285,714,285,715 ms).
        (huge, Some(1_234_285_714_286_000 + 110)),
        (bucket(gcra(1), 0, MICROS_PER_SECOND), None),
        (bucket(Algorithm::SlidingWindow, 3, MICROS_PER_SECOND), None),
        // A log: its window, 2.5 s; or its minimum interval, 3.000001 s, rounded up to the ms.
        (bucket(log(1_000_000), 3, 2_500_000), Some(2_500 + 110)),
        (bucket(log(3_000_001), 3, 2_500_000), Some(3_001 + 110)),
        (bucket(log(0), 0, MICROS_PER_SECOND), Some(1_000 + 110)),
    ];
    for (params, expiry) in cases {
        assert_eq!(
            decide_one::packed_expiry_ms(&params, 110),
            expiry,
            "{params:?}"
        );
    }
}
