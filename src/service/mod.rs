//! The gRPC face of the limiter: the RLS v3 handler, and the one mapping from errors to
//! `tonic::Status`. Around it: its flags (`options.rs`), how a decision is encoded
//! (`encode.rs`), the answer when the store fails (`failure.rs`), the client's deadline
//! (`deadline.rs`), and the method as an HTTP/2 route (`route.rs`).

mod deadline;
pub use deadline::Deadline;
pub mod encode;
mod failure;
mod options;
pub mod route;
mod throttle;

pub use encode::encode;
pub use options::{OnStoreError, STORE_ERROR_HEADER, ServiceOptions, StoreErrorHeader};

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::admission::{Admission, Overloaded};
use crate::descriptor::{self, RequestError};
use crate::dynamic_metadata;
use crate::headers;
use crate::limiter::{Code, Deciding, RateLimiter, Undecided};
use crate::metrics::Metrics;
use crate::pb;
use crate::storage::{StoreError, guard};
use crate::telemetry;

/// `envoy.service.ratelimit.v3.RateLimitService`.
#[derive(Clone)]
pub struct RlsService {
    limiter: Arc<RateLimiter>,
    options: Arc<ServiceOptions>,
    metrics: Arc<Metrics>,
    admission: Arc<Admission>,
}

impl RlsService {
    pub fn new(limiter: Arc<RateLimiter>, options: ServiceOptions, metrics: Arc<Metrics>) -> Self {
        Self {
            limiter,
            admission: Arc::new(Admission::new(
                options.max_in_flight,
                options.max_queue_time,
            )),
            options: Arc::new(options),
            metrics,
        }
    }

    /// The largest request message, in bytes.
    pub fn max_request_bytes(&self) -> usize {
        self.options.input_limits.max_request_bytes
    }

    /// Validates, decides and encodes one request; shared by gRPC and `POST /json`. A
    /// `deadline` (the client's gRPC timeout) bounds the wait for an admission slot and the
    /// store call; a request still undecided when it passes is not decided.
    pub async fn answer(
        &self,
        request: pb::RateLimitRequest,
        deadline: Option<Deadline>,
    ) -> Result<pb::RateLimitResponse, Error> {
        let _slot = self
            .admission
            .enter(deadline.map(|deadline| deadline.at))
            .await?;
        if deadline.as_ref().is_some_and(Deadline::passed) {
            return Err(Error::DeadlinePassed);
        }
        let options = &*self.options;
        // Dynamic metadata describes the request as sent; kept only when asked for.
        let sent = options.dynamic_metadata.then(|| request.clone());
        let request = descriptor::Request::from_pb(request, &options.input_limits)?;
        let decided = match self.limiter.loaded_rules() {
            Err(undecided) => Err(undecided),
            Ok(rules) => match self.limiter.decide(&rules, &request) {
                Deciding::Made(decided) => decided,
                Deciding::Waiting(decision) => match deadline {
                    Some(deadline) => {
                        let remaining = deadline.remaining();
                        if remaining.is_zero() {
                            return Err(Error::DeadlinePassed);
                        }
                        let decision = guard::for_caller(Some(deadline.at), decision);
                        tokio::time::timeout(remaining, decision)
                            .await
                            .unwrap_or(Err(Undecided::Store(StoreError::Timeout(remaining))))
                    }
                    None => decision.await,
                },
            },
        };
        match decided {
            Ok(decision) => {
                self.metrics
                    .service
                    .count_decision(decision.overall == Code::OverLimit);
                let headers = headers::headers(options.response_headers, &decision);
                let upstream = options
                    .upstream_limit_headers
                    .then(|| headers::limit_state(&decision))
                    .flatten();
                let metadata = sent.map(|sent| dynamic_metadata::build(&sent, &decision));
                let metadata = dynamic_metadata::with_reserved(metadata, &decision);
                let mut response = encode(decision);
                if let Some(values) = upstream {
                    // A name left out keeps its default.
                    let names = &options.upstream_limit_header_names;
                    let named = headers::LEGACY_HEADER_NAMES
                        .iter()
                        .enumerate()
                        .map(|(index, default)| names.get(index).map_or(*default, String::as_str));
                    response
                        .request_headers_to_add
                        .extend(named.zip(values).map(|(name, value)| pb::HeaderValue {
                            key: name.to_owned(),
                            value,
                            ..Default::default()
                        }));
                }
                response.dynamic_metadata = metadata;
                response
                    .response_headers_to_add
                    .extend(headers.into_iter().map(|(key, value)| pb::HeaderValue {
                        key: options.header_name(key).to_owned(),
                        value,
                        ..Default::default()
                    }));
                Ok(response)
            }
            Err(Undecided::Store(error)) => {
                failure::answer(options, &error, request.descriptors.len())
                    .ok_or(Error::Store(error))
            }
            Err(Undecided::NoConfig) => Err(Error::NoConfig),
        }
    }

