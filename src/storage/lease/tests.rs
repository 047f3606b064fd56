//! Leases against a model of the store (the lease layouts' and the per-request path's
//! semantics, as lease.lua, lease_return.lua, give_back.lua and the algorithms decide them):
//! random interleavings of requests on several replicas, leases and returns landing late,
//! time passing (slices expiring, windows ending), counters cooling down, replicas shut down
//! and replicas lost with their slices, clients giving back hits they were admitted (into a
//! slice, or to the store). No fixed window ever admits more than its limit beside what was
//! given back in it, and no bucket more than its burst and its refill in any interval.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use super::slice::{Slice, window_of};
use super::*;
use crate::algorithm::{Charge, State, decide, given_back};
use crate::clock::{Clock, ManualClock};
use crate::storage::keys::{EntryValue, counter_key};
use crate::storage::{Grant, StoreClock};

const LIMIT: u64 = 60;
const WINDOW: Micros = 10 * MICROS_PER_SECOND;

/// A counter in a window, as the model keys it.
type Slot = (String, u64);

/// The store as Redis holds it: a count per counter and window, a bucket's state, and each
/// holder's tally.
#[derive(Default)]
struct Model {
    counts: HashMap<Slot, u64>,
    states: HashMap<String, State>,
    tallies: HashMap<Slot, HashMap<String, u64>>,
    /// Lease calls that reached it, whatever they granted.
    leases: u64,
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

    fn count(&self, hit: &Hit, at: Micros) -> u64 {
        self.counts.get(&slot(hit, at)).copied().unwrap_or(0)
    }

    fn held(&self, hit: &Hit, at: Micros, holder: &str) -> u64 {
        self.tallies
            .get(&slot(hit, at))
            .and_then(|tally| tally.get(holder))
            .copied()
            .unwrap_or(0)
    }
}

