//! A warning that repeats per request (a store down fails every call) said at most once per
//! interval, with how many went unsaid since: a failing dependency must not make writing the
//! log the process's main work, nor bury every other line. The metrics count every one.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The warning of a failed store call, said at most once a second: a store down fails every
/// request, and the metrics count them (`tollgate_requests_total` by code,
/// `tollgate_store_errors_total` by kind).
pub static STORE_FAILURES: Throttle = Throttle::new(Duration::from_secs(1));

pub struct Throttle {
    every: Duration,
    state: Mutex<State>,
}

struct State {
    said: Option<Instant>,
    unsaid: u64,
}

impl Throttle {
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new(State {
                said: None,
                unsaid: 0,
            }),
        }
    }

    /// Whether to say it now: if so, how many went unsaid since it was last said.
    pub fn may_say(&self) -> Option<u64> {
        self.may_say_at(Instant::now())
    }

    fn may_say_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.said {
            Some(said) if now.saturating_duration_since(said) < self.every => {
                state.unsaid = state.unsaid.saturating_add(1);
                None
            }
            _ => {
                state.said = Some(now);
                Some(std::mem::take(&mut state.unsaid))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn said_once_per_interval_with_the_count_left_unsaid() {
        let throttle = Throttle::new(Duration::from_secs(1));
        let start = Instant::now();
        let at = |ms: u64| throttle.may_say_at(start + Duration::from_millis(ms));
        assert_eq!(at(0), Some(0));
        assert_eq!(at(10), None);
        assert_eq!(at(999), None);
        assert_eq!(at(1000), Some(2));
        assert_eq!(at(1500), None);
        assert_eq!(at(5000), Some(1));
        assert_eq!(at(6000), Some(0));
    }
}
