//! The `tollgate` binary itself: `check`, and `serve` answering `query`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::*;

fn run(args: &[&str]) -> Output {
    tollgate_bin().args(args).output().expect("run tollgate")
}

#[test]
fn check_accepts_the_example_config() {
    let output = run(&["check", "examples/config"]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "examples/config: ok, 2 domain(s)\n"
    );
}

#[test]
fn check_takes_config_as_serve_does_and_a_single_file() {
    let output = run(&["check", "--config", "examples/config"]);
    assert_eq!(
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout)
        ),
        (Some(0), "examples/config: ok, 2 domain(s)\n".into())
    );
    let output = run(&["check", "examples/config/api.yaml"]);
    assert_eq!(
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout)
        ),
        (
            Some(0),
            "examples/config/api.yaml: ok, 1 domain(s)\n".into()
        )
    );
}

#[test]
fn check_lists_the_files_it_skips() {
    let dir = config_dir(&[
        ("api.yaml", "domain: api\n"),
        ("limits.conf", "domain: forgotten\n"),
    ]);
    let output = run(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!(
            "{}: skipped: not a .yaml or .yml file\n{}: ok, 1 domain(s)\n",
            dir.path().join("limits.conf").display(),
            dir.path().display()
        )
    );
}

#[test]
fn check_prints_file_line_path_reason_and_exits_1() {
    let output = run(&["check", "tests/fixtures/config_errors/bad_unit"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "tests/fixtures/config_errors/bad_unit/api.yaml:6: domain \"api\" > descriptors[1] (key \"user\") > rate_limit.unit: expected one of second|minute|hour|day|week|month|year, got \"fortnight\"\n"
    );
}

#[tokio::test]
async fn serve_answers_query_ok_then_over_limit() {
    let (grpc, http_port) = (free_port(), free_port());
    let _server = spawn_serve_with(
        std::path::Path::new("examples/config"),
        grpc,
        http_port,
        &["--admin-token", "t0ken"],
    );
    let http_addr = std::net::SocketAddr::from(([127, 0, 0, 1], http_port));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = tokio::net::TcpStream::connect(http_addr).await.is_ok()
            && http(http_addr, "GET", "/healthcheck", "").await.0 == 200;
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tollgate serve never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let addr = format!("http://127.0.0.1:{grpc}");
    let query_with = |extra: &[&str], exit: i32| {
        let mut args = vec![
            "query",
            "--addr",
            &addr,
            "--domain",
            "api",
            "--descriptor",
            "password_reset=alice",
        ];
        args.extend(extra);
        let output = run(&args);
        assert_eq!(
            output.status.code(),
            Some(exit),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let query = || query_with(&[], 0);
    for remaining in [2, 1, 0] {
        let printed = query();
        let expected = format!("password_reset=alice: OK limit=3/DAY remaining={remaining} reset=");
        assert!(printed.starts_with(&expected), "{printed}");
        assert!(printed.ends_with("s\noverall: OK\n"), "{printed}");
    }
    // OVER_LIMIT exits 1, so a script can tell a denial from an error (2).
    let printed = query_with(&[], 1);
    assert!(
        printed.starts_with("password_reset=alice: OVER_LIMIT limit=3/DAY remaining=0 reset="),
        "{printed}"
    );
    assert!(printed.ends_with("s\noverall: OVER_LIMIT\n"), "{printed}");
    let json = query_with(&["--json"], 1);
    assert!(
        json.starts_with(r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":3,"unit":"DAY"},"durationUntilReset":""#),
        "{json}"
    );

    // An operator's reset: refused without the server's token, then sent with it (from the
    // flag, or the variable the server reads too): the counter starts afresh.
    let admin = format!("127.0.0.1:{http_port}");
    let reset = [
        "reset",
        "--admin-addr",
        &admin,
        "--domain",
        "api",
        "--descriptor",
        "password_reset=alice",
    ];
    let refused = run(&reset);
    assert_eq!(
        (
            refused.status.code(),
            String::from_utf8_lossy(&refused.stderr).into_owned()
        ),
        (
            Some(2),
            "Error: 401: unauthorized: send Authorization: Bearer <the --admin-token>\n".into()
        )
    );
    let from_env = tollgate_bin()
        .args(reset)
        .env("TOLLGATE_ADMIN_TOKEN", "t0ken")
        .output()
        .unwrap();
    assert_eq!(
        (
            from_env.status.code(),
            String::from_utf8_lossy(&from_env.stdout).into_owned()
        ),
        (Some(0), "{\"reset\":1}\n".into())
    );
    let output = run(&[reset.as_slice(), &["--admin-token", "t0ken"]].concat());
    assert_eq!(
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout)
        ),
        (Some(0), "{\"reset\":1}\n".into()),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = query();
    assert!(
        printed.starts_with("password_reset=alice: OK limit=3/DAY remaining=2 reset="),
        "{printed}"
    );
}

#[tokio::test]
async fn bench_drives_a_server_and_reports_exact_counts() {
    let config = config_dir(&[(
        "bench.yaml",
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}\n",
    )]);
    let replica = Replica::spawn(config.path(), &[]);
    replica.wait_ready().await;
    let addr = format!("http://127.0.0.1:{}", replica.grpc);
    let output = run(&[
        "bench",
        "--addr",
        &addr,
        "--values",
        "5",
        "--concurrency",
        "4",
        "--connections",
        "2",
        "--warmup",
        "0s",
        "--duration",
        "500ms",
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // 5 distinct users, 2 per hour each: exactly 10 admitted, every other call denied.
    assert_eq!(report["ok"], 10);
    assert_eq!(report["errors"], 0);
    assert!(report["over_limit"].as_u64().unwrap() > 0, "{report}");
    assert!(
        report["latency_us"]["p50"].as_u64().unwrap() > 0,
        "{report}"
    );
}

#[tokio::test]
async fn health_exits_0_when_serving_and_2_when_nothing_answers() {
    let replica = Replica::spawn(std::path::Path::new("examples/config"), &[]);
    replica.wait_ready().await;
    let serving = run(&[
        "health",
        "--addr",
        &format!("http://127.0.0.1:{}", replica.grpc),
    ]);
    assert_eq!(serving.status.code(), Some(0), "{serving:?}");
    let closed = run(&[
        "health",
        "--addr",
        &format!("http://127.0.0.1:{}", free_port()),
    ]);
    assert_eq!(closed.status.code(), Some(2), "{closed:?}");
}

#[test]
fn serve_refuses_to_start_with_unreadable_tls_files() {
    // Port 0: the system picks free ports, so no other test can take them first.
    let output = run(&[
        "serve",
        "--config",
        "examples/config",
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--tls-cert",
        "/nonexistent/server.crt",
        "--tls-key",
        "/nonexistent/server.key",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("TLS: /nonexistent/server.crt"), "{stderr}");
}

#[test]
fn a_port_in_use_is_named_with_its_flag_and_what_to_do() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let output = run(&[
        "serve",
        "--config",
        "examples/config",
        "--grpc-addr",
        &format!("127.0.0.1:{port}"),
        "--http-addr",
        &format!("127.0.0.1:{}", free_port()),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "--grpc-addr 127.0.0.1:{port}: cannot listen: Address already in use (os error 98); another process listens there: stop it or choose another port"
        )),
        "{stderr}"
    );
}

#[test]
fn query_takes_an_address_without_a_scheme() {
    // Nothing listens there: the error is about connecting, not about the address's form.
    let port = free_port();
    let output = run(&[
        "query",
        "--addr",
        &format!("127.0.0.1:{port}"),
        "--domain",
        "d",
        "--descriptor",
        "k=v",
    ]);
    assert_eq!(output.status.code(), Some(2), "an error, not a denial");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot connect to http://127.0.0.1:{port}: transport error: "
        )) && stderr.contains("Connection refused"),
        "{stderr}"
    );
}

