//! Requests as they arrive on gRPC streams, before they are decoded: each must arrive whole
//! within a deadline, and what requests still arriving hold is bounded for the whole process,
//! so that no client, however it paces its bytes, makes tollgate hold more than the bounds.
//!
//! A request that has arrived whole by the time its stream is served (as Envoy and every gRPC
//! client send one: headers and message in one write) is read at once and touches no bound.
//! One still arriving waits on its client, as does an answer its client has not taken yet,
//! and counts toward `--grpc-max-requests-waiting`: past it, the connection with the most
//! waiting is closed with all of them (`inbound::Conduct`), so a client that opens streams and
//! sends slowly, or never, or never reads, loses its connection while clients that send whole
//! requests and read their answers keep theirs. The room for its message, once its prefix says how
//! long it is, is charged to `--grpc-max-bytes-reading`; while the budget has no room it is
//! not read, so its client's flow-control window stays shut. One not whole within
//! `--grpc-request-timeout` ends with DEADLINE_EXCEEDED. A stream of messages (RLQS) is held
//! to the same, message by message.
//!
//! `unary.rs` reads a unary call's message; `metered.rs` meters a stream of messages.

pub mod metered;
pub mod unary;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use crate::clock::positive_duration;
use crate::inbound::conduct::{self, Conduct};

/// The gRPC message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// How requests may arrive: flags of `tollgate serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Responses and load shedding")]
pub struct IntakeOptions {
    /// A request must arrive whole within this long (an RLS call from its start, an RLQS
    /// report from its first byte); past it the call ends with DEADLINE_EXCEEDED.
    #[arg(long, env = "TOLLGATE_GRPC_REQUEST_TIMEOUT", default_value = "5s", value_parser = positive_duration)]
    pub grpc_request_timeout: Duration,

    /// Most requests waiting on their clients at once, across connections: still arriving,
    /// or answered and not yet taken (a client that does not read); past it the connection
    /// with the most is closed, with all it holds.
    #[arg(
        long,
        env = "TOLLGATE_GRPC_MAX_REQUESTS_WAITING",
        default_value_t = 4_096
    )]
    pub grpc_max_requests_waiting: usize,

    /// Most bytes held by requests still arriving, across connections (a message counts in
    /// full once its prefix gives its length); a request without room waits, unread, and one
    /// larger than the whole budget is refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "TOLLGATE_GRPC_MAX_BYTES_READING", default_value_t = 64 * 1024 * 1024)]
    pub grpc_max_bytes_reading: usize,

    /// Streams a client may have open on one gRPC connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS);
    /// a client wanting more waits on its side, or opens another connection. The default is
    /// what an Envoy with its default circuit breaker (1,024 requests) can send on a new
    /// connection before it has read this setting.
    #[arg(long, env = "TOLLGATE_GRPC_MAX_STREAMS", default_value_t = 1_024)]
    pub grpc_max_streams: u32,
}

impl Default for IntakeOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

/// The bounds shared by every request of the process.
#[derive(Debug)]
pub struct Intake {
    /// Requests waiting on their clients, and how many may.
    waiting: Arc<AtomicUsize>,
    max_waiting: usize,
    bytes: Arc<Semaphore>,
    /// The budget's size: a request larger than it is refused rather than left waiting.
    budget: usize,
    timeout: Duration,
}

/// Why a request was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("request not received whole within {0:?} (--grpc-request-timeout)")]
    TooSlow(Duration),
    /// Past `--grpc-max-requests-waiting` on a connection that cannot be told apart (a Unix
    /// socket's).
    #[error("too many requests waiting on their clients (--grpc-max-requests-waiting)")]
    Waiting,
    #[error("more bytes than requests still arriving may hold (--grpc-max-bytes-reading)")]
    Bytes,
    #[error("message of {found} bytes is over the limit of {limit} (--max-request-bytes)")]
    TooLarge { found: usize, limit: usize },
    #[error("compressed messages are not accepted")]
    Compressed,
    #[error("a unary call carries exactly one message")]
    NotOneMessage,
    #[error("the request stream failed: {0}")]
    Broken(String),
}

