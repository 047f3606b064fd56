//! The script's refund, which gives back what a group consumed when another group of the
//! same request vetoed it: exact for windows and logs, and for a token bucket or GCRA only
//! while the counter is as the consuming call left it (giving back to a bucket that refilled
//! since would hand out hits nobody paid for).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::redis_process::RedisServer;
use tollgate::algorithm::State;
use tollgate::algorithm::{Algorithm, Params};
use tollgate::clock::{MICROS_PER_SECOND, Micros};
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::redis::call::{Call, Op, Reply, SlidingWindowLayout, StateLayout};
use tollgate::storage::redis::connection::call_on;
use tollgate::storage::{Hit, Role};

const T0: Micros = 1_795_000_000 * MICROS_PER_SECOND;
const MS: Micros = 1_000;

fn hit(user: &str, params: Params, hits: u64) -> Hit {
    Hit {
        descriptor: 0,
        key: counter_key("refund", [("user", EntryValue::Actual(user))], &params),
        params,
        hits,
        role: Role::Enforced,
        charge: tollgate::algorithm::Charge::IfAllowed,
        lease: tollgate::limit::Lease::AsConfigured,
    }
}

/// Applies `hits` at `now`, or (`refund`: the consuming call's instant and the states it left)
/// gives them back.
async fn send(
    connection: &mut redis::aio::MultiplexedConnection,
    hits: &[Hit],
    now: Micros,
    refund: Option<&[Option<State>]>,
) -> Reply {
    let op = match refund {
        Some(expected) => Op::GiveBack { at: now, expected },
        None => Op::Apply { now },
    };
    let call = Call {
        op,
        hits,
        node: None,
        complete: false,
        prefix: "",
        grace_ms: 3_600_000,
        sliding_window: SlidingWindowLayout::Text,
        state_layout: StateLayout::Text,
    };
    call_on(connection, &call).await.unwrap()
}

#[tokio::test]
async fn a_bucket_refunds_only_while_unchanged_and_a_window_always() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    // 1,000 per second, burst 1: a token every ms.
    let bucket = Params {
        algorithm: Algorithm::TokenBucket { burst: 1 },
        requests: 1_000,
        window: MICROS_PER_SECOND,
    };
    for algorithm in [bucket.algorithm, Algorithm::Gcra { burst: 1 }] {
        let params = Params {
            algorithm,
            ..bucket
        };
        let name = algorithm.name();
        // Unchanged since the consuming call: the hit comes back.
        let one = [hit(&format!("{name}-a"), params, 1)];
        let took = send(&mut connection, &one, T0, None).await;
        assert!(took.committed && took.outcomes[0].allowed);
        let back = send(&mut connection, &one, T0, Some(&took.after)).await;
        assert_eq!(back.outcomes[0].remaining, 1, "{name}: refunded");

        // Another call refilled and consumed since: no refund, or two hits would pass in
        // 0.5 ms.
        let two = [hit(&format!("{name}-b"), params, 1)];
        let took = send(&mut connection, &two, T0, None).await;
        let later = send(&mut connection, &two, T0 + 3 * MS / 2, None).await;
        assert!(later.outcomes[0].allowed, "{name}: the bucket refilled");
        let back = send(&mut connection, &two, T0, Some(&took.after)).await;
        assert_eq!(back.outcomes[0].remaining, 0, "{name}: not refunded");
        let next = send(&mut connection, &two, T0 + 2 * MS, None).await;
        assert!(
            !next.outcomes[0].allowed,
            "{name}: one token per ms, no more"
        );
    }

    // A fixed window records its count per window: the refund is exact even after others.
    let window = Params {
        algorithm: Algorithm::default(),
        requests: 3,
        window: 60 * MICROS_PER_SECOND,
    };
    let three = [hit("window", window, 1)];
    let took = send(&mut connection, &three, T0, None).await;
    send(&mut connection, &three, T0 + MS, None).await;
    let back = send(&mut connection, &three, T0, Some(&took.after)).await;
    assert_eq!(back.outcomes[0].remaining, 2, "one of two hits given back");
}
