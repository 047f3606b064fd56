//! Redis's clock as this replica tracks it: the instant a call decides at. Reading `TIME`
//! inside every call cost Redis a large share of the cheapest counter (docs/performance.md);
//! instead each replica asks Redis for its time once a second and keeps the offset to its own
//! monotonic clock, so that replicas whose clocks disagree still decide by one clock,
//! Redis's (on a cluster, the clock of the primary of a fixed slot, the same for every
//! replica).
//!
//! The bound the design relies on (docs/design.md, "Time"): a replica's estimate is off by at
//! most half the round trip of the sample it came from, which is trusted only within
//! `trusted_round_trip`, plus what the two clocks drift apart until the next sample, and a
//! sample is used for at most `MAX_AGE`. An estimate older than that is no estimate: calls
//! fail as unavailable until a trusted sample comes. Counters are kept `grace` past the
//! moment their state stops mattering, so that a hit decided at an instant of its window and
//! answered within the store timeout always finds its window's counter, whichever replica
//! decided it.

use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use super::connection::{Connection, Current};
use crate::clock::{Clock, Micros, MonotonicClock};
use crate::storage::StoreError;

/// The round trip a sample is trusted within when the store timeout is shorter.
pub const MIN_TRUSTED_ROUND_TRIP: Duration = Duration::from_millis(50);

/// How often the offset is measured again.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// How soon a sample that could not be trusted is taken again.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// The longest an offset is used after its sample.
pub const MAX_AGE: Micros = 10_000_000;

/// What two replicas' estimates can drift apart within `MAX_AGE`: each clock is slewed by at
/// most 500 ppm (Linux's bound on an NTP correction), on either side.
const DRIFT_ALLOWANCE: Duration = Duration::from_millis(10);

/// The round trip within which a sample says enough about when Redis read its clock: the
/// store timeout, or `MIN_TRUSTED_ROUND_TRIP` if that is longer. A Redis slower than the
/// timeout answers no call either.
pub fn trusted_round_trip(timeout: Duration) -> Duration {
    timeout.max(MIN_TRUSTED_ROUND_TRIP)
}

/// How long past the moment its state stops mattering a counter is kept: a hit can reach Redis
/// at most the store timeout after its instant (a later answer is not used), and two
/// replicas' instants differ by at most the trusted round trip and the drift allowance.
pub fn grace(timeout: Duration) -> Duration {
    timeout + trusted_round_trip(timeout) + DRIFT_ALLOWANCE
}

pub struct RedisClock {
    local: Arc<dyn Clock>,
    trusted_round_trip: Micros,
    /// Redis's time minus this replica's, in µs.
    offset: AtomicI64,
    /// This replica's time at the last trusted sample (0: none yet).
    sampled_at: AtomicU64,
}

impl RedisClock {
    pub fn new(local: Arc<dyn Clock>, timeout: Duration) -> Self {
        Self {
            local,
            trusted_round_trip: micros(trusted_round_trip(timeout)),
            offset: AtomicI64::new(0),
            sampled_at: AtomicU64::new(0),
        }
    }

    /// This machine's monotonic clock, tracked.
    pub fn system(timeout: Duration) -> Self {
        Self::new(Arc::new(MonotonicClock::new()), timeout)
    }

    /// This replica's reading of its own clock, to bracket a sample with.
    pub fn local_now(&self) -> Micros {
        self.local.now()
    }

    /// Redis's time, as estimated now; unavailable while no trusted sample is recent enough.
    pub fn now(&self) -> Result<Micros, StoreError> {
        let local = self.local.now();
        let sampled_at = self.sampled_at.load(Ordering::Acquire);
        if sampled_at == 0 || local.saturating_sub(sampled_at) > MAX_AGE {
            return Err(StoreError::unavailable(
                "Redis's clock is not known: no TIME answered within the trusted round trip lately",
            ));
        }
        let local = i64::try_from(local).unwrap_or(i64::MAX);
        let estimate = local.saturating_add(self.offset.load(Ordering::Relaxed));
        Ok(u64::try_from(estimate).unwrap_or(0))
    }

    /// Learns from one sample: Redis answered `redis` (µs) to a question sent at local time
    /// `sent` and answered at `received`. Whether it was used.
    pub fn observe(&self, sent: Micros, redis: Micros, received: Micros) -> bool {
        let round_trip = received.saturating_sub(sent);
        if received < sent || round_trip > self.trusted_round_trip {
            return false;
        }
        let midpoint = i128::from(sent) + i128::from(round_trip / 2);
        let Ok(offset) = i64::try_from(i128::from(redis) - midpoint) else {
            return false;
        };
        self.offset.store(offset, Ordering::Relaxed);
        self.sampled_at.store(received.max(1), Ordering::Release);
        true
    }