impl Refusal {
    /// The metric label of this refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::TooSlow(_) => "timeout",
            Refusal::Waiting => "waiting",
            Refusal::Bytes => "bytes",
            Refusal::TooLarge { .. } => "too_large",
            Refusal::Compressed | Refusal::NotOneMessage => "framing",
            Refusal::Broken(_) => "broken",
        }
    }
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        let message = refusal.to_string();
        match refusal {
            Refusal::TooSlow(_) => Status::deadline_exceeded(message),
            Refusal::Waiting | Refusal::Bytes => Status::resource_exhausted(message),
            // gRPC's code for a message over the receiver's limit.
            Refusal::TooLarge { .. } => Status::out_of_range(message),
            Refusal::Compressed => Status::unimplemented(message),
            Refusal::NotOneMessage => Status::invalid_argument(message),
            Refusal::Broken(_) => Status::cancelled(message),
        }
    }
}

impl Intake {
    pub fn new(options: &IntakeOptions) -> Self {
        let permits = |n: usize| Arc::new(Semaphore::new(n.clamp(1, Semaphore::MAX_PERMITS)));
        Self {
            waiting: Arc::new(AtomicUsize::new(0)),
            max_waiting: options.grpc_max_requests_waiting,
            bytes: permits(options.grpc_max_bytes_reading),
            budget: options
                .grpc_max_bytes_reading
                .clamp(1, Semaphore::MAX_PERMITS),
            timeout: options.grpc_request_timeout,
        }
    }

    /// Counts a request as waiting on its client (on `conduct`'s connection, when it can be
    /// told apart) until the guard drops. Past the bound the connection with the most waiting
    /// goes, with all it holds: a client that sends whole requests and reads its answers has
    /// next to none; where connections cannot be told apart, the request is refused.
    pub fn waiting(&self, conduct: Option<&Conduct>) -> Result<Waiting, Refusal> {
        let guard = Waiting {
            _here: conduct.map(Conduct::waiting),
            _all: Counted::new(&self.waiting),
        };
        if self.waiting.load(Ordering::Relaxed) > self.max_waiting {
            match conduct {
                Some(conduct) => conduct.close_worst_of_listener(),
                None => return Err(Refusal::Waiting),
            }
        }
        Ok(guard)
    }
}

/// A request waiting on its client, counted on its connection and in the process.
pub struct Waiting {
    _here: Option<conduct::Waiting>,
    _all: Counted,
}

/// One more in a count, until dropped.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(count))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Permits of the bytes budget, held for what a request holds so far.
#[derive(Default)]
struct Charge(Option<OwnedSemaphorePermit>);

impl Charge {
    /// Permits missing to hold `held` bytes in all, if any.
    fn missing(&self, held: usize) -> Result<Option<u32>, Refusal> {
        let charged = self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        match held.checked_sub(charged).filter(|&more| more > 0) {
            Some(more) => u32::try_from(more).map(Some).map_err(|_| Refusal::Bytes),
            None => Ok(None),
        }
    }

    /// Holds permits for `held` bytes in all, taking what is missing.
    fn to(&mut self, budget: &Arc<Semaphore>, held: usize) -> Result<(), Refusal> {
        if let Some(more) = self.missing(held)? {
            let permit = Arc::clone(budget).try_acquire_many_owned(more);
            self.add(permit.map_err(|_| Refusal::Bytes)?);
        }
        Ok(())
    }

    /// Holds permits for `held` bytes in all, waiting for what is missing.
    async fn wait_for(&mut self, budget: &Arc<Semaphore>, held: usize) -> Result<(), Refusal> {
        if let Some(more) = self.missing(held)? {
            let permit = Arc::clone(budget).acquire_many_owned(more).await;
            self.add(permit.map_err(|_| Refusal::Bytes)?);
        }
        Ok(())
    }

    fn add(&mut self, permit: OwnedSemaphorePermit) {
        match &mut self.0 {
            Some(held) => held.merge(permit),
            None => self.0 = Some(permit),
        }
    }

    fn release(&mut self) {
        self.0 = None;
    }
}

/// The length a gRPC message prefix declares, once the prefix is there.
fn declared_length(bytes: &[u8]) -> Option<usize> {
    let prefix: [u8; PREFIX] = bytes.get(..PREFIX)?.try_into().ok()?;
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    usize::try_from(length).ok()
}

#[cfg(test)]
mod tests;
