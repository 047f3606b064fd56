//! The stores' metrics: remote calls' duration and failures, the deny cache's answers and the
//! denied hits it deferred, the memory store's counters and evictions.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::counters::Labels;

pub struct StoreMetrics {
    /// `tollgate_store_duration_seconds`: one call to a remote store.
    pub seconds: Histogram,
    /// `tollgate_store_errors_total{kind}`.
    pub errors: Family<Labels, Counter>,
    pub deny_cache_hits: Counter,
    /// `tollgate_deferred_hits_total`: denied hits that count, answered by the deny cache and
    /// counted in the store later (`storage::deferred`).
    pub deferred_hits: Counter,
    /// `tollgate_deferred_hits_lost_total`: of those, the hits whose count failed.
    pub deferred_hits_lost: Counter,
    pub memory_keys: Gauge,
    pub memory_evictions: Counter,
    pub memory_refusals: Counter,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self {
            // 10 µs to ~5 s.
            seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 20)),
            errors: Family::default(),
            deny_cache_hits: Counter::default(),
            deferred_hits: Counter::default(),
            deferred_hits_lost: Counter::default(),
            memory_keys: Gauge::default(),
            memory_evictions: Counter::default(),
            memory_refusals: Counter::default(),
        }
    }
}

impl StoreMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_duration_seconds",
            "Time of one call to a remote store (Redis, Redis Cluster)",
            self.seconds.clone(),
        );
        registry.register(
            "store_errors",
            "Failed store calls by kind",
            self.errors.clone(),
        );
        registry.register(
            "deny_cache_hits",
            "Requests answered by the local deny cache",
            self.deny_cache_hits.clone(),
        );
        registry.register(
            "deferred_hits",
            "Denied hits that count (usage, --count-denied) answered by the deny cache, counted in the store in batches",
            self.deferred_hits.clone(),
        );
        registry.register(
            "deferred_hits_lost",
            "Deferred hits whose count in the store failed",
            self.deferred_hits_lost.clone(),
        );
        registry.register(
            "memory_keys",
            "Counters held by the memory store",
            self.memory_keys.clone(),
        );
        registry.register(
            "memory_evictions",
            "Live counters the memory store evicted to stay within --memory-max-keys (--memory-when-full evict-least-recent)",
            self.memory_evictions.clone(),
        );
        registry.register(
            "memory_refusals",
            "New counters the memory store refused, every counter it held being live (--memory-when-full refuse)",
            self.memory_refusals.clone(),
        );
    }
}
