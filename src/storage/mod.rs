//! Where counters live. One narrow trait, one call per request: `apply` decides every hit of a
//! request at once, so a remote store costs one round trip, and a request is all-or-nothing.
//!
//! All-or-nothing: a request consumes on every descriptor or on none. The request is *vetoed*
//! when an enforced descriptor is over, or when it has quota descriptors and all of them are
//! over (quota_mode, as the reference computes the overall code); see `rejects`. Shadow hits
//! never veto. When vetoed, nothing is consumed and the allowed hits report their unchanged
//! counters, except the hits whose charge is `Charge::Always` (usage, `--count-denied`):
//! those consume, admitted or not, as the reference counts every hit.
//!
//! This file is the vocabulary every store shares; `rule.rs` is the request rule every store
//! applies; `stack.rs` builds the store as served.

pub mod deferred;
pub mod deny_cache;
pub mod guard;
pub mod keys;
pub mod lease;
pub mod memory;
pub mod options;
pub mod redis;
pub mod rule;
pub mod stack;

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Charge, Outcome, Params, State};
use crate::clock::Micros;
use crate::limit::Lease;
use keys::CounterKey;

/// One item per hit, held inline for the common request of one hit.
pub type PerHit<T> = smallvec::SmallVec<[T; 1]>;

/// How a hit's denial affects the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A denial vetoes the request.
    Enforced,
    /// `quota_mode`: vetoes only when every quota hit of the request is denied.
    Quota,
    /// `shadow_mode` (or global shadow mode): counted, never vetoes.
    Shadow,
    /// Envoy's `is_negative_hits`: the hits go back to the counter (`algorithm::refund`),
    /// whatever the rule's mode; never vetoes, and is applied even when the request is
    /// vetoed by its charges.
    Refund,
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
    /// Whether it consumes when denied or vetoed (usage reported after the fact, or
    /// `--count-denied`), or only when the request is admitted. A refund's is `IfAllowed`.
    pub charge: Charge,
    /// Its rule's `lease` (`lease.rs`).
    pub lease: Lease,
}

/// The cause of a store failure, kept for logs (`{:#}` shows it) and for `source()`.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Not reachable or not ready: refused, dropped, not connected yet, a cluster down or
    /// reconfiguring.
    #[error("store unavailable: {0}")]
    Unavailable(#[source] Cause),
    /// No answer within the store timeout (or the client's deadline).
    #[error("no answer from the store within {0:?}")]
    Timeout(Duration),
    /// A counter's slot is moving between Redis Cluster nodes (MOVED, ASK or TRYAGAIN still
    /// answered after the call was sent again): the trouble of that slot's keys alone, which
    /// neither the circuit breaker nor readiness count.
    #[error("store slot moving: {0}")]
    Moving(#[source] Cause),
    /// The circuit breaker is open: the store failed repeatedly and is not asked for now.
    #[error("store unavailable: circuit breaker open")]
    CircuitOpen,
    /// The store is a replica, which refuses writes: the connection leads to a master that
    /// was demoted (an address repointed at a failover). Fresh connections are made
    /// (`--redis-reconnect-on-readonly`).
    #[error("store is read-only (a replica): {0}")]
    ReadOnly(#[source] Cause),
    /// Calls have failed for longer than `--store-stuck-after` while Redis accepts fresh
    /// connections: this replica's client cannot recover by itself (liveness fails).
    #[error("store client stuck: {0}")]
    Stuck(String),
    /// The store answered with an error that retrying does not change: a wrong password, a
    /// refused command, a failing script.
    #[error("store refused the call: {0}")]
    Refused(#[source] Cause),
    /// The store answered something tollgate cannot read.
    #[error("malformed reply from the store: {0}")]
    MalformedReply(String),
    /// The memory store holds `--memory-max-keys` counters, every one within its window,
    /// and refuses new ones (`--memory-when-full refuse`).
    #[error("memory store full: {max_keys} counters, all live (--memory-max-keys)")]
    Full { max_keys: usize },
}

impl StoreError {
    /// A short name for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Timeout(_) => "timeout",
            StoreError::Moving(_) => "moving",
            StoreError::CircuitOpen => "circuit_open",
            StoreError::ReadOnly(_) => "read_only",
            StoreError::Stuck(_) => "stuck",
            StoreError::Refused(_) => "refused",
            StoreError::MalformedReply(_) => "malformed_reply",
            StoreError::Full { .. } => "full",
        }
    }

    /// Whether the same call may succeed later without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unavailable(_)
            | StoreError::Timeout(_)
            | StoreError::Moving(_)
            | StoreError::CircuitOpen
            | StoreError::ReadOnly(_) => true,
            StoreError::Stuck(_)
            | StoreError::Refused(_)
            | StoreError::MalformedReply(_)
            | StoreError::Full { .. } => false,
        }
    }

    /// Whether the failure is the whole store's, which the circuit breaker and readiness
    /// count: not one moving slot's.
    pub fn is_store_wide(&self) -> bool {
        !matches!(self, StoreError::Moving(_))
    }

    /// Unavailable, for a cause given as text.
    pub fn unavailable(cause: impl Into<String>) -> Self {
        StoreError::Unavailable(cause.into().into())
    }
}

