//! `tollgate bench`: a closed-loop load generator for any RLS v3 server. `concurrency` tasks
//! share `connections` HTTP/2 connections; each sends its next request as soon as the
//! previous one is answered. Requests are built once, before the run, and each task records
//! latencies in its own histogram, so the client spends its CPU on gRPC, not on itself.

use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use crate::cli::BenchArgs;
use crate::pb::{self, rate_limit_descriptor as desc, rate_limit_response as rls};

/// What one run measured (after the warm-up).
#[derive(Debug, Serialize)]
pub struct Report {
    pub seconds: f64,
    pub decisions_per_second: f64,
    pub ok: u64,
    pub over_limit: u64,
    pub errors: u64,
    pub latency_us: Percentiles,
}

#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

/// One task's tally.
struct Tally {
    latency: Histogram<u64>,
    ok: u64,
    over_limit: u64,
    errors: u64,
}

impl Tally {
    fn new() -> Result<Self, hdrhistogram::CreationError> {
        // 1 µs to 60 s at 3 significant digits.
        Ok(Self {
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            ok: 0,
            over_limit: 0,
            errors: 0,
        })
    }
}

/// The requests a run cycles through: one per distinct value, each with `descriptors`
/// descriptors on `key` (values `<n>` or `<n>-<j>`, so every descriptor has its own counter).
pub fn requests(args: &BenchArgs) -> Vec<pb::RateLimitRequest> {
    (0..args.values.max(1))
        .map(|value| pb::RateLimitRequest {
            domain: args.domain.clone(),
            descriptors: (0..args.descriptors.max(1))
                .map(|j| pb::RateLimitDescriptor {
                    entries: vec![desc::Entry {
                        key: args.key.clone(),
                        value: if args.descriptors > 1 {
                            format!("{value}-{j}")
                        } else {
                            value.to_string()
                        },
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: args.hits,
        })
        .collect()
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<Report> {
    let requests = std::sync::Arc::new(requests(args));
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        let channel = Endpoint::from_shared(args.addr.clone())?
            .tcp_nodelay(true)
            .connect()
            .await?;
        channels.push(channel);
    }
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let tasks: Vec<_> = (0..args.concurrency.max(1))
        .map(|task| {
            let channel = channels[task % channels.len()].clone();
            let requests = std::sync::Arc::clone(&requests);
            let stride = args.concurrency.max(1);
            tokio::spawn(drive(channel, requests, task, stride, measure_from, end))
        })
        .collect();
    let mut total = Tally::new()?;
    for task in tasks {
        let tally = task.await??;
        total.latency.add(&tally.latency)?;
        total.ok += tally.ok;
        total.over_limit += tally.over_limit;
        total.errors += tally.errors;
    }
    let seconds = args.duration.as_secs_f64();
    let answered = total.ok + total.over_limit + total.errors;
    let at = |q: f64| total.latency.value_at_quantile(q);
    Ok(Report {
        seconds,
        decisions_per_second: answered as f64 / seconds,
        ok: total.ok,
        over_limit: total.over_limit,
        errors: total.errors,
        latency_us: Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
            max: total.latency.max(),
        },
    })
}

/// One closed-loop task: requests `first`, `first + stride`, … until `end`; records only
/// calls that start after `measure_from`.
async fn drive(
    channel: Channel,
    requests: std::sync::Arc<Vec<pb::RateLimitRequest>>,
    first: usize,
    stride: usize,
    measure_from: Instant,
    end: Instant,
) -> anyhow::Result<Tally> {
    let mut client = pb::RateLimitServiceClient::new(channel);
    let mut tally = Tally::new()?;
    let mut next = first % requests.len();
    loop {
        let started = Instant::now();
        if started >= end {
            return Ok(tally);
        }
        let answer = client.should_rate_limit(requests[next].clone()).await;
        next = (next + stride) % requests.len();
        if started < measure_from {
            continue;
        }
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        tally.latency.saturating_record(micros.max(1));
        match answer.map(|response| response.into_inner().overall_code) {
            Ok(code) if code == rls::Code::OverLimit as i32 => tally.over_limit += 1,
            Ok(_) => tally.ok += 1,
            Err(_) => tally.errors += 1,
        }
    }
}

impl Report {
    pub fn render(&self) -> String {
        let l = &self.latency_us;
        format!(
            "{:.0} decisions/s over {:.1} s: {} OK, {} OVER_LIMIT, {} errors\nlatency µs: p50 {} p90 {} p99 {} p99.9 {} max {}\n",
            self.decisions_per_second,
            self.seconds,
            self.ok,
            self.over_limit,
            self.errors,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max
        )
    }
}