/// A fixed window's counter in the window of `at`; a bucket's only counter.
fn slot(hit: &Hit, at: Micros) -> Slot {
    (hit.key.as_str().to_owned(), window_of(hit, at).0)
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
    /// Decides at once (as Redis would at the instant the call carries), all or nothing over
    /// the request's counters, a refund off its window's count (never below 0), and answers
    /// late.
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        let now = self.clock.now();
        if hits.iter().any(|hit| leased::is_bucket(&hit.params)) {
            let outcomes = self.decide_buckets(hits, now);
            self.after_delay().await;
            return Ok(outcomes);
        }
        let outcomes = {
            let mut model = self.model.lock().unwrap();
            let mut asked: HashMap<Slot, u64> = HashMap::new();
            let charges = hits.iter().filter(|hit| hit.role != Role::Refund);
            for hit in charges.clone() {
                *asked.entry(slot(hit, now)).or_default() += hit.hits;
            }
            let allowed = charges
                .clone()
                .all(|hit| model.count(hit, now) + asked[&slot(hit, now)] <= hit.params.requests);
            if allowed {
                for (slot, hits) in asked {
                    *model.counts.entry(slot).or_default() += hits;
                }
            } else {
                // A charge that counts whether admitted or not is counted all the same.
                for hit in charges.filter(|hit| hit.charge == Charge::Always) {
                    *model.counts.entry(slot(hit, now)).or_default() += hit.hits;
                }
            }
            for refund in hits.iter().filter(|hit| hit.role == Role::Refund) {
                let count = model.counts.entry(slot(refund, now)).or_default();
                *count = count.saturating_sub(refund.hits);
            }
            hits.iter()
                .map(|hit| Outcome {
                    allowed: allowed || hit.role == Role::Refund,
                    remaining: hit.params.requests.saturating_sub(model.count(hit, now)),
                    ..Outcome::default()
                })
                .collect()
        };
        self.after_delay().await;
        Ok(outcomes)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl View {
    /// Buckets' hits, all or nothing (a counter named twice asks the sum).
    fn decide_buckets(&self, hits: &[Hit], now: Micros) -> Vec<Outcome> {
        let mut model = self.model.lock().unwrap();
        let mut asked: Vec<(&Hit, u64)> = Vec::new();
        for hit in hits {
            match asked.iter_mut().find(|(seen, _)| seen.key == hit.key) {
                Some((_, sum)) => *sum += hit.hits,
                None => asked.push((hit, hit.hits)),
            }
        }
        let decided: Vec<_> = asked
            .iter()
            .map(|(hit, sum)| {
                let state = model.states.get(hit.key.as_str());
                (
                    hit,
                    decide(&hit.params, state, now, *sum, Charge::IfAllowed),
                )
            })
            .collect();
        let allowed = decided.iter().all(|(_, decided)| decided.outcome.allowed);
        if allowed {
            for (hit, decided) in decided {
                if let Some(state) = decided.state {
                    model.states.insert(hit.key.as_str().to_owned(), state);
                }
            }
        }
        hits.iter()
            .map(|_| Outcome {
                allowed,
                ..Outcome::default()
            })
            .collect()
    }

    fn lease_now(&self, hit: &Hit, at: Micros, held: u64, life: Micros) -> Grant {
        let mut model = self.model.lock().unwrap();
        model.leases += 1;
        let intact = model.held(hit, at, &self.holder) >= held;
        let overrun = !leased::is_bucket(&hit.params) && model.count(hit, at) > hit.params.requests;
        let (granted, unleased, after, reset_after) = if leased::is_bucket(&hit.params) {
            let stored = model.states.get(hit.key.as_str());
            let (after, taken) = leased::lease(&hit.params, stored, at, hit.hits, life);
            if let Some(state) = &after {
                model
                    .states
                    .insert(hit.key.as_str().to_owned(), state.clone());
            }
            (taken.granted, taken.remaining, after, taken.reset_after)
        } else {
            let granted = hit
                .hits
                .min(hit.params.requests.saturating_sub(model.count(hit, at)));
            *model.counts.entry(slot(hit, at)).or_default() += granted;
            let unleased = hit.params.requests.saturating_sub(model.count(hit, at));
            let (_, end) = window_of(hit, at);
            (granted, unleased, None, end - at)
        };
        let tally = model.tallies.entry(slot(hit, at)).or_default();
        let bucket = leased::is_bucket(&hit.params);
        // A bucket's tally names each holder with its last slice's end, and counts those
        // still live; a fixed window's, what each was granted.
        match (bucket, granted > 0) {
            (true, true) => {
                tally.insert(self.holder.clone(), at + life);
            }
            (false, true) => *tally.entry(self.holder.clone()).or_default() += granted,
            _ => {}
        }
        if bucket {
            tally.retain(|_, end| *end > at);
        }
        Grant {
            granted,
            unleased,
            overrun,
            holders: tally.len() as u64,
            intact: bucket || intact,
            after,
            reset_after,
        }
    }
}

impl StoreClock for View {
    fn instant(&self, _: &Hit) -> Result<Micros, StoreError> {
        Ok(self.clock.now())
    }
}

#[tonic::async_trait]
impl CounterLease for View {
    async fn lease(
        &self,
        hit: &Hit,
        at: Micros,
        held: u64,
        life: Micros,
    ) -> Result<Grant, StoreError> {
        // The call reaches the store after one delay and its answer the replica after
        // another: a reset can fall between the two.
        self.after_delay().await;
        let grant = self.lease_now(hit, at, held, life);
        self.after_delay().await;
        Ok(grant)
    }

    async fn give_back_lease(
        &self,
        hit: &Hit,
        at: Micros,
        after: Option<&State>,
    ) -> Result<u64, StoreError> {
        self.after_delay().await;
        let back = self.give_back_now(hit, at, after);
        self.after_delay().await;
        Ok(back)
    }
}

impl View {
    fn give_back_now(&self, hit: &Hit, at: Micros, after: Option<&State>) -> u64 {
        let mut model = self.model.lock().unwrap();
        if let Some(after) = after {
            let stored = model.states.get(hit.key.as_str());
            let Some(state) = given_back::give_back(&hit.params, stored, Some(after), at, hit.hits)
            else {
                return 0;
            };
            model.states.insert(hit.key.as_str().to_owned(), state);
            return hit.hits;
        }
        let back = hit
            .hits
            .min(model.held(hit, at, &self.holder))
            .min(model.count(hit, at));
        if back > 0 {
            *model
                .tallies
                .entry(slot(hit, at))
                .or_default()
                .entry(self.holder.clone())
                .or_default() -= back;
            *model.counts.entry(slot(hit, at)).or_default() -= back;
        }
        back
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// A request of `hits` to a replica, on counter A, B, both, or A twice.
    Request {
        replica: usize,
        hits: u64,
        shape: u8,
    },
    /// This many requests of one hit on counter A to a replica, at once.
    Burst { replica: usize, requests: usize },
    /// A client gives back to a replica the hits of a request admitted earlier (the
    /// `pick`-th of those not given back yet, modulo their number), as Envoy does when a
    /// stream ends.
    GiveBack { replica: usize, pick: usize },
    /// Time passes.
    Advance(Micros),
    /// The runtime runs the tasks this many turns: calls in flight move on, some land.
    Settle(u8),
    /// A replica's idle counters give their slices back.
    Cool(usize),
    /// A replica shuts down gracefully and is replaced.
    ShutDown(usize),
    /// A replica is lost with its slices and replaced.
    Lose(usize),
    /// Every replica is told of a reset of both counters (as `Reset` does: before and after
    /// the store forgets them), and the store forgets them.
    Reset,
}

impl Step {
    /// A request step as (replica, hits, shape, how many times); nothing for another.
    fn requests(self) -> (usize, u64, u8, usize) {
        match self {
            Step::Request {
                replica,
                hits,
                shape,
            } => (replica, hits, shape, 1),
            Step::Burst { replica, requests } => (replica, 1, 0, requests),
            _ => (0, 0, 0, 0),
        }
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (0usize..3, 1u64..4, 0u8..6)
            .prop_map(|(replica, hits, shape)| Step::Request { replica, hits, shape }),
        2 => (0usize..3, 1usize..40)
            .prop_map(|(replica, requests)| Step::Burst { replica, requests }),
        3 => (0usize..3, any::<usize>())
            .prop_map(|(replica, pick)| Step::GiveBack { replica, pick }),
        2 => (0u64..2 * MICROS_PER_SECOND).prop_map(Step::Advance),
        2 => (0u8..16).prop_map(Step::Settle),
        1 => (0usize..3).prop_map(Step::Cool),
        1 => (0usize..3).prop_map(Step::ShutDown),
        1 => (0usize..3).prop_map(Step::Lose),
        1 => Just(Step::Reset),
    ]
}

fn hit(hits: u64) -> Hit {
    hit_of(LIMIT, hits)
}

fn hit_of(requests: u64, hits: u64) -> Hit {
    hit_on("all", requests, hits)
}

fn hit_on(route: &str, requests: u64, hits: u64) -> Hit {
    hit_of_algorithm(Algorithm::default(), route, requests, hits)
}

fn hit_of_algorithm(algorithm: Algorithm, route: &str, requests: u64, hits: u64) -> Hit {
    let params = Params {
        algorithm,
        requests,
        window: WINDOW,
    };
    Hit {
        descriptor: 0,
        key: counter_key("lease", [("route", EntryValue::Actual(route))], &params),
        params,
        hits,
        role: Role::Enforced,
        charge: crate::algorithm::Charge::IfAllowed,
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
    /// No replica yet, on a fresh model whose calls land after delays drawn from `seed`.
    fn new(clock: &ManualClock, seed: u64) -> Self {
        Fleet {
            model: Arc::new(Mutex::new(Model {
                seed,
                ..Model::default()
            })),
            clock: clock.clone(),
            replicas: Vec::new(),
            made: 0,
        }
    }

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

/// The request of a step's shape: mostly counter A alone, else B alone, both, or A twice.
fn request(algorithm: Algorithm, shape: u8, hits: u64) -> Vec<Hit> {
    let a = hit_of_algorithm(algorithm, "a", LIMIT, hits);
    let b = hit_of_algorithm(algorithm, "b", LIMIT, hits);
    let mut request = match shape {
        3 => vec![b],
        4 => vec![a, b],
        5 => vec![a.clone(), a],
        _ => vec![a],
    };
    for (descriptor, hit) in request.iter_mut().enumerate() {
        hit.descriptor = descriptor;
    }
    request
}

/// Hits admitted (or, negative, given back): the counter, the resets before them, their
/// instant, how many.
type Admitted = (String, u64, Micros, i64);

/// Runs the steps on counters of `algorithm`; answers every request's admitted hits.
async fn run(steps: &[Step], seed: u64, algorithm: Algorithm) -> Vec<Admitted> {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, seed);
    for _ in 0..3 {
        let replica = fleet.replica();
        fleet.replicas.push(replica);
    }
    // Whether each replica's process is up: a request it had not decided when it stopped is
    // never decided (its client sees an error).
    let mut up: Vec<Arc<std::sync::atomic::AtomicBool>> = (0..3)
        .map(|_| Arc::new(std::sync::atomic::AtomicBool::new(true)))
        .collect();
    let mut admitted = Vec::new();
    let mut pending = Vec::new();
    let resets = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // The hits admitted and not given back yet, with the window and reset they were admitted
    // in, which a client may give back (a fixed window's: a bucket's refund goes to the
    // store, as any other call). Only within that window and reset: a refund into another
    // makes room only as far as that window counted, which the bound could not tell.
    let givable: Arc<Mutex<Vec<(Hit, u64, u64)>>> = Arc::default();
    for &step in steps {
        match step {
            Step::GiveBack { replica, pick } => {
                let hit = {
                    let mut givable = givable.lock().unwrap();
                    if givable.is_empty()
                        || leased::is_bucket(&hit_of_algorithm(algorithm, "a", LIMIT, 1).params)
                    {
                        continue;
                    }
                    let index = pick % givable.len();
                    givable.swap_remove(index)
                };
                let store = Arc::clone(&fleet.replicas[replica]);
                let (clock, resets) = (clock.clone(), Arc::clone(&resets));
                let up = Arc::clone(&up[replica]);
                pending.push(tokio::spawn(async move {
                    if !up.load(std::sync::atomic::Ordering::Relaxed) {
                        return Vec::new();
                    }
                    let now = clock.now();
                    let epoch = resets.load(std::sync::atomic::Ordering::Relaxed);
                    let (hit, window, admitted_in) = hit;
                    if (window, admitted_in) != (now / WINDOW, epoch) {
                        return Vec::new();
                    }
                    let refund = [Hit {
                        role: Role::Refund,
                        descriptor: 0,
                        ..hit.clone()
                    }];
                    let outcomes = match store.apply_at_once(&refund) {
                        Some(at_once) => at_once.unwrap().into_vec(),
                        None => store.apply(&refund).await.unwrap(),
                    };
                    assert!(outcomes[0].allowed, "a refund is never denied");
                    let given = -i64::try_from(hit.hits).unwrap();
                    vec![(hit.key.as_str().to_owned(), epoch, now, given)]
                }));
            }
            Step::Request { .. } | Step::Burst { .. } => {
                let (replica, hits, shape, times) = step.requests();
                for _ in 0..times {
                    let store = Arc::clone(&fleet.replicas[replica]);
                    let clock = clock.clone();
                    let resets = Arc::clone(&resets);
                    let up = Arc::clone(&up[replica]);
                    let givable = Arc::clone(&givable);
                    // Requests are in flight at once; each is decided at its first poll, in the
                    // window it then falls in, and all or nothing.
                    pending.push(tokio::spawn(async move {
                        if !up.load(std::sync::atomic::Ordering::Relaxed) {
                            return Vec::new();
                        }
                        let now = clock.now();
                        let epoch = resets.load(std::sync::atomic::Ordering::Relaxed);
                        let request = request(algorithm, shape, hits);
                        // As the limiter asks: at once first, then the store's path.
                        let outcomes = match store.apply_at_once(&request) {
                            Some(at_once) => at_once.unwrap().into_vec(),
                            None => store.apply(&request).await.unwrap(),
                        };
                        let allowed = outcomes.iter().all(|outcome| outcome.allowed);
                        assert!(
                            allowed || outcomes.iter().all(|outcome| !outcome.allowed),
                            "all or nothing: {outcomes:?}"
                        );
                        if allowed {
                            let admitted =
                                request.iter().map(|hit| (hit.clone(), now / WINDOW, epoch));
                            givable.lock().unwrap().extend(admitted);
                        }
                        request
                            .iter()
                            .filter(|_| allowed)
                            .map(|hit| {
                                let hits = i64::try_from(hit.hits).unwrap();
                                (hit.key.as_str().to_owned(), epoch, now, hits)
                            })
                            .collect::<Vec<_>>()
                    }));
                }
            }
            Step::Advance(by) => clock.advance(by),
            Step::Settle(turns) => {
                for _ in 0..turns {
                    tokio::task::yield_now().await;
                }
            }
            Step::Cool(replica) => {
                fleet.replicas[replica]
                    .give_back_where(Some(COOL_AFTER))
                    .await;
            }
            Step::ShutDown(replica) => {
                up[replica].store(false, std::sync::atomic::Ordering::Relaxed);
                up[replica] = Arc::new(std::sync::atomic::AtomicBool::new(true));
                fleet.replicas[replica].give_back_all().await;
                fleet.replicas[replica] = fleet.replica();
            }
            Step::Lose(replica) => {
                up[replica].store(false, std::sync::atomic::Ordering::Relaxed);
                up[replica] = Arc::new(std::sync::atomic::AtomicBool::new(true));
                fleet.replicas[replica] = fleet.replica();
            }
            Step::Reset => {
                let counters = [
                    hit_of_algorithm(algorithm, "a", LIMIT, 1),
                    hit_of_algorithm(algorithm, "b", LIMIT, 1),
                ];
                for replica in &fleet.replicas {
                    replica.forget(&counters);
                }
                {
                    let mut model = fleet.model.lock().unwrap();
                    for counter in &counters {
                        model.counts.remove(&slot(counter, clock.now()));
                        model.states.remove(counter.key.as_str());
                        model.tallies.remove(&slot(counter, clock.now()));
                    }
                }
                resets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                for replica in &fleet.replicas {
                    replica.forget(&counters);
                }
            }
        }
    }
    for request in pending {
        admitted.extend(request.await.unwrap());
    }
    admitted
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// The most hits admitted on one counter between two resets within any interval of
/// `length`, with the counter.
fn most_in_any_interval(admitted: &[Admitted], length: Micros) -> (u64, String) {
    let mut by_counter: HashMap<(&str, u64), Vec<(Micros, u64)>> = HashMap::new();
    for (counter, epoch, at, hits) in admitted {
        by_counter
            .entry((counter, *epoch))
            .or_default()
            .push((*at, hits.unsigned_abs()));
    }
    let mut most = (0, String::new());
    for ((counter, _), mut hits) in by_counter {
        hits.sort_unstable();
        let (mut sum, mut start) = (0, 0);
        for end in 0..hits.len() {
            sum += hits[end].1;
            while hits[end].0 - hits[start].0 >= length {
                sum -= hits[start].1;
                start += 1;
            }
            if sum > most.0 {
                most = (sum, counter.to_owned());
            }
        }
    }
    most
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_interleaving_admits_more_than_the_limit_in_a_window(
        steps in proptest::collection::vec(step(), 1..600),
        seed in any::<u64>(),
    ) {
        let admitted = runtime().block_on(run(&steps, seed, Algorithm::default()));
        // Hits admitted in a window less those given back in it: a refund makes room, as
        // much as it gives back, whether it goes into a slice or to the store.
        let mut per_window: HashMap<(String, u64, u64), i64> = HashMap::new();
        for (counter, epoch, at, hits) in admitted {
            *per_window.entry((counter, at / WINDOW, epoch)).or_default() += hits;
        }
        for ((counter, window, epoch), hits) in per_window {
            prop_assert!(
                hits <= LIMIT as i64,
                "{counter} admitted {hits} of {LIMIT} in window {window} after reset {epoch}, beside what was given back"
            );
        }
    }

    #[test]
    fn no_interleaving_admits_more_than_a_bucket_allows(
        steps in proptest::collection::vec(step(), 1..600),
        seed in any::<u64>(),
        gcra in any::<bool>(),
        burst in 16u64..60,
        span in 1u64..30_000_000,
    ) {
        let algorithm = if gcra { Algorithm::Gcra { burst } } else { Algorithm::TokenBucket { burst } };
        let admitted = runtime().block_on(run(&steps, seed, algorithm));
        // In any interval of length t: the burst, and what refills in t.
        let bound = burst + (u128::from(LIMIT) * u128::from(span)).div_ceil(u128::from(WINDOW)) as u64;
        let (most, counter) = most_in_any_interval(&admitted, span);
        prop_assert!(most <= bound, "{counter} admitted {most} within {span} µs, bound {bound}");
    }
}

#[tokio::test]
async fn a_busy_counter_is_answered_from_its_slice_and_a_cold_one_by_the_store() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
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
        "8 hits a second, 500 ms of them, at least MIN_SLICE"
    );
    // Answered from the slice, at once: this replica's slice less the hits it answered, and
    // what nobody holds as the store last said (its last answer or grant).
    let answered = replica.metrics.from_slice.get();
    let outcome = replica.apply_at_once(&[hit(1)]).unwrap().unwrap()[0];
    assert!(outcome.allowed);
    assert_eq!(replica.metrics.from_slice.get(), answered + 1);
    let unleased = replica
        .book()
        .counters
        .values()
        .next()
        .unwrap()
        .unleased
        .unwrap()
        .1;
    let count = fleet.model.lock().unwrap().count(&hit(1), clock.now());
    assert!(
        unleased >= LIMIT - count,
        "{unleased} unleased, {count} counted"
    );
    assert_eq!(outcome.remaining, (leased - answered - 1) + unleased);
    assert_eq!(outcome.reset_after, WINDOW - clock.now() % WINDOW);
    // A request naming a counter that is not leased goes to the store whole.
    let cold = Hit {
        lease: Lease::Off,
        ..hit(1)
    };
    let outcomes = replica.apply(&[hit(1), cold]).await.unwrap();
    assert!(outcomes.iter().all(|outcome| outcome.allowed));
    assert_eq!(replica.metrics.from_slice.get(), answered + 1);
    let after = fleet.model.lock().unwrap().count(&hit(1), clock.now());
    assert_eq!(after, count + 2);
}

/// The slice of `hit`'s counter on `replica`: what it has left and what it spent.
fn slice_of(replica: &Leased, hit: &Hit) -> (u64, u64) {
    let book = replica.book();
    let slice = book.counters.get(&hit.key).unwrap().slice.as_ref().unwrap();
    (slice.left, slice.spent)
}

#[tokio::test]
async fn a_refund_goes_back_into_the_slice_it_was_spent_from_and_no_further() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = fleet.replica();
    for _ in 0..8 {
        assert!(replica.apply(&[hit(1)]).await.unwrap()[0].allowed);
    }
    settle().await;
    let (left, spent) = slice_of(&replica, &hit(1));
    assert_eq!((left, spent), (MIN_SLICE, 0));
    for _ in 0..3 {
        assert!(replica.apply_at_once(&[hit(1)]).unwrap().unwrap()[0].allowed);
    }
    assert_eq!(slice_of(&replica, &hit(1)), (MIN_SLICE - 3, 3));
    let count = fleet.model.lock().unwrap().count(&hit(1), clock.now());
    // Two of the three go back into the slice, at once; the store's count does not move.
    let refund = |hits| Hit {
        role: Role::Refund,
        ..hit(hits)
    };
    let outcome = replica.apply_at_once(&[refund(2)]).unwrap().unwrap()[0];
    assert!(outcome.allowed);
    assert_eq!(slice_of(&replica, &hit(1)), (MIN_SLICE - 1, 1));
    // A settlement: one back and two charged, from the slice.
    let settled = replica
        .apply_at_once(&[refund(1), hit(2)])
        .unwrap()
        .unwrap();
    assert!(settled.iter().all(|outcome| outcome.allowed));
    assert_eq!(slice_of(&replica, &hit(1)), (MIN_SLICE - 2, 2));
    assert_eq!(
        fleet.model.lock().unwrap().count(&hit(1), clock.now()),
        count
    );
    // More than the slice spent (hits spent elsewhere, or in a window before) goes to the
    // store, whole, the slice untouched.
    assert!(replica.apply_at_once(&[refund(3)]).is_none());
    assert!(replica.apply(&[refund(3)]).await.unwrap()[0].allowed);
    assert_eq!(slice_of(&replica, &hit(1)), (MIN_SLICE - 2, 2));
    assert_eq!(
        fleet.model.lock().unwrap().count(&hit(1), clock.now()),
        count - 3
    );
}

#[tokio::test]
async fn a_charge_that_counts_and_does_not_fit_its_slice_is_counted_by_the_store() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = fleet.replica();
    for _ in 0..8 {
        assert!(replica.apply(&[hit(1)]).await.unwrap()[0].allowed);
    }
    settle().await;
    assert_eq!(slice_of(&replica, &hit(1)).0, MIN_SLICE);
    let usage = |hits| Hit {
        charge: Charge::Always,
        ..hit(hits)
    };
    // Within the slice: taken from it, as an admission is.
    assert!(replica.apply_at_once(&[usage(3)]).unwrap().unwrap()[0].allowed);
    assert_eq!(slice_of(&replica, &hit(1)).0, MIN_SLICE - 3);
    // Past it: the store decides and counts it in full, past the limit; the slice is left
    // as it was (a lease its demand asks for may add to it later).
    assert!(replica.apply_at_once(&[usage(LIMIT)]).is_none());
    let count = fleet.model.lock().unwrap().count(&hit(1), clock.now());
    let from_slice = replica.metrics.from_slice.get();
    let outcome = replica.apply(&[usage(LIMIT)]).await.unwrap()[0];
    assert!(!outcome.allowed);
    assert_eq!(replica.metrics.from_slice.get(), from_slice);
    let after = fleet.model.lock().unwrap().count(&hit(1), clock.now());
    assert!(after >= count + LIMIT, "{count} then {after}");
    // The denial gives the slice back: usage took the count past the limit, and what the
    // slice held is no budget left. A check is then denied, by the store.
    settle().await;
    assert!(
        replica
            .book()
            .counters
            .get(&hit(1).key)
            .unwrap()
            .slice
            .is_none()
    );
    let returned = fleet.model.lock().unwrap().count(&hit(1), clock.now());
    assert_eq!(returned, after - (MIN_SLICE - 3));
    assert!(replica.apply_at_once(&[hit(0)]).is_none());
    assert!(!replica.apply(&[hit(0)]).await.unwrap()[0].allowed);
}

