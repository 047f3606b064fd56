//! `tollgate bench-calls`, which the Redis cost scripts measure with: the second run of a
//! measurement must find every counter the first run left, however long the runs take (under
//! callgrind, many seconds), or what it counts includes creating counters and growing logs
//! that the floor's one key never pays for.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::redis_process::RedisServer;
use tollgate::cli::CallsArgs;

const USERS: u64 = 10;
const CALLS: u64 = 200;

fn calls_of(server: &RedisServer, call: &str) -> CallsArgs {
    CallsArgs {
        redis: server.url(),
        call: call.to_owned(),
        hits: 1,
        layout: None,
        limit: 1000,
        calls: CALLS,
        keyspace: USERS,
        in_flight: 4,
        grace_ms: 3_600_000,
    }
}

/// Every key in the server and what it holds.
async fn stored(connection: &mut redis::aio::MultiplexedConnection) -> Vec<(String, String)> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(connection)
        .await
        .unwrap();
    keys.sort();
    let mut stored = Vec::new();
    for key in keys {
        let value: String = redis::cmd("GET")
            .arg(&key)
            .query_async(connection)
            .await
            .unwrap();
        stored.push((key, value));
    }
    stored
}

#[tokio::test]
async fn a_run_a_second_after_another_finds_the_counters_it_left() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    for call in ["fixed_window", "sliding_log"] {
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut connection)
            .await
            .unwrap();
        let calls = calls_of(&server, call);
        tollgate::bench::calls::run(&calls).await.unwrap();
        // Past the one-second window the calls are made in, were it the clock's.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        tollgate::bench::calls::run(&calls).await.unwrap();

        let stored = stored(&mut connection).await;
        assert_eq!(stored.len() as u64, USERS, "{call}: {stored:?}");
        let hits: u64 = stored
            .iter()
            .map(|(key, value)| {
                let numbers: Vec<u64> = value.split(' ').map(|n| n.parse().unwrap()).collect();
                match call {
                    "fixed_window" => numbers[0],
                    // One run of hits, all made at one instant.
                    _ => {
                        assert_eq!(numbers.len(), 2, "{key}: {value}");
                        numbers[1]
                    }
                }
            })
            .sum();
        assert_eq!(hits, 2 * CALLS, "{call}");
    }
}