    /// The offset in use, in µs.
    pub fn offset(&self) -> i64 {
        self.offset.load(Ordering::Relaxed)
    }
}

/// Asks Redis for its time once and learns the offset from it; whether the sample was used.
/// A failure keeps the last offset, until it is too old.
pub async fn sample(clock: &RedisClock, connection: &Connection) -> bool {
    let sent = clock.local_now();
    match connection.time().await {
        Ok(time) => {
            let received = clock.local_now();
            let before = clock.offset();
            let used = clock.observe(sent, redis_time(time), received);
            if used && clock.offset().abs_diff(before) > 1_000_000 {
                tracing::warn!(
                    offset_ms = clock.offset() / 1000,
                    "this replica's clock is off Redis's; decisions use Redis's"
                );
            }
            used
        }
        Err(error) => {
            tracing::debug!(%error, "reading Redis's clock failed; keeping the last offset");
            false
        }
    }
}

/// Samples every `SAMPLE_EVERY` (sooner after a sample that could not be used) while the
/// clock lives.
pub fn keep_tracking(clock: Weak<RedisClock>, current: Current, mut used: bool) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(if used { SAMPLE_EVERY } else { RETRY_EVERY }).await;
            let Some(clock) = clock.upgrade() else {
                return;
            };
            used = match current() {
                Some(connection) => sample(&clock, &connection).await,
                None => false,
            };
        }
    });
}

/// `TIME`'s answer (seconds, microseconds) in µs.
pub fn redis_time((seconds, micros): (u64, u64)) -> Micros {
    seconds.saturating_mul(1_000_000).saturating_add(micros)
}

fn micros(duration: Duration) -> Micros {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const TIMEOUT: Duration = Duration::from_millis(50);

    #[test]
    fn a_replica_an_hour_off_decides_at_redis_time() {
        let local = ManualClock::at_seconds(1_800_003_600);
        let clock = RedisClock::new(Arc::new(local.clone()), TIMEOUT);
        let redis = 1_800_000_000_000_000;
        // Sent at local T, answered 400 µs later: Redis read its clock about 200 µs in.
        let sent = local.now();
        local.advance(400);
        assert!(clock.observe(sent, redis + 200, local.now()));
        assert_eq!(clock.now().unwrap(), redis + 400);
        local.advance(1_000);
        assert_eq!(clock.now().unwrap(), redis + 1_400);
    }

    #[test]
    fn a_slow_or_backwards_sample_is_not_used() {
        let local = ManualClock::at_seconds(1_000);
        let clock = RedisClock::new(Arc::new(local.clone()), TIMEOUT);
        assert!(!clock.observe(0, 5_000_000_000, 50_001));
        assert!(!clock.observe(10, 5_000_000_000, 5));
        assert_eq!(clock.offset(), 0);
        assert!(clock.now().is_err(), "no sample yet: no instant");
        assert_eq!(redis_time((2, 5)), 2_000_005);
    }

    #[test]
    fn a_longer_store_timeout_trusts_slower_samples() {
        let local = ManualClock::at_seconds(1_000);
        let clock = RedisClock::new(Arc::new(local), Duration::from_millis(200));
        assert!(clock.observe(0, 5_000_000_000, 150_000));
        assert_eq!(clock.offset(), 5_000_000_000 - 75_000);
    }

    #[test]
    fn an_offset_is_used_for_at_most_max_age() {
        let local = ManualClock::at_seconds(1_000);
        let clock = RedisClock::new(Arc::new(local.clone()), TIMEOUT);
        let sent = local.now();
        assert!(clock.observe(sent, 7_000_000_000, sent));
        local.advance(MAX_AGE);
        assert_eq!(clock.now().unwrap(), 7_000_000_000 + MAX_AGE);
        local.advance(1);
        assert!(clock.now().is_err());
    }

    #[test]
    fn counters_outlive_their_windows_by_the_timeout_and_two_estimates_apart() {
        assert_eq!(grace(TIMEOUT), Duration::from_millis(110));
        assert_eq!(grace(Duration::from_millis(20)), Duration::from_millis(80));
        assert_eq!(grace(Duration::from_secs(1)), Duration::from_millis(2_010));
    }
}
