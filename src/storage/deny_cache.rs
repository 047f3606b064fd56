//! The local deny cache, in front of a remote store: when the store says a counter is denied
//! until some instant, later requests whose every counter is known denied are answered here,
//! without a round trip (a client hammering a limit it is over costs Redis nothing, and keeps
//! being denied while Redis is down). A denied charge that counts whether admitted or not
//! (usage, `--count-denied`) is answered here too, and counted in the store in a batch
//! (`deferred.rs`). A concurrency limit's denials are not kept: a stream ending anywhere
//! frees a hold before any time this cache could trust.
//!
//! Safe: a denial lasts at least until its `retry_after` whatever other replicas do (they can
//! only consume more), except for a give-back of a vetoed request or a client's refund on
//! another replica, which can make room early, or an operator resetting the counter in the
//! store; the cache then under-admits,
//! never over-admits. How long it can do so is bounded by `max_ttl`: a denial is answered
//! locally for at most that long before the store is asked again (`--deny-cache-max-ttl`,
//! 1 s by default, so a reset is honoured on every replica within about a second), while the
//! answer still carries the full `retry_after`; when that time is up, one call goes to the
//! store while the others are still answered here. Bounded in memory: an LRU of `capacity`
//! counters.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use lru::LruCache;
use prometheus_client::metrics::counter::Counter;

use super::deferred::Deferred;
use super::keys::CounterKey;
use super::{CounterStore, Hit, Role, StoreError};
use crate::algorithm::{Algorithm, Outcome, Params};
use crate::clock::{Clock, Micros};
use crate::metrics::Metrics;

struct Denied {
    /// The limit it was denied under (a per-request override may count the same counter
    /// against another limit).
    params: Params,
    /// Until when `need` or more hits are denied.
    until: Micros,
    /// Until when the cache answers for the store (`until`, or sooner by `max_ttl`).
    trusted_until: Micros,
    /// When the counter is fully available again.
    reset_at: Micros,
    need: u64,
    /// The room the store found (fewer than `need`), answered again as found.
    room: u64,
}

pub struct DenyCache {
    entries: Option<Mutex<LruCache<CounterKey, Denied>>>,
    /// How many counters `entries` holds, as of its last change. While none is held (no
    /// client over a limit), calls neither lock nor hash. Read without the lock, so a
    /// denial remembered at this instant may be missed once: that call asks the store.
    held: AtomicUsize,
    hits: AtomicU64,
    max_ttl: Micros,
}

impl DenyCache {
    /// A cache of at most `capacity` counters (0 turns it off), each answered locally for at
    /// most `max_ttl`.
    pub fn new(capacity: usize, max_ttl: Micros) -> Self {
        Self {
            entries: NonZeroUsize::new(capacity)
                .map(|capacity| Mutex::new(LruCache::new(capacity))),
            held: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            max_ttl,
        }
    }

