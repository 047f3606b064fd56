//! What the store's own calls say about its connections, and what to do about it. A Redis
//! that answers PING can still fail every call: a master demoted behind an address that now
//! leads elsewhere answers READONLY, a connection or a cluster client can wedge (after a slot
//! migration, behind a half-dead peer). So readiness does not rest on PING alone
//! (docs/design.md, "Failure"):
//!
//! - calls failing without a break for `NOT_READY_AFTER` make the store not ready;
//! - a READONLY answer (with `--redis-reconnect-on-readonly`), or calls failing for
//!   `REBUILD_AFTER`, make the connections again (`Pool::rebuild`), at most every
//!   `REBUILD_EVERY`;
//! - calls still failing `--store-stuck-after` into a streak are looked into, at most every
//!   `LOOK_EVERY`: if a fresh connection, made apart from the pool, works, the trouble is this
//!   process's and the rebuilds did not cure it, so the store reports itself stuck, which
//!   fails liveness and has the orchestrator restart the process. If the fresh connection
//!   fails too, the trouble is Redis's (down, a replica behind the address, a user without a
//!   permission), which a restart would not cure: the process stays alive, not ready.
//!
//! A streak is failures at most `STREAK_GAP` apart; any success ends it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::storage::StoreError;

/// Calls failing this long make the store not ready.
pub const NOT_READY_AFTER: Duration = Duration::from_secs(1);
/// Calls failing this long make the connections again.
pub const REBUILD_AFTER: Duration = Duration::from_secs(2);
/// The shortest gap between two rebuilds.
pub const REBUILD_EVERY: Duration = Duration::from_secs(3);
/// Failures further apart than this are two streaks (traffic stopped in between).
pub const STREAK_GAP: Duration = Duration::from_secs(2);
/// The shortest gap between two looks through a fresh connection.
pub const LOOK_EVERY: Duration = Duration::from_secs(10);

pub struct Doctor {
    /// A failure was recorded since the last success. While not (the usual case), a success
    /// takes no lock.
    troubled: AtomicBool,
    trouble: Mutex<Trouble>,
    reconnect_on_readonly: bool,
    /// `None`: never look, never stuck.
    stuck_after: Option<Duration>,
}

#[derive(Default)]
struct Trouble {
    streak: Option<Streak>,
    last_rebuild: Option<Instant>,
}

#[derive(Clone, Copy)]
struct Streak {
    since: Instant,
    last: Instant,
    /// The last look through a fresh connection in this streak: when, and whether it worked.
    look: Option<(Instant, bool)>,
}

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    Wait,
    /// Make the connections again (and, on a cluster, read the slot map again).
    Rebuild,
}

impl Doctor {
    pub fn new(reconnect_on_readonly: bool, stuck_after: Option<Duration>) -> Self {
        Self {
            troubled: AtomicBool::new(false),
            trouble: Mutex::new(Trouble::default()),
            reconnect_on_readonly,
            stuck_after,
        }
    }

    /// A call succeeded: any streak ends.
    pub fn succeeded(&self) {
        if !self.troubled.load(Ordering::Acquire) {
            return;
        }
        let mut trouble = self.lock();
        trouble.streak = None;
        self.troubled.store(false, Ordering::Release);
    }

    /// A call (or a readiness probe) failed with `error` at `now`.
    pub fn failed(&self, error: &StoreError, now: Instant) -> Treatment {
        let mut trouble = self.lock();
        self.troubled.store(true, Ordering::Release);
        let streak = match trouble.streak {
            Some(streak) if now.saturating_duration_since(streak.last) <= STREAK_GAP => Streak {
                last: now,
                ..streak
            },
            _ => Streak {
                since: now,
                last: now,
                look: None,
            },
        };
        trouble.streak = Some(streak);
        let wanted = (self.reconnect_on_readonly && matches!(error, StoreError::ReadOnly(_)))
            || now.saturating_duration_since(streak.since) >= REBUILD_AFTER;
        let allowed = trouble
            .last_rebuild
            .is_none_or(|at| now.saturating_duration_since(at) >= REBUILD_EVERY);
        if wanted && allowed {
            trouble.last_rebuild = Some(now);
            Treatment::Rebuild
        } else {
            Treatment::Wait
        }
    }

    /// How long calls have been failing, if they are now: a streak at least
    /// `NOT_READY_AFTER` long whose last failure is recent.
    pub fn calls_failing(&self, now: Instant) -> Option<Duration> {
        if !self.troubled.load(Ordering::Acquire) {
            return None;
        }
        let streak = self.lock().streak?;
        let length = streak.last.saturating_duration_since(streak.since);
        let recent = now.saturating_duration_since(streak.last) <= STREAK_GAP;
        (recent && length >= NOT_READY_AFTER).then_some(length)
    }

    /// Whether to look through a fresh connection now: calls have failed for
    /// `--store-stuck-after`, and no look was taken within `LOOK_EVERY`.
    pub fn look_due(&self, now: Instant) -> bool {
        let (Some(limit), Some(length)) = (self.stuck_after, self.calls_failing(now)) else {
            return false;
        };
        let look = self.lock().streak.and_then(|streak| streak.look);
        length >= limit
            && look.is_none_or(|(at, _)| now.saturating_duration_since(at) >= LOOK_EVERY)
    }

    /// What a look through a fresh connection found.
    pub fn looked(&self, now: Instant, fresh_works: bool) {
        if let Some(streak) = self.lock().streak.as_mut() {
            streak.look = Some((now, fresh_works));
        }
    }

