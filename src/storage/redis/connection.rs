//! A connection to Redis, a single server or a cluster behind one type: script calls, plain
//! commands, pings, and every `RedisError` turned into a `StoreError` here, once.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Cmd, ErrorKind, FromRedisValue, RedisError, RetryMethod, Script, ServerErrorKind, Value,
};

use super::call::{Call, Layout, Reply};
use super::library::{self, Function};
use super::sentinel::SentinelLink;
use super::transport::{self, Plain, Routed};
use super::url::RedisSpec;
use crate::storage::StoreError;

/// A multiplexed connection (cheap to clone: clones share it) and its call timeout.
#[derive(Clone)]
pub struct Connection {
    link: Link,
    timeout: Duration,
}

/// A pool's connection of the moment, for the tasks that keep the slot map and the clock
/// fresh: they follow the pool when it makes its connections again.
pub type Current = Arc<dyn Fn() -> Option<Connection> + Send + Sync>;

/// How long making a connection may take (`--redis-connect-timeout`, the reference's
/// REDIS_TIMEOUT), and one call (`--store-timeout`): a connect that waits longer than a call
/// would be a call that waits too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub call: Duration,
}

#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelLink>),
}

impl Connection {
    pub fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// Sends a call (on a cluster, to the node of its first key, or to its `node`) in its
    /// layout, and reads the reply.
    pub async fn call(&self, call: &Call<'_>) -> Result<Reply, StoreError> {
        let layout = Layout::of(call);
        let reply = self
            .send(call, layout)
            .await
            .map_err(|error| self.store_error(error))?;
        layout.decode(call, reply)
    }

    /// `call` for a call that names its cluster node (`Call::node`). `Ok(None)`: a counter is
    /// not (or no longer) on that node, or redis-rs no longer knows the node; the layouts read
    /// every counter before writing any, so such a call changed nothing and can be sent again
    /// one slot at a time.
    pub async fn call_on_node(&self, call: &Call<'_>) -> Result<Option<Reply>, StoreError> {
        let layout = Layout::of(call);
        match self.send(call, layout).await {
            Ok(reply) => layout.decode(call, reply).map(Some),
            Err(error) if call.node.is_some() && is_off_node(&error) => Ok(None),
            Err(error) => Err(self.store_error(error)),
        }
    }

    /// `call` in its layout, the raw reply: for the layouts whose reply is not a decision
    /// (the leases).
    pub async fn send_call(&self, call: &Call<'_>) -> Result<Value, StoreError> {
        self.send(call, Layout::of(call))
            .await
            .map_err(|error| self.store_error(error))
    }

    async fn send(&self, call: &Call<'_>, layout: Layout) -> Result<Value, RedisError> {
        match self.link.clone() {
            Link::Single(mut connection) => {
                transport::send(call, layout, &mut Plain(&mut connection)).await
            }
            Link::Cluster(mut connection) => send_while_moving(call, layout, &mut connection).await,
            Link::Sentinel(link) => {
                transport::send(call, layout, &mut Plain(&mut link.connection())).await
            }
        }
    }

    /// A command, routed by redis-rs (on a cluster: by key, or to every node for commands such
    /// as SCRIPT LOAD, or to a random node).
    pub async fn query<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        let answer = match self.link.clone() {
            Link::Single(mut connection) => command.query_async(&mut connection).await,
            Link::Cluster(mut connection) => command.query_async(&mut connection).await,
            Link::Sentinel(link) => command.query_async(&mut link.connection()).await,
        };
        answer.map_err(|error| self.store_error(error))
    }

    /// Redis's clock (`TIME`: seconds, microseconds); on a cluster the clock of the primary of
    /// slot 0, so that every replica tracks the same node.
    pub async fn time(&self) -> Result<(u64, u64), StoreError> {
        let command = redis::cmd("TIME");
        let answer = match self.link.clone() {
            Link::Single(mut connection) => command.query_async(&mut connection).await,
            Link::Cluster(mut connection) => {
                let slot_0 = Route::new(0, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(slot_0));
                match connection.route_command(command, routing).await {
                    Ok(value) => redis::from_redis_value(value).map_err(RedisError::from),
                    Err(error) => Err(error),
                }
            }
            Link::Sentinel(link) => command.query_async(&mut link.connection()).await,
        };
        answer.map_err(|error| self.store_error(error))
    }

    /// Answers when Redis does (on a cluster, a random node: enough to know it answers).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.query::<()>(&redis::cmd("PING")).await
    }

    /// Loads `script` (on every node of a cluster), so that calls can go by EVALSHA.
    pub async fn load(&self, script: &Script) -> Result<(), StoreError> {
        let answer = match self.link.clone() {
            Link::Single(mut connection) => script.load_async(&mut connection).await,
            Link::Cluster(mut connection) => script.load_async(&mut connection).await,
            Link::Sentinel(link) => script.load_async(&mut link.connection()).await,
        };
        answer.map(drop).map_err(|error| self.store_error(error))
    }

    /// FUNCTION LOAD of the library (on every primary of a cluster).
    async fn load_library(&self) -> Result<(), RedisError> {
        let command = library::load_command();
        match self.link.clone() {
            Link::Single(mut connection) => command.query_async(&mut connection).await,
            Link::Cluster(mut connection) => command.query_async(&mut connection).await,
            Link::Sentinel(link) => command.query_async(&mut link.connection()).await,
        }
    }

    /// What a failed Redis call means for the store's callers. Behind sentinels, any failure
    /// may be a failover: they are asked again.
    fn store_error(&self, error: RedisError) -> StoreError {
        if let Link::Sentinel(link) = &self.link {
            link.follow_failover();
        }
        store_error(error, self.timeout)
    }
}

