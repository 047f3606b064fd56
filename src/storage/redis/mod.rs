//! The Redis and Redis Cluster store: one implementation over redis-rs async connections
//! (multiplexed, so concurrent requests pipeline on one connection per node).
//!
//! One round trip per request: on a cluster the hits of a request are grouped by the node that
//! serves their slots (the hash tag `keys.rs` puts in every key), one script call per node,
//! all in flight at once; a single Redis gets one call for the whole request. Within a call
//! the script is atomic and applies the veto rule itself. Across nodes, a group that consumed
//! is refunded when another group's denial vetoes the request (so a rejected request never
//! over-admits; it may briefly under-admit while the refund is in flight). Grouping by node
//! needs the slot map (`slots.rs`, refreshed in the background) and Redis 7's
//! `allow-cross-slot-keys`; without them, one call per slot.
//!
//! Starting without Redis is normal (it may come up after us): the connection is made in the
//! background with backoff, and until then every call and the health probe fail fast.
//!
//! Files: `url.rs` (where Redis is), `connection.rs` (a single server or a cluster behind one
//! type, and the error classification), `slots.rs` (the slot map and the grouping),
//! `library.rs` with `lua/` (the counter code on the server), `script.rs` (a call to it),
//! `counter.rs` (fixed windows as one integer per window), `found.rs` (one hit alone, decided
//! from the state Redis found), `clock.rs` (Redis's clock, tracked).

mod arguments;
mod clock;
mod connection;
mod counter;
mod demand;
mod found;
pub mod library;
pub mod per_second;
pub mod refund;
pub mod script;
mod sentinel;
pub mod slots;
mod url;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clock::RedisClock;
use connection::{Connection, connect, connect_all};
use refund::{Part, Refund, give_back, refunds_of};
use script::{Call, Mode, Reply};
use slots::{Group, Topology, plan, split_by_slot};
pub use url::{RedisCertificates, RedisSpec, SpecError};

use crate::algorithm::{Charge, Outcome};
use crate::clock::Micros;
use crate::storage::{CounterStore, Hit, StoreError, StoreOptions, vetoed};

pub struct RedisStore {
    /// Set once every connection is up; calls take them in turn.
    connections: Arc<OnceLock<Box<[Connection]>>>,
    next: AtomicUsize,
    /// The connections of runtimes 1.. (see `StoreOptions::runtimes`).
    local: Arc<[LocalConnection]>,
    spec: RedisSpec,
    options: StoreOptions,
    topology: Arc<Topology>,
    /// The instant of each call: Redis's clock as this replica tracks it (`clock.rs`).
    clock: Arc<RedisClock>,
}

/// A runtime's own connection, made in the background on that runtime.
#[derive(Default)]
struct LocalConnection {
    connection: OnceLock<Connection>,
    connecting: AtomicBool,
}

/// Backoff of the background connect: from 100 ms, doubling, at most 5 s apart.
const CONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

