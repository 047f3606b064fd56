//! Slot migrations under load: two tollgate processes on one 3-master Redis Cluster keep
//! deciding while 50 slots that hold their counters move between masters. A call on a key
//! outside the moving slot never fails, calls on the moving slot fail for at most
//! `MOVING_SLOT_OUTAGE` a move, and every counter counts each admitted hit once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis_process::RedisCluster;
use common::*;

const USERS: usize = 12;
/// Calls in flight on each replica.
const CONCURRENCY: usize = 8;
const LIMIT: u32 = 1_000_000;
/// Keys beside each counter in its slot, so that a move takes a while (each a MIGRATE).
const FILLER: usize = 200;
/// The longest calls on a moving slot may fail, from the first failure to the end of the
/// last, each move.
const MOVING_SLOT_OUTAGE: Duration = Duration::from_millis(100);

fn limits() -> String {
    format!(
        "domain: moves\ndescriptors:\n  - key: user\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}}}\n"
    )
}

fn user(index: usize) -> tollgate::pb::RateLimitRequest {
    request("moves", &[&[("user", &format!("u{index}"))]])
}

/// A failed call: whose, and when it was sent and answered.
#[derive(Debug, Clone)]
struct Failure {
    user: usize,
    sent: Instant,
    answered: Instant,
    #[expect(dead_code, reason = "shown through Debug when a bound is broken")]
    status: String,
}

/// What the load on both replicas saw.
#[derive(Default)]
struct Seen {
    admitted: [u64; USERS],
    failures: Vec<Failure>,
}

/// The load's shared state: when to stop, the user whose slot moves next (`USERS`: none
/// yet), and what was seen.
#[derive(Clone, Default)]
struct Load {
    stop: Arc<AtomicBool>,
    hot: Arc<AtomicUsize>,
    seen: Arc<Mutex<Seen>>,
}

/// Calls `replica` `CONCURRENCY` at a time until `stop`: a quarter of the callers every
/// user in turn, the others the hot user, so that the moving slot is the busiest.
async fn load(replica: u16, load: Load) {
    let callers: Vec<_> = (0..CONCURRENCY)
        .map(|first| tokio::spawn(call_in_turn(replica, first, load.clone())))
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
}

