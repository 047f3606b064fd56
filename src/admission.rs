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
    pub async fn enter(self: &Arc<Self>) -> Result<OwnedSemaphorePermit, Overloaded> {
        match self.try_enter() {
            Some(slot) => Ok(slot),
            None => self.join_queue()?.slot().await,
        }
    }

    /// A slot at once, if one is free.
    fn try_enter(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    /// A place among the requests waiting for a slot, unless `max_in_flight` wait already.
    fn join_queue(self: &Arc<Self>) -> Result<Queued, Overloaded> {
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(self.overloaded());
        }
        Ok(Queued(Arc::clone(self)))
    }

    fn overloaded(&self) -> Overloaded {
        Overloaded {
            in_flight: self.max_in_flight,
            queue_time: self.max_queue_time,
        }
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(4_096, Duration::from_millis(50))
    }
}

/// A request waiting for a slot. It stops counting as waiting when dropped, whether it got a
/// slot, timed out, or its caller gave up (a call the client cancelled): a count left behind
/// would refuse a request for good.
struct Queued(Arc<Admission>);

impl Queued {
    async fn slot(self) -> Result<OwnedSemaphorePermit, Overloaded> {
        let admission = &self.0;
        let free = Arc::clone(&admission.slots).acquire_owned();
        match tokio::time::timeout(admission.max_queue_time, free).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => Err(admission.overloaded()),
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A gRPC service whose every call takes an admission slot before the service sees it, and
/// holds it until the service has answered; a call without a slot is answered
/// RESOURCE_EXHAUSTED, its body never read. It also times every call for the decision
/// histogram, the wait for a slot included.
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

type Answer = Result<http::Response<Body>, Infallible>;

/// The RESOURCE_EXHAUSTED answer, counted.
fn refusal(metrics: &Metrics, overloaded: &Overloaded, waited: Duration) -> Answer {
    metrics.observe_decision(waited);
    metrics.count_request(tonic::Code::ResourceExhausted);
    Ok(tonic::Status::resource_exhausted(overloaded.to_string()).into_http())
}

impl<S> Service<http::Request<Body>> for Admitted<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Unpin + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = AdmittedFuture<S::Future>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let started = Instant::now();
        let metrics = Arc::clone(&self.metrics);
        // Nearly every call: a slot is free, and nothing is allocated for admission.
        if let Some(slot) = self.admission.try_enter() {
            return AdmittedFuture::Admitted {
                answer: self.inner.call(request),
                slot,
                started,
                metrics,
            };
        }
        let queued = match self.admission.join_queue() {
            Ok(queued) => queued,
            Err(overloaded) => {
                return AdmittedFuture::Refused(Some(refusal(
                    &metrics,
                    &overloaded,
                    Duration::ZERO,
                )));
            }
        };
        // The clone is ready too (generated gRPC services always are); the original stays
        // with the connection for the next call.
        let mut inner = self.inner.clone();
        AdmittedFuture::Queued(Box::pin(async move {
            match queued.slot().await {
                Ok(_slot) => {
                    let answer = inner.call(request).await;
                    metrics.observe_decision(started.elapsed());
                    answer
                }
                Err(overloaded) => refusal(&metrics, &overloaded, started.elapsed()),
            }
        }))
    }
}

/// The answer to an admitted call.
pub enum AdmittedFuture<F> {
    /// Admitted at once: the service's answer, its slot held until then.
    Admitted {
        answer: F,
        slot: OwnedSemaphorePermit,
        started: Instant,
        metrics: Arc<Metrics>,
    },
    /// Waiting for a slot (only when every slot is busy).
    Queued(Pin<Box<dyn Future<Output = Answer> + Send>>),
    /// Refused at once; taken when polled.
    Refused(Option<Answer>),
}

impl<F: Future<Output = Answer> + Unpin> Future for AdmittedFuture<F> {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Answer> {
        match self.get_mut() {
            AdmittedFuture::Admitted {
                answer,
                slot: _,
                started,
                metrics,
            } => {
                let answer = std::task::ready!(Pin::new(answer).poll(context));
                metrics.observe_decision(started.elapsed());
                Poll::Ready(answer)
            }
            AdmittedFuture::Queued(queued) => queued.as_mut().poll(context),
            AdmittedFuture::Refused(answer) => Poll::Ready(
                answer
                    .take()
                    .unwrap_or_else(|| Ok(http::Response::default())),
            ),
        }
    }
}

impl<S: NamedService> NamedService for Admitted<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn a_request_that_gives_up_waiting_leaves_its_place_in_the_queue() {
        let admission = Arc::new(Admission::new(1, Duration::from_secs(30)));
        let busy = admission.enter().await.unwrap();
        // The one place in the queue, taken by a caller that gives up (a cancelled call).
        let gave_up = tokio::time::timeout(Duration::from_millis(20), admission.enter()).await;
        assert!(gave_up.is_err());

        let next = tokio::spawn({
            let admission = Arc::clone(&admission);
            async move { admission.enter().await.is_ok() }
        });
        // Long enough for `next` to find no free slot and queue (or, were the place still
        // counted as taken, be refused).
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(busy);
        assert!(
            next.await.unwrap(),
            "refused: the queue place was never given back"
        );
    }

    #[tokio::test]
    async fn beyond_max_in_flight_waiting_a_request_is_refused_at_once() {
        let admission = Arc::new(Admission::new(1, Duration::from_secs(30)));
        let _busy = admission.enter().await.unwrap();
        let waiting = tokio::spawn({
            let admission = Arc::clone(&admission);
            async move { admission.enter().await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let refused = admission.enter().await.unwrap_err();
        assert_eq!(
            refused.to_string(),
            "overloaded: 1 decisions in flight and no slot within 30s"
        );
        waiting.abort();
    }
}
