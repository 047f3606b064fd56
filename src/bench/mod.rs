//! `tollgate bench`: a load generator for any RLS v3 server.
//!
//! Closed loop (default): `concurrency` tasks share `connections` HTTP/2 connections; each sends
//! its next request as soon as the previous one is answered. Open loop (`--rate N`): requests
//! start on a fixed schedule whatever the server's speed, and latency is measured from the
//! scheduled start, so a server that falls behind shows it (no coordinated omission).
//! Requests are built and encoded once, before the run, and sent as those bytes (`Encoded`),
//! so the client spends no CPU encoding while it shares the machine with the server;
//! closed-loop tasks keep their own histograms.
//! With `--server-pid`, the server's CPU time (from /proc) per decision is reported too.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::builder::BoolishValueParser;
use hdrhistogram::Histogram;
use serde::Serialize;
use tonic::client::Grpc;
use tonic::transport::Channel;

pub mod calls;
mod codec;
pub mod hostile;
pub mod raw_h2;
mod requests;
pub mod rlqs;

use codec::call;
pub use requests::{RequestShape, Requests};

use crate::client::ClientArgs;
use crate::clock::{Clock, SystemClock};
use crate::pb::rate_limit_response as rls;

/// `tollgate bench`: what to send, how hard, and for how long.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub server: ClientArgs,

    #[command(flatten)]
    pub requests: RequestShape,

    /// Requests in flight.
    #[arg(long, env = "TOLLGATE_BENCH_CONCURRENCY", default_value_t = 64)]
    pub concurrency: usize,

    /// HTTP/2 connections the requests share.
    #[arg(long, env = "TOLLGATE_BENCH_CONNECTIONS", default_value_t = 2)]
    pub connections: usize,

    /// Measured time.
    #[arg(long, env = "TOLLGATE_BENCH_DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// Unmeasured time before it.
    #[arg(long, env = "TOLLGATE_BENCH_WARMUP", default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,

    /// Open loop: start this many requests per second on schedule, whatever the server's
    /// speed (default: closed loop with --concurrency in flight).
    #[arg(long, env = "TOLLGATE_BENCH_RATE")]
    pub rate: Option<u64>,

    /// Report this server process's CPU time per decision and its resident memory (Linux).
    #[arg(long, env = "TOLLGATE_BENCH_SERVER_PID")]
    pub server_pid: Option<u32>,

    /// Print the report as JSON.
    #[arg(long, env = "TOLLGATE_BENCH_JSON", value_parser = BoolishValueParser::new())]
    pub json: bool,

    /// Write the instant each OK answer arrived (Unix µs, one per line, in order) to this
    /// file: a hot key's admissions per window are counted from it (`scripts/hot-key`).
    #[arg(long, env = "TOLLGATE_BENCH_OK_TIMES")]
    pub ok_times: Option<std::path::PathBuf>,

    /// Write the first request as the body of a gRPC call (its 5-byte message header, then
    /// the message) to this file and exit without a run: what `h2load -d` sends
    /// (`scripts/overload h2load`).
    #[arg(long, env = "TOLLGATE_BENCH_WRITE_BODY")]
    pub write_body: Option<std::path::PathBuf>,
}

/// What one run measured (after the warm-up).
#[derive(Debug, Serialize)]
pub struct Report {
    pub seconds: f64,
    pub decisions_per_second: f64,
    pub ok: u64,
    pub over_limit: u64,
    /// Refused with RESOURCE_EXHAUSTED (load shedding).
    pub shed: u64,
    /// Open loop only: scheduled but never sent, because `MAX_OUTSTANDING` calls were already
    /// waiting (the client, not the server, fell behind).
    pub unsent: u64,
    pub errors: u64,
    /// Latency of answered decisions (OK and OVER_LIMIT).
    pub latency_us: Percentiles,
    /// The first error other than shedding, if any.
    pub first_error: Option<String>,
    /// Server CPU time per answered decision, with `--server-pid`.
    pub server_cpu_us_per_decision: Option<f64>,
    /// Server resident memory at the end, with `--server-pid`.
    pub server_rss_kib: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Self {
        let at = |q| histogram.value_at_quantile(q);
        Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
            max: histogram.max(),
        }
    }
}

