//! Connections as accepted, before any protocol is spoken on them: how many one listener
//! holds, how long a peer may stay silent, and how long it may leave answers unread. Every
//! listener (gRPC in plaintext, over TLS or spread over the per-core runtimes, and the HTTP
//! admin) accepts through an `Acceptor` (`accept.rs`) and serves each connection through an
//! `Inbound` (`watched.rs`), so that whatever a client does with its sockets, what it holds
//! here is bounded: connections by the cap, each for as long as it speaks and reads. Each
//! connection's `Conduct` (`conduct.rs`) tells the request handlers what it has waiting, so
//! that the connection with the most can be closed.

pub mod accept;
pub mod conduct;
pub mod watched;

use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use crate::clock::positive_duration;
use crate::metrics::ListenerMetrics;
use conduct::Conduct;

/// Connection bounds: flags of `tollgate serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct InboundOptions {
    /// Most connections the gRPC listener holds at once; past it, a new connection is closed
    /// as soon as it is accepted (counted in tollgate_connections_closed_total{reason="limit"}).
    #[arg(long, env = "TOLLGATE_GRPC_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub grpc_max_connections: usize,

    /// Most connections the HTTP admin listener (and the --metrics-addr one) holds at once.
    #[arg(long, env = "TOLLGATE_HTTP_MAX_CONNECTIONS", default_value_t = 1_000)]
    pub http_max_connections: usize,

    /// A new connection whose peer sends nothing for this long (and, with TLS, has not
    /// finished its handshake) is closed, so that sockets opened and left silent do not hold
    /// file descriptors.
    #[arg(long, env = "TOLLGATE_CONNECTION_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = positive_duration)]
    pub connection_handshake_timeout: Duration,

    /// A connection whose peer has sent nothing for this long (HTTP/2 pings count) is closed;
    /// clients open a new one when they next need it.
    #[arg(long, env = "TOLLGATE_CONNECTION_IDLE_TIMEOUT", default_value = "1h", value_parser = positive_duration)]
    pub connection_idle_timeout: Duration,

    /// A connection whose answers could not be written for this long (a client that stopped
    /// reading them) is closed, with whatever it left unread.
    #[arg(long, env = "TOLLGATE_CONNECTION_WRITE_TIMEOUT", default_value = "10s", value_parser = positive_duration)]
    pub connection_write_timeout: Duration,
}

impl Default for InboundOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

/// The deadlines every connection of one listener is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    pub handshake: Duration,
    pub idle: Duration,
    pub write_stalled: Duration,
    /// How long a connection lives at most, whatever it is doing: the end of an aged gRPC
    /// connection's grace (`--grpc-max-connection-age` plus its grace).
    pub lifetime: Option<Duration>,
    /// How long a connection must have gone without a request to be closed to make room
    /// for a new one when the listener is full (`conduct::Roll::make_room`).
    pub room_after: Duration,
}

impl InboundOptions {
    pub fn deadlines(&self) -> Deadlines {
        Deadlines {
            handshake: self.connection_handshake_timeout,
            idle: self.connection_idle_timeout,
            write_stalled: self.connection_write_timeout,
            lifetime: None,
            room_after: conduct::ROOM_AFTER,
        }
    }

    /// The deadlines of an HTTP admin connection: room is made at once, since its clients
    /// (probes, scrapes) open a connection per use or come back for it, and a probe must get
    /// in even while every connection is an attacker's just opened.
    pub fn http_deadlines(&self) -> Deadlines {
        Deadlines {
            room_after: Duration::ZERO,
            ..self.deadlines()
        }
    }
}

/// One connection's place under its listener's cap, and on its roll.
struct Slot {
    _permit: OwnedSemaphorePermit,
    deadlines: Deadlines,
    metrics: ListenerMetrics,
    conduct: Conduct,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics.open.dec();
        self.conduct.leave();
    }
}
