//! The RLQS metrics (`tollgate_rlqs_*`): streams, report messages, actions sent, and per
//! bucket (labels `domain`, `bucket`: the bucket's entries as `key=value` joined by `,` in key
//! order) the demand, the rate assigned and the streams. Per-bucket label sets go when the
//! bucket's last stream does, and exist only while a replica tracks at most
//! `MAX_BUCKET_LABELS` buckets, so cardinality stays bounded whatever the data planes report.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::counters::{Labels, label};

/// Buckets with label sets of their own; the totals count every bucket.
pub const MAX_BUCKET_LABELS: usize = 10_000;

#[derive(Default)]
pub struct QuotaMetrics {
    pub streams: Gauge,
    pub buckets: Gauge,
    pub reports: Counter,
    actions: Family<Labels, Counter>,
    demand: Family<Labels, Gauge<f64, AtomicU64>>,
    assigned: Family<Labels, Gauge<f64, AtomicU64>>,
    bucket_streams: Family<Labels, Gauge>,
}

/// One bucket's figures as this replica last computed them.
pub struct BucketFigures<'a> {
    pub domain: &'a str,
    pub bucket: &'a str,
    /// Requests per second offered by every stream reporting the bucket, all replicas.
    pub demand: f64,
    /// Requests per second assigned to this replica's streams (infinite: allow all).
    pub assigned: f64,
    /// Streams reporting the bucket, all replicas.
    pub streams: usize,
}

impl QuotaMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register("rlqs_streams", "Open RLQS streams", self.streams.clone());
        r.register(
            "rlqs_buckets",
            "Quota buckets this replica's streams report",
            self.buckets.clone(),
        );
        r.register(
            "rlqs_reports",
            "RLQS usage report messages received",
            self.reports.clone(),
        );
        r.register(
            "rlqs_actions",
            "RLQS bucket actions sent, by action (assign, abandon, expire)",
            self.actions.clone(),
        );
        r.register(
            "rlqs_bucket_demand",
            "Requests per second offered to a quota bucket, all replicas' streams",
            self.demand.clone(),
        );
        r.register(
            "rlqs_bucket_assigned",
            "Requests per second assigned to this replica's streams of a quota bucket (+Inf: allow all)",
            self.assigned.clone(),
        );
        r.register(
            "rlqs_bucket_streams",
            "Streams reporting a quota bucket, all replicas",
            self.bucket_streams.clone(),
        );
    }

    /// `count` actions of one kind sent.
    pub fn count_actions(&self, action: &'static str, count: u64) {
        if count > 0 {
            self.actions
                .get_or_create(&label("action", action))
                .inc_by(count);
        }
    }

    /// Sets one bucket's gauges.
    pub fn set_bucket(&self, figures: &BucketFigures<'_>) {
        let labels = bucket_labels(figures.domain, figures.bucket);
        self.demand.get_or_create(&labels).set(figures.demand);
        self.assigned.get_or_create(&labels).set(figures.assigned);
        self.bucket_streams
            .get_or_create(&labels)
            .set(i64::try_from(figures.streams).unwrap_or(i64::MAX));
    }

    /// Drops every bucket's label sets (too many buckets to label).
    pub fn clear_buckets(&self) {
        self.demand.clear();
        self.assigned.clear();
        self.bucket_streams.clear();
    }

    /// Drops a bucket's label sets.
    pub fn remove_bucket(&self, domain: &str, bucket: &str) {
        let labels = bucket_labels(domain, bucket);
        self.demand.remove(&labels);
        self.assigned.remove(&labels);
        self.bucket_streams.remove(&labels);
    }
}

fn bucket_labels(domain: &str, bucket: &str) -> Labels {
    vec![("domain", domain.to_owned()), ("bucket", bucket.to_owned())]
}
