//! Hostile clients of the gRPC port, for measuring what a server holds under them
//! (`scripts/hostile`) and for the tests of tollgate's bounds: streams whose request never
//! ends, streams with headers only, clients that never read their answers (at the socket, or
//! by a flow-control window of zero), and sockets that never speak. Each runs for a duration
//! and reports what it saw; none is a gRPC client a real one would be.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prost::bytes::Bytes;
use serde::Serialize;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::codegen::http;

use super::raw_h2::{self as raw, PATH};

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
}

type Shared = Arc<Mutex<HostileReport>>;

fn tally(report: &Shared, count: impl FnOnce(&mut HostileReport)) {
    count(&mut report.lock().unwrap_or_else(PoisonError::into_inner));
}

pub async fn run(args: &HostileArgs) -> anyhow::Result<HostileReport> {
    let report: Shared = Arc::default();
    let until = Instant::now() + args.duration;
    let mut connections = tokio::task::JoinSet::new();
    for _ in 0..args.connections {
        let (args, report) = (args.clone(), Arc::clone(&report));
        connections.spawn(async move { connection(&args, &report, until).await });
    }
    while let Some(done) = connections.join_next().await {
        if let Ok(Err(error)) = done {
            tracing::debug!(%error, "a hostile connection ended");
        }
    }
    let report = std::mem::take(&mut *report.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(report)
}

/// One connection of the attack, opened again when the server closes it, until `until`.
async fn connection(args: &HostileArgs, report: &Shared, until: Instant) -> anyhow::Result<()> {
    while Instant::now() < until {
        let socket = if args.target.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        if args.attack == Attack::NeverRead {
            // The least the kernel allows: what it would take in for a client that does
            // not read fills at once, as it would for one whose buffers had filled.
            socket.set_recv_buffer_size(4_096)?;
        }
        let tcp = socket.connect(args.target).await?;
        tally(report, |r| r.connections_opened += 1);
        let held = match args.attack {
            Attack::Idle => idle(tcp, until).await,
            Attack::IdleH2 => idle_h2(tcp, until).await,
            Attack::Slowloris => slowloris(tcp, until).await,
            Attack::NeverRead => never_read(tcp, args, until).await,
            Attack::RlqsBuckets => rlqs_buckets(args, report, until).await,
            Attack::SlowBody | Attack::HeadersOnly | Attack::ZeroWindow => {
                streams(args, tcp, report, until).await
            }
        };
        if held.is_err() || Instant::now() < until {
            tally(report, |r| r.connections_closed += 1);
        }
        if !args.reconnect {
            break;
        }
    }
    Ok(())
}

/// Holds `tcp` without a byte until `until`; an error if the server closed it first.
async fn idle(mut tcp: TcpStream, until: Instant) -> anyhow::Result<()> {
    let mut byte = [0u8; 1];
    tokio::select! {
        _ = tokio::io::AsyncReadExt::read(&mut tcp, &mut byte) => anyhow::bail!("closed by the server"),
        () = tokio::time::sleep_until(until) => Ok(()),
    }
}

/// How often `idle-h2` pings and `slowloris` writes a byte.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(5);

/// Holds an HTTP/2 connection over `tcp`, PINGing it, until `until`; an error if the server
/// closed it first.
async fn idle_h2(tcp: TcpStream, until: Instant) -> anyhow::Result<()> {
    let (_client, mut connection) = h2::client::Builder::new()
        .handshake::<_, Bytes>(tcp)
        .await?;
    let mut pings = connection
        .ping_pong()
        .ok_or_else(|| anyhow::anyhow!("no ping handle"))?;
    let mut serving = tokio::spawn(connection);
    loop {
        tokio::select! {
            _ = &mut serving => anyhow::bail!("closed by the server"),
            () = tokio::time::sleep_until(until) => break,
            () = tokio::time::sleep(KEEP_ALIVE_EVERY) => {
                pings.ping(h2::Ping::opaque()).await?;
            }
        }
    }
    serving.abort();
    Ok(())
}

/// Writes an HTTP/1.1 request over `tcp` a byte every 5 s, never its end, until `until`; an
/// error if the server closed it first.
async fn slowloris(mut tcp: TcpStream, until: Instant) -> anyhow::Result<()> {
    let request = b"GET /healthz HTTP/1.1\r\nHost: tollgate\r\nX-Trickle: ";
    let mut sent = 0;
    loop {
        let byte = request.get(sent).copied().unwrap_or(b'a');
        tcp.write_all(&[byte]).await?;
        sent += 1;
        let mut answer = [0u8; 1];
        tokio::select! {
            _ = tokio::io::AsyncReadExt::read(&mut tcp, &mut answer) => anyhow::bail!("closed by the server"),
            () = tokio::time::sleep_until(until) => return Ok(()),
            () = tokio::time::sleep(KEEP_ALIVE_EVERY) => {}
        }
    }
}

/// Writes requests over `tcp` until `until` or until the server gives up on it.
async fn never_read(mut tcp: TcpStream, args: &HostileArgs, until: Instant) -> anyhow::Result<()> {
    tcp.write_all(&raw::preface()).await?;
    let message = grpc_message(&attack_request(args));
    let mut stream_id: u32 = 1;
    let mut pace = pacing(args.rate);
    while Instant::now() < until {
        if let Some(pace) = &mut pace {
            pace.tick().await;
        }
        let frames = raw::request(stream_id, &message);
        tokio::select! {
            written = tcp.write_all(&frames) => written?,
            () = tokio::time::sleep_until(until) => break,
        }
        stream_id = stream_id
            .checked_add(2)
            .ok_or_else(|| anyhow::anyhow!("stream ids used up"))?;
    }
    Ok(())
}

/// Keeps `args.streams` streams open on one HTTP/2 connection, as the attack has them.
async fn streams(
    args: &HostileArgs,
    tcp: TcpStream,
    report: &Shared,
    until: Instant,
) -> anyhow::Result<()> {
    let window = if args.attack == Attack::ZeroWindow {
        0
    } else {
        65_535
    };
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .max_concurrent_reset_streams(usize::MAX)
        .handshake::<_, Bytes>(tcp)
        .await?;
    let mut serving = tokio::spawn(connection);
    let mut held = tokio::task::JoinSet::new();
    // A paced attack spreads its rate over its streams.
    let per_stream = (args.rate > 0).then(|| {
        let streams = u32::try_from(args.streams.max(1)).unwrap_or(u32::MAX);
        (args.rate / streams).max(1)
    });
    for _ in 0..args.streams {
        let (args, report, client) = (args.clone(), Arc::clone(report), client.clone());
        held.spawn(async move {
            let mut pace = per_stream.and_then(pacing);
            while Instant::now() < until {
                if let Some(pace) = &mut pace {
                    pace.tick().await;
                }
                if one_stream(&args, client.clone(), &report, until)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    tokio::select! {
        _ = &mut serving => anyhow::bail!("closed by the server"),
        () = tokio::time::sleep_until(until) => {}
    }
    held.abort_all();
    serving.abort();
    Ok(())
}

/// One RLQS stream subscribing `args.buckets` large buckets, in messages under 1 MiB, then
/// holding on until `until` or until the server ends it (its status counted in `answers`).
async fn rlqs_buckets(args: &HostileArgs, report: &Shared, until: Instant) -> anyhow::Result<()> {
    use crate::pb::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use crate::pb::{BucketId, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", args.target))?
        .connect()
        .await?;
    let (reports, outgoing) = tokio::sync::mpsc::channel(2);
    let outgoing = futures_util::stream::unfold(outgoing, |mut outgoing| async move {
        outgoing.recv().await.map(|report| (report, outgoing))
    });
    let (width, entries) = (args.entry_bytes.max(1), args.entries.max(1));
    let padded = move |text: String| format!("{text:x<width$}");
    let stream = report
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .streams_opened;
    tally(report, |r| r.streams_opened += 1);
    let bucket = move |n: usize| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: (1..entries)
                .map(|entry| (padded(format!("k{entry}-")), padded(String::new())))
                .chain([("name".to_owned(), padded(format!("{stream}-{n}-")))])
                .collect(),
        }),
        time_elapsed: None,
        num_requests_allowed: 1,
        num_requests_denied: 0,
    };
    let bucket_bytes = entries * 2 * width + 64;
    let per_message = (900 * 1024 / bucket_bytes).max(1);
    let (total, domain) = (args.buckets, args.domain.clone());
    let sending = tokio::spawn(async move {
        for first in (0..total).step_by(per_message) {
            let message = RateLimitQuotaUsageReports {
                domain: domain.clone(),
                bucket_quota_usages: (first..(first + per_message).min(total))
                    .map(bucket)
                    .collect(),
            };
            if reports.send(message).await.is_err() {
                return;
            }
        }
        // Held open, as an Envoy holds its stream.
        reports.closed().await;
    });
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let ended = async {
        let mut responses = client
            .stream_rate_limit_quotas(outgoing)
            .await?
            .into_inner();
        loop {
            if responses.message().await?.is_none() {
                return Ok::<_, tonic::Status>(());
            }
        }
    };
    let outcome = tokio::select! {
        ended = ended => Some(ended),
        () = tokio::time::sleep_until(until) => None,
    };
    sending.abort();
    match outcome {
        None => Ok(()),
        Some(Ok(())) => anyhow::bail!("the server ended the stream"),
        Some(Err(status)) => {
            let code = (status.code() as i32).to_string();
            tally(report, |r| *r.answers.entry(code).or_default() += 1);
            anyhow::bail!("the server ended the stream: {status}")
        }
    }
}

/// A ticker of `rate` a second (none for 0: as fast as possible).
fn pacing(rate: u32) -> Option<tokio::time::Interval> {
    (rate > 0).then(|| {
        let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    })
}

/// One stream of the attack, until the server answers or resets it (or `until`).
async fn one_stream(
    args: &HostileArgs,
    client: h2::client::SendRequest<Bytes>,
    report: &Shared,
    until: Instant,
) -> anyhow::Result<()> {
    let mut client = client.ready().await?;
    let request = http::Request::post(format!("http://{}{PATH}", args.target))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (answer, mut send) = client.send_request(request, false)?;
    tally(report, |r| r.streams_opened += 1);
    match args.attack {
        Attack::SlowBody => {
            let mut body = vec![0u8; 5 + args.bytes];
            let declared = match args.declares {
                Some(declared) => declared,
                None => u32::try_from(args.bytes + 1)?,
            };
            body[1..5].copy_from_slice(&declared.to_be_bytes());
            send.send_data(Bytes::from(body), false)?;
        }
        Attack::ZeroWindow => send.send_data(grpc_message(&attack_request(args)), true)?,
        _ => {}
    }
    let answered = tokio::select! {
        answered = answer => answered,
        () = tokio::time::sleep_until(until) => return Ok(()),
    };
    let code = match answered {
        Ok(response) if args.attack == Attack::ZeroWindow => {
            // Headers can come, the message cannot: hold the stream as a client that never
            // reads would, until the server gives up on it.
            let mut body = response.into_body();
            tokio::select! {
                _ = body.data() => tally(report, |r| r.streams_reset += 1),
                () = tokio::time::sleep_until(until) => {}
            }
            return Ok(());
        }
        Ok(response) => grpc_status(response).await,
        Err(error) if error.is_reset() => {
            tally(report, |r| r.streams_reset += 1);
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    };
    tally(report, |r| *r.answers.entry(code).or_default() += 1);
    drop(send);
    Ok(())
}

/// The gRPC status of an answer: in its headers (trailers-only) or its trailers.
async fn grpc_status(response: http::Response<h2::RecvStream>) -> String {
    if let Some(code) = response.headers().get("grpc-status") {
        return code.to_str().unwrap_or("?").to_owned();
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        if let Ok(data) = data {
            let _ = body.flow_control().release_capacity(data.len());
        }
    }
    match body.trailers().await {
        Ok(Some(trailers)) => trailers
            .get("grpc-status")
            .and_then(|code| code.to_str().ok())
            .unwrap_or("?")
            .to_owned(),
        _ => "?".to_owned(),
    }
}

fn attack_request(args: &HostileArgs) -> crate::pb::RateLimitRequest {
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
