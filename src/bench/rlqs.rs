//! `tollgate bench-rlqs`: load for an RLQS server, as many data planes would bring it.
//! `streams` streams over `connections` HTTP/2 connections each subscribe to `buckets`
//! buckets (shared by every stream, so each bucket is split `streams` ways, or each
//! stream's own), then report every bucket every `interval` with a demand that changes from
//! one report to the next for half the streams, so that every split moves each round.
//! Measured: the time from a stream's first report to the assignment of all its buckets, the
//! time from a report to the next assignment the stream receives, and with `--server-pid`
//! the server's CPU and resident memory per stream and per subscription.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::builder::BoolishValueParser;
use hdrhistogram::Histogram;
use prost_types::Duration as ProtoDuration;
use serde::Serialize;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::{MICROS_PER_TICK, Percentiles, server_cpu_ticks, server_rss_kib};
use crate::client::ClientArgs;
use crate::clock::positive_duration;
use crate::pb::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::pb::{BucketId, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports};

/// `tollgate bench-rlqs`: how many streams and buckets, how often, for how long.
#[derive(Debug, clap::Args)]
pub struct QuotaBenchArgs {
    #[command(flatten)]
    pub server: ClientArgs,

    /// The domain every stream names.
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_DOMAIN", default_value = "bench")]
    pub domain: String,

    /// Streams (data planes) at once.
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_STREAMS", default_value_t = 1_000)]
    pub streams: usize,

    /// Buckets each stream reports, `{name: b<n>}`.
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_BUCKETS", default_value_t = 100)]
    pub buckets: usize,

    /// Each stream reports buckets of its own (`{name: b<n>, stream: <s>}`) instead of the
    /// same ones as every other stream.
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_DISTINCT_BUCKETS", value_parser = BoolishValueParser::new())]
    pub distinct_buckets: bool,

    /// HTTP/2 connections the streams share.
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_CONNECTIONS", default_value_t = 16)]
    pub connections: usize,

    /// How often each stream reports.
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_INTERVAL", default_value = "1s", value_parser = positive_duration)]
    pub interval: Duration,

    /// How long to report once every stream is subscribed.
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_DURATION", default_value = "20s", value_parser = positive_duration)]
    pub duration: Duration,

    /// The server's process id, to report its CPU and memory (from /proc).
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_SERVER_PID")]
    pub server_pid: Option<u32>,

    /// Print the report as JSON.
    #[arg(long, env = "TOLLGATE_BENCH_RLQS_JSON", value_parser = BoolishValueParser::new())]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct QuotaReport {
    pub streams: usize,
    pub subscriptions: usize,
    pub seconds: f64,
    pub reports_sent: u64,
    /// From a stream's first report to the assignment of all its buckets, in µs.
    pub subscribe_us: Percentiles,
    /// From a report to the next assignment the stream receives, in µs.
    pub report_to_assignment_us: Percentiles,
    /// Server CPU, in cores, while streams report.
    pub server_cores: Option<f64>,
    pub server_cpu_us_per_stream_second: Option<f64>,
    pub server_cpu_ns_per_subscription_second: Option<f64>,
    /// Server resident memory before the streams opened and with them open, in KiB.
    pub server_rss_before_kib: Option<u64>,
    pub server_rss_kib: Option<u64>,
    pub server_rss_bytes_per_subscription: Option<f64>,
}

/// What one stream measured.
struct Measured {
    subscribe: Histogram<u64>,
    reassign: Histogram<u64>,
    reports: u64,
}

pub async fn run(args: &QuotaBenchArgs) -> anyhow::Result<QuotaReport> {
    let mut channels = Vec::with_capacity(args.connections.max(1));
    for _ in 0..args.connections.max(1) {
        channels.push(args.server.endpoint()?.connect().await?);
    }
    let rss_before = args.server_pid.and_then(server_rss_kib);
    let (subscribed, mut all_subscribed) = mpsc::channel(args.streams.max(1));
    let (start, started) = tokio::sync::watch::channel(None::<Instant>);
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..args.streams {
        let stream = Stream {
            index,
            channel: channels[index % channels.len()].clone(),
            domain: args.domain.clone(),
            buckets: bucket_ids(args, index),
            interval: args.interval,
            duration: args.duration,
            streams: args.streams,
        };
        tasks.spawn(stream.run(subscribed.clone(), started.clone()));
    }
    drop(subscribed);
    for _ in 0..args.streams {
        all_subscribed
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("a stream ended before its buckets were assigned"))?;
    }
    let cpu_before = args.server_pid.and_then(server_cpu_ticks);
    let begun = Instant::now();
    start.send_replace(Some(begun));
    let mut subscribe = histogram()?;
    let mut reassign = histogram()?;
    let mut reports = 0;
    while let Some(measured) = tasks.join_next().await {
        let measured = measured??;
        subscribe.add(&measured.subscribe)?;
        reassign.add(&measured.reassign)?;
        reports += measured.reports;
    }
    let seconds = begun.elapsed().as_secs_f64();
    let cpu_after = args.server_pid.and_then(server_cpu_ticks);
    let rss = args.server_pid.and_then(server_rss_kib);
    let cores = cpu_before
        .zip(cpu_after)
        .map(|(before, after)| (after - before) as f64 * MICROS_PER_TICK / 1e6 / seconds);
    let subscriptions = args.streams * args.buckets;
    Ok(QuotaReport {
        streams: args.streams,
        subscriptions,
        seconds,
        reports_sent: reports,
        subscribe_us: Percentiles::of(&subscribe),
        report_to_assignment_us: Percentiles::of(&reassign),
        server_cores: cores,
        server_cpu_us_per_stream_second: cores.map(|c| c * 1e6 / args.streams.max(1) as f64),
        server_cpu_ns_per_subscription_second: cores.map(|c| c * 1e9 / subscriptions.max(1) as f64),
        server_rss_before_kib: rss_before,
        server_rss_kib: rss,
        server_rss_bytes_per_subscription: rss_before.zip(rss).map(|(before, after)| {
            (after as f64 - before as f64) * 1024.0 / subscriptions.max(1) as f64
        }),
    })
}

