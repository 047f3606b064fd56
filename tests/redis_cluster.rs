//! tollgate on a real 3-master Redis Cluster started by the tests: exact across replicas,
//! all-or-nothing across slots, key safety, and one script call per slot group.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;

use common::redis_process::RedisCluster;
use common::*;
use redis::cluster_routing::Slot;
use tollgate::limit::Limit;
use tollgate::storage::keys::{EntryValue, counter_key};

const SHARED: &str = r#"
domain: shared
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_log}
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_log}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_log}
"#;

/// The Redis key of a limit's counter for one entry.
fn key_of(domain: &str, entry: (&str, &str), limit: &Limit) -> String {
    counter_key(
        domain,
        [(entry.0, EntryValue::Actual(entry.1))],
        &limit.params(),
    )
    .as_str()
    .to_owned()
}

fn sliding_log(requests: u32, unit: tollgate::limit::Unit) -> Limit {
    Limit {
        algorithm: tollgate::algorithm::Algorithm::SlidingLog { min_interval: 0 },
        ..Limit::new(requests, unit)
    }
}

/// A key's raw value, from whichever master holds it.
fn raw(cluster: &RedisCluster, key: &str) -> Option<String> {
    cluster
        .masters()
        .iter()
        .find_map(|node| match node.try_query(&["GET", key])? {
            redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            _ => None,
        })
}

#[tokio::test]
async fn three_replicas_sharing_a_cluster_admit_exactly_the_limit_and_veto_across_slots() {
    let cluster = RedisCluster::start(3, 0);
    let config = config_dir(&[("shared.yaml", SHARED)]);
    let store = cluster.url();
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::spawn(config.path(), &["--store", &store, "--store-timeout", "5s"]))
        .collect();
    for replica in &replicas {
        replica.wait_ready().await;
    }
    let mut clients = Vec::new();
    for replica in &replicas {
        clients.push(replica.client().await);
    }

    // 1,000 concurrent requests for one descriptor, spread over the three replicas.
    let calls = (0..1_000).map(|i| {
        let mut client = clients[i % 3].clone();
        async move {
            client
                .should_rate_limit(request("shared", &[&[("user", "hot")]]))
                .await
                .map(|response| response.into_inner().overall_code)
        }
    });
    let codes = futures_util::future::join_all(calls).await;
    let errors: Vec<_> = codes.iter().filter_map(|c| c.as_ref().err()).collect();
    assert!(
        errors.is_empty(),
        "{} errors, first {:?}",
        errors.len(),
        errors.first()
    );
    let ok = codes
        .iter()
        .filter(|c| matches!(c, Ok(code) if *code == OK))
        .count();
    let over = codes
        .iter()
        .filter(|c| matches!(c, Ok(code) if *code == OVER))
        .count();
    assert_eq!((ok, over), (100, 900));

    // Two descriptors whose counters live on different slots.
    let a_limit = sliding_log(5, tollgate::limit::Unit::Hour);
    let b_limit = sliding_log(1, tollgate::limit::Unit::Hour);
    let a_key = key_of("shared", ("a", "1"), &a_limit);
    let b_value = (0..100)
        .map(|i| i.to_string())
        .find(|v| Slot::for_key(key_of("shared", ("b", v), &b_limit)) != Slot::for_key(&a_key))
        .unwrap();
    let mut client = clients[0].clone();
    let mut call = async |descriptors: &[&[(&str, &str)]]| {
        client
            .should_rate_limit(request("shared", descriptors))
            .await
            .unwrap()
            .into_inner()
    };
    assert_eq!(call(&[&[("a", "1")]]).await.overall_code, OK);
    assert_eq!(call(&[&[("b", &b_value)]]).await.overall_code, OK);
    let a_before = raw(&cluster, &a_key).expect("a's counter exists");
    let vetoed = call(&[&[("a", "1")], &[("b", &b_value)]]).await;
    assert_eq!(vetoed.overall_code, OVER);
    assert_eq!(
        shapes(&vetoed),
        [
            limited(OK, "5/HOUR", 4, 3600),
            limited(OVER, "1/HOUR", 0, 3600)
        ]
    );
    assert_eq!(
        raw(&cluster, &a_key).unwrap(),
        a_before,
        "a's counter is unchanged"
    );
    let alone = call(&[&[("a", "1")]]).await;
    assert_eq!(alone.statuses[0].limit_remaining, 3);
    drop(replicas);
}

