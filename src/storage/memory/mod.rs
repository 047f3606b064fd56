//! The in-process store (the default): counters in a sharded map bounded by `max_keys`
//! (`memory/map.rs`), decided by the request rule (`storage::rule`).
//!
//! A request locks the shards of its counters in ascending order (so two requests cannot
//! deadlock), reads the clock, decides every hit, and writes what the rule says while holding
//! them: that is what makes a request of several descriptors atomic here. Sharding keeps
//! unrelated requests off each other's locks.

mod map;

use std::sync::{Arc, MutexGuard, Weak};
use std::time::Duration;

pub use map::WhenFull;
use map::{CounterMap, Digest, Shard, Written};

use super::{CounterReset, CounterStore, DecideAtOnce, Hit, PerHit, StoreError, rule};
use crate::algorithm::{Algorithm, Outcome, State};
use crate::clock::{Clock, Micros};
use crate::metrics::Metrics;

pub use map::SHARDS;

/// How often expired counters are removed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

pub struct MemoryStore {
    map: CounterMap,
    clock: Arc<dyn Clock>,
}

impl MemoryStore {
    /// A store of at most `max_keys` counters, refusing new ones when every counter held is
    /// live (`with_when_full` says otherwise).
    pub fn new(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            map: CounterMap::new(max_keys, WhenFull::Refuse),
            clock,
        }
    }

    /// What a full store does with a new counter.
    pub fn with_when_full(mut self, when_full: WhenFull) -> Self {
        let max_keys = self.map.max_keys();
        self.map = CounterMap::new(max_keys, when_full);
        self
    }

    /// Reports key count, evictions and refusals in `metrics`.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.map.keys_metric = metrics.store.memory_keys.clone();
        self.map.evictions_metric = metrics.store.memory_evictions.clone();
        self.map.refusals_metric = metrics.store.memory_refusals.clone();
        self
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
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters evicted to stay within `max_keys`.
    pub fn evictions(&self) -> u64 {
        self.map.evictions()
    }

    /// Removes every expired counter.
    pub fn sweep(&self) {
        self.map.sweep(self.clock.now());
    }

    /// Decides `hits` with every involved shard locked (see the module docs). The clock is
    /// read once the locks are held, and never taken back past a shard's latest instant
    /// (`Shard::at`), so a counter's state never comes from a later instant than the
    /// decision's.
    fn apply_with(
        &self,
        hits: &[Hit],
        now: impl FnOnce() -> Micros,
    ) -> Result<PerHit<Outcome>, StoreError> {
        if let [hit] = hits {
            return self
                .apply_one(hit, now)
                .map(|outcome| smallvec::smallvec![outcome]);
        }
        let digests: Vec<Digest> = hits.iter().map(|hit| self.map.digest(&hit.key)).collect();
        let shard_of_hit: Vec<usize> = digests.iter().map(|&d| CounterMap::shard_of(d)).collect();
        let mut locked: Vec<usize> = shard_of_hit.clone();
        locked.sort_unstable();
        locked.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            locked.iter().map(|&index| self.map.lock(index)).collect();
        let guard_of = |shard: usize| locked.binary_search(&shard).unwrap_or(0);
        let now = guards.iter_mut().fold(now(), |now, shard| shard.at(now));
        for shard in &mut guards {
            shard.at(now);
        }
        for (digest, &shard) in digests.iter().zip(&shard_of_hit) {
            guards[guard_of(shard)].touch(*digest);
        }
        let found: Vec<Option<&State>> = digests
            .iter()
            .zip(&shard_of_hit)
            .map(|(digest, &shard)| guards[guard_of(shard)].found(*digest, now))
            .collect();
        let decided = rule::decide(hits, &found, now, true);
        drop(found);
        // All or nothing: every new counter the request writes must have room first.
        let mut new: Vec<(usize, Digest)> = digests
            .iter()
            .zip(&shard_of_hit)
            .zip(&decided.writes)
            .filter(|((digest, shard), write)| {
                write.is_some() && !guards[guard_of(**shard)].holds(**digest)
            })
            .map(|((&digest, &shard), _)| (shard, digest))
            .collect();
        new.sort_unstable();
        new.dedup();
        for group in new.chunk_by(|a, b| a.0 == b.0) {
            let shard = &mut guards[guard_of(group[0].0)];
            if !self.map.has_room(shard, now, group.len()) {
                return Err(self.map.full());
            }
        }
        let writes = digests.iter().zip(decided.writes).zip(&shard_of_hit);
        for (((digest, write), &shard), (hit, outcome)) in
            writes.zip(hits.iter().zip(&decided.outcomes))
        {
            if let Some((state, expires_at)) = write {
                let written = Written {
                    state,
                    expires_at,
                    spare: is_spare(hit, outcome),
                };
                self.map
                    .store(&mut guards[guard_of(shard)], *digest, written);
            }
        }
        Ok(decided.outcomes)
    }

    /// `apply_with` for the common request of one counter: one lock, one map lookup (two for a
    /// new counter).
    fn apply_one(&self, hit: &Hit, now: impl FnOnce() -> Micros) -> Result<Outcome, StoreError> {
        let digest = self.map.digest(&hit.key);
        let mut shard = self.map.lock(CounterMap::shard_of(digest));
        let now = shard.at(now());
        let held = shard.use_index(digest);
        let found = held.and_then(|index| shard.found_at(index, now));
        let decided = rule::decide(std::slice::from_ref(hit), &[found], now, true);
        let outcome = decided.outcomes[0];
        if let Some(Some((state, expires_at))) = decided.writes.into_iter().next() {
            let written = Written {
                state,
                expires_at,
                spare: is_spare(hit, &outcome),
            };
            match held {
                Some(index) => self.map.replace_at(&mut shard, index, written),
                None if self.map.has_room(&mut shard, now, 1) => {
                    self.map.store(&mut shard, digest, written)
                }
                None => return Err(self.map.full()),
            }
        }
        Ok(outcome)
    }
}