/// A tally of calls.
struct Tally {
    latency: Histogram<u64>,
    ok: u64,
    over_limit: u64,
    shed: u64,
    errors: u64,
    unsent: u64,
    first_error: Option<String>,
    /// With `--ok-times`: when each OK answer arrived (Unix µs).
    ok_times: Option<Vec<u64>>,
}

impl Tally {
    fn new(keep_ok_times: bool) -> Result<Self, hdrhistogram::CreationError> {
        // 1 µs to 60 s at 3 significant digits.
        Ok(Self {
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            ok: 0,
            over_limit: 0,
            shed: 0,
            errors: 0,
            unsent: 0,
            first_error: None,
            ok_times: keep_ok_times.then(Vec::new),
        })
    }

    fn record(&mut self, answer: Result<i32, tonic::Status>, took: Duration) {
        match answer {
            Ok(code) => {
                let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
                self.latency.saturating_record(micros.max(1));
                if code == rls::Code::OverLimit as i32 {
                    self.over_limit += 1;
                } else {
                    self.ok += 1;
                    if let Some(times) = &mut self.ok_times {
                        times.push(SystemClock.now());
                    }
                }
            }
            Err(status) if status.code() == tonic::Code::ResourceExhausted => self.shed += 1,
            Err(status) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(format!("{:?}: {}", status.code(), status.message()));
                }
            }
        }
    }

    fn add(&mut self, other: &Tally) -> Result<(), hdrhistogram::AdditionError> {
        self.latency.add(&other.latency)?;
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.shed += other.shed;
        self.errors += other.errors;
        self.unsent += other.unsent;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        if let (Some(times), Some(others)) = (&mut self.ok_times, &other.ok_times) {
            times.extend_from_slice(others);
        }
        Ok(())
    }
}

/// Writes the first request of `shape` to `path` as a unary gRPC call's body.
pub fn write_body(shape: &RequestShape, path: &std::path::Path) -> anyhow::Result<()> {
    let body = Requests::new(shape).grpc_body(0);
    std::fs::write(path, body)
        .map_err(|error| anyhow::anyhow!("--write-body {}: {error}", path.display()))
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<Report> {
    let requests = Arc::new(Requests::new(&args.requests));
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        let channel = args.server.endpoint()?.tcp_nodelay(true).connect().await?;
        channels.push(channel);
    }
    let measure_from = Instant::now() + args.warmup;
    let end = measure_from + args.duration;
    let cpu_probe = {
        let pid = args.server_pid;
        async move {
            tokio::time::sleep_until(measure_from.into()).await;
            pid.and_then(server_cpu_ticks)
        }
    };
    let total = match args.rate {
        None => {
            let tasks: Vec<_> = (0..args.concurrency.max(1))
                .map(|task| {
                    let channel = channels[task % channels.len()].clone();
                    let requests = Arc::clone(&requests);
                    let stride = args.concurrency.max(1);
                    let tally = Tally::new(args.ok_times.is_some());
                    tokio::spawn(closed_loop(
                        channel,
                        requests,
                        (task, stride),
                        (measure_from, end),
                        tally,
                    ))
                })
                .collect();
            let cpu_before = cpu_probe.await;
            let mut total = Tally::new(args.ok_times.is_some())?;
            for task in tasks {
                total.add(&task.await??)?;
            }
            (total, cpu_before)
        }
        Some(rate) => {
            let schedule = tokio::spawn(open_loop(
                channels,
                Arc::clone(&requests),
                rate,
                (measure_from, end),
                Tally::new(args.ok_times.is_some())?,
            ));
            let cpu_before = cpu_probe.await;
            (schedule.await??, cpu_before)
        }
    };
    let (total, cpu_before) = total;
    if let (Some(path), Some(times)) = (&args.ok_times, &total.ok_times) {
        write_times(path, times)?;
    }
    let cpu_after = args.server_pid.and_then(server_cpu_ticks);
    let seconds = args.duration.as_secs_f64();
    let answered = total.ok + total.over_limit;
    Ok(Report {
        seconds,
        decisions_per_second: answered as f64 / seconds,
        ok: total.ok,
        over_limit: total.over_limit,
        shed: total.shed,
        unsent: total.unsent,
        errors: total.errors,
        first_error: total.first_error.clone(),
        latency_us: Percentiles::of(&total.latency),
        server_cpu_us_per_decision: cpu_before.zip(cpu_after).and_then(|(before, after)| {
            (answered > 0).then(|| (after - before) as f64 * MICROS_PER_TICK / answered as f64)
        }),
        server_rss_kib: args.server_pid.and_then(server_rss_kib),
    })
}

