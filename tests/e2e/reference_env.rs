//! envoyproxy/ratelimit's own deployment with only the image changed: tollgate started as
//! `ratelimit` (the image's /bin/ratelimit is a link to it) with the environment of the
//! reference's docker-compose example (Redis over TCP, the rules under RUNTIME_ROOT, statsd),
//! and a variant serving mutual TLS, each behind a real Envoy that limits exactly as the rules
//! say.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::certs::ca;
use common::envoy::*;
use common::redis_process::RedisServer;
use common::*;

/// `dir/ratelimit`, a link to the tollgate binary, as the image's /bin/ratelimit.
fn ratelimit_link(dir: &Path) -> PathBuf {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), &link).unwrap();
    link
}

/// RUNTIME_ROOT as the compose example mounts it: the rules in `ratelimit/config/`, here in a
/// file named without `.yaml` (the reference reads every file).
fn runtime_root(dir: &Path) -> PathBuf {
    let root = dir.join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::copy("deploy/config/edge.yaml", config.join("edge")).unwrap();
    root
}

/// The compose example's Redis and rules variables, with this machine's addresses.
fn compose_env(dir: &Path, redis: &RedisServer) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("RUNTIME_ROOT", runtime_root(dir).display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("RUNTIME_WATCH_ROOT", "false".to_owned()),
    ]
}

/// A `ratelimit` process and where its HTTP listener (`PORT`) is.
pub struct Ratelimit {
    pub _process: ChildGuard,
    pub http: std::net::SocketAddr,
}

/// Starts `ratelimit` with only `env` (and loopback listeners, the debug one on a port of
/// the system's choosing unless `env` says), and waits until it is ready; its log goes to
/// `dir/ratelimit.log`.
pub async fn start_ratelimit(dir: &Path, grpc: u16, env: &[(&str, String)]) -> Ratelimit {
    start_ratelimit_with(dir, grpc, env, &[]).await
}

/// `start_ratelimit` with arguments on `ratelimit`'s command line.
pub async fn start_ratelimit_with(
    dir: &Path,
    grpc: u16,
    env: &[(&str, String)],
    args: &[&str],
) -> Ratelimit {
    let http = free_port();
    let log = std::fs::File::create(dir.join("ratelimit.log")).unwrap();
    let child = Command::new(ratelimit_link(dir))
        .args(args)
        .env_clear()
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", "0")
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn ratelimit");
    let process = ChildGuard(child);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], http));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = tokio::net::TcpStream::connect(addr).await.is_ok()
            && common::http(addr, "GET", "/readyz", "").await.0 == 200;
        if ready {
            return Ratelimit {
                _process: process,
                http: addr,
            };
        }
        let log = std::fs::read_to_string(dir.join("ratelimit.log")).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "ratelimit never became ready:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_compose_environment_through_bin_ratelimit_limits_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    // The reference's plain statsd sink connects over TCP.
    let statsd = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = free_port();
    // The compose example's variables, with this machine's addresses.
    let mut env = compose_env(dir.path(), &redis);
    env.extend([
        ("USE_STATSD", "true".to_owned()),
        ("STATSD_HOST", "127.0.0.1".to_owned()),
        (
            "STATSD_PORT",
            statsd.local_addr().unwrap().port().to_string(),
        ),
        ("STATS_FLUSH_INTERVAL", "200ms".to_owned()),
        ("LOG_LEVEL", "debug".to_owned()),
        ("CONFIG_TYPE", "FILE".to_owned()),
    ]);
    let _ratelimit = start_ratelimit(dir.path(), grpc, &env).await;
    let ports = ports([grpc, grpc]);
    let _envoy = start_envoy(&ports, dir.path(), None).await;

    limits_hold(&ports, "alice").await;
    assert!(redis.dbsize() >= 4, "the counters are in Redis");
    // 4 calls for alice (3 admitted, the third past 80% of 3: near), 1 for another user.
    let expected = [
        ("ratelimit.service.rate_limit.edge.user.total_hits", 5),
        ("ratelimit.service.rate_limit.edge.user.within_limit", 4),
        ("ratelimit.service.rate_limit.edge.user.near_limit", 1),
        ("ratelimit.service.rate_limit.edge.user.over_limit", 1),
        ("ratelimit_server.ShouldRateLimit.total_requests", 11),
        ("ratelimit.service.config_load_success", 1),
    ];
    let received = receive_statsd_tcp(&statsd, &expected).await;
    for (name, count) in expected {
        assert_eq!(received.get(name), Some(&count), "{name} in {received:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_grpc_server_use_tls_and_a_client_ca_envoy_reaches_it_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let (server_ca, client_ca) = (ca("tollgate server CA"), ca("envoy client CA"));
    let (server_cert, server_key) = server_ca.write_leaf(dir.path(), "server", &["localhost"]);
    let (envoy_cert, envoy_key) = client_ca.write_leaf(dir.path(), "envoy", &["envoy"]);
    let server_ca_path = server_ca.write(dir.path(), "server-ca");
    let client_ca_path = client_ca.write(dir.path(), "client-ca");
    let grpc = free_port();
    let mut env = compose_env(dir.path(), &redis);
    env.extend([
        ("USE_STATSD", "false".to_owned()),
        ("GRPC_SERVER_USE_TLS", "true".to_owned()),
        ("GRPC_SERVER_TLS_CERT", server_cert.display().to_string()),
        ("GRPC_SERVER_TLS_KEY", server_key.display().to_string()),
        (
            "GRPC_CLIENT_TLS_CACERT",
            client_ca_path.display().to_string(),
        ),
    ]);
    let _ratelimit = start_ratelimit(dir.path(), grpc, &env).await;
    let ports = ports([grpc, grpc]);
    let tls = UpstreamTls {
        ca: server_ca_path,
        cert: envoy_cert,
        key: envoy_key,
    };
    let _envoy = start_envoy(&ports, dir.path(), Some(&tls)).await;
    limits_hold(&ports, "carol").await;
    // Fail-closed proves every answer came over TLS: a refused handshake would be a 503.
    assert_eq!(
        statuses(ports.fail_closed, "/api", "dave", 4).await,
        [200, 200, 200, 429]
    );
}

#[test]
fn a_value_tollgate_cannot_honour_stops_startup_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    // Each must stop at once; one that starts serving instead is killed and fails the test.
    let run = |env: &[(&str, &str)]| {
        let stderr = dir.path().join("stderr");
        let mut child = ChildGuard(
            Command::new(ratelimit_link_once(dir.path()))
                .env_clear()
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&stderr).unwrap())
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{env:?}: still running after 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        (status.code(), std::fs::read_to_string(&stderr).unwrap())
    };
    let (code, stderr) = run(&[("BACKEND_TYPE", "memcache")]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("BACKEND_TYPE: memcache is not supported"),
        "{stderr}"
    );
    let (code, stderr) = run(&[("CONFIG_TYPE", "CONSUL")]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("CONFIG_TYPE: \"CONSUL\""), "{stderr}");
    // A value clap refuses is reported against the variable it came from.
    let (code, stderr) = run(&[("NEAR_LIMIT_RATIO", "1.5")]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("NEAR_LIMIT_RATIO (as --near-limit-ratio)"),
        "{stderr}"
    );
}

