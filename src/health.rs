//! Health that tells the truth. Ready means "can answer as configured": while not shutting
//! down, and, when a failing store makes requests fail (`--on-store-error unavailable`), while
//! the store answers `ping`. With `allow` or `deny` a store outage still gets the configured
//! answer, so readiness stays (taking every replica out of service at once would bypass that
//! answer), and the store's own state is reported beside it: the `tollgate_store_up` gauge,
//! the `/readyz` body and a log line at each change. One state drives both the gRPC health
//! service (for the names Envoy and Kubernetes probe) and the HTTP `/healthcheck` and
//! `/readyz` endpoints.
//!
//! Liveness (`/healthz`) fails only when the store reports its client stuck: calls failing
//! for `--store-stuck-after` through fresh connections (`storage/redis/doctor.rs`), which a
//! restart may cure. Nothing else does: a Redis outage is not cured by restarting.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use prometheus_client::metrics::gauge::Gauge;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::rules::RuleSet;
use crate::storage::{CounterStore, StoreError};

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
    /// Why the store client is stuck, when it is (liveness fails).
    stuck: Arc<ArcSwapOption<String>>,
    shutting_down: Arc<AtomicBool>,
    /// Whether a store outage makes requests fail, hence the server unready.
    store_gates_readiness: bool,
    /// `tollgate_store_up`.
    store_up: Gauge,
    /// `tollgate_ready`.
    ready: Gauge,
    /// The rules in force, which must have been loaded for readiness.
    rules: Option<Arc<ArcSwap<RuleSet>>>,
    /// `--ready-needs-rules`: they must name a domain, too.
    needs_domain: bool,
    /// The readiness last published.
    published: Arc<AtomicBool>,
}

impl Health {
    /// Until the store has answered, NOT_SERVING if `store_gates_readiness`, else SERVING.
    pub async fn new(
        reporter: HealthReporter,
        store_gates_readiness: bool,
        (store_up, ready): (Gauge, Gauge),
    ) -> Self {
        let health = Self {
            reporter,
            store_ok: Arc::new(AtomicBool::new(false)),
            stuck: Arc::new(ArcSwapOption::empty()),
            shutting_down: Arc::new(AtomicBool::new(false)),
            store_gates_readiness,
            store_up,
            ready,
            rules: None,
            needs_domain: false,
            published: Arc::new(AtomicBool::new(false)),
        };
        health.publish().await;
        health
    }

    /// Ready only while `rules` have been loaded (`RuleSet::not_loaded` is not) and, if
    /// `needs_domain`, name at least one domain; checked at every probe.
    pub async fn requiring_rules(
        mut self,
        rules: Arc<ArcSwap<RuleSet>>,
        needs_domain: bool,
    ) -> Self {
        self.rules = Some(rules);
        self.needs_domain = needs_domain;
        self.publish().await;
        self
    }

    pub fn is_ready(&self) -> bool {
        (self.is_store_ok() || !self.store_gates_readiness)
            && self.has_rules()
            && !self.shutting_down.load(Ordering::SeqCst)
    }

    /// Whether the rules satisfy readiness (always, unless `requiring_rules`).
    fn has_rules(&self) -> bool {
        self.rules.as_ref().is_none_or(|rules| {
            let rules = rules.load();
            rules.is_loaded() && !(self.needs_domain && rules.domains().is_empty())
        })
    }

    /// Whether the store answered the latest probe.
    pub fn is_store_ok(&self) -> bool {
        self.store_ok.load(Ordering::SeqCst)
    }

    /// Why the store client cannot recover by itself, if it cannot: liveness fails.
    pub fn stuck(&self) -> Option<Arc<String>> {
        self.stuck.load_full()
    }

    /// Learns from a probe of the store.
    pub async fn set_store(&self, probe: &Result<(), StoreError>) {
        let stuck = match probe {
            Err(StoreError::Stuck(why)) => Some(Arc::new(why.clone())),
            _ => None,
        };
        if let (Some(why), None) = (&stuck, self.stuck.load().as_ref()) {
            tracing::error!(%why, "the store client cannot recover by itself; failing liveness (/healthz) so that the process is restarted (--store-stuck-after)");
        }
        self.stuck.store(stuck);
        self.set_store_ok(probe.is_ok()).await;
    }

    async fn set_store_ok(&self, ok: bool) {
        let changed = self.store_ok.swap(ok, Ordering::SeqCst) != ok;
        // After the state it reports: whoever reads the gauge finds readiness in step.
        self.store_up.set(i64::from(ok));
        if changed {
            match (ok, self.store_gates_readiness) {
                (true, _) => tracing::info!("store answers"),
                (false, true) => tracing::warn!("store does not answer; not ready"),
                (false, false) => {
                    tracing::warn!(
                        "store does not answer; still ready, answering by --on-store-error"
                    )
                }
            }
        }
        // Readiness may also have changed with the rules (a reload).
        if self.published.load(Ordering::SeqCst) != self.is_ready() {
            self.publish().await;
        }
    }

    /// Flips to NOT_SERVING for good, so load balancers stop sending before the drain.
    pub async fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.publish().await;
    }

    async fn publish(&self) {
        let ready = self.is_ready();
        self.published.store(ready, Ordering::SeqCst);
        self.ready.set(i64::from(ready));
        match &self.rules {
            Some(rules) if !rules.load().is_loaded() => {
                tracing::warn!("no rate limit configuration loaded; not ready");
            }
            Some(_) if !self.has_rules() => {
                tracing::warn!("the rules name no domain; not ready (--ready-needs-rules)");
            }
            _ => {}
        }
        let status = if ready {
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
        let probe = tokio::time::timeout(every, store.ping())
            .await
            .unwrap_or(Err(StoreError::Timeout(every)));
        if health.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        health.set_store(&probe).await;
    }
}
