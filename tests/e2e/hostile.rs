//! Hostile clients at the scale of the attacks they are measured against (`scripts/hostile`),
//! as `tollgate bench-hostile` processes against a `tollgate serve` on its defaults: ten
//! thousand HTTP/2 connections held open with PINGs and never used, and a thousand
//! Slowloris requests on the admin port. A new client must still be answered, and the probes
//! within their bound.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::rlqs::metric;
use common::*;

const RULES: &str = "domain: h\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";

/// Open files each process may hold: ten thousand connections and what else it has open.
const FILES: u32 = 12_000;

/// `tollgate <args>` with the soft file limit raised to `FILES` (within the hard limit, which
/// needs no privilege), stderr to `log`.
fn tollgate_with_files(args: &[&str], log: &Path) -> ChildGuard {
    tollgate_limited(args, log, "")
}

/// `tollgate_with_files`, with more limits (`&& ulimit -d 614400`: 600 MiB of data).
fn tollgate_limited(args: &[&str], log: &Path, more_limits: &str) -> ChildGuard {
    let hard: u32 = std::fs::read_to_string("/proc/self/limits")
        .unwrap()
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .and_then(|line| line.split_whitespace().nth(4)?.parse().ok())
        .unwrap_or(u32::MAX);
    assert!(
        hard >= FILES,
        "this test needs {FILES} open files a process; the hard limit here is {hard}"
    );
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new("sh")
        .args([
            "-c",
            &format!("ulimit -n {FILES} {more_limits} && exec \"$0\" \"$@\""),
        ])
        .arg(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    ChildGuard(child)
}

/// `tollgate serve` on the rules above with its defaults, and its gRPC and HTTP addresses.
async fn serve(dir: &Path) -> (ChildGuard, SocketAddr, SocketAddr) {
    serve_limited(dir, "").await
}

/// `serve` under more limits (as `tollgate_limited` takes them).
async fn serve_limited(dir: &Path, more_limits: &str) -> (ChildGuard, SocketAddr, SocketAddr) {
    let (grpc, http) = (free_port(), free_port());
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("h.yaml"), RULES).unwrap();
    let server = tollgate_limited(
        &[
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--log-level",
            "warn",
        ],
        &dir.join("server.log"),
        more_limits,
    );
    let http = SocketAddr::from(([127, 0, 0, 1], http));
    let deadline = Instant::now() + Duration::from_secs(30);
    while readyz_status(http).await != Some(200) {
        assert!(Instant::now() < deadline, "tollgate never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (server, SocketAddr::from(([127, 0, 0, 1], grpc)), http)
}

/// `tollgate bench-hostile` with `attack` on `target`, connections opened again when closed.
fn attack(dir: &Path, target: SocketAddr, attack: &str, connections: usize) -> ChildGuard {
    attack_with(dir, target, attack, connections, &[])
}

/// `attack` with more of bench-hostile's flags.
fn attack_with(
    dir: &Path,
    target: SocketAddr,
    attack: &str,
    connections: usize,
    more: &[&str],
) -> ChildGuard {
    let connections = connections.to_string();
    let target = target.to_string();
    let mut args = vec![
        "bench-hostile",
        "--target",
        &target,
        "--attack",
        attack,
        "--connections",
        &connections,
        "--duration",
        "300s",
        "--reconnect",
    ];
    args.extend_from_slice(more);
    tollgate_with_files(&args, &dir.join(format!("{attack}.log")))
}

/// A process's virtual memory (`VmSize`), in KiB; `None` once it has exited.
fn virtual_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("VmSize:"))
        .and_then(|size| size.trim().trim_end_matches(" kB").parse().ok())
}

/// Waits (up to 120 s) until `listener` holds `count` connections.
async fn holding(http: SocketAddr, listener: &str, count: f64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let open = metric(
            http,
            "tollgate_connections",
            &format!("listener=\"{listener}\""),
        )
        .await;
        if open >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the attack never held {count} connections: {open}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_http2_connections_kept_alive_by_pings_leave_room_for_a_new_client() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, grpc, http) = serve(dir.path()).await;
    let _attack = attack(dir.path(), grpc, "idle-h2", 10_000);
    // The default --grpc-max-connections: the listener is full.
    holding(http, "grpc", 10_000.0).await;
    // Past `ROOM_AFTER` without a request, every attacking connection may be closed for room.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for user in ["alice", "bob", "carol"] {
        let started = Instant::now();
        let answered = async {
            let mut client =
                tollgate::pb::RateLimitServiceClient::connect(format!("http://{grpc}"))
                    .await
                    .unwrap();
            client
                .should_rate_limit(request("h", &[&[("user", user)]]))
                .await
                .unwrap()
                .into_inner()
                .overall_code
        };
        let code = tokio::time::timeout(Duration::from_secs(5), answered)
            .await
            .expect("a new client is answered");
        let took = started.elapsed();
        assert_eq!(code, 1);
        assert!(
            took < Duration::from_secs(1),
            "{user} was answered after {took:?}"
        );
        assert_eq!(readyz_status(http).await, Some(200));
    }
    let room = metric(http, "tollgate_connections_closed_total", "reason=\"room\"").await;
    assert!(room >= 3.0, "closed to make room: {room}");
    assert_eq!(
        metric(
            http,
            "tollgate_connections_closed_total",
            "reason=\"limit\""
        )
        .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slowloris_clients_on_the_admin_port_leave_the_probes_answered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, _grpc, http) = serve(dir.path()).await;
    let _attack = attack(dir.path(), http, "slowloris", 1_000);
    // The default --http-max-connections (the probes' own connections come and go).
    holding(http, "http", 999.0).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut slowest = Duration::ZERO;
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        for path in ["/healthz", "/readyz"] {
            let started = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(5), get(http, path, &[]))
                .await
                .expect("the probe is answered");
            slowest = slowest.max(started.elapsed());
            assert_eq!(answer.status, 200, "{path}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        slowest < Duration::from_millis(100),
        "the slowest probe took {slowest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_declared_large_and_never_sent_cost_at_most_the_read_budget() {
    const BUDGET_KIB: u64 = 64 * 1024;
    let dir = tempfile::tempdir().unwrap();
    // 600 MiB of data: 512 messages of a declared MiB each would not fit if declaring were
    // enough to have room made for them.
    let (server, grpc, http) = serve_limited(dir.path(), "&& ulimit -d 614400").await;
    let pid = server.0.id();
    let alive = |pid| virtual_kib(pid).expect("tollgate died under the attack");
    let before = alive(pid);
    let _attack = attack_with(
        dir.path(),
        grpc,
        "slow-body",
        2,
        &["--streams", "256", "--bytes", "0", "--declares", "1048576"],
    );
    let mut peak = before;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        peak = peak.max(alive(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut client = tollgate::pb::RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let answer = client
        .should_rate_limit(request("h", &[&[("user", "alice")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, 1, "the process lives and answers");
    assert_eq!(readyz_status(http).await, Some(200));
    let grown = peak.saturating_sub(before);
    eprintln!("virtual memory {before} KiB, peak {peak} KiB: grew {grown} KiB");
    assert!(
        grown <= BUDGET_KIB,
        "virtual memory grew {grown} KiB, more than the read budget ({BUDGET_KIB} KiB)"
    );
}
