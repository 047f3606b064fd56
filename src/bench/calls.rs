//! `tollgate bench-calls` (hidden): sends calls of the Redis protocol to a Redis, built and
//! decoded by the store's own code (`storage::redis::call`), a number in flight at once; or
//! the floor, the minimal fixed-window script any one-round-trip atomic limiter needs (INCRBY,
//! PEXPIRE on the first hit). What each call costs Redis is read from Redis's own counters
//! around a run (`scripts/redis-cost`, `scripts/redis-instructions`): nothing outside this
//! file writes a call's arguments by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::algorithm::{Algorithm, Anchor, Charge, Params};
use crate::clock::{MICROS_PER_SECOND, Micros};
use crate::storage::keys::{EntryValue, counter_key};
use crate::storage::redis::call::{Call, Layout, Op, SlidingWindowLayout, StateLayout};
use crate::storage::redis::connection::call_as;
use crate::storage::{Hit, Role};

/// The floor: the cheapest atomic fixed-window counter a script can be, sent with keys as
/// long as tollgate's.
pub const FLOOR_SCRIPT: &str = "local c = redis.call('INCRBY', KEYS[1], ARGV[1]) \
     if c == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return c";

#[derive(Debug, clap::Args)]
pub struct CallsArgs {
    /// The Redis to call (`redis://host:port`).
    #[arg(long)]
    pub redis: String,

    /// What to send: `floor`, or the algorithm of every hit (`fixed_window`,
    /// `fixed_window_first_hit`, `sliding_window`, `sliding_window_counters` (written in the
    /// counters layout), `sliding_log`, `token_bucket`, `gcra`, and `token_bucket_packed`,
    /// `gcra_packed`, `sliding_log_packed` (written packed).
    #[arg(long, default_value = "fixed_window")]
    pub call: String,

    /// Hits per call, each on its own counter.
    #[arg(long, default_value_t = 1)]
    pub hits: usize,

    /// The layout to send them in (`count_one`, `count`, `decide_one`, `apply`); default:
    /// the one tollgate chooses.
    #[arg(long)]
    pub layout: Option<String>,

    /// The limit, per second (token bucket and GCRA: their burst too).
    #[arg(long, default_value_t = 1000)]
    pub limit: u64,

    /// Calls to send.
    #[arg(long, default_value_t = 10_000)]
    pub calls: u64,

    /// Counters drawn from, at random, per hit of a call.
    #[arg(long, default_value_t = 10_000)]
    pub keyspace: u64,

    /// Calls in flight at once (on one multiplexed connection: pipelined).
    #[arg(long, default_value_t = 32)]
    pub in_flight: u64,

    /// How long counters outlive their windows, in ms: an hour by default, so that a run
    /// measures a busy limiter's steady state, its counters already there.
    #[arg(long, default_value_t = 3_600_000)]
    pub grace_ms: u64,
}

/// What a run sent.
#[derive(Debug, serde::Serialize)]
pub struct CallsReport {
    pub calls: u64,
    pub seconds: f64,
    pub layout: String,
}