impl RedisStore {
    /// Creates the store and starts connecting in the background. Must run inside a tokio
    /// runtime.
    pub fn start(spec: RedisSpec, options: StoreOptions) -> Arc<Self> {
        // rediss:// goes through rustls, which needs a process-wide crypto provider; an
        // error only means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let timeout = options.timeout;
        let store = Arc::new(Self {
            connections: Arc::new(OnceLock::new()),
            next: AtomicUsize::new(0),
            local: (1..options.runtimes)
                .map(|_| LocalConnection::default())
                .collect(),
            spec: spec.clone(),
            options,
            topology: Arc::default(),
            clock: Arc::new(RedisClock::system(timeout)),
        });
        let slot = Arc::clone(&store.connections);
        let topology = Arc::downgrade(&store.topology);
        let clock = Arc::downgrade(&store.clock);
        let refresh = store.options.slot_map_refresh;
        let timeout = store.options.timeout;
        let count = store.options.redis_connections.max(1);
        tokio::spawn(async move {
            let mut wait = CONNECT_BACKOFF.0;
            loop {
                match connect_all(&spec, timeout, count).await {
                    Ok(connections) => {
                        tracing::info!(store = %spec, connections = count, "connected to Redis");
                        // The slot map is read before the first call can be made, so that
                        // calls group by node from the start.
                        if let (Some(first), true, Some(known)) =
                            (connections.first(), spec.cluster, topology.upgrade())
                        {
                            known.refresh(first).await;
                            Topology::keep_fresh(topology, first.clone(), refresh);
                        }
                        // Redis's clock is known before the first decision (or, if the sample
                        // was too slow to trust, a moment later: until then calls fail).
                        if let (Some(first), Some(tracked)) = (connections.first(), clock.upgrade())
                        {
                            let used = clock::sample(&tracked, first).await;
                            clock::keep_tracking(clock.clone(), first.clone(), used);
                        }
                        let _ = slot.set(connections);
                        return;
                    }
                    Err(error) if error.is_transient() => {
                        tracing::warn!(store = %spec, %error, retry_in = ?wait, "Redis not reachable yet");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(CONNECT_BACKOFF.1);
                    }
                    // Answered, but no: retrying is still right (a rotated secret may fix it),
                    // but someone must act, so it is an error with what to check.
                    Err(error) => {
                        let hint = refusal_hint(&error);
                        tracing::error!(store = %spec, %error, retry_in = ?wait, "Redis refused tollgate: {hint}");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(CONNECT_BACKOFF.1);
                    }
                }
            }
        });
        store
    }

    fn connection(&self) -> Result<&Connection, StoreError> {
        if let Some(local) = self.local_connection() {
            return Ok(local);
        }
        let connections = self
            .connections
            .get()
            .ok_or_else(|| StoreError::unavailable("not connected to Redis yet"))?;
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % connections.len().max(1);
        connections
            .get(turn)
            .ok_or_else(|| StoreError::unavailable("no Redis connection"))
    }

    /// This runtime's own connection, once made. The first call on a runtime without one
    /// starts making it there (after the shared connections are up, so never while Redis is
    /// unreachable), and uses the shared connections meanwhile: no call waits for a connect.
    fn local_connection(&self) -> Option<&Connection> {
        let index = crate::runtime::index().checked_sub(1)?;
        let slot = self.local.get(index)?;
        if let Some(connection) = slot.connection.get() {
            return Some(connection);
        }
        if self.connections.get().is_some() && !slot.connecting.swap(true, Ordering::AcqRel) {
            let (local, spec, timeout) = (
                Arc::clone(&self.local),
                self.spec.clone(),
                self.options.timeout,
            );
            // Spawned here: on this runtime, where the connection's driver must run.
            tokio::spawn(async move {
                let Some(slot) = local.get(index) else {
                    return;
                };
                match connect(&spec, timeout).await {
                    Ok(connection) => {
                        let _ = slot.connection.set(connection);
                    }
                    Err(error) => {
                        // The shared connections serve meanwhile: no hurry to retry.
                        tracing::warn!(%error, runtime = index + 1, retry_in = ?CONNECT_BACKOFF.1, "a runtime's own Redis connection failed");
                        tokio::time::sleep(CONNECT_BACKOFF.1).await;
                        slot.connecting.store(false, Ordering::Release);
                    }
                }
            });
        }
        None
    }

    /// The instant to decide at: the injected clock's (tests), or Redis's as tracked.
    fn now(&self) -> Result<Micros, StoreError> {
        match &self.options.clock {
            Some(clock) => Ok(clock.now()),
            None => self.clock.now(),
        }
    }