    /// Validates `request` as a decision would be, then forgets the counters it would count
    /// on (`POST /reset`); how many.
    pub async fn reset(&self, request: pb::RateLimitRequest) -> Result<usize, Error> {
        let request = descriptor::Request::from_pb(request, &self.options.input_limits)?;
        let reset = self.limiter.reset(&request).await?;
        tracing::info!(domain = %request.domain, counters = reset, "counters reset");
        Ok(reset)
    }
}

#[tonic::async_trait]
impl pb::RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        self.handle(&metadata, request).await.map(Response::new)
    }
}

impl RlsService {
    /// One call: decided, counted, traced and logged.
    pub async fn handle(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        request: pb::RateLimitRequest,
    ) -> Result<pb::RateLimitResponse, Status> {
        let deadline = Deadline::of(metadata);
        // The caller's trace context must be set before the span is first entered.
        let span = crate::request_span!(
            "should_rate_limit",
            domain = tracing::field::Empty,
            descriptors = tracing::field::Empty,
            code = tracing::field::Empty,
        );
        if !span.is_disabled() {
            telemetry::continue_trace(&span, metadata);
        }
        span.record("domain", request.domain.as_str());
        span.record("descriptors", request.descriptors.len());
        // One line per decision at debug, built only when someone reads it.
        let shown = tracing::enabled!(tracing::Level::DEBUG).then(|| show_request(&request));
        let started = Instant::now();
        // A span that is off still costs a wrapper and a move of the whole future.
        let answer = if span.is_disabled() {
            self.answer(request, deadline).await
        } else {
            self.answer(request, deadline)
                .instrument(span.clone())
                .await
        }
        .map_err(Status::from);
        self.metrics.service.observe_decision(started.elapsed());
        let code = match &answer {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.metrics.service.count_request(code);
        if let Some(shown) = shown {
            match &answer {
                Ok(response) => {
                    tracing::debug!(request = %shown, outcome = %show_outcome(response), "decision")
                }
                Err(status) => {
                    tracing::debug!(request = %shown, error = %status.message(), "no decision")
                }
            }
        }
        let response = answer?;
        span.record("code", response.overall_code);
        Ok(response)
    }
}

/// `domain [k=v,k=v] [k=v]`: a request as a log line shows it.
fn show_request(request: &pb::RateLimitRequest) -> String {
    let mut out = request.domain.clone();
    for descriptor in &request.descriptors {
        let entries: Vec<String> = descriptor
            .entries
            .iter()
            .map(|entry| format!("{}={}", entry.key, entry.value))
            .collect();
        out.push_str(&format!(" [{}]", entries.join(",")));
    }
    out
}

/// `OVER_LIMIT: OK 4/5, OVER_LIMIT 0/10`: the overall code, then each descriptor's code and
/// remaining/limit (`OK` alone where no limit matched).
fn show_outcome(response: &pb::RateLimitResponse) -> String {
    use pb::rate_limit_response::Code;
    let name = |code: i32| Code::try_from(code).map_or("UNKNOWN", |code| code.as_str_name());
    let statuses: Vec<String> = response
        .statuses
        .iter()
        .map(|status| match &status.current_limit {
            Some(limit) => format!(
                "{} {}/{}",
                name(status.code),
                status.limit_remaining,
                limit.requests_per_unit
            ),
            None => name(status.code).to_owned(),
        })
        .collect();
    format!("{}: {}", name(response.overall_code), statuses.join(", "))
}

/// Why a call failed.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// No rules were ever loaded (`RuleSet::not_loaded`).
    #[error("no rate limit configuration loaded")]
    NoConfig,
    /// The client's deadline (its `grpc-timeout`) passed before the request was decided.
    #[error("the client's deadline passed before the request was decided")]
    DeadlinePassed,
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        match error {
            Error::Request(error) => Status::invalid_argument(error.to_string()),
            Error::Overloaded(error) => Status::resource_exhausted(error.to_string()),
            Error::DeadlinePassed => Status::deadline_exceeded(error.to_string()),
            // The reference's code and words for a server without rules.
            Error::NoConfig => Status::unknown(error.to_string()),
            // UNAVAILABLE, not an OK or a guess: Envoy's `failure_mode_deny` then decides
            // whether traffic passes while the store is down, as the operator configured.
            Error::Store(error) => {
                if let Some(unsaid) = throttle::STORE_FAILURES.may_say() {
                    tracing::warn!(%error, unsaid, "store call failed (said at most once a second; unsaid: the failures since the last line)");
                }
                Status::unavailable("rate limit store unavailable")
            }
        }
    }
}

#[cfg(test)]
mod tests;
