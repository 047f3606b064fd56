//! The gRPC face of the limiter: protobuf ↔ domain types, and the one mapping from errors to
//! `tonic::Status`. Nothing else happens here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::BoolishValueParser;
use tonic::codegen::http;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::admission::{Admission, Admitted, Overloaded};
use crate::clock::{Micros, whole_seconds_up};
use crate::descriptor::{self, InputLimits, RequestError};
use crate::dynamic_metadata;
use crate::headers::{self, HeaderMode, LEGACY_HEADER_NAMES};
use crate::limit::Unit;
use crate::limiter::{Code, Decision, DescriptorStatus, RateLimiter};
use crate::metrics::Metrics;
use crate::pb::{self, rate_limit_response as rls};
use crate::storage::StoreError;
use crate::telemetry;

/// What a request gets when the store fails (`--on-store-error`, docs/design.md "Failure").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnStoreError {
    /// gRPC UNAVAILABLE: Envoy's `failure_mode_deny` decides.
    #[default]
    Unavailable,
    /// OK for every descriptor, marked with the `x-tollgate-store-error` header
    /// (`--store-error-header`).
    Allow,
    /// OVER_LIMIT for every descriptor, marked likewise.
    Deny,
}

/// The header that marks an answer given without the store.
pub const STORE_ERROR_HEADER: &str = "x-tollgate-store-error";

/// Where Envoy puts the `x-tollgate-store-error` marker (`--store-error-header`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreErrorHeader {
    /// On the request Envoy forwards upstream (`request_headers_to_add`): the service behind
    /// Envoy sees it, the end user does not.
    #[default]
    Upstream,
    /// On the response to the client (`response_headers_to_add`), end users included.
    Response,
    /// Nowhere (the `tollgate_store_errors_total` metric still counts).
    Off,
}

/// How the service answers. Each field is a flag of `tollgate serve` (the struct is flattened
/// into its arguments), so a new response option is one field here and its use below.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ServiceOptions {
    #[command(flatten, next_help_heading = "Input bounds")]
    pub input_limits: InputLimits,

    /// What a request gets when the store fails: UNAVAILABLE (Envoy's failure_mode_deny
    /// decides), OK, or OVER_LIMIT.
    #[arg(long, env = "TOLLGATE_ON_STORE_ERROR", value_enum, default_value_t = OnStoreError::Unavailable, help_heading = "Responses and load shedding")]
    pub on_store_error: OnStoreError,

    /// Rate-limit headers to add to every response with a limit: `off`, `draft03`
    /// (X-RateLimit-*, as Envoy's own), `ietf` (RateLimit-Policy and RateLimit) or `legacy`
    /// (RateLimit-Limit/Remaining/Reset); `Retry-After` on OVER_LIMIT.
    #[arg(long, env = "TOLLGATE_RESPONSE_HEADERS", value_enum, default_value_t = HeaderMode::Off, help_heading = "Responses and load shedding")]
    pub response_headers: HeaderMode,

    /// The names of the `legacy` headers, in the order limit, remaining, reset, separated by
    /// `,` (the reference's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
    /// LIMIT_RESET_HEADER); a name left out keeps its default.
    #[arg(long, env = "TOLLGATE_LEGACY_HEADER_NAMES", value_delimiter = ',', value_parser = header_name, default_values_t = LEGACY_HEADER_NAMES.map(String::from), help_heading = "Responses and load shedding")]
    pub legacy_header_names: Vec<String>,

    /// Where the `x-tollgate-store-error` header marking an answer given without the store
    /// goes: `upstream` (to the service behind Envoy only), `response` (to the client too) or
    /// `off`.
    #[arg(long, env = "TOLLGATE_STORE_ERROR_HEADER", value_enum, default_value_t = StoreErrorHeader::Upstream, help_heading = "Responses and load shedding")]
    pub store_error_header: StoreErrorHeader,

    /// Add dynamic metadata to responses (domain, descriptors, hits_addend and the matched
    /// rules' `metadata`), as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA.
    #[arg(
        long,
        env = "TOLLGATE_DYNAMIC_METADATA",
        help_heading = "Responses and load shedding",
        value_parser = BoolishValueParser::new()
    )]
    pub dynamic_metadata: bool,

    /// Decisions in flight at once; beyond, a request waits up to --max-queue-time for a slot,
    /// then gets RESOURCE_EXHAUSTED (load shedding).
    #[arg(long, env = "TOLLGATE_MAX_IN_FLIGHT", default_value_t = ServiceOptions::DEFAULT.max_in_flight, help_heading = "Responses and load shedding")]
    pub max_in_flight: usize,

    /// Longest wait for a decision slot when --max-in-flight are busy.
    #[arg(long, env = "TOLLGATE_MAX_QUEUE_TIME", default_value = "50ms", value_parser = humantime::parse_duration, help_heading = "Responses and load shedding")]
    pub max_queue_time: Duration,
}

