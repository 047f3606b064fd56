//! What one stream is given for one bucket, as the protocol's actions, and when it is sent
//! again. Shaped for what Envoy's filter (1.40) reads: it enforces blanket rules and token
//! buckets (not `requests_per_time_unit`), reads durations in whole seconds, refills a token
//! bucket at `tokens_per_fill / fill_interval` per second, and keeps its bucket when an
//! identical one is sent again (only the time to live restarts).
//!
//! A rate becomes a token bucket refilled every second (every hour or day for slower rates)
//! with the share rounded down, holding a tenth of a second's worth, at least one token:
//! bursts stay small, so that the streams' admissions add up to at most the bucket's rate
//! second by second.

use std::time::{Duration, Instant};

use prost_types::Duration as ProtoDuration;

use super::bucket::BucketKey;
use crate::pb::rate_limit_quota_response::BucketAction;
use crate::pb::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use crate::pb::rate_limit_strategy::{BlanketRule, Strategy};
use crate::pb::{BucketId, RateLimitStrategy, TokenBucket};

/// One stream's assignment for one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Grant {
    AllowAll,
    DenyAll,
    /// Requests per second.
    Rate(f64),
}

/// An assignment as last sent to a stream.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    pub grant: Grant,
    pub at: Instant,
}

/// A rate that moves by more than this fraction is sent at once; smaller moves wait for the
/// renewal, so that noise in the demand does not become a stream of assignments.
const RESEND_CHANGE: f64 = 0.05;

/// How many seconds of the rate the token bucket holds.
const BURST_SECONDS: f64 = 0.1;

/// Whether `grant` must be sent now to a stream last sent `last`: never sent, changed kind,
/// moved by more than `RESEND_CHANGE`, or half its time to live gone.
pub fn due(last: Option<&Sent>, grant: Grant, now: Instant, ttl: Duration) -> bool {
    let Some(last) = last else {
        return true;
    };
    let changed = match (last.grant, grant) {
        (Grant::Rate(old), Grant::Rate(new)) => (new - old).abs() > old.abs() * RESEND_CHANGE,
        (old, new) => old != new,
    };
    changed || now.saturating_duration_since(last.at) >= ttl / 2
}

/// The assignment of `grant` to `bucket`, valid for `ttl` (zero: expired at once).
pub fn assign(bucket: &BucketKey, grant: Grant, ttl: Duration) -> BucketAction {
    let action = QuotaAssignmentAction {
        assignment_time_to_live: Some(proto_duration(ttl)),
        rate_limit_strategy: Some(strategy(grant)),
    };
    BucketAction {
        bucket_id: Some(bucket_id(bucket)),
        bucket_action: Some(Action::QuotaAssignmentAction(action)),
    }
}

/// Tells a stream the server no longer tracks `bucket`.
pub fn abandon(bucket: &BucketKey) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(bucket)),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

/// The protocol's strategy for a grant.
pub fn strategy(grant: Grant) -> RateLimitStrategy {
    let strategy = match grant {
        Grant::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Grant::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Grant::Rate(per_second) => Strategy::TokenBucket(token_bucket(per_second)),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}

/// `per_second` as whole tokens per whole-second refill: per second, else per hour, else per
/// day, rounded down, so that the streams' shares never add up to more than the bucket's rate
/// (at the cost of up to one request per refill each). The one exception: a share under one
/// request a day is given one a day, the least a token bucket can give. Envoy ignores a
/// change of `fill_interval` alone, so two tiers never share a token count.
fn token_bucket(per_second: f64) -> TokenBucket {
    let (seconds, tokens) = [1, 3_600, 86_400]
        .into_iter()
        // The epsilon keeps an exact share (50 of 100) from being floored a request short by
        // the split's floating-point arithmetic.
        .map(|seconds| (seconds, (per_second * seconds as f64 + 1e-6).floor()))
        .find(|&(_, tokens)| tokens >= 1.0)
        .unwrap_or((86_400, 1.0));
    let tokens = tokens.min(f64::from(u32::MAX)) as u32;
    let burst = (per_second * BURST_SECONDS)
        .ceil()
        .clamp(1.0, f64::from(u32::MAX)) as u32;
    TokenBucket {
        max_tokens: burst,
        tokens_per_fill: Some(tokens),
        fill_interval: Some(ProtoDuration { seconds, nanos: 0 }),
    }
}

fn bucket_id(bucket: &BucketKey) -> BucketId {
    BucketId {
        bucket: bucket.clone().into_iter().collect(),
    }
}

/// Whole seconds, rounded up: Envoy drops the fraction, and a time to live under a second
/// would expire at once.
fn proto_duration(duration: Duration) -> ProtoDuration {
    let whole = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    ProtoDuration {
        seconds: i64::try_from(whole).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_a_token_bucket_refilled_in_whole_seconds() {
        let bucket = |rate| match strategy(Grant::Rate(rate)).strategy {
            Some(Strategy::TokenBucket(bucket)) => (
                bucket.max_tokens,
                bucket.tokens_per_fill,
                bucket.fill_interval.map(|d| (d.seconds, d.nanos)),
            ),
            other => panic!("a token bucket, not {other:?}"),
        };
        // Rounded down: 14.29 + 28.57 + 57.14 = 100 becomes 14 + 28 + 57.
        assert_eq!(bucket(57.14), (6, Some(57), Some((1, 0))));
        assert_eq!(bucket(28.57), (3, Some(28), Some((1, 0))));
        assert_eq!(bucket(1.0), (1, Some(1), Some((1, 0))));
        assert_eq!(bucket(0.5), (1, Some(1800), Some((3600, 0))));
        // 10 a day among 5 streams: 2 a day each, not one an hour.
        assert_eq!(bucket(2.0 / 86_400.0), (1, Some(2), Some((86_400, 0))));
        assert_eq!(bucket(1e-9), (1, Some(1), Some((86_400, 0))));
    }

    #[test]
    fn times_to_live_are_whole_seconds_rounded_up() {
        let ttl = |d| proto_duration(d).seconds;
        assert_eq!(ttl(Duration::from_millis(1500)), 2);
        assert_eq!(ttl(Duration::from_secs(10)), 10);
        assert_eq!(ttl(Duration::ZERO), 0);
    }

    #[test]
    fn assignments_are_resent_on_a_real_change_or_half_way_to_expiry() {
        let at = Instant::now();
        let ttl = Duration::from_secs(10);
        let sent = Sent {
            grant: Grant::Rate(100.0),
            at,
        };
        assert!(due(None, Grant::AllowAll, at, ttl));
        assert!(!due(Some(&sent), Grant::Rate(104.0), at, ttl));
        assert!(due(Some(&sent), Grant::Rate(106.0), at, ttl));
        assert!(due(Some(&sent), Grant::DenyAll, at, ttl));
        assert!(!due(
            Some(&sent),
            Grant::Rate(100.0),
            at + Duration::from_secs(4),
            ttl
        ));
        assert!(due(
            Some(&sent),
            Grant::Rate(100.0),
            at + Duration::from_secs(5),
            ttl
        ));
    }
}
