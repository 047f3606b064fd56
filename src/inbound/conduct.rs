//! How each connection conducts itself, for the bounds that are about connections rather
//! than bytes. A request *waits on its client* while its message is still waiting, and again
//! once answered until the answer is taken (HTTP/2 flow control holds an answer a client does
//! not read); a client that sends whole requests and reads its answers has next to none
//! waiting, while one that opens streams and sends slowly, or never, or never reads, has many.
//! When the process holds more waiting requests than it may (`intake`), the connection with
//! the most is closed, with all it holds, and its listener pauses before accepting again, so
//! that a client reconnecting to do it again is slowed to a few attempts a second.
//!
//! A full listener makes room the same way (`Roll::make_room`): a new client is let in by
//! closing the connection that has gone longest without a request and has none waiting,
//! idle for `ROOM_AFTER` at least. Connections held open and silent (HTTP/2 PINGs keep them
//! alive at the byte level) or trickling a request that never ends (Slowloris) are the ones
//! closed, never a client that is using its connection; a probe, whose connection is new and
//! short, always finds room.
//!
//! Each connection's `Conduct` reaches the request handlers as its connect info (tonic puts it
//! in every request's extensions).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Context;
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;

/// How long a listener waits before its next accept after it closed a connection for what it
/// held: long enough that reconnecting to open streams again costs an attacker more than it
/// costs tollgate, short enough that a client connecting meanwhile barely notices.
const PAUSE: Duration = Duration::from_millis(100);

/// The fewest requests a connection must have waiting to be closed for them: a client that
/// sends whole requests and reads its answers has one or two waiting at a time at most (for
/// the instant between a stream's headers and its message), so closing it would only hurt.
const CLOSED_FROM: usize = 32;

/// The shortest a connection must have gone without a request to be closed to make room:
/// long enough that a client between two requests of its traffic keeps its connection.
pub const ROOM_AFTER: Duration = Duration::from_secs(1);

/// Every listener's roll, for making room when the process runs out of file descriptors,
/// which are the process's and not one listener's.
static ROLLS: Mutex<Vec<std::sync::Weak<Roll>>> = Mutex::new(Vec::new());

/// A listener's live connections.
#[derive(Debug)]
pub struct Roll {
    connections: Mutex<HashMap<u64, Arc<State>>>,
    next: AtomicU64,
    started: Instant,
    /// Until when (ms since `started`) the listener pauses before accepting.
    paused_until: AtomicU64,
    /// How long a connection must have gone without a request to make room (`ROOM_AFTER`
    /// on the gRPC listener).
    room_after: Duration,
}

/// One connection's conduct, as its requests see it.
#[derive(Debug, Clone)]
pub struct Conduct {
    state: Arc<State>,
    roll: Arc<Roll>,
}

#[derive(Debug)]
struct State {
    id: u64,
    waiting: AtomicUsize,
    /// When its last request came (ms since its roll's start), or when it opened.
    active: AtomicU64,
    /// Its streams that last (RLQS), open now.
    streams: AtomicUsize,
    /// `OPEN`, or why the connection is to close (an index into `REASONS`).
    closing: AtomicU8,
    waker: AtomicWaker,
}

const OPEN: u8 = 0;
/// Why a connection is closed, as the metric's `reason` says it.
const REASONS: [&str; 4] = ["", "slow_client", "over_bound", "room"];
const SLOW_CLIENT: u8 = 1;
const OVER_BOUND: u8 = 2;
const ROOM: u8 = 3;