#[tokio::test]
async fn a_request_its_slices_cannot_answer_at_once_is_left_to_the_store_as_it_was() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = fleet.replica();
    // A cold counter: asked at once first, then through the store, as the limiter does.
    // Counted once a request (4, below the busy rate of 5), it is never followed.
    for _ in 0..4 {
        assert!(replica.apply_at_once(&[hit(1)]).is_none());
        assert!(replica.apply(&[hit(1)]).await.unwrap()[0].allowed);
    }
    settle().await;
    assert_eq!(replica.metrics.leases.get(), 0);
    assert!(replica.book().counters.is_empty());
    // Busy and leased: a request asking more than the slice holds is not answered at once,
    // and leaves the demand as it was; the store's path then decides it.
    for _ in 0..4 {
        replica.apply(&[hit(1)]).await.unwrap();
    }
    settle().await;
    assert_eq!(replica.metrics.leased_hits.get(), MIN_SLICE);
    let demand = |replica: &Leased| {
        replica
            .book()
            .counters
            .values()
            .next()
            .unwrap()
            .demand
            .rate()
    };
    let before = demand(&replica);
    assert!(replica.apply_at_once(&[hit(MIN_SLICE + 1)]).is_none());
    assert_eq!(demand(&replica), before);
    assert_eq!(replica.metrics.from_slice.get(), 0);
    let count = fleet.model.lock().unwrap().count(&hit(1), clock.now());
    assert!(replica.apply(&[hit(MIN_SLICE + 1)]).await.unwrap()[0].allowed);
    assert_eq!(demand(&replica), before + MIN_SLICE + 1);
    let after = fleet.model.lock().unwrap().count(&hit(1), clock.now());
    assert_eq!(after, count + MIN_SLICE + 1, "decided by the store");
    // What fits is answered at once, from the slice alone.
    let outcome = replica.apply_at_once(&[hit(2)]).unwrap().unwrap()[0];
    assert!(outcome.allowed);
    assert_eq!(replica.metrics.from_slice.get(), 1);
    assert_eq!(
        fleet.model.lock().unwrap().count(&hit(1), clock.now()),
        after
    );
}

