//! Prometheus metrics, served on `GET /metrics` (prometheus-client, OpenMetrics text). Names
//! start with `tollgate_`; counters end in `_total`.
//!
//! Per limit (labels `domain` and `limit`, the rule's config path in the reference's stats
//! notation, e.g. `api.user`): `total_hits`, `over_limit`, `near_limit`, `within_limit`,
//! `shadow_mode`, counted in hits as the reference counts them. Client values appear in a
//! label only for rules with `detailed_metric` or levels with `value_to_metric`, and then at
//! most `max_detailed` distinct label sets: beyond that a hit counts under the rule's plain
//! path, so cardinality stays bounded whatever clients send.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod counters;
mod quota;

pub use counters::{HeldCounters, Labels, grpc_code, label};
use counters::{LimitCounters, PerLimit};
pub use quota::{BucketFigures, MAX_BUCKET_LABELS, QuotaMetrics};

/// Per domain, per rule path: the plain (no client value) label sets, found by borrowed
/// strings so that counting a hit allocates nothing. Behind an `ArcSwap`, because every
/// limited descriptor reads it and new paths are rare: a read takes no lock and writes no
/// shared memory (a `RwLock` would bounce its reader count between cores on every call).
type PlainCounters = HashMap<String, HashMap<String, Arc<LimitCounters>>>;

pub struct Metrics {
    /// Tells this instance from others (see `HeldCounters`).
    identity: usize,
    registry: Registry,
    /// The `process_*` metrics, under their standard names (no `tollgate_` prefix).
    process: Registry,
    per_limit: PerLimit,
    plain: ArcSwap<PlainCounters>,
    /// Detailed (client-valued) label sets seen, bounded by `max_detailed`.
    detailed: Mutex<HashSet<(String, String)>>,
    max_detailed: usize,
    near_limit_ratio: f64,
    requests: Family<Labels, Counter>,
    decisions: Family<Labels, Counter>,
    /// The label sets nearly every request counts under, looked up once rather than per call.
    requests_ok: Counter,
    decisions_ok: Counter,
    decisions_over: Counter,
    pub decision_seconds: Histogram,
    pub store_seconds: Histogram,
    pub store_errors: Family<Labels, Counter>,
    pub config_reloads: Family<Labels, Counter>,
    pub deny_cache_hits: Counter,
    pub store_up: Gauge,
    /// `tollgate_ready`: 1 while health reports SERVING.
    pub ready: Gauge,
    /// When the rules in force (or a failed attempt to replace them) were last loaded.
    config_load_time: Gauge<f64, AtomicU64>,
    config_load_success: Gauge,
    /// `tollgate_config_source_info{source, version}`: 1 for the rules in force.
    config_source: Family<Labels, Gauge>,
    pub memory_keys: Gauge,
    pub memory_evictions: Counter,
    pub tokio_tasks: Gauge,
    /// The RLQS service's metrics.
    pub quota: QuotaMetrics,
}

/// One descriptor's count, as the limiter saw it.
pub struct LimitHit<'a> {
    pub domain: &'a str,
    /// The rule's config path, and the path with client values when it has some.
    pub path: &'a str,
    pub detailed_path: Option<String>,
    /// Where the rule holds the counters of `path`, for a configured rule.
    pub held: Option<&'a HeldCounters>,
    pub hits: u64,
    pub limit: u64,
    /// After the call; for a denied one, the room it found (see `algorithm::Outcome`).
    pub remaining: u64,
    pub allowed: bool,
    pub shadow: bool,
}

