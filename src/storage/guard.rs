//! Failure behaviour around a remote store (DESIGN §7): every call has a deadline, and a
//! circuit breaker fails fast while the store is down instead of making every request wait
//! for its timeout, letting one trial call through now and then to find it back.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{CounterStore, Hit, StoreError};
use crate::algorithm::Outcome;

/// Consecutive failures that open the breaker.
const TRIP_AFTER: u32 = 5;
/// How long an open breaker fails fast before it lets a trial call through.
const OPEN_FOR: Duration = Duration::from_millis(500);

pub struct Guarded {
    inner: Arc<dyn CounterStore>,
    timeout: Duration,
    breaker: Mutex<Breaker>,
}

#[derive(Default)]
struct Breaker {
    failures: u32,
    /// Open: calls fail fast until then.
    open_until: Option<Instant>,
}

impl Guarded {
    pub fn new(inner: Arc<dyn CounterStore>, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            breaker: Mutex::new(Breaker::default()),
        }
    }

    /// Whether a call may go to the store now. An open breaker past its time lets this one
    /// call through and stays open for the others until it answers.
    fn admit(&self) -> bool {
        let mut breaker = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
        match breaker.open_until {
            Some(until) if Instant::now() < until => false,
            Some(_) => {
                breaker.open_until = Some(Instant::now() + OPEN_FOR);
                true
            }
            None => true,
        }
    }

    fn record(&self, ok: bool) {
        let mut breaker = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
        if ok {
            *breaker = Breaker::default();
        } else {
            breaker.failures = breaker.failures.saturating_add(1);
            if breaker.failures >= TRIP_AFTER {
                breaker.open_until = Some(Instant::now() + OPEN_FOR);
            }
        }
    }

    async fn within_deadline<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

#[tonic::async_trait]
impl CounterStore for Guarded {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        if !self.admit() {
            return Err(StoreError::CircuitOpen);
        }
        let result = self.within_deadline(self.inner.apply(hits)).await;
        self.record(result.is_ok());
        result
    }

    /// Health probes bypass the breaker: they are how readiness finds the store back.
    async fn ping(&self) -> Result<(), StoreError> {
        self.within_deadline(self.inner.ping()).await
    }
}
