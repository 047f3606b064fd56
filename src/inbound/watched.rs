//! One accepted connection, watched at the byte level: a peer that sends nothing after
//! connecting (`handshake`), or nothing for a long time (`idle`), or stops reading what is
//! written to it (`write_stalled`), or whose connection outlived its age and grace
//! (`max_age`), or whose connection was chosen to close for the requests
//! it left waiting (`slow_client`) or for going past a bound of the service (`over_bound`,
//! `conduct.rs`), has its connection fail with a timeout,
//! which closes it and frees whatever the protocol above held for it: streams, buffered
//! answers, the file descriptor.
//!
//! One timer per connection, armed lazily: a read only notes the instant; the timer is moved
//! when it rings early (the peer spoke since) or when a deadline comes closer (a write just
//! found the socket full), so that the bytes flowing cost no timer updates.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

use super::Slot;
use super::conduct::Conduct;

pub struct Inbound<S> {
    stream: S,
    slot: Slot,
    opened: Instant,
    /// When the peer last sent bytes; `None` until it first does.
    heard: Option<Instant>,
    /// Since when writes have found the socket full, with nothing written since.
    blocked: Option<Instant>,
    alarm: Pin<Box<Sleep>>,
    /// Why the connection was closed, once it was: every later call fails alike.
    closed: Option<&'static str>,
}

impl<S> Inbound<S> {
    pub(super) fn new(stream: S, slot: Slot) -> Self {
        let opened = Instant::now();
        let alarm = Box::pin(tokio::time::sleep_until(
            (opened + slot.deadlines.handshake).into(),
        ));
        Self {
            stream,
            slot,
            opened,
            heard: None,
            blocked: None,
            alarm,
            closed: None,
        }
    }

    /// The deadline in force, and what passing it means.
    fn deadline(&self) -> (Instant, &'static str) {
        let deadlines = &self.slot.deadlines;
        let read = match self.heard {
            None => (self.opened + deadlines.handshake, "handshake"),
            Some(heard) => (heard + deadlines.idle, "idle"),
        };
        let watched = match self.blocked {
            Some(since) if since + deadlines.write_stalled < read.0 => {
                (since + deadlines.write_stalled, "write_stalled")
            }
            _ => read,
        };
        match deadlines.lifetime {
            Some(lifetime) if self.opened + lifetime < watched.0 => {
                (self.opened + lifetime, "max_age")
            }
            _ => watched,
        }
    }

    /// Closes the connection for `reason`: every later call fails alike.
    fn close(&mut self, reason: &'static str) -> io::Error {
        if self.closed.is_none() {
            self.closed = Some(reason);
            self.slot.metrics.count_closed(reason);
            tracing::debug!(reason, "connection closed");
        }
        closed(reason)
    }

    /// The reason the connection was closed for, if it was (or has just been chosen to be).
    fn was_closed(&mut self) -> Option<&'static str> {
        if self.closed.is_none()
            && let Some(reason) = self.slot.conduct.closing_for()
        {
            self.close(reason);
        }
        self.closed
    }

    /// Pending until a deadline passes, or the connection is chosen to close; then it is
    /// closed for it.
    fn watch(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if let Some(reason) = self.slot.conduct.closing(cx) {
            return Poll::Ready(self.close(reason));
        }
        if let Some(reason) = self.closed {
            return Poll::Ready(closed(reason));
        }
        loop {
            let (deadline, reason) = self.deadline();
            if Instant::now() >= deadline {
                return Poll::Ready(self.close(reason));
            }
            if self.alarm.is_elapsed() || deadline < self.alarm.deadline().into_std() {
                self.alarm.as_mut().reset(deadline.into());
            }
            ready!(self.alarm.as_mut().poll(cx));
        }
    }

    fn wrote(
        &mut self,
        written: Poll<io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(count)) => {
                if count > 0 {
                    self.blocked = None;
                }
                Poll::Ready(Ok(count))
            }
            Poll::Pending => {
                self.blocked.get_or_insert_with(Instant::now);
                self.watch(cx).map(Err)
            }
            failed => failed,
        }
    }
}

fn closed(reason: &'static str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("connection closed: {reason}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Inbound<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(reason) = this.was_closed() {
            return Poll::Ready(Err(closed(reason)));
        }
        // While its answers cannot be written, nothing more is read from the peer: a client
        // that does not read makes no more work than fits in the socket buffers.
        if this.blocked.is_some() {
            return this.watch(cx).map(Err);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.heard = Some(Instant::now());
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => this.watch(cx).map(Err),
            failed => failed,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Inbound<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(reason) = this.was_closed() {
            return Poll::Ready(Err(closed(reason)));
        }
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(written, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(reason) = this.was_closed() {
            return Poll::Ready(Err(closed(reason)));
        }
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(written, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What the request handlers see of the connection: its conduct (`conduct.rs`).
impl<S> Connected for Inbound<S> {
    type ConnectInfo = Conduct;

    fn connect_info(&self) -> Conduct {
        self.slot.conduct.clone()
    }
}
