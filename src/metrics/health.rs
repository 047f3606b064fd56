//! Readiness as metrics: whether the store answers the probe, whether the server is ready.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Default)]
pub struct HealthMetrics {
    /// `tollgate_store_up`: 1 while the store answers the health probe.
    pub store_up: Gauge,
    /// `tollgate_ready`: 1 while health reports SERVING.
    pub ready: Gauge,
}

impl HealthMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_up",
            "1 while the store answers the health probe, else 0",
            self.store_up.clone(),
        );
        registry.register(
            "ready",
            "1 while the server reports itself ready (gRPC health SERVING, /readyz 200), else 0",
            self.ready.clone(),
        );
    }
}
