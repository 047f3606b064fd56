//! The Redis and Redis Cluster store: one implementation over redis-rs async connections
//! (multiplexed, so concurrent requests pipeline on one connection per node), laid out by
//! stage:
//!
//! - `pool.rs`: the connections, made in the background (`url.rs` where Redis is,
//!   `connection.rs` a single server, a cluster or a sentinel-watched master behind one type,
//!   and every error classified once; `sentinel.rs` following the sentinels);
//! - `fanout.rs`: a request as one call, or one call per cluster node (`slots.rs`, the slot
//!   map) and the refunds when one of them vetoes;
//! - `call/`: the protocol, every call layout named by `call::Layout`, each with its
//!   arguments and its reply's decoding;
//! - `transport.rs`: how a call travels (FCALL of the function library, `library.rs` and its
//!   `lua/`; scripts where functions cannot run);
//! - `clock.rs`: Redis's clock as this replica tracks it, the instant every call decides at;
//! - `doctor.rs`: what failing calls say about the connections (readiness, a rebuild of the
//!   pool, liveness);
//! - `per_second.rs` (a second store for per-second limits), `demand.rs` (RLQS demand
//!   shared by replicas) and `leases.rs` (a busy counter's budget leased to this replica),
//!   beside the request path.

pub mod call;
mod clock;
pub mod connection;
mod demand;
mod doctor;
mod fanout;
mod leases;
pub mod library;
pub mod per_second;
mod pool;
mod sentinel;
pub mod slots;
mod transport;
pub mod url;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use call::{Call, Op};
use clock::RedisClock;
use connection::Timeouts;
use doctor::{Doctor, Treatment};
use pool::{Pool, Tracked};
use slots::Topology;
pub use url::{RedisCertificates, RedisSpec, SpecError};

use crate::algorithm::Outcome;
use crate::clock::Micros;
use crate::storage::options::StoreOptions;
use crate::storage::{
    CountLater, CounterReset, CounterStore, Demand, DemandPost, DemandShare, Hit, StoreClock,
    StoreError,
};

pub struct RedisStore {
    pool: Arc<Pool>,
    doctor: Doctor,
    options: StoreOptions,
    topology: Arc<Topology>,
    /// The instant of each call: Redis's clock as this replica tracks it (`clock.rs`).
    clock: Arc<RedisClock>,
    /// This store's name in the lease tallies of the counters it leases (`leases.rs`).
    holder: String,
}

impl RedisStore {
    /// Creates the store and starts connecting in the background. Must run inside a tokio
    /// runtime.
    pub fn start(spec: RedisSpec, options: StoreOptions) -> Arc<Self> {
        // rediss:// goes through rustls, which needs a process-wide crypto provider; an
        // error only means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let topology = Arc::new(Topology::default());
        let clock = Arc::new(RedisClock::system(options.timeout));
        let tracked = Tracked {
            topology: Arc::downgrade(&topology),
            slot_map_refresh: options.slot_map_refresh,
            clock: Arc::downgrade(&clock),
        };
        // redis-rs's own bound is the longest a call may take; the guard bounds each call by
        // what its caller waits.
        let timeouts = Timeouts {
            connect: options.connect_timeout,
            call: options.call_bounds().longest,
        };
        let pool = Pool::start(
            spec,
            timeouts,
            options.redis_connections,
            options.runtimes,
            tracked,
        );
        let stuck_after = Some(options.stuck_after).filter(|after| !after.is_zero());
        Arc::new(Self {
            pool,
            doctor: Doctor::new(options.reconnect_on_readonly, stuck_after),
            options,
            topology,
            clock,
            holder: holder_name(),
        })
    }

    /// The instant to decide at: the injected clock's (tests), or Redis's as tracked.
    fn now(&self) -> Result<Micros, StoreError> {
        match &self.options.clock {
            Some(clock) => Ok(clock.now()),
            None => self.clock.now(),
        }
    }

    /// How long counters are kept past the moment their state stops mattering
    /// (`clock::grace`), in whole ms; with an explicit clock, which does not run with Redis's
    /// (which expires keys), an hour at least, so that they outlive a test.
    fn grace_ms(&self) -> u64 {
        let grace = clock::grace(self.options.timeout);
        let grace = u64::try_from(grace.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        match self.options.clock {
            Some(_) => grace.max(3_600_000),
            None => grace,
        }
    }

    /// Learns from a failed call (see `doctor.rs`): makes the connections again (and, on a
    /// cluster, reads the slot map again through them) when the failures call for it.
    fn treat(&self, error: &StoreError) {
        if !error.is_store_wide() {
            return;
        }
        if self.doctor.failed(error, Instant::now()) == Treatment::Rebuild {
            let why = match error {
                StoreError::ReadOnly(_) => "Redis answered READONLY (a replica)",
                _ => "every call failed for the last seconds",
            };
            if self.pool.rebuild(why) {
                self.topology.report_stale();
            }
        }
    }

    /// A write that a replica refuses, so that readiness sees what calls see: DEL of a key of
    /// its own (`<prefix>tollgate_probe`, never set), which leaves nothing behind.
    async fn probe(&self) -> Result<(), StoreError> {
        let command = self.probe_command();
        self.pool
            .connection()?
            .query::<i64>(&command)
            .await
            .map(drop)
    }

    fn probe_command(&self) -> redis::Cmd {
        let key = format!("{}tollgate_probe", self.options.key_prefix);
        redis::cmd("DEL").arg(key).to_owned()
    }

    fn call<'a>(
        &'a self,
        op: Op<'a>,
        hits: &'a [Hit],
        node: Option<(&'a str, u16)>,
        complete: bool,
    ) -> Call<'a> {
        Call {
            op,
            hits,
            node,
            complete,
            prefix: &self.options.key_prefix,
            grace_ms: self.grace_ms(),
            sliding_window: self.options.redis_sliding_window_layout,
            state_layout: self.options.redis_state_layout,
        }
    }
}

