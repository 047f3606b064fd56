//! `serve`'s flags: every setting of the server, grouped under help headings, each with its
//! `TOLLGATE_*` variable (`serve_options.rs` turns them into the parts' options).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;

use super::values::{key_prefix, positive_duration, tag, url_path};
use super::xds_args::XdsArgs;
use crate::rlqs::QuotaOptions;
use crate::runtime::Flavor;
use crate::service::ServiceOptions;
use crate::telemetry::ratio;

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
    #[arg(
        long,
        env = "TOLLGATE_CONFIG",
        required_unless_present = "config_xds",
        help_heading = "Rules"
    )]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub xds: XdsArgs,

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

    /// Whether the admin's mutating endpoints (`POST /json`, `POST /reset`) answer: `on`, or
    /// `off` (403).
    #[arg(long, env = "TOLLGATE_ADMIN_WRITES", default_value = "on", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set, help_heading = "Listeners and TLS")]
    pub admin_writes: bool,

    /// Require `Authorization: Bearer <token>` on the admin's mutating endpoints (401
    /// without it); best set from a Secret through the environment variable.
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_TOKEN",
        hide_env_values = true,
        help_heading = "Listeners and TLS"
    )]
    pub admin_token: Option<String>,

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

    #[command(flatten)]
    pub quota: QuotaOptions,

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
