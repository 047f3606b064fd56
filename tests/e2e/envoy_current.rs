//! What Envoy 1.38+ and the reference's main send, through a real Envoy (deploy/envoy/envoy.yaml
//! with its ports changed and a route or two added): refunds on stream done
//! (`is_negative_hits`), limit state for the upstream (`--upstream-limit-headers`), and
//! connections that age out so that a new replica behind one address gets a share.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::envoy::*;
use common::proxy::Proxy;
use common::*;

/// The catch-all route of deploy/envoy/envoy.yaml, before which the tests add theirs.
const CATCH_ALL: &str = "                        - match: {prefix: /}\n                          route: {cluster: app}\n";

/// The application's one route, which the tests make echo what the upstream received.
const APP_ROUTE: &str = "                          direct_response: {status: 200, body: {inline_string: \"hello\\n\"}}\n";

fn with_route(text: String, route: &str) -> String {
    assert!(
        text.contains(CATCH_ALL),
        "deploy/envoy/envoy.yaml's catch-all route"
    );
    text.replace(CATCH_ALL, &format!("{route}{CATCH_ALL}"))
}

/// The application answers with `x-upstream-saw: LIMIT/REMAINING/RESET` as it received them.
fn echoing_upstream_headers(text: String) -> String {
    assert!(
        text.contains(APP_ROUTE),
        "deploy/envoy/envoy.yaml's application"
    );
    let echo = "                          response_headers_to_add:\n                            - header: {key: x-upstream-saw, value: \"%REQ(ratelimit-limit)%/%REQ(ratelimit-remaining)%/%REQ(ratelimit-reset)%\"}\n";
    text.replace(APP_ROUTE, &format!("{APP_ROUTE}{echo}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_sees_the_limit_state_and_the_client_does_not() {
    let grpc = free_port();
    let ports = ports([grpc, grpc]);
    let dir = tempfile::tempdir().unwrap();
    let replica = Replica::spawn_on(
        Path::new("deploy/config"),
        grpc,
        &["--upstream-limit-headers"],
    );
    replica.wait_ready().await;
    let _envoy = start_envoy_edited(&ports, dir.path(), None, echoing_upstream_headers).await;
    away_from_the_hour_boundary().await;
    for remaining in [2, 1, 0] {
        let before = hour_left();
        let response = api(ports.fail_open, "/api", "upstream").await;
        let after = hour_left();
        assert_eq!(response.status, 200, "{}", response.body);
        let saw = response.header("x-upstream-saw").unwrap().to_owned();
        let parts: Vec<&str> = saw.split('/').collect();
        assert_eq!(parts[..2], ["3", &remaining.to_string()], "{saw}");
        let reset: u64 = parts[2].parse().unwrap();
        assert!(
            (after..=before).contains(&reset),
            "reset {reset}, expected {after}..={before}"
        );
        // Not the client's: only Envoy's own draft-03 headers reach it.
        assert_eq!(response.header("ratelimit-limit"), None);
        assert_eq!(response.header("ratelimit-remaining"), None);
    }
}

/// A budget of tokens: 1000 an hour per user, charged 5 on the request and given back 3 when
/// the stream is done (Envoy 1.38+: `hits_addend` with `is_negative_hits`, `apply_on_stream_done`).
const TOKENS: &str = r#"
domain: edge
descriptors:
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 1000}
"#;

const TOKENS_ROUTE: &str = r#"                        - match: {prefix: /tokens}
                          route: {cluster: app}
                          typed_per_filter_config:
                            envoy.filters.http.ratelimit:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                              rate_limits:
                                - actions:
                                    - request_headers: {header_name: x-user-id, descriptor_key: tokens}
                                  hits_addend: {number: 5}
                                - actions:
                                    - request_headers: {header_name: x-user-id, descriptor_key: tokens}
                                  apply_on_stream_done: true
                                  hits_addend: {number: 3, is_negative_hits: true}
"#;

/// What remains of `user`'s token budget, asked check-only.
async fn tokens_left(grpc: u16, user: &str) -> u32 {
    let mut client =
        tollgate::pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
            .await
            .unwrap();
    let mut check = request("edge", &[&[("tokens", user)]]);
    check.descriptors[0].hits_addend = Some(0);
    let response = client.should_rate_limit(check).await.unwrap().into_inner();
    response.statuses[0].limit_remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gives_back_on_stream_done_what_it_charged_on_the_request() {
    let config = config_dir(&[("tokens.yaml", TOKENS)]);
    let grpc = free_port();
    let ports = ports([grpc, grpc]);
    let dir = tempfile::tempdir().unwrap();
    let replica = Replica::spawn_on(config.path(), grpc, &[]);
    replica.wait_ready().await;
    let _envoy = start_envoy_edited(&ports, dir.path(), None, |text| {
        with_route(text, TOKENS_ROUTE)
    })
    .await;
    away_from_the_hour_boundary().await;
    const REQUESTS: u32 = 4;
    for _ in 0..REQUESTS {
        let response = api(ports.fail_closed, "/tokens", "carol").await;
        assert_eq!(response.status, 200, "{}", response.body);
    }
    // The refunds are sent when each stream is done, without waiting for an answer: give
    // the last one a moment to arrive.
    let expected = 1000 - REQUESTS * (5 - 3);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = tokens_left(grpc, "carol").await;
        if left == expected {
            break;
        }
        assert!(
            left < expected && Instant::now() < deadline,
            "{left} tokens left, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And it stays there: nothing more is charged or refunded.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(tokens_left(grpc, "carol").await, expected);
}

/// The decisions a replica has answered, from its /metrics.
async fn answered(replica: &Replica) -> u64 {
    let metrics = get(replica.http_addr(), "/metrics", &[]).await.body;
    metrics
        .lines()
        .filter(|line| line.starts_with("tollgate_requests_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_behind_one_address_gets_a_share_once_connections_age_out() {
    let config = Path::new("deploy/config");
    // Two seconds, one of grace: a few minutes in production (deploy/k8s).
    let aging = [
        "--grpc-max-connection-age",
        "2s",
        "--grpc-max-connection-age-grace",
        "1s",
    ];
    let first = Replica::spawn_on(config, free_port(), &aging);
    first.wait_ready().await;
    // The Service: one address, new connections dealt to the replicas in turn.
    let service = Proxy::start(loopback(first.grpc)).await;
    let ports = ports([service.addr.port(), service.addr.port()]);
    let dir = tempfile::tempdir().unwrap();
    let _envoy = start_envoy(&ports, dir.path(), None).await;
    away_from_the_hour_boundary().await;
    // Each request its own user, so none is over its limit: every answer is 200.
    let mut sent = 0;
    let mut send = async || {
        sent += 1;
        let response = api(ports.fail_closed, "/api", &format!("user-{sent}")).await;
        assert_eq!(response.status, 200, "request {sent}: {}", response.body);
    };
    for _ in 0..10 {
        send().await;
    }
    let second = Replica::spawn_on(config, free_port(), &aging);
    second.wait_ready().await;
    service.add_target(loopback(second.grpc));
    let started = Instant::now();
    // Within the age plus its grace (and Envoy's reconnect), the second replica answers;
    // no request fails meanwhile (fail-closed would answer 503).
    while answered(&second).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the second replica got no decision in 15 s"
        );
        send().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..20 {
        send().await;
    }
    assert!(answered(&first).await > 0);
}