#[tokio::test]
async fn a_refill_after_a_reset_drops_the_stale_slice() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = fleet.replica();
    let slice_left = |replica: &Arc<Leased>| {
        let book = replica.book();
        let followed = book.counters.values().next()?;
        followed.slice.as_ref().map(|slice| slice.left)
    };
    for _ in 0..20 {
        replica.apply(&[hit_of(10_000, 1)]).await.unwrap();
    }
    settle().await;
    assert!(
        slice_left(&replica).unwrap_or(0) > 0,
        "a slice after 20 busy requests"
    );
    // The store forgets the counter and its tally (a reset, a flush): the next refill finds
    // the tally short, and the slice it had is dropped, not topped up.
    let counter = slot(&hit_of(10_000, 1), clock.now());
    {
        let mut model = fleet.model.lock().unwrap();
        model.counts.remove(&counter);
        model.tallies.remove(&counter);
    }
    let leases = replica.metrics.leases.get();
    for _ in 0..100 {
        if replica.metrics.leases.get() > leases {
            break;
        }
        replica.apply(&[hit_of(10_000, 1)]).await.unwrap();
        settle().await;
    }
    assert!(
        replica.metrics.leases.get() > leases,
        "a refill after the reset"
    );
    let counted = fleet.model.lock().unwrap().counts[&counter];
    let left = slice_left(&replica).unwrap_or(0);
    assert!(
        left <= counted,
        "the slice ({left}) holds no more than the store counted since the reset ({counted})"
    );
}