/// One caller of `load`, starting at user `first`; three in four call the hot user
/// once there is one.
async fn call_in_turn(replica: u16, first: usize, load: Load) {
    let Load { stop, hot, seen } = load;
    let mut client =
        tollgate::pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{replica}"))
            .await
            .unwrap();
    let mut turn = first;
    while !stop.load(Ordering::Relaxed) {
        let index = match hot.load(Ordering::Relaxed) {
            hot if !first.is_multiple_of(4) && hot < USERS => hot,
            _ => turn % USERS,
        };
        turn += 1;
        let sent = Instant::now();
        match client.should_rate_limit(user(index)).await {
            Ok(answer) => {
                assert_eq!(
                    answer.into_inner().overall_code,
                    1,
                    "every hit is within the limit"
                );
                seen.lock().unwrap().admitted[index] += 1;
            }
            Err(status) => {
                seen.lock().unwrap().failures.push(Failure {
                    user: index,
                    sent,
                    answered: Instant::now(),
                    status: format!("{:?}: {}", status.code(), status.message()),
                });
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// The slot of each user's counter, once the load has made them all, each slot given
/// `FILLER` keys beside it.
fn slots_of_users(cluster: &RedisCluster) -> Option<[u16; USERS]> {
    let mut slots = [None; USERS];
    let mut fill = Vec::new();
    for master in cluster.masters() {
        let keys: Vec<String> = master
            .try_query(&["KEYS", "tollgate:v1:*"])
            .and_then(|keys| redis::from_redis_value(keys).ok())
            .unwrap_or_default();
        for key in keys {
            // A fixed window's key ends in its window's number.
            let identity = key
                .rsplit_once(':')
                .map_or(key.as_str(), |(identity, _)| identity);
            let index = (0..USERS).find(|index| {
                let value = format!("u{index}");
                identity.ends_with(&format!("userv{}:{value}", value.len()))
            })?;
            slots[index] = Some(master.query(&["CLUSTER", "KEYSLOT", &key]).parse().ok()?);
            let tag = key.split_once('{')?.1.split_once('}')?.0.to_owned();
            fill.push((master, tag));
        }
    }
    if slots.iter().all(Option::is_some) {
        for (master, tag) in fill {
            for filler in 0..FILLER {
                master.query(&["SET", &format!("{{{tag}}}:filler:{filler}"), "x"]);
            }
        }
    }
    let mut known = [0; USERS];
    for (index, slot) in slots.into_iter().enumerate() {
        known[index] = slot?;
    }
    Some(known)
}

/// One move: its slot, when it began and when every master knew the new owner.
struct Move {
    slot: u16,
    began: Instant,
    ended: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_slot_migrations_under_load_fail_only_the_moving_slot_and_briefly() {
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
    let shared = Load {
        hot: Arc::new(AtomicUsize::new(USERS)),
        ..Load::default()
    };
    let loads: Vec<_> = replicas
        .iter()
        .map(|replica| tokio::spawn(load(replica.grpc, shared.clone())))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let user_slots = loop {
        if let Some(slots) = slots_of_users(&cluster) {
            break slots;
        }
        assert!(
            Instant::now() < deadline,
            "the load never made a counter for each of the {USERS} users"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut slots = user_slots.to_vec();
    slots.sort_unstable();
    slots.dedup();

    let mut moves = Vec::new();
    for migration in 0..50 {
        let slot = slots[migration % slots.len()];
        let hot = user_slots.iter().position(|&of| of == slot).unwrap();
        shared.hot.store(hot, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let began = Instant::now();
        tokio::task::block_in_place(|| {
            let owner = cluster.owner_of(slot).port;
            let masters = cluster.masters();
            let to = masters.iter().find(|master| master.port != owner).unwrap();
            cluster.move_slot(slot, to);
        });
        moves.push(Move {
            slot,
            began,
            ended: Instant::now(),
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Time for a replica left unable to decide to show it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    shared.stop.store(true, Ordering::Relaxed);
    for load in loads {
        load.await.unwrap();
    }
    let seen = std::mem::take(&mut *shared.seen.lock().unwrap());
    let logs = || {
        ["a", "b"]
            .map(|name| {
                std::fs::read_to_string(dir.path().join(format!("{name}.log"))).unwrap_or_default()
            })
            .join("\n")
    };
    eprintln!(
        "{} admitted, {} failed over {} moves",
        seen.admitted.iter().sum::<u64>(),
        seen.failures.len(),
        moves.len()
    );

    // A failure belongs to the move of its user's slot that it overlaps, with the outage
    // bound as slack either side (a call sent just before SETSLOT NODE reached every master
    // is answered just after); any other failure is one a slot move caused elsewhere.
    let move_of = |failure: &Failure| {
        moves.iter().position(|moved| {
            moved.slot == user_slots[failure.user]
                && failure.sent <= moved.ended + MOVING_SLOT_OUTAGE
                && failure.answered + MOVING_SLOT_OUTAGE >= moved.began
        })
    };
    let elsewhere: Vec<_> = seen
        .failures
        .iter()
        .filter(|failure| move_of(failure).is_none())
        .collect();
    assert!(
        elsewhere.is_empty(),
        "calls on keys outside the moving slot failed: {elsewhere:?}\n{}",
        logs()
    );
    for (index, moved) in moves.iter().enumerate() {
        let failed: Vec<_> = seen
            .failures
            .iter()
            .filter(|failure| move_of(failure) == Some(index))
            .collect();
        let (Some(first), Some(last)) = (
            failed.iter().map(|failure| failure.sent).min(),
            failed.iter().map(|failure| failure.answered).max(),
        ) else {
            continue;
        };
        assert!(
            last - first <= MOVING_SLOT_OUTAGE,
            "slot {} failed for {:?} in move {index}: {failed:?}\n{}",
            moved.slot,
            last - first,
            logs()
        );
    }
    // Each counter holds every admitted hit once, and no failed call counted.
    let mut client = replicas[0].client().await;
    for index in 0..USERS {
        let answer = client
            .should_rate_limit(user(index))
            .await
            .unwrap()
            .into_inner();
        let counted = u64::from(LIMIT - answer.statuses[0].limit_remaining) - 1;
        assert_eq!(counted, seen.admitted[index], "user {index}");
    }
}
