//! The connections a Redis store calls on: made in the background with backoff (starting
//! without Redis is normal: it may come up after us), then taken in turn; each serving runtime
//! besides the main one gets one of its own, made on it, so that its driver task runs on the
//! same thread as the calls it carries. Until the first connection is up every call fails
//! fast. Once up, the slot map (on a cluster) and Redis's clock are read before the first call
//! is let through, and kept fresh through whichever connections are current.
//!
//! The connections can be made again (`rebuild`, see `doctor.rs`): a connection that answers
//! but cannot serve (to a master demoted behind an address now pointing at the new master,
//! which answers READONLY; a cluster client wedged after a slot migration) is left for fresh
//! ones, while calls keep using the old ones until the fresh ones are up.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use super::clock::{self, RedisClock};
use super::connection::{Connection, Current, Timeouts, connect, connect_all};
use super::slots::Topology;
use super::url::RedisSpec;
use crate::storage::StoreError;

/// Backoff of the background connect: from 100 ms, doubling, at most 5 s apart.
const CONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

pub struct Pool {
    /// The shared connections, once up; calls take them in turn.
    shared: ArcSwapOption<Generation>,
    next: AtomicUsize,
    /// The connections of runtimes 1.. (see `StoreOptions::runtimes`).
    local: Arc<[LocalConnection]>,
    spec: RedisSpec,
    timeouts: Timeouts,
    count: usize,
    /// A rebuild is under way.
    rebuilding: AtomicBool,
}

/// One making of the shared connections; a runtime's own connection belongs to one too, and
/// is made again when it is not the current one's.
struct Generation {
    number: u64,
    connections: Box<[Connection]>,
}

/// A runtime's own connection, made in the background on that runtime, with the number of
/// the generation it was made for.
#[derive(Default)]
struct LocalConnection {
    made: ArcSwapOption<(u64, Connection)>,
    connecting: AtomicBool,
}

/// What the pool keeps fresh once connected.
pub struct Tracked {
    pub topology: Weak<Topology>,
    pub slot_map_refresh: Duration,
    pub clock: Weak<RedisClock>,
}

