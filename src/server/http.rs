//! The HTTP side of serving: the admin listener, and the metrics-only one, each accepting
//! within the HTTP listeners' connection bounds (`inbound`).

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::grpc::Serving;
use crate::inbound::InboundOptions;
use crate::inbound::accept::Acceptor;
use crate::metrics::Metrics;
use crate::runtime::wait_for;

/// Serves `router` on `listener` until `stopped`, within `inbound`'s bounds, counted in
/// `metrics`.
pub(super) fn serve_http(
    (listener, router): (TcpListener, axum::Router),
    inbound: &InboundOptions,
    metrics: &Metrics,
    stopped: &watch::Receiver<bool>,
) -> Serving {
    let acceptor = Acceptor::new(
        listener,
        "http",
        inbound.http_max_connections,
        inbound.http_deadlines(),
        metrics.connections.listener("http"),
    );
    let serving = axum::serve(acceptor, router).with_graceful_shutdown(wait_for(stopped.clone()));
    tokio::spawn(async move { Ok(serving.await?) })
}
