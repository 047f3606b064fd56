//! A call to the counter code (`library.rs`): how it reaches the server (FCALL, or by script
//! where functions cannot run) and what it answered; its arguments are written by
//! `arguments.rs`. A call whose every hit is a counter
//! (`counter.rs`) goes to lua/counter.lua's entry point, any other to lua/apply.lua's; each
//! documents its calling convention. Both answer in apply.lua's form (`parse_reply`).

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, RedisError, RedisResult, Value};

use super::counter::{self, is_counter};
use super::found;
use super::library::{self, Entry};
use crate::algorithm::{Charge, Outcome};
use crate::clock::{Clock, Micros, SystemClock};
use crate::storage::{Hit, StoreError};

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
    /// The instant to decide at: the store passes Redis's clock as it tracks it, tests an
    /// explicit instant; `None`: this machine's clock, read once per call.
    pub now: Option<Micros>,
    pub charge: Charge,
    pub complete: bool,
    /// For a refund: the state numbers the apply call reported per hit (`Reply::states`).
    pub expected: &'a [(i64, i64)],
    /// Put before every key (`--store-key-prefix`); it holds no `{`, so slots are unchanged.
    pub prefix: &'a str,
    /// How long past the moment its state stops mattering a counter is kept, in ms
    /// (`clock::grace`): a hit decided at an instant of a window that reaches Redis late must
    /// find that window's counter, never start it again.
    pub grace_ms: u64,
}

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The instant the call decided at.
    pub now: Micros,
    /// Whether the hits were consumed (not vetoed within the call).
    pub committed: bool,
    pub outcomes: Vec<Outcome>,
    /// Per hit, the first two numbers of its counter's state after the call (-1: none).
    pub states: Vec<(i64, i64)>,
}

