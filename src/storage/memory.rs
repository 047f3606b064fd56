//! The in-process store (the default): counters in a sharded map bounded by `max_keys`.
//!
//! Each shard is a `std::sync::Mutex` around a map (see below). A std mutex, not tokio's,
//! because it is never held across an `.await`: `apply` is synchronous inside. A request locks the shards of
//! its keys in ascending order (so two requests cannot deadlock), decides every hit, and
//! commits all or nothing while holding them: that is what makes a multi-descriptor request
//! atomic here. Sharding keeps unrelated requests off each other's locks.
//!
//! Counters are held by a 128-bit keyed digest of their key, not the key itself: a key is
//! 60 bytes or more, and with the digest a counter costs about 75 bytes at a million
//! (docs/performance.md). The digest is SipHash under keys drawn at random per process, so
//! clients cannot aim for a collision, and an accidental one among a billion counters has a
//! probability below 10^-20.
//!
//! Bounded memory: each shard holds at most `max_keys / SHARDS` (rounded up) counters and
//! evicts beyond that (counted in `evictions`) by CLOCK, an approximation of LRU: a use only
//! marks a counter, and a hand sweeping the shard's entries unmarks marked counters and evicts
//! the first unmarked one. The shard is an `IndexMap`, its entries one contiguous array: no
//! allocation per counter and no list links to update per use (an LRU list costs two cache
//! misses per decision at a million counters), and the background sweep of expired counters
//! reads memory in order instead of chasing pointers under the shard's lock.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use indexmap::IndexMap;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::keys::CounterKey;
use super::{CounterStore, Hit, StoreError, vetoed};
use crate::algorithm::{self, Charge, Outcome, State, Transition};
use crate::clock::{Clock, Micros};
use crate::metrics::Metrics;

/// Enough shards that two cores rarely contend, few enough that a sweep stays cheap.
const SHARDS: usize = 64;

/// Most counters a shard reserves room for up front (4M in all). Reserving takes address
/// space only: pages become resident as counters fill them. Within it a shard never grows
/// under its lock (copying every counter while requests wait), and no outgrown array is left
/// for the allocator to hold on to.
const MAX_RESERVED_PER_SHARD: usize = 1 << 16;

/// How often expired counters are removed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// A counter's identity in the map: two independent keyed 64-bit hashes of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest(u64, u64);

impl Hash for Digest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already a keyed hash: the map uses it as is (see `PassThrough`).
        state.write_u64(self.1);
    }
}

/// The map's hasher for `Digest`, which is already uniformly distributed and unpredictable.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `Digest` is hashed here, through `write_u64`; any other input still spreads.
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// One shard: its counters, the CLOCK hand (an index into them) for eviction, and the latest
/// instant it was used at.
#[derive(Default)]
struct Shard {
    counters: IndexMap<Digest, Slot, BuildHasherDefault<PassThrough>>,
    hand: usize,
    latest: Micros,
}

impl Shard {
    /// The instant to decide or sweep at: `now`, or the latest instant this shard was used at
    /// if the clock stepped back since. A counter is then never decided at an instant before
    /// one it was swept at (which would find it gone and count its window again from zero).
    fn at(&mut self, now: Micros) -> Micros {
        self.latest = self.latest.max(now);
        self.latest
    }
}

struct Slot {
    state: State,
    /// When the state may be forgotten, in µs, with `USED` (a bit no instant reaches before
    /// the year 30000) marking a use since the CLOCK hand last passed the counter:
    /// a separate flag would cost 8 bytes per counter in padding.
    stamp: Micros,
}

const USED: Micros = 1 << 63;

impl Slot {
    fn new(state: State, expires_at: Micros) -> Self {
        Self {
            state,
            stamp: expires_at & !USED,
        }
    }

    fn expires_at(&self) -> Micros {
        self.stamp & !USED
    }

    fn mark_used(&mut self) {
        self.stamp |= USED;
    }

    /// Clears the mark; whether it was set.
    fn take_used(&mut self) -> bool {
        let used = self.stamp & USED != 0;
        self.stamp &= !USED;
        used
    }
}

pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    /// The digest's keys, drawn at random.
    digest_keys: RandomState,
    charge: Charge,
    clock: Arc<dyn Clock>,
    evictions: AtomicU64,
    /// `tollgate_memory_keys` and `tollgate_memory_evictions`.
    keys_metric: Gauge,
    evictions_metric: Counter,
}

