//! Where counters live. One narrow trait, one call per request: `apply` decides every hit of a
//! request at once, so a remote store costs one round trip, and a request is all-or-nothing.
//!
//! All-or-nothing: a request consumes on every descriptor or on none. The request is *vetoed*
//! when an enforced hit is denied, or when it has quota hits and all of them are denied
//! (quota_mode, as the reference computes the overall code). Shadow hits never veto. When
//! vetoed, nothing is consumed and the allowed hits report their unchanged counters. With
//! `Charge::Always` (`--count-denied`) every hit consumes, as in the reference.

pub mod keys;
pub mod memory;

use std::sync::Arc;

use crate::algorithm::{Charge, Outcome, Params};
use crate::clock::SystemClock;
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
    pub key: CounterKey,
    pub params: Params,
    pub hits: u64,
    pub role: Role,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer in time or is not reachable; worth retrying.
    #[error("store unavailable: {0}")]
    Unavailable(String),
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
}

/// Builds the store for `spec`. Must run inside a tokio runtime (the memory store sweeps
/// expired counters in a background task).
pub fn build_store(spec: &StoreSpec, charge: Charge) -> Arc<dyn CounterStore> {
    match spec {
        StoreSpec::Memory { max_keys } => {
            memory::MemoryStore::new(*max_keys, charge, Arc::new(SystemClock)).start()
        }
    }
}

/// Whether the request is vetoed, given which hits were allowed (see the module docs).
pub fn vetoed(hits: &[Hit], allowed: impl Fn(usize) -> bool) -> bool {
    let mut quota_hits = 0;
    let mut quota_denied = 0;
    for (index, hit) in hits.iter().enumerate() {
        match hit.role {
            Role::Enforced if !allowed(index) => return true,
            Role::Quota => {
                quota_hits += 1;
                if !allowed(index) {
                    quota_denied += 1;
                }
            }
            Role::Enforced | Role::Shadow => {}
        }
    }
    quota_hits > 0 && quota_denied == quota_hits
}
