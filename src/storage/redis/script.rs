//! The counter script: the Lua ports of the algorithms (`lua/`, one file per algorithm, each
//! with the `decide` and `give_back` of its Rust twin in src/algorithm/) joined into one
//! script, and the encoding of a call to it. The calling convention is documented in
//! lua/apply.lua.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind};

use crate::algorithm::{Charge, Outcome, Refund};
use crate::clock::Micros;
use crate::storage::{Hit, Role, StoreError};

/// The parts, in the order the script needs them: helpers, one file per algorithm (each
/// registers itself by its key tag), the entry point.
const SOURCE: [&str; 7] = [
    include_str!("lua/prelude.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/apply.lua"),
];

static SOURCE_TEXT: LazyLock<String> = LazyLock::new(|| SOURCE.join("\n"));

/// The script, with its SHA1 computed once.
pub static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&SOURCE_TEXT));

/// The text of `CROSS_SLOT_SCRIPT`.
static CROSS_SLOT_TEXT: LazyLock<String> =
    LazyLock::new(|| format!("#!lua flags=allow-cross-slot-keys\n{}", *SOURCE_TEXT));

/// The same script declared `allow-cross-slot-keys` (Redis 7+; older versions cannot even
/// compile it): on a cluster it may touch the counters of every slot its node serves.
pub static CROSS_SLOT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&CROSS_SLOT_TEXT));

/// Whether a call decides hits or gives back hits a vetoed request consumed elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Apply,
    /// Gives back, at the instant the consuming call returned, each hit's `hits`.
    Refund {
        at: Micros,
    },
}

/// One call: `hits` (all in one slot, or with `node` on one node), and whether they are the
/// whole request.
pub struct Call<'a> {
    pub mode: Mode,
    pub hits: &'a [Hit],
    /// `Some(host, port)`: the hits span several slots of the cluster node at that address,
    /// and go to it by `CROSS_SLOT_SCRIPT`, declaring no key (Redis requires declared keys to
    /// share a slot). With no declared key Redis never redirects the call (no MOVED, no ASK, so
    /// no ASKING that would make a migrating slot's missing counters look local): a counter
    /// not on the node fails the script's read of it, before any write.
    pub node: Option<(&'a str, u16)>,
    /// Explicit time for tests; `None` uses Redis `TIME`.
    pub now: Option<Micros>,
    pub charge: Charge,
    pub complete: bool,
    /// For a refund: the state numbers the apply call reported per hit (`Reply::states`).
    pub expected: &'a [(i64, i64)],
    /// Put before every key (`--store-key-prefix`); it holds no `{`, so slots are unchanged.
    pub prefix: &'a str,
}

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The instant the script decided at (Redis time unless explicit).
    pub now: Micros,
    /// Whether the hits were consumed (not vetoed within the call).
    pub committed: bool,
    pub outcomes: Vec<Outcome>,
    /// Per hit, the first two numbers of its counter's state after the call (-1: none).
    pub states: Vec<(i64, i64)>,
}

