//! Health that tells the truth: SERVING only while the store answers `ping` and the process is
//! not shutting down. One state drives both the gRPC health service (for the names Envoy and
//! Kubernetes probe) and the HTTP `/healthcheck` and `/readyz` endpoints.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::storage::CounterStore;

/// The gRPC health service names that reflect readiness: the server as a whole, the name the
/// reference registers, and the RLS service's full name.
pub const SERVICE_NAMES: [&str; 3] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
];

#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
    store_ok: Arc<AtomicBool>,
    shutting_down: Arc<AtomicBool>,
}

impl Health {
    /// Starts NOT_SERVING until the store has answered.
    pub async fn new(reporter: HealthReporter) -> Self {
        let health = Self {
            reporter,
            store_ok: Arc::new(AtomicBool::new(false)),
            shutting_down: Arc::new(AtomicBool::new(false)),
        };
        health.publish().await;
        health
    }

    pub fn is_ready(&self) -> bool {
        self.store_ok.load(Ordering::SeqCst) && !self.shutting_down.load(Ordering::SeqCst)
    }

    pub async fn set_store_ok(&self, ok: bool) {
        if self.store_ok.swap(ok, Ordering::SeqCst) != ok {
            if ok {
                tracing::info!("store answers; serving");
            } else {
                tracing::warn!("store does not answer; not serving");
            }
            self.publish().await;
        }
    }

    /// Flips to NOT_SERVING for good, so load balancers stop sending before the drain.
    pub async fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.publish().await;
    }

    async fn publish(&self) {
        let status = if self.is_ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in SERVICE_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
    }
}

/// Pings the store every `every` and updates health, until shutdown begins.
pub async fn probe_store(health: Health, store: Arc<dyn CounterStore>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    while !health.shutting_down.load(Ordering::SeqCst) {
        ticks.tick().await;
        let ok = tokio::time::timeout(every, store.ping())
            .await
            .is_ok_and(|ping| ping.is_ok());
        if health.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        health.set_store_ok(ok).await;
    }
}
