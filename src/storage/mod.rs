//! Where counters live. One narrow trait, one call per request: `apply` decides every hit of a
//! request at once, so a remote store costs one round trip, and a request is all-or-nothing.
//!
//! All-or-nothing: a request consumes on every descriptor or on none. The request is *vetoed*
//! when an enforced descriptor is over, or when it has quota descriptors and all of them are
//! over (quota_mode, as the reference computes the overall code); see `rejects`. Shadow hits
//! never veto. When
//! vetoed, nothing is consumed and the allowed hits report their unchanged counters. With
//! `Charge::Always` (`--count-denied`) every hit consumes, as in the reference.

pub mod deny_cache;
pub mod guard;
pub mod keys;
pub mod memory;
pub mod redis;
pub mod script;
pub mod slots;

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Charge, Outcome, Params};
use crate::clock::SystemClock;
use crate::metrics::Metrics;
use keys::CounterKey;

/// How a hit's denial affects the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A denial vetoes the request.
    Enforced,
    /// `quota_mode`: vetoes only when every quota hit of the request is denied.
    Quota,
    /// `shadow_mode` (or global shadow mode): counted, never vetoes.
    Shadow,
}

/// One counter to decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Which descriptor of the request this hit counts for; a descriptor's hits are adjacent.
    pub descriptor: usize,
    pub key: CounterKey,
    pub params: Params,
    pub hits: u64,
    pub role: Role,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store is not reachable or answered an error; worth retrying.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// No answer within the store timeout.
    #[error("no answer from the store within {0:?}")]
    Timeout(std::time::Duration),
    /// The circuit breaker is open: the store failed repeatedly and is not asked for now.
    #[error("store unavailable: circuit breaker open")]
    CircuitOpen,
}

impl StoreError {
    /// A short name for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Timeout(_) => "timeout",
            StoreError::CircuitOpen => "circuit_open",
        }
    }
}

/// A counter store.
#[tonic::async_trait]
pub trait CounterStore: Send + Sync + 'static {
    /// Decides every hit of one request; outcomes are in the order of `hits`.
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError>;

    /// Answers when the store can serve; drives readiness.
    async fn ping(&self) -> Result<(), StoreError>;
}

/// Which store to build, from `--store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    Memory { max_keys: usize },
    Redis(redis::RedisSpec),
}

/// Behaviour common to the stores, from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    pub charge: Charge,
    /// Bound on one call to a remote store.
    pub timeout: Duration,
    /// Counters the local deny cache of a remote store remembers (0: off).
    pub deny_cache_size: usize,
    /// Connections to Redis (per node, on a cluster).
    pub redis_connections: usize,
    /// Serving runtimes; each beyond the first gets its own Redis connection.
    pub runtimes: usize,
}

/// Builds the store for `spec`. Must run inside a tokio runtime (the memory store sweeps
/// expired counters in a background task; Redis is connected to in the background).
pub fn build_store(
    spec: &StoreSpec,
    options: StoreOptions,
    metrics: &Metrics,
) -> Arc<dyn CounterStore> {
    match spec {
        StoreSpec::Memory { max_keys } => {
            memory::MemoryStore::new(*max_keys, options.charge, Arc::new(SystemClock))
                .with_metrics(metrics)
                .start()
        }
        StoreSpec::Redis(spec) => {
            let store = redis::RedisStore::start(
                spec.clone(),
                redis::RedisOptions {
                    charge: options.charge,
                    timeout: options.timeout,
                    clock: None,
                    connections: options.redis_connections,
                    runtimes: options.runtimes,
                    slot_map_refresh: redis::SLOT_MAP_REFRESH,
                },
            );
            remote_stack(store, options, Arc::new(SystemClock), metrics)
        }
    }
}

/// A remote store as served: the deny cache (default charge only) in front of the store
/// timeout and circuit breaker, so that cached denials neither reset the breaker nor wait
/// for it.
pub fn remote_stack(
    store: Arc<dyn CounterStore>,
    options: StoreOptions,
    clock: Arc<dyn crate::clock::Clock>,
    metrics: &Metrics,
) -> Arc<dyn CounterStore> {
    let guarded: Arc<dyn CounterStore> = Arc::new(guard::Guarded::new(
        store,
        options.timeout,
        metrics.store_seconds.clone(),
    ));
    if options.charge == Charge::IfAllowed && options.deny_cache_size > 0 {
        Arc::new(
            deny_cache::DenyCached::new(guarded, options.deny_cache_size, clock)
                .with_metrics(metrics),
        )
    } else {
        guarded
    }
}

/// Whether a request is rejected, given each limited descriptor's role and whether it is
/// over: an enforced descriptor over, or every quota descriptor over (there being one). Both
/// the store's veto and the limiter's overall code use this one rule, so what is consumed and
/// what is answered always agree.
pub fn rejects(descriptors: impl IntoIterator<Item = (Role, bool)>) -> bool {
    let mut quota = 0;
    let mut quota_over = 0;
    for (role, over) in descriptors {
        match role {
            Role::Enforced if over => return true,
            Role::Quota => {
                quota += 1;
                quota_over += usize::from(over);
            }
            Role::Enforced | Role::Shadow => {}
        }
    }
    quota > 0 && quota_over == quota
}

/// Whether the request is vetoed, given which hits were allowed: a descriptor is over when
/// any of its hits (one per limit) is denied.
pub fn vetoed(hits: &[Hit], allowed: impl Fn(usize) -> bool) -> bool {
    let descriptors = hits.chunk_by(|a, b| a.descriptor == b.descriptor);
    let mut first = 0;
    rejects(descriptors.map(|group| {
        let over = (first..first + group.len()).any(|index| !allowed(index));
        first += group.len();
        (group[0].role, over)
    }))
}
