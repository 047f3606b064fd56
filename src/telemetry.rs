//! Logs and traces. Logs go to stderr as text or JSON (`--log-format`), filtered by
//! `RUST_LOG` when set, else by `--log-level`. Traces: `tracing` spans for the request
//! (`should_rate_limit`), the decision (`decide`) and the store call (`store`), exported with
//! OpenTelemetry OTLP/gRPC when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, named by `OTEL_SERVICE_NAME` (default
//! `tollgate`). A W3C `traceparent` in the gRPC metadata makes the request's span a child of
//! the caller's (Envoy's), so traces continue across the hop.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
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

/// Installs the global subscriber. Must run inside the tokio runtime when traces are
/// exported (the OTLP exporter is a tonic client).
pub fn init(log_level: &str, format: LogFormat) -> Result<Telemetry, TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(directives)?,
        _ => EnvFilter::try_new(log_level)?,
    };
    let exporting = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    let provider = if exporting {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()?;
        Some(provider(exporter))
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
    let resource = if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        Resource::builder().build()
    } else {
        Resource::builder().with_service_name("tollgate").build()
    };
    SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
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
