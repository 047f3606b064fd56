//! Accepting connections within a listener's cap, and through the failures of `accept`
//! itself: out of file descriptors (EMFILE, ENFILE) a listener that retried at once would spin
//! a core and never give the process a chance to close what it holds, so it backs off, and
//! says so once rather than thousands of times a second.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::conduct::Roll;
use super::watched::Inbound;
use super::{Deadlines, Slot};
use crate::metrics::ListenerMetrics;

/// The first pause after a failed accept; each failure in a row doubles it, up to
/// `MOST_BACKOFF`, short enough that a listener takes new clients well within a second of
/// descriptors coming free.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MOST_BACKOFF: Duration = Duration::from_millis(250);

/// Each connection's socket send buffer (Linux doubles it): answers for a client that reads
/// them are written at once, and one that does not finds its answers backed up, and the
/// write timeout running, within a second or two of them.
const SEND_BUFFER: usize = 256 * 1024;

/// How long a new connection waits for the one closed to make room for it to go.
const ROOM_WAIT: Duration = Duration::from_millis(250);

/// How often a listener that keeps failing, or keeps turning connections away at its cap,
/// says so again.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// A listener, with its cap on connections and what its connections are held to.
pub struct Acceptor {
    listener: TcpListener,
    name: &'static str,
    slots: Arc<Semaphore>,
    deadlines: Deadlines,
    metrics: ListenerMetrics,
    roll: Arc<Roll>,
    failures: Episode,
    refusals: Episode,
}

/// A connection accepted within the cap: its stream, and its place under the cap (given back
/// when the connection, or the `Inbound` it becomes, is dropped).
pub struct Accepted<S> {
    pub stream: S,
    slot: Slot,
}

/// A run of failures (or refusals) in a row: logged at its first, then at most every
/// `LOG_EVERY`, with how many there were since.
#[derive(Default)]
struct Episode {
    count: u64,
    logged: Option<(Instant, u64)>,
}

impl Episode {
    /// Counts one more; whether to log it, and how many went unlogged before it.
    fn count(&mut self) -> Option<u64> {
        self.count += 1;
        let due = match self.logged {
            None => true,
            Some((at, _)) => at.elapsed() >= LOG_EVERY,
        };
        if !due {
            return None;
        }
        let unlogged = self
            .logged
            .map_or(0, |(_, at_count)| self.count - at_count - 1);
        self.logged = Some((Instant::now(), self.count));
        Some(unlogged)
    }

    fn end(&mut self) {
        self.count = 0;
        // A new episode within `LOG_EVERY` of the last line stays quiet: a listener flapping
        // at its limit writes one line a minute, not one per flap.
        if self.logged.is_some_and(|(at, _)| at.elapsed() >= LOG_EVERY) {
            self.logged = None;
        }
        if let Some((at, _)) = self.logged {
            self.logged = Some((at, 0));
        }
    }

    fn backoff(&self) -> Duration {
        let doublings = u32::try_from(self.count.saturating_sub(1))
            .unwrap_or(u32::MAX)
            .min(8);
        (FIRST_BACKOFF * 2u32.pow(doublings)).min(MOST_BACKOFF)
    }
}