impl Metrics {
    pub fn new(near_limit_ratio: f64, max_detailed: usize) -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let per_limit = PerLimit::default();
        registry.register(
            "total_hits",
            "Hits counted per limit",
            per_limit.total_hits.clone(),
        );
        registry.register(
            "over_limit",
            "Hits over the limit",
            per_limit.over_limit.clone(),
        );
        registry.register(
            "near_limit",
            "Hits within the limit but past --near-limit-ratio of it",
            per_limit.near_limit.clone(),
        );
        registry.register(
            "within_limit",
            "Hits within the limit",
            per_limit.within_limit.clone(),
        );
        registry.register(
            "shadow_mode",
            "Hits over the limit let through by shadow mode",
            per_limit.shadow_mode.clone(),
        );
        static INSTANCES: AtomicUsize = AtomicUsize::new(0);
        let metrics = Self {
            identity: INSTANCES.fetch_add(1, Ordering::Relaxed),
            per_limit,
            plain: ArcSwap::default(),
            detailed: Mutex::new(HashSet::new()),
            max_detailed,
            near_limit_ratio,
            requests: Family::default(),
            decisions: Family::default(),
            requests_ok: Counter::default(),
            decisions_ok: Counter::default(),
            decisions_over: Counter::default(),
            // 10 µs to ~5 s.
            decision_seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 20)),
            store_seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 20)),
            store_errors: Family::default(),
            config_reloads: Family::default(),
            deny_cache_hits: Counter::default(),
            store_up: Gauge::default(),
            ready: Gauge::default(),
            config_load_time: Gauge::default(),
            config_load_success: Gauge::default(),
            config_source: Family::default(),
            process: {
                let mut process = Registry::default();
                process.register_collector(Box::new(crate::process::ProcessCollector));
                process
            },
            memory_keys: Gauge::default(),
            memory_evictions: Counter::default(),
            tokio_tasks: Gauge::default(),
            quota: QuotaMetrics::default(),
            registry,
        };
        metrics.register_service().cache_common_labels()
    }

    fn cache_common_labels(self) -> Self {
        let requests_ok = self
            .requests
            .get_or_create(&label("code", grpc_code(tonic::Code::Ok)))
            .clone();
        let decisions_ok = self
            .decisions
            .get_or_create(&label("overall", "OK"))
            .clone();
        let over = label("overall", "OVER_LIMIT");
        let decisions_over = self.decisions.get_or_create(&over).clone();
        Self {
            requests_ok,
            decisions_ok,
            decisions_over,
            ..self
        }
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

    /// One decision, by its overall code.
    pub fn count_decision(&self, over_limit: bool) {
        match over_limit {
            false => self.decisions_ok.inc(),
            true => self.decisions_over.inc(),
        };
    }

    fn register_service(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "requests",
            "ShouldRateLimit calls by gRPC status code",
            self.requests.clone(),
        );
        r.register(
            "decisions",
            "Decisions by overall code",
            self.decisions.clone(),
        );
        r.register(
            "decision_duration_seconds",
            "Time to decide one request, store call included",
            self.decision_seconds.clone(),
        );
        r.register(
            "store_duration_seconds",
            "Time of one call to a remote store (Redis, Redis Cluster)",
            self.store_seconds.clone(),
        );
        r.register(
            "store_errors",
            "Failed store calls by kind",
            self.store_errors.clone(),
        );
        r.register(
            "config_reloads",
            "Config reloads by result (success, error)",
            self.config_reloads.clone(),
        );
        let build_info = Family::<Labels, Gauge>::default();
        build_info
            .get_or_create(&label("version", env!("CARGO_PKG_VERSION")))
            .set(1);
        r.register("build_info", "tollgate's version, as a label", build_info);
        r.register(
            "config_last_load_timestamp_seconds",
            "When the config was last loaded or a reload last failed, since the Unix epoch",
            self.config_load_time.clone(),
        );
        r.register(
            "config_last_load_success",
            "1 if the last config load or reload succeeded, 0 if it failed",
            self.config_load_success.clone(),
        );
        r.register(
            "config_source_info",
            "Where the rules in force came from (files, xds) and their version, as labels",
            self.config_source.clone(),
        );
        r.register(
            "store_up",
            "1 while the store answers the health probe, else 0",
            self.store_up.clone(),
        );
        r.register(
            "ready",
            "1 while the server reports itself ready (gRPC health SERVING, /readyz 200), else 0",
            self.ready.clone(),
        );
        r.register(
            "deny_cache_hits",
            "Requests answered by the local deny cache",
            self.deny_cache_hits.clone(),
        );
        r.register(
            "memory_keys",
            "Counters held by the memory store",
            self.memory_keys.clone(),
        );
        r.register(
            "memory_evictions",
            "Counters the memory store evicted to stay within --memory-max-keys",
            self.memory_evictions.clone(),
        );
        r.register(
            "tokio_alive_tasks",
            "Tasks alive in the runtime (sampled at scrape time)",
            self.tokio_tasks.clone(),
        );
        self.quota.register(r);
        self
    }

    /// Counts one limited descriptor.
    pub fn count(&self, hit: &LimitHit<'_>) {
        match (&hit.detailed_path, hit.held) {
            (None, Some(held)) => match held.get(self.identity) {
                Some(counters) => self.add(counters, hit),
                None => self.add(
                    &held.hold(self.identity, self.plain(hit.domain, hit.path)),
                    hit,
                ),
            },
            (None, None) => self.add(&self.plain(hit.domain, hit.path), hit),
            (Some(_), _) => self.add(&LimitCounters::new(self.labels(hit)), hit),
        }
    }

    fn add(&self, counters: &LimitCounters, hit: &LimitHit<'_>) {
        let per = &self.per_limit;
        counters.add(&counters.total_hits, &per.total_hits, hit.hits);
        if hit.allowed {
            counters.add(&counters.within_limit, &per.within_limit, hit.hits);
            let near = self.near_hits(hit);
            if near > 0 {
                counters.add(&counters.near_limit, &per.near_limit, near);
            }
        } else {
            // As the reference splits a request that goes partly over: the hits past the
            // room the limit had are over, those within it count as near where past the
            // threshold (limit 20, count 19, 3 hits: 2 over, 1 near).
            let room = if hit.remaining < hit.hits {
                hit.remaining
            } else {
                0
            };
            let over = hit.hits - room;
            counters.add(&counters.over_limit, &per.over_limit, over);
            let near = self.near_of_room(hit.limit, room);
            if near > 0 {
                counters.add(&counters.near_limit, &per.near_limit, near);
            }
            if hit.shadow {
                counters.add(&counters.shadow_mode, &per.shadow_mode, over);
            }
        }
    }

    /// Of the last `room` hits of `limit`, how many are past the near-limit threshold.
    fn near_of_room(&self, limit: u64, room: u64) -> u64 {
        let threshold = (limit as f64 * self.near_limit_ratio).floor() as u64;
        let before = limit.saturating_sub(room);
        limit.saturating_sub(before.max(threshold))
    }

    /// The counters of a rule's plain path.
    fn plain(&self, domain: &str, path: &str) -> Arc<LimitCounters> {
        let held = self.plain.load();
        match held.get(domain).and_then(|paths| paths.get(path)) {
            Some(counters) => Arc::clone(counters),
            None => self.hold_plain(domain, path),
        }
    }

    /// Holds the counters of a rule's plain path from now on (their number is bounded by the
    /// config), keeping the ones another call may have added meanwhile.
    fn hold_plain(&self, domain: &str, path: &str) -> Arc<LimitCounters> {
        let fresh = Arc::new(LimitCounters::new(vec![
            ("domain", domain.to_owned()),
            ("limit", path.to_owned()),
        ]));
        let mut held = None;
        self.plain.rcu(|current| {
            let mut next = PlainCounters::clone(current);
            let counters = next
                .entry(domain.to_owned())
                .or_default()
                .entry(path.to_owned())
                .or_insert_with(|| Arc::clone(&fresh));
            held = Some(Arc::clone(counters));
            next
        });
        held.unwrap_or(fresh)
    }

    /// Hits of an admitted call past the near-limit threshold, as the reference counts them.
    fn near_hits(&self, hit: &LimitHit<'_>) -> u64 {
        let threshold = (hit.limit as f64 * self.near_limit_ratio).floor() as u64;
        let after = hit.limit.saturating_sub(hit.remaining);
        let before = after.saturating_sub(hit.hits);
        if after <= threshold {
            0
        } else if before >= threshold {
            hit.hits
        } else {
            after - threshold
        }
    }

    /// The label set: the detailed path while there is room for another, else the plain path.
    fn labels(&self, hit: &LimitHit<'_>) -> Labels {
        let path = match &hit.detailed_path {
            Some(detailed) => {
                let mut seen = self.detailed.lock().unwrap_or_else(PoisonError::into_inner);
                let key = (hit.domain.to_owned(), detailed.clone());
                if seen.contains(&key) || seen.len() < self.max_detailed {
                    seen.insert(key);
                    detailed.clone()
                } else {
                    hit.path.to_owned()
                }
            }
            None => hit.path.to_owned(),
        };
        vec![("domain", hit.domain.to_owned()), ("limit", path)]
    }

    pub fn observe_decision(&self, took: Duration) {
        self.decision_seconds.observe(took.as_secs_f64());
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let alive = runtime.metrics().num_alive_tasks();
            self.tokio_tasks
                .set(i64::try_from(alive).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        // Writing to a String cannot fail. One exposition ends with one `# EOF`: the first
        // registry's is dropped before the second is appended.
        let _ = encode(&mut out, &self.registry);
        if out.ends_with("# EOF\n") {
            out.truncate(out.len() - "# EOF\n".len());
        }
        let _ = encode(&mut out, &self.process);
        out
    }

    /// Labels the rules in force with their source and version (only these labels remain).
    pub fn config_source(&self, source: &str, version: &str) {
        self.config_source.clear();
        let labels = vec![
            ("source", source.to_owned()),
            ("version", version.to_owned()),
        ];
        self.config_source.get_or_create(&labels).set(1);
    }

    /// Records a config load (at start or a reload) and whether it succeeded.
    pub fn config_loaded(&self, success: bool) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        self.config_load_time.set(now);
        self.config_load_success.set(i64::from(success));
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(0.8, 1_000)
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit<'a>(held: &'a HeldCounters, hits: u64) -> LimitHit<'a> {
        LimitHit {
            domain: "d",
            path: "d.user",
            detailed_path: None,
            held: Some(held),
            hits,
            limit: 100,
            remaining: 50,
            allowed: true,
            shadow: false,
        }
    }

    fn total_hits(metrics: &Metrics) -> Option<u64> {
        metrics.render().lines().find_map(|line| {
            line.strip_prefix("tollgate_total_hits_total{domain=\"d\",limit=\"d.user\"} ")?
                .parse()
                .ok()
        })
    }

    #[test]
    fn grpc_codes_are_spelled_as_grpc_spells_them() {
        assert_eq!(grpc_code(tonic::Code::Ok), "OK");
        assert_eq!(grpc_code(tonic::Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(grpc_code(tonic::Code::Unauthenticated), "UNAUTHENTICATED");
    }

    #[test]
    fn a_rule_holds_its_counters_for_the_metrics_that_found_them_only() {
        let rule_counters = HeldCounters::default();
        let (first, second) = (Metrics::default(), Metrics::default());
        first.count(&hit(&rule_counters, 2));
        first.count(&hit(&rule_counters, 3));
        // Held by the rule now, for `first`; `second` counts into its own registry.
        assert!(rule_counters.get(first.identity).is_some());
        assert!(rule_counters.get(second.identity).is_none());
        second.count(&hit(&rule_counters, 7));
        assert_eq!(total_hits(&first), Some(5));
        assert_eq!(total_hits(&second), Some(7));
        // The same rule loaded again (a reload) finds the same counters.
        first.count(&hit(&HeldCounters::default(), 1));
        assert_eq!(total_hits(&first), Some(6));
    }
}