    /// Requests answered from the cache.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// The outcomes of `hits` at `now` if every one of them is known denied.
    pub fn answer(&self, hits: &[Hit], now: Micros) -> Option<Vec<Outcome>> {
        let entries = self.entries.as_ref()?;
        if hits.is_empty() || self.held.load(Ordering::Acquire) == 0 {
            return None;
        }
        // A refund changes its counter: the store applies it (`remember` then forgets the
        // counter's denial, its answer being allowed).
        if hits.iter().any(|hit| hit.role == Role::Refund) {
            return None;
        }
        let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut outcomes = Vec::with_capacity(hits.len());
        let mut known = true;
        for hit in hits {
            let denied = entries.get_mut(&hit.key)?;
            if denied.params != hit.params || denied.until <= now || hit.hits.max(1) < denied.need {
                return None;
            }
            if denied.trusted_until <= now {
                // Due for a look at the store: this call goes, and the others keep being
                // answered here meanwhile (re-armed), so one call per counter asks, not every
                // call in flight. Its answer replaces or removes the entry.
                denied.trusted_until = now.saturating_add(self.max_ttl);
                known = false;
            }
            outcomes.push(Outcome {
                allowed: false,
                remaining: denied.room,
                reset_after: denied.reset_at.saturating_sub(now),
                retry_after: denied.until - now,
            });
        }
        if !known {
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(outcomes)
    }

    /// Drops what it knows of these counters.
    pub fn forget(&self, keys: &[CounterKey]) {
        let Some(entries) = &self.entries else {
            return;
        };
        let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
        for key in keys {
            entries.pop(key);
        }
        self.held.store(entries.len(), Ordering::Release);
    }

    /// Learns from a store answer: denied counters are remembered until their retry time,
    /// allowed ones forgotten. A counter named twice in the request is only forgotten: its
    /// later denial may have been decided on hits the veto then gave back.
    pub fn remember(&self, hits: &[Hit], outcomes: &[Outcome], now: Micros) {
        let Some(entries) = &self.entries else {
            return;
        };
        let all_allowed = outcomes.iter().all(|outcome| outcome.allowed);
        if all_allowed && self.held.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut repeated = HashSet::new();
        if hits.len() > 1 {
            let mut seen = HashSet::with_capacity(hits.len());
            repeated.extend(
                hits.iter()
                    .map(|hit| &hit.key)
                    .filter(|key| !seen.insert(*key)),
            );
        }
        let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
        for (hit, outcome) in hits.iter().zip(outcomes) {
            let concurrency = hit.params.algorithm == Algorithm::Concurrency;
            if outcome.allowed || repeated.contains(&hit.key) || concurrency {
                entries.pop(&hit.key);
            } else if outcome.retry_after > 0 {
                let denied = Denied {
                    params: hit.params,
                    until: now.saturating_add(outcome.retry_after),
                    trusted_until: now.saturating_add(outcome.retry_after.min(self.max_ttl)),
                    reset_at: now.saturating_add(outcome.reset_after),
                    need: hit.hits.max(1),
                    room: outcome.remaining,
                };
                entries.put(hit.key.clone(), denied);
            }
        }
        self.held.store(entries.len(), Ordering::Release);
    }
}

/// A store with a deny cache in front.
pub struct DenyCached {
    inner: Arc<dyn CounterStore>,
    cache: DenyCache,
    /// Where the denied hits that count go, answered here; `None`: such requests go to the
    /// store.
    deferred: Option<Arc<Deferred>>,
    clock: Arc<dyn Clock>,
    /// `tollgate_deny_cache_hits`.
    hits_metric: Counter,
}

impl DenyCached {
    pub fn new(
        inner: Arc<dyn CounterStore>,
        capacity: usize,
        max_ttl: Micros,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner,
            cache: DenyCache::new(capacity, max_ttl),
            deferred: None,
            clock,
            hits_metric: Counter::default(),
        }
    }

    /// Answers denied charges that count too, deferring their count to `deferred`.
    pub fn deferring_to(self, deferred: Arc<Deferred>) -> Self {
        Self {
            deferred: Some(deferred),
            ..self
        }
    }

    pub fn with_metrics(self, metrics: &Metrics) -> Self {
        Self {
            hits_metric: metrics.store.deny_cache_hits.clone(),
            ..self
        }
    }

    /// Requests answered from the cache.
    pub fn hits(&self) -> u64 {
        self.cache.hits()
    }

    /// Forgets what it knows of these counters (a reset): this replica asks the store about
    /// them at once.
    pub fn forget_denials(&self, hits: &[Hit]) {
        let keys: Vec<CounterKey> = hits.iter().map(|hit| hit.key.clone()).collect();
        self.cache.forget(&keys);
    }
}

