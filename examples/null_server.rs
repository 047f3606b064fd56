//! The floor of the gRPC path: an RLS v3 server whose handler answers OK to every descriptor
//! without looking at it, on tollgate's runtime and transport settings. Benchmarks run it
//! beside `tollgate serve` so that tollgate's cost is read against what any tonic server pays.
//!
//! `cargo run --release --example null_server -- 127.0.0.1:8091 [--per-core]`
//!
//! `--per-core` serves on one current-thread runtime per core instead, each accepting on its
//! own `SO_REUSEPORT` listener: the design tollgate's runtime was measured against.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tollgate::pb::{self, RateLimitServiceServer, rate_limit_response as rls};
use tonic::{Request, Response, Status};

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

async fn serve(listener: TcpListener) -> anyhow::Result<()> {
    tollgate::server::grpc_server()
        .add_service(RateLimitServiceServer::new(NullHandler))
        .serve_with_incoming(tollgate::server::tcp_incoming(listener))
        .await?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr: SocketAddr = args
        .iter()
        .find(|arg| !arg.starts_with("--"))
        .map_or("127.0.0.1:8091", String::as_str)
        .parse()?;
    if args.iter().any(|arg| arg == "--per-core") {
        return per_core(addr);
    }
    tollgate::runtime::build()?.block_on(async {
        let listener = TcpListener::bind(addr).await?;
        eprintln!("null handler listening on {addr}");
        serve(listener).await
    })
}

/// One current-thread runtime per core, each with its own listener on the same port.
fn per_core(addr: SocketAddr) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism()?.get();
    eprintln!("null handler listening on {addr}, {cores} current-thread runtimes");
    let threads: Vec<_> = (0..cores)
        .map(|_| {
            std::thread::spawn(move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async {
                    let socket = match addr {
                        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
                    };
                    socket.set_reuseport(true)?;
                    socket.bind(addr)?;
                    serve(socket.listen(1024)?).await
                })
            })
        })
        .collect();
    for thread in threads {
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("a runtime thread panicked"))??;
    }
    Ok(())
}