/// Waits between sends of a call refused because its slot is moving: together about as long
/// as a busy slot's move takes to settle after its last key is migrated.
const WHILE_MOVING: [Duration; 6] = [
    Duration::from_millis(1),
    Duration::from_millis(2),
    Duration::from_millis(4),
    Duration::from_millis(8),
    Duration::from_millis(16),
    Duration::from_millis(32),
];

/// Sends a cluster call, again while its slot is moving. redis-rs follows MOVED and ASK
/// itself, but only as far as its retries go; its ASKING can be taken by another caller's
/// command on the shared connection (`transport::Routed::asking` sends both as one); and a
/// move's last moments bounce a call between the two owners (the old one has given the slot
/// away while the new one does not know it owns it yet). A call refused for any of these ran
/// nothing, so sending it again is exact.
async fn send_while_moving(
    call: &Call<'_>,
    layout: Layout,
    connection: &mut ClusterConnection,
) -> Result<Value, RedisError> {
    let mut waits = WHILE_MOVING.iter();
    let mut sent = transport::send(call, layout, &mut Routed::new(connection, call)).await;
    loop {
        let error = match sent {
            Err(error) if is_moving(&error) => error,
            sent => return sent,
        };
        if let (ErrorKind::Server(ServerErrorKind::Ask), Some((address, _))) =
            (error.kind(), error.redirect_node())
            && let Some((host, port)) = address
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse().ok()?)))
        {
            let mut asking = Routed::asking(connection, host, port);
            sent = transport::send(call, layout, &mut asking).await;
            if !sent.as_ref().is_err_and(is_moving) {
                return sent;
            }
        }
        let Some(wait) = waits.next() else {
            return Err(error);
        };
        tokio::time::sleep(*wait).await;
        sent = transport::send(call, layout, &mut Routed::new(connection, call)).await;
    }
}

/// Sends `call` on a connection to one server and reads the reply: for the tests and tools
/// that talk to one Redis directly.
pub async fn call_on(
    connection: &mut impl ConnectionLike,
    call: &Call<'_>,
) -> Result<Reply, StoreError> {
    call_as(connection, call, Layout::of(call)).await
}

/// `call_on` in a layout of the caller's choosing, which must carry the call (a measurement
/// of what each layout costs).
pub async fn call_as(
    connection: &mut impl ConnectionLike,
    call: &Call<'_>,
    layout: Layout,
) -> Result<Reply, StoreError> {
    if !layout.carries(call) {
        return Err(StoreError::Refused(
            format!("a {} call cannot carry these hits", layout.name()).into(),
        ));
    }
    let reply = transport::send(call, layout, &mut Plain(connection))
        .await
        .map_err(|error| store_error(error, Duration::ZERO))?;
    layout.decode(call, reply)
}

/// Classifies a Redis error once: no answer in time; a replica's refusal to write (READONLY:
/// the connection leads to a demoted master); not reachable or not ready (refused, dropped, a
/// cluster down or reconfiguring, a replica loading: redis-rs would retry or reconnect, and so
/// may we); or an answer that retrying does not change (a wrong password, a refused command,
/// a failing script).
pub fn store_error(error: RedisError, timeout: Duration) -> StoreError {
    if error.is_timeout() {
        return StoreError::Timeout(timeout);
    }
    if is_read_only(&error) {
        return StoreError::ReadOnly(Box::new(error));
    }
    if is_moving(&error) {
        return StoreError::Moving(Box::new(error));
    }
    let lasting = error.kind() == ErrorKind::AuthenticationFailed
        || matches!(error.retry_method(), RetryMethod::NoRetry);
    if lasting {
        StoreError::Refused(Box::new(error))
    } else {
        StoreError::Unavailable(Box::new(error))
    }
}

