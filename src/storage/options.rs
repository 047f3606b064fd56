//! The store's options: every flag of `tollgate serve` that says which store to build and how
//! it behaves (flattened into `serve`, defaults in the `#[arg]`s), and `StoreSpec`, which
//! store the URLs name.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::{BoolishValueParser, TypedValueParser};

use super::guard::CallBounds;
use super::redis::call::{SlidingWindowLayout, StateLayout};
use super::redis::url::{RedisCertificates, RedisSpec, SpecError};
use crate::clock::Clock;
use crate::storage::memory::WhenFull;

/// `--lease`: whether counters whose rule does not say are leased when busy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LeaseMode {
    /// Every hit is decided by the store, unless its rule says `lease: auto`.
    #[default]
    Off,
    /// Busy fixed windows, token buckets and GCRA limits are leased, unless their rule says
    /// `lease: off`.
    Auto,
}

/// Which store to build, from `--store` (and `--store-per-second`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    Memory,
    Redis(RedisSpec),
    /// Per-second limits in the second Redis (`--store-per-second`), the others in the first.
    RedisPerSecond(RedisSpec, RedisSpec),
}

/// How the stores behave: one set of options for every store and the layers around them.
#[derive(Clone, clap::Args)]
#[command(next_help_heading = "Store")]
pub struct StoreOptions {
    /// Counter store: `memory` (in-process), `redis://[user:pass@]host:port[/db]`,
    /// `unix:///path/redis.sock[?db=N&pass=P]` (Redis on a Unix socket),
    /// `rediss://…` (TLS), `redis-cluster://[user:pass@]host:port,host:port,…`,
    /// `rediss-cluster://…`, or
    /// `redis-sentinel://[user:pass@]host:port,…/MASTER[/db][?sentinel_user=U&sentinel_pass=P]`
    /// (the master the sentinels name, followed through failovers; `rediss-sentinel://` for
    /// TLS).
    #[arg(long = "store", env = "TOLLGATE_STORE", default_value = "memory")]
    pub url: String,

    /// A second Redis for the limits whose unit is one second (the reference's
    /// REDIS_PERSECOND): a URL as --store takes, for a Redis store only. A request with limits
    /// in both stays all-or-nothing (docs/design.md).
    #[arg(long = "store-per-second", env = "TOLLGATE_STORE_PER_SECOND")]
    pub per_second_url: Option<String>,

    /// Put before every Redis key, so that several deployments can share one Redis (the
    /// reference's CACHE_KEY_PREFIX).
    #[arg(long = "store-key-prefix", env = "TOLLGATE_STORE_KEY_PREFIX", default_value = "", value_parser = key_prefix)]
    pub key_prefix: String,

    /// File holding the Redis password (overrides one in the URL); a trailing newline is
    /// ignored, an empty file gives none.
    #[arg(long, env = "TOLLGATE_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,

    /// PEM CA certificates that sign the Redis servers' certificates (else the system's
    /// roots), for `rediss://` URLs (--store and --store-per-second).
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,

    /// PEM client certificate for Redis (with --redis-tls-key), for a Redis that requires
    /// one (`tls-auth-clients`).
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CERT", requires = "redis_tls_key")]
    pub redis_tls_cert: Option<PathBuf>,

    /// PEM private key for --redis-tls-cert.
    #[arg(long, env = "TOLLGATE_REDIS_TLS_KEY", requires = "redis_tls_cert")]
    pub redis_tls_key: Option<PathBuf>,

    /// Longest wait for one Redis call, redis-rs's own retries included, when the client
    /// sent no gRPC deadline (a client that sends one gets what remains of it, up to
    /// --store-timeout-max).
    #[arg(long = "store-timeout", env = "TOLLGATE_STORE_TIMEOUT", default_value = "50ms", value_parser = crate::options::positive_duration)]
    pub timeout: Duration,

    /// Longest wait for one Redis call whatever the client's deadline: a Redis slower than
    /// this is treated as down (the circuit breaker counts it).
    #[arg(long = "store-timeout-max", env = "TOLLGATE_STORE_TIMEOUT_MAX", default_value = "1s", value_parser = crate::options::positive_duration)]
    pub timeout_max: Duration,