impl RedisStore {
    /// Decides `hits` at the instant `at` gives (`None`: now), the doctor told how it went.
    async fn apply_at_instant(
        &self,
        hits: &[Hit],
        at: Option<Micros>,
    ) -> Result<Vec<Outcome>, StoreError> {
        let connection = self.pool.connection()?;
        let result = match at {
            Some(at) => Ok(at),
            None => self.now(),
        };
        let result = match result {
            Ok(now) => self.apply_remote(&connection, hits, now).await,
            Err(error) => Err(error),
        };
        match &result {
            Ok(_) => self.doctor.succeeded(),
            Err(error) => self.treat(error),
        }
        result
    }
}

#[tonic::async_trait]
impl CounterStore for RedisStore {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        self.apply_at_instant(hits, None).await
    }

    /// Ready when Redis takes a write, its clock is known (no decision can be made before)
    /// and calls are not failing; stuck (liveness fails) as `doctor.rs` says.
    async fn ping(&self) -> Result<(), StoreError> {
        if self.doctor.look_due(Instant::now()) {
            let fresh_works = self.pool.fresh_look(&self.probe_command()).await;
            self.doctor.looked(Instant::now(), fresh_works);
        }
        self.doctor.check_stuck(Instant::now())?;
        if let Err(error) = self.probe().await {
            self.treat(&error);
            return Err(error);
        }
        self.now()?;
        match self.doctor.calls_failing(Instant::now()) {
            Some(length) => Err(StoreError::unavailable(format!(
                "every call has failed for the last {} ms",
                length.as_millis()
            ))),
            None => Ok(()),
        }
    }

    /// redis-rs's own bound is the longest any call may wait, so a call its caller gave up
    /// on earlier ends here: without this, connections that stop answering would never be
    /// made again for callers that wait less than --store-timeout-max.
    fn gave_up(&self, error: &StoreError) {
        self.treat(error);
    }
}

impl StoreClock for RedisStore {
    fn instant(&self, _: &Hit) -> Result<Micros, StoreError> {
        self.now()
    }
}

#[tonic::async_trait]
impl CountLater for RedisStore {
    async fn apply_at(&self, hits: &[Hit], at: Micros) -> Result<Vec<Outcome>, StoreError> {
        self.apply_at_instant(hits, Some(at)).await
    }
}

#[tonic::async_trait]
impl CounterReset for RedisStore {
    /// One DEL per counter, all at once (on a cluster each is routed by its key), within the
    /// store timeout. A counter of one integer per window is forgotten for the current window;
    /// a sliding window in both its layouts.
    async fn forget(&self, hits: &[Hit]) -> Result<(), StoreError> {
        let connection = self.pool.connection()?;
        let now = self.now()?;
        let connection = &connection;
        let deletes = hits.iter().map(|hit| {
            let call = self.call(Op::Apply { now }, std::slice::from_ref(hit), None, true);
            // A leased counter's tally goes with it: what was leased before is not given back.
            // A sliding window's counters go too, whichever layout wrote them.
            let command = redis::cmd("DEL")
                .arg(call.key(hit))
                .arg(call.tally_key(hit))
                .arg(call.window_counters_around(hit))
                .to_owned();
            async move { connection.query::<i64>(&command).await }
        });
        let deleted = futures_util::future::join_all(deletes);
        let results = tokio::time::timeout(self.options.timeout, deleted)
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?;
        for result in results {
            result?;
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl DemandShare for RedisStore {
    /// Within the store timeout.
    async fn share_demand(&self, post: &DemandPost<'_>) -> Result<Vec<Demand>, StoreError> {
        let connection = self.pool.connection()?;
        let shared = demand::share(&connection, &self.options.key_prefix, post);
        tokio::time::timeout(self.options.timeout, shared)
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?
    }
}

/// This store's name as a lease holder: unique to the process and to the store within it.
fn holder_name() -> String {
    static STORES: AtomicU64 = AtomicU64::new(0);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let store = STORES.fetch_add(1, Ordering::Relaxed);
    format!("{:x}.{:x}.{store}", std::process::id(), started)
}
