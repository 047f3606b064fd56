//! Hostile clients of the gRPC and admin ports, for measuring what a server holds under them
//! (`scripts/hostile`) and for the tests of tollgate's bounds: streams whose request never
//! ends, streams with headers only, clients that never read their answers (at the socket, or
//! by a flow-control window of zero), sockets that never speak, connections held open with
//! PINGs, Slowloris requests, and refunds restoring a budget. Each runs for a duration and
//! reports what it saw; none is a gRPC client a real one would be. Here: what an attack is
//! and what it reports; `attack.rs` runs one, `streams.rs`, `sockets.rs` and `calls.rs` are
//! the attacks of streams, of a socket and of whole calls.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prost::bytes::Bytes;
use serde::Serialize;

use super::raw_h2::{self as raw, PATH};

pub mod attack;
mod calls;
mod sockets;
mod streams;

/// What the hostile clients do: flags of `tollgate bench-hostile`.
#[derive(Debug, Clone, clap::Args)]
pub struct HostileArgs {
    /// The server's gRPC address (plaintext).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub target: SocketAddr,

    #[arg(long, value_enum)]
    pub attack: Attack,

    /// Connections the attack holds.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,

    /// Streams each connection keeps open (one ended is opened again).
    #[arg(long, default_value_t = 512)]
    pub streams: usize,

    /// never-read, zero-window: requests each connection sends a second (0: as fast as it
    /// can, which is a flood of requests more than a client that does not read).
    #[arg(long, default_value_t = 0)]
    pub rate: u32,

    /// never-read, zero-window: the requests' domain (its rules decide how long an answer is).
    #[arg(long, default_value = "hostile")]
    pub domain: String,

    /// never-read, zero-window: descriptors per request, each `user=<n>` (64 make answers of a
    /// few kilobytes when the domain limits `user`).
    #[arg(long, default_value_t = 1)]
    pub descriptors: usize,

    /// slow-body: bytes of the message sent (its prefix declares one more, or --declares).
    #[arg(long, default_value_t = 1024 * 1024 - 1)]
    pub bytes: usize,

    /// slow-body: the message length its prefix declares, when not --bytes plus one (a
    /// message declared large and never sent: `--bytes 0 --declares 1048576`).
    #[arg(long)]
    pub declares: Option<u32>,

    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// rlqs-buckets: buckets each stream subscribes.
    #[arg(long, default_value_t = 100_000)]
    pub buckets: usize,

    /// rlqs-buckets: entries of each bucket id.
    #[arg(long, default_value_t = 64)]
    pub entries: usize,

    /// rlqs-buckets: bytes of each entry's key and of its value.
    #[arg(long, default_value_t = 1_024)]
    pub entry_bytes: usize,

    /// Open a connection again when the server closes it (a flood of connections rather than
    /// a hold on some).
    #[arg(long)]
    pub reconnect: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Attack {
    /// Each stream sends its headers and all of a message but its last byte, and waits.
    SlowBody,
    /// Each stream sends its headers and nothing more.
    HeadersOnly,
    /// Requests written over raw TCP as fast as the socket takes them; nothing is ever read.
    NeverRead,
    /// Whole requests on streams whose flow-control window is 0: no answer can be sent.
    ZeroWindow,
    /// TCP connections that never send a byte.
    Idle,
    /// HTTP/2 connections that send no request, only a PING every 5 s, as a well-behaved
    /// client keeps a connection it does not use alive.
    IdleH2,
    /// HTTP/1.1 requests (to the admin port) written a byte every 5 s, never ending.
    Slowloris,
    /// On one key (`user=0` of `--domain`), a hit then a refund of 10^9, again and again: a
    /// client of the gRPC port restoring its own budget (the spends admitted are counted).
    Refunds,
    /// RLQS streams (one per connection) each subscribing `--buckets` buckets whose ids are
    /// as large as a stream may send (`--entries` entries of `--entry-bytes` keys and values).
    RlqsBuckets,
}

/// What the attack saw.
#[derive(Debug, Default, Serialize)]
pub struct HostileReport {
    pub connections_opened: u64,
    /// Connections the server closed (or refused) while the attack held them.
    pub connections_closed: u64,
    pub streams_opened: u64,
    /// Answers by gRPC status code (from the answer's headers or trailers).
    pub answers: BTreeMap<String, u64>,
    /// Streams the server reset.
    pub streams_reset: u64,
    /// refunds: the spends admitted.
    pub admitted: u64,
}

pub(super) type Shared = Arc<Mutex<HostileReport>>;

pub(super) fn tally(report: &Shared, count: impl FnOnce(&mut HostileReport)) {
    count(&mut report.lock().unwrap_or_else(PoisonError::into_inner));
}

/// A ticker of `rate` a second (none for 0: as fast as possible).
pub(super) fn pacing(rate: u32) -> Option<tokio::time::Interval> {
    (rate > 0).then(|| {
        let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    })
}

pub(super) fn attack_request(args: &HostileArgs) -> crate::pb::RateLimitRequest {
    crate::pb::RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: (0..args.descriptors.max(1))
            .map(|n| crate::pb::RateLimitDescriptor {
                entries: vec![crate::pb::rate_limit_descriptor::Entry {
                    key: "user".into(),
                    value: n.to_string(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// `request` as one gRPC message (prefix and protobuf).
pub fn grpc_message(request: &crate::pb::RateLimitRequest) -> Bytes {
    let encoded = prost::Message::encode_to_vec(request);
    let mut message = Vec::with_capacity(5 + encoded.len());
    message.push(0);
    message.extend_from_slice(
        &u32::try_from(encoded.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    message.extend_from_slice(&encoded);
    Bytes::from(message)
}
