//! Load shedding: at most `max_in_flight` decisions at once. A request beyond that waits up
//! to `max_queue_time` for a slot (and at most `max_in_flight` requests wait), then is refused
//! with RESOURCE_EXHAUSTED. Beyond capacity, admitted requests keep a bounded latency and the
//! process a bounded memory, instead of every request slowing down together.
//!
//! On gRPC, admission comes before the request is read ([`Admitted`]): a refusal costs no
//! decoding, no tracing span and no limiter work, so the CPU a saturated process spends on
//! the excess stays small and the admitted throughput holds near capacity.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use crate::metrics::Metrics;

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error)]
#[error("overloaded: {in_flight} decisions in flight and no slot within {queue_time:?}")]
pub struct Overloaded {
    in_flight: usize,
    queue_time: Duration,
}

#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    max_in_flight: usize,
    max_queue_time: Duration,
    waiting: AtomicUsize,
}

impl Admission {
    pub fn new(max_in_flight: usize, max_queue_time: Duration) -> Self {
        let max_in_flight = max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            max_queue_time,
            waiting: AtomicUsize::new(0),
        }
    }

    /// A slot, held until the returned permit drops.
    pub async fn enter(&self) -> Result<OwnedSemaphorePermit, Overloaded> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(permit);
        }
        let overloaded = || Overloaded {
            in_flight: self.max_in_flight,
            queue_time: self.max_queue_time,
        };
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(overloaded());
        }
        let waited =
            tokio::time::timeout(self.max_queue_time, Arc::clone(&self.slots).acquire_owned())
                .await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match waited {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(overloaded()),
        }
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(4_096, Duration::from_millis(50))
    }
}

/// A gRPC service whose every call takes an admission slot before the service sees it, and
/// holds it until the service has answered; a call without a slot is answered
/// RESOURCE_EXHAUSTED at once, its body never read.
#[derive(Clone)]
pub struct Admitted<S> {
    inner: S,
    admission: Arc<Admission>,
    metrics: Arc<Metrics>,
}

impl<S> Admitted<S> {
    pub fn new(inner: S, admission: Arc<Admission>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            admission,
            metrics,
        }
    }
}

impl<S> Service<http::Request<Body>> for Admitted<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone is ready too (generated gRPC services always are); the original stays
        // with the connection for the next call.
        let mut inner = self.inner.clone();
        let admission = Arc::clone(&self.admission);
        let metrics = Arc::clone(&self.metrics);
        Box::pin(async move {
            let arrived = Instant::now();
            match admission.enter().await {
                Ok(_slot) => inner.call(request).await,
                Err(overloaded) => {
                    metrics.observe_decision(arrived.elapsed());
                    metrics.count_request(tonic::Code::ResourceExhausted);
                    Ok(tonic::Status::resource_exhausted(overloaded.to_string()).into_http())
                }
            }
        })
    }
}

impl<S: NamedService> NamedService for Admitted<S> {
    const NAME: &'static str = S::NAME;
}