/// The link, made once per directory.
fn ratelimit_link_once(dir: &Path) -> PathBuf {
    let link = dir.join("ratelimit");
    if !link.exists() {
        ratelimit_link(dir);
    }
    link
}

/// One OTLP/HTTP export request received on `listener` (the body of a `POST /v1/traces`),
/// answered 200.
pub async fn receive_otlp_http(
    listener: &tokio::net::TcpListener,
) -> opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
    use prost::Message as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (mut stream, _) = listener.accept().await.unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        let read = stream.read(&mut buffer).await.unwrap();
        assert!(
            read > 0,
            "the exporter closed before sending a whole request"
        );
        received.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&received);
        let Some(head_end) = text.find("\r\n\r\n") else {
            continue;
        };
        let head = text[..head_end].to_ascii_lowercase();
        assert!(head.starts_with("post /v1/traces"), "{head}");
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map(|value| value.trim().parse().unwrap())
            .expect("a content-length");
        let body_start = head_end + 4;
        if received.len() >= body_start + length {
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            return opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(
                &received[body_start..body_start + length],
            )
            .unwrap();
        }
    }
}

/// TRACING_ENABLED with the reference's default protocol (OTLP over HTTP) and service name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_enabled_exports_spans_over_otlp_http_as_ratelimit() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let dir = tempfile::tempdir().unwrap();
    let collector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", collector.local_addr().unwrap());
    let grpc = free_port();
    let redis = RedisServer::start();
    let mut env = compose_env(dir.path(), &redis);
    env.extend([
        ("USE_STATSD", "false".to_owned()),
        ("BACKEND_TYPE", "redis".to_owned()),
        ("TRACING_ENABLED", "true".to_owned()),
        ("LOG_LEVEL", "info".to_owned()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
    ]);
    let _ratelimit = start_ratelimit(dir.path(), grpc, &env).await;
    let mut client =
        tollgate::pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
            .await
            .unwrap();
    client
        .should_rate_limit(request("edge", &[&[("user", "traced")]]))
        .await
        .unwrap();
    let export = tokio::time::timeout(Duration::from_secs(30), receive_otlp_http(&collector))
        .await
        .unwrap_or_else(|_| {
            let log = std::fs::read_to_string(dir.path().join("ratelimit.log")).unwrap_or_default();
            panic!("no spans exported within 30 s; tollgate's log:\n{log}")
        });
    let resource = export.resource_spans[0].resource.as_ref().unwrap();
    let service = resource
        .attributes
        .iter()
        .find(|attribute| attribute.key == "service.name")
        .and_then(|attribute| attribute.value.as_ref()?.value.clone());
    assert_eq!(service, Some(Value::StringValue("RateLimit".into())));
    let names: Vec<&str> = export
        .resource_spans
        .iter()
        .flat_map(|spans| &spans.scope_spans)
        .flat_map(|scope| &scope.spans)
        .map(|span| span.name.as_str())
        .collect();
    assert!(names.contains(&"should_rate_limit"), "{names:?}");
}