/// Whether `hit`'s counter, as `outcome` leaves it, admits at least half its limit (its
/// burst, for a bucket) still: spare, which a full store may forget for a new counter.
fn is_spare(hit: &Hit, outcome: &Outcome) -> bool {
    let most = match hit.params.algorithm {
        Algorithm::TokenBucket { burst } | Algorithm::Gcra { burst } => burst,
        _ => hit.params.requests,
    };
    outcome.remaining.saturating_mul(2) >= most
}

#[tonic::async_trait]
impl CounterStore for MemoryStore {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        self.apply_with(hits, || self.clock.now())
            .map(PerHit::into_vec)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl DecideAtOnce for MemoryStore {
    fn apply_at_once(&self, hits: &[Hit]) -> Option<Result<PerHit<Outcome>, StoreError>> {
        Some(self.apply_with(hits, || self.clock.now()))
    }
}

#[tonic::async_trait]
impl CounterReset for MemoryStore {
    async fn forget(&self, hits: &[Hit]) -> Result<(), StoreError> {
        for hit in hits {
            self.map.remove(self.map.digest(&hit.key));
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
            charge: crate::algorithm::Charge::IfAllowed,
            lease: crate::limit::Lease::AsConfigured,
        }
    }

    /// `hits` as one request, each hit its own descriptor.
    fn numbered(hits: &[Hit]) -> Vec<Hit> {
        hits.iter()
            .enumerate()
            .map(|(descriptor, hit)| Hit {
                descriptor,
                ..hit.clone()
            })
            .collect()
    }

    impl MemoryStore {
        /// Decides `hits` at `now`, each hit its own descriptor of one request.
        fn apply_now(&self, hits: &[Hit], now: Micros) -> Vec<Outcome> {
            self.apply_with(&numbered(hits), || now).unwrap().into_vec()
        }
    }

    fn store(max_keys: usize) -> (MemoryStore, ManualClock) {
        let clock = ManualClock::at_seconds(1_000_020);
        (MemoryStore::new(max_keys, Arc::new(clock.clone())), clock)
    }

    fn remaining(outcomes: &[Outcome]) -> Vec<(bool, u64)> {
        outcomes.iter().map(|o| (o.allowed, o.remaining)).collect()
    }

    #[test]
    fn a_vetoed_request_consumes_nothing_anywhere() {
        let (store, clock) = store(100);
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
        let (store, clock) = store(100);
        let now = clock.now();
        let always = |user, requests| Hit {
            charge: crate::algorithm::Charge::Always,
            ..hit(user, requests, 1, Role::Enforced)
        };
        store.apply_now(&[always("b", 1)], now);
        let vetoed = store.apply_now(&[always("a", 5), always("b", 1)], now);
        assert_eq!(remaining(&vetoed), [(true, 4), (false, 0)]);
        let after = store.apply_now(&[hit("a", 5, 1, Role::Enforced)], now);
        assert_eq!(remaining(&after), [(true, 3)]);
    }

    #[test]
    fn shadow_denials_do_not_veto_and_quota_vetoes_only_when_all_quota_is_over() {
        let (store, clock) = store(100);
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
        let (store, clock) = store(100);
        let outcomes = store.apply_now(
            &[
                hit("a", 2, 1, Role::Enforced),
                hit("a", 2, 1, Role::Enforced),
            ],
            clock.now(),
        );
        assert_eq!(remaining(&outcomes), [(true, 1), (true, 0)]);
    }

    /// A store that evicts the least recently used counter when full.
    fn evicting(max_keys: usize) -> (MemoryStore, ManualClock) {
        let (store, clock) = store(max_keys);
        (store.with_when_full(WhenFull::EvictLeastRecent), clock)
    }

    #[test]
    fn least_recently_used_counters_are_evicted_beyond_the_bound() {
        let (store, clock) = evicting(SHARDS);
        for user in 0..1_000 {
            store.apply_now(&[hit(&user.to_string(), 5, 1, Role::Enforced)], clock.now());
        }
        assert!(store.len() <= SHARDS, "{}", store.len());
        assert_eq!(store.evictions(), 1_000 - store.len() as u64);
    }

