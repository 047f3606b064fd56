//! The Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): each data plane
//! reports, per quota bucket and reporting interval, how many requests it allowed and
//! denied, and enforces on its own the assignment the server pushes back; no call per
//! request. docs/rlqs.md describes the model.
//!
//! - `bucket`: which rule a bucket falls under, and what it gives (allow all, deny all, a rate);
//! - `demand`: what a stream's reports say about its demand (the time each covers, smoothing);
//! - `split`: one rate divided among streams by demand, with a floor;
//! - `grant`: what one stream is given, as the protocol's strategy, and when it is resent;
//! - `report`: what a stream may report, and why a report is refused (`ReportError`);
//! - `registry`: the streams, their subscriptions and demand; reports in, actions out;
//! - `rebalance`: every interval, demand shared through the store, split again, pushed;
//! - `listing`: the buckets as `GET /config` shows them;
//! - `service`: the gRPC stream, and the service as served.

pub mod bucket;
pub mod demand;
pub mod grant;
pub mod listing;
pub mod rebalance;
pub mod registry;
pub mod report;
pub mod service;
pub mod split;

use std::time::Duration;

use crate::clock::positive_duration;

/// How the quota service behaves. Each field is a flag of `tollgate serve`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct QuotaOptions {
    /// How often each quota bucket is split again among the streams that report it, and
    /// changed assignments pushed (RLQS).
    #[arg(long, env = "TOLLGATE_RLQS_INTERVAL", default_value = "1s", value_parser = positive_duration, help_heading = "Quota service (RLQS)")]
    pub rlqs_interval: Duration,

    /// A bucket in which a stream has reported no request for this long (and for at least two
    /// of the stream's report periods) is abandoned: the stream is sent an AbandonAction and
    /// the server forgets the bucket for it.
    #[arg(long, env = "TOLLGATE_RLQS_ABANDON_AFTER", default_value = "60s", value_parser = positive_duration, help_heading = "Quota service (RLQS)")]
    pub rlqs_abandon_after: Duration,

    /// How long the data plane may apply an assignment that was not renewed: past it, the
    /// filter's expired_assignment_behavior applies (the server renews well before).
    #[arg(long, env = "TOLLGATE_RLQS_ASSIGNMENT_TTL", default_value = "10s", value_parser = positive_duration, help_heading = "Quota service (RLQS)")]
    pub rlqs_assignment_ttl: Duration,

    /// The least share of a bucket's rate a stream gets, as a fraction of an equal share, so
    /// that a new or quiet data plane is never starved.
    #[arg(long, env = "TOLLGATE_RLQS_FLOOR", default_value_t = 0.1, value_parser = fraction, help_heading = "Quota service (RLQS)")]
    pub rlqs_floor: f64,

    /// Most RLQS streams open at once; past it a new stream is refused with
    /// RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "TOLLGATE_RLQS_MAX_STREAMS",
        default_value_t = 10_000,
        help_heading = "Quota service (RLQS)"
    )]
    pub rlqs_max_streams: usize,

    /// Most subscriptions (a stream reporting a bucket) across every stream; a report that
    /// would go past it ends its stream with RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "TOLLGATE_RLQS_MAX_SUBSCRIPTIONS",
        default_value_t = 200_000,
        help_heading = "Quota service (RLQS)"
    )]
    pub rlqs_max_subscriptions: usize,

    /// Most bytes of bucket ids held across every stream (each distinct bucket counts once:
    /// its keys and values, and 64 bytes an entry); a report that would go past it ends its
    /// stream with RESOURCE_EXHAUSTED.
    #[arg(long, env = "TOLLGATE_RLQS_MAX_BUCKET_BYTES", default_value_t = 32 * 1024 * 1024, help_heading = "Quota service (RLQS)")]
    pub rlqs_max_bucket_bytes: usize,
}

impl Default for QuotaOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

/// A number from 0 to 1.
fn fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if (0.0..=1.0).contains(&value) => Ok(value),
        Ok(_) => Err("must be from 0 to 1".into()),
        Err(error) => Err(error.to_string()),
    }
}
