//! tollgate on a real 3-master Redis Cluster started by the tests: exact across replicas,
//! all-or-nothing across slots and nodes, key safety, one script call per node, and what a
//! resharding under load costs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_process::RedisCluster;
use common::*;
use tollgate::algorithm::Outcome;
use tollgate::limit::Limit;
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::options::StoreOptions;
use tollgate::storage::redis::slots::slot_of;
use tollgate::storage::redis::{RedisSpec, RedisStore};
use tollgate::storage::{CounterStore, Hit, Role};

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

    // Two descriptors whose counters live on different nodes, so that b's denial vetoes a
    // consumption already made on a's node, which is refunded.
    let a_limit = sliding_log(5, tollgate::limit::Unit::Hour);
    let b_limit = sliding_log(1, tollgate::limit::Unit::Hour);
    let a_key = key_of("shared", ("a", "1"), &a_limit);
    let node_of = |key: &str| cluster.owner_of(slot_of(key)).port;
    let b_value = (0..100)
        .map(|i| i.to_string())
        .find(|v| node_of(&key_of("shared", ("b", v), &b_limit)) != node_of(&a_key))
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
async fn ten_descriptors_cost_one_script_call_per_node_all_in_flight_at_once() {
    let entries = ten_descriptors();
    let limit = Limit::new(100, tollgate::limit::Unit::Minute);
    let slots: HashSet<u16> = entries
        .iter()
        .map(|(k, v)| slot_of(&key_of("wide", (k, v), &limit)))
        .collect();

    let server = start_on(StoreKind::Cluster, &[("wide.yaml", WIDE)]).await;
    let Backing::Cluster(cluster) = &server.backing else {
        panic!("a cluster test");
    };
    let nodes: HashSet<u16> = slots
        .iter()
        .map(|&slot| cluster.owner_of(slot).port)
        .collect();
    assert!(
        nodes.len() < slots.len(),
        "some node serves two of the slots"
    );
    let before = cluster.script_calls();
    let response = server.ok(wide_request(&entries)).await;
    assert!(response.statuses.iter().all(|s| s.limit_remaining == 99));
    assert_eq!(cluster.script_calls() - before, nodes.len() as u64);
    drop(server);

    let server = start_on(StoreKind::Redis, &[("wide.yaml", WIDE)]).await;
    let Backing::Redis(redis) = &server.backing else {
        panic!("a redis test");
    };
    let before = redis.script_calls();
    let response = server.ok(wide_request(&entries)).await;
    assert!(response.statuses.iter().all(|s| s.limit_remaining == 99));
    assert_eq!(
        redis.script_calls() - before,
        1,
        "one call for the whole request"
    );
}

/// Hits of one request on the cluster, straight to the store: one per user, 100 per hour
/// (a sliding log: no window boundary can fall between two calls of a test).
fn user_hits(users: &[String]) -> Vec<Hit> {
    let params = sliding_log(100, tollgate::limit::Unit::Hour).params();
    users
        .iter()
        .enumerate()
        .map(|(descriptor, user)| Hit {
            descriptor,
            key: counter_key("store", [("user", EntryValue::Actual(user))], &params),
            params,
            hits: 1,
            role: Role::Enforced,
            charge: tollgate::algorithm::Charge::IfAllowed,
            lease: tollgate::limit::Lease::AsConfigured,
        })
        .collect()
}

fn cluster_store(cluster: &RedisCluster) -> Arc<RedisStore> {
    RedisStore::start(
        RedisSpec::parse(&cluster.url(), None).unwrap().unwrap(),
        StoreOptions {
            timeout: Duration::from_secs(5),
            // Long: the map goes stale when the test moves a slot, and stays so until a
            // call finds out.
            slot_map_refresh: Duration::from_secs(3600),
            ..StoreOptions::default()
        },
    )
}

