//! The RLS service's metrics: calls by gRPC code, requests refused as they arrived, decisions
//! by overall code, and how long a decision takes.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::counters::{Labels, grpc_code, label};
use super::reference::ResponseTime;

pub struct ServiceMetrics {
    requests: Family<Labels, Counter>,
    refusals: Family<Labels, Counter>,
    decisions: Family<Labels, Counter>,
    /// The label sets nearly every request counts under, looked up once rather than per call.
    requests_ok: Counter,
    decisions_ok: Counter,
    decisions_over: Counter,
    decision_seconds: Histogram,
    refunds: Family<Labels, Counter>,
    /// The reference's response time series, when its series are served
    /// (`--metrics-reference-series`).
    pub(super) reference_time: std::sync::OnceLock<ResponseTime>,
}

impl Default for ServiceMetrics {
    fn default() -> Self {
        let requests = Family::<Labels, Counter>::default();
        let decisions = Family::<Labels, Counter>::default();
        let requests_ok = requests
            .get_or_create(&label("code", grpc_code(tonic::Code::Ok)))
            .clone();
        let decisions_ok = decisions.get_or_create(&label("overall", "OK")).clone();
        let decisions_over = decisions
            .get_or_create(&label("overall", "OVER_LIMIT"))
            .clone();
        Self {
            requests_ok,
            decisions_ok,
            decisions_over,
            requests,
            refusals: Family::default(),
            decisions,
            // 10 µs to ~5 s.
            decision_seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 20)),
            refunds: Family::default(),
            reference_time: std::sync::OnceLock::new(),
        }
    }
}

impl ServiceMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "ShouldRateLimit calls by gRPC status code",
            self.requests.clone(),
        );
        registry.register(
            "intake_refusals",
            "Requests refused while they arrived, by reason: timeout (not whole within --grpc-request-timeout), reading (--grpc-max-requests-reading), bytes (--grpc-max-bytes-reading), too_large, framing, broken",
            self.refusals.clone(),
        );
        registry.register(
            "decisions",
            "Decisions by overall code",
            self.decisions.clone(),
        );
        registry.register(
            "refunds",
            "Refunds clients asked for (is_negative_hits), one per limit, by outcome: given (back to the counter, never more than it holds in its window) or refused (--refunds refuse, or the rule's refunds: refuse)",
            self.refunds.clone(),
        );
        registry.register(
            "decision_duration_seconds",
            "Time to decide one request, store call included",
            self.decision_seconds.clone(),
        );
    }

    /// One `ShouldRateLimit` call answered with `code`.
    pub fn count_request(&self, code: tonic::Code) {
        match code {
            tonic::Code::Ok => self.requests_ok.inc(),
            code => self
                .requests
                .get_or_create(&label("code", grpc_code(code)))
                .inc(),
        };
    }

    /// One request refused while it arrived, for `reason` (`intake::Refusal::reason`).
    pub fn count_refusal(&self, reason: &'static str) {
        self.refusals.get_or_create(&label("reason", reason)).inc();
    }

    /// One decision, by its overall code.
    pub fn count_decision(&self, over_limit: bool) {
        match over_limit {
            false => self.decisions_ok.inc(),
            true => self.decisions_over.inc(),
        };
    }

    /// One refund asked for on one limit: given, or refused.
    pub fn count_refund(&self, given: bool) {
        let outcome = if given { "given" } else { "refused" };
        self.refunds.get_or_create(&label("outcome", outcome)).inc();
    }

    pub fn observe_decision(&self, took: Duration) {
        self.decision_seconds.observe(took.as_secs_f64());
        if let Some(reference) = self.reference_time.get() {
            reference.observe(took);
        }
    }
}