#[tokio::test]
async fn a_limit_lowered_by_the_rules_is_leased_under_its_new_value() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = fleet.replica();
    for _ in 0..200 {
        replica.apply(&[hit_of(1_000, 1)]).await.unwrap();
    }
    settle().await;
    assert!(
        replica.metrics.from_slice.get() > 100,
        "busy on the first limit"
    );
    // The rules now say 100, for the same counter (the key does not carry the limit): the
    // next window admits 100, not what the old limit would lease.
    clock.advance(WINDOW);
    let mut admitted = 0;
    for _ in 0..400 {
        let outcome = replica.apply(&[hit_of(100, 1)]).await.unwrap()[0];
        admitted += u64::from(outcome.allowed);
        settle().await;
    }
    assert_eq!(admitted, 100);
    // And in the first window too, nothing more is admitted once the new limit is passed.
    clock.advance(WINDOW);
    for _ in 0..200 {
        replica.apply(&[hit_of(1_000, 1)]).await.unwrap();
    }
    settle().await;
    let count = fleet
        .model
        .lock()
        .unwrap()
        .count(&hit_of(1_000, 1), clock.now());
    assert!(count > 100);
    let mut late = 0;
    for _ in 0..50 {
        late += u64::from(replica.apply(&[hit_of(100, 1)]).await.unwrap()[0].allowed);
        settle().await;
    }
    assert_eq!(late, 0, "{count} counted under the old limit");
}

