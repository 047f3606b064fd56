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

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisError};

use super::script::{CROSS_SLOT_SCRIPT, Call, Mode, Reply, SCRIPT, is_off_node, parse_reply};
use super::slots::{Group, SlotOwners, plan, split_by_slot};
use super::{CounterStore, Hit, StoreError, vetoed};
use crate::algorithm::{Charge, Outcome};
use crate::clock::{Clock, Micros};

/// Where Redis is, from `--store` (and `--redis-password-file`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSpec {
    pub cluster: bool,
    /// One URL per node (`redis://` or `rediss://`), credentials included.
    nodes: Vec<String>,
    password: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("--store: {0}")]
pub struct SpecError(String);

impl RedisSpec {
    /// Parses `redis://…`, `rediss://…`, `redis-cluster://[user:pass@]h1:p1,h2:p2` or
    /// `rediss-cluster://…`. `None`: not a Redis URL at all.
    pub fn parse(url: &str, password: Option<String>) -> Option<Result<Self, SpecError>> {
        let (cluster, scheme, rest) = if let Some(rest) = url.strip_prefix("redis-cluster://") {
            (true, "redis", rest)
        } else if let Some(rest) = url.strip_prefix("rediss-cluster://") {
            (true, "rediss", rest)
        } else if url.starts_with("redis://") || url.starts_with("rediss://") {
            return Some(Self::checked(false, vec![url.to_owned()], password));
        } else {
            return None;
        };
        let rest = rest.trim_end_matches('/');
        let (credentials, hosts) = match rest.rsplit_once('@') {
            Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
            None => (String::new(), rest),
        };
        let nodes = hosts
            .split(',')
            .filter(|host| !host.is_empty())
            .map(|host| format!("{scheme}://{credentials}{host}"))
            .collect();
        Some(Self::checked(cluster, nodes, password))
    }

    fn checked(
        cluster: bool,
        nodes: Vec<String>,
        password: Option<String>,
    ) -> Result<Self, SpecError> {
        let spec = Self {
            cluster,
            nodes,
            password,
        };
        if spec.nodes.is_empty() {
            return Err(SpecError("a Redis cluster URL names no node".into()));
        }
        spec.connection_infos()
            .map_err(|error| SpecError(format!("invalid Redis URL: {error}")))?;
        Ok(spec)
    }

    fn connection_infos(&self) -> Result<Vec<ConnectionInfo>, RedisError> {
        self.nodes
            .iter()
            .map(|node| {
                let info = node.as_str().into_connection_info()?;
                Ok(match &self.password {
                    Some(password) => {
                        let settings = info.redis_settings().clone().set_password(password);
                        info.set_redis_settings(settings)
                    }
                    None => info,
                })
            })
            .collect()
    }
}

/// Never prints credentials: only the addresses.
impl fmt::Debug for RedisSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addresses: Vec<String> = match self.connection_infos() {
            Ok(infos) => infos.iter().map(|info| info.addr().to_string()).collect(),
            Err(_) => vec!["<invalid>".into()],
        };
        f.debug_struct("RedisSpec")
            .field("cluster", &self.cluster)
            .field("nodes", &addresses)
            .finish()
    }
}

/// How the store behaves.
#[derive(Clone)]
pub struct RedisOptions {
    pub charge: Charge,
    /// Bound on one store call, including redis-rs's own retries.
    pub timeout: Duration,
    /// Explicit time passed to the script (tests); `None`: Redis `TIME`.
    pub clock: Option<Arc<dyn Clock>>,
    /// Multiplexed connections (per node, on a cluster) that calls are spread over.
    pub connections: usize,
    /// Serving runtimes (`--runtime per-core`: one per core; else 1). Each runtime besides
    /// the main one gets a connection of its own, made on it, so that the connection's
    /// driver task runs on the same thread as the calls it carries: their commands go out
    /// in one write per batch, with no wake-ups across threads.
    pub runtimes: usize,
    /// How often a cluster's slot map is read again, besides whenever a call finds it stale.
    pub slot_map_refresh: Duration,
}

