//! Failure behaviour around a remote store (docs/design.md "Failure"): every call has a
//! deadline, and a circuit breaker fails fast while the store is down instead of making every
//! request wait for its timeout, letting one trial call through now and then to find it back.
//! It also times the calls (`store_duration_seconds`): only remote stores are timed, since timing an
//! in-process call would cost about as much as the call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;

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
    /// Whether the breaker has recorded a failure since the last success. While it has not
    /// (the normal case), a call neither reads nor writes the breaker: no lock per call.
    troubled: AtomicBool,
    took: Histogram,
}

#[derive(Default)]
struct Breaker {
    failures: u32,
    /// Open: calls fail fast until then.
    open_until: Option<Instant>,
}

impl Guarded {
    /// Guards `inner`, observing each call's duration into `took`.
    pub fn new(inner: Arc<dyn CounterStore>, timeout: Duration, took: Histogram) -> Self {
        Self {
            inner,
            timeout,
            breaker: Mutex::new(Breaker::default()),
            troubled: AtomicBool::new(false),
            took,
        }
    }

    /// Whether a call may go to the store now. An open breaker past its time lets this one
    /// call through and stays open for the others until it answers.
    fn admit(&self) -> bool {
        if !self.troubled.load(Ordering::Acquire) {
            return true;
        }
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
        if ok && !self.troubled.load(Ordering::Acquire) {
            return;
        }
        let mut breaker = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
        // Written under the lock, so it always agrees with the breaker it summarises.
        self.troubled.store(!ok, Ordering::Release);
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
        let started = Instant::now();
        let result = self.within_deadline(self.inner.apply(hits)).await;
        self.took.observe(started.elapsed().as_secs_f64());
        self.record(result.is_ok());
        result
    }

    /// Health probes bypass the breaker: they are how readiness finds the store back.
    async fn ping(&self) -> Result<(), StoreError> {
        self.within_deadline(self.inner.ping()).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    /// A store that fails while `failing` is set, counting the calls that reach it.
    #[derive(Default)]
    struct Flaky {
        failing: AtomicBool,
        calls: AtomicU32,
    }

    #[tonic::async_trait]
    impl CounterStore for Flaky {
        async fn apply(&self, _hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.failing.load(Ordering::Relaxed) {
                return Err(StoreError::unavailable("down"));
            }
            Ok(Vec::new())
        }

        async fn ping(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    fn guarded() -> (Arc<Flaky>, Guarded, Histogram) {
        let inner = Arc::new(Flaky::default());
        let took = Histogram::new([0.001]);
        let store: Arc<dyn CounterStore> = inner.clone();
        let guarded = Guarded::new(store, Duration::from_secs(5), took.clone());
        (inner, guarded, took)
    }

    #[tokio::test]
    async fn a_success_resets_the_failures_and_the_breaker_opens_after_five_in_a_row() {
        let (inner, guarded, took) = guarded();
        let call = || guarded.apply(&[]);
        assert!(call().await.is_ok());
        inner.failing.store(true, Ordering::Relaxed);
        for _ in 0..TRIP_AFTER - 1 {
            assert!(matches!(call().await, Err(StoreError::Unavailable(_))));
        }
        inner.failing.store(false, Ordering::Relaxed);
        assert!(call().await.is_ok());
        inner.failing.store(true, Ordering::Relaxed);
        for _ in 0..TRIP_AFTER {
            assert!(matches!(call().await, Err(StoreError::Unavailable(_))));
        }
        // Open: the call fails fast without reaching the store, and is not timed.
        assert!(matches!(call().await, Err(StoreError::CircuitOpen)));
        let reached = 1 + (TRIP_AFTER - 1) + 1 + TRIP_AFTER;
        assert_eq!(inner.calls.load(Ordering::Relaxed), reached);
        assert_eq!(observations(&took), u64::from(reached));
    }

    fn observations(histogram: &Histogram) -> u64 {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("took", "", histogram.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix("took_count "))
            .and_then(|count| count.parse().ok())
            .unwrap()
    }
}
