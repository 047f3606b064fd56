//! A sliding window written in the counters layout (`SlidingWindowLayout::Counters`) at its
//! edges: a hit decided late, in a window whose successor has begun, finds the window's
//! counter closed and counts in the next window, as the Rust algorithm decides on a state of
//! a later window; alone in its call (DecideOne) or beside another counter (Apply).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::redis_process::RedisServer;
use common::sliding_window;
use tollgate::algorithm::{self, Algorithm, Charge, Params, State};
use tollgate::clock::{MICROS_PER_SECOND, Micros};
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::redis::call::{Call, Layout, Op, SlidingWindowLayout};
use tollgate::storage::redis::connection::call_on;
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
                charge: Charge::IfAllowed,
                complete: true,
                prefix: "",
                grace_ms: 3_600_000,
                sliding_window: SlidingWindowLayout::Counters,
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