/// `RedisOptions::slot_map_refresh` as served: a resharding is noticed by the first call it
/// affects anyway, so the period only bounds how long grouping stays less than ideal.
pub const SLOT_MAP_REFRESH: Duration = Duration::from_secs(5);

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    async fn call(&self, call: &Call<'_>) -> Result<Reply, RedisError> {
        let values = match (self.clone(), call.node) {
            (Connection::Cluster(mut connection), Some(node)) => {
                call.invoke_on(&mut connection, node).await?
            }
            (Connection::Cluster(mut connection), None) => call.invoke(&mut connection).await?,
            (Connection::Single(mut connection), _) => call.invoke(&mut connection).await?,
        };
        parse_reply(&values, call.hits.len()).map_err(|error| {
            RedisError::from((
                redis::ErrorKind::Client,
                "tollgate script",
                error.to_string(),
            ))
        })
    }

    async fn ping(&self) -> Result<(), RedisError> {
        let command = redis::cmd("PING");
        match self.clone() {
            Connection::Single(mut c) => c.req_packed_command(&command).await.map(drop),
            Connection::Cluster(mut c) => {
                // Routed to a random node: enough to know the cluster answers.
                command.query_async::<()>(&mut c).await
            }
        }
    }

    /// Loads the cross-slot script on every node; Redis before 7 cannot compile it.
    async fn load_cross_slot_script(&self) -> Result<(), RedisError> {
        match self.clone() {
            Connection::Single(mut c) => CROSS_SLOT_SCRIPT.load_async(&mut c).await.map(drop),
            Connection::Cluster(mut c) => CROSS_SLOT_SCRIPT.load_async(&mut c).await.map(drop),
        }
    }

    async fn slot_owners(&self) -> Result<SlotOwners, RedisError> {
        let command = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        let reply = match self.clone() {
            Connection::Single(mut c) => command.query_async::<redis::Value>(&mut c).await?,
            Connection::Cluster(mut c) => command.query_async::<redis::Value>(&mut c).await?,
        };
        SlotOwners::from_cluster_slots(&reply).map_err(|error| {
            RedisError::from((redis::ErrorKind::Client, "CLUSTER SLOTS", error.to_string()))
        })
    }

    async fn load_script(&self) -> Result<(), RedisError> {
        // On a cluster SCRIPT LOAD goes to every node.
        match self.clone() {
            Connection::Single(mut c) => SCRIPT.load_async(&mut c).await.map(drop),
            Connection::Cluster(mut c) => SCRIPT.load_async(&mut c).await.map(drop),
        }
    }
}

