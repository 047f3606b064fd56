//! Exactness at window edges (docs/design.md, "Time"): a hit decided at an instant of a window
//! that reaches the store late (in flight, from a replica whose estimate of Redis's clock is
//! behind another's, out of order with hits of the next window) is counted where the hits
//! admitted in that window are still counted, never in a window started again from zero. On
//! the memory store, a Redis and a 3-master Redis Cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::redis_process::{RedisCluster, RedisServer};
use common::rng::Rng;
use common::{Backing, StoreKind};
use tollgate::algorithm::{Algorithm, Outcome, Params};
use tollgate::clock::{Clock, MICROS_PER_SECOND, ManualClock, Micros, SystemClock};
use tollgate::metrics::Metrics;
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::memory::MemoryStore;
use tollgate::storage::{CounterStore, Hit, Role};

const MS: Micros = 1_000;
const LIMIT: u64 = 5;

/// Redis expires counters by its own clock, so the instants these tests decide at are near
/// this machine's (an explicit clock far from it keeps counters an hour).
fn next_edge_after(now: Micros) -> Micros {
    (now / MICROS_PER_SECOND + 2) * MICROS_PER_SECOND
}

fn hit(user: &str) -> Hit {
    let params = Params {
        algorithm: Algorithm::default(),
        requests: LIMIT,
        window: MICROS_PER_SECOND,
    };
    Hit {
        descriptor: 0,
        key: counter_key("edges", [("user", EntryValue::Actual(user))], &params),
        params,
        hits: 1,
        role: Role::Enforced,
        charge: tollgate::algorithm::Charge::IfAllowed,
        lease: tollgate::limit::Lease::AsConfigured,
    }
}

/// The store under test and what keeps it running; on Redis with a store timeout long
/// enough that no call of a loaded machine's test times out.
struct Under {
    store: Arc<dyn CounterStore>,
    /// The same store when it is the memory store, whose sweep the tests run by hand.
    memory: Option<Arc<MemoryStore>>,
    _backing: Backing,
}

impl Under {
    fn start(kind: StoreKind, clock: &ManualClock) -> Self {
        let timeout = Duration::from_secs(2);
        let metrics = Metrics::default();
        let redis = |url: &str| common::redis_store(url, clock, timeout, &metrics);
        match kind {
            StoreKind::Memory => {
                let memory = MemoryStore::new(1_000, Arc::new(clock.clone())).start();
                Under {
                    store: memory.clone(),
                    memory: Some(memory),
                    _backing: Backing::None,
                }
            }
            StoreKind::Redis => {
                let server = RedisServer::start();
                Under {
                    store: redis(&server.url()).counters,
                    memory: None,
                    _backing: Backing::Redis(server),
                }
            }
            StoreKind::Cluster => {
                let cluster = RedisCluster::start(3, 0);
                Under {
                    store: redis(&cluster.url()).counters,
                    memory: None,
                    _backing: Backing::Cluster(cluster),
                }
            }
            other => panic!("no window-edge test on {other:?}"),
        }
    }

    /// The memory store's background sweep, run now (remote stores expire on their own).
    fn sweep(&self) {
        if let Some(memory) = &self.memory {
            memory.sweep();
        }
    }

    async fn decide(&self, clock: &ManualClock, at: Micros, hit: &Hit) -> Outcome {
        clock.set(at);
        // The first calls may wait for the connection to Redis.
        for _ in 0..200 {
            match self.store.apply(std::slice::from_ref(hit)).await {
                Ok(outcomes) => return outcomes[0],
                Err(error) if error.is_transient() => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => panic!("{error}"),
            }
        }
        panic!("the store never answered");
    }
}

/// A window's last hits decided just before its end, then a hit decided in the same window
/// that reaches the store after the window's end (and after the time the counter would live
/// were it kept only to its window's end): it finds the window full.
async fn a_late_hit_finds_its_window_still_counted(kind: StoreKind) {
    let clock = ManualClock::default();
    let under = Under::start(kind, &clock);
    let edge = next_edge_after(SystemClock.now());
    let user = hit("late");
    for expected in (0..LIMIT).rev() {
        let outcome = under.decide(&clock, edge - MS, &user).await;
        assert_eq!((outcome.allowed, outcome.remaining), (true, expected));
    }
    // Past the end of the window as the counter was kept before: 1 ms after its last write.
    tokio::time::sleep(Duration::from_millis(20)).await;
    under.sweep();
    let late = under.decide(&clock, edge - MS / 2, &user).await;
    assert_eq!(
        (late.allowed, late.remaining, late.retry_after),
        (false, 0, MS / 2),
        "a late hit of a full window is denied"
    );
}

/// The end of the window an admitted hit decided at `at` was counted in. A store may decide
/// at a later instant than `at` (the memory store never decides a counter at an instant
/// before one it was used at), so the instant plus `reset_after` falls within that window,
/// and is its end when the store decided at `at`.
fn window_end(at: Micros, outcome: &Outcome) -> Micros {
    (at + outcome.reset_after).div_ceil(MICROS_PER_SECOND) * MICROS_PER_SECOND
}

/// Hits whose instants straddle window edges, sent in a random order with random pauses (so
/// that many reach the store after hits of the next window, and after the moment their own
/// window's counter would have expired had it been kept only to the window's end): no window
/// admits more than its limit. A hit counts in the window its outcome reports (the window
/// that ends `reset_after` past its instant).
async fn straddling_hits_never_admit_more_than_the_limit_per_window(kind: StoreKind) {
    let clock = ManualClock::default();
    let under = Under::start(kind, &clock);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let first_edge = next_edge_after(SystemClock.now());
    let mut admitted: HashMap<(u64, Micros), u64> = HashMap::new();
    for round in 0..6u64 {
        let edge = first_edge + round * MICROS_PER_SECOND;
        let user_number = round % 2;
        let user = hit(&format!("user-{user_number}"));
        // 40 instants within 40 ms either side of the edge, sent in a random order.
        let mut instants: Vec<Micros> = (0..40)
            .map(|_| edge - 40 * MS + rng.below(80 * MS))
            .collect();
        for i in (1..instants.len()).rev() {
            let j = usize::try_from(rng.below(i as u64 + 1)).unwrap();
            instants.swap(i, j);
        }
        for at in instants {
            let outcome = under.decide(&clock, at, &user).await;
            if outcome.allowed {
                *admitted
                    .entry((user_number, window_end(at, &outcome)))
                    .or_default() += 1;
            }
            match rng.below(10) {
                0..4 => {}
                4..9 => tokio::time::sleep(Duration::from_millis(rng.below(4))).await,
                _ => under.sweep(),
            }
        }
    }
    let fullest = admitted.values().copied().max().unwrap_or(0);
    assert!(
        admitted.values().all(|&count| count <= LIMIT),
        "admitted per window: {admitted:?}"
    );
    assert_eq!(fullest, LIMIT, "the test must fill windows: {admitted:?}");
}

on_every_store!(
    a_late_hit_finds_its_window_still_counted,
    straddling_hits_never_admit_more_than_the_limit_per_window,
);
