//! Redis failures: a stopped Redis gets the configured answer fast and readiness turns
//! NOT_SERVING; a Redis restarted empty (its scripts gone) and a cluster failover are
//! recovered from without restarting tollgate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use tollgate::server::Options;
use tollgate::service::{OnStoreError, STORE_ERROR_HEADER, ServiceOptions};

const LIMITS: &str = r#"
domain: faults
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
"#;

/// A burst of 3, refilled at one every six minutes: no refill during a test.
const BUCKET: &str = r#"
domain: bucket
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra, burst: 3}
"#;

const STORE_TIMEOUT: Duration = Duration::from_millis(100);
/// What the issue promises beyond the store timeout.
const ANSWER_MARGIN: Duration = Duration::from_millis(20);

fn user(value: &str) -> tollgate::pb::RateLimitRequest {
    request("faults", &[&[("user", value)]])
}

async fn start_with_policy(on_store_error: OnStoreError) -> TestServer {
    start_with(
        &[("faults.yaml", LIMITS)],
        Setup {
            store: StoreKind::Redis,
            store_timeout: STORE_TIMEOUT,
            options: Options {
                service: ServiceOptions {
                    on_store_error,
                    ..ServiceOptions::default()
                },
                probe_every: Duration::from_millis(200),
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await
}

fn redis(server: &mut TestServer) -> &mut common::redis_process::RedisServer {
    match &mut server.backing {
        Backing::Redis(redis) => redis,
        _ => panic!("a standalone Redis test"),
    }
}

/// Polls `ready()` until it equals `expected`, for up to `within`.
async fn readiness_becomes(server: &TestServer, expected: u16, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (status, _) = server.http("GET", "/readyz", "").await;
        if status == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz stayed {status}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops Redis, then checks 30 calls answer within the timeout (+20 ms) as `check` says, and
/// readiness: NOT_SERVING when a store failure fails requests, still ready when it gets the
/// configured `allow` or `deny` (the store reported down beside it).
async fn stopped_redis(
    on_store_error: OnStoreError,
    check: impl Fn(Result<tollgate::pb::RateLimitResponse, tonic::Status>),
) -> TestServer {
    let mut server = start_with_policy(on_store_error).await;
    assert_eq!(server.ok(user("a")).await.statuses[0].limit_remaining, 9);
    redis(&mut server).stop();
    let mut client = server.client().await;
    for _ in 0..30 {
        let started = Instant::now();
        let answer = client
            .should_rate_limit(user("a"))
            .await
            .map(tonic::Response::into_inner);
        let took = started.elapsed();
        assert!(
            took <= STORE_TIMEOUT + ANSWER_MARGIN,
            "answered in {took:?}"
        );
        check(answer);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .http("GET", "/metrics", "")
        .await
        .1
        .contains("\ntollgate_store_up 0\n")
    {
        assert!(Instant::now() < deadline, "the store never reported down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if on_store_error == OnStoreError::Unavailable {
        assert_eq!(
            server.http("GET", "/readyz", "").await,
            (500, "NOT OK\nstore: down\n".to_owned())
        );
    } else {
        assert_eq!(
            server.http("GET", "/readyz", "").await,
            (200, "OK\nstore: down\n".to_owned())
        );
        assert_eq!(server.http("GET", "/healthcheck", "").await.0, 200);
    }
    // The failures are in the metrics: refused connections, then the open breaker.
    let metrics = server.http("GET", "/metrics", "").await.1;
    assert!(
        metrics.contains("tollgate_store_errors_total{kind=\"unavailable\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_store_errors_total{kind=\"circuit_open\"}"),
        "{metrics}"
    );
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_redis_is_unavailable_fast_then_a_restarted_empty_redis_serves_again() {
    let mut server = stopped_redis(OnStoreError::Unavailable, |answer| {
        assert_eq!(answer.unwrap_err().code(), tonic::Code::Unavailable);
    })
    .await;

    // Restarted empty: no counters, no script loaded. Decisions resume by themselves.
    redis(&mut server).restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let resumed = loop {
        if let Ok(response) = server.call(user("b")).await {
            break response;
        }
        assert!(Instant::now() < deadline, "decisions never resumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(resumed.statuses[0].limit_remaining, 9);
    assert_eq!(
        server.ok(user("a")).await.statuses[0].limit_remaining,
        9,
        "a fresh counter"
    );
    readiness_becomes(&server, 200, Duration::from_secs(10)).await;
}

/// A Redis stalled for 300 ms, three times its store timeout: a caller that waits 5 s (Envoy
/// AI Gateway's quota filter) gets its decision; one that sends no deadline gets
/// `--store-timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_call_waits_what_remains_of_its_caller_s_deadline() {
    let mut server = start_with_policy(OnStoreError::Unavailable).await;
    assert_eq!(server.ok(user("a")).await.statuses[0].limit_remaining, 9);
    let mut client = server.client().await;
    let stalled = |server: &mut TestServer| redis(server).pause_for(Duration::from_millis(300));
    let waiting = |wait: Option<Duration>| {
        let mut request = tonic::Request::new(user("a"));
        if let Some(wait) = wait {
            request.set_timeout(wait);
        }
        request
    };

    let resumed = stalled(&mut server);
    let answer = client
        .should_rate_limit(waiting(Some(Duration::from_secs(5))))
        .await;
    resumed.join().unwrap();
    assert_eq!(answer.unwrap().into_inner().statuses[0].limit_remaining, 8);

    let resumed = stalled(&mut server);
    let unsaid = client.should_rate_limit(waiting(None)).await;
    resumed.join().unwrap();
    assert_eq!(unsaid.unwrap_err().code(), tonic::Code::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_as_long_as_the_store_timeout_fail_the_calls_they_catch_and_never_open_the_breaker()
{
    let mut server = start_with_policy(OnStoreError::Unavailable).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Eight callers, each user new (a store call every time, none answered by the deny cache).
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(server.client().await);
    }
    let callers: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(caller, mut client)| {
            let stop = std::sync::Arc::clone(&stop);
            tokio::spawn(async move {
                let (mut answered, mut failed) = (0, 0);
                for call in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    match client
                        .should_rate_limit(user(&format!("{caller}-{call}")))
                        .await
                    {
                        Ok(_) => answered += 1,
                        Err(_) => failed += 1,
                    }
                }
                (answered, failed)
            })
        })
        .collect();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let resumed = redis(&mut server).pause_for(STORE_TIMEOUT);
        tokio::task::spawn_blocking(move || resumed.join().unwrap())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut answered, mut failed) = (0, 0);
    for caller in callers {
        let (one_answered, one_failed) = caller.await.unwrap();
        answered += one_answered;
        failed += one_failed;
    }
    eprintln!("{answered} answered, {failed} failed over 20 stalls");
    assert!(
        answered > 0 && failed > 0,
        "{answered} answered, {failed} failed"
    );
    let metric =
        |kind: &'static str| common::rlqs::metric(server.http, "tollgate_store_errors_total", kind);
    assert_eq!(metric("kind=\"circuit_open\"").await, 0.0);
    assert_eq!(metric("kind=\"timeout\"").await, f64::from(failed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_redis_with_allow_answers_ok_marked_in_a_header() {
    stopped_redis(OnStoreError::Allow, |answer| {
        let response = answer.unwrap();
        assert_eq!(response.overall_code, OK);
        assert_eq!(response.statuses.len(), 1);
        assert_eq!(response.statuses[0].code, OK);
        // For the service behind Envoy, not for the end user.
        assert!(response.response_headers_to_add.is_empty());
        let header = &response.request_headers_to_add[0];
        assert_eq!(
            (header.key.as_str(), header.value.as_str()),
            (STORE_ERROR_HEADER, "allow")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_redis_with_deny_answers_over_limit_marked_in_a_header() {
    stopped_redis(OnStoreError::Deny, |answer| {
        let response = answer.unwrap();
        assert_eq!(response.overall_code, OVER);
        assert_eq!(response.statuses[0].code, OVER);
        assert!(response.response_headers_to_add.is_empty());
        assert_eq!(response.request_headers_to_add[0].value, "deny");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_by_its_replica_and_decisions_resume_within_ten_seconds() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("tollgate=debug,redis=debug")
        .try_init();
    let mut server = start_with(
        &[("faults.yaml", LIMITS)],
        Setup {
            store: StoreKind::ReplicatedCluster,
            store_timeout: Duration::from_millis(500),
            ..Setup::default()
        },
    )
    .await;
    assert_eq!(server.ok(user("a")).await.statuses[0].limit_remaining, 9);
    let Backing::Cluster(cluster) = &mut server.backing else {
        panic!("a cluster test");
    };
    // The master that holds user "a".
    let owner = cluster
        .nodes
        .iter()
        .position(|node| {
            matches!(node.try_query(&["DBSIZE"]), Some(redis::Value::Int(1)))
                && cluster.masters().iter().any(|m| m.port == node.port)
        })
        .expect("a master holds the counter");
    cluster.nodes[owner].stop();
    let killed = Instant::now();

    let resumed = answered_within_ten_seconds(&server, "a", killed).await;
    // The replica had the counter (asynchronous replication may lose the last write: then 9).
    let remaining = resumed.statuses[0].limit_remaining;
    assert!(remaining == 8 || remaining == 9, "remaining {remaining}");
    eprintln!(
        "decisions resumed {:?} after the master was killed",
        killed.elapsed()
    );
    // Every node agrees on the new topology within the same bound.
    for other in ["z", "y", "x"] {
        let fresh = answered_within_ten_seconds(&server, other, killed).await;
        assert_eq!(fresh.statuses[0].limit_remaining, 9);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinels_decisions_follow_the_master_to_the_promoted_replica() {
    let mut server = start_with(
        &[("faults.yaml", LIMITS)],
        Setup {
            store: StoreKind::Sentinel,
            store_timeout: Duration::from_millis(500),
            ..Setup::default()
        },
    )
    .await;
    assert_eq!(server.ok(user("a")).await.statuses[0].limit_remaining, 9);
    let Backing::Sentinel(sentinels) = &mut server.backing else {
        panic!("a sentinel test");
    };
    let (old_master, replica) = (sentinels.master.port, sentinels.replica.port);
    assert_eq!(sentinels.master_port(), Some(old_master));
    sentinels.master.stop();
    let killed = Instant::now();
    sentinels.wait_until(
        |sentinels| sentinels.master_port() == Some(replica),
        "to promote the replica",
    );
    let promoted = Instant::now();
    let resumed = answered_within_ten_seconds(&server, "a", promoted).await;
    let remaining = resumed.statuses[0].limit_remaining;
    // Asynchronous replication may lose the last write: then 9 again.
    assert!(remaining == 8 || remaining == 9, "remaining {remaining}");
    eprintln!(
        "promoted {:?} after the master was killed; decisions resumed {:?} after that",
        promoted - killed,
        promoted.elapsed()
    );
    let Backing::Sentinel(sentinels) = &server.backing else {
        unreachable!()
    };
    assert!(
        sentinels.replica.dbsize() >= 1,
        "the counter is on the new master"
    );
}

/// The first answer for user `value`, retried until 10 s after `since`.
async fn answered_within_ten_seconds(
    server: &TestServer,
    value: &str,
    since: Instant,
) -> tollgate::pb::RateLimitResponse {
    loop {
        if let Ok(response) = server.call(user(value)).await {
            return response;
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "decisions for {value:?} did not resume within 10 s of the failover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_started_before_redis_is_not_ready_then_serves_once_redis_answers() {
    let port = free_port();
    let config = config_dir(&[("faults.yaml", LIMITS)]);
    let store = format!("redis://127.0.0.1:{port}");
    let replica = Replica::spawn(config.path(), &["--store", &store]);
    // Up (liveness) but not ready, and decisions are UNAVAILABLE: never a crash.
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(replica.http_addr())
        .await
        .is_err()
        || http(replica.http_addr(), "GET", "/healthz", "").await.0 != 200
    {
        assert!(Instant::now() < deadline, "tollgate never came up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(http(replica.http_addr(), "GET", "/readyz", "").await.0, 500);
    let mut client = replica.client().await;
    let status = client.should_rate_limit(user("a")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);

    let _redis = common::redis_process::RedisServer::start_on(port);
    replica.wait_ready().await;
    let response = client
        .should_rate_limit(user("a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.statuses[0].limit_remaining, 9);
}

#[test]
fn a_wrong_redis_password_is_an_error_that_says_what_to_check() {
    use std::io::BufRead;
    let redis = common::redis_process::RedisServer::start();
    redis.query(&["CONFIG", "SET", "requirepass", "right"]);
    let config = config_dir(&[("faults.yaml", LIMITS)]);
    let mut child = ChildGuard(
        tollgate_bin()
            .args(["serve", "--config"])
            .arg(config.path())
            .args([
                "--store",
                &redis.url().replace("redis://", "redis://:wrong@"),
            ])
            .args(["--grpc-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = std::io::BufReader::new(child.0.stderr.take().unwrap());
    let (found, first_error) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let error = stderr
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("ERROR"));
        let _ = found.send(error);
    });
    let refused = first_error
        .recv_timeout(Duration::from_secs(30))
        .expect("an error line within 30 s")
        .expect("tollgate exited without an error line");
    assert!(
        refused.contains("Redis refused tollgate: check the user and password (in the --store URL, or --redis-password-file)"),
        "{refused}"
    );
    assert!(
        !refused.contains("wrong"),
        "the password stays out of logs: {refused}"
    );
}

/// The Kubernetes manifests mount the Redis password from a Secret as a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_from_a_file_authenticates_to_redis() {
    let redis = common::redis_process::RedisServer::start();
    redis.query(&["CONFIG", "SET", "requirepass", "from-a-secret"]);
    let config = config_dir(&[("faults.yaml", LIMITS)]);
    let password = config.path().join("password");
    std::fs::write(&password, "from-a-secret\n").unwrap();
    let replica = common::Replica::spawn(
        config.path(),
        &[
            "--store",
            &redis.url(),
            "--redis-password-file",
            password.to_str().unwrap(),
        ],
    );
    replica.wait_ready().await;
    let mut client = replica.client().await;
    let response = client
        .should_rate_limit(user("a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.statuses[0].limit_remaining, 9);
    replica.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_reset_clears_the_counter_in_redis_and_the_local_deny_cache_at_once() {
    let server = start_with(
        &[("faults.yaml", LIMITS)],
        Setup {
            store: StoreKind::Redis,
            options: Options {
                admin_writes: tollgate::admin::writes::AdminWrites {
                    mode: tollgate::admin::writes::WritesMode::On,
                    token: None,
                },
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    for _ in 0..10 {
        server.ok(user("a")).await;
    }
    assert_eq!(server.ok(user("a")).await.overall_code, OVER);
    let body = r#"{"domain":"faults","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#;
    assert_eq!(
        server.http("POST", "/reset", body).await,
        (200, r#"{"reset":1}"#.to_owned())
    );
    let after = server.ok(user("a")).await;
    assert_eq!(
        (after.overall_code, after.statuses[0].limit_remaining),
        (OK, 9)
    );
    // A bad request names its fault.
    assert_eq!(
        server.http("POST", "/reset", r#"{"domain":""}"#).await,
        (400, "bad request: domain: must not be empty\n".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_reset_in_redis_is_honoured_once_the_deny_cache_max_ttl_has_passed() {
    // 10 per minute for user "a"; the server's clock (the script's too) is manual.
    let server = start_on(StoreKind::Redis, &[("faults.yaml", LIMITS)]).await;
    for _ in 0..10 {
        assert_eq!(server.ok(user("a")).await.overall_code, OK);
    }
    let over = server.ok(user("a")).await;
    assert_eq!(over.overall_code, OVER);
    // An operator resets the counters; the cached denial stands for at most a second.
    let Backing::Redis(redis) = &server.backing else {
        panic!("a Redis test");
    };
    redis.query(&["FLUSHALL"]);
    assert_eq!(
        server.ok(user("a")).await.overall_code,
        OVER,
        "answered locally"
    );
    server.clock.advance(1_000_001);
    let after = server.ok(user("a")).await;
    assert_eq!(
        (after.overall_code, after.statuses[0].limit_remaining),
        (OK, 9),
        "the store is asked again and finds the counter reset"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_a_unix_socket_counts_as_over_tcp() {
    let server = start_on(StoreKind::RedisSocket, &[("faults.yaml", LIMITS)]).await;
    for remaining in (0..10).rev() {
        assert_eq!(
            server.ok(user("a")).await.statuses[0].limit_remaining,
            remaining
        );
    }
    assert_eq!(server.ok(user("a")).await.overall_code, OVER);
    let Backing::Redis(redis) = &server.backing else {
        panic!("a Redis test");
    };
    // The counter is in that Redis (reached over TCP here).
    assert_eq!(redis.dbsize(), 1);
}

/// Every counter tollgate writes to Redis expires once it no longer matters, and the grace
/// after (docs/design.md, "Time": 110 ms with the default 50 ms store timeout): a lone hit's
/// counter, the counters of a request of several descriptors (counted in one call, their
/// arguments packed), and an algorithm's state (GCRA, a lone hit's own path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_counter_in_redis_expires_within_its_window_and_the_grace() {
    let redis = common::redis_process::RedisServer::start();
    let config = config_dir(&[("faults.yaml", LIMITS), ("bucket.yaml", BUCKET)]);
    let replica = Replica::spawn(config.path(), &["--store", &redis.url()]);
    replica.wait_ready().await;
    let mut client = replica.client().await;
    let calls = [
        user("a"),
        request("faults", &[&[("user", "b")], &[("user", "c")]]),
        request("bucket", &[&[("user", "d")]]),
    ];
    for call in calls {
        let response = client.should_rate_limit(call).await.unwrap().into_inner();
        assert_eq!(response.overall_code, OK);
    }
    let keys = redis.try_query(&["KEYS", "*"]).unwrap();
    let keys: Vec<String> = redis::from_redis_value(keys).unwrap();
    assert_eq!(keys.len(), 4, "{keys:?}");
    for key in &keys {
        let ttl: i64 = redis.query(&["PTTL", key]).parse().unwrap();
        // A minute's window, or one GCRA emission interval (an hour / 10), and the grace.
        let longest = if key.contains("}:gcra") {
            360_000
        } else {
            60_000
        };
        assert!(0 < ttl && ttl <= longest + 110, "{key}: PTTL {ttl} ms");
    }
}

/// `--store-key-prefix` (the reference's CACHE_KEY_PREFIX): every key in Redis starts with it,
/// counting is unchanged, and a reset finds the prefixed key. Also `--metrics-addr`: the
/// metrics alone on a port of their own, at `--metrics-path`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_prefix_goes_before_every_redis_key_and_metrics_get_their_own_port() {
    let redis = common::redis_process::RedisServer::start();
    let config = config_dir(&[("faults.yaml", LIMITS)]);
    let metrics_port = free_port();
    let replica = Replica::spawn(
        config.path(),
        &[
            "--store",
            &redis.url(),
            "--store-key-prefix",
            "team-a:",
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
            "--metrics-path",
            "/stats/prometheus",
            "--admin-writes",
            "on",
        ],
    );
    replica.wait_ready().await;
    let mut client = replica.client().await;
    for remaining in [9, 8] {
        let response = client
            .should_rate_limit(user("a"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.statuses[0].limit_remaining, remaining);
    }
    let keys = redis.try_query(&["KEYS", "*"]).unwrap();
    let keys: Vec<String> = redis::from_redis_value(keys).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].starts_with("team-a:tollgate:v1:{"), "{keys:?}");
    let body = r#"{"domain":"faults","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#;
    assert_eq!(
        http(replica.http_addr(), "POST", "/reset", body).await,
        (200, r#"{"reset":1}"#.to_owned())
    );
    assert_eq!(redis.dbsize(), 0);

    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let (status, text) = http(metrics, "GET", "/stats/prometheus", "").await;
    assert_eq!(status, 200);
    assert!(
        text.contains("tollgate_requests_total{code=\"OK\"} 2"),
        "{text}"
    );
    assert_eq!(
        http(metrics, "GET", "/json", "").await.0,
        404,
        "only the metrics there"
    );
}

/// `rediss://` to a Redis whose certificate a private CA signed and which requires client
/// certificates (`--redis-tls-ca`, `--redis-tls-cert`, `--redis-tls-key`; the reference's
/// REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_private_ca_and_a_client_certificate() {
    use common::certs::ca;
    let certs = tempfile::tempdir().unwrap();
    let (redis_ca, client_ca) = (ca("redis CA"), ca("redis clients CA"));
    let (cert, key) = redis_ca.write_leaf(certs.path(), "redis", &["localhost"]);
    let client_ca_path = client_ca.write(certs.path(), "clients-ca");
    let (redis, tls_port) =
        common::redis_process::RedisServer::start_tls(&cert, &key, &client_ca_path);
    let redis_ca_path = redis_ca.write(certs.path(), "redis-ca");
    let (client_cert, client_key) = client_ca.write_leaf(certs.path(), "tollgate", &["tollgate"]);
    let config = config_dir(&[("faults.yaml", LIMITS)]);
    let store = format!("rediss://localhost:{tls_port}");
    let path = |p: &std::path::Path| p.display().to_string();
    let replica = Replica::spawn(
        config.path(),
        &[
            "--store",
            &store,
            "--redis-tls-ca",
            &path(&redis_ca_path),
            "--redis-tls-cert",
            &path(&client_cert),
            "--redis-tls-key",
            &path(&client_key),
        ],
    );
    replica.wait_ready().await;
    let mut client = replica.client().await;
    let response = client
        .should_rate_limit(user("a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.statuses[0].limit_remaining, 9);
    assert_eq!(redis.dbsize(), 1, "counted in the TLS Redis");

    // Without the client certificate, Redis refuses the handshake: never ready.
    let without = Replica::spawn(
        config.path(),
        &["--store", &store, "--redis-tls-ca", &path(&redis_ca_path)],
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!without.ready().await, "ready without a client certificate");
}

/// A Redis user refused FUNCTION and FCALL (as on Redis before 7, which has neither) still
/// gets exact decisions: tollgate runs the same code as scripts. In a process of its own,
/// since the choice holds for the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_user_refused_functions_gets_the_same_decisions_by_script() {
    let redis = common::redis_process::RedisServer::start();
    redis.query(&[
        "ACL",
        "SETUSER",
        "scripts",
        "on",
        ">secret",
        "~*",
        "+@all",
        "-function",
        "-fcall",
        "-fcall_ro",
    ]);
    let config = config_dir(&[("faults.yaml", LIMITS), ("bucket.yaml", BUCKET)]);
    let store = redis.url().replace("redis://", "redis://scripts:secret@");
    let replica = Replica::spawn(config.path(), &["--store", &store]);
    replica.wait_ready().await;
    let mut client = replica.client().await;
    let mut remaining = Vec::new();
    for _ in 0..12 {
        let response = client
            .should_rate_limit(user("scripted"))
            .await
            .unwrap()
            .into_inner();
        remaining.push((response.overall_code, response.statuses[0].limit_remaining));
    }
    let (ok, over) = (OK, OVER);
    assert_eq!(
        remaining,
        [
            (ok, 9),
            (ok, 8),
            (ok, 7),
            (ok, 6),
            (ok, 5),
            (ok, 4),
            (ok, 3),
            (ok, 2),
            (ok, 1),
            (ok, 0),
            (over, 0),
            (over, 0)
        ]
    );
    // Another algorithm alone in its request: the script answers the state it found, and
    // tollgate works out the outcome from it.
    let mut bucket = Vec::new();
    for _ in 0..4 {
        let response = client
            .should_rate_limit(request("bucket", &[&[("user", "scripted")]]))
            .await
            .unwrap()
            .into_inner();
        bucket.push((response.overall_code, response.statuses[0].limit_remaining));
    }
    assert_eq!(bucket, [(ok, 2), (ok, 1), (ok, 0), (over, 0)]);
    assert_eq!(redis.calls("fcall"), 0, "FCALL is refused to this user");
    // The thirteen admitted hits reached Redis (the deny cache may answer the denied ones).
    assert!(
        redis.calls("evalsha") + redis.calls("eval") >= 10,
        "the decisions went by script"
    );
    replica.terminate().await;
}