fn bucket_ids(args: &QuotaBenchArgs, stream: usize) -> Vec<BucketId> {
    (0..args.buckets)
        .map(|n| {
            let mut bucket = HashMap::from([("name".to_owned(), format!("b{n}"))]);
            if args.distinct_buckets {
                bucket.insert("stream".to_owned(), stream.to_string());
            }
            BucketId { bucket }
        })
        .collect()
}

struct Stream {
    index: usize,
    channel: Channel,
    domain: String,
    buckets: Vec<BucketId>,
    interval: Duration,
    duration: Duration,
    streams: usize,
}

impl Stream {
    /// Subscribes, says so on `subscribed`, waits for `started`, then reports every interval
    /// (each stream at its own phase) until the run ends.
    async fn run(
        self,
        subscribed: mpsc::Sender<()>,
        mut started: tokio::sync::watch::Receiver<Option<Instant>>,
    ) -> anyhow::Result<Measured> {
        let mut measured = Measured {
            subscribe: histogram()?,
            reassign: histogram()?,
            reports: 0,
        };
        let (reports, outgoing) = mpsc::channel(4);
        let outgoing = futures_util::stream::unfold(outgoing, |mut outgoing| async move {
            outgoing.recv().await.map(|report| (report, outgoing))
        });
        let mut client = RateLimitQuotaServiceClient::new(self.channel.clone());
        reports.send(self.report(0, Duration::ZERO)).await?;
        let sent = Instant::now();
        let mut responses = client
            .stream_rate_limit_quotas(outgoing)
            .await?
            .into_inner();
        let mut assigned = 0;
        while assigned < self.buckets.len() {
            let response = responses
                .message()
                .await?
                .ok_or_else(|| anyhow::anyhow!("the server ended a stream"))?;
            assigned += response.bucket_action.len();
        }
        measured.subscribe.record(micros(sent.elapsed()))?;
        let _ = subscribed.send(()).await;
        let begun = loop {
            if let Some(begun) = *started.borrow_and_update() {
                break begun;
            }
            started.changed().await?;
        };
        let phase = self
            .interval
            .mul_f64(self.index as f64 / self.streams.max(1) as f64);
        let mut next = tokio::time::Instant::from_std(begun) + phase;
        let end = begun + self.duration;
        let mut pending: Option<Instant> = None;
        let mut round = 0u64;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    if Instant::now() >= end {
                        return Ok(measured);
                    }
                    round += 1;
                    reports.send(self.report(round, self.interval)).await?;
                    measured.reports += 1;
                    pending = Some(Instant::now());
                    next += self.interval;
                }
                response = responses.message() => {
                    if response?.is_none() {
                        anyhow::bail!("the server ended a stream");
                    }
                    if let Some(sent) = pending.take() {
                        measured.reassign.record(micros(sent.elapsed()))?;
                    }
                }
            }
        }
    }

    /// Usage over `elapsed`: each stream's own base demand, doubled every other round for
    /// even streams, so that every bucket's split moves.
    fn report(&self, round: u64, elapsed: Duration) -> RateLimitQuotaUsageReports {
        let base = (self.index % 10 + 1) as f64;
        let factor = if self.index.is_multiple_of(2) && !round.is_multiple_of(2) {
            2.0
        } else {
            1.0
        };
        let allowed = if elapsed.is_zero() {
            1
        } else {
            (base * factor * elapsed.as_secs_f64()).round() as u64
        };
        let elapsed = ProtoDuration {
            seconds: i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(elapsed.subsec_nanos()).unwrap_or(0),
        };
        RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: self
                .buckets
                .iter()
                .map(|bucket| BucketQuotaUsage {
                    bucket_id: Some(bucket.clone()),
                    time_elapsed: Some(elapsed),
                    num_requests_allowed: allowed,
                    num_requests_denied: 0,
                })
                .collect(),
        }
    }
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 600_000_000, 3)?)
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl QuotaReport {
    pub fn render(&self) -> String {
        let ms = |us: u64| us as f64 / 1000.0;
        let (s, r) = (&self.subscribe_us, &self.report_to_assignment_us);
        let mut out = format!(
            "{} streams, {} subscriptions, {} reports over {:.1} s\nfirst report → all buckets assigned, ms: p50 {:.1} p99 {:.1} max {:.1}\nreport → next assignment, ms: p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}\n",
            self.streams,
            self.subscriptions,
            self.reports_sent,
            self.seconds,
            ms(s.p50),
            ms(s.p99),
            ms(s.max),
            ms(r.p50),
            ms(r.p90),
            ms(r.p99),
            ms(r.max),
        );
        if let (Some(cores), Some(per_stream), Some(per_sub)) = (
            self.server_cores,
            self.server_cpu_us_per_stream_second,
            self.server_cpu_ns_per_subscription_second,
        ) {
            out.push_str(&format!(
                "server CPU: {cores:.3} cores; {per_stream:.1} µs per stream-second, {per_sub:.0} ns per subscription-second\n"
            ));
        }
        if let (Some(before), Some(after), Some(per_sub)) = (
            self.server_rss_before_kib,
            self.server_rss_kib,
            self.server_rss_bytes_per_subscription,
        ) {
            out.push_str(&format!(
                "server RSS: {before} KiB before, {after} KiB with the streams; {per_sub:.0} bytes per subscription\n"
            ));
        }
        out
    }
}