/// A lasting stream counted as open on its connection until dropped.
pub struct StreamOpen(Arc<State>);

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request counted as waiting on its connection until dropped.
pub struct Waiting(Arc<State>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Roll {
    pub fn new(room_after: Duration) -> Arc<Self> {
        let roll = Arc::new(Self {
            connections: Mutex::default(),
            next: AtomicU64::new(0),
            started: Instant::now(),
            paused_until: AtomicU64::new(0),
            room_after,
        });
        let mut rolls = ROLLS.lock().unwrap_or_else(PoisonError::into_inner);
        rolls.retain(|roll| roll.strong_count() > 0);
        rolls.push(Arc::downgrade(&roll));
        roll
    }

    fn connections(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<State>>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A new connection on the roll.
    pub fn enter(self: &Arc<Self>) -> Conduct {
        let state = Arc::new(State {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            waiting: AtomicUsize::new(0),
            active: AtomicU64::new(self.millis()),
            streams: AtomicUsize::new(0),
            closing: AtomicU8::new(OPEN),
            waker: AtomicWaker::new(),
        });
        self.connections().insert(state.id, Arc::clone(&state));
        Conduct {
            state,
            roll: Arc::clone(self),
        }
    }

    /// How long the listener should still pause before accepting.
    pub fn pause(&self) -> Duration {
        let until = self.paused_until.load(Ordering::Relaxed);
        let now = self.millis();
        Duration::from_millis(until.saturating_sub(now))
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Closes the connection with the most requests waiting on it, if it has `CLOSED_FROM`.
    fn close_worst(&self) {
        let worst = self
            .connections()
            .values()
            .filter(|state| state.closing.load(Ordering::Relaxed) == OPEN)
            .max_by_key(|state| state.waiting.load(Ordering::Relaxed))
            .filter(|state| state.waiting.load(Ordering::Relaxed) >= CLOSED_FROM)
            .cloned();
        if let Some(worst) = worst {
            self.close(&worst, SLOW_CLIENT);
        }
    }

    /// Closes the connection that has gone longest without a request, none waiting on it, if
    /// that is `ROOM_AFTER` at least: whether one was.
    pub fn make_room(&self) -> bool {
        Self::close_for_room(self.idlest())
    }

    /// `make_room` over every listener of the process: the idlest connection of any.
    pub fn make_room_anywhere() -> bool {
        let rolls: Vec<Arc<Roll>> = ROLLS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let idlest = rolls
            .iter()
            .filter_map(|roll| roll.idlest())
            .max_by_key(|(_, idle)| *idle);
        Self::close_for_room(idlest)
    }

    /// The open connection longest without a request and none waiting, with how long, if
    /// that is the roll's `room_after` at least.
    fn idlest(&self) -> Option<(Arc<State>, u64)> {
        let now = self.millis();
        let least = u64::try_from(self.room_after.as_millis()).unwrap_or(u64::MAX);
        self.connections()
            .values()
            .filter(|state| state.closing.load(Ordering::Relaxed) == OPEN)
            .filter(|state| state.waiting.load(Ordering::Relaxed) == 0)
            .map(|state| {
                let idle = now.saturating_sub(state.active.load(Ordering::Relaxed));
                (state, idle)
            })
            .filter(|(_, idle)| *idle >= least)
            .max_by_key(|(_, idle)| *idle)
            .map(|(state, idle)| (Arc::clone(state), idle))
    }

    /// Closes `idlest`, if there is one, to let another connection in (whether it was):
    /// no pause, since the newcomer did nothing wrong.
    fn close_for_room(idlest: Option<(Arc<State>, u64)>) -> bool {
        let Some((state, _)) = idlest else {
            return false;
        };
        state.closing.store(ROOM, Ordering::Relaxed);
        state.waker.wake();
        true
    }

    /// Closes one connection for `reason`, and pauses accepting.
    fn close(&self, state: &State, reason: u8) {
        state.closing.store(reason, Ordering::Relaxed);
        state.waker.wake();
        let until = self.millis() + u64::try_from(PAUSE.as_millis()).unwrap_or(0);
        self.paused_until.fetch_max(until, Ordering::Relaxed);
    }
}

impl Conduct {
    /// Counts a request as waiting on its client on this connection until the guard drops.
    pub fn waiting(&self) -> Waiting {
        self.state.waiting.fetch_add(1, Ordering::Relaxed);
        self.state
            .active
            .store(self.roll.millis(), Ordering::Relaxed);
        Waiting(Arc::clone(&self.state))
    }

    /// Counts a lasting stream (RLQS) as open on this connection until the guard drops.
    pub fn stream_open(&self) -> StreamOpen {
        self.state.streams.fetch_add(1, Ordering::Relaxed);
        StreamOpen(Arc::clone(&self.state))
    }

    /// Lasting streams open on this connection now.
    pub fn streams_now(&self) -> usize {
        self.state.streams.load(Ordering::Relaxed)
    }

    /// Requests waiting on this connection now.
    pub fn waiting_now(&self) -> usize {
        self.state.waiting.load(Ordering::Relaxed)
    }

    /// Closes whichever connection of this one's listener has the most requests waiting.
    pub fn close_worst_of_listener(&self) {
        self.roll.close_worst();
    }

    /// Closes this connection for what its client did (it went past a bound of the whole
    /// service), and pauses its listener as for the worst.
    pub fn close(&self) {
        self.roll.close(&self.state, OVER_BOUND);
    }

    /// Why the connection is to close, if it is (`slow_client`, `over_bound`, `room`).
    pub(super) fn closing_for(&self) -> Option<&'static str> {
        let reason = self.state.closing.load(Ordering::Relaxed);
        (reason != OPEN).then(|| REASONS[usize::from(reason)])
    }

    /// The same; wakes `cx` when it comes to close.
    pub(super) fn closing(&self, cx: &mut Context<'_>) -> Option<&'static str> {
        self.state.waker.register(cx.waker());
        self.closing_for()
    }

    /// Takes the connection off its listener's roll.
    pub(super) fn leave(&self) {
        self.roll.connections().remove(&self.state.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_holding_the_most_waiting_requests_is_closed_and_accepting_pauses() {
        let roll = Roll::new(ROOM_AFTER);
        let (quiet, busy, busier) = (roll.enter(), roll.enter(), roll.enter());
        let _one = quiet.waiting();
        let _held: Vec<Waiting> = (0..CLOSED_FROM).map(|_| busy.waiting()).collect();
        let _more: Vec<Waiting> = (0..CLOSED_FROM + 1).map(|_| busier.waiting()).collect();
        assert_eq!(roll.pause(), Duration::ZERO);
        quiet.close_worst_of_listener();
        let closing = |conduct: &Conduct| conduct.closing_for().is_some();
        assert!(closing(&busier) && !closing(&busy) && !closing(&quiet));
        assert!(roll.pause() > Duration::ZERO);
        // The next worst, once the worst is closing; never one with next to nothing waiting.
        quiet.close_worst_of_listener();
        assert!(closing(&busy));
        busy.leave();
        let _after = roll.enter().waiting();
        quiet.close_worst_of_listener();
        assert!(!closing(&quiet));
        drop(_one);
        assert_eq!(quiet.waiting_now(), 0);
    }
}
