//! Serving: the gRPC listener (RLS v3 + gRPC health) and the HTTP admin listener, a store
//! probe driving health, and graceful shutdown: when `shutdown` resolves, health flips to
//! NOT_SERVING, then after `shutdown_delay` (time for load balancers to notice) both
//! listeners stop accepting and in-flight calls finish, bounded by `drain_timeout`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

mod grpc;
mod http;
mod listeners;

pub use grpc::{
    ConnectionOptions, GrpcListener, ServerError, grpc_acceptor, grpc_router, grpc_server,
    tcp_incoming,
};
use grpc::{Serving, serve_grpc};
use http::serve_http;
pub use listeners::{BindError, ListenOptions, Listeners, SameAddress};

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use tokio::sync::watch;

use crate::admin::writes::AdminWrites;
use crate::health::{self, Health};
use crate::limiter::{Modes, RateLimiter};
use crate::metrics::Metrics;
use crate::reload::{ReloadOptions, ReloadStatus};
use crate::rlqs::QuotaOptions;
use crate::rlqs::service::Quotas;
use crate::rules::RuleSet;
use crate::runtime::Flavor;
use crate::service::{OnStoreError, RlsService, ServiceOptions};
use crate::shutdown::ShutdownOptions;
use crate::statsd::StatsdOptions;
use crate::storage::Store;
use crate::tls::TlsFiles;
use crate::xds::XdsOptions;

/// Server settings that are not about counting.
#[derive(Debug, Clone)]
pub struct Options {
    /// How requests are answered (response flags, input bounds, load shedding).
    pub service: ServiceOptions,
    pub modes: Modes,
    /// The quota service (RLQS).
    pub quota: QuotaOptions,
    pub shutdown: ShutdownOptions,
    /// How often the store is pinged for health.
    pub probe_every: Duration,
    /// Where everything is counted (`GET /metrics`); stores built for this server should
    /// report into the same one.
    pub metrics: Arc<Metrics>,
    /// Watch the config directory and reload it on change.
    pub reload: Option<ReloadOptions>,
    /// The outcome of the latest reload (shown by `GET /config`).
    pub reload_status: Arc<ReloadStatus>,
    /// TLS (and mutual TLS) on the gRPC listener.
    pub tls: Option<TlsFiles>,
    /// Not ready while the rules name no domain.
    pub ready_needs_rules: bool,
    /// Send the metrics to statsd too.
    pub statsd: StatsdOptions,
    /// Take the rules from a control plane over xDS instead of files.
    pub xds: Option<XdsOptions>,
    /// With `xds`, be ready before the first rules arrive (unknown domains are answered OK).
    pub serve_before_config: bool,
    /// Who may use the admin's mutating endpoints.
    pub admin_writes: AdminWrites,
    /// How gRPC connections are spread over cores; `run` must be called on the main
    /// runtime of this flavour.
    pub runtime: Flavor,
    /// How long a gRPC connection lives.
    pub connections: ConnectionOptions,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            service: ServiceOptions::default(),
            modes: Modes::default(),
            quota: QuotaOptions::default(),
            shutdown: ShutdownOptions::default(),
            probe_every: Duration::from_secs(1),
            metrics: Arc::new(Metrics::default()),
            reload: None,
            reload_status: Arc::new(ReloadStatus::default()),
            tls: None,
            ready_needs_rules: false,
            statsd: StatsdOptions::default(),
            xds: None,
            serve_before_config: false,
            admin_writes: AdminWrites::default(),
            runtime: Flavor::default(),
            connections: ConnectionOptions::default(),
        }
    }
}