impl Acceptor {
    /// `listener` (named `name` in logs and metrics), holding at most `max_connections`.
    pub fn new(
        listener: TcpListener,
        name: &'static str,
        max_connections: usize,
        deadlines: Deadlines,
        metrics: ListenerMetrics,
    ) -> Self {
        Self {
            listener,
            name,
            slots: Arc::new(Semaphore::new(
                max_connections.clamp(1, Semaphore::MAX_PERMITS),
            )),
            deadlines,
            metrics,
            roll: Roll::new(deadlines.room_after),
            failures: Episode::default(),
            refusals: Episode::default(),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection within the cap. Past the cap a connection is closed as soon as it
    /// is accepted (its client learns at once, rather than waiting in the backlog); a failed
    /// accept is retried after a pause, and so is the next accept after a connection was
    /// closed for what it held (`conduct.rs`).
    pub async fn accept(&mut self) -> Accepted<TcpStream> {
        loop {
            let pause = self.roll.pause();
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) if is_connection_error(&error) => continue,
                Err(error) => {
                    self.back_off(&error).await;
                    continue;
                }
            };
            self.failures.end();
            let Some(permit) = self.place().await else {
                self.metrics.count_closed("limit");
                if let Some(unlogged) = self.refusals.count() {
                    tracing::warn!(
                        listener = self.name,
                        turned_away_since_last_line = unlogged,
                        "connection limit reached and no connection idle to close: new connections are closed at once"
                    );
                }
                continue;
            };
            self.refusals.end();
            // Answers are small and latency-bound: no Nagle delay.
            let _ = stream.set_nodelay(true);
            // A fixed send buffer: the kernel's autotuning would grow it to megabytes for a
            // client that never reads, so that its answers back up (and the write timeout
            // starts) only after a minute of them.
            let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER);
            self.metrics.open.inc();
            let slot = Slot {
                _permit: permit,
                deadlines: self.deadlines,
                metrics: self.metrics.clone(),
                conduct: self.roll.enter(),
            };
            return Accepted { stream, slot };
        }
    }

    /// A place under the cap: a free one, or one made by closing the idlest connection
    /// (`Roll::make_room`). `None`: every connection is in use.
    async fn place(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Some(permit);
        }
        if !self.roll.make_room() {
            return None;
        }
        let freed = Arc::clone(&self.slots).acquire_owned();
        tokio::time::timeout(ROOM_WAIT, freed).await.ok()?.ok()
    }

    /// The connections as a stream of `Inbound`s (tonic's `serve_with_incoming`), watched on
    /// the runtime that polls it.
    pub fn incoming(self) -> impl Stream<Item = io::Result<Inbound<TcpStream>>> {
        futures_util::stream::unfold(self, |mut acceptor| async move {
            let accepted = acceptor.accept().await;
            Some((Ok(accepted.into_inbound()), acceptor))
        })
    }

    async fn back_off(&mut self, error: &io::Error) {
        self.metrics.accept_errors.inc();
        if let Some(unlogged) = self.failures.count()
            && process_may_say_so()
        {
            tracing::warn!(listener = self.name, %error, failed_since_last_line = unlogged, "accepting connections fails; retrying with a pause (said again at most once a minute)");
        }
        // Out of file descriptors: the idlest connection of any listener gives its own back,
        // and the next accept is tried as soon as it has.
        let pause = if is_out_of_descriptors(error) && Roll::make_room_anywhere() {
            FIRST_BACKOFF
        } else {
            self.failures.backoff()
        };
        tokio::time::sleep(pause).await;
    }
}

impl<S> Accepted<S> {
    /// The connection, watched (must be called on the runtime that will serve it: its
    /// deadlines are that runtime's timers).
    pub fn into_inbound(self) -> Inbound<S> {
        Inbound::new(self.stream, self.slot)
    }

    /// The same connection as another type of stream (to hand it to another runtime).
    pub fn map<T>(self, convert: impl FnOnce(S) -> io::Result<T>) -> io::Result<Accepted<T>> {
        Ok(Accepted {
            stream: convert(self.stream)?,
            slot: self.slot,
        })
    }
}

/// The HTTP listeners (`axum::serve`) accept through the same cap and deadlines.
impl axum::serve::Listener for Acceptor {
    type Io = Inbound<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let accepted = Acceptor::accept(self).await;
        let peer = accepted
            .stream
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        (accepted.into_inbound(), peer)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// Whether this process may log a failing accept now: at most once every `LOG_EVERY` over all
/// its listeners, since what makes accepts fail (the file-descriptor limit) is the process's.
fn process_may_say_so() -> bool {
    static SAID: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let mut said = SAID
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if said.is_some_and(|at| at.elapsed() < LOG_EVERY) {
        return false;
    }
    *said = Some(Instant::now());
    true
}

/// EMFILE or ENFILE: the process's or the system's file descriptors are all in use.
fn is_out_of_descriptors(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(23 | 24))
}

/// Errors of one connection that went away before it was accepted, not of the listener.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_failures_is_logged_once_a_minute_with_a_backoff_that_stops_growing() {
        let mut episode = Episode::default();
        assert_eq!(episode.count(), Some(0));
        assert_eq!(episode.backoff(), Duration::from_millis(10));
        for _ in 0..9 {
            assert_eq!(episode.count(), None);
        }
        assert_eq!(episode.backoff(), Duration::from_millis(250));
        // Over and begun again within the minute: still quiet, the backoff short again.
        episode.end();
        assert_eq!(episode.count(), None);
        assert_eq!(episode.backoff(), Duration::from_millis(10));
        // A minute after the line, the next failure is said, with those left unsaid.
        episode.logged = episode.logged.map(|(at, n)| (at - LOG_EVERY, n));
        assert_eq!(episode.count(), Some(1));
    }
}
