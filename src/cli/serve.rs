//! `serve`'s flags: every part's options struct, flattened (each declares its flags, their
//! `TOLLGATE_*` variables and defaults once, with the part), and how they make the server's
//! options.

use std::sync::Arc;

use clap::Args;

use super::xds_args::XdsArgs;
use crate::admin::writes::AdminWrites;
use crate::limiter::Modes;
use crate::metrics::{Metrics, MetricsOptions};
use crate::reload::RulesOptions;
use crate::rlqs::QuotaOptions;
use crate::runtime::Flavor;
use crate::server::{ListenOptions, Options};
use crate::service::ServiceOptions;
use crate::shutdown::ShutdownOptions;
use crate::statsd::StatsdOptions;
use crate::storage::options::StoreOptions;
use crate::tls::TlsOptions;

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

    #[command(flatten)]
    pub rules: RulesOptions,

    #[command(flatten)]
    pub xds: XdsArgs,

    #[command(flatten)]
    pub listen: ListenOptions,

    #[command(flatten)]
    pub tls: TlsOptions,

    #[command(flatten)]
    pub admin: AdminWrites,

    #[command(flatten)]
    pub store: StoreOptions,

    #[command(flatten)]
    pub metrics: MetricsOptions,

    #[command(flatten)]
    pub statsd: StatsdOptions,

    #[command(flatten)]
    pub modes: Modes,

    #[command(flatten)]
    pub service: ServiceOptions,

    #[command(flatten)]
    pub quota: QuotaOptions,

    #[command(flatten)]
    pub shutdown: ShutdownOptions,

    #[command(flatten)]
    pub connections: crate::server::ConnectionOptions,

    #[command(flatten)]
    pub trace: crate::telemetry::TraceArgs,

    /// How gRPC connections are spread over cores: multi-thread (tokio's work-stealing
    /// runtime) or per-core (one single-threaded runtime per core, each serving the
    /// connections dealt to it in turn; not with TLS). See docs/performance.md.
    #[arg(long, env = "TOLLGATE_RUNTIME", value_enum, default_value_t = Flavor::default(), help_heading = "Runtime")]
    pub runtime: Flavor,
}

impl ServeArgs {
    /// The store's options, with what the runtime adds.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            runtimes: self.runtime.grpc_runtimes(),
            ..self.store.clone()
        }
    }

    /// The server's options: each part's, as given.
    pub fn options(&self) -> Options {
        Options {
            service: self.service.clone(),
            quota: self.quota.clone(),
            modes: self.modes,
            shutdown: self.shutdown,
            connections: self.connections,
            ready_needs_rules: self.rules.ready_needs_rules,
            statsd: self.statsd.clone(),
            runtime: self.runtime,
            tls: self.tls.files(),
            reload: self.rules.reload(),
            xds: self.xds.options(self.rules.load.merge_domains),
            serve_before_config: self.xds.serve_before_config,
            admin_writes: self.admin.clone(),
            metrics: Arc::new(
                Metrics::new(
                    self.metrics.near_limit_ratio,
                    self.metrics.metrics_max_detailed,
                )
                .with_reference_series(
                    self.metrics.reference_series,
                    self.metrics.reference_response_time,
                ),
            ),
            ..Options::default()
        }
    }
}