    /// Longest wait to make a connection to Redis (the reference's REDIS_TIMEOUT); calls are
    /// bounded by --store-timeout.
    #[arg(long = "redis-connect-timeout", env = "TOLLGATE_REDIS_CONNECT_TIMEOUT", default_value = "1s", value_parser = crate::options::positive_duration)]
    pub connect_timeout: Duration,

    /// Make fresh connections when Redis answers READONLY: the address leads to a master that
    /// was demoted (a failover by DNS, a Service or a proxy; the reference's
    /// REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR).
    #[arg(long = "redis-reconnect-on-readonly", env = "TOLLGATE_REDIS_RECONNECT_ON_READONLY", num_args = 0..=1, default_value = "true", default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub reconnect_on_readonly: bool,

    /// Fail liveness (`/healthz`) when every Redis call has failed this long although fresh
    /// connections were made meanwhile: the client cannot recover by itself, a restart may
    /// (0s: never). A Redis that refuses connections never fails liveness.
    #[arg(long = "store-stuck-after", env = "TOLLGATE_STORE_STUCK_AFTER", default_value = "60s", value_parser = humantime::parse_duration)]
    pub stuck_after: Duration,

    /// Counters a Redis store remembers as denied, to answer them locally until their retry
    /// time (0: off).
    #[arg(long, env = "TOLLGATE_DENY_CACHE_SIZE", default_value_t = 100_000)]
    pub deny_cache_size: usize,

    /// Longest a cached denial is answered locally before the store is asked again: bounds
    /// how long a replica keeps denying a counter that was reset in the store.
    #[arg(long, env = "TOLLGATE_DENY_CACHE_MAX_TTL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub deny_cache_max_ttl: Duration,

    /// Lease the budget of busy counters whose rule does not say (`lease:`): `auto` leases a
    /// fixed window (aligned on the epoch), a token bucket or a GCRA limit while this replica
    /// sees it busy, and answers its
    /// hits from the slice held, without a Redis call each (docs/algorithms.md, "Leases");
    /// `off` decides every hit in Redis.
    #[arg(long, env = "TOLLGATE_LEASE", value_enum, default_value_t = LeaseMode::Off)]
    pub lease: LeaseMode,

    /// How a sliding window's hits are written to Redis: `text`, its state as text under its
    /// key, as builds before this one read and write it; or `counters`, one integer per
    /// window, which costs Redis less per hit (limits under 2^26 a window; larger ones stay
    /// text). Every replica reads both, so once none runs an earlier build, replicas can be
    /// switched one at a time (docs/operations.md, "Upgrades").
    #[arg(long, env = "TOLLGATE_REDIS_SLIDING_WINDOW_LAYOUT", value_enum, default_value_t = SlidingWindowLayout::Text)]
    pub redis_sliding_window_layout: SlidingWindowLayout,

    /// How a lone hit writes a `token_bucket`, a `gcra` or a `sliding_log` limit (of up to 64
    /// a window) to Redis: `text`, its numbers as text, as builds before this one read and
    /// write them; or `packed`, its numbers packed, which costs Redis less per hit (a bucket
    /// is then kept for the longest it can take to fill, a full burst at its rate, then the
    /// grace, rather than until it is full again; a log as long as in text). Every replica
    /// reads both, so once none runs an earlier build, replicas can be switched one at a time;
    /// an earlier build cannot read `packed` (some of its calls fail, others misread it and
    /// can over-admit), so switch back to `text` before going back to one
    /// (docs/operations.md, "Upgrades").
    #[arg(long, env = "TOLLGATE_REDIS_STATE_LAYOUT", value_enum, default_value_t = StateLayout::Text)]
    pub redis_state_layout: StateLayout,

    /// Hits a second on one counter, seen by this replica, from which a leased counter's
    /// budget is leased.
    #[arg(long, env = "TOLLGATE_LEASE_BUSY_RATE", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_busy_rate: u64,

