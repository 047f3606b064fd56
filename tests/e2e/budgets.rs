//! Token budgets and concurrency through a real Envoy running deploy/budgets/envoy.yaml (only
//! its ports changed), whose stand-in model server reports the tokens each response spent as
//! dynamic metadata, as Envoy AI Gateway's ext_proc does: usage charged when a stream ends
//! counts in full on every store, in tollgate's own mode and in the reference's, with the
//! deny cache and with leases; reserve-and-settle stays within its stated bound where
//! charging after overshoots; a stream refused gives nothing back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::envoy::*;
use common::redis_process::{RedisCluster, RedisServer};
use common::rng::Rng;
use common::*;
use tollgate::pb::{self, rate_limit_response as rls};

/// The ports deploy/budgets/envoy.yaml uses: ingress, the model server, admin, tollgate.
const FILE_PORTS: [u16; 4] = [10000, 10080, 9901, 8081];

/// The hourly budget of deploy/budgets/config/ai.yaml.
const BUDGET: u32 = 10_000;

/// deploy/budgets/envoy.yaml on free ports, asking tollgate on `grpc`: its ingress port.
async fn start_envoy_for(dir: &Path, grpc: u16) -> (ChildGuard, u16) {
    let mut text = std::fs::read_to_string("deploy/budgets/envoy.yaml").unwrap();
    let (ingress, models, admin) = (free_port(), free_port(), free_port());
    for (old, new) in FILE_PORTS.iter().zip([ingress, models, admin, grpc]) {
        let from = format!("port_value: {old}}}");
        assert!(text.contains(&from), "deploy/budgets/envoy.yaml uses {old}");
        text = text.replace(&from, &format!("port_value: {new}}}"));
    }
    let config = dir.join("envoy.yaml");
    std::fs::write(&config, text).unwrap();
    (run_envoy(&config, admin).await, ingress)
}

/// One request through Envoy, and its status.
async fn send(ingress: u16, path: &str, tenant: &str, headers: &[(&str, &str)]) -> u16 {
    let mut all = vec![("x-tenant", tenant)];
    all.extend_from_slice(headers);
    get(loopback(ingress), path, &all).await.status
}

/// A descriptor of deploy/budgets/config/ai.yaml: the budget `kind`, the tenant.
fn budget(kind: &str, tenant: &str, hits: u64, refund: bool) -> pb::RateLimitRequest {
    let mut request = request("ai", &[&[("budget", kind), ("tenant", tenant)]]);
    request.descriptors[0].hits_addend = Some(hits);
    request.descriptors[0].is_negative_hits = refund;
    request
}

/// What is left of `tenant`'s `kind` budget, asked check-only, and whether it is over.
async fn left(grpc: u16, kind: &str, tenant: &str) -> (u32, bool) {
    let mut client =
        tollgate::pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
            .await
            .unwrap();
    let response = client
        .should_rate_limit(budget(kind, tenant, 0, false))
        .await
        .unwrap()
        .into_inner();
    let status = &response.statuses[0];
    (
        status.limit_remaining,
        status.code == rls::Code::OverLimit as i32,
    )
}

/// Gives `hits` back to `tenant`'s `kind` budget, as Envoy's refund does.
async fn give_back(grpc: u16, kind: &str, tenant: &str, hits: u64) {
    ask(grpc, budget(kind, tenant, hits, true)).await;
}

/// Charges `hits` to `tenant`'s `kind` budget, as Envoy does when a stream ends.
async fn charge(grpc: u16, kind: &str, tenant: &str, hits: u64) {
    ask(grpc, budget(kind, tenant, hits, false)).await;
}

