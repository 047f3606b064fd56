//! What Envoy Gateway's deployment asks of the rate-limit service beyond deciding: its probes
//! (`/healthcheck` for liveness and readiness alike) through a Redis outage, `egctl config
//! ratelimit`'s read of the debug listener, Redis over TLS with client certificates and a
//! password, its tracing variables, and a burst on a fresh connection from an Envoy whose
//! cluster sets no stream limit.

use std::time::{Duration, Instant};

use prost::bytes::Bytes;
use tonic::codegen::http;

use super::certs::leaf;
use super::envoy::*;
use super::*;
use crate::common::away_from_the_hour_boundary;
use crate::common::redis_process::RedisServer;

/// A listener limiting each `x-user-id` to `per_hour`, and its config.
fn per_user(per_hour: u32) -> (RateLimitConfig, Listener) {
    let l = listener_domain("eg", "http");
    let r = route_key("backend");
    let actions = vec![generic(&r), header_distinct("rule-0-match-0", "x-user-id")];
    let route = route(
        &r,
        prefix("/"),
        serde_json::json!({BASE_FILTER: per_route(&l, vec![limit(actions)])}),
    );
    let rules = config(
        &l,
        vec![node(&r, &r, vec![hourly("rule-0-match-0", "", per_hour)])],
    );
    (rules, Listener::new(&l, vec![route]))
}

async fn healthcheck(eg: &Deployment) -> (u16, String) {
    let response = get(eg.ratelimit.http, "/healthcheck", &[]).await;
    (response.status, response.body)
}

/// Envoy Gateway's liveness probe (`/healthcheck`, three failures 10 s apart) never fails
/// through a minute without Redis, probed every second here; `/readyz` says where the store
/// is; decisions resume when Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_of_a_minute_never_fails_the_gateway_s_probes() {
    let mut eg = Deployment::start().await;
    let (rules, listener) = per_user(1_000);
    eg.push(vec![rules]).await;
    let envoy = eg.envoy(&[listener]).await;
    away_from_the_hour_boundary().await;
    let alice = [("x-user-id", "alice")];
    assert_eq!(
        statuses(envoy.ports[0], "/", &alice, 1).await,
        [with_limit(200, 1_000)]
    );

    eg.redis.stop();
    let outage = Instant::now();
    let mut saw_down = false;
    while outage.elapsed() < Duration::from_secs(60) {
        assert_eq!(
            healthcheck(&eg).await,
            (200, "OK".to_owned()),
            "after {:?} without Redis",
            outage.elapsed()
        );
        let readyz = get(eg.ratelimit.http, "/readyz", &[]).await.body;
        saw_down |= readyz.contains("store: down");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(saw_down, "the store's outage is reported beside readiness");
    eg.redis.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = send(envoy.ports[0], "GET", "/", &alice).await;
        if answer.limit.is_some() {
            assert_eq!(answer.status, 200);
            break;
        }
        assert!(Instant::now() < deadline, "decisions never resumed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// With `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true`, readiness follows Redis, as the
/// reference's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_active_connection_checks_the_healthcheck_follows_redis() {
    let redis = RedisServer::start();
    let mut eg = Deployment::start_with(redis, |env, _| {
        env.push(("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true".into()));
    })
    .await;
    eg.redis.stop();
    let deadline = Instant::now() + Duration::from_secs(30);
    while healthcheck(&eg).await.0 != 500 {
        assert!(Instant::now() < deadline, "/healthcheck never failed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(healthcheck(&eg).await, (500, "NOT OK".to_owned()));
}

/// `egctl config ratelimit` prints what the debug listener's `/rlconfig` serves: the rules
/// pushed over xDS, one line per limit, as the reference dumps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egctl_reads_the_pushed_rules_from_the_debug_listener() {
    let mut eg = Deployment::start().await;
    let (rules, _) = per_user(3);
    let shared = "gateway-conformance-infra/ratelimit-all-ips";
    let rule = format!("{shared}/rule/0");
    let cidr = node(
        "masked_remote_address",
        "0.0.0.0/0",
        vec![hourly("remote_address", "", 3)],
    );
    eg.push(vec![
        rules,
        config(shared, vec![node(&rule, &rule, vec![cidr])]),
    ])
    .await;
    let dumped = get(loopback(eg.debug), "/rlconfig", &[]).await;
    let r = route_key("backend");
    assert_eq!(
        (dumped.status, dumped.body),
        (
            200,
            format!(
                "gateway-conformance-infra/eg/http.{r}_{r}.rule-0-match-0: unit=HOUR requests_per_unit=3, shadow_mode: false, quota_mode: false\n\
                 {shared}.{rule}_{rule}.masked_remote_address_0.0.0.0/0.remote_address: unit=HOUR requests_per_unit=3, shadow_mode: false, quota_mode: false\n"
            )
        )
    );
}

/// Envoy Gateway's Redis TLS settings: `REDIS_TLS`, a client certificate from
/// `/redis-certs` (PKCS#1, as certgen writes it), `REDIS_AUTH`, and statsd on. Redis's
/// certificate is the test's CA's, which the system does not trust: `REDIS_TLS_CACERT` says
/// so here, as a deployment on a private CA would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_client_certificate_and_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let certs = super::certs::Certs::generate(dir.path());
    let server = leaf(dir.path(), "redis", "redis");
    let (mut redis, tls_port) = RedisServer::start_tls(&server.cert(), &server.key(), &server.ca());
    redis.set_password("redis_auth_password");
    let client = leaf(dir.path(), "redis-certs", "*");
    let mut eg = Deployment::start_with(redis, |env, _| {
        env.retain(|(name, _)| *name != "REDIS_URL" && *name != "USE_STATSD");
        env.extend([
            ("REDIS_URL", format!("localhost:{tls_port}")),
            ("USE_STATSD", "true".into()),
            ("REDIS_TLS", "true".into()),
            ("REDIS_TLS_CLIENT_CERT", client.cert().display().to_string()),
            ("REDIS_TLS_CLIENT_KEY", client.key().display().to_string()),
            ("REDIS_TLS_CACERT", client.ca().display().to_string()),
            ("REDIS_AUTH", "redis_auth_password".into()),
        ]);
    })
    .await;
    drop(certs);
    let (rules, listener) = per_user(2);
    eg.push(vec![rules]).await;
    let envoy = eg.envoy(&[listener]).await;
    away_from_the_hour_boundary().await;
    let mut expected = vec![with_limit(200, 2); 2];
    expected.push(with_limit(429, 2));
    assert_eq!(
        statuses(envoy.ports[0], "/", &[("x-user-id", "tls")], 3).await,
        expected
    );
    assert_eq!(eg.redis.dbsize(), 1, "the counter is in Redis");
}

/// Envoy Gateway's tracing variables: spans go to the OTLP/HTTP endpoint under the service
/// name, namespace and instance (the pod's name) it sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tracing_variables_name_the_spans_as_the_gateway_sets_them() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let collector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", collector.local_addr().unwrap());
    let mut eg = Deployment::start_with(RedisServer::start(), |env, _| {
        env.extend([
            ("TRACING_ENABLED", "true".into()),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit".into()),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system".into()),
            (
                "TRACING_SERVICE_INSTANCE_ID",
                "envoy-ratelimit-7d9f8-x2x4q".into(),
            ),
            ("TRACING_SAMPLING_RATE", "1.0".into()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ]);
    })
    .await;
    let (rules, listener) = per_user(10);
    eg.push(vec![rules]).await;
    let envoy = eg.envoy(&[listener]).await;
    assert_eq!(
        statuses(envoy.ports[0], "/", &[("x-user-id", "traced")], 1).await,
        [with_limit(200, 10)]
    );
    let export = tokio::time::timeout(
        Duration::from_secs(30),
        super::super::reference_env::receive_otlp_http(&collector),
    )
    .await
    .expect("spans exported within 30 s");
    let resource = export.resource_spans[0].resource.as_ref().unwrap();
    let attribute = |key: &str| {
        resource
            .attributes
            .iter()
            .find(|attribute| attribute.key == key)
            .and_then(|attribute| attribute.value.as_ref()?.value.clone())
    };
    let text = |value: &str| Some(Value::StringValue(value.into()));
    assert_eq!(attribute("service.name"), text("envoy-ratelimit"));
    assert_eq!(attribute("service.namespace"), text("envoy-gateway-system"));
    assert_eq!(
        attribute("service.instance.id"),
        text("envoy-ratelimit-7d9f8-x2x4q")
    );
}