    /// Multiplexed connections to Redis (to each node, on a cluster) that calls are spread
    /// over. One keeps a single-threaded Redis busy; with Redis `io-threads N`, use N, since
    /// Redis spreads connections, not calls, over its threads.
    #[arg(long, env = "TOLLGATE_REDIS_CONNECTIONS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64).map(usize::from))]
    pub redis_connections: usize,

    /// Most counters the memory store keeps; a full store first forgets the counters whose
    /// windows have ended.
    #[arg(long, env = "TOLLGATE_MEMORY_MAX_KEYS", default_value_t = 1_000_000)]
    pub memory_max_keys: usize,

    /// What a full memory store does with a new counter when every counter it holds is
    /// still live: refuse it (the request fails as the store failing, --on-store-error
    /// decides; no live counter is ever dropped) or evict the least recently used (new keys
    /// always count; a flood of them resets live counters).
    #[arg(long, env = "TOLLGATE_MEMORY_WHEN_FULL", value_enum, default_value_t = WhenFull::Refuse)]
    pub memory_when_full: WhenFull,

    /// Serving runtimes (`--runtime per-core`: one per core; else 1). Each runtime besides
    /// the main one gets a Redis connection of its own, made on it, so that the connection's
    /// driver task runs on the same thread as the calls it carries.
    #[arg(skip = 1_usize)]
    pub runtimes: usize,

    /// How often a cluster's slot map is read again, besides whenever a call finds it stale:
    /// a resharding is noticed by the first call it affects anyway, so the period only bounds
    /// how long grouping stays less than ideal.
    #[arg(skip = Duration::from_secs(5))]
    pub slot_map_refresh: Duration,

    /// `None`: time from the system clock, and in Redis from Redis `TIME`. `Some`: from this
    /// clock everywhere (tests).
    #[arg(skip)]
    pub clock: Option<Arc<dyn Clock>>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

/// The URLs are shown by scheme only: they may carry a password.
impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = |url: &str| url.split("://").next().unwrap_or_default().to_owned();
        f.debug_struct("StoreOptions")
            .field("url", &scheme(&self.url))
            .field(
                "per_second_url",
                &self.per_second_url.as_deref().map(scheme),
            )
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A key prefix without `{` or `}`, which would choose the Redis Cluster slot.
fn key_prefix(text: &str) -> Result<String, String> {
    if text.contains(['{', '}']) {
        Err("must not contain `{` or `}` (they would choose the Redis Cluster slot)".into())
    } else {
        Ok(text.to_owned())
    }
}

/// Why the store's flags name no store that can be built.
#[derive(Debug, thiserror::Error)]
pub enum StoreSpecError {
    #[error(
        "--store: unsupported store {0:?}; expected `memory`, `redis://…`, `rediss://…`, `unix:///…` (a Redis Unix socket), `redis-cluster://…`, `rediss-cluster://…` or `redis-sentinel://…`"
    )]
    Unsupported(String),
    #[error("--store-per-second: needs a Redis --store (the memory store has no per-second twin)")]
    PerSecondWithoutRedis,
    #[error(transparent)]
    Redis(#[from] SpecError),
    #[error("{flag} {path}: {error}")]
    File {
        flag: &'static str,
        path: String,
        error: std::io::Error,
    },
}

impl StoreOptions {
    /// How long one call may wait: --store-timeout-max below --store-timeout is read as
    /// --store-timeout (no caller waits less for having said how long it waits).
    pub fn call_bounds(&self) -> CallBounds {
        CallBounds {
            unsaid: self.timeout,
            longest: self.timeout_max.max(self.timeout),
        }
    }