impl MemoryStore {
    pub fn new(max_keys: usize, charge: Charge, clock: Arc<dyn Clock>) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS).max(1);
        // Eviction comes before insertion, so a shard never holds more than its bound.
        let reserved = per_shard.min(MAX_RESERVED_PER_SHARD);
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        counters: IndexMap::with_capacity_and_hasher(reserved, Default::default()),
                        hand: 0,
                        latest: 0,
                    })
                })
                .collect(),
            per_shard,
            digest_keys: RandomState::new(),
            charge,
            clock,
            evictions: AtomicU64::new(0),
            keys_metric: Gauge::default(),
            evictions_metric: Counter::default(),
        }
    }

    /// Reports key count and evictions in `metrics`.
    pub fn with_metrics(self, metrics: &Metrics) -> Self {
        Self {
            keys_metric: metrics.memory_keys.clone(),
            evictions_metric: metrics.memory_evictions.clone(),
            ..self
        }
    }

    /// Wraps the store and starts its background sweep, which ends when the store is dropped.
    pub fn start(self) -> Arc<Self> {
        let store = Arc::new(self);
        let weak: Weak<Self> = Arc::downgrade(&store);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(SWEEP_EVERY);
            loop {
                ticks.tick().await;
                match weak.upgrade() {
                    Some(store) => store.sweep(),
                    None => return,
                }
            }
        });
        store
    }

    /// Number of counters held.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).counters.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters evicted to stay within `max_keys`.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Removes every expired counter.
    pub fn sweep(&self) {
        let now = self.clock.now();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let now = shard.at(now);
            let held = shard.counters.len();
            shard.counters.retain(|_, slot| slot.expires_at() > now);
            let swept = held - shard.counters.len();
            self.keys_metric
                .dec_by(i64::try_from(swept).unwrap_or(i64::MAX));
        }
    }

    /// Both halves come from one pass over the key: the second is the keyed hash (SipHash) of
    /// the key followed by one more byte. Two keys then share a digest only if their 256-bit
    /// hash states coincide or both halves collide by chance, about 2^-128 either way.
    fn digest(&self, key: &CounterKey) -> Digest {
        let mut hasher = self.digest_keys.build_hasher();
        key.hash(&mut hasher);
        let first = hasher.finish();
        hasher.write_u8(1);
        Digest(first, hasher.finish())
    }

    fn shard_of(digest: Digest) -> usize {
        // Truncating is fine: only the low bits pick the shard.
        (digest.0 as usize) % SHARDS
    }

    /// Decides `hits` with every involved shard locked (see the module docs). The clock is
    /// read once the locks are held, and never taken back past a shard's latest instant
    /// (`Shard::at`), so a counter's state never comes from a later instant than the
    /// decision's.
    fn apply_with(&self, hits: &[Hit], now: impl FnOnce() -> Micros) -> Vec<Outcome> {
        if let [hit] = hits {
            return vec![self.apply_one(hit, now)];
        }
        let digests: Vec<Digest> = hits.iter().map(|hit| self.digest(&hit.key)).collect();
        let shard_of_hit: Vec<usize> = digests.iter().map(|&d| Self::shard_of(d)).collect();
        let mut locked: Vec<usize> = shard_of_hit.clone();
        locked.sort_unstable();
        locked.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> = locked
            .iter()
            .map(|&index| lock(&self.shards[index]))
            .collect();
        let guard_of = |shard: usize| locked.binary_search(&shard).unwrap_or(0);
        let now = guards.iter_mut().fold(now(), |now, shard| shard.at(now));
        for shard in &mut guards {
            shard.at(now);
        }

        let stored: Vec<Option<State>> = digests
            .iter()
            .zip(&shard_of_hit)
            .map(|(digest, &shard)| {
                let slot = guards[guard_of(shard)].counters.get_mut(digest)?;
                slot.mark_used();
                (slot.expires_at() > now).then(|| slot.state.clone())
            })
            .collect();
        let decisions = decide_in_order(hits, &stored, now, self.charge);
        let veto = self.charge == Charge::IfAllowed
            && vetoed(hits, |index| decisions[index].outcome.allowed);
        if veto {
            return unconsumed_outcomes(hits, &stored, &decisions, now);
        }
        for ((digest, decision), &shard) in digests.iter().zip(&decisions).zip(&shard_of_hit) {
            if let Some(state) = &decision.state {
                let slot = Slot::new(state.clone(), decision.expires_at);
                self.store(&mut guards[guard_of(shard)], *digest, slot);
            }
        }
        decisions.iter().map(|decision| decision.outcome).collect()
    }

    /// `apply_with` for the common request of one counter: one lock, one map lookup, no
    /// intermediate vectors. A lone hit vetoes only itself, and then consumes nothing.
    fn apply_one(&self, hit: &Hit, now: impl FnOnce() -> Micros) -> Outcome {
        let digest = self.digest(&hit.key);
        let mut shard = lock(&self.shards[Self::shard_of(digest)]);
        let now = shard.at(now());
        let mut slot = shard.counters.get_mut(&digest);
        if let Some(slot) = slot.as_deref_mut() {
            slot.mark_used();
        }
        let stored = slot
            .as_deref()
            .filter(|slot| slot.expires_at() > now)
            .map(|slot| &slot.state);
        let decision = algorithm::decide(&hit.params, stored, now, hit.hits, self.charge);
        let veto = self.charge == Charge::IfAllowed
            && vetoed(std::slice::from_ref(hit), |_| decision.outcome.allowed);
        if let (false, Some(state)) = (veto, decision.state) {
            let fresh = Slot::new(state, decision.expires_at);
            match slot {
                Some(slot) => {
                    // Still used: the mark survives the new state.
                    *slot = fresh;
                    slot.mark_used();
                }
                None => self.store(&mut shard, digest, fresh),
            }
        }
        decision.outcome
    }

    /// Puts a counter into its (locked) shard, evicting one first when the shard is full.
    fn store(&self, shard: &mut Shard, digest: Digest, slot: Slot) {
        if let Some(held) = shard.counters.get_mut(&digest) {
            *held = slot;
            held.mark_used();
            return;
        }
        let hole = self.evict_one(shard);
        let (added, _) = shard.counters.insert_full(digest, slot);
        self.keys_metric.inc();
        // Into the evicted counter's place, just behind the hand, as CLOCK has it: the new
        // counter waits a full turn before the hand looks at it.
        if let Some(hole) = hole.filter(|&hole| hole < added) {
            shard.counters.swap_indices(hole, added);
        }
    }

    /// Makes room for one counter in a full shard by CLOCK: from the hand on, a marked
    /// counter is unmarked and passed, the first unmarked one is evicted. Each step unmarks or
    /// evicts, so it ends within two turns. Returns the evicted counter's index (which now
    /// holds the shard's former last counter); the hand is just past it.
    fn evict_one(&self, shard: &mut Shard) -> Option<usize> {
        if shard.counters.len() < self.per_shard {
            return None;
        }
        loop {
            if shard.hand >= shard.counters.len() {
                shard.hand = 0;
            }
            let hand = shard.hand;
            shard.hand += 1;
            let used = shard
                .counters
                .get_index_mut(hand)
                .map(|(_, slot)| slot.take_used())?;
            if !used {
                shard.counters.swap_remove_index(hand);
                self.evictions.fetch_add(1, Ordering::Relaxed);
                self.evictions_metric.inc();
                self.keys_metric.dec();
                return Some(hand);
            }
        }
    }
}