/// A fresh 3-master cluster and a store connected to it, with a counter for each of `count`
/// users named `prefix0`, `prefix1`…
async fn cluster_with_store(
    count: usize,
    prefix: &str,
) -> (RedisCluster, Arc<RedisStore>, Vec<Hit>) {
    let cluster = RedisCluster::start(3, 0);
    let store = cluster_store(&cluster);
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.ping().await.is_err() {
        assert!(Instant::now() < deadline, "the store never connected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let users: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    (cluster, store, user_hits(&users))
}

/// Per hit: whether it was allowed and what its counter has left.
fn decided(outcomes: &[Outcome]) -> Vec<(bool, u64)> {
    outcomes.iter().map(|o| (o.allowed, o.remaining)).collect()
}

/// `decided` for one hit applied on its own.
async fn alone(store: &RedisStore, hit: &Hit) -> (bool, u64) {
    decided(&store.apply(std::slice::from_ref(hit)).await.unwrap())[0]
}

#[tokio::test]
async fn a_call_across_the_slots_of_one_node_vetoes_itself_or_is_refunded() {
    let (cluster, store, hits) = cluster_with_store(1000, "u").await;
    // Two users on one node, in different slots; the second's limit is used up first.
    let slot = |index: usize| slot_of(hits[index].key.as_str());
    let node = |index: usize| cluster.owner_of(slot(index)).port;
    let second = (1..hits.len())
        .find(|&i| node(i) == node(0) && slot(i) != slot(0))
        .unwrap();
    let pair = [
        hits[0].clone(),
        Hit {
            descriptor: 1,
            ..hits[second].clone()
        },
    ];
    for _ in 0..100 {
        assert!(store.apply(&pair[1..]).await.unwrap()[0].allowed);
    }

    let before = cluster.script_calls();
    let outcomes = store.apply(&pair).await.unwrap();
    assert_eq!(
        cluster.script_calls() - before,
        1,
        "one call for both slots"
    );
    assert_eq!(
        decided(&outcomes),
        [(true, 100), (false, 0)],
        "the first counter reports itself unchanged"
    );
    let first = store.apply(&pair[..1]).await.unwrap();
    assert_eq!(
        (first[0].allowed, first[0].remaining),
        (true, 99),
        "nothing was consumed"
    );

    // Two fresh users on that node (two slots: one call, which commits) and a third user, on
    // another node, whose limit is used up: that node vetoes, and the first node's
    // consumption is given back, slot by slot.
    let elsewhere = (1..hits.len()).find(|&i| node(i) != node(0)).unwrap();
    let fresh = (1..hits.len())
        .filter(|&i| node(i) == node(0) && i != second)
        .collect::<Vec<_>>();
    let (x1, x2) = (
        fresh[0],
        *fresh.iter().find(|&&i| slot(i) != slot(fresh[0])).unwrap(),
    );
    let exhausted = Hit {
        descriptor: 2,
        ..hits[elsewhere].clone()
    };
    for _ in 0..100 {
        assert!(store.apply(std::slice::from_ref(&exhausted)).await.unwrap()[0].allowed);
    }
    let request = [
        hits[x1].clone(),
        Hit {
            descriptor: 1,
            ..hits[x2].clone()
        },
        exhausted,
    ];
    let outcomes = store.apply(&request).await.unwrap();
    assert_eq!(
        decided(&outcomes),
        [(true, 100), (true, 100), (false, 0)],
        "the refunded counters report themselves as they are after the refund"
    );
    for x in [x1, x2] {
        assert_eq!(alone(&store, &hits[x]).await, (true, 99), "given back");
    }
}

#[tokio::test]
async fn a_request_whose_call_fails_on_one_node_gives_back_what_the_others_consumed() {
    let (cluster, store, hits) = cluster_with_store(100, "u").await;
    let node = |index: usize| cluster.owner_of(slot_of(hits[index].key.as_str())).port;
    let other = (1..hits.len()).find(|&i| node(i) != node(0)).unwrap();
    // The second counter's key holds a list: the script's GET of it fails on its node, after
    // the first node's call committed.
    let broken = hits[other].key.as_str();
    cluster
        .owner_of(slot_of(broken))
        .query(&["RPUSH", broken, "not a counter"]);
    let request = [hits[0].clone(), hits[other].clone()];

    let error = store.apply(&request).await.unwrap_err();
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    assert_eq!(
        alone(&store, &hits[0]).await,
        (true, 99),
        "the failed request consumed nothing"
    );
}

#[tokio::test]
async fn a_resharded_slot_costs_a_retry_and_never_a_count() {
    let (cluster, store, hits) = cluster_with_store(10, "user-").await;
    let slots: Vec<u16> = hits.iter().map(|hit| slot_of(hit.key.as_str())).collect();
    let nodes = |cluster: &RedisCluster| -> u64 {
        let ports: HashSet<u16> = slots
            .iter()
            .map(|&slot| cluster.owner_of(slot).port)
            .collect();
        ports.len() as u64
    };
    let calls = || cluster.script_calls();

    let before = calls();
    let first = store.apply(&hits).await.unwrap();
    assert!(first.iter().all(|o| o.allowed && o.remaining == 99));
    assert_eq!(calls() - before, nodes(&cluster), "one call per node");

    // Move one slot (and its counter) away from a node that serves another of the slots, one
    // not first in its node's call (where redis-rs's routing never looks).
    let moved = (0..slots.len())
        .find(|&i| {
            (0..i).any(|j| {
                slots[j] != slots[i]
                    && cluster.owner_of(slots[j]).port == cluster.owner_of(slots[i]).port
            })
        })
        .expect("two of the slots on one node");
    let nodes_before = nodes(&cluster);
    let from = cluster.owner_of(slots[moved]).port;
    let to = cluster
        .masters()
        .into_iter()
        .find(|master| master.port != from)
        .unwrap();
    cluster.move_slot(slots[moved], to);
    assert_eq!(cluster.owner_of(slots[moved]).port, to.port);

    // The store still believes the old map: the call for `from` finds the counter gone and
    // is sent again per slot; every counter counts exactly once.
    let before = calls();
    let second = store.apply(&hits).await.unwrap();
    let retried = calls() - before;
    assert!(
        retried > nodes_before,
        "the call for the old owner failed and was sent again per slot: {retried} calls"
    );
    assert_eq!(decided(&second), vec![(true, 98); hits.len()]);
    let stored = to.try_query(&["GET", hits[moved].key.as_str()]);
    assert!(
        matches!(stored, Some(redis::Value::BulkString(_))),
        "the moved counter lives on its new node: {stored:?}"
    );

    // The failed call asked for the map again: calls group by the new owners.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut remaining = 98;
    loop {
        let before = calls();
        let outcomes = store.apply(&hits).await.unwrap();
        remaining -= 1;
        assert!(
            outcomes
                .iter()
                .all(|o| o.allowed && o.remaining == remaining)
        );
        if calls() - before == nodes(&cluster) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot map was never read again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