/// A write refused by a replica: as an error reply, or raised inside a script (where Redis
/// wraps it in the script's error).
fn is_read_only(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || error.to_string().contains("READONLY")
}

/// A cluster's refusal of a call whose slot is moving (or has moved): the call ran nothing.
fn is_moving(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::TryAgain
        )
    )
}

/// Whether a cross-slot call failed because a counter is not served by the node it went to.
fn is_off_node(error: &RedisError) -> bool {
    error.kind() == ErrorKind::ClusterConnectionNotFound
        || error.to_string().contains("non local key")
}

/// `count` independent connections: on one multiplexed connection a single task writes and
/// reads every call, which caps throughput before Redis does (docs/performance.md).
pub async fn connect_all(
    spec: &RedisSpec,
    timeouts: Timeouts,
    count: usize,
) -> Result<Box<[Connection]>, StoreError> {
    let mut connections = Vec::with_capacity(count);
    for _ in 0..count {
        connections.push(connect(spec, timeouts).await?);
    }
    Ok(connections.into_boxed_slice())
}

/// Connects and loads the counter code: the function library, or where functions cannot
/// run, the scripts.
pub async fn connect(spec: &RedisSpec, timeouts: Timeouts) -> Result<Connection, StoreError> {
    let link = open(spec, timeouts)
        .await
        .map_err(|error| store_error(error, timeouts.connect))?;
    let connection = Connection {
        link,
        timeout: timeouts.call,
    };
    if library::functions_usable() {
        match connection.load_library().await {
            Err(error) if library::gives_up_functions(&error) => {}
            Err(error) if !library::is_loaded_already(&error) => {
                return Err(connection.store_error(error));
            }
            _ => return Ok(connection),
        }
    }
    for function in Function::all() {
        if let Some((script, _)) = function.script().filter(|_| !function.cross_slot) {
            connection.load(script).await?;
        }
    }
    Ok(connection)
}

async fn open(spec: &RedisSpec, timeouts: Timeouts) -> Result<Link, RedisError> {
    let infos = spec.connection_infos()?;
    let Timeouts {
        connect: connect_timeout,
        call: timeout,
    } = timeouts;
    if spec.cluster {
        // redis-rs's defaults retry for minutes; a rate limit decision has milliseconds.
        let mut builder = ClusterClient::builder(infos);
        if let Some(certificates) = &spec.certificates {
            builder = builder.certs(certificates.to_redis());
        }
        let client = builder
            .connection_timeout(connect_timeout)
            .response_timeout(timeout)
            .overall_response_timeout(Some(timeout))
            .retries(2)
            .min_retry_wait(1)
            .max_retry_wait(10)
            .build()?;
        return Ok(Link::Cluster(client.get_async_connection().await?));
    }
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(10));
    if spec.sentinel.is_some() {
        return Ok(Link::Sentinel(
            SentinelLink::open(spec, config, connect_timeout).await?,
        ));
    }
    let Some(info) = infos.into_iter().next() else {
        return Err(RedisError::from((ErrorKind::Client, "no Redis node")));
    };
    let client = match &spec.certificates {
        Some(certificates) => redis::Client::build_with_tls(info, certificates.to_redis())?,
        None => redis::Client::open(info)?,
    };
    Ok(Link::Single(
        client.get_connection_manager_with_config(config).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str, detail: &str) -> RedisError {
        let parsed = redis::parse_redis_value(format!("-{code} {detail}\r\n").as_bytes());
        match parsed.map(Value::extract_error) {
            Ok(Err(error)) => error,
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn a_moving_slot_s_refusals_are_moving_and_nothing_else_is() {
        let kind = |code, detail| store_error(server_error(code, detail), Duration::ZERO).kind();
        assert_eq!(kind("ASK", "3999 127.0.0.1:7001"), "moving");
        assert_eq!(kind("MOVED", "3999 127.0.0.1:7001"), "moving");
        assert_eq!(
            kind("TRYAGAIN", "Multiple keys request during rehashing of slot"),
            "moving"
        );
        assert_eq!(kind("CLUSTERDOWN", "The cluster is down"), "unavailable");
        assert_eq!(
            kind("READONLY", "You can't write against a read only replica."),
            "read_only"
        );
        assert!(!StoreError::Moving("ASK".into()).is_store_wide());
        assert!(StoreError::unavailable("down").is_store_wide());
    }
}
