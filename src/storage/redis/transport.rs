//! How a call reaches the server: FCALL of its layout's function; a server without the
//! library gets it (FUNCTION LOAD) and the call again; where functions cannot run, or the
//! library cannot be loaded right now (a cluster node down), the call goes by script
//! (EVALSHA, and on NOSCRIPT, EVAL with the whole script, which also caches it on that node).
//! Not redis-rs's ScriptInvocation: its NOSCRIPT recovery sends SCRIPT LOAD to every node of a
//! cluster and fails while any node is down, which is exactly when a failover needs it.

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};

use super::call::{Call, Layout};
use super::library::{self, Function};

/// Where a call's commands go: one connection, or one node of a cluster.
pub(super) trait Target {
    async fn send(&mut self, command: Cmd) -> RedisResult<Value>;
}

/// A single server's connection (or a cluster's, routed by redis-rs by the first key).
pub(super) struct Plain<'a, C>(pub &'a mut C);

impl<C: ConnectionLike> Target for Plain<'_, C> {
    async fn send(&mut self, command: Cmd) -> RedisResult<Value> {
        command.query_async(self.0).await
    }
}

/// One node of a cluster: the one serving the call's first key, or, for a cross-slot call,
/// the node at its address, or the node an ASK redirection names; a missing library is
/// loaded on that node only.
pub(super) struct Routed<'a> {
    connection: &'a mut ClusterConnection,
    routing: RoutingInfo,
    /// Each command goes after ASKING, in one pipeline, so that no other caller's command on
    /// the shared connection takes the ASKING meant for it (redis-rs sends ASKING and the
    /// command as two requests, which under load lets the command bounce back as MOVED).
    asking: bool,
}

impl<'a> Routed<'a> {
    pub fn new(connection: &'a mut ClusterConnection, call: &Call<'_>) -> Self {
        let routing = match call.node {
            Some((host, port)) => RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            }),
            None => RoutingInfo::SingleNode(match call.hits.first() {
                // The prefix holds no `{`, so the slot is the key's.
                Some(hit) => SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    hit.key.as_str(),
                    SlotAddr::Master,
                )),
                None => SingleNodeRoutingInfo::Random,
            }),
        };
        Self {
            connection,
            routing,
            asking: false,
        }
    }

    /// To the node at `host:port` that an ASK redirection named, each command after ASKING.
    pub fn asking(connection: &'a mut ClusterConnection, host: &str, port: u16) -> Self {
        let node = SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        };
        Self {
            connection,
            routing: RoutingInfo::SingleNode(node),
            asking: true,
        }
    }
}

impl Target for Routed<'_> {
    /// A routed command answers a server's error as a value: it is made an error here, as a
    /// plain connection's is.
    async fn send(&mut self, command: Cmd) -> RedisResult<Value> {
        let node = match &self.routing {
            RoutingInfo::SingleNode(node) if self.asking => node.clone(),
            routing => {
                return self
                    .connection
                    .route_command(command, routing.clone())
                    .await
                    .and_then(Value::extract_error);
            }
        };
        let mut pipeline = redis::pipe();
        pipeline
            .add_command(redis::cmd("ASKING"))
            .add_command(command);
        let mut replies = self.connection.route_pipeline(pipeline, 1, 1, node).await?;
        match replies.pop() {
            Some(reply) => reply.extract_error(),
            None => Err(RedisError::from((
                ErrorKind::Client,
                "no reply after ASKING",
            ))),
        }
    }
}

/// Sends `call` as `layout` and returns the raw reply.
pub(super) async fn send(
    call: &Call<'_>,
    layout: Layout,
    to: &mut impl Target,
) -> RedisResult<Value> {
    let function = Function {
        layout,
        cross_slot: call.node.is_some(),
    };
    if library::functions_usable() {
        let fcall = || command("FCALL", function.name(), call, layout);
        match to.send(fcall()).await {
            Err(error) if library::is_missing(&error) => {
                if load_library(to).await {
                    return to.send(fcall()).await;
                }
            }
            Err(error) if library::gives_up_functions(&error) => {}
            result => return result,
        }
    }
    let Some((script, text)) = function.script() else {
        return Err(RedisError::from((
            ErrorKind::Client,
            "no script for this layout",
            layout.name().to_owned(),
        )));
    };
    match to
        .send(command("EVALSHA", script.get_hash(), call, layout))
        .await
    {
        Err(error) if library::is_no_script(&error) => {
            to.send(command("EVAL", text, call, layout)).await
        }
        result => result,
    }
}

/// Loads the library where `to` leads; whether calls can now go by FCALL.
async fn load_library(to: &mut impl Target) -> bool {
    match to.send(library::load_command()).await {
        Ok(_) => true,
        Err(error) if library::is_loaded_already(&error) => true,
        Err(error) if library::gives_up_functions(&error) => false,
        Err(error) => {
            tracing::warn!(%error, "loading tollgate's functions failed; this call goes by script");
            false
        }
    }
}

/// `verb target numkeys key… arg…`, where `verb target` is `FCALL function`, `EVALSHA sha`
/// or `EVAL script`, the keys each hit's, then a lease's tally or the window counter of each
/// sliding window written as counters (`Call::window_counter`); across slots no key is
/// declared and the keys follow the arguments.
fn command(verb: &str, target: &str, call: &Call<'_>, layout: Layout) -> Cmd {
    // Sized up front (keys of about 90 bytes, a few numbers a hit), so that building the
    // command does not reallocate as arguments are added.
    let hits = call.hits.len();
    let mut command = Cmd::with_capacity(6 + 2 * hits, 96 + 180 * hits);
    command.arg(verb).arg(target);
    match call.node {
        Some(_) => {
            command.arg(0);
            layout.encode(call, &mut command);
            for hit in call.hits {
                command.arg(call.key(hit));
            }
            for counter in call.hits.iter().filter_map(|hit| call.window_counter(hit)) {
                command.arg(counter);
            }
        }
        None => {
            let tally = call.hits.first().filter(|_| layout.declares_tally());
            let windows: Vec<String> = call
                .hits
                .iter()
                .filter_map(|hit| call.window_counter(hit))
                .collect();
            command.arg(hits + usize::from(tally.is_some()) + windows.len());
            for hit in call.hits {
                command.arg(call.key(hit));
            }
            if let Some(hit) = tally {
                command.arg(call.tally_key(hit));
            }
            for counter in windows {
                command.arg(counter);
            }
            layout.encode(call, &mut command);
        }
    }
    command
}