async fn ask(grpc: u16, request: pb::RateLimitRequest) -> pb::RateLimitResponse {
    let mut client =
        tollgate::pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
            .await
            .unwrap();
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

/// Waits (up to 20 s) until `tenant`'s `kind` budget has `expected` left: Envoy sends what a
/// stream spent once it ends, without waiting for the answer.
async fn settled(grpc: u16, kind: &str, tenant: &str, expected: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (left, _) = left(grpc, kind, tenant).await;
        if left == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{tenant}: {left} left of the {kind} budget, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Envoy Gateway's pattern on `/charge-after`: a check on the request, the tokens spent
/// charged when the stream ends. Every token is counted, the response that crosses the budget
/// is counted in full, and the next request is refused; streams that were in flight then and
/// end later are counted too, whoever answers them (the deny cache defers them to the store).
/// The count is read back exactly: the budget is 1,100 past the limit, so giving back 1,100
/// leaves it used up, and one more frees one.
async fn usage_counts_in_full(ingress: u16, grpc: u16, tenant: &str) {
    away_from_the_hour_boundary().await;
    // 9,300 tokens in 14 responses.
    let mut spent = 0;
    for usage in [
        700, 650, 800, 600, 750, 700, 600, 650, 700, 600, 650, 700, 550, 650,
    ] {
        let usage = usage.to_string();
        let status = send(ingress, "/charge-after", tenant, &[("x-usage", &usage)]).await;
        assert_eq!(status, 200, "{tenant}: {spent} tokens spent so far");
        spent += usage.parse::<u32>().unwrap();
    }
    assert_eq!(spent, 9_300);
    settled(grpc, "tokens", tenant, BUDGET - spent).await;
    // 700 left: the request is admitted, and its 1,500 tokens cross the budget.
    let status = send(ingress, "/charge-after", tenant, &[("x-usage", "1500")]).await;
    assert_eq!(status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !left(grpc, "tokens", tenant).await.1 {
        assert!(
            Instant::now() < deadline,
            "{tenant}: the crossing usage never counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..3 {
        let status = send(ingress, "/charge-after", tenant, &[("x-usage", "10")]).await;
        assert_eq!(status, 429, "{tenant}: over the budget");
    }
    // Three streams admitted before the crossing end now, as Envoy reports them.
    for _ in 0..3 {
        charge(grpc, "tokens", tenant, 100).await;
    }
    // The deny cache counts what it answered within 25 ms; a second is plenty.
    tokio::time::sleep(Duration::from_secs(1)).await;
    give_back(grpc, "tokens", tenant, 1_100).await;
    assert_eq!(
        left(grpc, "tokens", tenant).await,
        (0, true),
        "{tenant}: 10,000 counted"
    );
    give_back(grpc, "tokens", tenant, 1).await;
    assert_eq!(
        left(grpc, "tokens", tenant).await,
        (1, false),
        "{tenant}: 9,999 counted"
    );
}

/// The rules of deploy/budgets/config, as the reference's environment mounts them
/// (RUNTIME_ROOT/ratelimit/config), without `charges`: the reference's mode counts every
/// charge by default.
fn reference_root(dir: &Path) -> PathBuf {
    let root = dir.join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    let rules = std::fs::read_to_string("deploy/budgets/config/ai.yaml").unwrap();
    let without = rules.replace("          charges: usage\n", "");
    assert_ne!(without, rules, "the charge-after rule says charges: usage");
    std::fs::write(config.join("ai.yaml"), without).unwrap();
    root
}

/// How a run starts tollgate.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// `tollgate serve` with deploy/budgets/config, whose charge-after rule says `charges:
    /// usage`.
    Native,
    /// `tollgate serve --env reference` with the rules without `charges`.
    Reference,
}

/// How a run counts in Redis: through the deny cache (on by default), or with leases too.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Speed {
    DenyCache,
    Leases,
}

/// A tollgate process, its gRPC port and its admin address.
struct Running {
    _process: ChildGuard,
    grpc: u16,
    http: std::net::SocketAddr,
}

/// Starts tollgate on `store` (a `--store` URL; the reference's variables are worked out from
/// it) in `mode`; answers once ready.
async fn start_tollgate(dir: &Path, store: &str, mode: Mode, speed: Speed) -> Running {
    let (grpc, http) = (free_port(), free_port());
    let leasing = speed == Speed::Leases;
    let process = match mode {
        Mode::Native => {
            let mut flags = vec!["--store", store];
            if leasing {
                flags.extend(["--lease", "auto", "--lease-busy-rate", "5"]);
            }
            spawn_serve_with(Path::new("deploy/budgets/config"), grpc, http, &flags)
        }
        Mode::Reference => {
            let mut env = vec![("LOCAL_CACHE_SIZE_IN_BYTES", "1000000".to_owned())];
            env.extend(reference_store(store));
            if leasing {
                env.extend([
                    ("TOLLGATE_LEASE", "auto".to_owned()),
                    ("TOLLGATE_LEASE_BUSY_RATE", "5".to_owned()),
                ]);
            }
            let memory: &[&str] = if store == "memory" {
                &["--store", "memory"]
            } else {
                &[]
            };
            spawn_reference_with(&reference_root(dir), grpc, http, &env, memory)
        }
    };
    let http = loopback(http);
    let deadline = Instant::now() + Duration::from_secs(60);
    while readyz_status(http).await != Some(200) {
        assert!(Instant::now() < deadline, "{mode:?} on {store} never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Running {
        _process: process,
        grpc,
        http,
    }
}

/// The sum of a counter's series on a replica's /metrics.
async fn metric(http: std::net::SocketAddr, name: &str) -> f64 {
    let body = get(http, "/metrics", &[]).await.body;
    body.lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The reference's variables for a `--store` URL.
fn reference_store(store: &str) -> Vec<(&'static str, String)> {
    if let Some(nodes) = store.strip_prefix("redis-cluster://") {
        return vec![
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_TYPE", "cluster".to_owned()),
            ("REDIS_URL", nodes.to_owned()),
        ];
    }
    match store.strip_prefix("redis://") {
        Some(address) => vec![
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", address.to_owned()),
        ],
        None => Vec::new(),
    }
}

/// Runs the charge-after scenario on `store` in each mode and speed, each with a tenant of
/// its own, through an Envoy of its own.
async fn usage_counts_on(store: &str, speeds: &[Speed]) {
    for mode in [Mode::Native, Mode::Reference] {
        for &speed in speeds {
            let dir = tempfile::tempdir().unwrap();
            let tollgate = start_tollgate(dir.path(), store, mode, speed).await;
            let (_envoy, ingress) = start_envoy_for(dir.path(), tollgate.grpc).await;
            let tenant = format!("{mode:?}-{speed:?}").to_lowercase();
            usage_counts_in_full(ingress, tollgate.grpc, &tenant).await;
            if store == "memory" {
                continue;
            }
            // Each way of going faster did its part.
            let (leased, deferred) = (
                metric(tollgate.http, "tollgate_lease_leased_hits_total").await,
                metric(tollgate.http, "tollgate_deferred_hits_total").await,
            );
            assert!(deferred >= 200.0, "{tenant}: {deferred} deferred hits");
            if speed == Speed::Leases {
                assert!(leased > 0.0, "{tenant}: nothing leased");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reported_when_a_stream_ends_counts_in_full_on_the_memory_store() {
    usage_counts_on("memory", &[Speed::DenyCache]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reported_when_a_stream_ends_counts_in_full_on_redis_with_the_deny_cache_and_leases()
{
    let redis = RedisServer::start();
    usage_counts_on(&redis.url(), &[Speed::DenyCache, Speed::Leases]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reported_when_a_stream_ends_counts_in_full_on_a_cluster_with_the_deny_cache_and_leases()
 {
    let cluster = RedisCluster::start(3, 0);
    usage_counts_on(&cluster.url(), &[Speed::DenyCache, Speed::Leases]).await;
}

/// One stream of the budget runs: the tokens it spends, and whether Envoy admitted it.
struct Stream {
    usage: u64,
    admitted: bool,
}

/// The streams' estimate (x-max-tokens), and the range their usage is drawn from, around it.
const ESTIMATE: u64 = 400;
const USAGE: std::ops::Range<u64> = 200..601;

/// 150 streams on `path`, 50 in flight at a time, each spending a usage drawn from `USAGE`
/// (seeded) and lasting 100 to 300 ms.
async fn streams(ingress: u16, path: &'static str, tenant: &str, seed: u64) -> Vec<Stream> {
    let mut rng = Rng(seed);
    let drawn: Vec<(u64, u64)> = (0..150)
        .map(|_| {
            let usage = USAGE.start + rng.below(USAGE.end - USAGE.start);
            (usage, 100 + rng.below(201))
        })
        .collect();
    let mut workers = Vec::new();
    for chunk in drawn.chunks(3) {
        let (chunk, tenant) = (chunk.to_vec(), tenant.to_owned());
        workers.push(tokio::spawn(async move {
            let mut streams = Vec::new();
            for (usage, delay) in chunk {
                let (usage_text, delay_text) = (usage.to_string(), delay.to_string());
                let estimate = ESTIMATE.to_string();
                let headers = [
                    ("x-usage", usage_text.as_str()),
                    ("x-max-tokens", estimate.as_str()),
                    ("x-envoy-fault-delay-request", delay_text.as_str()),
                ];
                let status = send(ingress, path, &tenant, &headers).await;
                assert!(status == 200 || status == 429, "{path}: {status}");
                streams.push(Stream {
                    usage,
                    admitted: status == 200,
                });
            }
            streams
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    all
}

/// Reserve and settle against charging after, on the same draws: 50 streams in flight at
/// once against a budget of 10,000 tokens, usage drawn around the estimate. Reserving keeps
/// the tokens admitted streams spend within the budget and what those that spent more than
/// their estimate spent beyond it; charging after admits every stream while the budget is
/// not yet used up, whatever is in flight. Prints the row of docs/budgets.md's table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserving_keeps_a_budget_within_its_bound_where_charging_after_overshoots() {
    let dir = tempfile::tempdir().unwrap();
    let tollgate = start_tollgate(dir.path(), "memory", Mode::Native, Speed::DenyCache).await;
    let grpc = tollgate.grpc;
    let (_envoy, ingress) = start_envoy_for(dir.path(), grpc).await;
    for seed in [1, 2, 3] {
        away_from_the_hour_boundary().await;
        let reserved = streams(ingress, "/reserve", &format!("reserve-{seed}"), seed).await;
        let after = streams(ingress, "/charge-after", &format!("after-{seed}"), seed).await;
        let spent = |streams: &[Stream]| -> u64 {
            streams.iter().filter(|s| s.admitted).map(|s| s.usage).sum()
        };
        let admitted = |streams: &[Stream]| streams.iter().filter(|s| s.admitted).count();
        // The stated bound: the budget, and what admitted streams spent past their estimate.
        let beyond: u64 = reserved
            .iter()
            .filter(|s| s.admitted)
            .map(|s| s.usage.saturating_sub(ESTIMATE))
            .sum();
        let bound = u64::from(BUDGET) + beyond;
        println!(
            "seed {seed}: reserve-and-settle admitted {} of 150, {} tokens (bound {bound}); charge-after admitted {} of 150, {} tokens",
            admitted(&reserved),
            spent(&reserved),
            admitted(&after),
            spent(&after)
        );
        assert!(
            spent(&reserved) <= bound,
            "reserve-and-settle spent {} over its bound {bound}",
            spent(&reserved)
        );
        assert!(admitted(&reserved) < 150, "the budget ran out");
        assert!(
            spent(&after) > u64::from(BUDGET) + 5_000,
            "charging after overshoots with 50 streams in flight: {}",
            spent(&after)
        );
        // Every settlement counted: what is left is the budget less what was spent.
        let left = u64::from(BUDGET).saturating_sub(spent(&reserved)) as u32;
        settled(grpc, "reserved", &format!("reserve-{seed}"), left).await;
    }
}

/// A concurrency limit of 4 through Envoy: four streams in flight hold it; the streams it
/// refuses end at once and give nothing back (their answer reserved nothing), so a fifth is
/// still refused while the four run; once they end, all four holds are free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_gives_nothing_back_and_the_holds_free_when_streams_end() {
    let dir = tempfile::tempdir().unwrap();
    let tollgate = start_tollgate(dir.path(), "memory", Mode::Native, Speed::DenyCache).await;
    let grpc = tollgate.grpc;
    let (_envoy, ingress) = start_envoy_for(dir.path(), grpc).await;
    let long = [("x-envoy-fault-delay-request", "3000")];
    let holders: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { send(ingress, "/concurrency", "acme", &long).await }))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while left(grpc, "in_flight", "acme").await != (0, true) {
        assert!(
            Instant::now() < deadline,
            "the four streams never held the limit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..3 {
        assert_eq!(send(ingress, "/concurrency", "acme", &[]).await, 429);
    }
    // The refused streams have ended; had they given back a hold, one would be free.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(left(grpc, "in_flight", "acme").await, (0, true));
    assert_eq!(send(ingress, "/concurrency", "acme", &[]).await, 429);
    for holder in holders {
        assert_eq!(holder.await.unwrap(), 200);
    }
    settled(grpc, "in_flight", "acme", 4).await;
    assert_eq!(send(ingress, "/concurrency", "acme", &[]).await, 200);
}