pub async fn run(args: &CallsArgs) -> anyhow::Result<CallsReport> {
    let client = redis::Client::open(args.redis.as_str())?;
    let connection = client.get_multiplexed_async_connection().await?;
    let shape = Shape::of(args)?;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.in_flight.max(1))
        .map(|task| {
            let (mut connection, next, shape) =
                (connection.clone(), Arc::clone(&next), shape.clone());
            let (calls, keyspace, hits, grace_ms) = (
                args.calls,
                args.keyspace.max(1),
                args.hits.max(1),
                args.grace_ms,
            );
            tokio::spawn(async move {
                let mut random =
                    0x9e37_79b9_7f4a_7c15 ^ (task + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                while next.fetch_add(1, Ordering::Relaxed) < calls {
                    random = xorshift(random);
                    let user = random % keyspace;
                    shape.send(&mut connection, user, hits, grace_ms).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(CallsReport {
        calls: args.calls,
        seconds: started.elapsed().as_secs_f64(),
        layout: shape.layout_name(args.hits.max(1)),
    })
}

/// What every call of a run is.
#[derive(Clone)]
enum Shape {
    Floor(Arc<redis::Script>),
    Hits {
        params: Params,
        layout: Option<Layout>,
        writes: Writes,
    },
}

/// The state layouts a run's calls write in.
#[derive(Clone, Copy, Default)]
struct Writes {
    sliding_window: SlidingWindowLayout,
    state_layout: StateLayout,
}

impl Shape {
    fn of(args: &CallsArgs) -> anyhow::Result<Self> {
        let mut writes = Writes::default();
        let algorithm = match args.call.as_str() {
            "floor" => return Ok(Shape::Floor(Arc::new(redis::Script::new(FLOOR_SCRIPT)))),
            "sliding_window_counters" => {
                writes.sliding_window = SlidingWindowLayout::Counters;
                Algorithm::SlidingWindow
            }
            "token_bucket_packed" => {
                writes.state_layout = StateLayout::Packed;
                Algorithm::TokenBucket { burst: args.limit }
            }
            "gcra_packed" => {
                writes.state_layout = StateLayout::Packed;
                Algorithm::Gcra { burst: args.limit }
            }
            "sliding_log_packed" => {
                writes.state_layout = StateLayout::Packed;
                Algorithm::SlidingLog { min_interval: 0 }
            }
            "fixed_window_first_hit" => Algorithm::FixedWindow {
                anchor: Anchor::FirstHit,
            },
            "token_bucket" => Algorithm::TokenBucket { burst: args.limit },
            "gcra" => Algorithm::Gcra { burst: args.limit },
            name => name
                .parse::<Algorithm>()
                .map_err(|error| anyhow::anyhow!("--call: {error}, or floor"))?,
        };
        let layout = match args.layout.as_deref() {
            None => None,
            Some(name) => Some(
                Layout::ALL
                    .into_iter()
                    .find(|layout| layout.name() == name)
                    .ok_or_else(|| anyhow::anyhow!("--layout: no layout named {name:?}"))?,
            ),
        };
        let params = Params {
            algorithm,
            requests: args.limit,
            window: MICROS_PER_SECOND,
        };
        Ok(Shape::Hits {
            params,
            layout,
            writes,
        })
    }

    /// The layout the calls go in (a call of `hits` hits of this shape, as `send` builds it).
    fn layout_name(&self, hits: usize) -> String {
        match self {
            Shape::Floor(_) => "floor".to_owned(),
            Shape::Hits {
                params,
                layout,
                writes,
            } => {
                let hits = hits_of(params, 0, hits);
                let call = call(&hits, 0, *writes);
                layout
                    .unwrap_or_else(|| Layout::of(&call))
                    .name()
                    .to_owned()
            }
        }
    }

    async fn send(
        &self,
        connection: &mut redis::aio::MultiplexedConnection,
        user: u64,
        count: usize,
        grace_ms: u64,
    ) -> anyhow::Result<()> {
        let (params, layout, writes) = match self {
            Shape::Floor(script) => {
                // A key as long as a counter's (key length is part of what Redis spends).
                let params = Params {
                    algorithm: Algorithm::default(),
                    requests: 1000,
                    window: MICROS_PER_SECOND,
                };
                let key = &hits_of(&params, user, 1)[0].key;
                let _: i64 = script
                    .key(format!("{}:{FLOOR_WINDOW}", key.as_str()))
                    .arg(1)
                    .arg(grace_ms.max(1))
                    .invoke_async(connection)
                    .await?;
                return Ok(());
            }
            Shape::Hits {
                params,
                layout,
                writes,
            } => (params, layout, *writes),
        };
        let hits = hits_of(params, user, count);
        let call = call(&hits, grace_ms, writes);
        let layout = layout.unwrap_or_else(|| Layout::of(&call));
        call_as(connection, &call, layout).await?;
        Ok(())
    }
}

/// `count` hits of one user, each on its own counter.
fn hits_of(params: &Params, user: u64, count: usize) -> Vec<Hit> {
    (0..count)
        .map(|index| Hit {
            descriptor: index,
            key: counter_key(
                "bench",
                [("user", EntryValue::Actual(&format!("{user}-{index}")))],
                params,
            ),
            params: *params,
            hits: 1,
            role: Role::Enforced,
            charge: Charge::IfAllowed,
            lease: crate::limit::Lease::AsConfigured,
        })
        .collect()
}

/// The instant every call is made at, in every run: the floor's window. A run then finds the
/// counters the run before it left, whatever its speed (under callgrind a run spans many
/// seconds, and calls at the clock's instant would name a new fixed window's counter every
/// second and grow a sliding log by one run per instant, which the floor's one key does not).
const AT: Micros = FLOOR_WINDOW * MICROS_PER_SECOND;

/// The window number the floor's key ends with (a second's, as `AT`'s).
const FLOOR_WINDOW: u64 = 1_795_000_000;

/// A call of `hits` at `AT`, as one request's.
fn call(hits: &[Hit], grace_ms: u64, writes: Writes) -> Call<'_> {
    Call {
        op: Op::Apply { now: AT },
        hits,
        node: None,
        complete: true,
        prefix: "",
        grace_ms,
        sliding_window: writes.sliding_window,
        state_layout: writes.state_layout,
    }
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}
