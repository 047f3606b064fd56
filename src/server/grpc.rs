//! The gRPC side of serving: the routes (RLS v3, RLQS, health, reflection), the transport
//! settings shared with the null-handler server, and how accepted connections are served
//! (plaintext, TLS, a Unix socket, or spread over the per-core runtimes).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::watch;
use tonic::transport::server::Router;

use crate::inbound::accept::Acceptor;
use crate::inbound::watched::Inbound;
use crate::inbound::{Deadlines, InboundOptions};
use crate::intake::{Intake, IntakeOptions};
use crate::metrics::Metrics;
use crate::rlqs::service::QuotaService;
use crate::runtime::{self, Flavor, wait_for};
use crate::service::RlsService;
use crate::service::route::RlsRoute;
use crate::tls::{TlsFiles, TlsIncoming};
use tokio::task::JoinHandle;

/// Where gRPC is served: a TCP address, or a Unix socket (`--grpc-uds`).
pub enum GrpcListener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl GrpcListener {
    /// The TCP address (a Unix socket has none).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            GrpcListener::Tcp(listener) => listener.local_addr(),
            GrpcListener::Unix(_) => Err(std::io::Error::other("gRPC is on a Unix socket")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("grpc server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("http server: {0}")]
    Http(#[from] std::io::Error),
    #[error("server task: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error("grpc reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("--runtime per-core does not serve TLS yet; use --runtime multi-thread")]
    PerCoreTls,
    #[error(transparent)]
    Statsd(#[from] crate::statsd::StatsdError),
    #[error("--grpc-uds serves plaintext only (a Unix socket stays on the host); drop --tls-cert")]
    UnixTls,
}

pub(super) type Serving = JoinHandle<Result<(), ServerError>>;

/// How long a gRPC connection lives: flags of `tollgate serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct ConnectionOptions {
    /// Close each gRPC connection this long after it opened (HTTP/2 GOAWAY: the client opens
    /// a new one, maybe to another replica), so that a scale-out behind a Kubernetes Service
    /// gets a share of long-lived Envoy connections; 0s: never (the reference's
    /// GRPC_MAX_CONNECTION_AGE).
    #[arg(long = "grpc-max-connection-age", env = "TOLLGATE_GRPC_MAX_CONNECTION_AGE", default_value = "0s", value_parser = humantime::parse_duration)]
    pub max_age: Duration,

    /// How long calls in flight on an aged connection may still take before it is closed
    /// (the reference's GRPC_MAX_CONNECTION_AGE_GRACE).
    #[arg(long = "grpc-max-connection-age-grace", env = "TOLLGATE_GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub max_age_grace: Duration,

    /// How many connections each listener holds, and how long a silent or non-reading
    /// peer's connection stays.
    #[command(flatten)]
    pub inbound: InboundOptions,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

impl ConnectionOptions {
    /// The deadlines of a gRPC connection: the inbound ones, and its whole life when
    /// connections age.
    pub fn deadlines(&self) -> Deadlines {
        Deadlines {
            lifetime: (!self.max_age.is_zero()).then(|| self.max_age + self.max_age_grace),
            ..self.inbound.deadlines()
        }
    }
}

/// The gRPC routes: RLS v3, RLQS, gRPC health, and server reflection (so that `grpcurl list` and
/// `grpcurl describe` work without the proto files).
pub fn grpc_router(
    service: RlsService,
    quotas: QuotaService,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    intake: &IntakeOptions,
    connections: ConnectionOptions,
) -> Result<Router, ServerError> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let max_request_bytes = service.max_request_bytes();
    let intake_bounds = Arc::new(Intake::new(intake));
    let mut server = grpc_server(intake.grpc_max_streams);
    if !connections.max_age.is_zero() {
        // The age only: given a grace too, tonic sleeps through age and grace and then cuts
        // the connection, without the GOAWAY that tells the client to move its new calls
        // elsewhere, so that calls in flight at the cut fail. The grace is the connection's
        // lifetime deadline instead (`ConnectionOptions::deadlines`).
        server = server.max_connection_age(connections.max_age);
    }
    Ok(server
        .add_service(health_service)
        .add_service(reflection)
        .add_service(RlsRoute::new(
            service,
            Arc::clone(&intake_bounds),
            max_request_bytes,
        ))
        .add_service(quotas.route(intake_bounds)))
}

/// The gRPC server with tollgate's transport settings; shared with the null-handler server
/// that benchmarks measure against (examples/null_server.rs), so both run the same transport.
pub fn grpc_server(max_streams: u32) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        // Streams a client may have open on one connection: requests beyond wait on the
        // client's side (HTTP/2 flow control) instead of piling up in this process.
        .max_concurrent_streams(max_streams)
        // What a stream may send before it is read: a request is a few hundred bytes, and a
        // stream refused unread (`intake`) then costs the bytes in flight, not a megabyte.
        .initial_stream_window_size(STREAM_WINDOW)
}

/// HTTP/2's own default window: 64 KiB.
const STREAM_WINDOW: u32 = 65_535;

/// The gRPC listener's acceptor: its connections within `connections`' bounds, counted in
/// `metrics`.
pub fn grpc_acceptor(
    listener: TcpListener,
    connections: &ConnectionOptions,
    metrics: &Metrics,
) -> Acceptor {
    Acceptor::new(
        listener,
        "grpc",
        connections.inbound.grpc_max_connections,
        connections.deadlines(),
        metrics.connections.listener("grpc"),
    )
}

/// Accepted gRPC connections within the default bounds (the null-handler server's, so that
/// it runs the transport tollgate runs).
pub fn tcp_incoming(
    listener: TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<Inbound<tokio::net::TcpStream>>> {
    grpc_acceptor(listener, &ConnectionOptions::default(), &Metrics::default()).incoming()
}

/// The connections accepted on a Unix socket.
fn unix_incoming(
    listener: UnixListener,
) -> impl futures_util::Stream<Item = std::io::Result<UnixStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

/// Serves gRPC on `listener` (over TLS, or across the per-core runtimes) until `stopped`,
/// each TCP connection within `connections`' bounds.
pub(super) fn serve_grpc(
    router: Router,
    listener: GrpcListener,
    tls: Option<(TlsFiles, Arc<ServerConfig>)>,
    (flavor, connections, metrics): (Flavor, ConnectionOptions, &Metrics),
    stopped: &watch::Receiver<bool>,
) -> Serving {
    let stop = wait_for(stopped.clone());
    let runtimes = flavor.grpc_runtimes();
    let listener = match listener {
        GrpcListener::Tcp(listener) => listener,
        // Plaintext on the main runtime: a Unix socket is for a sidecar on the same host.
        GrpcListener::Unix(listener) => {
            if tls.is_some() {
                return tokio::spawn(async { Err(ServerError::UnixTls) });
            }
            let serving = router.serve_with_incoming_shutdown(unix_incoming(listener), stop);
            return tokio::spawn(async move { Ok(serving.await?) });
        }
    };
    let acceptor = grpc_acceptor(listener, &connections, metrics);
    match tls {
        Some((files, config)) => {
            let incoming = TlsIncoming::new(acceptor, files, config);
            let serving = router.serve_with_incoming_shutdown(incoming, stop);
            tokio::spawn(async move { Ok(serving.await?) })
        }
        None if runtimes > 1 => {
            let serving = runtime::serve_grpc(router, acceptor, runtimes, stopped.clone());
            tokio::spawn(async move { Ok(serving.await?) })
        }
        None => {
            let serving = router.serve_with_incoming_shutdown(acceptor.incoming(), stop);
            tokio::spawn(async move { Ok(serving.await?) })
        }
    }
}