pub struct RedisStore {
    /// Set once every connection is up; calls take them in turn.
    connections: Arc<OnceLock<Box<[Connection]>>>,
    next: AtomicUsize,
    /// The connections of runtimes 1.. (see `RedisOptions::runtimes`).
    local: Arc<[LocalConnection]>,
    spec: RedisSpec,
    options: RedisOptions,
    topology: Arc<Topology>,
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
    pub fn start(spec: RedisSpec, options: RedisOptions) -> Arc<Self> {
        // rediss:// goes through rustls, which needs a process-wide crypto provider; an
        // error only means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = Arc::new(Self {
            connections: Arc::new(OnceLock::new()),
            next: AtomicUsize::new(0),
            local: (1..options.runtimes)
                .map(|_| LocalConnection::default())
                .collect(),
            spec: spec.clone(),
            options,
            topology: Arc::default(),
        });
        let slot = Arc::clone(&store.connections);
        let topology = Arc::downgrade(&store.topology);
        let refresh = store.options.slot_map_refresh;
        let timeout = store.options.timeout;
        let count = store.options.connections.max(1);
        tokio::spawn(async move {
            let mut wait = CONNECT_BACKOFF.0;
            loop {
                match connect_all(&spec, timeout, count).await {
                    Ok(connections) => {
                        tracing::info!(?spec, connections = count, "connected to Redis");
                        // The slot map is read before the first call can be made, so that
                        // calls group by node from the start.
                        if let (Some(first), true, Some(known)) =
                            (connections.first(), spec.cluster, topology.upgrade())
                        {
                            known.refresh(first).await;
                            Topology::keep_fresh(topology, first.clone(), refresh);
                        }
                        let _ = slot.set(connections);
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(?spec, %error, retry_in = ?wait, "Redis not reachable yet");
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
            .ok_or_else(|| StoreError::Unavailable("not connected to Redis yet".into()))?;
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % connections.len().max(1);
        connections
            .get(turn)
            .ok_or_else(|| StoreError::Unavailable("no Redis connection".into()))
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

    fn explicit_now(&self) -> Option<Micros> {
        self.options.clock.as_ref().map(|clock| clock.now())
    }

    async fn apply_remote(
        &self,
        connection: &Connection,
        hits: &[Hit],
    ) -> Result<Vec<Outcome>, StoreError> {
        let grouped = matches!(connection, Connection::Cluster(_)) && hits.len() > 1;
        // Held for the call: the groups borrow their nodes' addresses from it.
        let owners = grouped.then(|| self.topology.owners.load_full()).flatten();
        let groups = if grouped {
            plan(hits, owners.as_deref())
        } else {
            Vec::new()
        };
        // The whole request in one call (a single Redis, or every counter in one slot): the
        // script applies the whole veto rule itself; no regrouping, no refund.
        if groups.len() <= 1 && !groups.first().is_some_and(|group| group.cross_slot) {
            let call = self.call(Mode::Apply, hits, None, true);
            return Ok(connection.call(&call).await.map_err(unavailable)?.outcomes);
        }
        self.apply_grouped(connection, hits, groups).await
    }

    fn call<'a>(
        &self,
        mode: Mode,
        hits: &'a [Hit],
        node: Option<(&'a str, u16)>,
        complete: bool,
    ) -> Call<'a> {
        Call {
            mode,
            hits,
            node,
            now: self.explicit_now(),
            charge: self.options.charge,
            complete,
            expected: &[],
        }
    }

    /// One call per group, all in flight at once; a cross-slot group that found a counter
    /// off its node (a stale slot map) is sent again one slot at a time. A request with a
    /// call that failed fails as a whole, and what its other calls consumed is given back
    /// (with --count-denied every attempt that reached its counters counts, so nothing is).
    async fn apply_grouped(
        &self,
        connection: &Connection,
        hits: &[Hit],
        groups: Vec<Group<'_>>,
    ) -> Result<Vec<Outcome>, StoreError> {
        let complete = groups.len() == 1;
        let results = self.send_groups(connection, hits, &groups, complete).await;
        let mut sent: Vec<(Group<'_>, Vec<Hit>, Reply)> = Vec::with_capacity(groups.len());
        let mut again = Vec::new();
        let mut failure = None;
        for (group, (group_hits, result)) in groups.into_iter().zip(results) {
            match result {
                Ok(reply) => sent.push((group, group_hits, reply)),
                Err(error) if group.cross_slot && is_off_node(&error) => {
                    again.extend(split_by_slot(&group.indices, hits));
                }
                Err(error) => failure = failure.or(Some(error)),
            }
        }
        if !again.is_empty() {
            self.topology.stale.notify_one();
        }
        if !again.is_empty() && failure.is_none() {
            let results = self.send_groups(connection, hits, &again, false).await;
            for (group, (group_hits, result)) in again.into_iter().zip(results) {
                match result {
                    Ok(reply) => sent.push((group, group_hits, reply)),
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
        if let Some(error) = failure {
            if self.options.charge == Charge::IfAllowed {
                self.refund(connection, &sent, &mut outcomes).await;
            }
            return Err(unavailable(error));
        }
        if self.options.charge == Charge::IfAllowed && vetoed(hits, |index| outcomes[index].allowed)
        {
            self.refund(connection, &sent, &mut outcomes).await;
        }
        Ok(outcomes)
    }

    /// Applies each group's hits in one call, all at once; answers in the order of `groups`.
    /// A cross-slot group goes to its node's address.
    async fn send_groups(
        &self,
        connection: &Connection,
        hits: &[Hit],
        groups: &[Group<'_>],
        complete: bool,
    ) -> Vec<(Vec<Hit>, Result<Reply, RedisError>)> {
        let grouped: Vec<Vec<Hit>> = groups
            .iter()
            .map(|group| group.indices.iter().map(|&i| hits[i].clone()).collect())
            .collect();
        let calls = groups.iter().zip(&grouped).map(|(group, group_hits)| {
            let node = group.node.filter(|_| group.cross_slot);
            async move {
                let call = self.call(Mode::Apply, group_hits, node, complete);
                connection.call(&call).await
            }
        });
        let results = futures_util::future::join_all(calls).await;
        grouped.into_iter().zip(results).collect()
    }

    /// Gives back what the committed groups of a vetoed or failed request consumed; their
    /// allowed hits then report their counters as they are after the refund. The refund runs
    /// as its own task, so a caller that goes away (a client deadline) does not leave hits
    /// consumed; if it fails, the request is still answered as vetoed (or failed), its
    /// counters under-admitting briefly.
    async fn refund(
        &self,
        connection: &Connection,
        sent: &[(Group<'_>, Vec<Hit>, Reply)],
        outcomes: &mut [Outcome],
    ) {
        // One refund per slot (routed by key, as refunds are rare): a group's hits are at
        // positions 0.. of its own hit list.
        let refunds: Vec<Refund> = sent
            .iter()
            .filter(|(_, _, reply)| reply.committed)
            .flat_map(|(group, hits, reply)| {
                let positions: Vec<usize> = (0..hits.len()).collect();
                split_by_slot(&positions, hits)
                    .into_iter()
                    .map(move |slot| Refund {
                        indices: slot.indices.iter().map(|&p| group.indices[p]).collect(),
                        hits: slot
                            .indices
                            .iter()
                            .map(|&p| Hit {
                                hits: if reply.outcomes[p].allowed {
                                    hits[p].hits
                                } else {
                                    0
                                },
                                ..hits[p].clone()
                            })
                            .collect(),
                        at: reply.now,
                        expected: slot.indices.iter().map(|&p| reply.states[p]).collect(),
                    })
            })
            .collect();
        let connection = connection.clone();
        let task = tokio::spawn(async move {
            let calls = refunds.iter().map(|refund| {
                let call = Call {
                    mode: Mode::Refund { at: refund.at },
                    hits: &refund.hits,
                    node: None,
                    now: None,
                    charge: Charge::IfAllowed,
                    complete: false,
                    expected: &refund.expected,
                };
                let connection = &connection;
                async move { connection.call(&call).await }
            });
            let replies = futures_util::future::join_all(calls).await;
            (refunds, replies)
        });
        let (refunds, replies) = match task.await {
            Ok(done) => done,
            Err(error) => {
                tracing::warn!(%error, "refund task failed");
                return;
            }
        };
        for (refund, reply) in refunds.iter().zip(replies) {
            match reply {
                Ok(reply) => {
                    for ((&index, hit), outcome) in
                        refund.indices.iter().zip(&refund.hits).zip(reply.outcomes)
                    {
                        if hit.hits > 0 {
                            outcomes[index] = outcome;
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "refund of a vetoed request failed; its counters under-admit until they reset");
                }
            }
        }
    }
}

/// What the store knows of a cluster's slots.
#[derive(Default)]
struct Topology {
    /// Which node serves each slot, once known and once the cross-slot script is loaded.
    owners: ArcSwapOption<SlotOwners>,
    cross_slot: AtomicU8,
    /// Woken when a call found the map stale, to read it again before the next period.
    stale: Arc<tokio::sync::Notify>,
}

/// `Topology::cross_slot`: whether the cross-slot script is loaded on every node.
const NOT_YET: u8 = 0;
const LOADED: u8 = 1;
/// A node refused to compile it (Redis before 7): one call per slot for good.
const REFUSED: u8 = 2;

/// Reads of the slot map are at least this far apart, so that calls finding it stale while a
/// migration is in progress (the map cannot show a half-moved slot) do not flood the cluster.
const SLOT_MAP_MIN_GAP: Duration = Duration::from_secs(1);

impl Topology {
    async fn refresh(&self, connection: &Connection) {
        if self.cross_slot.load(Ordering::Acquire) == NOT_YET {
            // Once is enough: a node that lacks it later (restarted, promoted) gets it with
            // its first call, by EVAL.
            match connection.load_cross_slot_script().await {
                Ok(()) => self.cross_slot.store(LOADED, Ordering::Release),
                Err(error) if error.is_io_error() || error.is_timeout() => {
                    tracing::warn!(%error, "loading the cross-slot script failed; one call per slot until it loads");
                }
                Err(error) => {
                    tracing::info!(%error, "the cluster cannot run cross-slot scripts (Redis 7+): one call per slot");
                    self.cross_slot.store(REFUSED, Ordering::Release);
                }
            }
        }
        if self.cross_slot.load(Ordering::Acquire) != LOADED {
            return;
        }
        match connection.slot_owners().await {
            Ok(owners) => self.owners.store(Some(Arc::new(owners))),
            // A stale map is still mostly right, and a call it misleads is sent again.
            Err(error) => tracing::warn!(%error, "reading the cluster's slot map failed"),
        }
    }

    /// Keeps the map fresh while the store lives (the task holds the topology only while it
    /// reads the map).
    fn keep_fresh(topology: Weak<Self>, connection: Connection, period: Duration) {
        let Some(stale) = topology
            .upgrade()
            .map(|topology| Arc::clone(&topology.stale))
        else {
            return;
        };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SLOT_MAP_MIN_GAP.min(period)).await;
                tokio::select! {
                    _ = tokio::time::sleep(period.saturating_sub(SLOT_MAP_MIN_GAP)) => {}
                    _ = stale.notified() => {}
                }
                let Some(topology) = topology.upgrade() else {
                    return;
                };
                if topology.cross_slot.load(Ordering::Acquire) == REFUSED {
                    return;
                }
                topology.refresh(&connection).await;
            }
        });
    }
}

/// What one slot of a committed group of a vetoed request gives back.
struct Refund {
    /// The hits, by index into the request's.
    indices: Vec<usize>,
    /// The hits, with `hits` 0 for those that did not consume.
    hits: Vec<Hit>,
    /// When the apply call consumed.
    at: Micros,
    /// The state the apply call left, which a token bucket or GCRA refund requires.
    expected: Vec<(i64, i64)>,
}

fn unavailable(error: RedisError) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

/// `count` independent connections: on one multiplexed connection a single task writes and
/// reads every call, which caps throughput before Redis does (docs/performance.md).
async fn connect_all(
    spec: &RedisSpec,
    timeout: Duration,
    count: usize,
) -> Result<Box<[Connection]>, RedisError> {
    let mut connections = Vec::with_capacity(count);
    for _ in 0..count {
        connections.push(connect(spec, timeout).await?);
    }
    Ok(connections.into_boxed_slice())
}

async fn connect(spec: &RedisSpec, timeout: Duration) -> Result<Connection, RedisError> {
    let infos = spec.connection_infos()?;
    let connection = if spec.cluster {
        // redis-rs's defaults retry for minutes; a rate limit decision has milliseconds.
        let client = ClusterClient::builder(infos)
            .connection_timeout(timeout.max(Duration::from_millis(500)))
            .response_timeout(timeout)
            .overall_response_timeout(Some(timeout))
            .retries(2)
            .min_retry_wait(1)
            .max_retry_wait(10)
            .build()?;
        Connection::Cluster(client.get_async_connection().await?)
    } else {
        let Some(info) = infos.into_iter().next() else {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "no Redis node",
            )));
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(500))))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(10));
        let client = redis::Client::open(info)?;
        Connection::Single(client.get_connection_manager_with_config(config).await?)
    };
    connection.load_script().await?;
    Ok(connection)
}

#[tonic::async_trait]
impl CounterStore for RedisStore {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        self.apply_remote(self.connection()?, hits).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.connection()?.ping().await.map_err(unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> RedisSpec {
        RedisSpec::parse(url, None)
            .expect("a Redis URL")
            .expect("valid")
    }

    #[test]
    fn cluster_urls_name_every_node_with_the_shared_credentials() {
        let spec = parse("redis-cluster://user:secret@127.0.0.1:7000,127.0.0.1:7001/");
        assert!(spec.cluster);
        assert_eq!(
            spec.nodes,
            [
                "redis://user:secret@127.0.0.1:7000",
                "redis://user:secret@127.0.0.1:7001"
            ]
        );
        let tls = parse("rediss-cluster://h1:7000,h2:7001");
        assert_eq!(tls.nodes, ["rediss://h1:7000", "rediss://h2:7001"]);
        assert!(!parse("rediss://h:6380").cluster);
    }

    #[test]
    fn passwords_never_appear_in_debug_output() {
        let spec = RedisSpec::parse("redis://:hunter2@127.0.0.1:6379", Some("s3cret".into()))
            .unwrap()
            .unwrap();
        let shown = format!("{spec:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret"),
            "{shown}"
        );
        assert!(shown.contains("127.0.0.1:6379"), "{shown}");
    }

    #[test]
    fn a_password_file_overrides_the_url() {
        let spec = RedisSpec::parse("redis://:old@127.0.0.1:6379", Some("new".into()))
            .unwrap()
            .unwrap();
        let infos = spec.connection_infos().unwrap();
        assert_eq!(infos[0].redis_settings().password(), Some("new"));
    }

    #[test]
    fn other_schemes_are_not_redis_and_empty_clusters_are_errors() {
        assert!(RedisSpec::parse("memcached://x", None).is_none());
        assert!(RedisSpec::parse("redis-cluster://", None).unwrap().is_err());
    }
}