/// Decides each hit on the state left by the hits before it, so a request naming one counter
/// twice counts it twice.
fn decide_in_order(
    hits: &[Hit],
    stored: &[Option<State>],
    now: Micros,
    charge: Charge,
) -> Vec<Transition> {
    let mut decisions: Vec<Transition> = Vec::with_capacity(hits.len());
    // The state of each hit's counter after that hit.
    let mut after: Vec<Option<State>> = Vec::with_capacity(hits.len());
    for (index, hit) in hits.iter().enumerate() {
        let earlier = (0..index).rev().find(|&before| hits[before].key == hit.key);
        let state = match earlier {
            Some(before) => after[before].clone(),
            None => stored[index].clone(),
        };
        let decision = algorithm::decide(&hit.params, state.as_ref(), now, hit.hits, charge);
        after.push(decision.state.clone().or(state));
        decisions.push(decision);
    }
    decisions
}

/// Outcomes of a vetoed request: denied hits as decided, allowed hits re-read as a check
/// (0 hits) on their unchanged counters, since nothing was consumed.
fn unconsumed_outcomes(
    hits: &[Hit],
    stored: &[Option<State>],
    decisions: &[Transition],
    now: Micros,
) -> Vec<Outcome> {
    hits.iter()
        .zip(stored)
        .zip(decisions)
        .map(|((hit, state), decision)| {
            if decision.outcome.allowed {
                algorithm::decide(&hit.params, state.as_ref(), now, 0, Charge::IfAllowed).outcome
            } else {
                decision.outcome
            }
        })
        .collect()
}

