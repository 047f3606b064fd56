//! The listeners' metrics: connections open, connections closed by tollgate and why, and
//! failed accepts, each by listener (`grpc`, `http`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::counters::{Labels, label};

#[derive(Default)]
pub struct ConnectionMetrics {
    open: Family<Labels, Gauge>,
    closed: Family<Labels, Counter>,
    accept_errors: Family<Labels, Counter>,
}

/// One listener's metrics, looked up once.
#[derive(Clone, Debug, Default)]
pub struct ListenerMetrics {
    pub open: Gauge,
    pub accept_errors: Counter,
    closed: Family<Labels, Counter>,
    listener: &'static str,
}

impl ListenerMetrics {
    /// One connection closed by tollgate for `reason` (`limit`, `handshake`, `idle`,
    /// `write_stalled`, `max_age`, `slow_client`, `over_bound`).
    pub fn count_closed(&self, reason: &'static str) {
        let labels = vec![
            ("listener", self.listener.to_owned()),
            ("reason", reason.to_owned()),
        ];
        self.closed.get_or_create(&labels).inc();
    }
}

impl ConnectionMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections",
            "Connections open, by listener",
            self.open.clone(),
        );
        registry.register(
            "connections_closed",
            "Connections tollgate closed, by listener and reason: limit (over --grpc-max-connections or --http-max-connections), handshake (no first bytes within --connection-handshake-timeout), idle (--connection-idle-timeout), write_stalled (answers not read for --connection-write-timeout), max_age (still open at the end of --grpc-max-connection-age-grace), slow_client (the connection with the most requests waiting on its client, past --grpc-max-requests-waiting), over_bound (its client went past a bound of the whole service: --rlqs-max-subscriptions, --rlqs-max-bucket-bytes)",
            self.closed.clone(),
        );
        registry.register(
            "accept_errors",
            "Failed accepts (out of file descriptors and the like), by listener",
            self.accept_errors.clone(),
        );
    }

    /// The metrics of the listener named `listener`.
    pub fn listener(&self, listener: &'static str) -> ListenerMetrics {
        let labels = label("listener", listener);
        ListenerMetrics {
            open: self.open.get_or_create(&labels).clone(),
            accept_errors: self.accept_errors.get_or_create(&labels).clone(),
            closed: self.closed.clone(),
            listener,
        }
    }
}