fn bucket(hits: u64) -> Hit {
    hit_of_algorithm(
        Algorithm::TokenBucket { burst: LIMIT },
        "bucket",
        LIMIT,
        hits,
    )
}

/// A replica's bucket made busy (5 hits at once), its first lease landed; and the bucket's
/// remaining as the store would answer a check now.
async fn busy_bucket(fleet: &mut Fleet) -> Arc<Leased> {
    let replica = fleet.replica();
    for _ in 0..5 {
        assert!(replica.apply(&[bucket(1)]).await.unwrap()[0].allowed);
    }
    settle().await;
    assert_eq!(replica.metrics.leased_hits.get(), MIN_SLICE);
    replica
}

fn bucket_remaining(fleet: &Fleet) -> u64 {
    let model = fleet.model.lock().unwrap();
    let state = model.states.get(bucket(0).key.as_str()).cloned();
    decide(
        &bucket(0).params,
        state.as_ref(),
        fleet.clock.now(),
        0,
        Charge::IfAllowed,
    )
    .outcome
    .remaining
}

#[tokio::test]
async fn a_buckets_slice_is_used_within_its_life_only() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = busy_bucket(&mut fleet).await;
    // The lease held back its life's refill (1 s of 6 a second, and a µs): of the 55 tokens
    // left, it took 8 of the 54 it could, leaving 45 and a fraction.
    assert_eq!(bucket_remaining(&fleet), 45);
    // Within the life, hits come out of the slice; the answer counts the slice and what the
    // lease left.
    let outcome = replica.apply(&[bucket(1)]).await.unwrap()[0];
    assert_eq!(replica.metrics.from_slice.get(), 1);
    assert_eq!(outcome.remaining, (MIN_SLICE - 1) + 45);
    // Past the life (1 s: --deny-cache-max-ttl here), the slice is not used: the hit goes to
    // the store, and the unused 7 do not go back, the bucket having changed since the lease.
    clock.advance(MICROS_PER_SECOND);
    assert!(replica.apply(&[bucket(1)]).await.unwrap()[0].allowed);
    assert_eq!(replica.metrics.from_slice.get(), 1);
    settle().await;
    assert_eq!(replica.metrics.returned_hits.get(), 0);
}

