//! Every environment variable envoyproxy/ratelimit reads, with its default there and what
//! tollgate does with it. `docs/migrating.md` has the same table for people; a test keeps the
//! two equal, and another checks that every variable marked honoured is read.

/// What tollgate does with a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Read, and turned into the flags named (values tollgate cannot honour stop startup
    /// with a message naming the variable).
    Honoured(&'static str),
    /// Accepted; when set, logged once as ignored, with the reason.
    Ignored(&'static str),
}

#[derive(Debug, Clone, Copy)]
pub struct Variable {
    pub name: &'static str,
    /// The reference's default.
    pub default: &'static str,
    pub treatment: Treatment,
}

use Treatment::{Honoured, Ignored};

const fn honoured(name: &'static str, default: &'static str, flags: &'static str) -> Variable {
    Variable {
        name,
        default,
        treatment: Honoured(flags),
    }
}

const fn ignored(name: &'static str, default: &'static str, why: &'static str) -> Variable {
    Variable {
        name,
        default,
        treatment: Ignored(why),
    }
}

const MEMCACHE: &str = "memcache is not a tollgate store (BACKEND_TYPE=memcache is refused)";
const GO_POOL: &str = "tunes the reference's Go connection pool; tollgate multiplexes every call over --redis-connections connections";
const STARTUP: &str = "tollgate starts without Redis and connects in the background, retrying every 0.1 to 5 s, for ever";

/// The reference's variables (its README and settings, in its order). Names that vary
/// (`DOG_STATSD_MOGRIFIER_<NAME>_*`) are listed by their prefix.
pub const VARIABLES: &[Variable] = &[
    // Listeners and server.
    honoured("HOST", "0.0.0.0", "--http-addr HOST:PORT"),
    honoured("PORT", "8080", "--http-addr HOST:PORT"),
    honoured(
        "DEBUG_HOST",
        "0.0.0.0",
        "--debug-addr DEBUG_HOST:DEBUG_PORT (/rlconfig, /stats)",
    ),
    honoured(
        "DEBUG_PORT",
        "6070",
        "--debug-addr DEBUG_HOST:DEBUG_PORT (/rlconfig, /stats)",
    ),
    honoured("GRPC_HOST", "0.0.0.0", "--grpc-addr GRPC_HOST:GRPC_PORT"),
    honoured("GRPC_PORT", "8081", "--grpc-addr GRPC_HOST:GRPC_PORT"),
    honoured(
        "GRPC_UDS",
        "",
        "--grpc-uds (instead of GRPC_HOST:GRPC_PORT)",
    ),
    honoured(
        "GRPC_MAX_CONNECTION_AGE",
        "24h",
        "--grpc-max-connection-age",
    ),
    honoured(
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "1h",
        "--grpc-max-connection-age-grace",
    ),
    honoured("GRPC_SERVER_USE_TLS", "false", "--tls-cert, --tls-key"),
    honoured("GRPC_SERVER_TLS_CERT", "", "--tls-cert"),
    honoured("GRPC_SERVER_TLS_KEY", "", "--tls-key"),
    honoured("GRPC_CLIENT_TLS_CACERT", "", "--tls-client-ca (mutual TLS)"),
    honoured("GRPC_CLIENT_TLS_SAN", "", "--tls-client-san"),
    ignored(
        "GRPC_SERVER_TLS_CA_CERT",
        "",
        "not read by envoyproxy/ratelimit either (Envoy Gateway sets it); client certificates are required only with GRPC_CLIENT_TLS_CACERT",
    ),
    honoured("LOG_LEVEL", "WARN", "--log-level"),
    honoured("LOG_FORMAT", "text", "--log-format"),
    // Config.
    honoured(
        "CONFIG_TYPE",
        "FILE",
        "FILE: --config; GRPC_XDS_SOTW: --config-xds",
    ),
    honoured(
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "false",
        "--serve-before-config (xDS; files that do not load at start are served as no rules, not ready, until fixed)",
    ),
    honoured(
        "RUNTIME_ROOT",
        "/srv/runtime_data/current",
        "--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY",
    ),
    honoured("RUNTIME_SUBDIRECTORY", "", "--config"),
    honoured("RUNTIME_APPDIRECTORY", "config", "--config"),
    honoured(
        "RUNTIME_IGNOREDOTFILES",
        "false",
        "--config-dotfiles when false",
    ),
    honoured(
        "RUNTIME_WATCH_ROOT",
        "true",
        "true: --config-poll 1s (sees RUNTIME_ROOT's link swapped); false: watch the directory",
    ),
    honoured("MERGE_DOMAIN_CONFIG", "false", "--merge-domains"),
    honoured(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "false",
        "--ready-needs-rules",
    ),
    // xDS.
    honoured("CONFIG_GRPC_XDS_NODE_ID", "default", "--xds-node-id"),
    honoured("CONFIG_GRPC_XDS_NODE_METADATA", "", "--xds-node-metadata"),
    honoured(
        "CONFIG_GRPC_XDS_SERVER_URL",
        "localhost:18000",
        "--config-xds (with CONFIG_TYPE=GRPC_XDS_SOTW)",
    ),
    ignored(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "3s",
        "reconnecting follows XDS_CLIENT_BACKOFF_INITIAL_INTERVAL and XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    ),
    honoured(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "",
        "--xds-header",
    ),
    honoured(
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        "false",
        "--xds-tls-ca and the TLS flags below",
    ),
    honoured("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", "--xds-tls-cert"),
    honoured("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", "--xds-tls-key"),
    honoured(
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "",
        "--xds-tls-ca (required for TLS: tollgate trusts only the CA it is given)",
    ),
    honoured(
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "",
        "--xds-tls-server-name",
    ),
    honoured(
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "10s",
        "--xds-backoff-initial",
    ),
    honoured(
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "60s",
        "--xds-backoff-max",
    ),
    ignored(
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "0.5",
        "every reconnection wait is jittered by up to half",
    ),
    ignored(
        "XDS_CLIENT_BACKOFF_JITTER",
        "true",
        "every reconnection wait is jittered by up to half",
    ),
    honoured(
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        "",
        "--xds-max-message-bytes",
    ),
    // Behaviour.
    honoured("BACKEND_TYPE", "redis", "redis; memcache is refused"),
    honoured("CACHE_KEY_PREFIX", "", "--store-key-prefix"),
    ignored(
        "EXPIRATION_JITTER_MAX_SECONDS",
        "300",
        "a counter expires when its window ends; tollgate's keys differ per window, so expiries need no jitter",
    ),
    honoured(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "0",
        "unset: tollgate's deny cache at its own size; set: --deny-cache-size (0: off; else one entry per 128 bytes)",
    ),
    honoured("NEAR_LIMIT_RATIO", "0.8", "--near-limit-ratio"),
    honoured(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "false",
        "false: --count-denied (the reference's default); true: tollgate's default, a rejected request consumes nothing",
    ),
    honoured("SHADOW_MODE", "false", "--shadow-mode"),
    honoured("QUOTA_MODE", "false", "--quota-mode"),
    honoured("RESPONSE_DYNAMIC_METADATA", "false", "--dynamic-metadata"),
    honoured(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "false",
        "--response-headers legacy",
    ),
    honoured(
        "LIMIT_REQUEST_HEADERS_ENABLED",
        "false",
        "--upstream-limit-headers",
    ),
    honoured(
        "LIMIT_REQUEST_LIMIT_HEADER",
        "RateLimit-Limit",
        "--upstream-limit-header-names",
    ),
    honoured(
        "LIMIT_REQUEST_REMAINING_HEADER",
        "RateLimit-Remaining",
        "--upstream-limit-header-names",
    ),
    honoured(
        "LIMIT_REQUEST_RESET_HEADER",
        "RateLimit-Reset",
        "--upstream-limit-header-names",
    ),
    honoured(
        "LIMIT_LIMIT_HEADER",
        "RateLimit-Limit",
        "--legacy-header-names",
    ),
    honoured(
        "LIMIT_REMAINING_HEADER",
        "RateLimit-Remaining",
        "--legacy-header-names",
    ),
    honoured(
        "LIMIT_RESET_HEADER",
        "RateLimit-Reset",
        "--legacy-header-names",
    ),
    // Redis.
    honoured("REDIS_SOCKET_TYPE", "unix", "--store unix://… or redis://…"),
    honoured(
        "REDIS_TYPE",
        "SINGLE",
        "--store redis://…, redis-sentinel://… or redis-cluster://…",
    ),
    honoured("REDIS_URL", "/var/run/nutcracker/ratelimit.sock", "--store"),
    ignored("REDIS_POOL_SIZE", "10", GO_POOL),
    honoured("REDIS_AUTH", "", "--store (user and password of the URL)"),
    honoured(
        "REDIS_SENTINEL_AUTH",
        "",
        "--store (sentinel_user, sentinel_pass)",
    ),
    honoured("REDIS_TLS", "false", "--store rediss://…"),
    ignored("REDIS_PIPELINE_WINDOW", "0", GO_POOL),
    ignored("REDIS_PIPELINE_LIMIT", "0", GO_POOL),
    ignored("REDIS_CLUSTER_PIPELINE_PARALLELISM", "1", GO_POOL),
    honoured(
        "REDIS_TIMEOUT",
        "10s",
        "--redis-connect-timeout (a dial timeout there too; calls keep --store-timeout)",
    ),
    honoured(
        "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
        "false",
        "--redis-reconnect-on-readonly=false when set false; unset, tollgate reconnects on READONLY",
    ),
    ignored("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", GO_POOL),
    ignored("REDIS_POOL_ON_EMPTY_WAIT_DURATION", "1s", GO_POOL),
    honoured("REDIS_PERSECOND", "false", "--store-per-second"),
    honoured("REDIS_PERSECOND_SOCKET_TYPE", "unix", "--store-per-second"),
    honoured("REDIS_PERSECOND_TYPE", "SINGLE", "--store-per-second"),
    honoured(
        "REDIS_PERSECOND_URL",
        "/var/run/nutcracker/ratelimitpersecond.sock",
        "--store-per-second",
    ),
    ignored("REDIS_PERSECOND_POOL_SIZE", "10", GO_POOL),
    honoured("REDIS_PERSECOND_AUTH", "", "--store-per-second"),
    honoured("REDIS_PERSECOND_SENTINEL_AUTH", "", "--store-per-second"),
    honoured(
        "REDIS_PERSECOND_TLS",
        "false",
        "--store-per-second rediss://…",
    ),
    ignored("REDIS_PERSECOND_PIPELINE_WINDOW", "0", GO_POOL),
    ignored("REDIS_PERSECOND_PIPELINE_LIMIT", "0", GO_POOL),
    ignored("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1", GO_POOL),
    ignored(
        "REDIS_PERSECOND_TIMEOUT",
        "10s",
        "one --redis-connect-timeout (REDIS_TIMEOUT) for both stores",
    ),
    ignored("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", GO_POOL),
    ignored("REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION", "1s", GO_POOL),
    honoured("REDIS_TLS_CLIENT_CERT", "", "--redis-tls-cert"),
    honoured("REDIS_TLS_CLIENT_KEY", "", "--redis-tls-key"),
    honoured("REDIS_TLS_CACERT", "", "--redis-tls-ca"),
    honoured(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "false",
        "--store rediss://…#insecure",
    ),
    honoured(
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "false",
        "false: --ready-without-store (/healthcheck stays 200 through a Redis outage); true: readiness follows the store",
    ),
    ignored("REDIS_STARTUP_INITIAL_INTERVAL", "1s", STARTUP),
    ignored("REDIS_STARTUP_MAX_INTERVAL", "30s", STARTUP),
    ignored("REDIS_STARTUP_MAX_ELAPSED_TIME", "0", STARTUP),
    // Memcache.
    ignored("MEMCACHE_HOST_PORT", "", MEMCACHE),
    ignored("MEMCACHE_SRV", "", MEMCACHE),
    ignored("MEMCACHE_SRV_REFRESH", "0", MEMCACHE),
    ignored("MEMCACHE_MAX_IDLE_CONNS", "2", MEMCACHE),
    ignored("MEMCACHE_TLS", "false", MEMCACHE),
    ignored("MEMCACHE_TLS_CLIENT_CERT", "", MEMCACHE),
    ignored("MEMCACHE_TLS_CLIENT_KEY", "", MEMCACHE),
    ignored("MEMCACHE_TLS_CACERT", "", MEMCACHE),
    ignored("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false", MEMCACHE),
    // Stats.
    honoured("USE_STATSD", "true", "--statsd STATSD_HOST:STATSD_PORT"),
    honoured("STATSD_HOST", "localhost", "--statsd"),
    honoured("STATSD_PORT", "8125", "--statsd"),
    honoured(
        "STATSD_PROTOCOL",
        "tcp",
        "--statsd-protocol (read by the reference's plain statsd sink, gostats)",
    ),
    honoured(
        "USE_DOG_STATSD",
        "false",
        "--statsd --statsd-protocol udp --statsd-tag-style dogstatsd",
    ),
    ignored(
        "USE_DOG_STATSD_MOGRIFIERS",
        "",
        "stats go out under the reference's names, unrewritten",
    ),
    ignored(
        "DOG_STATSD_MOGRIFIER_",
        "",
        "stats go out under the reference's names, unrewritten",
    ),
    honoured(
        "USE_PROMETHEUS",
        "false",
        "--metrics-addr PROMETHEUS_ADDR, --metrics-reference-series (the reference's series beside tollgate's; /metrics is on HOST:PORT too)",
    ),
    honoured("PROMETHEUS_ADDR", ":9090", "--metrics-addr"),
    honoured("PROMETHEUS_PATH", "/metrics", "--metrics-path"),
    honoured(
        "PROMETHEUS_MAPPER_YAML",
        "",
        "--metrics-reference-response-time: its response_time mapping's scale (none: milliseconds); the reference's series otherwise follow the reference's default mapping",
    ),
    honoured(
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "false",
        "--metrics-reference-response-time milliseconds (without PROMETHEUS_MAPPER_YAML)",
    ),
    honoured("EXTRA_TAGS", "", "--statsd-tag"),
    honoured("STATS_FLUSH_INTERVAL", "10s", "--statsd-flush-interval"),
    honoured("DISABLE_STATS", "false", "no --statsd"),
    // Tracing.
    honoured("TRACING_ENABLED", "false", "--traces on|off"),
    honoured("TRACING_EXPORTER_PROTOCOL", "http", "--trace-protocol"),
    honoured("TRACING_SERVICE_NAME", "RateLimit", "--trace-service-name"),
    honoured("TRACING_SERVICE_NAMESPACE", "", "--trace-service-namespace"),
    honoured(
        "TRACING_SERVICE_INSTANCE_ID",
        "",
        "--trace-service-instance-id",
    ),
    honoured("TRACING_SAMPLING_RATE", "1", "--trace-sampling-ratio"),
    honoured(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "",
        "read by the OTLP exporter, as are the other OTEL_EXPORTER_OTLP_* variables",
    ),
];

/// The entry for `name` (a `DOG_STATSD_MOGRIFIER_…` variable by its prefix).
pub fn lookup(name: &str) -> Option<&'static Variable> {
    VARIABLES.iter().find(|variable| {
        variable.name == name
            || (variable.name.ends_with('_')
                && name.starts_with(variable.name)
                && variable.name.len() < name.len())
    })
}
