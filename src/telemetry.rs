//! Logs and traces. Logs go to stderr as text or JSON (`--log-format`), filtered by
//! `RUST_LOG` when set, else by `--log-level`. Traces: `tracing` spans for the request
//! (`should_rate_limit`), the decision (`decide`) and the store call (`store`), exported with
//! OpenTelemetry OTLP over gRPC or HTTP (`--trace-protocol`) when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, named by `OTEL_SERVICE_NAME` (default
//! `tollgate`). A W3C `traceparent` in the gRPC metadata makes the request's span a child of
//! the caller's (Envoy's), so traces continue across the hop.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// When spans are exported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Traces {
    /// When `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
    #[default]
    Auto,
    /// Always (to the OTLP default, `http://localhost:4317`, unless those variables say).
    On,
    Off,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceProtocol {
    /// OTLP over gRPC (a collector's port 4317).
    #[default]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318, path /v1/traces), plain HTTP.
    Http,
}

/// Trace export settings: flags of `tollgate serve` (the other commands export none).
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct TraceArgs {
    /// Export spans over OTLP/gRPC: `auto` (when `OTEL_EXPORTER_OTLP_ENDPOINT` is set), `on`
    /// or `off`.
    #[arg(long, env = "TOLLGATE_TRACES", value_enum, default_value_t = Traces::Auto, help_heading = "Tracing")]
    pub traces: Traces,

    /// OTLP over `grpc` or `http` (protobuf).
    #[arg(long, env = "TOLLGATE_TRACE_PROTOCOL", value_enum, default_value_t = TraceProtocol::Grpc, help_heading = "Tracing")]
    pub trace_protocol: TraceProtocol,

    /// `service.name` of the spans (default: `OTEL_SERVICE_NAME`, else `tollgate`).
    #[arg(long, env = "TOLLGATE_TRACE_SERVICE_NAME", help_heading = "Tracing")]
    pub trace_service_name: Option<String>,

    /// `service.namespace` of the spans.
    #[arg(
        long,
        env = "TOLLGATE_TRACE_SERVICE_NAMESPACE",
        help_heading = "Tracing"
    )]
    pub trace_service_namespace: Option<String>,

    /// `service.instance.id` of the spans.
    #[arg(
        long,
        env = "TOLLGATE_TRACE_SERVICE_INSTANCE_ID",
        help_heading = "Tracing"
    )]
    pub trace_service_instance_id: Option<String>,

    /// Share of the traces that start here which are recorded (a caller's decision, from its
    /// `traceparent`, is followed).
    #[arg(long, env = "TOLLGATE_TRACE_SAMPLING_RATIO", value_parser = ratio, help_heading = "Tracing")]
    pub trace_sampling_ratio: Option<f64>,
}

/// A number from 0 to 1.
pub fn ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if (0.0..=1.0).contains(&value) => Ok(value),
        Ok(_) => Err("must be between 0 and 1".into()),
        Err(error) => Err(error.to_string()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log filter: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Keeps the trace exporter alive; flushes it when dropped.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// The target of the start-up lines, logged at every level: what runs, where, from what.
pub const STARTUP: &str = "tollgate::startup";

/// The libraries that carry the bytes (HTTP/2 frames, connections): their debug lines would
/// drown tollgate's own, so they speak at debug only when trace is asked for.
const TRANSPORT: [&str; 6] = ["h2", "hyper", "hyper_util", "tower", "tonic", "rustls"];

/// `--log-level` as filter directives: the level for tollgate, the transport libraries one
/// step quieter at debug, and the start-up lines always. A level with its own directives
/// (`info,h2=debug`) is taken as written, plus the start-up lines.
fn directives(log_level: &str) -> String {
    let level = log_level.trim().to_ascii_lowercase();
    let mut out = vec![level.clone()];
    if !level.contains(['=', ',']) {
        let transport = match level.as_str() {
            "trace" => "trace",
            "debug" => "info",
            other => other,
        };
        // h2 warns of what a peer did to it (a flood of reset streams, an unexpected ping):
        // one line per misbehaving connection, thousands a second under an attack, while the
        // connection is closed anyway. Those show at debug.
        let level_of = |target: &str| match (target, level.as_str()) {
            ("h2", "info" | "warn") => "error",
            _ => transport,
        };
        out.extend(TRANSPORT.map(|target| format!("{target}={}", level_of(target))));
    }
    if !matches!(level.as_str(), "info" | "debug" | "trace" | "off") {
        out.push(format!("{STARTUP}=info"));
    }
    out.join(",")
}

/// Installs the global subscriber. Must run inside the tokio runtime when traces are
/// exported (the OTLP exporter is a tonic client).
pub fn init(
    log_level: &str,
    format: LogFormat,
    trace: &TraceArgs,
) -> Result<Telemetry, TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(directives)?,
        _ => EnvFilter::try_new(directives(log_level))?,
    };
    let endpoint_set = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    let exporting = match trace.traces {
        Traces::Auto => endpoint_set,
        Traces::On => true,
        Traces::Off => false,
    };
    let provider = if exporting {
        let builder = opentelemetry_otlp::SpanExporter::builder();
        let exporter = match trace.trace_protocol {
            TraceProtocol::Grpc => builder.with_tonic().build()?,
            TraceProtocol::Http => {
                use opentelemetry_otlp::WithExportConfig as _;
                builder
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .build()?
            }
        };
        Some(configured_provider(exporter, trace))
    } else {
        None
    };
    let traces = provider.as_ref().map(layer);
    // Colour only for a person at a terminal: a log collector would store the escape codes.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let text = (format == LogFormat::Text).then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(colour)
            .with_writer(std::io::stderr)
    });
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
    });
    // A second init (tests) keeps the first subscriber; that is fine.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(traces)
        .try_init();
    Ok(Telemetry { provider })
}

