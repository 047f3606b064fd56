//! The script's refund, which gives back what a group consumed when another group of the
//! same request vetoed it: exact for windows and logs, and for a token bucket or GCRA only
//! while the counter is as the consuming call left it (giving back to a bucket that refilled
//! since would hand out hits nobody paid for).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::redis_process::RedisServer;
use tollgate::algorithm::{Algorithm, Charge, Params};
use tollgate::clock::{MICROS_PER_SECOND, Micros};
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::redis::script::{Call, Mode, Reply, parse_reply};
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
    }
}

async fn send(
    connection: &mut redis::aio::MultiplexedConnection,
    mode: Mode,
    hits: &[Hit],
    now: Micros,
    expected: &[(i64, i64)],
) -> Reply {
    let call = Call {
        mode,
        hits,
        node: None,
        now: Some(now),
        charge: Charge::IfAllowed,
        complete: false,
        expected,
        prefix: "",
        grace_ms: 0,
    };
    parse_reply(&call.invoke(connection).await.unwrap(), hits.len()).unwrap()
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
        let took = send(&mut connection, Mode::Apply, &one, T0, &[]).await;
        assert!(took.committed && took.outcomes[0].allowed);
        let back = send(
            &mut connection,
            Mode::Refund { at: took.now },
            &one,
            T0,
            &took.states,
        )
        .await;
        assert_eq!(back.outcomes[0].remaining, 1, "{name}: refunded");

        // Another call refilled and consumed since: no refund, or two hits would pass in
        // 0.5 ms.
        let two = [hit(&format!("{name}-b"), params, 1)];
        let took = send(&mut connection, Mode::Apply, &two, T0, &[]).await;
        let later = send(&mut connection, Mode::Apply, &two, T0 + 3 * MS / 2, &[]).await;
        assert!(later.outcomes[0].allowed, "{name}: the bucket refilled");
        let back = send(
            &mut connection,
            Mode::Refund { at: took.now },
            &two,
            T0,
            &took.states,
        )
        .await;
        assert_eq!(back.outcomes[0].remaining, 0, "{name}: not refunded");
        let next = send(&mut connection, Mode::Apply, &two, T0 + 2 * MS, &[]).await;
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
    let took = send(&mut connection, Mode::Apply, &three, T0, &[]).await;
    send(&mut connection, Mode::Apply, &three, T0 + MS, &[]).await;
    let back = send(
        &mut connection,
        Mode::Refund { at: took.now },
        &three,
        T0,
        &took.states,
    )
    .await;
    assert_eq!(back.outcomes[0].remaining, 2, "one of two hits given back");
}
