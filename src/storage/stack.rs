//! The store as served: which store (`--store`, `--store-per-second`), and around a remote
//! one the layers that make it safe to call on every request: the deny cache in front of the
//! timeout and circuit breaker (`guard`), so that cached denials neither reset the breaker nor
//! wait for it, with the denied hits that count deferred to the store beside it
//! (`deferred`); in front of both, the leases of busy counters (`lease`). Beside the
//! decision path, the reset (which forgets the deny cache's denials too), the demand sharing
//! of RLQS and what shutdown gives back and counts, each built here for what it reaches
//! (`Store`).

use std::sync::Arc;

use super::deferred::Deferred;
use super::lease::{LeaseSettings, Leased};
use super::options::LeaseMode;
use super::options::{StoreOptions, StoreSpec};
use super::redis::RedisStore;
use super::redis::per_second::PerSecondSplit;
use super::{
    CountLater, CounterLease, CounterReset, CounterStore, DecideAtOnce, DemandShare, Flush,
    HeldLeases, Hit, Store, StoreError, deny_cache, guard, memory,
};
use crate::clock::{Clock, SystemClock};
use crate::metrics::Metrics;

/// Builds the store for `spec`. Must run inside a tokio runtime (the memory store sweeps
/// expired counters in a background task; Redis is connected to in the background).
pub fn build_store(spec: &StoreSpec, options: &StoreOptions, metrics: &Metrics) -> Store {
    let clock = local_clock(options);
    match spec {
        StoreSpec::Memory => Store::in_process(
            memory::MemoryStore::new(options.memory_max_keys, clock)
                .with_when_full(options.memory_when_full)
                .with_metrics(metrics)
                .start(),
        ),
        StoreSpec::Redis(spec) => {
            let store = RedisStore::start(spec.clone(), options.clone());
            remote_stack(store, options, metrics)
        }
        StoreSpec::RedisPerSecond(main, per_second) => {
            let split = PerSecondSplit::new(
                RedisStore::start(main.clone(), options.clone()),
                RedisStore::start(per_second.clone(), options.clone()),
            );
            remote_stack(Arc::new(split), options, metrics)
        }
    }
}

/// A remote store wrapped as served (see the module docs).
pub fn remote_stack<S>(store: Arc<S>, options: &StoreOptions, metrics: &Metrics) -> Store
where
    S: CounterStore + CounterReset + DemandShare + CounterLease + CountLater,
{
    let guarded: Arc<dyn CounterStore> = Arc::new(guard::Guarded::new(
        Arc::clone(&store) as Arc<dyn CounterStore>,
        options.call_bounds(),
        metrics.store.seconds.clone(),
    ));
    let deferred = (options.deny_cache_size > 0).then(|| {
        let late = Arc::clone(&store) as Arc<dyn CountLater>;
        Deferred::start(late, options.timeout, metrics)
    });
    let cache = deferred.as_ref().map(|deferred| {
        Arc::new(
            deny_cache::DenyCached::new(
                guarded.clone(),
                options.deny_cache_size,
                micros(options.deny_cache_max_ttl),
                local_clock(options),
            )
            .with_metrics(metrics)
            .deferring_to(Arc::clone(deferred)),
        )
    });
    let per_request = match &cache {
        Some(cache) => Arc::clone(cache) as Arc<dyn CounterStore>,
        None => guarded,
    };
    // A slice lives --deny-cache-max-ttl, which at 0 leaves nothing to answer from.
    let leasing = !options.deny_cache_max_ttl.is_zero();
    let leases = leasing.then(|| {
        let settings = LeaseSettings {
            by_default: options.lease == LeaseMode::Auto,
            busy_rate: options.lease_busy_rate,
            slice_life: micros(options.deny_cache_max_ttl),
        };
        let lender = Arc::clone(&store) as Arc<dyn CounterLease>;
        Leased::new(per_request.clone(), lender, settings, metrics)
    });
    let counters = match &leases {
        Some(leases) => Arc::clone(leases) as Arc<dyn CounterStore>,
        None => per_request,
    };
    Store {
        counters,
        reset: Arc::new(Reset {
            cache,
            leases: leases.clone(),
            store: Arc::clone(&store) as Arc<dyn CounterReset>,
        }),
        demand: Some(store),
        at_once: leases.clone().map(|leases| leases as Arc<dyn DecideAtOnce>),
        leases: leases.map(|leases| leases as Arc<dyn HeldLeases>),
        deferred: deferred.map(|deferred| deferred as Arc<dyn Flush>),
    }
}

/// The reset of a remote store: this replica's deny cache forgets the counters first, and
/// its leases their slices (it then answers from the store at once; other replicas within
/// their caches' longest time to trust a denial, which is also a slice's longest life), then
/// the store does.
struct Reset {
    cache: Option<Arc<deny_cache::DenyCached>>,
    leases: Option<Arc<Leased>>,
    store: Arc<dyn CounterReset>,
}

#[tonic::async_trait]
impl CounterReset for Reset {
    async fn forget(&self, hits: &[Hit]) -> Result<(), StoreError> {
        if let Some(cache) = &self.cache {
            cache.forget_denials(hits);
        }
        if let Some(leases) = &self.leases {
            leases.forget(hits);
        }
        let forgotten = self.store.forget(hits).await;
        // Again: a lease that landed between the two is not used either.
        if let Some(leases) = &self.leases {
            leases.forget(hits);
        }
        forgotten
    }
}

fn micros(duration: std::time::Duration) -> crate::clock::Micros {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The clock of state kept in this process.
fn local_clock(options: &StoreOptions) -> Arc<dyn Clock> {
    options
        .clock
        .clone()
        .unwrap_or_else(|| Arc::new(SystemClock))
}
