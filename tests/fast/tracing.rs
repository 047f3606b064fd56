//! OpenTelemetry: a ShouldRateLimit call carrying a W3C `traceparent` produces spans in that
//! trace (the request, the decision and the store call), exported over OTLP/gRPC to a real
//! receiver running in-process. Uses telemetry.rs's own provider and layer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// A received span: (trace id, span name).
type Received = (Vec<u8>, String);

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push((span.trace_id, span.name));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_from_grpc_metadata_continues_into_exported_spans() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let collector = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .with_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let provider = tollgate::telemetry::provider(exporter);
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("tollgate=info"))
        .with(tollgate::telemetry::layer(&provider))
        .try_init()
        .unwrap();

    let server = start(&[("t.yaml", "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")]).await;
    let mut call = tonic::Request::new(request("t", &[&[("k", "x")]]));
    call.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-00f067aa0ba902b7-01")
            .parse()
            .unwrap(),
    );
    server.client().await.should_rate_limit(call).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    let expected = hex(TRACE_ID);
    loop {
        let flushed = provider.clone();
        tokio::task::spawn_blocking(move || flushed.force_flush())
            .await
            .unwrap()
            .unwrap();
        let names: Vec<String> = receiver
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(trace, _)| *trace == expected)
            .map(|(_, name)| name.clone())
            .collect();
        if ["should_rate_limit", "decide", "store"]
            .iter()
            .all(|n| names.iter().any(|m| m == n))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "spans in the trace: {names:?}; all: {:?}",
            receiver.0.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    collector.abort();
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}
