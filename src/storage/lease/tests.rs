//! Leases against a model of the store (the lease layouts' and the per-request path's
//! semantics, as lease.lua, lease_return.lua and a fixed window decide them): random
//! interleavings of requests on several replicas, leases and returns landing late, time
//! passing (slices expiring, windows ending), counters cooling down, replicas shut down and
//! replicas lost with their slices. No window ever admits more than its limit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::storage::keys::{EntryValue, counter_key};

const LIMIT: u64 = 60;
const WINDOW: Micros = 10 * MICROS_PER_SECOND;

/// The store as Redis holds it: a count per window, and each holder's tally.
#[derive(Default)]
struct Model {
    counts: HashMap<u64, u64>,
    tallies: HashMap<u64, HashMap<String, u64>>,
    /// Drives how long each call takes to land (yields of the runtime).
    seed: u64,
}

impl Model {
    fn delay(&mut self) -> u64 {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.seed >> 33) % 6
    }
}

/// One replica's view of the model: its per-request path and its leases, under its name.
struct View {
    model: Arc<Mutex<Model>>,
    clock: ManualClock,
    holder: String,
}

impl View {
    async fn after_delay(&self) {
        let delay = self.model.lock().unwrap().delay();
        for _ in 0..delay {
            tokio::task::yield_now().await;
        }
    }
}

#[tonic::async_trait]
impl CounterStore for View {
    /// Decides at once (as Redis would at the instant the call carries), answers late.
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        let now = self.clock.now();
        let allowed = {
            let mut model = self.model.lock().unwrap();
            let count = model.counts.entry(now / WINDOW).or_default();
            let asked: u64 = hits.iter().map(|hit| hit.hits).sum();
            let allowed = *count + asked <= LIMIT;
            if allowed {
                *count += asked;
            }
            allowed
        };
        self.after_delay().await;
        let outcome = Outcome {
            allowed,
            ..Outcome::default()
        };
        Ok(vec![outcome; hits.len()])
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[tonic::async_trait]
impl CounterLease for View {
    fn instant(&self, _: &Hit) -> Result<Micros, StoreError> {
        Ok(self.clock.now())
    }

    async fn lease(&self, hit: &Hit, at: Micros) -> Result<Grant, StoreError> {
        self.after_delay().await;
        let mut model = self.model.lock().unwrap();
        let window = at / WINDOW;
        let count = model.counts.entry(window).or_default();
        let granted = hit.hits.min(LIMIT.saturating_sub(*count));
        *count += granted;
        let count = *count;
        let tally = model.tallies.entry(window).or_default();
        if granted > 0 {
            *tally.entry(self.holder.clone()).or_default() += granted;
        }
        Ok(Grant {
            granted,
            count,
            holders: tally.len() as u64,
        })
    }

