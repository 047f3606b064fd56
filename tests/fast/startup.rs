//! How `tollgate` starts and stops: exit codes, rules that do not load at start (native mode
//! exits, reference mode waits and heals), listener addresses, and what `check` says about
//! what it was given.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use tollgate::pb;
use tonic::Code;

fn run(args: &[&str]) -> Output {
    tollgate_bin().args(args).output().expect("run tollgate")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

const BROKEN: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n";
const VALID: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";

#[test]
fn check_exits_1_on_problems_and_2_when_there_is_nothing_to_check() {
    let dir = tempfile::tempdir().unwrap();
    let empty = run(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(empty.status.code(), Some(1), "{empty:?}");
    assert!(
        stderr(&empty).contains(
            "no .yaml or .yml file: every request would be unlimited (--config-allow-empty if that is intended)"
        ),
        "{}",
        stderr(&empty)
    );
    let allowed = run(&[
        "check",
        dir.path().to_str().unwrap(),
        "--config-allow-empty",
    ]);
    assert_eq!(allowed.status.code(), Some(0), "{allowed:?}");

    let missing = dir.path().join("absent");
    let output = run(&["check", missing.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        stderr(&output),
        format!("Error: {}: no such file or directory\n", missing.display())
    );

    let output = tollgate_bin()
        .arg("check")
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        stderr(&output),
        "Error: name the rules directory (PATH or --config)\n"
    );
}

#[test]
fn check_in_reference_mode_reads_every_file_under_the_runtime_root() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    // The reference reads a file whatever its name: this one has no `.yaml`.
    std::fs::write(config.join("edge"), BROKEN).unwrap();
    let check = |env: &[(&str, &str)]| {
        tollgate_bin()
            .args(["check", "--env", "reference"])
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let root_env = [
        ("RUNTIME_ROOT", root.path().to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ];
    let output = check(&root_env);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr(&output).contains("edge:4: domain \"edge\" > descriptors[0] (key \"user\") > rate_limit.unit: expected one of"),
        "{}",
        stderr(&output)
    );
    std::fs::write(config.join("edge"), VALID).unwrap();
    let output = check(&root_env);
    assert_eq!(output.status.code(), Some(0), "{output:?}");

    let output = check(&[
        ("RUNTIME_ROOT", root.path().to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "elsewhere"),
    ]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        stderr(&output).contains(
            "(from RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY): no such file or directory"
        ),
        "{}",
        stderr(&output)
    );
    // A directory named on the command line is not the RUNTIME_* variables'.
    let missing = root.path().join("missing");
    let output = tollgate_bin()
        .args(["check", "--env", "reference"])
        .arg(&missing)
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_eq!(
        stderr(&output),
        format!("Error: {}: no such file or directory\n", missing.display())
    );
}

#[test]
fn native_serve_with_rules_that_do_not_load_exits_2_naming_the_problem() {
    let dir = config_dir(&[("edge.yaml", BROKEN)]);
    let output = tollgate_bin()
        .args(["serve", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = stderr(&output);
    assert!(
        stderr.contains(
            "edge.yaml:4: domain \"edge\" > descriptors[0] (key \"user\") > rate_limit.unit"
        ),
        "{stderr}"
    );
    // An error a user is meant to read, not a crash: no backtrace even when asked for one.
    assert!(!stderr.contains("Stack backtrace"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The reference's behaviour at start with a broken ConfigMap: up, not ready, every call
/// answered with an error, and healed by fixing the files (no restart, so no CrashLoopBackOff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_mode_with_rules_that_do_not_load_waits_not_ready_and_heals() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("edge"), BROKEN).unwrap();
    let (grpc, http) = (free_port(), free_port());
    let _process = spawn_reference(
        root.path(),
        grpc,
        http,
        &[
            ("RUNTIME_WATCH_ROOT", "false".into()),
            ("USE_STATSD", "false".into()),
        ],
    );
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], http));
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(admin).await.is_err() {
        assert!(Instant::now() < deadline, "tollgate never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(http_get_status(admin, "/healthcheck").await, 500);

    let mut client = loop {
        match pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await {
            Ok(client) => break client,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => panic!("gRPC never listened: {error}"),
        }
    };
    let status = client
        .should_rate_limit(request("edge", &[&[("user", "alice")]]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unknown);
    assert_eq!(status.message(), "no rate limit configuration loaded");

    std::fs::write(config.join("edge"), VALID).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let response = loop {
        match client
            .should_rate_limit(request("edge", &[&[("user", "alice")]]))
            .await
        {
            Ok(response) => break response.into_inner(),
            Err(status) => {
                assert_eq!(status.code(), Code::Unknown, "{status:?}");
                assert!(Instant::now() < deadline, "the fixed rules never loaded");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(
        shapes(&response)[0].2,
        2,
        "3 an hour, one spent: {response:?}"
    );
    assert_eq!(http_get_status(admin, "/healthcheck").await, 200);
}

async fn http_get_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    http(addr, "GET", path, "").await.0
}

#[test]
fn listener_addresses_take_the_reference_forms_and_must_differ() {
    let port = free_port();
    let output = run(&[
        "serve",
        "--config",
        "examples/config",
        "--grpc-addr",
        &format!("127.0.0.1:{port}"),
        "--http-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains(&format!(
            "--grpc-addr and --http-addr both name 127.0.0.1:{port}: each listener needs a port of its own"
        )),
        "{}",
        stderr(&output)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_name_and_a_bare_port_are_listener_addresses() {
    let (grpc, http) = (free_port(), free_port());
    let child = tollgate_bin()
        .args(["serve", "--config", "examples/config"])
        .args(["--grpc-addr", &format!("localhost:{grpc}")])
        .args(["--http-addr", &format!(":{http}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _process = ChildGuard(child);
    // `:PORT` listens on every address, as the reference's HOST default does; loopback is one.
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], http));
    let deadline = Instant::now() + Duration::from_secs(60);
    while readyz_status(admin).await != Some(200) {
        assert!(Instant::now() < deadline, "tollgate never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client = pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    client
        .should_rate_limit(request("unknown", &[&[("k", "v")]]))
        .await
        .unwrap();
}

#[test]
fn help_shows_defaults_as_they_are_typed_and_only_each_command_s_flags() {
    let serve = String::from_utf8_lossy(&run(&["serve", "-h"]).stdout).into_owned();
    assert!(
        serve.contains("[default: auto] [possible values: auto, on, off, json]"),
        "--admin-writes lists its values:\n{serve}"
    );
    // A list's default as it would be typed, not as Rust prints a Vec.
    assert!(
        serve.contains("[default: RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset]"),
        "{serve}"
    );
    assert!(serve.contains("--trace"), "{serve}");
    for command in ["check", "query", "reset", "health"] {
        let help = String::from_utf8_lossy(&run(&[command, "--help"]).stdout).into_owned();
        assert!(!help.contains("--trace"), "{command} --help:\n{help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_logs_one_line_per_decision_and_no_transport_frames() {
    let dir = config_dir(&[("edge.yaml", VALID)]);
    let log = dir.path().join("serve.log");
    let replica = Replica::spawn_logged(dir.path(), &["--log-level", "debug"], &log);
    replica.wait_ready().await;
    let mut client = replica.client().await;
    for _ in 0..4 {
        client
            .should_rate_limit(request("edge", &[&[("user", "alice")]]))
            .await
            .unwrap();
    }
    replica.terminate().await;
    let text = std::fs::read_to_string(&log).unwrap();
    let decisions: Vec<&str> = text.lines().filter(|l| l.contains(" decision ")).collect();
    assert_eq!(decisions.len(), 4, "{text}");
    assert!(
        decisions[0].contains("request=edge [user=alice] outcome=OK: OK 2/3"),
        "{}",
        decisions[0]
    );
    assert!(
        decisions[3].contains("outcome=OVER_LIMIT: OVER_LIMIT 0/3"),
        "{}",
        decisions[3]
    );
    for target in [" h2::", " hyper::", " hyper_util::", " tower::"] {
        assert!(!text.contains(target), "{target} at debug:\n{text}");
    }
}

#[test]
fn the_start_up_line_is_logged_at_every_level() {
    use std::io::BufRead;
    let mut child = tollgate_bin()
        .args([
            "serve",
            "--config",
            "examples/config",
            "--log-level",
            "warn",
        ])
        .args(["--grpc-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    for part in [
        "tollgate listening",
        &format!("version={}", env!("CARGO_PKG_VERSION")),
        "config=examples/config",
        "grpc=127.0.0.1:",
        "store=memory",
    ] {
        assert!(line.contains(part), "{part} in {line:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_domain_names_it() {
    let dir = config_dir(&[
        ("edge.yaml", VALID),
        (
            "api.yaml",
            "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        ),
    ]);
    let log = tempfile::NamedTempFile::new().unwrap();
    let replica = Replica::spawn_logged(dir.path(), &["--log-level", "warn"], log.path());
    replica.wait_ready().await;
    std::fs::remove_file(dir.path().join("api.yaml")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        let text = std::fs::read_to_string(log.path()).unwrap();
        if let Some(line) = text.lines().find(|line| line.contains("domains removed")) {
            break line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no line names the removed domain:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        line.contains(" WARN ") && line.contains("removed=[\"api\"]"),
        "{line}"
    );
    replica.terminate().await;
}