#[tonic::async_trait]
impl CounterStore for DenyCached {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        let now = self.clock.now();
        if let Some(outcomes) = self.cache.answer(hits, now)
            && self.defer(hits)
        {
            self.hits_metric.inc();
            return Ok(outcomes);
        }
        let outcomes = self.inner.apply(hits).await?;
        self.cache.remember(hits, &outcomes, now);
        Ok(outcomes)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

impl DenyCached {
    /// Whether a request answered here has nothing left to count in the store, or has
    /// deferred it: its denied charges that count are added to the next batch.
    fn defer(&self, hits: &[Hit]) -> bool {
        use crate::algorithm::Charge;
        let counts = |hit: &Hit| hit.charge == Charge::Always && hit.hits > 0;
        if !hits.iter().any(counts) {
            return true;
        }
        self.deferred
            .as_ref()
            .is_some_and(|deferred| deferred.defer(hits).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::storage::Role;
    use crate::storage::keys::{EntryValue, counter_key};

    fn hit(user: &str, hits: u64) -> Hit {
        let params = Params {
            algorithm: Algorithm::default(),
            requests: 10,
            window: 60_000_000,
        };
        Hit {
            descriptor: 0,
            key: counter_key("d", [("user", EntryValue::Actual(user))], &params),
            params,
            hits,
            role: Role::Enforced,
            charge: crate::algorithm::Charge::IfAllowed,
            lease: crate::limit::Lease::AsConfigured,
        }
    }

    fn denied(retry_after: Micros) -> Outcome {
        Outcome {
            allowed: false,
            remaining: 0,
            reset_after: 60_000_000,
            retry_after,
        }
    }

    #[test]
    fn a_known_denial_is_answered_until_its_retry_time_for_as_many_hits_or_more() {
        let cache = DenyCache::new(10, Micros::MAX);
        cache.remember(&[hit("a", 2)], &[denied(5_000_000)], 1_000);
        let answer = cache.answer(&[hit("a", 2)], 2_000).unwrap();
        assert_eq!(answer[0].retry_after, 4_999_000);
        assert!(
            cache.answer(&[hit("a", 1)], 2_000).is_none(),
            "fewer hits may pass"
        );
        assert!(cache.answer(&[hit("a", 2)], 5_001_000).is_none(), "expired");
        assert!(
            cache.answer(&[hit("a", 2), hit("b", 1)], 2_000).is_none(),
            "b unknown"
        );
        assert_eq!(cache.hits(), 1);
    }

    #[test]
    fn a_denial_is_answered_locally_for_at_most_the_max_ttl_with_its_full_retry_time() {
        let cache = DenyCache::new(10, 1_000_000);
        cache.remember(&[hit("a", 1)], &[denied(3_600_000_000)], 0);
        let answer = cache.answer(&[hit("a", 1)], 999_999).unwrap();
        assert_eq!(answer[0].retry_after, 3_600_000_000 - 999_999);
        assert!(
            cache.answer(&[hit("a", 1)], 1_000_000).is_none(),
            "past the max TTL the store is asked again (a reset there is honoured)"
        );
        assert!(
            cache.answer(&[hit("a", 1)], 1_000_001).is_some(),
            "by one call: the others in flight meanwhile are still answered here"
        );
        assert!(
            cache.answer(&[hit("a", 1)], 2_000_000).is_none(),
            "and again a second later"
        );
    }

    #[test]
    fn a_counter_named_twice_is_never_cached() {
        let cache = DenyCache::new(10, Micros::MAX);
        let allowed = Outcome {
            allowed: true,
            ..Outcome::default()
        };
        cache.remember(
            &[hit("a", 3), hit("a", 3)],
            &[allowed, denied(60_000_000)],
            0,
        );
        assert!(cache.answer(&[hit("a", 3)], 1).is_none());
    }

    #[test]
    fn size_zero_is_off() {
        let cache = DenyCache::new(0, Micros::MAX);
        cache.remember(&[hit("a", 1)], &[denied(1_000)], 0);
        assert!(cache.answer(&[hit("a", 1)], 1).is_none());
    }
}