    /// How long counters are kept past the moment their state stops mattering
    /// (`clock::grace`), in whole ms.
    fn grace_ms(&self) -> u64 {
        let grace = clock::grace(self.options.timeout);
        u64::try_from(grace.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
    }

    async fn apply_remote(
        &self,
        connection: &Connection,
        hits: &[Hit],
    ) -> Result<Vec<Outcome>, StoreError> {
        let grouped = connection.is_cluster() && hits.len() > 1;
        // Held for the call: the groups borrow their nodes' addresses from it.
        let owners = grouped.then(|| self.topology.owners()).flatten();
        let groups = if grouped {
            plan(hits, owners.as_deref())
        } else {
            Vec::new()
        };
        // The whole request in one call (a single Redis, or every counter in one slot): the
        // script applies the whole veto rule itself; no regrouping, no refund.
        if groups.len() <= 1 && !groups.first().is_some_and(|group| group.cross_slot) {
            let call = self.call(Mode::Apply, hits, None, true)?;
            return Ok(connection.call(&call).await?.outcomes);
        }
        self.apply_grouped(connection, hits, groups).await
    }

    fn call<'a>(
        &'a self,
        mode: Mode,
        hits: &'a [Hit],
        node: Option<(&'a str, u16)>,
        complete: bool,
    ) -> Result<Call<'a>, StoreError> {
        Ok(Call {
            mode,
            hits,
            node,
            now: Some(self.now()?),
            charge: self.options.charge,
            complete,
            expected: &[],
            prefix: &self.options.key_prefix,
            grace_ms: self.grace_ms(),
        })
    }

    /// One call per group, all in flight at once (see `gather`). A request with a call that
    /// failed fails as a whole, and what its other calls consumed is given back (with
    /// --count-denied every attempt that reached its counters counts, so nothing is); so is
    /// what a vetoed request's calls consumed.
    async fn apply_grouped(
        &self,
        connection: &Connection,
        hits: &[Hit],
        groups: Vec<Group<'_>>,
    ) -> Result<Vec<Outcome>, StoreError> {
        let complete = groups.len() == 1;
        let mut part = self.gather(connection, hits, groups, complete).await;
        let give = self.options.charge == Charge::IfAllowed
            && (part.failure.is_some() || vetoed(hits, |index| part.outcomes[index].allowed));
        if give {
            let refunds = std::mem::take(&mut part.refunds);
            give_back(
                connection,
                &self.options.key_prefix,
                refunds,
                &mut part.outcomes,
            )
            .await;
        }
        match part.failure {
            Some(error) => Err(error),
            None => Ok(part.outcomes),
        }
    }

    /// Applies `hits` as one part of a request that spans two stores (`--store-per-second`):
    /// the calls veto only within themselves, and the caller, who sees the whole request,
    /// gives back (`give_back_part`) what a veto or a failure elsewhere undoes.
    pub async fn apply_part(&self, hits: &[Hit]) -> Part {
        let connection = match self.connection() {
            Ok(connection) => connection,
            Err(error) => return Part::failed(hits.len(), error),
        };
        let owners = connection
            .is_cluster()
            .then(|| self.topology.owners())
            .flatten();
        let groups = if connection.is_cluster() {
            plan(hits, owners.as_deref())
        } else {
            vec![Group {
                indices: (0..hits.len()).collect(),
                cross_slot: false,
                node: None,
            }]
        };
        self.gather(connection, hits, groups, false).await
    }

    /// Sends `refunds` of a part (see `apply_part`).
    pub async fn give_back_part(&self, refunds: Vec<Refund>, outcomes: &mut [Outcome]) {
        match self.connection() {
            Ok(connection) => {
                give_back(connection, &self.options.key_prefix, refunds, outcomes).await;
            }
            Err(error) => {
                tracing::warn!(%error, "refund of a vetoed request failed; its counters under-admit until they reset")
            }
        }
    }