const KEYS: &str = r#"
domain: keys
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

#[tokio::test]
async fn hostile_values_get_distinct_counters_without_crossslot_and_users_spread_over_masters() {
    let server = start_on(StoreKind::Cluster, &[("keys.yaml", KEYS)]).await;
    let long_a = "x".repeat(4096);
    let long_b = format!("{}y", "x".repeat(4095));
    let values = [
        "{",
        "}",
        "{}",
        "{a}",
        "a:b",
        "a",
        "b",
        "{x}:{y}",
        ":",
        long_a.as_str(),
        long_b.as_str(),
    ];
    for value in values {
        let first = server.ok(request("keys", &[&[("user", value)]])).await;
        assert_eq!(first.overall_code, OK, "first hit of {value:.20}");
        let second = server.ok(request("keys", &[&[("user", value)]])).await;
        assert_eq!(second.overall_code, OVER, "second hit of {value:.20}");
    }
    // All of them in one request (many slots): no CROSSSLOT, each over on its own counter.
    let pairs: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("user", *v)]).collect();
    let all: Vec<&[(&str, &str)]> = pairs.iter().map(|p| p.as_slice()).collect();
    let together = server.ok(request("keys", &all)).await;
    assert_eq!(together.overall_code, OVER);
    assert!(together.statuses.iter().all(|s| s.code == OVER));

    for user in 0..300 {
        server
            .ok(request("keys", &[&[("user", &format!("user-{user}"))]]))
            .await;
    }
    let Backing::Cluster(cluster) = &server.backing else {
        panic!("a cluster test");
    };
    let per_master: Vec<u64> = cluster.masters().iter().map(|m| m.dbsize()).collect();
    assert_eq!(per_master.len(), 3);
    assert_eq!(per_master.iter().sum::<u64>(), 300 + values.len() as u64);
    assert!(
        per_master.iter().all(|&keys| keys >= 60),
        "keys spread over every master: {per_master:?}"
    );
}

const WIDE: &str = r#"
domain: wide
descriptors:
  - key: d0
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d1
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d2
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d3
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d4
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d5
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d6
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d7
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d8
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d9
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

fn ten_descriptors() -> Vec<(String, String)> {
    (0..10)
        .map(|i| (format!("d{i}"), format!("v{i}")))
        .collect()
}

fn wide_request(entries: &[(String, String)]) -> tollgate::pb::RateLimitRequest {
    let pairs: Vec<[(&str, &str); 1]> = entries
        .iter()
        .map(|(k, v)| [(k.as_str(), v.as_str())])
        .collect();
    let descriptors: Vec<&[(&str, &str)]> = pairs.iter().map(|p| p.as_slice()).collect();
    request("wide", &descriptors)
}

#[tokio::test]
async fn ten_descriptors_cost_one_script_call_per_slot_all_in_flight_at_once() {
    let entries = ten_descriptors();
    let limit = Limit::new(100, tollgate::limit::Unit::Minute);
    let slots: HashSet<Slot> = entries
        .iter()
        .map(|(k, v)| Slot::for_key(key_of("wide", (k, v), &limit)))
        .collect();

    let server = start_on(StoreKind::Cluster, &[("wide.yaml", WIDE)]).await;
    let Backing::Cluster(cluster) = &server.backing else {
        panic!("a cluster test");
    };
    let before = cluster.calls("evalsha");
    let response = server.ok(wide_request(&entries)).await;
    assert!(response.statuses.iter().all(|s| s.limit_remaining == 99));
    assert_eq!(cluster.calls("evalsha") - before, slots.len() as u64);
    drop(server);

    let server = start_on(StoreKind::Redis, &[("wide.yaml", WIDE)]).await;
    let Backing::Redis(redis) = &server.backing else {
        panic!("a redis test");
    };
    let before = redis.calls("evalsha");
    let response = server.ok(wide_request(&entries)).await;
    assert!(response.statuses.iter().all(|s| s.limit_remaining == 99));
    assert_eq!(
        redis.calls("evalsha") - before,
        1,
        "one call for the whole request"
    );
}