/// The first log line of `tollgate serve` on examples/config with `flags`, its stderr a pipe.
fn first_log_line(flags: &[&str]) -> String {
    use std::io::BufRead;
    let mut child = tollgate_bin()
        .args(["serve", "--config", "examples/config"])
        .args(flags)
        .args(["--grpc-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    line
}

#[test]
fn log_format_json_writes_one_json_object_per_line() {
    let line = first_log_line(&["--log-format", "json"]);
    let entry: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(entry["level"], "INFO", "{line}");
    assert_eq!(entry["fields"]["message"], "tollgate listening", "{line}");
}

#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let line = first_log_line(&[]);
    assert!(
        line.contains(" INFO ") && line.contains("tollgate listening"),
        "{line:?}"
    );
    assert!(!line.contains('\x1b'), "{line:?}");
}

#[tokio::test]
async fn bench_open_loop_reports_server_cpu_and_memory() {
    let config = config_dir(&[(
        "bench.yaml",
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}\n",
    )]);
    let replica = Replica::spawn(config.path(), &[]);
    replica.wait_ready().await;
    let output = run(&[
        "bench",
        "--addr",
        &format!("http://127.0.0.1:{}", replica.grpc),
        "--values",
        "5",
        "--rate",
        "200",
        "--warmup",
        "0s",
        "--duration",
        "500ms",
        "--server-pid",
        &replica.process.0.id().to_string(),
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // 100 requests on schedule for 5 users at 2 per hour each.
    assert_eq!(report["ok"], 10, "{report}");
    assert_eq!(report["over_limit"], 90, "{report}");
    assert_eq!(
        (report["errors"].clone(), report["shed"].clone()),
        (0.into(), 0.into())
    );
    assert!(report["server_cpu_us_per_decision"].is_number(), "{report}");
    assert!(
        report["server_rss_kib"].as_u64().unwrap() > 1_000,
        "{report}"
    );
}

#[test]
fn booleans_from_the_environment_take_1_0_true_false() {
    // Nothing listens on the port: a value clap accepts gets as far as connecting (exit 2);
    // one it refuses stops at parsing, naming the flag.
    let port = free_port();
    for (value, accepted) in [
        ("1", true),
        ("0", true),
        ("true", true),
        ("false", true),
        ("maybe", false),
    ] {
        let output = tollgate_bin()
            .args([
                "query",
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--domain",
                "d",
            ])
            .args(["--descriptor", "k=v"])
            .env("TOLLGATE_QUERY_JSON", value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if accepted {
            assert!(stderr.contains("cannot connect"), "{value}: {stderr}");
        } else {
            assert!(
                stderr.contains("invalid value 'maybe' for '--json'"),
                "{stderr}"
            );
        }
    }
}

/// `--grpc-uds` (the reference's GRPC_UDS): gRPC on a Unix socket instead of a TCP port; a
/// socket file left by an earlier run is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_is_served_on_a_unix_socket_when_asked() {
    use hyper_util::rt::TokioIo;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ratelimit.sock");
    // A stale socket, as a killed process leaves it.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let config = config_dir(&[(
        "u.yaml",
        "domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )]);
    let socket_arg = socket.display().to_string();
    let replica = Replica::spawn(config.path(), &["--grpc-uds", &socket_arg]);
    replica.wait_ready().await;
    let path = socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .unwrap();
    let mut client = tollgate::pb::RateLimitServiceClient::new(channel);
    let remaining: Vec<u32> = {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let response = client
                .should_rate_limit(request("u", &[&[("k", "x")]]))
                .await
                .unwrap()
                .into_inner();
            seen.push(response.statuses[0].limit_remaining);
        }
        seen
    };
    assert_eq!(remaining, [1, 0, 0]);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", replica.grpc)).is_err(),
        "no TCP gRPC listener"
    );
}

#[test]
fn leases_are_refused_where_a_slice_could_not_live() {
    for (flags, says) in [
        (
            ["--count-denied=false", "--deny-cache-max-ttl", "0s"],
            "--lease auto (TOLLGATE_LEASE) needs --deny-cache-max-ttl above 0s",
        ),
        (
            ["--count-denied", "--deny-cache-max-ttl", "0s"],
            "--lease auto (TOLLGATE_LEASE) needs --deny-cache-max-ttl above 0s",
        ),
    ] {
        let output = run(&[
            &["serve", "--config", "examples/config", "--lease", "auto"][..],
            &flags[..],
            &["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"][..],
        ]
        .concat());
        assert_eq!(output.status.code(), Some(2), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}
