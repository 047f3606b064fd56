//! Load shedding: at most `max_in_flight` decisions at once. A request beyond that waits up
//! to `max_queue_time` for a slot, and no longer than its client's deadline (at most
//! `max_in_flight` requests wait), then is refused with RESOURCE_EXHAUSTED. Beyond capacity,
//! admitted requests keep a bounded latency and the process a bounded memory, instead of
//! every request slowing down together.
//!
//! On gRPC, a request that would be refused at once is refused before it is read
//! (`service::RlsRoute`): such a refusal costs no decoding, no tracing span and no limiter
//! work.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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

    /// A slot, held until the returned permit drops; waited for until `max_queue_time` has
    /// passed or `until` (the client's deadline) comes, whichever is first.
    pub async fn enter(
        self: &Arc<Self>,
        until: Option<Instant>,
    ) -> Result<OwnedSemaphorePermit, Overloaded> {
        match self.try_enter() {
            Some(slot) => Ok(slot),
            None => self.join_queue()?.slot(until).await,
        }
    }

    /// Why a request arriving now would be refused without waiting, if it would: no slot
    /// free and `max_in_flight` requests waiting already.
    pub fn refuses_at_once(&self) -> Option<Overloaded> {
        let full = self.slots.available_permits() == 0
            && self.waiting.load(Ordering::Acquire) >= self.max_in_flight;
        full.then(|| self.overloaded(self.max_queue_time))
    }

    /// A slot at once, if one is free.
    fn try_enter(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    /// A place among the requests waiting for a slot, unless `max_in_flight` wait already.
    fn join_queue(self: &Arc<Self>) -> Result<Queued, Overloaded> {
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(self.overloaded(self.max_queue_time));
        }
        Ok(Queued(Arc::clone(self)))
    }

    fn overloaded(&self, queue_time: Duration) -> Overloaded {
        Overloaded {
            in_flight: self.max_in_flight,
            queue_time,
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
    async fn slot(self, until: Option<Instant>) -> Result<OwnedSemaphorePermit, Overloaded> {
        let admission = &self.0;
        let wait = until.map_or(admission.max_queue_time, |until| {
            until
                .saturating_duration_since(Instant::now())
                .min(admission.max_queue_time)
        });
        let free = Arc::clone(&admission.slots).acquire_owned();
        match tokio::time::timeout(wait, free).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => Err(admission.overloaded(wait)),
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn a_request_that_gives_up_waiting_leaves_its_place_in_the_queue() {
        let admission = Arc::new(Admission::new(1, Duration::from_secs(30)));
        let busy = admission.enter(None).await.unwrap();
        // The one place in the queue, taken by a caller that gives up (a cancelled call).
        let gave_up = tokio::time::timeout(Duration::from_millis(20), admission.enter(None)).await;
        assert!(gave_up.is_err());

        let next = tokio::spawn({
            let admission = Arc::clone(&admission);
            async move { admission.enter(None).await.is_ok() }
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
        assert!(admission.refuses_at_once().is_none());
        let _busy = admission.enter(None).await.unwrap();
        // A slot busy, but room in the queue.
        assert!(admission.refuses_at_once().is_none());
        let waiting = tokio::spawn({
            let admission = Arc::clone(&admission);
            async move { admission.enter(None).await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(admission.refuses_at_once().is_some());
        let refused = admission.enter(None).await.unwrap_err();
        assert_eq!(
            refused.to_string(),
            "overloaded: 1 decisions in flight and no slot within 30s"
        );
        waiting.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_a_slot_no_longer_than_its_deadline() {
        let admission = Arc::new(Admission::new(1, Duration::from_secs(30)));
        let _busy = admission.enter(None).await.unwrap();
        let started = Instant::now();
        let refused = admission
            .enter(Some(started + Duration::from_millis(20)))
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_millis(20));
        assert_eq!(
            refused.to_string(),
            "overloaded: 1 decisions in flight and no slot within 20ms"
        );
        // A deadline already passed waits for nothing.
        let refused = admission.enter(Some(started)).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_millis(20));
        assert_eq!(
            refused.to_string(),
            "overloaded: 1 decisions in flight and no slot within 0ns"
        );
    }
}
