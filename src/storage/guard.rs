//! Failure behaviour around a remote store (docs/design.md "Failure"): every call has a
//! deadline (what remains of its caller's, up to `--store-timeout-max`, else
//! `--store-timeout`), and a circuit breaker fails fast while the store is down instead of making every
//! request wait for its timeout, letting one trial call through now and then to find it back.
//! It also times the calls (`store_duration_seconds`): only remote stores are timed, since timing an
//! in-process call would cost about as much as the call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;

use super::{CounterStore, Hit, StoreError};
use crate::algorithm::Outcome;

/// Consecutive failures that open the breaker, when they span `TRIP_SPAN` at least.
const TRIP_AFTER: u32 = 5;
/// The shortest run of failures that opens the breaker: longer than one stall of the store
/// lasting about its call timeout takes to fail the calls it caught (those in flight, all at
/// once), so that such a blip fails only them and not every call for `OPEN_FOR` after.
const TRIP_SPAN: Duration = Duration::from_millis(250);
/// How long an open breaker fails fast before it lets a trial call through.
const OPEN_FOR: Duration = Duration::from_millis(500);

tokio::task_local! {
    /// When the caller of the request being decided stops waiting for its answer. Set by the
    /// service around a decision (`for_caller`) rather than passed through every store
    /// layer: only this one reads it.
    static CALLER_GIVES_UP: tokio::time::Instant;
}

/// Runs `decision` for a caller that waits until `gives_up`: the store calls it makes may
/// take what remains of that wait (up to the guard's longest).
pub async fn for_caller<F: Future>(
    gives_up: Option<tokio::time::Instant>,
    decision: F,
) -> F::Output {
    match gives_up {
        Some(at) => CALLER_GIVES_UP.scope(at, decision).await,
        None => decision.await,
    }
}

/// How long one store call may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallBounds {
    /// For a caller that said nothing of its wait (`--store-timeout`).
    pub unsaid: Duration,
    /// The longest, whatever the caller waits (`--store-timeout-max`).
    pub longest: Duration,
}

impl CallBounds {
    /// The bound of a call made now: what remains of its caller's wait, up to the longest.
    fn now(&self) -> Duration {
        CALLER_GIVES_UP
            .try_with(|at| at.saturating_duration_since(tokio::time::Instant::now()))
            .map_or(self.unsaid, |remaining| remaining.min(self.longest))
    }
}

pub struct Guarded {
    inner: Arc<dyn CounterStore>,
    bounds: CallBounds,
    breaker: Mutex<Breaker>,
    /// Whether the breaker has recorded a failure since the last success. While it has not
    /// (the normal case), a call neither reads nor writes the breaker: no lock per call.
    troubled: AtomicBool,
    took: Histogram,
}

#[derive(Default)]
struct Breaker {
    failures: u32,
    /// When the first of `failures` came.
    since: Option<Instant>,
    /// Open: calls fail fast until then.
    open_until: Option<Instant>,
}

impl Guarded {
    /// Guards `inner`, observing each call's duration into `took`.
    pub fn new(inner: Arc<dyn CounterStore>, bounds: CallBounds, took: Histogram) -> Self {
        Self {
            inner,
            bounds,
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
            let now = Instant::now();
            breaker.failures = breaker.failures.saturating_add(1);
            let since = *breaker.since.get_or_insert(now);
            if breaker.failures >= TRIP_AFTER && now.duration_since(since) >= TRIP_SPAN {
                breaker.open_until = Some(now + OPEN_FOR);
            }
        }
    }

