//! A decision as the reference answers it: the status shapes of docs/design.md ("Wire
//! contract") in protobuf.

use crate::clock::{Micros, whole_seconds_up};
use crate::limit::Unit;
use crate::limiter::{Code, Decision, DescriptorStatus};
use crate::pb::{self, rate_limit_response as rls};

/// Encodes a decision with the reference's status shapes.
pub fn encode(decision: Decision) -> pb::RateLimitResponse {
    pb::RateLimitResponse {
        overall_code: encode_code(decision.overall) as i32,
        statuses: decision.statuses.into_iter().map(encode_status).collect(),
        ..Default::default()
    }
}

fn encode_code(code: Code) -> rls::Code {
    match code {
        Code::Ok => rls::Code::Ok,
        Code::OverLimit => rls::Code::OverLimit,
    }
}

fn encode_status(status: DescriptorStatus) -> rls::DescriptorStatus {
    match status {
        DescriptorStatus::NoLimit => rls::DescriptorStatus {
            code: rls::Code::Ok as i32,
            ..Default::default()
        },
        DescriptorStatus::Unlimited => rls::DescriptorStatus {
            code: rls::Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        },
        DescriptorStatus::Limited {
            code,
            limit,
            remaining,
            until_reset,
        } => rls::DescriptorStatus {
            code: encode_code(code) as i32,
            current_limit: Some(rls::RateLimit {
                name: limit.name.unwrap_or_default(),
                requests_per_unit: limit.requests_per_unit,
                unit: encode_unit(limit.unit) as i32,
                unit_multiplier: (limit.unit_multiplier > 1).then_some(limit.unit_multiplier),
            }),
            limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(whole_seconds(until_reset)),
            quota: None,
        },
    }
}

fn encode_unit(unit: Unit) -> rls::rate_limit::Unit {
    use rls::rate_limit::Unit as Pb;
    match unit {
        Unit::Second => Pb::Second,
        Unit::Minute => Pb::Minute,
        Unit::Hour => Pb::Hour,
        Unit::Day => Pb::Day,
        Unit::Week => Pb::Week,
        Unit::Month => Pb::Month,
        Unit::Year => Pb::Year,
    }
}

/// Rounds up to whole seconds, as the reference reports (`unit - now % unit` on whole-second
/// clocks): Envoy's `X-RateLimit-Reset` reads only the seconds, and rounding down would tell
/// a client to come back before its window has ended.
fn whole_seconds(duration: Micros) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(whole_seconds_up(duration)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}
