//! Prometheus metrics, served on `GET /metrics` (prometheus-client, OpenMetrics text). Names
//! start with `tollgate_`; counters end in `_total`. One small struct per part, each in its
//! file and registered here: the per-limit counters (`limits.rs`, on `counters.rs`), the RLS
//! service (`service.rs`), the stores (`store.rs`) and their leases (`lease.rs`), the rules (`config.rs`), readiness
//! (`health.rs`), RLQS (`quota.rs`) and the listeners' connections (`connections.rs`); the process's own metrics come from `process`.

mod config;
mod connections;
mod counters;
mod health;
pub mod lease;
mod limits;
mod quota;
pub mod reference;
mod service;
mod store;

use std::fmt;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use config::ConfigMetrics;
pub use connections::{ConnectionMetrics, ListenerMetrics};
pub use counters::{HeldCounters, Labels, grpc_code, label};
pub use health::HealthMetrics;
pub use limits::{LimitHit, LimitMetrics};
pub use quota::{BucketFigures, MAX_BUCKET_LABELS, QuotaMetrics};
pub use service::ServiceMetrics;
pub use store::StoreMetrics;

/// What the metrics count and where else they are served: flags of `tollgate serve`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsOptions {
    /// Share of a limit past which admitted hits also count as `near_limit` in the metrics.
    #[arg(long, env = "TOLLGATE_NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = crate::telemetry::ratio)]
    pub near_limit_ratio: f64,

    /// Most label sets with client values (`detailed_metric`, `value_to_metric`) in the
    /// per-limit metrics; beyond it, hits count under the rule's plain path.
    #[arg(long, env = "TOLLGATE_METRICS_MAX_DETAILED", default_value_t = 1_000)]
    pub metrics_max_detailed: usize,

    /// Also serve the metrics alone on this address (at --metrics-path), e.g. for a scrape
    /// port apart from the admin endpoints.
    #[arg(long, env = "TOLLGATE_METRICS_ADDR", value_parser = crate::options::listen_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// The path of the metrics on --metrics-addr.
    #[arg(long, env = "TOLLGATE_METRICS_PATH", default_value = "/metrics", value_parser = crate::options::url_path)]
    pub metrics_path: String,

    /// Also serve envoyproxy/ratelimit's Prometheus series (`ratelimit_service_…`, the names
    /// and labels its Prometheus sink gives its stats) beside tollgate's own, for dashboards
    /// built on the reference (docs/migrating.md). Set by USE_PROMETHEUS in reference mode.
    #[arg(long = "metrics-reference-series", env = "TOLLGATE_METRICS_REFERENCE_SERIES", value_parser = clap::builder::BoolishValueParser::new())]
    pub reference_series: bool,

    /// The unit of the reference's `ratelimit_service_response_time_seconds` series: seconds,
    /// as its default mapping scales them, or the milliseconds its timer records (a mapping
    /// without that scale, as Envoy Gateway's; PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS).
    #[arg(long = "metrics-reference-response-time", env = "TOLLGATE_METRICS_REFERENCE_RESPONSE_TIME", value_enum, default_value_t = reference::TimeUnit::Seconds)]
    pub reference_response_time: reference::TimeUnit,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

pub struct Metrics {
    registry: Registry,
    /// The `process_*` metrics, under their standard names (no `tollgate_` prefix).
    process: Registry,
    tokio_tasks: Gauge,
    pub limits: LimitMetrics,
    pub service: ServiceMetrics,
    pub store: StoreMetrics,
    pub lease: lease::LeaseMetrics,
    pub config: ConfigMetrics,
    pub health: HealthMetrics,
    pub quota: QuotaMetrics,
    pub connections: ConnectionMetrics,
    /// Whether the exposition carries the reference's series too (`reference.rs`).
    reference_series: bool,
}

impl Metrics {
    pub fn new(near_limit_ratio: f64, max_detailed: usize) -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let metrics = Self {
            limits: LimitMetrics::new(near_limit_ratio, max_detailed),
            service: ServiceMetrics::default(),
            store: StoreMetrics::default(),
            lease: lease::LeaseMetrics::default(),
            config: ConfigMetrics::default(),
            health: HealthMetrics::default(),
            quota: QuotaMetrics::default(),
            connections: ConnectionMetrics::default(),
            reference_series: false,
            tokio_tasks: Gauge::default(),
            process: {
                let mut process = Registry::default();
                process.register_collector(Box::new(crate::process::ProcessCollector));
                process
            },
            registry: Registry::default(),
        };
        metrics.limits.register(&mut registry);
        metrics.service.register(&mut registry);
        metrics.store.register(&mut registry);
        metrics.lease.register(&mut registry);
        metrics.config.register(&mut registry);
        metrics.health.register(&mut registry);
        metrics.quota.register(&mut registry);
        metrics.connections.register(&mut registry);
        let build_info = Family::<Labels, Gauge>::default();
        build_info
            .get_or_create(&label("version", env!("CARGO_PKG_VERSION")))
            .set(1);
        registry.register("build_info", "tollgate's version, as a label", build_info);
        registry.register(
            "tokio_alive_tasks",
            "Tasks alive in the runtime (sampled at scrape time)",
            metrics.tokio_tasks.clone(),
        );
        Self {
            registry,
            ..metrics
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let alive = runtime.metrics().num_alive_tasks();
            self.tokio_tasks
                .set(i64::try_from(alive).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        // Writing to a String cannot fail. One exposition ends with one `# EOF`: the first
        // registry's is dropped before the second is appended.
        let _ = encode(&mut out, &self.registry);
        if out.ends_with("# EOF\n") {
            out.truncate(out.len() - "# EOF\n".len());
        }
        let _ = encode(&mut out, &self.process);
        if self.reference_series && out.ends_with("# EOF\n") {
            out.truncate(out.len() - "# EOF\n".len());
            let reference = reference::prometheus(&out);
            out.push_str(&reference);
            if let Some(time) = self.service.reference_time.get() {
                out.push_str(&time.render());
            }
            out.push_str(reference::RUNTIME_SERIES);
            out.push_str("# EOF\n");
        }
        out
    }

    /// These metrics, their exposition also carrying the reference's series when `on`, its
    /// response time in `unit`.
    pub fn with_reference_series(self, on: bool, unit: reference::TimeUnit) -> Self {
        if on {
            let _ = self
                .service
                .reference_time
                .set(reference::ResponseTime::new(unit));
        }
        Self {
            reference_series: on,
            ..self
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let options = MetricsOptions::default();
        Self::new(options.near_limit_ratio, options.metrics_max_detailed)
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}