/// A counter store: what the decision path needs, and nothing else.
#[tonic::async_trait]
pub trait CounterStore: Send + Sync + 'static {
    /// Decides every hit of one request; outcomes are in the order of `hits`.
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError>;

    /// Answers when the store can serve; drives readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// A call of `apply` or `ping` was dropped unanswered after `error` (its caller's bound
    /// passed): a store that learns from its failures learns from this one too, which it
    /// never saw end.
    fn gave_up(&self, _error: &StoreError) {}
}

/// Deciding without a future: a store in process decides every request so, a leasing store
/// the requests its replica's slices can answer (`RateLimiter::decide`).
pub trait DecideAtOnce: Send + Sync + 'static {
    /// What `CounterStore::apply` decides, made now; `None` when it cannot be made without
    /// waiting, with nothing done: `apply` then decides the hits as if this was never asked.
    fn apply_at_once(&self, hits: &[Hit]) -> Option<Result<PerHit<Outcome>, StoreError>>;
}

/// The clock of a store shared by replicas, which leases and deferred counts go by.
pub trait StoreClock: Send + Sync + 'static {
    /// The instant the store of `hit`'s counter decides at right now (Redis's clock, as this
    /// replica tracks it).
    fn instant(&self, hit: &Hit) -> Result<Micros, StoreError>;
}

/// Counting hits at an instant that has passed: the denied hits that count, which the deny
/// cache answered and defers (`deferred.rs`), counted at the instants they were denied.
#[tonic::async_trait]
pub trait CountLater: StoreClock {
    /// Decides `hits` at `at`, an instant of their store's clock (one counter's: a deferred
    /// count sends one), as `CounterStore::apply` decides at now.
    async fn apply_at(&self, hits: &[Hit], at: Micros) -> Result<Vec<Outcome>, StoreError>;
}

/// What this replica answered for the store and has still to count there, counted at once
/// (graceful shutdown).
#[tonic::async_trait]
pub trait Flush: Send + Sync + 'static {
    async fn flush_all(&self);
}

/// Forgetting counters: an operator's reset (`POST /reset`), off the request path.
#[tonic::async_trait]
pub trait CounterReset: Send + Sync + 'static {
    /// Forgets these counters: they start afresh.
    async fn forget(&self, hits: &[Hit]) -> Result<(), StoreError>;
}

/// Leasing a busy counter's budget (`lease.rs`): a store shared by replicas grants this
/// replica part of a fixed window's budget, counted as hits, or of a bucket's, for a slice's
/// life (`algorithm::leased`), which it then decides from without a call per hit; what it
/// does not use it gives back (a fixed window's while the window lasts, a bucket's while
/// nobody has taken from it since).
#[tonic::async_trait]
pub trait CounterLease: StoreClock {
    /// Takes up to `hit.hits` of the budget of `hit`'s counter at `at` (a fixed window's: of
    /// the window of `at`), for a slice used until `at + life` at the latest (a bucket's hits
    /// are taken for that life, `algorithm::leased`); `held` is what this replica believes it
    /// holds of the counter's budget (granted, less what it asked to give back), which the
    /// store checks (`Grant::intact`).
    async fn lease(
        &self,
        hit: &Hit,
        at: Micros,
        held: u64,
        life: Micros,
    ) -> Result<Grant, StoreError>;

