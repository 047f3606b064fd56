//! The floor of the gRPC path: an RLS v3 server whose handler answers every descriptor OK
//! with the fields tollgate answers (its limit, what remains, when it resets) without
//! deciding anything, served as tollgate serves RLS: the same route, intake, connection
//! bounds, runtime and allocator. Benchmarks run it beside `tollgate serve`, so that what
//! they read is the decision's own cost, not the transport's or the encoding's.
//!
//! `cargo run --release --example null_server -- 127.0.0.1:8091 [--per-core]`
//!
//! `--per-core` serves on one current-thread runtime per core instead, connections dealt out
//! in turn, as `tollgate serve --runtime per-core` does (src/runtime.rs).

use std::net::SocketAddr;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate::intake::{Intake, IntakeOptions};
use tollgate::pb::{self, rate_limit_response as rls};
use tollgate::runtime::{self, Flavor};
use tollgate::service::route::{Handler, RlsRoute};
use tonic::Status;
use tonic::metadata::MetadataMap;

/// mimalloc instead of the system allocator (see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone)]
struct NullHandler;

impl Handler for NullHandler {
    async fn handle(
        &self,
        _: &MetadataMap,
        request: pb::RateLimitRequest,
    ) -> Result<pb::RateLimitResponse, Status> {
        // The benchmarks' rule (1,000 a second), as a decision early in its window answers.
        let status = rls::DescriptorStatus {
            code: rls::Code::Ok as i32,
            current_limit: Some(rls::RateLimit {
                requests_per_unit: 1000,
                unit: rls::rate_limit::Unit::Second as i32,
                ..Default::default()
            }),
            limit_remaining: 999,
            duration_until_reset: Some(prost_types::Duration {
                seconds: 0,
                nanos: 999_000_000,
            }),
            ..Default::default()
        };
        Ok(pb::RateLimitResponse {
            overall_code: rls::Code::Ok as i32,
            statuses: vec![status; request.descriptors.len()],
            ..Default::default()
        })
    }

    fn refuses_at_once(&self) -> Option<Status> {
        None
    }

    fn count_intake_refusal(&self, _: &'static str) {}

    fn count_refused(&self, _: tonic::Code) {}
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr: SocketAddr = args
        .iter()
        .find(|arg| !arg.starts_with("--"))
        .map_or("127.0.0.1:8091", String::as_str)
        .parse()?;
    let flavor = if args.iter().any(|arg| arg == "--per-core") {
        Flavor::PerCore
    } else {
        Flavor::MultiThread
    };
    flavor.build()?.block_on(async {
        let listener = TcpListener::bind(addr).await?;
        eprintln!("null handler listening on {addr} ({flavor:?})");
        let intake = IntakeOptions::default();
        let route = RlsRoute::new(
            NullHandler,
            Arc::new(Intake::new(&intake)),
            tollgate::descriptor::InputLimits::DEFAULT.max_request_bytes,
        );
        let router = tollgate::server::grpc_server(intake.grpc_max_streams).add_service(route);
        // Never stopped: the benchmark kills the process.
        let (_stop, stopped) = watch::channel(false);
        match flavor {
            Flavor::MultiThread => {
                router
                    .serve_with_incoming_shutdown(
                        tollgate::server::tcp_incoming(listener),
                        runtime::wait_for(stopped),
                    )
                    .await?
            }
            Flavor::PerCore => {
                let acceptor = tollgate::server::grpc_acceptor(
                    listener,
                    &Default::default(),
                    &Default::default(),
                );
                runtime::serve_grpc(router, acceptor, flavor.grpc_runtimes(), stopped).await?
            }
        }
        Ok(())
    })
}