    #[test]
    fn a_counter_in_use_outlives_unused_ones_when_evicting() {
        // Room for 8 counters per shard; one counter is used between every two arrivals.
        let (store, clock) = evicting(8 * SHARDS);
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
    fn a_full_store_forgets_spare_counters_for_new_ones_and_refuses_rather_than_drop_the_rest() {
        let metrics = Metrics::default();
        let (store, clock) = store(4 * SHARDS);
        let store = store.with_metrics(&metrics);
        let now = clock.now();
        // A counter near its limit (9 of 10): never forgotten while live.
        let victim = |hits| [hit("victim", 10, hits, Role::Enforced)];
        store.apply_now(&victim(9), now);
        // A flood of new keys, each spare (1 of 10): they take room from one another.
        for user in 0..10_000 {
            let new = [hit(&format!("u{user}"), 10, 1, Role::Enforced)];
            assert!(store.apply_with(&new, || now).is_ok(), "u{user}");
        }
        assert_eq!(store.len(), 4 * SHARDS);
        assert_eq!(metrics.store.memory_refusals.get(), 0);
        assert!(store.evictions() >= 10_000 - 4 * SHARDS as u64);
        assert_eq!(remaining(&store.apply_now(&victim(1), now)), [(true, 0)]);
        // New counters that are not spare (6 of 10): the spare ones go first, then they are
        // refused, the request whole.
        let mut refused = 0;
        for user in 0..1_000 {
            let new = [hit(&format!("n{user}"), 10, 6, Role::Enforced)];
            match store.apply_with(&new, || now) {
                Ok(_) => {}
                Err(StoreError::Full { max_keys }) => {
                    assert_eq!(max_keys, 4 * SHARDS);
                    refused += 1;
                }
                Err(other) => panic!("{other}"),
            }
        }
        assert!(refused > 0);
        assert_eq!(metrics.store.memory_refusals.get(), refused);
        // The victim is still over: its count survived both floods.
        assert_eq!(remaining(&store.apply_now(&victim(1), now)), [(false, 0)]);
        // Once every window has ended, new counters take their places.
        let later = now + 120 * MICROS_PER_SECOND;
        let next = [hit("newcomer", 10, 6, Role::Enforced)];
        assert!(store.apply_with(&next, || later).is_ok());
    }

    #[test]
    fn sweep_removes_expired_counters_only() {
        let metrics = Metrics::default();
        let (store, clock) = store(100);
        let store = store.with_metrics(&metrics);
        store.apply_now(&[hit("a", 5, 1, Role::Enforced)], clock.now());
        // "a" lives until the end of its minute, "b" until the end of the next one.
        clock.advance(61 * MICROS_PER_SECOND);
        store.apply_now(&[hit("b", 5, 1, Role::Enforced)], clock.now());
        assert_eq!(metrics.store.memory_keys.get(), 2);
        clock.advance(30 * MICROS_PER_SECOND);
        store.sweep();
        assert_eq!(store.len(), 1);
        assert_eq!(metrics.store.memory_keys.get(), 1);
        // The survivor is the later counter, with its hit still counted.
        let b = store.apply_now(&[hit("b", 5, 1, Role::Enforced)], clock.now());
        assert_eq!(remaining(&b), [(true, 3)]);
        clock.advance(30 * MICROS_PER_SECOND);
        store.sweep();
        assert_eq!(store.len(), 0);
        assert_eq!(metrics.store.memory_keys.get(), 0);
    }

    #[test]
    fn a_hit_from_before_a_clock_step_back_counts_in_the_window_the_memory_store_swept_at() {
        // The sweep ran at a later instant than the hit's (the clock stepped back since): the hit
        // counts in the later window, whose counter the sweep kept, not in its own window started
        // again from zero.
        let clock = ManualClock::at_seconds(1_795_000_000);
        let store = MemoryStore::new(1_000, Arc::new(clock.clone()));
        const LIMIT: u64 = 5;
        const MS: Micros = 1_000;
        let window_end = |at: Micros, outcome: &Outcome| {
            (at + outcome.reset_after).div_ceil(MICROS_PER_SECOND) * MICROS_PER_SECOND
        };
        let user = Hit {
            params: Params {
                window: MICROS_PER_SECOND,
                ..hit("stepped", LIMIT, 1, Role::Enforced).params
            },
            ..hit("stepped", LIMIT, 1, Role::Enforced)
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let decide = |at: Micros| {
            clock.set(at);
            runtime
                .block_on(store.apply(std::slice::from_ref(&user)))
                .unwrap()[0]
        };
        let edge = 1_795_000_001 * MICROS_PER_SECOND;
        for _ in 0..LIMIT {
            assert!(decide(edge - MS).allowed);
        }
        clock.set(edge + 10 * MS);
        store.sweep();
        let late = decide(edge - MS / 2);
        assert_eq!(
            (
                late.allowed,
                late.remaining,
                window_end(edge - MS / 2, &late)
            ),
            (true, LIMIT - 1, edge + MICROS_PER_SECOND),
            "counted in the next window"
        );
        let next = decide(edge + 20 * MS);
        assert_eq!((next.allowed, next.remaining), (true, LIMIT - 2));
    }
}
