//! Load shedding: at most `max_in_flight` decisions at once. A request beyond that waits up
//! to `max_queue_time` for a slot (and at most `max_in_flight` requests wait), then is refused
//! with RESOURCE_EXHAUSTED. Beyond capacity, admitted requests keep a bounded latency and the
//! process a bounded memory, instead of every request slowing down together.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