/// A shard's map is consistent after any panic (slots are replaced whole), so a poisoned lock
/// is safe to keep using.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[tonic::async_trait]
impl CounterStore for MemoryStore {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        Ok(self.apply_with(hits, || self.clock.now()))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn forget(&self, hits: &[Hit]) -> Result<(), StoreError> {
        for hit in hits {
            let digest = self.digest(&hit.key);
            let mut shard = lock(&self.shards[Self::shard_of(digest)]);
            if shard.counters.swap_remove(&digest).is_some() {
                self.keys_metric.dec();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Params};
    use crate::clock::{MICROS_PER_SECOND, ManualClock};
    use crate::storage::Role;
    use crate::storage::keys::{EntryValue, counter_key};

    fn hit(user: &str, requests: u64, hits: u64, role: Role) -> Hit {
        let params = Params {
            algorithm: Algorithm::default(),
            requests,
            window: 60 * MICROS_PER_SECOND,
        };
        Hit {
            descriptor: 0,
            key: counter_key("d", [("user", EntryValue::Actual(user))], &params),
            params,
            hits,
            role,
        }
    }

    impl MemoryStore {
        /// Decides `hits` at `now`, each hit its own descriptor of one request.
        fn apply_now(&self, hits: &[Hit], now: Micros) -> Vec<Outcome> {
            let numbered: Vec<Hit> = hits
                .iter()
                .enumerate()
                .map(|(descriptor, hit)| Hit {
                    descriptor,
                    ..hit.clone()
                })
                .collect();
            self.apply_with(&numbered, || now)
        }
    }

    fn store(max_keys: usize, charge: Charge) -> (MemoryStore, ManualClock) {
        let clock = ManualClock::at_seconds(1_000_020);
        (
            MemoryStore::new(max_keys, charge, Arc::new(clock.clone())),
            clock,
        )
    }

    fn remaining(outcomes: &[Outcome]) -> Vec<(bool, u64)> {
        outcomes.iter().map(|o| (o.allowed, o.remaining)).collect()
    }

    #[test]
    fn a_vetoed_request_consumes_nothing_anywhere() {
        let (store, clock) = store(100, Charge::IfAllowed);
        let now = clock.now();
        let first = store.apply_now(
            &[
                hit("a", 5, 1, Role::Enforced),
                hit("b", 1, 1, Role::Enforced),
            ],
            now,
        );
        assert_eq!(remaining(&first), [(true, 4), (true, 0)]);
        let vetoed = store.apply_now(
            &[
                hit("a", 5, 1, Role::Enforced),
                hit("b", 1, 1, Role::Enforced),
            ],
            now,
        );
        assert_eq!(remaining(&vetoed), [(true, 4), (false, 0)]);
        let after = store.apply_now(&[hit("a", 5, 1, Role::Enforced)], now);
        assert_eq!(remaining(&after), [(true, 3)]);
    }

    #[test]
    fn count_denied_consumes_on_every_descriptor() {
        let (store, clock) = store(100, Charge::Always);
        let now = clock.now();
        store.apply_now(&[hit("b", 1, 1, Role::Enforced)], now);
        let vetoed = store.apply_now(
            &[
                hit("a", 5, 1, Role::Enforced),
                hit("b", 1, 1, Role::Enforced),
            ],
            now,
        );
        assert_eq!(remaining(&vetoed), [(true, 4), (false, 0)]);
        let after = store.apply_now(&[hit("a", 5, 1, Role::Enforced)], now);
        assert_eq!(remaining(&after), [(true, 3)]);
    }

    #[test]
    fn shadow_denials_do_not_veto_and_quota_vetoes_only_when_all_quota_is_over() {
        let (store, clock) = store(100, Charge::IfAllowed);
        let now = clock.now();
        store.apply_now(&[hit("s", 0, 1, Role::Shadow)], now);
        let shadowed = store.apply_now(
            &[hit("a", 5, 1, Role::Enforced), hit("s", 0, 1, Role::Shadow)],
            now,
        );
        assert_eq!(remaining(&shadowed), [(true, 4), (false, 0)]);
        let one_quota_over = store.apply_now(
            &[
                hit("a", 5, 1, Role::Enforced),
                hit("q1", 0, 1, Role::Quota),
                hit("q2", 5, 1, Role::Quota),
            ],
            now,
        );
        assert_eq!(
            remaining(&one_quota_over),
            [(true, 3), (false, 0), (true, 4)]
        );
        let all_quota_over = store.apply_now(
            &[hit("a", 5, 1, Role::Enforced), hit("q1", 0, 1, Role::Quota)],
            now,
        );
        assert_eq!(remaining(&all_quota_over), [(true, 3), (false, 0)]);
    }

    #[test]
    fn the_same_counter_twice_in_one_request_counts_twice() {
        let (store, clock) = store(100, Charge::IfAllowed);
        let outcomes = store.apply_now(
            &[
                hit("a", 2, 1, Role::Enforced),
                hit("a", 2, 1, Role::Enforced),
            ],
            clock.now(),
        );
        assert_eq!(remaining(&outcomes), [(true, 1), (true, 0)]);
    }

    #[test]
    fn least_recently_used_counters_are_evicted_beyond_the_bound() {
        let (store, clock) = store(SHARDS, Charge::IfAllowed);
        for user in 0..1_000 {
            store.apply_now(&[hit(&user.to_string(), 5, 1, Role::Enforced)], clock.now());
        }
        assert!(store.len() <= SHARDS, "{}", store.len());
        assert_eq!(store.evictions(), 1_000 - store.len() as u64);
    }

    #[test]
    fn a_counter_in_use_outlives_unused_ones_when_evicting() {
        // Room for 8 counters per shard; one counter is used between every two arrivals.
        let (store, clock) = store(8 * SHARDS, Charge::IfAllowed);
        let kept = hit("kept", 5_000, 1, Role::Enforced);
        for user in 0..2_000 {
            store.apply_now(std::slice::from_ref(&kept), clock.now());
            store.apply_now(&[hit(&user.to_string(), 5, 1, Role::Enforced)], clock.now());
        }
        let last = store.apply_now(std::slice::from_ref(&kept), clock.now());
        // Never evicted: all 2,001 of its hits are still counted.
        assert_eq!(remaining(&last), [(true, 5_000 - 2_001)]);
        assert_eq!(store.evictions(), 2_001 - store.len() as u64);
        assert!(store.len() <= 8 * SHARDS);
    }

    #[test]
    fn eviction_takes_the_oldest_unused_counter_never_the_one_just_added() {
        let (store, clock) = store(4 * SHARDS, Charge::IfAllowed);
        let mut shard = Shard::default();
        let state = State::FixedWindow(algorithm::fixed_window::State::default());
        let slot = || Slot::new(state.clone(), clock.now() + 60 * MICROS_PER_SECOND);
        let digest = |n: u64| Digest(n, n);
        for n in 0..4 {
            store.store(&mut shard, digest(n), slot());
        }
        // A full shard: each new counter takes the place of the oldest unused one, behind the
        // hand, so the counters added since wait their turn.
        store.store(&mut shard, digest(4), slot());
        store.store(&mut shard, digest(5), slot());
        store.store(&mut shard, digest(6), slot());
        let mut held: Vec<u64> = shard.counters.keys().map(|digest| digest.0).collect();
        held.sort_unstable();
        assert_eq!(held, [3, 4, 5, 6]);
        // A use protects a counter the hand reaches: 3 is next in line, unless used.
        if let Some(slot) = shard.counters.get_mut(&digest(3)) {
            slot.mark_used();
        }
        store.store(&mut shard, digest(7), slot());
        assert!(shard.counters.contains_key(&digest(3)));
        assert_eq!(shard.counters.len(), 4);
        assert_eq!(store.evictions(), 4);
    }

    #[test]
    fn sweep_removes_expired_counters_only() {
        let metrics = Metrics::default();
        let (store, clock) = store(100, Charge::IfAllowed);
        let store = store.with_metrics(&metrics);
        store.apply_now(&[hit("a", 5, 1, Role::Enforced)], clock.now());
        // "a" lives until the end of its minute, "b" until the end of the next one.
        clock.advance(61 * MICROS_PER_SECOND);
        store.apply_now(&[hit("b", 5, 1, Role::Enforced)], clock.now());
        assert_eq!(metrics.memory_keys.get(), 2);
        clock.advance(30 * MICROS_PER_SECOND);
        store.sweep();
        assert_eq!(store.len(), 1);
        assert_eq!(metrics.memory_keys.get(), 1);
        // The survivor is the later counter, with its hit still counted.
        let b = store.apply_now(&[hit("b", 5, 1, Role::Enforced)], clock.now());
        assert_eq!(remaining(&b), [(true, 3)]);
        clock.advance(30 * MICROS_PER_SECOND);
        store.sweep();
        assert_eq!(store.len(), 0);
        assert_eq!(metrics.memory_keys.get(), 0);
    }
}
