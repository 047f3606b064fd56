//! The gRPC face of the limiter: protobuf ↔ domain types, and the one mapping from errors to
//! `tonic::Status`. Nothing else happens here.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::clock::{MICROS_PER_SECOND, Micros};
use crate::descriptor::{self, InputLimits, RequestError};
use crate::limit::Unit;
use crate::limiter::{Code, Decision, DescriptorStatus, RateLimiter};
use crate::pb::{self, rate_limit_response as rls};
use crate::storage::StoreError;

/// `envoy.service.ratelimit.v3.RateLimitService`.
#[derive(Clone)]
pub struct RlsService {
    limiter: Arc<RateLimiter>,
    input_limits: InputLimits,
}

impl RlsService {
    pub fn new(limiter: Arc<RateLimiter>, input_limits: InputLimits) -> Self {
        Self {
            limiter,
            input_limits,
        }
    }

    /// Validates, decides and encodes one request; shared by gRPC and `POST /json`.
    pub async fn decide(
        &self,
        request: pb::RateLimitRequest,
    ) -> Result<pb::RateLimitResponse, Error> {
        let request = descriptor::Request::from_pb(request, &self.input_limits)?;
        let decision = self.limiter.should_rate_limit(&request).await?;
        Ok(encode(decision))
    }
}

#[tonic::async_trait]
impl pb::RateLimitService for RlsService {
    #[tracing::instrument(skip_all, fields(domain, descriptors, code))]
    async fn should_rate_limit(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        let request = request.into_inner();
        let span = tracing::Span::current();
        span.record("domain", request.domain.as_str());
        span.record("descriptors", request.descriptors.len());
        let response = self.decide(request).await.map_err(Status::from)?;
        span.record("code", response.overall_code);
        Ok(Response::new(response))
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        match error {
            Error::Request(error) => Status::invalid_argument(error.to_string()),
            // UNAVAILABLE, not an OK or a guess: Envoy's `failure_mode_deny` then decides
            // whether traffic passes while the store is down, as the operator configured.
            Error::Store(error) => {
                tracing::warn!(%error, "store call failed");
                Status::unavailable("rate limit store unavailable")
            }
        }
    }
}

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
        seconds: i64::try_from(duration.div_ceil(MICROS_PER_SECOND)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}