    /// `Err(Stuck)` while calls fail and the last look found a fresh connection working.
    pub fn check_stuck(&self, now: Instant) -> Result<(), StoreError> {
        let Some(length) = self.calls_failing(now) else {
            return Ok(());
        };
        match self.lock().streak.and_then(|streak| streak.look) {
            Some((_, true)) => Err(StoreError::Stuck(format!(
                "every call has failed for {}s, made again through fresh connections, while a connection made apart works",
                length.as_secs()
            ))),
            _ => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Trouble> {
        self.trouble.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout() -> StoreError {
        StoreError::Timeout(Duration::from_millis(50))
    }

    fn read_only() -> StoreError {
        StoreError::ReadOnly("READONLY You can't write against a read only replica.".into())
    }

    /// Failures every 100 ms from `start` for `length`; the rebuilds asked for.
    fn fail_for(doctor: &Doctor, start: Instant, length: Duration) -> Vec<(Duration, Treatment)> {
        fail_between(doctor, start, Duration::ZERO, length)
    }

    /// Failures every 100 ms from `start + from` to `start + length`.
    fn fail_between(
        doctor: &Doctor,
        start: Instant,
        from: Duration,
        length: Duration,
    ) -> Vec<(Duration, Treatment)> {
        let step = Duration::from_millis(100);
        let mut at = from;
        let mut given = Vec::new();
        while at <= length {
            let treatment = doctor.failed(&timeout(), start + at);
            if treatment == Treatment::Rebuild {
                given.push((at, treatment));
            }
            at += step;
        }
        given
    }

    #[test]
    fn a_read_only_answer_rebuilds_at_once_and_not_again_within_the_gap() {
        let doctor = Doctor::new(true, None);
        let start = Instant::now();
        assert_eq!(doctor.failed(&read_only(), start), Treatment::Rebuild);
        let soon = start + Duration::from_millis(500);
        assert_eq!(doctor.failed(&read_only(), soon), Treatment::Wait);
        let later = start + REBUILD_EVERY;
        assert_eq!(doctor.failed(&read_only(), later), Treatment::Rebuild);
    }

    #[test]
    fn without_reconnect_on_readonly_a_read_only_answer_waits_like_any_failure() {
        let doctor = Doctor::new(false, None);
        let start = Instant::now();
        assert_eq!(doctor.failed(&read_only(), start), Treatment::Wait);
        let rebuilds = fail_for(&doctor, start, Duration::from_secs(4));
        assert_eq!(rebuilds, vec![(REBUILD_AFTER, Treatment::Rebuild)]);
    }

    #[test]
    fn failing_calls_rebuild_after_two_seconds_then_every_three() {
        let doctor = Doctor::new(true, None);
        let rebuilds = fail_for(&doctor, Instant::now(), Duration::from_secs(9));
        let at: Vec<u64> = rebuilds
            .iter()
            .map(|(at, _)| at.as_millis() as u64)
            .collect();
        assert_eq!(at, vec![2_000, 5_000, 8_000]);
    }

    #[test]
    fn not_ready_after_a_second_of_failures_and_ready_once_one_succeeds() {
        let doctor = Doctor::new(true, None);
        let start = Instant::now();
        fail_for(&doctor, start, Duration::from_millis(900));
        assert_eq!(
            doctor.calls_failing(start + Duration::from_millis(900)),
            None
        );
        fail_for(&doctor, start, Duration::from_millis(1_000));
        let failing = doctor.calls_failing(start + Duration::from_millis(1_000));
        assert_eq!(failing, Some(Duration::from_millis(1_000)));
        doctor.succeeded();
        assert_eq!(
            doctor.calls_failing(start + Duration::from_millis(1_000)),
            None
        );
    }

    #[test]
    fn a_streak_ends_when_traffic_stops_and_failures_start_a_new_one() {
        let doctor = Doctor::new(true, None);
        let start = Instant::now();
        fail_for(&doctor, start, Duration::from_millis(1_500));
        let quiet = start + Duration::from_millis(1_500) + STREAK_GAP + Duration::from_millis(1);
        assert_eq!(doctor.calls_failing(quiet), None);
        // One failure after the quiet spell is a streak of its own: no rebuild yet.
        assert_eq!(doctor.failed(&timeout(), quiet), Treatment::Wait);
        assert_eq!(doctor.calls_failing(quiet), None);
    }

    #[test]
    fn stuck_only_after_the_bound_and_only_when_a_fresh_connection_works() {
        let bound = Duration::from_secs(10);
        let doctor = Doctor::new(true, Some(bound));
        let start = Instant::now();
        fail_for(&doctor, start, Duration::from_secs(9));
        let early = start + Duration::from_secs(9);
        assert!(!doctor.look_due(early));
        fail_between(
            &doctor,
            start,
            Duration::from_secs(9),
            Duration::from_secs(12),
        );
        let now = start + Duration::from_secs(12);
        assert!(doctor.look_due(now));
        // Redis refused the fresh connection too: not this process's fault.
        doctor.looked(now, false);
        assert!(!doctor.look_due(now + Duration::from_secs(1)));
        assert!(doctor.check_stuck(now).is_ok());
        let later = now + LOOK_EVERY;
        fail_between(
            &doctor,
            start,
            Duration::from_secs(12),
            Duration::from_secs(22),
        );
        assert!(doctor.look_due(later));
        doctor.looked(later, true);
        let stuck = doctor.check_stuck(later).unwrap_err();
        assert_eq!(stuck.kind(), "stuck");
        assert!(
            stuck
                .to_string()
                .starts_with("store client stuck: every call has failed for 22s"),
            "{stuck}"
        );
        // A success ends it.
        doctor.succeeded();
        assert!(doctor.check_stuck(later).is_ok());
        let never = Doctor::new(true, None);
        fail_for(&never, start, Duration::from_secs(12));
        assert!(!never.look_due(now));
    }
}
