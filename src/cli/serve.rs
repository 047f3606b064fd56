//! `serve`'s flags: every setting of the server, grouped under help headings, each with its
//! `TOLLGATE_*` variable, and how they become the options of the parts they configure.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;

use crate::algorithm::Charge;
use crate::config::LoadOptions;
use crate::limiter::Modes;
use crate::metrics::Metrics;
use crate::reload::ReloadOptions;
use crate::runtime::Flavor;
use crate::server::Options;
use crate::service::ServiceOptions;
use crate::statsd::StatsdOptions;
use crate::storage::StoreOptions;
use crate::storage::redis::{RedisCertificates, RedisSpec, SpecError as RedisSpecError};
use crate::storage::stack::StoreSpec;
use crate::telemetry::ratio;
use crate::tls::TlsFiles;

/// Where `serve` takes its settings from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvStyle {
    /// These flags (and their `TOLLGATE_*` variables).
    #[default]
    Native,
    /// envoyproxy/ratelimit's environment variables, with its defaults (as when started as
    /// `ratelimit`); flags given as well win. See docs/migrating.md.
    Reference,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Read envoyproxy/ratelimit's environment variables (`reference`) instead of needing
    /// these flags; tollgate started as `ratelimit` (the image's /bin/ratelimit) does too.
    #[arg(long, env = "TOLLGATE_ENV", value_enum, default_value_t = EnvStyle::Native)]
    pub env: EnvStyle,

    /// Directory of YAML rule files (one domain per file).
    #[arg(long, env = "TOLLGATE_CONFIG", help_heading = "Rules")]
    pub config: PathBuf,

    /// Poll the config directory this often instead of watching it for file events (for
    /// filesystems without inotify, such as some network mounts).
    #[arg(long, env = "TOLLGATE_CONFIG_POLL", value_parser = positive_duration, help_heading = "Rules")]
    pub config_poll: Option<Duration>,

    /// Read every file under --config, not only `*.yaml`/`*.yml` (as the reference does).
    #[arg(long, env = "TOLLGATE_CONFIG_EVERY_FILE", help_heading = "Rules", value_parser = BoolishValueParser::new())]
    pub config_every_file: bool,

    /// Read dot files and dot directories under --config too (by default they are skipped:
    /// editors' swap files, a ConfigMap volume's `..data` copies).
    #[arg(long, env = "TOLLGATE_CONFIG_DOTFILES", help_heading = "Rules", value_parser = BoolishValueParser::new())]
    pub config_dotfiles: bool,

    /// Merge files that name the same domain (their descriptors must differ) instead of
    /// refusing the second one (the reference's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "TOLLGATE_MERGE_DOMAINS", help_heading = "Rules", value_parser = BoolishValueParser::new())]
    pub merge_domains: bool,

    /// Report not ready (health NOT_SERVING, /readyz 500) while the rules name no domain (the
    /// reference's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
    #[arg(long, env = "TOLLGATE_READY_NEEDS_RULES", help_heading = "Rules", value_parser = BoolishValueParser::new())]
    pub ready_needs_rules: bool,

    /// gRPC listen address (RLS v3 and gRPC health).
    #[arg(
        long,
        env = "TOLLGATE_GRPC_ADDR",
        default_value = "0.0.0.0:8081",
        help_heading = "Listeners and TLS"
    )]
    pub grpc_addr: SocketAddr,

    /// Serve gRPC on this Unix socket instead of --grpc-addr (plaintext; for a sidecar on the
    /// same host; the reference's GRPC_UDS).
    #[arg(long, env = "TOLLGATE_GRPC_UDS", help_heading = "Listeners and TLS")]
    pub grpc_uds: Option<PathBuf>,

    /// PEM certificate chain for TLS on the gRPC listener (with --tls-key).
    #[arg(
        long,
        env = "TOLLGATE_TLS_CERT",
        requires = "tls_key",
        help_heading = "Listeners and TLS"
    )]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(
        long,
        env = "TOLLGATE_TLS_KEY",
        requires = "tls_cert",
        help_heading = "Listeners and TLS"
    )]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates: require clients to present a certificate signed by one (mutual
    /// TLS). Needs --tls-cert.
    #[arg(
        long,
        env = "TOLLGATE_TLS_CLIENT_CA",
        requires = "tls_cert",
        help_heading = "Listeners and TLS"
    )]
    pub tls_client_ca: Option<PathBuf>,

    /// With --tls-client-ca, also require the client certificate to be valid for this DNS
    /// name or IP address (a subject alternative name; the reference's GRPC_CLIENT_TLS_SAN).
    #[arg(
        long,
        env = "TOLLGATE_TLS_CLIENT_SAN",
        requires = "tls_client_ca",
        help_heading = "Listeners and TLS"
    )]
    pub tls_client_san: Option<String>,

    /// HTTP admin listen address (/healthcheck, /healthz, /readyz, /json, /config).
    #[arg(
        long,
        env = "TOLLGATE_HTTP_ADDR",
        default_value = "0.0.0.0:8080",
        help_heading = "Listeners and TLS"
    )]
    pub http_addr: SocketAddr,

    /// Counter store: `memory` (in-process), `redis://[user:pass@]host:port[/db]`,
    /// `unix:///path/redis.sock[?db=N&pass=P]` (Redis on a Unix socket),
    /// `rediss://…` (TLS), `redis-cluster://[user:pass@]host:port,host:port,…`,
    /// `rediss-cluster://…`, or
    /// `redis-sentinel://[user:pass@]host:port,…/MASTER[/db][?sentinel_user=U&sentinel_pass=P]`
    /// (the master the sentinels name, followed through failovers; `rediss-sentinel://` for
    /// TLS).
    #[arg(
        long,
        env = "TOLLGATE_STORE",
        default_value = "memory",
        help_heading = "Store"
    )]
    pub store: String,

    /// A second Redis for the limits whose unit is one second (the reference's
    /// REDIS_PERSECOND): a URL as --store takes, for a Redis store only. A request with limits
    /// in both stays all-or-nothing (docs/design.md).
    #[arg(long, env = "TOLLGATE_STORE_PER_SECOND", help_heading = "Store")]
    pub store_per_second: Option<String>,

    /// Put before every Redis key, so that several deployments can share one Redis (the
    /// reference's CACHE_KEY_PREFIX).
    #[arg(long, env = "TOLLGATE_STORE_KEY_PREFIX", default_value = "", value_parser = key_prefix, help_heading = "Store")]
    pub store_key_prefix: String,

    /// File holding the Redis password (overrides one in the URL); a trailing newline is
    /// ignored.
    #[arg(long, env = "TOLLGATE_REDIS_PASSWORD_FILE", help_heading = "Store")]
    pub redis_password_file: Option<PathBuf>,

    /// PEM CA certificates that sign the Redis servers' certificates (else the system's
    /// roots), for `rediss://` URLs (--store and --store-per-second).
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CA", help_heading = "Store")]
    pub redis_tls_ca: Option<PathBuf>,

    /// PEM client certificate for Redis (with --redis-tls-key), for a Redis that requires
    /// one (`tls-auth-clients`).
    #[arg(
        long,
        env = "TOLLGATE_REDIS_TLS_CERT",
        requires = "redis_tls_key",
        help_heading = "Store"
    )]
    pub redis_tls_cert: Option<PathBuf>,

    /// PEM private key for --redis-tls-cert.
    #[arg(
        long,
        env = "TOLLGATE_REDIS_TLS_KEY",
        requires = "redis_tls_cert",
        help_heading = "Store"
    )]
    pub redis_tls_key: Option<PathBuf>,

    /// Longest wait for one Redis call (never longer than the client's gRPC deadline).
    #[arg(long, env = "TOLLGATE_STORE_TIMEOUT", default_value = "50ms", value_parser = humantime::parse_duration, help_heading = "Store")]
    pub store_timeout: Duration,

    /// Counters a Redis store remembers as denied, to answer them locally until their retry
    /// time (0: off).
    #[arg(
        long,
        env = "TOLLGATE_DENY_CACHE_SIZE",
        default_value_t = 100_000,
        help_heading = "Store"
    )]
    pub deny_cache_size: usize,

    /// Longest a cached denial is answered locally before the store is asked again: bounds
    /// how long a replica keeps denying a counter that was reset in the store.
    #[arg(long, env = "TOLLGATE_DENY_CACHE_MAX_TTL", default_value = "1s", value_parser = humantime::parse_duration, help_heading = "Store")]
    pub deny_cache_max_ttl: Duration,

    /// Multiplexed connections to Redis (to each node, on a cluster) that calls are spread
    /// over. One keeps a single-threaded Redis busy; with Redis `io-threads N`, use N, since
    /// Redis spreads connections, not calls, over its threads.
    #[arg(long, env = "TOLLGATE_REDIS_CONNECTIONS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64), help_heading = "Store")]
    pub redis_connections: u16,

    /// Most counters the memory store keeps; beyond it the least recently used are evicted.
    #[arg(
        long,
        env = "TOLLGATE_MEMORY_MAX_KEYS",
        default_value_t = 1_000_000,
        help_heading = "Store"
    )]
    pub memory_max_keys: usize,

    /// Count hits on every descriptor even when the request is rejected (the reference's
    /// behaviour). By default a rejected request consumes nothing.
    #[arg(long, env = "TOLLGATE_COUNT_DENIED", help_heading = "Store", value_parser = BoolishValueParser::new())]
    pub count_denied: bool,

    /// Share of a limit past which admitted hits also count as `near_limit` in the metrics.
    #[arg(long, env = "TOLLGATE_NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = ratio, help_heading = "Metrics")]
    pub near_limit_ratio: f64,

    /// Most label sets with client values (`detailed_metric`, `value_to_metric`) in the
    /// per-limit metrics; beyond it, hits count under the rule's plain path.
    #[arg(
        long,
        env = "TOLLGATE_METRICS_MAX_DETAILED",
        default_value_t = 1_000,
        help_heading = "Metrics"
    )]
    pub metrics_max_detailed: usize,

    /// Also serve the metrics alone on this address (at --metrics-path), e.g. for a scrape
    /// port apart from the admin endpoints.
    #[arg(long, env = "TOLLGATE_METRICS_ADDR", help_heading = "Metrics")]
    pub metrics_addr: Option<SocketAddr>,

    /// The path of the metrics on --metrics-addr.
    #[arg(long, env = "TOLLGATE_METRICS_PATH", default_value = "/metrics", value_parser = url_path, help_heading = "Metrics")]
    pub metrics_path: String,

    /// Also send the metrics to this statsd server (`host:port`, UDP) under the reference's
    /// stat names (`ratelimit.service.rate_limit.…`; docs/migrating.md).
    #[arg(long, env = "TOLLGATE_STATSD", help_heading = "Metrics")]
    pub statsd: Option<String>,

    /// How often the counters' increase is sent to --statsd.
    #[arg(long, env = "TOLLGATE_STATSD_FLUSH_INTERVAL", default_value = "10s", value_parser = positive_duration, help_heading = "Metrics")]
    pub statsd_flush_interval: Duration,

    /// A tag on every stat sent to --statsd, as `key=value` (DogStatsD form); repeat for
    /// more (in the environment, separate them with `,`).
    #[arg(long = "statsd-tag", env = "TOLLGATE_STATSD_TAGS", value_delimiter = ',', value_parser = tag, help_heading = "Metrics")]
    pub statsd_tags: Vec<(String, String)>,

    /// Never answer OVER_LIMIT overall; statuses still show which descriptor is over.
    #[arg(long, env = "TOLLGATE_SHADOW_MODE", help_heading = "Decisions", value_parser = BoolishValueParser::new())]
    pub shadow_mode: bool,

    /// Treat every rule as `quota_mode: true`: the request is over only when all its quota
    /// descriptors are (the reference's QUOTA_MODE).
    #[arg(long, env = "TOLLGATE_QUOTA_MODE", help_heading = "Decisions", value_parser = BoolishValueParser::new())]
    pub quota_mode: bool,

    #[command(flatten)]
    pub service: ServiceOptions,

    /// Time health reports NOT_SERVING before the listeners close on shutdown.
    #[arg(long, env = "TOLLGATE_SHUTDOWN_DELAY", default_value = "0s", value_parser = humantime::parse_duration, help_heading = "Shutdown")]
    pub shutdown_delay: Duration,

    /// Longest wait for in-flight calls to finish on shutdown.
    #[arg(long, env = "TOLLGATE_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration, help_heading = "Shutdown")]
    pub drain_timeout: Duration,

    /// How gRPC connections are spread over cores: multi-thread (tokio's work-stealing
    /// runtime) or per-core (one single-threaded runtime per core, each serving the
    /// connections dealt to it in turn; not with TLS). See docs/performance.md.
    #[arg(long, env = "TOLLGATE_RUNTIME", value_enum, default_value_t = Flavor::default(), help_heading = "Runtime")]
    pub runtime: Flavor,
}