impl ServiceOptions {
    pub const DEFAULT: ServiceOptions = ServiceOptions {
        input_limits: InputLimits::DEFAULT,
        on_store_error: OnStoreError::Unavailable,
        store_error_header: StoreErrorHeader::Upstream,
        response_headers: HeaderMode::Off,
        // Empty means the default names (`LEGACY_HEADER_NAMES`); a const cannot allocate.
        legacy_header_names: Vec::new(),
        dynamic_metadata: false,
        max_in_flight: 4_096,
        max_queue_time: Duration::from_millis(50),
    };
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            legacy_header_names: LEGACY_HEADER_NAMES.map(String::from).to_vec(),
            ..Self::DEFAULT
        }
    }
}

impl ServiceOptions {
    /// The name a header goes out under: a `legacy` header may be renamed.
    fn header_name<'a>(&'a self, name: &'a str) -> &'a str {
        LEGACY_HEADER_NAMES
            .iter()
            .position(|legacy| *legacy == name)
            .filter(|_| self.response_headers == HeaderMode::Legacy)
            .and_then(|index| self.legacy_header_names.get(index))
            .map_or(name, String::as_str)
    }
}

/// A header name as HTTP allows it (a token: letters, digits and ``!#$%&'*+-.^_`|~``).
fn header_name(text: &str) -> Result<String, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !text.is_empty() && text.chars().all(token) {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?} is not an HTTP header name"))
    }
}

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

    /// The gRPC service: RLS v3 behind `Admitted`, so that a request the queue has no room
    /// for is refused before it is read.
    pub fn grpc(self, max_request_bytes: usize) -> Admitted<pb::RateLimitServiceServer<Self>> {
        let admission = Arc::clone(&self.admission);
        let metrics = Arc::clone(&self.metrics);
        let server =
            pb::RateLimitServiceServer::new(self).max_decoding_message_size(max_request_bytes);
        Admitted::new(server, admission, metrics)
    }

    /// Validates, decides and encodes one request; shared by gRPC and `POST /json`. A
    /// `deadline` (the client's gRPC timeout) bounds the decision, store call included.
    pub async fn answer(
        &self,
        request: pb::RateLimitRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::RateLimitResponse, Error> {
        let _slot = self.admission.enter().await?;
        let options = &*self.options;
        // Dynamic metadata describes the request as sent; kept only when asked for.
        let sent = options.dynamic_metadata.then(|| request.clone());
        let request = descriptor::Request::from_pb(request, &options.input_limits)?;
        let decision = self.limiter.should_rate_limit(&request);
        let decided = match deadline {
            Some(deadline) => tokio::time::timeout(deadline, decision)
                .await
                .unwrap_or(Err(StoreError::Timeout(deadline))),
            None => decision.await,
        };
        match decided {
            Ok(decision) => {
                self.metrics
                    .count_decision(decision.overall == Code::OverLimit);
                let headers = headers::headers(options.response_headers, &decision);
                let metadata = sent.map(|sent| dynamic_metadata::build(&sent, &decision));
                let mut response = encode(decision);
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
            Err(error) => self.without_store(error, request.descriptors.len()),
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

    /// The answer when the store failed, per `--on-store-error`.
    fn without_store(
        &self,
        error: StoreError,
        descriptors: usize,
    ) -> Result<pb::RateLimitResponse, Error> {
        let code = match self.options.on_store_error {
            OnStoreError::Unavailable => return Err(Error::Store(error)),
            OnStoreError::Allow => rls::Code::Ok,
            OnStoreError::Deny => rls::Code::OverLimit,
        };
        let policy = self.options.on_store_error;
        tracing::warn!(%error, ?policy, "store call failed; answering by policy");
        let mut response = pb::RateLimitResponse {
            overall_code: code as i32,
            statuses: (0..descriptors)
                .map(|_| rls::DescriptorStatus {
                    code: code as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let marker = pb::HeaderValue {
            key: STORE_ERROR_HEADER.into(),
            value: format!("{policy:?}").to_lowercase(),
            ..Default::default()
        };
        match self.options.store_error_header {
            StoreErrorHeader::Upstream => response.request_headers_to_add.push(marker),
            StoreErrorHeader::Response => response.response_headers_to_add.push(marker),
            StoreErrorHeader::Off => {}
        }
        Ok(response)
    }
}

/// The header a gRPC client's deadline comes in, by a name parsed once rather than per call.
const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// The `grpc-timeout` a client sent (`<digits><unit>`, units H M S m u n), if any.
fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let headers: &http::HeaderMap = metadata.as_ref();
    let text = headers.get(&GRPC_TIMEOUT)?.to_str().ok()?;
    let (digits, unit) = text.split_at_checked(text.len().checked_sub(1)?)?;
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[tonic::async_trait]
impl pb::RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        let deadline = grpc_timeout(request.metadata());
        // The caller's trace context must be set before the span is first entered.
        let span = crate::request_span!(
            "should_rate_limit",
            domain = tracing::field::Empty,
            descriptors = tracing::field::Empty,
            code = tracing::field::Empty,
        );
        if !span.is_disabled() {
            telemetry::continue_trace(&span, request.metadata());
        }
        let request = request.into_inner();
        span.record("domain", request.domain.as_str());
        span.record("descriptors", request.descriptors.len());
        let started = Instant::now();
        let answer = self
            .answer(request, deadline)
            .instrument(span.clone())
            .await
            .map_err(Status::from);
        self.metrics.observe_decision(started.elapsed());
        let code = match &answer {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.metrics.count_request(code);
        let response = answer?;
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
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        match error {
            Error::Request(error) => Status::invalid_argument(error.to_string()),
            Error::Overloaded(error) => Status::resource_exhausted(error.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Charge, Outcome};
    use crate::clock::ManualClock;
    use crate::limiter::Modes;
    use crate::pb::RateLimitService as _;
    use crate::storage::memory::MemoryStore;
    use crate::storage::{CounterReset, CounterStore, Hit, Store};
    use arc_swap::ArcSwap;
    use std::path::Path;

    const RULES: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

    struct DownStore;

    #[tonic::async_trait]
    impl CounterStore for DownStore {
        async fn apply(&self, _: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
        async fn ping(&self) -> Result<(), StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
    }

    #[tonic::async_trait]
    impl CounterReset for DownStore {
        async fn forget(&self, _: &[Hit]) -> Result<(), StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
    }

    fn service<S: CounterStore + CounterReset>(store: Arc<S>) -> RlsService {
        service_with(store, ServiceOptions::default())
    }

    fn service_with<S: CounterStore + CounterReset>(
        store: Arc<S>,
        options: ServiceOptions,
    ) -> RlsService {
        let rules = crate::config::file::parse(Path::new("d.yaml"), RULES).unwrap();
        let rules = Arc::new(ArcSwap::from_pointee(crate::rules::RuleSet::new([rules])));
        RlsService::new(
            Arc::new(RateLimiter::new(rules, &Store::local(store), Modes::default())),
            options,
            Arc::new(Metrics::default()),
        )
    }

    #[test]
    fn a_client_deadline_is_read_from_grpc_timeout() {
        let deadline = |value: Option<&str>| {
            let mut metadata = tonic::metadata::MetadataMap::new();
            metadata.insert("x-other", "1".parse().unwrap());
            if let Some(value) = value {
                metadata.insert("grpc-timeout", value.parse().unwrap());
            }
            grpc_timeout(&metadata)
        };
        assert_eq!(deadline(Some("250m")), Some(Duration::from_millis(250)));
        assert_eq!(deadline(Some("2S")), Some(Duration::from_secs(2)));
        assert_eq!(deadline(Some("1H")), Some(Duration::from_secs(3600)));
        assert_eq!(deadline(Some("20u")), Some(Duration::from_micros(20)));
        assert_eq!(deadline(Some("5x")), None);
        assert_eq!(deadline(Some("m")), None);
        assert_eq!(deadline(None), None);
    }

    fn request(value: &str) -> pb::RateLimitRequest {
        pb::RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![pb::RateLimitDescriptor {
                entries: vec![pb::rate_limit_descriptor::Entry {
                    key: "k".into(),
                    value: value.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        }
    }

    #[tokio::test]
    async fn the_handler_answers_with_the_limited_shape() {
        let clock = ManualClock::at_seconds(2222);
        let store = Arc::new(MemoryStore::new(100, Charge::IfAllowed, Arc::new(clock)));
        let svc = service(store);
        let response = svc
            .should_rate_limit(Request::new(request("v")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.overall_code, rls::Code::Ok as i32);
        let status = &response.statuses[0];
        assert_eq!(status.limit_remaining, 1);
        assert_eq!(
            status.duration_until_reset,
            Some(prost_types::Duration {
                seconds: 58,
                nanos: 0
            })
        );
        assert_eq!(
            status
                .current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit)),
            Some((2, 2))
        );
    }

    #[tokio::test]
    async fn the_store_error_marker_goes_upstream_unless_asked_for_on_the_response() {
        let marked = |place: StoreErrorHeader| async move {
            let options = ServiceOptions {
                on_store_error: OnStoreError::Allow,
                store_error_header: place,
                ..ServiceOptions::default()
            };
            let svc = service_with(Arc::new(DownStore), options);
            let response = svc.answer(request("v"), None).await.unwrap();
            let names = |headers: &[pb::HeaderValue]| -> Vec<String> {
                headers
                    .iter()
                    .map(|h| format!("{}: {}", h.key, h.value))
                    .collect()
            };
            (
                names(&response.request_headers_to_add),
                names(&response.response_headers_to_add),
            )
        };
        let marker = vec![format!("{STORE_ERROR_HEADER}: allow")];
        assert_eq!(
            marked(StoreErrorHeader::Upstream).await,
            (marker.clone(), vec![])
        );
        assert_eq!(marked(StoreErrorHeader::Response).await, (vec![], marker));
        assert_eq!(marked(StoreErrorHeader::Off).await, (vec![], vec![]));
    }

    #[tokio::test]
    async fn a_failing_store_is_unavailable_so_envoy_failure_mode_decides() {
        let svc = service(Arc::new(DownStore));
        let status = svc
            .should_rate_limit(Request::new(request("v")))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "rate limit store unavailable");
        // A descriptor that matches nothing never reaches the store.
        let mut unmatched = request("v");
        unmatched.descriptors[0].entries[0].key = "other".into();
        let response = svc
            .should_rate_limit(Request::new(unmatched))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.overall_code, rls::Code::Ok as i32);
    }
}
