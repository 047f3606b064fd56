//! The store as served: which store (`--store`, `--store-per-second`), and around a remote one the layers that make
//! it safe to call on every request: the deny cache in front of the timeout and circuit
//! breaker (`guard`), so that cached denials neither reset the breaker nor wait for it.

use std::sync::Arc;

use super::redis::per_second::PerSecondSplit;
use super::redis::{RedisSpec, RedisStore};
use super::{CounterStore, StoreOptions, deny_cache, guard, memory};
use crate::algorithm::Charge;
use crate::clock::{Clock, SystemClock};
use crate::metrics::Metrics;

/// Which store to build, from `--store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    Memory,
    Redis(RedisSpec),
    /// Per-second limits in the second Redis (`--store-per-second`), the others in the first.
    RedisPerSecond(RedisSpec, RedisSpec),
}

/// Builds the store for `spec`. Must run inside a tokio runtime (the memory store sweeps
/// expired counters in a background task; Redis is connected to in the background).
pub fn build_store(
    spec: &StoreSpec,
    options: &StoreOptions,
    metrics: &Metrics,
) -> Arc<dyn CounterStore> {
    let clock = local_clock(options);
    match spec {
        StoreSpec::Memory => {
            memory::MemoryStore::new(options.memory_max_keys, options.charge, clock)
                .with_metrics(metrics)
                .start()
        }
        StoreSpec::Redis(spec) => {
            let store = RedisStore::start(spec.clone(), options.clone());
            remote_stack(store, options, metrics)
        }
        StoreSpec::RedisPerSecond(main, per_second) => {
            let split = PerSecondSplit::new(
                RedisStore::start(main.clone(), options.clone()),
                RedisStore::start(per_second.clone(), options.clone()),
                options.charge,
            );
            remote_stack(Arc::new(split), options, metrics)
        }
    }
}

/// A remote store wrapped as served (see the module docs).
pub fn remote_stack(
    store: Arc<dyn CounterStore>,
    options: &StoreOptions,
    metrics: &Metrics,
) -> Arc<dyn CounterStore> {
    let guarded: Arc<dyn CounterStore> = Arc::new(guard::Guarded::new(
        store,
        options.timeout,
        metrics.store_seconds.clone(),
    ));
    if options.charge == Charge::IfAllowed && options.deny_cache_size > 0 {
        Arc::new(
            deny_cache::DenyCached::new(
                guarded,
                options.deny_cache_size,
                micros(options.deny_cache_max_ttl),
                local_clock(options),
            )
            .with_metrics(metrics),
        )
    } else {
        guarded
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