/// The OK answers' instants, sorted, one per line.
fn write_times(path: &std::path::Path, times: &[u64]) -> anyhow::Result<()> {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    let text: String = sorted.iter().map(|time| format!("{time}\n")).collect();
    std::fs::write(path, text)
        .map_err(|error| anyhow::anyhow!("--ok-times {}: {error}", path.display()))
}

/// One closed-loop task: requests `first`, `first + stride`, … until `end`; records only
/// calls that start after `measure_from`.
async fn closed_loop(
    channel: Channel,
    requests: Arc<Requests>,
    (first, stride): (usize, usize),
    (measure_from, end): (Instant, Instant),
    tally: Result<Tally, hdrhistogram::CreationError>,
) -> anyhow::Result<Tally> {
    let mut client = Grpc::new(channel);
    let mut tally = tally?;
    let mut next = first % requests.len();
    loop {
        let started = Instant::now();
        if started >= end {
            return Ok(tally);
        }
        let answer = call(&mut client, requests.get(next)).await;
        next = (next + stride) % requests.len();
        if started >= measure_from {
            tally.record(answer, started.elapsed());
        }
    }
}

/// The open loop: `rate` requests a second on schedule, each in its own task, latency from
/// its scheduled start.
async fn open_loop(
    channels: Vec<Channel>,
    requests: Arc<Requests>,
    rate: u64,
    (measure_from, end): (Instant, Instant),
    tally: Tally,
) -> anyhow::Result<Tally> {
    let tally = Arc::new(Mutex::new(tally));
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let start = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for n in 0u64.. {
        let scheduled = start + interval.mul_f64(n as f64);
        if scheduled >= end {
            break;
        }
        tokio::time::sleep_until(scheduled.into()).await;
        // Reap finished calls as we go, so the set stays as small as what is in flight.
        while calls.try_join_next().is_some() {}
        if calls.len() >= MAX_OUTSTANDING {
            if scheduled >= measure_from {
                tally.lock().unwrap_or_else(PoisonError::into_inner).unsent += 1;
            }
            continue;
        }
        let index = usize::try_from(n).unwrap_or(0);
        let mut client = Grpc::new(channels[index % channels.len()].clone());
        let request = requests.get(index);
        let tally = Arc::clone(&tally);
        calls.spawn(async move {
            let answer = call(&mut client, request).await;
            if scheduled >= measure_from {
                tally
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .record(answer, scheduled.elapsed());
            }
        });
    }
    while calls.join_next().await.is_some() {}
    let tally = Arc::try_unwrap(tally)
        .map_err(|_| anyhow::anyhow!("open-loop calls still running"))?
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    Ok(tally)
}

/// Open-loop calls waiting at once, beyond which the client counts a call as unsent rather
/// than grow without bound.
const MAX_OUTSTANDING: usize = 20_000;

/// Linux reports CPU time in clock ticks of 1/100 s (USER_HZ is 100 on every Linux ABI).
pub(crate) const MICROS_PER_TICK: f64 = 10_000.0;

/// utime + stime of `pid`, in clock ticks, from /proc/<pid>/stat.
pub(crate) fn server_cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS of `pid`, in KiB.
pub fn server_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

impl Report {
    pub fn render(&self) -> String {
        let l = &self.latency_us;
        let mut out = format!(
            "{:.0} decisions/s over {:.1} s: {} OK, {} OVER_LIMIT, {} shed, {} errors, {} unsent\nlatency µs: p50 {} p90 {} p99 {} p99.9 {} max {}\n",
            self.decisions_per_second,
            self.seconds,
            self.ok,
            self.over_limit,
            self.shed,
            self.errors,
            self.unsent,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max
        );
        if let Some(cpu) = self.server_cpu_us_per_decision {
            out.push_str(&format!("server CPU: {cpu:.1} µs per decision\n"));
        }
        if let Some(rss) = self.server_rss_kib {
            out.push_str(&format!("server RSS: {rss} KiB\n"));
        }
        out
    }
}