/// A tracer provider exporting through `exporter` in batches, named by `OTEL_SERVICE_NAME`
/// or `tollgate`.
pub fn provider(
    exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static,
) -> SdkTracerProvider {
    configured_provider(exporter, &TraceArgs::default())
}

/// A tracer provider exporting through `exporter` in batches, as `trace` says. Must be called
/// inside the tokio runtime, which then runs the exports.
pub fn configured_provider(
    exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static,
    trace: &TraceArgs,
) -> SdkTracerProvider {
    let mut resource = Resource::builder();
    match &trace.trace_service_name {
        Some(name) => resource = resource.with_service_name(name.clone()),
        None if std::env::var_os("OTEL_SERVICE_NAME").is_none() => {
            resource = resource.with_service_name("tollgate");
        }
        None => {}
    }
    let attributes = [
        ("service.namespace", &trace.trace_service_namespace),
        ("service.instance.id", &trace.trace_service_instance_id),
    ];
    for (key, value) in attributes {
        if let Some(value) = value {
            resource = resource.with_attribute(KeyValue::new(key, value.clone()));
        }
    }
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
        trace.trace_sampling_ratio.unwrap_or(1.0),
    )));
    // Exports run on the tokio runtime, not on a thread of their own: the HTTP exporter's
    // client needs a runtime to connect from.
    let batches =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    SdkTracerProvider::builder()
        .with_span_processor(batches)
        .with_resource(resource.build())
        .with_sampler(sampler)
        .build()
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of `provider`. Building it
/// turns on the request spans (see `traced`).
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    TRACED.store(true, Ordering::Relaxed);
    tracing_opentelemetry::layer().with_tracer(provider.tracer("tollgate"))
}

static TRACED: AtomicBool = AtomicBool::new(false);

/// Whether request spans go anywhere. Only traces use them: log lines carry their own
/// fields. Without an exporter the spans are not made at all, because at the default log
/// level the log layer would otherwise build and format three spans per request (about a
/// tenth of a decision's CPU, docs/performance.md).
pub fn traced() -> bool {
    TRACED.load(Ordering::Relaxed)
}

/// An `info` span when traces are exported, else the disabled span (free to enter).
#[macro_export]
macro_rules! request_span {
    ($($span:tt)*) => {
        if $crate::telemetry::traced() {
            tracing::info_span!($($span)*)
        } else {
            tracing::Span::none()
        }
    };
}

/// Makes `span` a child of the W3C trace context (`traceparent`, `tracestate`) in `metadata`,
/// if there is a valid one.
pub fn continue_trace(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    let context = TraceContextPropagator::new().extract(&Metadata(metadata));
    let _ = span.set_parent(context);
}

struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_libraries_speak_a_step_quieter_and_h2_only_of_errors_at_info() {
        assert_eq!(
            directives("info"),
            "info,h2=error,hyper=info,hyper_util=info,tower=info,tonic=info,rustls=info"
        );
        assert_eq!(
            directives("debug"),
            "debug,h2=info,hyper=info,hyper_util=info,tower=info,tonic=info,rustls=info"
        );
        assert!(directives("warn").starts_with("warn,h2=error,hyper=warn,"));
        assert_eq!(
            directives("info,h2=debug"),
            "info,h2=debug,tollgate::startup=info"
        );
    }
}