    /// The store the URLs name, with the password and certificate files read.
    pub fn spec(&self) -> Result<StoreSpec, StoreSpecError> {
        let main = match self.url.as_str() {
            "memory" if self.per_second_url.is_some() => {
                return Err(StoreSpecError::PerSecondWithoutRedis);
            }
            "memory" => return Ok(StoreSpec::Memory),
            url => self.with_certificates(redis_spec(url, self.redis_password()?)?)?,
        };
        Ok(match &self.per_second_url {
            None => StoreSpec::Redis(main),
            Some(url) => {
                let per_second = self.with_certificates(redis_spec(url, None)?)?;
                StoreSpec::RedisPerSecond(main, per_second)
            }
        })
    }

    /// `spec` with the --redis-tls-* files, if any are given.
    fn with_certificates(&self, spec: RedisSpec) -> Result<RedisSpec, StoreSpecError> {
        let ca = self
            .redis_tls_ca
            .as_ref()
            .map(|path| read("--redis-tls-ca", path))
            .transpose()?;
        let client = match (&self.redis_tls_cert, &self.redis_tls_key) {
            (Some(cert), Some(key)) => Some((
                read("--redis-tls-cert", cert)?,
                read("--redis-tls-key", key)?,
            )),
            _ => None,
        };
        if ca.is_none() && client.is_none() {
            return Ok(spec);
        }
        Ok(spec.with_certificates(RedisCertificates { ca, client })?)
    }

    /// The password in --redis-password-file (for --store; a --store-per-second URL carries
    /// its own). An empty file gives none (a password in the URL, if any, stands): a
    /// Kubernetes Secret mounted for a Redis that has none.
    fn redis_password(&self) -> Result<Option<String>, StoreSpecError> {
        let Some(path) = &self.redis_password_file else {
            return Ok(None);
        };
        let text = read("--redis-password-file", path)?;
        let password = String::from_utf8_lossy(&text)
            .trim_end_matches(['\r', '\n'])
            .to_owned();
        Ok(Some(password).filter(|password| !password.is_empty()))
    }
}

fn read(flag: &'static str, path: &PathBuf) -> Result<Vec<u8>, StoreSpecError> {
    std::fs::read(path).map_err(|error| StoreSpecError::File {
        flag,
        path: path.display().to_string(),
        error,
    })
}

/// A Redis URL (with the password from a file, if any).
fn redis_spec(url: &str, password: Option<String>) -> Result<RedisSpec, StoreSpecError> {
    match RedisSpec::parse(url, password) {
        Some(spec) => Ok(spec?),
        // The URL is not echoed whole: it may carry a password.
        None => Err(StoreSpecError::Unsupported(
            url.split("://").next().unwrap_or_default().to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_flags_defaults() {
        let options = StoreOptions::default();
        assert_eq!(options.url, "memory");
        assert_eq!(options.timeout, Duration::from_millis(50));
        assert_eq!(options.connect_timeout, Duration::from_secs(1));
        assert_eq!(options.stuck_after, Duration::from_secs(60));
        assert!(options.reconnect_on_readonly);
        assert_eq!(
            (
                options.deny_cache_size,
                options.redis_connections,
                options.runtimes
            ),
            (100_000, 1, 1)
        );
        assert_eq!(options.slot_map_refresh, Duration::from_secs(5));
        assert!(options.clock.is_none());
        assert_eq!(options.spec().unwrap(), StoreSpec::Memory);
    }

    #[test]
    fn a_password_in_a_url_never_shows_in_debug() {
        let options = StoreOptions {
            url: "redis://user:secret@127.0.0.1:6379".into(),
            ..StoreOptions::default()
        };
        assert!(!format!("{options:?}").contains("secret"));
    }

    #[test]
    fn a_password_file_gives_its_first_line_and_an_empty_one_no_password() {
        let dir = tempfile::tempdir().unwrap();
        let options = |text: &str| {
            let path = dir.path().join("password");
            std::fs::write(&path, text).unwrap();
            StoreOptions {
                redis_password_file: Some(path),
                ..StoreOptions::default()
            }
        };
        assert_eq!(
            options("s3cret\n").redis_password().unwrap(),
            Some("s3cret".to_owned())
        );
        assert_eq!(options("").redis_password().unwrap(), None);
        assert_eq!(options("\n").redis_password().unwrap(), None);
    }
}