#[tokio::test]
async fn a_buckets_slice_goes_back_while_the_bucket_is_as_the_lease_left_it() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = busy_bucket(&mut fleet).await;
    replica.give_back_all().await;
    assert_eq!(replica.metrics.returned_hits.get(), MIN_SLICE);
    // The 8 are back; the held-back refill is not (it comes back with time, as refill).
    assert_eq!(bucket_remaining(&fleet), 53);
}

#[tokio::test]
async fn a_buckets_lease_that_grants_nothing_leaves_the_slices_life_as_it_was() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = busy_bucket(&mut fleet).await;
    // Half a second on, another replica empties the bucket: the next lease finds nothing to
    // take.
    clock.advance(MICROS_PER_SECOND / 2);
    drain(&fleet, clock.now());
    for _ in 0..6 {
        assert!(replica.apply(&[bucket(1)]).await.unwrap()[0].allowed);
        settle().await;
    }
    assert_eq!(replica.metrics.from_slice.get(), 6);
    assert_eq!(
        fleet.model.lock().unwrap().leases,
        2,
        "a refill was asked for"
    );
    assert_eq!(
        replica.metrics.leased_hits.get(),
        MIN_SLICE,
        "and granted nothing"
    );
    // The slice still ends 1 s after its lease, not after the empty one: its last 2 hits are
    // not used past it.
    clock.advance(MICROS_PER_SECOND / 2);
    replica.apply(&[bucket(1)]).await.unwrap();
    assert_eq!(replica.metrics.from_slice.get(), 6);
}