impl Call<'_> {
    /// Sends the call: EVALSHA, and on NOSCRIPT (a restarted node, a promoted replica, SCRIPT
    /// FLUSH) EVAL with the whole script, which also caches it on that node. Not redis-rs's
    /// ScriptInvocation: its NOSCRIPT recovery sends SCRIPT LOAD to every node of a cluster
    /// and fails while any node is down, which is exactly when a failover needs it.
    pub async fn invoke(&self, connection: &mut impl ConnectionLike) -> RedisResult<Vec<i64>> {
        let (script, text) = self.script();
        match self
            .command("EVALSHA", script.get_hash())
            .query_async(connection)
            .await
        {
            Err(error) if is_no_script(&error) => {
                self.command("EVAL", text).query_async(connection).await
            }
            result => result,
        }
    }

    /// `invoke` on the cluster node at `host:port` (a cross-slot call has no key to route by).
    pub async fn invoke_on(
        &self,
        connection: &mut ClusterConnection,
        (host, port): (&str, u16),
    ) -> RedisResult<Vec<i64>> {
        let node = || {
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            })
        };
        let (script, text) = self.script();
        let reply = match connection
            .route_command(self.command("EVALSHA", script.get_hash()), node())
            .await
        {
            Err(error) if is_no_script(&error) => {
                connection
                    .route_command(self.command("EVAL", text), node())
                    .await
            }
            result => result,
        }?;
        Ok(redis::from_redis_value(reply)?)
    }

    fn script(&self) -> (&'static Script, &'static str) {
        if self.node.is_some() {
            (&CROSS_SLOT_SCRIPT, CROSS_SLOT_TEXT.as_str())
        } else {
            (&SCRIPT, SOURCE_TEXT.as_str())
        }
    }

    /// `EVALSHA sha numkeys key… arg…` or `EVAL script numkeys key… arg…`; redis-rs routes it on
    /// a cluster by its first key.
    fn command(&self, name: &str, script: &str) -> Cmd {
        // Sized for the whole call up front (8 arguments, then 11 per hit, keys of about 70
        // bytes), so building it does not reallocate as arguments are added.
        let hits = self.hits.len();
        let mut command = Cmd::with_capacity(8 + 11 * hits, 96 + 160 * hits);
        command.arg(name).arg(script);
        if self.node.is_some() {
            command.arg(0);
        } else {
            command.arg(hits);
            for hit in self.hits {
                self.key_arg(&mut command, hit);
            }
        }
        let (mode, now) = match self.mode {
            Mode::Apply => ("apply", self.now.map(|now| now.to_string())),
            Mode::Refund { at } => ("refund", Some(at.to_string())),
        };
        command
            .arg(mode)
            .arg(now.unwrap_or_default())
            .arg(if self.charge == Charge::Always {
                "1"
            } else {
                "0"
            })
            .arg(if self.complete { "1" } else { "0" })
            .arg(hits);
        for (index, hit) in self.hits.iter().enumerate() {
            let params = &hit.params;
            let tick = params.tick().unwrap_or(1_000_000);
            command
                .arg(params.algorithm.key_tag())
                .arg(params.requests)
                .arg(params.window)
                .arg(tick)
                .arg(params.algorithm.parameter_in_ticks(tick))
                .arg(hit.hits)
                .arg(match hit.role {
                    Role::Enforced => "e",
                    Role::Quota => "q",
                    Role::Shadow => "s",
                })
                .arg(hit.descriptor);
            // A refund of an `IfUnchanged` counter names the state it requires.
            let condition = match (self.mode, params.algorithm.refund()) {
                (Mode::Refund { .. }, Refund::IfUnchanged) => self.expected.get(index).copied(),
                _ => None,
            };
            match condition {
                Some((first, second)) => command.arg(first).arg(second),
                None => command.arg("").arg(""),
            };
        }
        if self.node.is_some() {
            for hit in self.hits {
                self.key_arg(&mut command, hit);
            }
        }
        command
    }

    fn key_arg(&self, command: &mut Cmd, hit: &Hit) {
        if self.prefix.is_empty() {
            command.arg(hit.key.as_str());
        } else {
            command.arg([self.prefix, hit.key.as_str()].concat());
        }
    }
}

fn is_no_script(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Numbers per hit in a reply.
const PER_HIT: usize = 6;

/// Reads the script's reply for `count` hits.
pub fn parse_reply(values: &[i64], count: usize) -> Result<Reply, StoreError> {
    let malformed = || StoreError::MalformedReply(format!("counter script answered {values:?}"));
    let (head, outcomes) = values.split_at_checked(2).ok_or_else(malformed)?;
    if outcomes.len() != count * PER_HIT {
        return Err(malformed());
    }
    let non_negative = |value: i64| u64::try_from(value).map_err(|_| malformed());
    Ok(Reply {
        now: non_negative(head[0])?,
        committed: head[1] == 1,
        states: outcomes
            .chunks_exact(PER_HIT)
            .map(|o| (o[4], o[5]))
            .collect(),
        outcomes: outcomes
            .chunks_exact(PER_HIT)
            .map(|o| {
                Ok(Outcome {
                    allowed: o[0] == 1,
                    remaining: non_negative(o[1])?,
                    reset_after: non_negative(o[2])?,
                    retry_after: non_negative(o[3])?,
                })
            })
            .collect::<Result<_, StoreError>>()?,
    })
}
