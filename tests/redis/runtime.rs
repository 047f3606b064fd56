//! `--runtime per-core`: connections dealt to several single-threaded runtimes still share
//! one store (a limit holds exactly across them, in memory and on Redis, where each runtime
//! has its own connection), and SIGTERM drains every runtime.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::redis_process::RedisServer;
use common::*;
use tollgate::pb;
use tonic::transport::Endpoint;

const LIMITS: &str = "domain: r\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// Connections the test opens, each served by the runtime it is dealt to.
const CONNECTIONS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_holds_exactly_across_connections_on_every_runtime_and_sigterm_drains_them() {
    limit_holds_across_runtimes(&[]).await.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_limit_holds_exactly_across_runtimes_with_their_own_connections() {
    let redis = RedisServer::start();
    let url = redis.url();
    let flags = [
        "--store",
        &url,
        "--store-timeout",
        "5s",
        "--redis-connections",
        "1",
    ];
    let replica = limit_holds_across_runtimes(&flags).await;
    // The shared connection, one of its own for every other runtime that served a call
    // (made in the background: waited for), and the one asking.
    let cores = std::thread::available_parallelism().unwrap().get();
    let expected = (1 + (cores.min(CONNECTIONS) - 1) + 1) as u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while redis.connected_clients() != expected && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(redis.connected_clients(), expected);
    replica.terminate().await;
}

/// Sends 60 requests for one key on each connection, the limit 100: exactly 100 pass.
async fn limit_holds_across_runtimes(store: &[&str]) -> Replica {
    let config = config_dir(&[("r.yaml", LIMITS)]);
    let flags = [&["--runtime", "per-core"], store].concat();
    let replica = Replica::spawn(config.path(), &flags);
    replica.wait_ready().await;
    let cores = std::thread::available_parallelism().unwrap().get();
    // A thread takes its name once it runs, which a loaded machine may delay past readiness.
    let runtimes = || {
        threads_of(replica.process.0.id())
            .iter()
            .filter(|name| name.starts_with("tollgate-grpc-"))
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while runtimes() != cores - 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        runtimes(),
        cores - 1,
        "serving threads besides the main one"
    );
    let ok = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let endpoint = Endpoint::from_shared(format!("http://127.0.0.1:{}", replica.grpc))
                .unwrap()
                .timeout(Duration::from_secs(10));
            let ok = Arc::clone(&ok);
            tokio::spawn(async move {
                let channel = endpoint.connect().await.unwrap();
                for _ in 0..60 {
                    let answer = pb::RateLimitServiceClient::new(channel.clone())
                        .should_rate_limit(request("r", &[&[("user", "shared")]]))
                        .await
                        .unwrap();
                    if answer.into_inner().overall_code == OK {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(ok.load(Ordering::Relaxed), 100);
    replica
}

/// The names of a process's threads.
fn threads_of(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect()
}