/// Takes every token the bucket has at `now`, as another replica would.
fn drain(fleet: &Fleet, now: Micros) {
    let mut model = fleet.model.lock().unwrap();
    let key = bucket(0).key.as_str().to_owned();
    let state = model.states.get(&key).cloned();
    let params = bucket(0).params;
    let left = decide(&params, state.as_ref(), now, 0, Charge::IfAllowed)
        .outcome
        .remaining;
    let drained = decide(&params, state.as_ref(), now, left, Charge::IfAllowed);
    if let Some(state) = drained.state {
        model.states.insert(key, state);
    }
}

#[tokio::test]
async fn a_buckets_slice_left_by_a_changed_limit_goes_back_under_the_limit_it_was_leased_under() {
    let clock = ManualClock::at_seconds(1_795_000_000);
    let mut fleet = Fleet::new(&clock, 0);
    let replica = busy_bucket(&mut fleet).await;
    assert_eq!(bucket_remaining(&fleet), 45);
    // The rules now give the same counter a burst of 5: the slice's 8 go back as leased
    // under a burst of 60, not as 8 of a burst of 5 (which would empty the bucket's debt).
    let changed = hit_of_algorithm(Algorithm::TokenBucket { burst: 5 }, "bucket", LIMIT, 1);
    assert_eq!(changed.key, bucket(1).key);
    let now = [Some(clock.now())];
    assert!(replica.answer_from_slices(&[changed], &now).is_none());
    settle().await;
    assert_eq!(replica.metrics.returned_hits.get(), MIN_SLICE);
    assert_eq!(bucket_remaining(&fleet), 53);
}

#[test]
fn a_buckets_later_grant_leaves_the_earlier_ones_hits_their_own_end() {
    let slice = |left, at: Micros, until| Slice {
        window: 0,
        at,
        left,
        spent: 0,
        until,
        expiring: None,
        last: None,
        full_at: until,
    };
    let second = MICROS_PER_SECOND;
    // 3 hits left of a grant good until 1 s; at 0.5 s a grant of 8 good until 1.5 s.
    let mut held = slice(3, 0, second);
    calls::add_to_bucket_slice(&mut held, slice(8, second / 2, 3 * second / 2), second / 2);
    assert_eq!(
        (held.left, held.expiring, held.until),
        (11, Some((3, second)), 3 * second / 2)
    );
    // One is used before 1 s; the other 2 go with their grant's end, the 8 stay.
    held.spend(1);
    held.settle(second - 1);
    assert_eq!(held.left, 10);
    held.settle(second);
    assert_eq!((held.left, held.expiring), (8, None));
}