impl Pool {
    /// Starts connecting `count` connections in the background (and, for `runtimes` serving
    /// runtimes, one more per runtime besides the first, on first use). Must run inside a
    /// tokio runtime.
    pub fn start(
        spec: RedisSpec,
        timeouts: Timeouts,
        count: usize,
        runtimes: usize,
        tracked: Tracked,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            shared: ArcSwapOption::empty(),
            next: AtomicUsize::new(0),
            local: (1..runtimes).map(|_| LocalConnection::default()).collect(),
            spec,
            timeouts,
            count: count.max(1),
            rebuilding: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&pool);
        let (spec, count) = (pool.spec.clone(), pool.count);
        tokio::spawn(async move {
            let connections = connect_with_backoff(&spec, timeouts, count).await;
            let Some(pool) = weak.upgrade() else {
                return;
            };
            if let Some(first) = connections.first() {
                // The slot map is read before the first call can be made, so that calls
                // group by node from the start.
                if let (true, Some(known)) = (spec.cluster, tracked.topology.upgrade()) {
                    known.refresh(first).await;
                    Topology::keep_fresh(
                        tracked.topology,
                        current(&weak),
                        tracked.slot_map_refresh,
                    );
                }
                // Redis's clock is known before the first decision (or, if the sample was
                // too slow to trust, a moment later: until then calls fail).
                if let Some(known) = tracked.clock.upgrade() {
                    let used = clock::sample(&known, first).await;
                    clock::keep_tracking(tracked.clock, current(&weak), used);
                }
            }
            pool.shared.store(Some(Arc::new(Generation {
                number: 0,
                connections,
            })));
        });
        pool
    }

    /// A connection to call on: this runtime's own, or the shared ones in turn.
    pub fn connection(&self) -> Result<Connection, StoreError> {
        let generation = self
            .shared
            .load_full()
            .ok_or_else(|| StoreError::unavailable("not connected to Redis yet"))?;
        if let Some(local) = self.local_connection(generation.number) {
            return Ok(local);
        }
        shared_connection(&generation, &self.next)
    }

    /// Makes every connection again, in the background, unless a rebuild is under way or
    /// the first connections are not up yet; calls use the current ones until the fresh ones
    /// are up, and keep them if making them fails. Whether a rebuild started.
    pub fn rebuild(self: &Arc<Self>, why: &str) -> bool {
        if self.shared.load().is_none() || self.rebuilding.swap(true, Ordering::AcqRel) {
            return false;
        }
        tracing::warn!(store = %self.spec, why, "making the Redis connections again");
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            match connect_all(&pool.spec, pool.timeouts, pool.count).await {
                Ok(connections) => {
                    let number = pool.shared.load().as_ref().map_or(0, |made| made.number) + 1;
                    pool.shared.store(Some(Arc::new(Generation {
                        number,
                        connections,
                    })));
                    tracing::info!(store = %pool.spec, "made the Redis connections again");
                }
                Err(error) => tracing::warn!(
                    store = %pool.spec, %error,
                    "making the Redis connections again failed; keeping the current ones"
                ),
            }
            pool.rebuilding.store(false, Ordering::Release);
        });
        true
    }

    /// Whether a connection made apart from the pool, now, takes the `probe` write and tells
    /// the time:
    /// whether Redis serves, whatever state the pool's connections are in.
    pub async fn fresh_look(&self, probe: &redis::Cmd) -> bool {
        let look = async {
            let connection = connect(&self.spec, self.timeouts).await?;
            connection.query::<i64>(probe).await?;
            connection.time().await
        };
        let worked = look.await.is_ok();
        tracing::info!(store = %self.spec, worked, "looked at Redis through a fresh connection, every call having failed for --store-stuck-after");
        worked
    }

    /// This runtime's own connection of generation `number`, once made. The first call on a
    /// runtime without one starts making it there (after the shared connections are up, so
    /// never while Redis is unreachable), and uses the shared connections meanwhile: no call
    /// waits for a connect.
    fn local_connection(&self, number: u64) -> Option<Connection> {
        let index = crate::runtime::index().checked_sub(1)?;
        let slot = self.local.get(index)?;
        if let Some(made) = slot.made.load().as_ref()
            && made.0 == number
        {
            return Some(made.1.clone());
        }
        if !slot.connecting.swap(true, Ordering::AcqRel) {
            let (local, spec, timeouts) =
                (Arc::clone(&self.local), self.spec.clone(), self.timeouts);
            // Spawned here: on this runtime, where the connection's driver must run.
            tokio::spawn(async move {
                let Some(slot) = local.get(index) else {
                    return;
                };
                match connect(&spec, timeouts).await {
                    Ok(connection) => slot.made.store(Some(Arc::new((number, connection)))),
                    Err(error) => {
                        // The shared connections serve meanwhile: no hurry to retry.
                        tracing::warn!(%error, runtime = index + 1, retry_in = ?CONNECT_BACKOFF.1, "a runtime's own Redis connection failed");
                        tokio::time::sleep(CONNECT_BACKOFF.1).await;
                    }
                }
                slot.connecting.store(false, Ordering::Release);
            });
        }
        None
    }
}

fn shared_connection(
    generation: &Generation,
    next: &AtomicUsize,
) -> Result<Connection, StoreError> {
    let connections = &generation.connections;
    let turn = next.fetch_add(1, Ordering::Relaxed) % connections.len().max(1);
    connections
        .get(turn)
        .cloned()
        .ok_or_else(|| StoreError::unavailable("no Redis connection"))
}

/// The pool's current shared connection, while the pool lives.
fn current(pool: &Weak<Pool>) -> Current {
    let pool = pool.clone();
    Arc::new(move || {
        let pool = pool.upgrade()?;
        let generation = pool.shared.load_full()?;
        shared_connection(&generation, &pool.next).ok()
    })
}

/// Connects until it succeeds, with backoff, saying why it waits.
async fn connect_with_backoff(
    spec: &RedisSpec,
    timeouts: Timeouts,
    count: usize,
) -> Box<[Connection]> {
    let mut wait = CONNECT_BACKOFF.0;
    loop {
        match connect_all(spec, timeouts, count).await {
            Ok(connections) => {
                tracing::info!(store = %spec, connections = count, "connected to Redis");
                return connections;
            }
            Err(error) if error.is_transient() => {
                tracing::warn!(store = %spec, %error, retry_in = ?wait, "Redis not reachable yet");
            }
            // Answered, but no: retrying is still right (a rotated secret may fix it), but
            // someone must act, so it is an error with what to check.
            Err(error) => {
                let hint = refusal_hint(&error);
                tracing::error!(store = %spec, %error, retry_in = ?wait, "Redis refused tollgate: {hint}");
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(CONNECT_BACKOFF.1);
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
    } else if text.contains("READONLY") {
        "the address leads to a replica; tollgate needs the master"
    } else {
        "see the error; tollgate keeps retrying"
    }
}