/// A key prefix without `{` or `}`, which would choose the Redis Cluster slot.
fn key_prefix(text: &str) -> Result<String, String> {
    if text.contains(['{', '}']) {
        Err("must not contain `{` or `}` (they would choose the Redis Cluster slot)".into())
    } else {
        Ok(text.to_owned())
    }
}

/// An absolute URL path.
fn url_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') && !text.contains(char::is_whitespace) {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?} is not a path starting with /"))
    }
}

/// `key=value`, neither empty.
fn tag(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() && !value.is_empty() => {
            Ok((key.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not key=value")),
    }
}

/// A duration above zero.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        Ok(_) => Err("must be more than zero".into()),
        Err(error) => Err(error.to_string()),
    }
}

/// A Redis URL (with the password from a file, if any).
fn redis_spec(url: &str, password: Option<String>) -> Result<RedisSpec, ArgsError> {
    match RedisSpec::parse(url, password) {
        Some(spec) => Ok(spec?),
        // The URL is not echoed whole: it may carry a password.
        None => Err(ArgsError::UnsupportedStore(
            url.split("://").next().unwrap_or_default().to_owned(),
        )),
    }
}

/// Why `serve`'s flags cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error(
        "--store: unsupported store {0:?}; expected `memory`, `redis://…`, `rediss://…`, `unix:///…` (a Redis Unix socket), `redis-cluster://…`, `rediss-cluster://…` or `redis-sentinel://…`"
    )]
    UnsupportedStore(String),
    #[error("--store-per-second: needs a Redis --store (the memory store has no per-second twin)")]
    PerSecondWithoutRedis,
    #[error(transparent)]
    Redis(#[from] RedisSpecError),
    #[error("--redis-password-file {path}: {error}")]
    PasswordFile { path: String, error: std::io::Error },
    #[error("{flag} {path}: {error}")]
    File {
        flag: &'static str,
        path: String,
        error: std::io::Error,
    },
}

