//! Serving: the gRPC listener (RLS v3 + gRPC health) and the HTTP admin listener, a store
//! probe driving health, and graceful shutdown: when `shutdown` resolves, health flips to
//! NOT_SERVING, then after `shutdown_delay` (time for load balancers to notice) both
//! listeners stop accepting and in-flight calls finish, bounded by `drain_timeout`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod grpc;
mod http;

pub use grpc::{
    ConnectionOptions, GrpcListener, ServerError, grpc_acceptor, grpc_router, grpc_server,
    tcp_incoming,
};
use grpc::{Serving, serve_grpc};
use http::serve_http;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use tokio::net::{TcpListener, UnixListener};
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

/// Where the server listens: flags of `tollgate serve`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct ListenOptions {
    /// gRPC listen address (RLS v3 and gRPC health): `HOST:PORT`, or `:PORT` for every
    /// address of the host, IPv6 and IPv4.
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = ":8081", value_parser = crate::options::listen_addr)]
    pub grpc_addr: SocketAddr,

    /// Serve gRPC on this Unix socket instead of --grpc-addr (plaintext; for a sidecar on the
    /// same host; the reference's GRPC_UDS).
    #[arg(long, env = "TOLLGATE_GRPC_UDS")]
    pub grpc_uds: Option<std::path::PathBuf>,

    /// HTTP admin listen address (/healthcheck, /healthz, /readyz, /json, /config), as
    /// --grpc-addr.
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = ":8080", value_parser = crate::options::listen_addr)]
    pub http_addr: SocketAddr,
}

impl Default for ListenOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

impl ListenOptions {
    /// Refuses two listeners on one address (port 0, "any free port", excepted), which would
    /// otherwise fail as if another process held it.
    pub fn check_distinct(&self, metrics: Option<SocketAddr>) -> Result<(), SameAddress> {
        let grpc = self
            .grpc_uds
            .is_none()
            .then_some(("--grpc-addr", self.grpc_addr));
        let named: Vec<(&'static str, SocketAddr)> = grpc
            .into_iter()
            .chain([("--http-addr", self.http_addr)])
            .chain(metrics.map(|addr| ("--metrics-addr", addr)))
            .collect();
        for (index, (first, addr)) in named.iter().enumerate() {
            let clash = named[index + 1..]
                .iter()
                .find(|(_, other)| addr.port() != 0 && overlap(*addr, *other));
            if let Some((second, _)) = clash {
                return Err(SameAddress {
                    first,
                    second,
                    addr: *addr,
                });
            }
        }
        Ok(())
    }
}

/// Whether two listen addresses would take the same port: equal, or one of them every
/// address of the host.
fn overlap(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Two listeners named for one address.
#[derive(Debug, thiserror::Error)]
#[error("{first} and {second} both name {addr}: each listener needs a port of its own")]
pub struct SameAddress {
    first: &'static str,
    second: &'static str,
    addr: SocketAddr,
}

/// The two bound listeners.
pub struct Listeners {
    pub grpc: GrpcListener,
    pub http: TcpListener,
    /// The metrics alone, with the path they are served at (`--metrics-addr`).
    pub metrics: Option<(TcpListener, String)>,
}

impl Listeners {
    /// Binds both; an address already in use, or not this host's, names its flag.
    pub async fn bind(grpc: SocketAddr, http: SocketAddr) -> Result<Self, BindError> {
        Ok(Self {
            grpc: GrpcListener::Tcp(listen("--grpc-addr", grpc).await?),
            http: listen("--http-addr", http).await?,
            metrics: None,
        })
    }

    /// gRPC on the Unix socket at `path` (a socket left there by an earlier run is replaced),
    /// HTTP on `http`.
    pub fn bind_unix(
        path: &Path,
        http: SocketAddr,
    ) -> impl Future<Output = Result<Self, BindError>> {
        let grpc = listen_unix(path);
        async move {
            Ok(Self {
                grpc: GrpcListener::Unix(grpc?),
                http: listen("--http-addr", http).await?,
                metrics: None,
            })
        }
    }

    /// Also a listener serving only the metrics, at `path`.
    pub async fn with_metrics(mut self, addr: SocketAddr, path: String) -> Result<Self, BindError> {
        self.metrics = Some((listen("--metrics-addr", addr).await?, path));
        Ok(self)
    }
}

fn listen_unix(path: &Path) -> Result<UnixListener, BindError> {
    use std::os::unix::fs::FileTypeExt as _;
    let stale = std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket());
    if stale {
        let _ = std::fs::remove_file(path);
    }
    UnixListener::bind(path).map_err(|error| BindError {
        flag: "--grpc-uds",
        addr: path.display().to_string(),
        hint: match error.kind() {
            std::io::ErrorKind::AddrInUse => {
                "; something else is there: remove it or choose another path"
            }
            std::io::ErrorKind::NotFound => "; its directory does not exist",
            std::io::ErrorKind::PermissionDenied => "; no permission to create it there",
            _ => "",
        },
        error,
    })
}

/// Binds `addr`. Every address of the host (`[::]`) is both IPv6 and IPv4 (whatever the
/// host's `bindv6only`), or IPv4 alone on a host without IPv6.
async fn listen(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    let bound = if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED {
        match dual_stack(addr) {
            Err(error) if is_ipv6_missing(&error) => {
                let v4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
                tracing::info!(flag, %v4, "no IPv6 on this host: listening on IPv4 alone");
                TcpListener::bind(v4).await
            }
            bound => bound,
        }
    } else {
        TcpListener::bind(addr).await
    };
    bound.map_err(|error| BindError {
        flag,
        addr: addr.to_string(),
        hint: match error.kind() {
            std::io::ErrorKind::AddrInUse => {
                "; another process listens there: stop it or choose another port"
            }
            std::io::ErrorKind::AddrNotAvailable => "; the address is not one of this host's",
            std::io::ErrorKind::PermissionDenied => "; ports below 1024 need privileges",
            _ => "",
        },
        error,
    })
}

/// `[::]:port` for IPv6 and IPv4 connections alike.
fn dual_stack(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV6, Type::STREAM, None)?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Whether binding an IPv6 socket failed because the host has no IPv6.
fn is_ipv6_missing(error: &std::io::Error) -> bool {
    const EAFNOSUPPORT: i32 = 97;
    error.raw_os_error() == Some(EAFNOSUPPORT)
        || error.kind() == std::io::ErrorKind::AddrNotAvailable
}

/// A listener that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {addr}: cannot listen: {error}{hint}")]
pub struct BindError {
    pub flag: &'static str,
    pub addr: String,
    hint: &'static str,
    // In the message, not a `source`: the one line says it all.
    error: std::io::Error,
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
    let store_gates_readiness = options.service.on_store_error == OnStoreError::Unavailable;
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
    if let Some(metrics_only) = metrics_only {
        metrics_only.abort();
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
