//! A sliding window written in the counters layout (`SlidingWindowLayout::Counters`): at its
//! edges, a hit decided late, in a window whose successor has begun, finds the window's
//! counter closed (or none, and the next one's) and counts in the next window, as the Rust
//! algorithm decides on a state of a later window, alone in its call (DecideOne) or beside
//! another counter (Apply); a reset forgets it whichever layout wrote it; a limit raised past
//! what a counter holds fails rather than count past it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::redis_process::RedisServer;
use common::sliding_window;
use tollgate::algorithm::{self, Algorithm, Charge, Params, State};
use tollgate::clock::{MICROS_PER_SECOND, ManualClock, Micros};
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::options::{LeaseMode, StoreOptions};
use tollgate::storage::redis::call::numbers::WINDOW_COUNTS;
use tollgate::storage::redis::call::{Call, Layout, Op, SlidingWindowLayout, StateLayout};
use tollgate::storage::redis::connection::call_on;
use tollgate::storage::{CounterReset, CounterStore};
use tollgate::storage::{Hit, Role};

const SECOND: Micros = MICROS_PER_SECOND;
/// The start of a window of one second.
const WINDOW: Micros = 1_795_000_000 * SECOND;

fn hit(name: &str, params: Params, descriptor: usize) -> Hit {
    Hit {
        descriptor,
        key: counter_key("edges", [("user", EntryValue::Actual(name))], &params),
        params,
        hits: 1,
        role: Role::Enforced,
        charge: tollgate::algorithm::Charge::IfAllowed,
        lease: tollgate::limit::Lease::AsConfigured,
    }
}

#[tokio::test]
async fn a_hit_decided_late_counts_in_the_window_begun_after_it() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let params = Params {
        algorithm: Algorithm::SlidingWindow,
        requests: 5,
        window: SECOND,
    };
    let other = Params {
        algorithm: Algorithm::default(),
        requests: 100,
        window: SECOND,
    };
    // Two hits late in a window (or none), one early in the next, then one decided late, at an
    // instant of the first window: it counts in the second, as the algorithm says.
    let counted = [
        WINDOW + 900_000,
        WINDOW + 910_000,
        WINDOW + SECOND + 10_000,
        WINDOW + 950_000,
    ];
    let empty_before = [WINDOW + SECOND + 10_000, WINDOW + 950_000];
    for (name, beside, instants, counts) in [
        ("alone", None, &counted[..], (2, 2)),
        ("beside", Some(hit("other", other, 1)), &counted[..], (2, 2)),
        ("alone-after-none", None, &empty_before[..], (2, 0)),
        (
            "beside-after-none",
            Some(hit("other", other, 1)),
            &empty_before[..],
            (2, 0),
        ),
    ] {
        let counter = hit(name, params, 0);
        let mut state: Option<State> = None;
        for (index, &at) in instants.iter().enumerate() {
            let hits: Vec<Hit> = [counter.clone()]
                .into_iter()
                .chain(beside.clone())
                .collect();
            let call = Call {
                op: Op::Apply { now: at },
                hits: &hits,
                node: None,
                complete: true,
                prefix: "",
                grace_ms: 3_600_000,
                sliding_window: SlidingWindowLayout::Counters,
                state_layout: StateLayout::Text,
            };
            let expected = if beside.is_some() {
                Layout::Apply
            } else {
                Layout::DecideOne
            };
            assert_eq!(Layout::of(&call), expected);
            let reply = call_on(&mut connection, &call).await.unwrap();
            let decided = algorithm::decide(&params, state.as_ref(), at, 1, Charge::IfAllowed);
            assert_eq!(reply.outcomes[0], decided.outcome, "{name}: hit {index}");
            state = decided.state;
            let newest = sliding_window::newest_window(&params, state.as_ref(), at);
            assert_eq!(
                sliding_window::stored(&mut connection, counter.key.as_str(), &params, newest)
                    .await,
                sliding_window::modelled(&params, state.as_ref(), newest),
                "{name}: hit {index}: the counts of window {newest} and the one before"
            );
        }
        // The late hit counted as the second window's second.
        let newest = WINDOW / SECOND + 1;
        assert_eq!(
            sliding_window::stored(&mut connection, counter.key.as_str(), &params, newest).await,
            counts,
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_reset_forgets_a_sliding_window_whichever_layout_wrote_it() {
    let server = RedisServer::start();
    let clock = ManualClock::at_seconds(WINDOW / SECOND + 30);
    let store = |layout| {
        let options = StoreOptions {
            redis_sliding_window_layout: layout,
            ..crate::leases::options(&clock, LeaseMode::Off)
        };
        crate::leases::redis(&server, &options)
    };
    let (counting, text) = (
        store(SlidingWindowLayout::Counters),
        store(SlidingWindowLayout::Text),
    );
    crate::leases::ready(&counting).await;
    crate::leases::ready(&text).await;
    let params = Params {
        algorithm: Algorithm::SlidingWindow,
        requests: 2,
        window: 60 * SECOND,
    };
    let limited = [hit("reset", params, 0)];
    let allowed = |outcomes: Vec<algorithm::Outcome>| outcomes[0].allowed;
    assert!(allowed(counting.apply(&limited).await.unwrap()));
    assert!(allowed(text.apply(&limited).await.unwrap()));
    assert!(!allowed(counting.apply(&limited).await.unwrap()), "full");
    // A replica writing text resets what the counters hold too.
    text.forget(&limited).await.unwrap();
    assert!(
        allowed(counting.apply(&limited).await.unwrap()),
        "forgotten"
    );
    assert!(allowed(text.apply(&limited).await.unwrap()));
    assert!(!allowed(text.apply(&limited).await.unwrap()), "full again");
}

#[tokio::test]
async fn a_limit_raised_past_what_a_counter_holds_fails_while_counted() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let params = |requests| Params {
        algorithm: Algorithm::SlidingWindow,
        requests,
        window: SECOND,
    };
    let call = |now, hits: &'static [Hit], sliding_window| Call {
        op: Op::Apply { now },
        hits,
        node: None,
        complete: true,
        prefix: "",
        grace_ms: 3_600_000,
        sliding_window,
        state_layout: StateLayout::Text,
    };
    let small: &'static [Hit] = Vec::leak(vec![hit("raised", params(100), 0)]);
    let large: &'static [Hit] = Vec::leak(vec![hit("raised", params(WINDOW_COUNTS), 0)]);
    assert_eq!(small[0].key, large[0].key, "one limit, raised");
    call_on(
        &mut connection,
        &call(WINDOW, small, SlidingWindowLayout::Counters),
    )
    .await
    .unwrap();
    let raised = call_on(
        &mut connection,
        &call(WINDOW + 1, large, SlidingWindowLayout::Counters),
    )
    .await;
    assert!(raised.is_err(), "{raised:?}");
    // Once its counters are gone, the larger limit counts as text.
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut connection)
        .await
        .unwrap();
    let text = call_on(
        &mut connection,
        &call(WINDOW + 2, large, SlidingWindowLayout::Counters),
    )
    .await
    .unwrap();
    assert!(text.outcomes[0].allowed);
    let stored: String = redis::cmd("GET")
        .arg(large[0].key.as_str())
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(stored.split(' ').count(), 3, "text: {stored}");
}
