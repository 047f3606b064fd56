//! Failovers that no sentinel announces, and a Redis that stops answering: a master demoted
//! behind an address repointed at the new master (DNS, a Service, a managed Redis endpoint),
//! which keeps answering READONLY on the open connections, is left for fresh connections
//! within seconds, and readiness says so meanwhile; a Redis that stalls is answered within the
//! store timeout even when the reference's REDIS_TIMEOUT says 10 s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::redis_process::RedisServer;
use common::*;
use tollgate::pb::RateLimitServiceClient;
use tonic::transport::Channel;

const LIMITS: &str = r#"
domain: failover
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000}
"#;

fn user() -> tollgate::pb::RateLimitRequest {
    request("failover", &[&[("user", "a")]])
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("tollgate.log")).unwrap_or_default()
}

/// Calls until one is answered, for up to `within`: how long it took, and the remaining
/// count it answered.
async fn first_answer(
    client: &mut RateLimitServiceClient<Channel>,
    within: Duration,
) -> Option<(Duration, u32)> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Ok(answer) = client.should_rate_limit(user()).await {
            return Some((
                started.elapsed(),
                answer.into_inner().statuses[0].limit_remaining,
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Polls `/readyz` until it is `ready` or `within` passes; whether it was.
async fn readiness_becomes(tollgate: &Replica, ready: bool, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if tollgate.ready().await == ready {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A (the master) replicated by B, tollgate reaching A through the proxy; then B promoted, A
/// made B's replica, and the proxy, three seconds later, repointed at B.
async fn failover_by_address(extra: &[&str]) {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    b.replicate(&a);
    let proxy = Proxy::start(a.addr()).await;
    let dir = config_dir(&[("failover.yaml", LIMITS)]);
    let store = format!("redis://{}", proxy.addr);
    let mut flags = vec!["--store", &store, "--store-timeout", "200ms"];
    flags.extend_from_slice(extra);
    let tollgate = Replica::spawn_logged(dir.path(), &flags, &dir.path().join("tollgate.log"));
    tollgate.wait_ready().await;
    let mut client = tollgate.client().await;
    for remaining in (995..1000).rev() {
        let answer = client.should_rate_limit(user()).await.unwrap().into_inner();
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
    }
    assert_eq!(a.query(&["WAIT", "1", "5000"]), "1", "B holds every count");

    b.query(&["REPLICAOF", "NO", "ONE"]);
    a.query(&["REPLICAOF", "127.0.0.1", &b.port.to_string()]);
    let failing = Instant::now();
    let mut failed = false;
    while !failed && failing.elapsed() < Duration::from_secs(3) {
        failed = client.should_rate_limit(user()).await.is_err();
    }
    assert!(
        failed,
        "a demoted master's READONLY answers must fail calls:\n{}",
        log_of(dir.path())
    );
    assert!(
        readiness_becomes(&tollgate, false, Duration::from_secs(3)).await,
        "/readyz must say not ready while every call fails:\n{}",
        log_of(dir.path())
    );
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(failing.elapsed())).await;

    proxy.point_at(b.addr());
    let resumed = first_answer(&mut client, Duration::from_secs(10)).await;
    let Some((took, remaining)) = resumed else {
        panic!(
            "decisions never resumed after the repoint:\n{}",
            log_of(dir.path())
        );
    };
    assert!(
        took < Duration::from_secs(5),
        "decisions resumed {took:?} after the repoint:\n{}",
        log_of(dir.path())
    );
    // The counter carried over with the data B replicated: no decision was lost, and the
    // refused ones consumed nothing.
    assert_eq!(remaining, 994);
    assert!(
        readiness_becomes(&tollgate, true, Duration::from_secs(5)).await,
        "/readyz must come back:\n{}",
        log_of(dir.path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_demoted_behind_a_repointed_address_is_left_for_the_new_master() {
    failover_by_address(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reconnect_on_readonly_failing_calls_still_lead_to_fresh_connections() {
    failover_by_address(&["--redis-reconnect-on-readonly=false"]).await;
}

/// `dir/ratelimit`, a link to the tollgate binary, as the image's /bin/ratelimit.
fn ratelimit_link(dir: &Path) -> std::path::PathBuf {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), &link).unwrap();
    link
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_is_answered_within_the_store_timeout_though_redis_timeout_says_ten_seconds()
 {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("data/ratelimit/config");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("failover.yaml"), LIMITS).unwrap();
    let (grpc, http) = (free_port(), free_port());
    let log = std::fs::File::create(dir.path().join("tollgate.log")).unwrap();
    let child = std::process::Command::new(ratelimit_link(dir.path()))
        .env_clear()
        .envs([
            ("HOST", "127.0.0.1".to_owned()),
            ("PORT", http.to_string()),
            ("GRPC_HOST", "127.0.0.1".to_owned()),
            ("GRPC_PORT", grpc.to_string()),
            ("DEBUG_HOST", "127.0.0.1".to_owned()),
            ("DEBUG_PORT", "0".to_owned()),
            ("USE_STATSD", "false".to_owned()),
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("REDIS_TIMEOUT", "10s".to_owned()),
            (
                "RUNTIME_ROOT",
                dir.path().join("data").display().to_string(),
            ),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
            ("RUNTIME_WATCH_ROOT", "false".to_owned()),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let tollgate = Replica {
        grpc,
        http,
        process: ChildGuard(child),
    };
    tollgate.wait_ready().await;
    // No deadline: the client sends no grpc-timeout, as Envoy with `timeout: 0s`.
    let mut client = tollgate.client().await;
    let answer = client.should_rate_limit(user()).await.unwrap().into_inner();
    assert_eq!(answer.statuses[0].limit_remaining, 999);

    redis.pause();
    let mut took = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let answer = client.should_rate_limit(user()).await;
        took.push(started.elapsed());
        assert_eq!(
            answer.map(drop).map_err(|status| status.code()),
            Err(tonic::Code::Unavailable),
            "the store-error policy answers"
        );
    }
    redis.resume();
    // 50 ms (--store-timeout's default) and what a loaded machine adds; 10 s would be the
    // reference's dial timeout taken for a call bound.
    let slowest = took.iter().max().copied().unwrap_or_default();
    assert!(
        slowest < Duration::from_millis(50) + Duration::from_millis(450),
        "answers took {took:?}:\n{}",
        log_of(dir.path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_stop_answering_are_made_again_while_readiness_says_not_ready() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.addr()).await;
    let dir = config_dir(&[("failover.yaml", LIMITS)]);
    let store = format!("redis://{}", proxy.addr);
    let flags = [
        "--store",
        &store,
        "--store-timeout",
        "200ms",
        "--redis-connections",
        "2",
    ];
    let tollgate = Replica::spawn_logged(dir.path(), &flags, &dir.path().join("tollgate.log"));
    tollgate.wait_ready().await;
    let mut client = tollgate.client().await;
    for remaining in (997..1000).rev() {
        let answer = client.should_rate_limit(user()).await.unwrap().into_inner();
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
    }

    // Open and silent: redis-rs sees no error, only calls that time out.
    proxy.stall_open();
    let stalled = Instant::now();
    assert!(client.should_rate_limit(user()).await.is_err());
    assert!(
        readiness_becomes(&tollgate, false, Duration::from_secs(4)).await,
        "/readyz must say not ready while every call fails:\n{}",
        log_of(dir.path())
    );
    let Some((_, remaining)) = first_answer(&mut client, Duration::from_secs(10)).await else {
        panic!("decisions never resumed:\n{}", log_of(dir.path()));
    };
    let took = stalled.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "decisions resumed {took:?} after the connections stalled:\n{}",
        log_of(dir.path())
    );
    // A call that timed out may have counted, never one that was not sent.
    assert!((995..=996).contains(&remaining), "remaining {remaining}");
    assert!(readiness_becomes(&tollgate, true, Duration::from_secs(5)).await);
}