    /// Gives back up to `hit.hits` that this replica leased at `at`: a fixed window's within
    /// its window; a bucket's only while the bucket is in the state `after` its lease left it
    /// (nobody has taken from it since, so the hits go back as if never taken). Answers the
    /// hits given back.
    async fn give_back_lease(
        &self,
        hit: &Hit,
        at: Micros,
        after: Option<&State>,
    ) -> Result<u64, StoreError>;
}

/// The budget this replica holds on lease (`lease.rs`), seen from outside the decision path.
#[tonic::async_trait]
pub trait HeldLeases: Send + Sync + 'static {
    /// Whether counters whose rule does not say are leased (`--lease auto`).
    fn by_default(&self) -> bool;

    /// Gives back every slice's unused budget (graceful shutdown).
    async fn give_back_all(&self);
}

/// What a lease granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Hits of budget now held by this replica: at most those asked for, never past the limit.
    pub granted: u64,
    /// What nobody holds after the grant: the hits a decision now would find.
    pub unleased: u64,
    /// Whether the counter is past its limit (a charge that counts whether admitted or not,
    /// usage, took it there): what any replica holds of it is then no budget left.
    pub overrun: bool,
    /// How many replicas hold part of the counter's budget (a fixed window's: or held, this
    /// window).
    pub holders: u64,
    /// Whether the store still counts what this replica believed it held: if not, the counter
    /// was reset, flushed or rolled back since its earlier leases, whose slices are stale.
    /// Always for a bucket, whose slices end with their lives.
    pub intact: bool,
    /// A bucket's state after the grant, which a return requires it to still be in.
    pub after: Option<State>,
    /// The time until the counter's full limit is available again, as the grant left it.
    pub reset_after: Micros,
}

/// Sharing RLQS demand between the replicas of a shared store.
#[tonic::async_trait]
pub trait DemandShare: Send + Sync + 'static {
    /// Posts this replica's demand on one RLQS quota bucket and reads every replica's, in one
    /// round trip.
    async fn share_demand(&self, post: &DemandPost<'_>) -> Result<Vec<Demand>, StoreError>;
}

/// A store as built (`stack::build_store`): what decides, and the two capabilities beside
/// the decision path. They are handed out separately, each built for what it reaches (the
/// reset forgets the deny cache's denials too), so that no wrapper of the decision path can
/// drop one by forgetting to forward it.
#[derive(Clone)]
pub struct Store {
    pub counters: Arc<dyn CounterStore>,
    pub reset: Arc<dyn CounterReset>,
    /// `None`: nothing is shared between replicas (the memory store), so a replica's own
    /// RLQS streams are the only ones.
    pub demand: Option<Arc<dyn DemandShare>>,
    /// The same counters as `counters`, decided synchronously where this store can.
    pub at_once: Option<Arc<dyn DecideAtOnce>>,
    /// `Some` for a store shared by replicas that leases busy counters (`lease.rs`).
    pub leases: Option<Arc<dyn HeldLeases>>,
    /// `Some` for a store whose deny cache defers the denied hits that count (`deferred.rs`).
    pub deferred: Option<Arc<dyn Flush>>,
}

impl Store {
    /// A store of this process alone: it decides and resets, and shares no demand.
    pub fn local<S: CounterStore + CounterReset>(store: Arc<S>) -> Self {
        Self {
            counters: Arc::clone(&store) as Arc<dyn CounterStore>,
            reset: store,
            demand: None,
            at_once: None,
            leases: None,
            deferred: None,
        }
    }

    /// `local`, for a store that also decides at once (the memory store).
    pub fn in_process<S: CounterStore + CounterReset + DecideAtOnce>(store: Arc<S>) -> Self {
        Self {
            at_once: Some(Arc::clone(&store) as Arc<dyn DecideAtOnce>),
            ..Self::local(store)
        }
    }
}

/// One replica's side of an RLQS quota bucket's demand (see `DemandShare`).
pub struct DemandPost<'a> {
    /// Names the bucket; the store adds its key prefix.
    pub key: &'a str,
    /// This replica's streams that report the bucket, and their demand.
    pub demands: &'a [Demand],
    /// This replica's streams that stopped reporting it since the last post.
    pub gone: &'a [String],
    /// An entry not posted again for this long is dropped (its replica stopped).
    pub stale_after: Duration,
}

/// A stream's demand on a bucket: requests per second, smoothed, or `None` while not known
/// yet (the stream still counts among the bucket's streams); `stream` is unique across
/// replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub stream: String,
    pub per_second: Option<f64>,
}