/// Serves until `shutdown` resolves, then drains (see the module docs).
pub async fn run(
    rules: RuleSet,
    store: Store,
    options: Options,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let tls = tls_config(&options)?;
    // Rules from a control plane arrive once serving: until its first set, none is loaded,
    // unless asked to serve before it (unknown domains answered OK).
    let rules = match &options.xds {
        Some(_) if !options.serve_before_config => RuleSet::not_loaded(),
        _ => rules,
    };
    options
        .metrics
        .config
        .loaded(rules.is_loaded() || options.xds.is_some());
    let statsd = crate::statsd::spawn(Arc::clone(&options.metrics), options.statsd.clone()).await?;
    let rules = Arc::new(ArcSwap::from_pointee(rules));
    if options.reload.is_some() {
        options.metrics.config.source("files", "");
    }
    let follower = options.xds.clone().map(|xds| {
        crate::xds::spawn(
            xds,
            Arc::clone(&rules),
            Arc::clone(&options.reload_status),
            Arc::clone(&options.metrics),
        )
    });
    let reloader = options.reload.clone().map(|reload| {
        crate::reload::spawn(
            reload,
            Arc::clone(&rules),
            Arc::clone(&options.reload_status),
            Arc::clone(&options.metrics),
        )
    });
    let limiter = Arc::new(
        RateLimiter::new(Arc::clone(&rules), &store, options.modes)
            .with_metrics(Arc::clone(&options.metrics)),
    );
    let service = RlsService::new(
        Arc::clone(&limiter),
        options.service.clone(),
        Arc::clone(&options.metrics),
    );
    let quotas = Quotas::start(
        options.quota.clone(),
        Arc::clone(&rules),
        store.demand.clone(),
        Arc::clone(&options.metrics),
    );
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let store_gates_readiness = options.service.on_store_error == OnStoreError::Unavailable
        && !options.service.ready_without_store;
    let store_up = options.metrics.health.store_up.clone();
    let gauges = (store_up, options.metrics.health.ready.clone());
    let health = Health::new(reporter, store_gates_readiness, gauges)
        .await
        .requiring_rules(Arc::clone(&rules), options.ready_needs_rules)
        .await;
    let (leases, deferred) = (store.leases.clone(), store.deferred.clone());
    let probe = tokio::spawn(health::probe_store(
        health.clone(),
        store.counters,
        options.probe_every,
    ));

    let (stop, stopped) = watch::channel(false);
    let router = grpc_router(
        service.clone(),
        quotas.service(),
        health_service,
        &options.service.intake,
        options.connections,
    )?;
    let transport = (options.runtime, options.connections, &*options.metrics);
    let mut grpc = serve_grpc(router, listeners.grpc, tls, transport, &stopped);
    let debug_router =
        crate::admin::debug::router(Arc::clone(&limiter), Arc::clone(&options.metrics));
    let admin = crate::admin::router(
        options.admin_writes.clone(),
        service,
        limiter,
        health.clone(),
        Arc::clone(&options.metrics),
        Arc::clone(&options.reload_status),
        Arc::clone(&quotas.registry),
    );
    let (inbound, metrics) = (&options.connections.inbound, &*options.metrics);
    let metrics_only = listeners.metrics.map(|(listener, path)| {
        let router = crate::admin::metrics_router(Arc::clone(&options.metrics), &path);
        serve_http((listener, router), inbound, metrics, &stopped)
    });
    let debug = listeners
        .debug
        .map(|listener| serve_http((listener, debug_router), inbound, metrics, &stopped));
    let mut http = serve_http((listeners.http, admin), inbound, metrics, &stopped);

    tracing::info!("serving");
    tokio::select! {
        () = shutdown => {}
        result = &mut grpc => return flatten(result),
        result = &mut http => return flatten(result),
    }
    health.begin_shutdown().await;
    tokio::time::sleep(options.shutdown.delay).await;
    quotas.stop();
    let _ = stop.send(true);
    probe.abort();
    for task in reloader.iter().chain(&statsd).chain(&follower) {
        task.abort();
    }
    for task in metrics_only.iter().chain(&debug) {
        task.abort();
    }
    let drained = drain(grpc, http, options.shutdown.drain_timeout).await;
    // Once no call is left to decide from them, the slices' unused budget goes back.
    if let Some(leases) = leases {
        leases.give_back_all().await;
    }
    // And the denied hits that count, answered by the deny cache, are counted.
    if let Some(deferred) = deferred {
        deferred.flush_all().await;
    }
    drained
}

/// The gRPC listener's TLS settings, read first: a server that cannot serve TLS as asked must
/// not start.
fn tls_config(options: &Options) -> Result<Option<(TlsFiles, Arc<ServerConfig>)>, ServerError> {
    let Some(files) = &options.tls else {
        return Ok(None);
    };
    if options.runtime == Flavor::PerCore {
        return Err(ServerError::PerCoreTls);
    }
    Ok(Some((files.clone(), files.server_config()?)))
}

/// Waits for both listeners to finish their in-flight calls, at most `timeout`.
async fn drain(mut grpc: Serving, mut http: Serving, timeout: Duration) -> Result<(), ServerError> {
    let drained = tokio::time::timeout(timeout, async {
        let grpc = (&mut grpc).await;
        let http = (&mut http).await;
        flatten(grpc).and(flatten(http))
    })
    .await;
    match drained {
        Ok(result) => {
            tracing::info!("drained; stopped");
            result
        }
        Err(_) => {
            tracing::warn!(?timeout, "drain timed out; stopping anyway");
            grpc.abort();
            http.abort();
            Ok(())
        }
    }
}

fn flatten(
    result: Result<Result<(), ServerError>, tokio::task::JoinError>,
) -> Result<(), ServerError> {
    result?
}
