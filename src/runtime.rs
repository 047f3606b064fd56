//! The tokio runtimes tollgate serves on, shared with the benchmarks' null-handler server so
//! that both are measured on the same settings.
//!
//! Two flavours (`--runtime`):
//! - `multi-thread`: tokio's work-stealing runtime, one worker per core
//!   (`TOKIO_WORKER_THREADS` overrides it). Every task may run on any core.
//! - `per-core`: one current-thread runtime per core. The main one runs everything else
//!   (admin listener, reloads, probes, the store's background tasks); gRPC connections are
//!   accepted there and dealt out in turn to every runtime, which then serves each connection
//!   alone: its requests never cross cores, so no work-stealing, fewer wake-ups across
//!   threads, and no cache lines bouncing for the connection's state. Dealing in turn, not
//!   `SO_REUSEPORT`, because Envoy opens few long-lived connections and the kernel's hash of
//!   two of them can land both on one core. The cost: a connection cannot move when its core
//!   is busy, so a single busy connection uses one core.
//!
//! docs/performance.md compares the two.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::TcpStream as StdTcpStream;

use futures_util::stream::{self, Stream};
use tokio::net::TcpStream;
use tokio::runtime::{Builder, Runtime};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::transport::server::Router;

use crate::inbound::accept::{Accepted, Acceptor};
use crate::inbound::watched::Inbound;

/// Why serving across runtimes failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("grpc server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("runtime: {0}")]
    Io(#[from] io::Error),
    #[error("runtime: a gRPC runtime thread died")]
    ThreadDied,
}

/// How requests are spread over cores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavor {
    #[default]
    MultiThread,
    PerCore,
}

impl Flavor {
    /// The main runtime: the one `main` blocks on.
    pub fn build(self) -> io::Result<Runtime> {
        match self {
            Flavor::MultiThread => Builder::new_multi_thread().enable_all().build(),
            Flavor::PerCore => Builder::new_current_thread().enable_all().build(),
        }
    }

    /// How many runtimes serve gRPC connections, the main one included.
    pub fn grpc_runtimes(self) -> usize {
        match self {
            Flavor::MultiThread => 1,
            Flavor::PerCore => std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

thread_local! {
    /// Which serving runtime this thread runs: 0 for the main one (and for every thread of a
    /// multi-thread runtime), 1.. for the per-core threads.
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The serving runtime the calling task runs on (see `INDEX`), for state kept per runtime
/// (a Redis connection whose driver runs beside its callers).
pub fn index() -> usize {
    INDEX.get()
}

/// Resolves once `stopped` turns true (or its sender is gone, which also means stop).
pub async fn wait_for(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Serves `router` on `listener` across `runtimes` runtimes (this one and `runtimes - 1`
/// current-thread runtimes on threads of their own) until `stopped`, then lets every
/// runtime drain its connections. Returns when all have.
pub async fn serve_grpc(
    router: Router,
    listener: Acceptor,
    runtimes: usize,
    stopped: watch::Receiver<bool>,
) -> Result<(), RuntimeError> {
    let (senders, mut receivers): (Vec<_>, Vec<_>) = (0..runtimes.max(1))
        .map(|_| mpsc::unbounded_channel())
        .unzip();
    let here = receivers.remove(0);
    let mut others = Vec::with_capacity(receivers.len());
    for (offset, connections) in receivers.into_iter().enumerate() {
        let index = offset + 1;
        others.push(serve_on_thread(
            index,
            router.clone(),
            connections,
            stopped.clone(),
        )?);
    }
    let accepting = deal(listener, senders, stopped.clone());
    let serving_here =
        router.serve_with_incoming_shutdown(incoming(here), wait_for(stopped.clone()));
    let ((), here) = tokio::join!(accepting, serving_here);
    here?;
    for other in others {
        other.await.map_err(|_| RuntimeError::ThreadDied)??;
    }
    Ok(())
}

/// Accepts connections and hands them to the runtimes in turn, until `stopped`; then the
/// senders are dropped, which ends each runtime's incoming stream.
async fn deal(
    mut listener: Acceptor,
    mut runtimes: Vec<mpsc::UnboundedSender<Accepted<StdTcpStream>>>,
    stopped: watch::Receiver<bool>,
) {
    let mut turn = 0;
    while !runtimes.is_empty() {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = wait_for(stopped.clone()) => return,
        };
        match accepted.map(TcpStream::into_std) {
            Ok(mut connection) => {
                // A runtime gone (its thread failed; `serve_grpc` returns its error at the
                // end) gets no more connections: the others take its share.
                while !runtimes.is_empty() {
                    let index = turn % runtimes.len();
                    match runtimes[index].send(connection) {
                        Ok(()) => break,
                        Err(mpsc::error::SendError(back)) => {
                            tracing::error!("a gRPC runtime has stopped; serving on the others");
                            runtimes.remove(index);
                            connection = back;
                        }
                    }
                }
                turn = turn.wrapping_add(1);
            }
            Err(error) => tracing::debug!(%error, "a gRPC connection could not be handed over"),
        }
    }
}

/// The connections dealt to one runtime, registered with that runtime's reactor as they are
/// taken (the stream is polled on the runtime that serves them).
fn incoming(
    connections: mpsc::UnboundedReceiver<Accepted<StdTcpStream>>,
) -> impl Stream<Item = io::Result<Inbound<TcpStream>>> {
    stream::unfold(connections, |mut connections| async move {
        let connection = connections.recv().await?;
        let registered = connection
            .map(TcpStream::from_std)
            .map(Accepted::into_inbound);
        Some((registered, connections))
    })
}

/// A thread running a current-thread runtime that serves the connections it is dealt.
fn serve_on_thread(
    index: usize,
    router: Router,
    connections: mpsc::UnboundedReceiver<Accepted<StdTcpStream>>,
    stopped: watch::Receiver<bool>,
) -> Result<
    impl Future<Output = Result<Result<(), RuntimeError>, oneshot::error::RecvError>>,
    RuntimeError,
> {
    let (done, finished) = oneshot::channel();
    std::thread::Builder::new()
        .name(format!("tollgate-grpc-{index}"))
        .spawn(move || {
            INDEX.set(index);
            let served =
                Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(RuntimeError::Io)
                    .and_then(|runtime| {
                        runtime
                            .block_on(router.serve_with_incoming_shutdown(
                                incoming(connections),
                                wait_for(stopped),
                            ))
                            .map_err(RuntimeError::from)
                    });
            let _ = done.send(served);
        })
        .map_err(RuntimeError::Io)?;
    Ok(finished)
}
