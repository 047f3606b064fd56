//! Time as a value. Algorithms never read the clock; the memory store asks a `Clock` once per
//! request and passes the instant down, so tests can drive time by hand (`ManualClock`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (instants) or a length of time in microseconds.
pub type Micros = u64;

pub const MICROS_PER_SECOND: Micros = 1_000_000;

/// A duration in whole seconds, rounded up (never tell a client to come back early).
pub fn whole_seconds_up(duration: Micros) -> u64 {
    duration.div_ceil(MICROS_PER_SECOND)
}

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Micros;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        // A clock before 1970 is a broken host; treat it as the epoch rather than panic.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// The wall clock as it read when this clock was made, advanced since by the monotonic clock:
/// a step of the wall clock (an NTP correction, an operator) does not move it. For measuring
/// an offset to another machine's clock, which a step would falsify until measured again.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    wall: Micros,
    since: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            wall: SystemClock.now(),
            since: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Micros {
        let elapsed = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.wall.saturating_add(elapsed)
    }
}

/// A clock that only moves when told to: for tests.
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn at_seconds(seconds: u64) -> Self {
        let clock = Self::default();
        clock.set(seconds * MICROS_PER_SECOND);
        clock
    }

    pub fn set(&self, now: Micros) {
        self.now.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Micros) {
        self.now.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}

/// A duration above zero.
pub fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        Ok(_) => Err("must be more than zero".into()),
        Err(error) => Err(error.to_string()),
    }
}
