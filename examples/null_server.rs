//! The floor of the gRPC path: an RLS v3 server whose handler answers OK to every descriptor
//! without looking at it, on tollgate's runtime and transport settings. Benchmarks run it
//! beside `tollgate serve` so that tollgate's cost is read against what any tonic server pays.
//!
//! `cargo run --release --example null_server -- 127.0.0.1:8091 [--per-core]`
//!
//! `--per-core` serves on one current-thread runtime per core instead, connections dealt out
//! in turn, as `tollgate serve --runtime per-core` does (src/runtime.rs).

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate::pb::{self, RateLimitServiceServer, rate_limit_response as rls};
use tollgate::runtime::{self, Flavor};
use tonic::{Request, Response, Status};

/// mimalloc instead of the system allocator (see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct NullHandler;

#[tonic::async_trait]
impl pb::RateLimitService for NullHandler {
    async fn should_rate_limit(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        let descriptors = request.get_ref().descriptors.len();
        Ok(Response::new(pb::RateLimitResponse {
            overall_code: rls::Code::Ok as i32,
            statuses: (0..descriptors)
                .map(|_| rls::DescriptorStatus {
                    code: rls::Code::Ok as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }))
    }
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
        let router = tollgate::server::grpc_server(
            tollgate::intake::IntakeOptions::default().grpc_max_streams,
        )
        .add_service(RateLimitServiceServer::new(NullHandler));
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
