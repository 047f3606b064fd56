//! How the service answers: `ServiceOptions`, every field a flag of `tollgate serve` (the
//! struct is flattened into its arguments), so a new response option is one field here and
//! its use in the service.

use std::time::Duration;

use clap::builder::BoolishValueParser;

use crate::descriptor::InputLimits;
use crate::headers::{HeaderMode, LEGACY_HEADER_NAMES};

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

/// How the service answers.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ServiceOptions {
    #[command(flatten, next_help_heading = "Input bounds")]
    pub input_limits: InputLimits,

    /// What a request gets when the store fails: UNAVAILABLE (Envoy's failure_mode_deny
    /// decides), OK, or OVER_LIMIT.
    #[arg(long, env = "TOLLGATE_ON_STORE_ERROR", value_enum, default_value_t = OnStoreError::Unavailable, help_heading = "Responses and load shedding")]
    pub on_store_error: OnStoreError,

    /// With `--on-store-error unavailable`, stay ready while the store does not answer
    /// (`/readyz` and `tollgate_store_up` still say so): for deployments that probe liveness
    /// on the readiness endpoint, as Envoy Gateway does, where an outage would otherwise
    /// restart every replica (the reference's REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=false).
    #[arg(long, env = "TOLLGATE_READY_WITHOUT_STORE", value_parser = BoolishValueParser::new(), help_heading = "Responses and load shedding")]
    pub ready_without_store: bool,

    /// Rate-limit headers to add to every response with a limit: `off`, `draft03`
    /// (X-RateLimit-*, as Envoy's own), `ietf` (RateLimit-Policy and RateLimit) or `legacy`
    /// (RateLimit-Limit/Remaining/Reset); `Retry-After` on OVER_LIMIT.
    #[arg(long, env = "TOLLGATE_RESPONSE_HEADERS", value_enum, default_value_t = HeaderMode::Off, help_heading = "Responses and load shedding")]
    pub response_headers: HeaderMode,

    /// The names of the `legacy` headers, in the order limit, remaining, reset, separated by
    /// `,` (the reference's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
    /// LIMIT_RESET_HEADER); a name left out keeps its default.
    #[arg(long, env = "TOLLGATE_LEGACY_HEADER_NAMES", value_delimiter = ',', value_parser = header_name, default_value = "RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset", help_heading = "Responses and load shedding")]
    pub legacy_header_names: Vec<String>,

    /// Tell the service behind Envoy how close the request came to its limit: the limit,
    /// remaining and reset of the descriptor the response headers would describe, in
    /// `request_headers_to_add` (the client does not see them); the reference's
    /// LIMIT_REQUEST_HEADERS_ENABLED.
    #[arg(
        long,
        env = "TOLLGATE_UPSTREAM_LIMIT_HEADERS",
        help_heading = "Responses and load shedding",
        value_parser = BoolishValueParser::new()
    )]
    pub upstream_limit_headers: bool,

    /// The names of those upstream headers, in the order limit, remaining, reset, separated
    /// by `,` (the reference's LIMIT_REQUEST_LIMIT_HEADER, …_REMAINING_HEADER and
    /// …_RESET_HEADER); a name left out keeps its default.
    #[arg(long, env = "TOLLGATE_UPSTREAM_LIMIT_HEADER_NAMES", value_delimiter = ',', value_parser = header_name, default_value = "RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset", help_heading = "Responses and load shedding")]
    pub upstream_limit_header_names: Vec<String>,

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
    #[arg(
        long,
        env = "TOLLGATE_MAX_IN_FLIGHT",
        default_value_t = 4_096,
        help_heading = "Responses and load shedding"
    )]
    pub max_in_flight: usize,

    /// Longest wait for a decision slot when --max-in-flight are busy; never past the
    /// client's gRPC deadline.
    #[arg(long, env = "TOLLGATE_MAX_QUEUE_TIME", default_value = "50ms", value_parser = humantime::parse_duration, help_heading = "Responses and load shedding")]
    pub max_queue_time: Duration,

    /// How requests may arrive: deadlines, and bounds on what requests still arriving hold.
    #[command(flatten)]
    pub intake: crate::intake::IntakeOptions,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

impl ServiceOptions {
    /// The name a header goes out under: a `legacy` header may be renamed.
    pub fn header_name<'a>(&'a self, name: &'a str) -> &'a str {
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