impl Call<'_> {
    /// Sends the call on a single server's connection (or on a cluster, routed by redis-rs by
    /// its first key).
    pub async fn invoke(&self, connection: &mut impl ConnectionLike) -> RedisResult<Vec<i64>> {
        self.run(&mut Plain(connection)).await
    }

    /// Sends the call to the cluster node that serves its first key, or, for a cross-slot call
    /// (`node`), to the node at that address; a missing library is loaded on that node only.
    pub async fn invoke_on_cluster(
        &self,
        connection: &mut ClusterConnection,
    ) -> RedisResult<Vec<i64>> {
        let routing = match self.node {
            Some((host, port)) => RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            }),
            None => RoutingInfo::SingleNode(match self.hits.first() {
                // The prefix holds no `{`, so the slot is the key's.
                Some(hit) => SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    hit.key.as_str(),
                    SlotAddr::Master,
                )),
                None => SingleNodeRoutingInfo::Random,
            }),
        };
        self.run(&mut Routed {
            connection,
            routing,
        })
        .await
    }

    /// FCALL; a server without the library gets it (FUNCTION LOAD) and the call again. Where
    /// functions cannot run, or the library cannot be loaded right now (a cluster node down),
    /// the call goes by script. Answers in apply.lua's form.
    async fn run(&self, to: &mut impl Target) -> RedisResult<Vec<i64>> {
        let instant = self.instant();
        let entry = self.entry();
        let cross_slot = self.node.is_some();
        let raw = 'raw: {
            if library::functions_usable() {
                let call = || {
                    self.command(
                        "FCALL",
                        library::function(entry, cross_slot),
                        instant,
                        entry,
                    )
                };
                match to.send(call()).await {
                    Err(error) if library::is_missing(&error) => {
                        if self.load_library(to).await {
                            break 'raw to.send(call()).await?;
                        }
                    }
                    Err(error) if library::gives_up_functions(&error) => {}
                    result => break 'raw result?,
                }
            }
            self.run_script(to, entry, cross_slot, instant).await?
        };
        if let Some(hit) = self.lone_hit_found() {
            return found::general_reply(hit, &raw, instant, self.charge, self.complete).map_err(
                |error| {
                    RedisError::from((redis::ErrorKind::Parse, "counter reply", error.to_string()))
                },
            );
        }
        // The count entry answers one hit alone with one integer.
        let values = match raw {
            Value::Int(packed) => vec![packed],
            raw => decode(raw)?,
        };
        let mut values = values;
        if entry == Entry::Count && self.sends_distinct() {
            // The distinct mode answers its counts first and committed last.
            values.rotate_right(1);
        }
        match entry {
            Entry::Apply => Ok(values),
            Entry::Count => counter::general_reply(
                self.hits,
                &values,
                instant,
                matches!(self.mode, Mode::Refund { .. }),
                self.charge,
            )
            .map_err(|error| {
                RedisError::from((redis::ErrorKind::Parse, "counter reply", error.to_string()))
            }),
        }
    }

    /// Loads the library where `to` leads; whether calls can now go by FCALL.
    async fn load_library(&self, to: &mut impl Target) -> bool {
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

    /// EVALSHA, and on NOSCRIPT (a restarted node, a promoted replica, SCRIPT FLUSH) EVAL
    /// with the whole script, which also caches it on that node. Not redis-rs's
    /// ScriptInvocation: its NOSCRIPT recovery sends SCRIPT LOAD to every node of a cluster
    /// and fails while any node is down, which is exactly when a failover needs it.
    async fn run_script(
        &self,
        to: &mut impl Target,
        entry: Entry,
        cross_slot: bool,
        instant: Micros,
    ) -> RedisResult<Value> {
        let (script, text) = library::script(entry, cross_slot);
        match to
            .send(self.command("EVALSHA", script.get_hash(), instant, entry))
            .await
        {
            Err(error) if library::is_no_script(&error) => {
                to.send(self.command("EVAL", text, instant, entry)).await
            }
            result => result,
        }
    }

    /// The instant the call decides at: a refund's is its apply call's, so that a counter's
    /// window is the one that call counted in.
    fn instant(&self) -> Micros {
        match self.mode {
            Mode::Refund { at } => at,
            Mode::Apply => self.now.unwrap_or_else(|| SystemClock.now()),
        }
    }

    /// How long past the moment their state stops mattering Redis keeps the counters: the
    /// grace. Redis expires keys by its own clock: an instant more than a minute from this
    /// machine's (a test's explicit clock) keeps them an hour, so that they outlive the run.
    pub(super) fn slack_ms(&self, instant: Micros) -> u64 {
        if instant.abs_diff(SystemClock.now()) > 60_000_000 {
            self.grace_ms.max(3_600_000)
        } else {
            self.grace_ms
        }
    }

    /// The hit of a call that goes by `found.rs`: one hit alone, applied, declared as a key,
    /// not a counter, and with a state short enough (`found::takes`).
    fn lone_hit_found(&self) -> Option<&Hit> {
        match (self.hits, self.mode, self.node) {
            ([hit], Mode::Apply, None) if !is_counter(&hit.params) && found::takes(&hit.params) => {
                Some(hit)
            }
            _ => None,
        }
    }

    fn entry(&self) -> Entry {
        if !self.hits.is_empty() && self.hits.iter().all(|hit| is_counter(&hit.params)) {
            Entry::Count
        } else {
            Entry::Apply
        }
    }
}

fn decode(reply: Value) -> RedisResult<Vec<i64>> {
    redis::from_redis_value(reply).map_err(RedisError::from)
}

/// Where a call's commands go: one connection, or one node of a cluster.
trait Target {
    async fn send(&mut self, command: Cmd) -> RedisResult<Value>;
}

struct Plain<'a, C>(&'a mut C);

impl<C: ConnectionLike> Target for Plain<'_, C> {
    async fn send(&mut self, command: Cmd) -> RedisResult<Value> {
        command.query_async(self.0).await
    }
}

struct Routed<'a> {
    connection: &'a mut ClusterConnection,
    routing: RoutingInfo,
}

impl Target for Routed<'_> {
    async fn send(&mut self, command: Cmd) -> RedisResult<Value> {
        self.connection
            .route_command(command, self.routing.clone())
            .await
    }
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