    async fn within_deadline<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded(self.bounds.now(), call).await
    }

    /// `call`, dropped after `bound`: the store is told, since it never sees that failure.
    async fn bounded<T>(
        &self,
        bound: Duration,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(bound, call).await {
            Ok(result) => result,
            Err(_) => {
                let error = StoreError::Timeout(bound);
                self.inner.gave_up(&error);
                Err(error)
            }
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
        match &result {
            Err(error) if !error.is_store_wide() => {}
            result => self.record(result.is_ok()),
        }
        result
    }

    /// Health probes bypass the breaker: they are how readiness finds the store back.
    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(self.bounds.unsaid, self.inner.ping()).await
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
        /// Fails as a moving slot does instead.
        moving: AtomicBool,
        calls: AtomicU32,
    }

    #[tonic::async_trait]
    impl CounterStore for Flaky {
        async fn apply(&self, _hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.moving.load(Ordering::Relaxed) {
                return Err(StoreError::Moving("ASK 3999 127.0.0.1:7001".into()));
            }
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
        let bounds = CallBounds {
            unsaid: Duration::from_secs(5),
            longest: Duration::from_secs(5),
        };
        let guarded = Guarded::new(store, bounds, took.clone());
        (inner, guarded, took)
    }

    /// A store whose calls take `delay`, remembering the bounds it was told it missed.
    #[derive(Default)]
    struct Slow {
        delay: Duration,
        missed: Mutex<Vec<u128>>,
    }

    #[tonic::async_trait]
    impl CounterStore for Slow {
        async fn apply(&self, _hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
            tokio::time::sleep(self.delay).await;
            Ok(Vec::new())
        }

        async fn ping(&self) -> Result<(), StoreError> {
            tokio::time::sleep(self.delay).await;
            Ok(())
        }

        fn gave_up(&self, error: &StoreError) {
            if let StoreError::Timeout(bound) = error {
                self.missed.lock().unwrap().push(bound.as_millis());
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_waits_what_remains_of_its_caller_s_wait_up_to_the_longest() {
        let bounds = CallBounds {
            unsaid: Duration::from_millis(50),
            longest: Duration::from_secs(1),
        };
        let store = |delay_ms| {
            let slow = Arc::new(Slow {
                delay: Duration::from_millis(delay_ms),
                ..Slow::default()
            });
            Guarded::new(slow, bounds, Histogram::new([0.001]))
        };
        let within = |wait_ms| Some(tokio::time::Instant::now() + Duration::from_millis(wait_ms));
        let timeout_ms = |result: Result<Vec<Outcome>, StoreError>| match result {
            Err(StoreError::Timeout(bound)) => Some(bound.as_millis()),
            _ => None,
        };
        // No deadline sent: --store-timeout.
        let slow = store(200);
        assert_eq!(timeout_ms(slow.apply(&[]).await), Some(50));
        // A caller waiting 5 s: a 200 ms call is answered.
        let answered = for_caller(within(5_000), slow.apply(&[])).await;
        assert_eq!(answered.map(|outcomes| outcomes.len()).ok(), Some(0));
        // ...but never longer than --store-timeout-max.
        let slower = store(2_000);
        assert_eq!(
            timeout_ms(for_caller(within(5_000), slower.apply(&[])).await),
            Some(1_000)
        );
        // A caller waiting less than --store-timeout: its wait wins.
        assert_eq!(
            timeout_ms(for_caller(within(20), slow.apply(&[])).await),
            Some(20)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_store_is_told_of_every_call_dropped_at_its_bound() {
        let bounds = CallBounds {
            unsaid: Duration::from_millis(50),
            longest: Duration::from_secs(1),
        };
        let slow = Arc::new(Slow {
            delay: Duration::from_millis(200),
            ..Slow::default()
        });
        let guarded = Guarded::new(slow.clone(), bounds, Histogram::new([0.001]));
        assert!(guarded.apply(&[]).await.is_err());
        assert!(guarded.ping().await.is_err());
        let within = Some(tokio::time::Instant::now() + Duration::from_secs(5));
        assert!(for_caller(within, guarded.apply(&[])).await.is_ok());
        assert_eq!(*slow.missed.lock().unwrap(), [50, 50]);
    }

    #[tokio::test]
    async fn a_success_resets_the_failures_and_the_breaker_opens_after_five_in_a_row_over_a_span() {
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
        // Ten failures at once (a stall failing the calls it caught): still closed.
        for _ in 0..TRIP_AFTER * 2 {
            assert!(matches!(call().await, Err(StoreError::Unavailable(_))));
        }
        // Failing still, past the span: the next failure opens it.
        tokio::time::sleep(TRIP_SPAN + Duration::from_millis(20)).await;
        assert!(matches!(call().await, Err(StoreError::Unavailable(_))));
        // Open: the call fails fast without reaching the store, and is not timed.
        assert!(matches!(call().await, Err(StoreError::CircuitOpen)));
        let reached = 1 + (TRIP_AFTER - 1) + 1 + TRIP_AFTER * 2 + 1;
        assert_eq!(inner.calls.load(Ordering::Relaxed), reached);
        assert_eq!(observations(&took), u64::from(reached));
    }

    #[tokio::test]
    async fn a_moving_slot_never_opens_the_breaker_nor_closes_it() {
        let (inner, guarded, _) = guarded();
        inner.moving.store(true, Ordering::Relaxed);
        for _ in 0..TRIP_AFTER * 4 {
            assert!(matches!(
                guarded.apply(&[]).await,
                Err(StoreError::Moving(_))
            ));
        }
        inner.moving.store(false, Ordering::Relaxed);
        assert!(
            guarded.apply(&[]).await.is_ok(),
            "the breaker stayed closed"
        );
        // Four failures, a moving slot in between: the fifth, past the span, still opens it.
        inner.failing.store(true, Ordering::Relaxed);
        for _ in 0..TRIP_AFTER - 1 {
            assert!(guarded.apply(&[]).await.is_err());
        }
        inner.moving.store(true, Ordering::Relaxed);
        assert!(matches!(
            guarded.apply(&[]).await,
            Err(StoreError::Moving(_))
        ));
        inner.moving.store(false, Ordering::Relaxed);
        tokio::time::sleep(TRIP_SPAN + Duration::from_millis(20)).await;
        assert!(matches!(
            guarded.apply(&[]).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            guarded.apply(&[]).await,
            Err(StoreError::CircuitOpen)
        ));
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
