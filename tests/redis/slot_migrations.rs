//! Slot migrations under load: two tollgate processes on one 3-master Redis Cluster keep
//! deciding while 50 slots that hold their counters move between masters, none of them
//! unable to decide for long, and every counter counts each admitted hit once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::redis_process::RedisCluster;
use common::*;

const USERS: usize = 12;
/// Calls in flight on each replica.
const CONCURRENCY: usize = 4;
const LIMIT: u32 = 1_000_000;
/// The longest a replica may go without a decision (the bound after a migration
/// ends; a migration here takes well under a second).
const LONGEST_GAP: Duration = Duration::from_secs(5);

fn limits() -> String {
    format!(
        "domain: moves\ndescriptors:\n  - key: user\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}}}\n"
    )
}

fn user(index: usize) -> tollgate::pb::RateLimitRequest {
    request("moves", &[&[("user", &format!("u{index}"))]])
}

/// What one replica's load saw.
#[derive(Default)]
struct Seen {
    admitted: Vec<u64>,
    failed: Vec<u64>,
    longest_gap: Duration,
}

/// Calls `replica` for every user in turn, `CONCURRENCY` at a time, until `stop`.
async fn load(replica: u16, stop: Arc<AtomicBool>) -> Seen {
    let callers: Vec<_> = (0..CONCURRENCY)
        .map(|first| tokio::spawn(call_in_turn(replica, first, Arc::clone(&stop))))
        .collect();
    let mut seen = Seen {
        admitted: vec![0; USERS],
        failed: vec![0; USERS],
        longest_gap: Duration::ZERO,
    };
    for caller in callers {
        let one = caller.await.unwrap();
        for index in 0..USERS {
            seen.admitted[index] += one.admitted[index];
            seen.failed[index] += one.failed[index];
        }
        seen.longest_gap = seen.longest_gap.max(one.longest_gap);
    }
    seen
}

/// One caller of `load`, starting at user `first`.
async fn call_in_turn(replica: u16, first: usize, stop: Arc<AtomicBool>) -> Seen {
    let mut client =
        tollgate::pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{replica}"))
            .await
            .unwrap();
    let mut seen = Seen {
        admitted: vec![0; USERS],
        failed: vec![0; USERS],
        longest_gap: Duration::ZERO,
    };
    let mut last_success = Instant::now();
    let mut turn = first;
    while !stop.load(Ordering::Relaxed) {
        let index = turn % USERS;
        turn += 1;
        match client.should_rate_limit(user(index)).await {
            Ok(answer) => {
                assert_eq!(
                    answer.into_inner().overall_code,
                    1,
                    "every hit is within the limit"
                );
                seen.admitted[index] += 1;
                seen.longest_gap = seen.longest_gap.max(last_success.elapsed());
                last_success = Instant::now();
            }
            Err(_) => {
                seen.failed[index] += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    seen.longest_gap = seen.longest_gap.max(last_success.elapsed());
    seen
}

/// The slot of every counter the cluster holds, one entry per counter.
fn slots_in_use(cluster: &RedisCluster) -> Vec<u16> {
    cluster
        .masters()
        .iter()
        .flat_map(|master| {
            let keys: Vec<String> = master
                .try_query(&["KEYS", "*"])
                .and_then(|keys| redis::from_redis_value(keys).ok())
                .unwrap_or_default();
            keys.into_iter()
                .filter(|key| key.starts_with("tollgate:v1:"))
                .map(|key| master.query(&["CLUSTER", "KEYSLOT", &key]).parse().unwrap())
                .collect::<Vec<u16>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_slot_migrations_under_load_leave_no_replica_unable_to_decide() {
    let cluster = RedisCluster::start(3, 0);
    let dir = config_dir(&[("moves.yaml", &limits())]);
    let store = cluster.url();
    let flags = ["--store", store.as_str(), "--store-timeout", "1s"];
    let replicas = [
        Replica::spawn_logged(dir.path(), &flags, &dir.path().join("a.log")),
        Replica::spawn_logged(dir.path(), &flags, &dir.path().join("b.log")),
    ];
    for replica in &replicas {
        replica.wait_ready().await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = replicas
        .iter()
        .map(|replica| tokio::spawn(load(replica.grpc, Arc::clone(&stop))))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let slots = loop {
        let mut slots = slots_in_use(&cluster);
        if slots.len() == USERS {
            slots.sort_unstable();
            slots.dedup();
            break slots;
        }
        assert!(
            Instant::now() < deadline,
            "the load never made {USERS} counters: {slots:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    for migration in 0..50 {
        let slot = slots[migration % slots.len()];
        tokio::task::block_in_place(|| {
            let owner = cluster.owner_of(slot).port;
            let masters = cluster.masters();
            let to = masters.iter().find(|master| master.port != owner).unwrap();
            cluster.move_slot(slot, to);
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Time for a replica left unable to decide to show it.
    tokio::time::sleep(LONGEST_GAP + Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);

    let mut admitted = [0; USERS];
    let mut failed = [0; USERS];
    for (load, name) in loads.into_iter().zip(["a", "b"]) {
        let seen = load.await.unwrap();
        eprintln!(
            "replica {name}: {} admitted, {} failed, longest without a decision {:?}",
            seen.admitted.iter().sum::<u64>(),
            seen.failed.iter().sum::<u64>(),
            seen.longest_gap
        );
        let log =
            std::fs::read_to_string(dir.path().join(format!("{name}.log"))).unwrap_or_default();
        assert!(
            seen.longest_gap <= LONGEST_GAP,
            "replica {name} went {:?} without a decision:\n{log}",
            seen.longest_gap
        );
        for index in 0..USERS {
            admitted[index] += seen.admitted[index];
            failed[index] += seen.failed[index];
        }
    }
    // Each counter holds every admitted hit once; a call that failed (a timeout) may have
    // counted too, nothing else.
    let mut client = replicas[0].client().await;
    for index in 0..USERS {
        let answer = client
            .should_rate_limit(user(index))
            .await
            .unwrap()
            .into_inner();
        let counted = u64::from(LIMIT - answer.statuses[0].limit_remaining) - 1;
        assert!(
            counted >= admitted[index] && counted <= admitted[index] + failed[index],
            "user {index}: counted {counted}, admitted {}, failed {}",
            admitted[index],
            failed[index]
        );
    }
}