    /// Sends one call per group, all at once; a cross-slot group that found a counter off its
    /// node (a stale slot map) is sent again one slot at a time. Gathers the outcomes, what
    /// the committed calls would give back, and the first failure.
    async fn gather(
        &self,
        connection: &Connection,
        hits: &[Hit],
        groups: Vec<Group<'_>>,
        complete: bool,
    ) -> Part {
        let results = self.send_groups(connection, hits, &groups, complete).await;
        let mut sent: Vec<(Group<'_>, Vec<Hit>, Reply)> = Vec::with_capacity(groups.len());
        let mut again = Vec::new();
        let mut failure = None;
        for (group, (group_hits, result)) in groups.into_iter().zip(results) {
            match result {
                Ok(Some(reply)) => sent.push((group, group_hits, reply)),
                Ok(None) => again.extend(split_by_slot(&group.indices, hits)),
                Err(error) => failure = failure.or(Some(error)),
            }
        }
        if !again.is_empty() {
            self.topology.report_stale();
        }
        if !again.is_empty() && failure.is_none() {
            let results = self.send_groups(connection, hits, &again, false).await;
            for (group, (group_hits, result)) in again.into_iter().zip(results) {
                match result {
                    Ok(Some(reply)) => sent.push((group, group_hits, reply)),
                    // One slot per call, routed by key: redis-rs follows the redirections.
                    Ok(None) => {
                        let moved = StoreError::unavailable("a counter's slot moved twice");
                        failure = failure.or(Some(moved));
                    }
                    Err(error) => failure = failure.or(Some(error)),
                }
            }
        }
        let mut outcomes = vec![Outcome::default(); hits.len()];
        for (group, _, reply) in &sent {
            for (&index, outcome) in group.indices.iter().zip(&reply.outcomes) {
                outcomes[index] = *outcome;
            }
        }
        Part {
            outcomes,
            refunds: refunds_of(&sent),
            failure,
        }
    }

    /// Applies each group's hits in one call, all at once; answers in the order of `groups`.
    /// A cross-slot group goes to its node's address (`None`: a counter was not there).
    async fn send_groups(
        &self,
        connection: &Connection,
        hits: &[Hit],
        groups: &[Group<'_>],
        complete: bool,
    ) -> Vec<(Vec<Hit>, Result<Option<Reply>, StoreError>)> {
        let grouped: Vec<Vec<Hit>> = groups
            .iter()
            .map(|group| group.indices.iter().map(|&i| hits[i].clone()).collect())
            .collect();
        let calls = groups.iter().zip(&grouped).map(|(group, group_hits)| {
            let node = group.node.filter(|_| group.cross_slot);
            async move {
                let call = self.call(Mode::Apply, group_hits, node, complete)?;
                connection.call_on_node(&call).await
            }
        });
        let results = futures_util::future::join_all(calls).await;
        grouped.into_iter().zip(results).collect()
    }
}

/// What to check when Redis refuses a connection.
fn refusal_hint(error: &StoreError) -> &'static str {
    let text = error.to_string();
    if ["WRONGPASS", "NOAUTH", "uthentication"]
        .iter()
        .any(|sign| text.contains(sign))
    {
        "check the user and password (in the --store URL, or --redis-password-file)"
    } else if text.contains("NOPERM") {
        "the Redis user lacks a permission tollgate needs (FUNCTION and FCALL, or EVALSHA, EVAL and SCRIPT; GET, MGET, SET, INCRBY, DECRBY, PEXPIRE, DEL)"
    } else {
        "see the error; tollgate keeps retrying"
    }
}

#[tonic::async_trait]
impl CounterStore for RedisStore {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        self.apply_remote(self.connection()?, hits).await
    }

    /// Ready when Redis answers and its clock is known (no decision can be made before).
    async fn ping(&self) -> Result<(), StoreError> {
        self.connection()?.ping().await?;
        self.now().map(drop)
    }

    /// One DEL per counter, all at once: on a cluster each is routed by its key. A counter
    /// of one integer per window (`counter.rs`) is forgotten for the current window.
    async fn forget(&self, hits: &[Hit]) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let now = self.now()?;
        let deletes = hits.iter().map(|hit| {
            let mut key = [self.options.key_prefix.as_str(), hit.key.as_str()].concat();
            if counter::is_counter(&hit.params) {
                key = format!("{key}:{}", counter::window_number(&hit.params, now));
            }
            let command = redis::cmd("DEL").arg(key).to_owned();
            async move { connection.query::<i64>(&command).await }
        });
        for result in futures_util::future::join_all(deletes).await {
            result?;
        }
        Ok(())
    }

    async fn share_demand(
        &self,
        post: &crate::storage::DemandPost<'_>,
    ) -> Result<Option<Vec<crate::storage::Demand>>, StoreError> {
        let prefix = &self.options.key_prefix;
        demand::share(self.connection()?, prefix, post)
            .await
            .map(Some)
    }
}
