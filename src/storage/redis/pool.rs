//! The connections a Redis store calls on: made in the background with backoff (starting
//! without Redis is normal: it may come up after us), then taken in turn; each serving runtime
//! besides the main one gets one of its own, made on it, so that its driver task runs on the
//! same thread as the calls it carries. Until the first connection is up every call fails
//! fast. Once up, the slot map (on a cluster) and Redis's clock are read before the first
//! call is let through.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use super::clock::{self, RedisClock};
use super::connection::{Connection, connect, connect_all};
use super::slots::Topology;
use super::url::RedisSpec;
use crate::storage::StoreError;

/// Backoff of the background connect: from 100 ms, doubling, at most 5 s apart.
const CONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

pub struct Pool {
    /// Set once every connection is up; calls take them in turn.
    connections: Arc<OnceLock<Box<[Connection]>>>,
    next: AtomicUsize,
    /// The connections of runtimes 1.. (see `StoreOptions::runtimes`).
    local: Arc<[LocalConnection]>,
    spec: RedisSpec,
    timeout: Duration,
}

/// A runtime's own connection, made in the background on that runtime.
#[derive(Default)]
struct LocalConnection {
    connection: OnceLock<Connection>,
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
        timeout: Duration,
        count: usize,
        runtimes: usize,
        tracked: Tracked,
    ) -> Self {
        let pool = Self {
            connections: Arc::new(OnceLock::new()),
            next: AtomicUsize::new(0),
            local: (1..runtimes).map(|_| LocalConnection::default()).collect(),
            spec: spec.clone(),
            timeout,
        };
        let slot = Arc::clone(&pool.connections);
        tokio::spawn(async move {
            let connections = connect_with_backoff(&spec, timeout, count.max(1)).await;
            if let Some(first) = connections.first() {
                // The slot map is read before the first call can be made, so that calls
                // group by node from the start.
                if let (true, Some(known)) = (spec.cluster, tracked.topology.upgrade()) {
                    known.refresh(first).await;
                    Topology::keep_fresh(tracked.topology, first.clone(), tracked.slot_map_refresh);
                }
                // Redis's clock is known before the first decision (or, if the sample was
                // too slow to trust, a moment later: until then calls fail).
                if let Some(known) = tracked.clock.upgrade() {
                    let used = clock::sample(&known, first).await;
                    clock::keep_tracking(tracked.clock, first.clone(), used);
                }
            }
            let _ = slot.set(connections);
        });
        pool
    }

    /// A connection to call on: this runtime's own, or the shared ones in turn.
    pub fn connection(&self) -> Result<&Connection, StoreError> {
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
            let (local, spec, timeout) = (Arc::clone(&self.local), self.spec.clone(), self.timeout);
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
}

/// Connects until it succeeds, with backoff, saying why it waits.
async fn connect_with_backoff(
    spec: &RedisSpec,
    timeout: Duration,
    count: usize,
) -> Box<[Connection]> {
    let mut wait = CONNECT_BACKOFF.0;
    loop {
        match connect_all(spec, timeout, count).await {
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
    } else {
        "see the error; tollgate keeps retrying"
    }
}