    async fn give_back_lease(&self, hit: &Hit, at: Micros) -> Result<u64, StoreError> {
        self.after_delay().await;
        let mut model = self.model.lock().unwrap();
        let window = at / WINDOW;
        let count = model.counts.get(&window).copied().unwrap_or(0);
        let held = model
            .tallies
            .get(&window)
            .and_then(|tally| tally.get(&self.holder))
            .copied()
            .unwrap_or(0);
        let back = hit.hits.min(held).min(count);
        if back > 0 {
            *model
                .tallies
                .entry(window)
                .or_default()
                .entry(self.holder.clone())
                .or_default() -= back;
            *model.counts.entry(window).or_default() -= back;
        }
        Ok(back)
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// A request of `hits` to a replica.
    Request { replica: usize, hits: u64 },
    /// Time passes.
    Advance(Micros),
    /// Calls in flight land.
    Settle,
    /// A replica's idle counters give their slices back.
    Cool(usize),
    /// A replica shuts down gracefully and is replaced.
    ShutDown(usize),
    /// A replica is lost with its slices and replaced.
    Lose(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (0usize..3, 1u64..4).prop_map(|(replica, hits)| Step::Request { replica, hits }),
        1 => (0u64..2 * MICROS_PER_SECOND).prop_map(Step::Advance),
        2 => Just(Step::Settle),
        1 => (0usize..3).prop_map(Step::Cool),
        1 => (0usize..3).prop_map(Step::ShutDown),
        1 => (0usize..3).prop_map(Step::Lose),
    ]
}

fn hit(hits: u64) -> Hit {
    let params = Params {
        algorithm: Algorithm::default(),
        requests: LIMIT,
        window: WINDOW,
    };
    Hit {
        descriptor: 0,
        key: counter_key("lease", [("route", EntryValue::Actual("all"))], &params),
        params,
        hits,
        role: Role::Enforced,
        lease: Lease::Auto,
    }
}

struct Fleet {
    model: Arc<Mutex<Model>>,
    clock: ManualClock,
    replicas: Vec<Arc<Leased>>,
    made: usize,
}

impl Fleet {
    fn replica(&mut self) -> Arc<Leased> {
        self.made += 1;
        let view = Arc::new(View {
            model: Arc::clone(&self.model),
            clock: self.clock.clone(),
            holder: format!("replica {}", self.made),
        });
        let settings = LeaseSettings {
            by_default: false,
            busy_rate: 5,
            slice_life: MICROS_PER_SECOND,
        };
        Leased::new(
            Arc::clone(&view) as Arc<dyn CounterStore>,
            view,
            settings,
            &Metrics::default(),
        )
    }
}

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Runs the steps; answers the hits each window admitted.
async fn run(steps: &[Step], seed: u64) -> HashMap<u64, u64> {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let model = Arc::new(Mutex::new(Model {
        seed,
        ..Model::default()
    }));
    let mut fleet = Fleet {
        model,
        clock: clock.clone(),
        replicas: Vec::new(),
        made: 0,
    };
    for _ in 0..3 {
        let replica = fleet.replica();
        fleet.replicas.push(replica);
    }
    let mut admitted: HashMap<u64, u64> = HashMap::new();
    let mut pending = Vec::new();
    for &step in steps {
        match step {
            Step::Request { replica, hits } => {
                let store = Arc::clone(&fleet.replicas[replica]);
                let clock = clock.clone();
                // Requests are in flight at once; each is decided at its first poll, in the
                // window it then falls in.
                pending.push(tokio::spawn(async move {
                    let window = clock.now() / WINDOW;
                    let outcome = store.apply(&[hit(hits)]).await.unwrap();
                    (window, if outcome[0].allowed { hits } else { 0 })
                }));
            }
            Step::Advance(by) => clock.advance(by),
            Step::Settle => settle().await,
            Step::Cool(replica) => {
                let since = clock.now().saturating_sub(COOL_AFTER);
                fleet.replicas[replica].give_back_where(Some(since)).await;
            }
            Step::ShutDown(replica) => {
                fleet.replicas[replica].give_back_all().await;
                fleet.replicas[replica] = fleet.replica();
            }
            Step::Lose(replica) => fleet.replicas[replica] = fleet.replica(),
        }
    }
    for request in pending {
        let (window, hits) = request.await.unwrap();
        *admitted.entry(window).or_default() += hits;
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_interleaving_admits_more_than_the_limit_in_a_window(
        steps in proptest::collection::vec(step(), 1..600),
        seed in any::<u64>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let admitted = runtime.block_on(run(&steps, seed));
        for (window, hits) in admitted {
            prop_assert!(hits <= LIMIT, "window {window} admitted {hits} of {LIMIT}");
        }
    }
}

#[tokio::test]
async fn a_busy_counter_is_answered_from_its_slice_and_a_cold_one_by_the_store() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet {
        model: Arc::new(Mutex::new(Model::default())),
        clock: clock.clone(),
        replicas: Vec::new(),
        made: 0,
    };
    let replica = fleet.replica();
    // Below the busy rate (5 a second), every request goes to the store.
    for _ in 0..4 {
        assert!(replica.apply(&[hit(1)]).await.unwrap()[0].allowed);
    }
    settle().await;
    assert_eq!(replica.metrics.leases.get(), 0);
    // Busy: a lease is taken in the background, and the next requests come out of it.
    for _ in 0..4 {
        assert!(replica.apply(&[hit(1)]).await.unwrap()[0].allowed);
    }
    settle().await;
    assert_eq!(replica.metrics.leases.get(), 1);
    let leased = replica.metrics.leased_hits.get();
    assert_eq!(
        leased, MIN_SLICE,
        "8 hits a second, 200 ms of them, at least MIN_SLICE"
    );
    // Answered from the slice: this replica's slice less the hits it answered, and what
    // nobody holds: the limit less the store's count (the hits it decided and the lease).
    let answered = replica.metrics.from_slice.get();
    let outcome = replica.apply(&[hit(1)]).await.unwrap()[0];
    assert!(outcome.allowed);
    assert_eq!(replica.metrics.from_slice.get(), answered + 1);
    let count = fleet.model.lock().unwrap().counts[&(clock.now() / WINDOW)];
    assert_eq!(outcome.remaining, (leased - answered - 1) + (LIMIT - count));
    assert_eq!(outcome.reset_after, WINDOW - clock.now() % WINDOW);
    // A request naming a counter that is not leased goes to the store whole.
    let cold = Hit {
        lease: Lease::Off,
        ..hit(1)
    };
    let outcomes = replica.apply(&[hit(1), cold]).await.unwrap();
    assert!(outcomes.iter().all(|outcome| outcome.allowed));
    assert_eq!(replica.metrics.from_slice.get(), answered + 1);
    let after = fleet.model.lock().unwrap().counts[&(clock.now() / WINDOW)];
    assert_eq!(after, count + 2);
}