/// `count` requests at once over one HTTP/2 connection to Envoy's listener on `port`, each
/// with its own `x-user-id`: each answer's status and whether it carried a limit.
async fn burst(port: u16, count: usize) -> Vec<(u16, bool)> {
    let tcp = tokio::net::TcpStream::connect(loopback(port))
        .await
        .unwrap();
    let (client, connection) = h2::client::Builder::new()
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..count {
        let mut client = client.clone();
        calls.spawn(async move {
            client = client.ready().await.unwrap();
            let request = http::Request::get(format!("http://127.0.0.1:{port}/"))
                .header("x-user-id", format!("burst-{n}"))
                .body(())
                .unwrap();
            let (response, _) = client.send_request(request, true).unwrap();
            let response = response.await.unwrap();
            let answer = (
                response.status().as_u16(),
                response.headers().contains_key("x-ratelimit-limit"),
            );
            // Read whole, so that Envoy's frames to this client do not pile up.
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            answer
        });
    }
    calls.join_all().await
}

/// A burst of 1,000 calls from an Envoy (one worker) whose `ratelimit_cluster` sets no
/// stream limit, as the gateway's does, on a fresh connection: Envoy sends them all before
/// it has read tollgate's SETTINGS; none is refused (a refused call, with the gateway's
/// `failClosed`, would be a 500) and each is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_a_thousand_calls_on_a_fresh_connection_is_decided_in_full() {
    let eg = {
        let mut eg = Deployment::start().await;
        let (rules, _) = per_user(10);
        eg.push(vec![rules]).await;
        eg
    };
    let (_, mut listener) = per_user(10);
    listener.fail_closed = true;
    let dir = eg.dir.path().join("burst");
    std::fs::create_dir_all(&dir).unwrap();
    let flags = ["--concurrency", "1"];
    let envoy = Envoy::start(&dir, &[listener], eg.grpc, &eg.certs.envoy, &flags).await;
    away_from_the_hour_boundary().await;
    let answers = burst(envoy.ports[0], 1_000).await;
    let decided = answers
        .iter()
        .filter(|answer| **answer == (200, true))
        .count();
    assert_eq!(decided, 1_000, "answers other than decisions: {:?}", {
        let mut other: Vec<_> = answers
            .iter()
            .filter(|answer| **answer != (200, true))
            .collect();
        other.dedup();
        other
    });
    let stat = get(
        loopback(envoy.admin),
        "/stats?filter=ratelimit_cluster.upstream_cx_total",
        &[],
    )
    .await;
    assert!(
        stat.body
            .contains("cluster.ratelimit_cluster.upstream_cx_total: 1\n"),
        "one connection carried them all: {}",
        stat.body
    );
}