impl ServeArgs {
    pub fn store_spec(&self) -> Result<StoreSpec, ArgsError> {
        let main = match self.store.as_str() {
            "memory" if self.store_per_second.is_some() => {
                return Err(ArgsError::PerSecondWithoutRedis);
            }
            "memory" => return Ok(StoreSpec::Memory),
            url => self.with_certificates(redis_spec(url, self.redis_password()?)?)?,
        };
        Ok(match &self.store_per_second {
            None => StoreSpec::Redis(main),
            Some(url) => {
                let per_second = self.with_certificates(redis_spec(url, None)?)?;
                StoreSpec::RedisPerSecond(main, per_second)
            }
        })
    }

    /// `spec` with the --redis-tls-* files, if any are given.
    fn with_certificates(&self, spec: RedisSpec) -> Result<RedisSpec, ArgsError> {
        let read = |flag: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|error| ArgsError::File {
                flag,
                path: path.display().to_string(),
                error,
            })
        };
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
    /// its own).
    fn redis_password(&self) -> Result<Option<String>, ArgsError> {
        let Some(path) = &self.redis_password_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|error| ArgsError::PasswordFile {
            path: path.display().to_string(),
            error,
        })?;
        Ok(Some(text.trim_end_matches(['\r', '\n']).to_owned()))
    }

    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            charge: self.charge(),
            timeout: self.store_timeout,
            deny_cache_size: self.deny_cache_size,
            deny_cache_max_ttl: self.deny_cache_max_ttl,
            memory_max_keys: self.memory_max_keys,
            redis_connections: usize::from(self.redis_connections),
            key_prefix: self.store_key_prefix.clone(),
            runtimes: self.runtime.grpc_runtimes(),
            ..StoreOptions::default()
        }
    }

    /// Which config files are read, and how.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            every_file: self.config_every_file,
            dotfiles: self.config_dotfiles,
            merge_domains: self.merge_domains,
        }
    }

    pub fn charge(&self) -> Charge {
        if self.count_denied {
            Charge::Always
        } else {
            Charge::IfAllowed
        }
    }

    pub fn options(&self) -> Options {
        Options {
            service: self.service.clone(),
            modes: Modes {
                global_shadow: self.shadow_mode,
                global_quota: self.quota_mode,
            },
            shutdown_delay: self.shutdown_delay,
            ready_needs_rules: self.ready_needs_rules,
            statsd: self.statsd.clone().map(|address| StatsdOptions {
                address,
                every: self.statsd_flush_interval,
                tags: self.statsd_tags.clone(),
            }),
            drain_timeout: self.drain_timeout,
            runtime: self.runtime,
            tls: self
                .tls_cert
                .clone()
                .zip(self.tls_key.clone())
                .map(|(cert, key)| TlsFiles {
                    cert,
                    key,
                    client_ca: self.tls_client_ca.clone(),
                    client_san: self.tls_client_san.clone(),
                }),
            reload: Some(ReloadOptions {
                dir: self.config.clone(),
                poll: self.config_poll,
                load: self.load_options(),
            }),
            metrics: Arc::new(Metrics::new(
                self.near_limit_ratio,
                self.metrics_max_detailed,
            )),
            ..Options::default()
        }
    }
}
