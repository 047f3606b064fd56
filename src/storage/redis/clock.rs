//! Redis's clock as this replica tracks it: the instant a call decides at. Reading `TIME`
//! inside every call cost Redis a third of the cheapest counter's whole cost; instead each
//! replica asks Redis for its time once a second and keeps the offset to its own clock, so
//! that replicas whose clocks disagree still decide by one clock, Redis's (on a cluster, the
//! clock of the primary of a fixed slot, the same for every replica). The estimate is off by
//! at most half the round trip of the sample it came from; a sample slower than
//! `TRUSTED_ROUND_TRIP` is not used.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use std::sync::Weak;

use super::connection::Connection;
use crate::clock::{Clock, Micros, SystemClock};

/// A sample whose round trip took longer than this says too little about when Redis read its
/// clock.
pub const TRUSTED_ROUND_TRIP: Micros = 50_000;

/// How often the offset is measured again.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

pub struct RedisClock {
    local: Arc<dyn Clock>,
    /// Redis's time minus this replica's, in µs (0 until a sample is taken).
    offset: AtomicI64,
}

impl RedisClock {
    pub fn new(local: Arc<dyn Clock>) -> Self {
        Self {
            local,
            offset: AtomicI64::new(0),
        }
    }

    /// The system clock, tracked.
    pub fn system() -> Self {
        Self::new(Arc::new(SystemClock))
    }

    /// This replica's reading of its own clock, to bracket a sample with.
    pub fn local_now(&self) -> Micros {
        self.local.now()
    }

    /// Redis's time, as estimated now.
    pub fn now(&self) -> Micros {
        let local = i64::try_from(self.local.now()).unwrap_or(i64::MAX);
        u64::try_from(local.saturating_add(self.offset.load(Ordering::Relaxed))).unwrap_or(0)
    }

    /// Learns from one sample: Redis answered `redis` (µs) to a question sent at local time
    /// `sent` and answered at `received`. Whether it was used.
    pub fn observe(&self, sent: Micros, redis: Micros, received: Micros) -> bool {
        let round_trip = received.saturating_sub(sent);
        if received < sent || round_trip > TRUSTED_ROUND_TRIP {
            return false;
        }
        let midpoint = i128::from(sent) + i128::from(round_trip / 2);
        let offset = i128::from(redis) - midpoint;
        match i64::try_from(offset) {
            Ok(offset) => {
                self.offset.store(offset, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// The offset in use, in µs.
    pub fn offset(&self) -> i64 {
        self.offset.load(Ordering::Relaxed)
    }
}

/// Asks Redis for its time once and learns the offset from it; a failure keeps the last one.
pub async fn sample(clock: &RedisClock, connection: &Connection) {
    let sent = clock.local_now();
    match connection.time().await {
        Ok(time) => {
            let received = clock.local_now();
            let before = clock.offset();
            if clock.observe(sent, redis_time(time), received)
                && clock.offset().abs_diff(before) > 1_000_000
            {
                tracing::warn!(
                    offset_ms = clock.offset() / 1000,
                    "this replica's clock is off Redis's; decisions use Redis's"
                );
            }
        }
        Err(error) => {
            tracing::debug!(%error, "reading Redis's clock failed; keeping the last offset")
        }
    }
}

/// Samples every `SAMPLE_EVERY` while the clock lives.
pub fn keep_tracking(clock: Weak<RedisClock>, connection: Connection) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(SAMPLE_EVERY).await;
            let Some(clock) = clock.upgrade() else {
                return;
            };
            sample(&clock, &connection).await;
        }
    });
}

/// `TIME`'s answer (seconds, microseconds) in µs.
pub fn redis_time((seconds, micros): (u64, u64)) -> Micros {
    seconds.saturating_mul(1_000_000).saturating_add(micros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn a_replica_an_hour_off_decides_at_redis_time() {
        let local = ManualClock::at_seconds(1_800_003_600);
        let clock = RedisClock::new(Arc::new(local.clone()));
        let redis = 1_800_000_000_000_000;
        // Sent at local T, answered 400 µs later: Redis read its clock about 200 µs in.
        let sent = local.now();
        local.advance(400);
        assert!(clock.observe(sent, redis + 200, local.now()));
        assert_eq!(clock.now(), redis + 400);
        local.advance(1_000);
        assert_eq!(clock.now(), redis + 1_400);
    }

    #[test]
    fn a_slow_or_backwards_sample_is_not_used() {
        let local = ManualClock::at_seconds(1_000);
        let clock = RedisClock::new(Arc::new(local.clone()));
        assert!(!clock.observe(0, 5_000_000_000, TRUSTED_ROUND_TRIP + 1));
        assert!(!clock.observe(10, 5_000_000_000, 5));
        assert_eq!(clock.offset(), 0);
        assert_eq!(clock.now(), 1_000_000_000);
        assert_eq!(redis_time((2, 5)), 2_000_005);
    }
}
