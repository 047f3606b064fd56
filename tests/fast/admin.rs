//! The HTTP admin endpoints and health, over real listeners.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;
use tollgate::server::Options;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

const CONFIG: &str = r#"
domain: dummy
descriptors:
  - key: one_per_day
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: parent
    value: p
    descriptors:
      - key: child
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5, name: kid}
"#;

#[tokio::test]
async fn json_maps_ok_to_200_over_limit_to_429_and_bad_input_to_400() {
    let server = start_with(&[("dummy.yaml", CONFIG)], writes_on()).await;
    let body = r#"{"domain":"dummy","descriptors":[{"entries":[{"key":"one_per_day","value":"something"}]}]}"#;
    assert_eq!(
        server.http("POST", "/json", body).await,
        (200, r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":1,"unit":"DAY"},"durationUntilReset":"84178s"}]}"#.to_owned())
    );
    assert_eq!(
        server.http("POST", "/json", body).await,
        (429, r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":1,"unit":"DAY"},"durationUntilReset":"84178s"}]}"#.to_owned())
    );
    let unlimited =
        r#"{"domain":"dummy","descriptors":[{"entries":[{"key":"free","value":"x"}]}]}"#;
    assert_eq!(
        server.http("POST", "/json", unlimited).await,
        (
            200,
            r#"{"overallCode":"OK","statuses":[{"code":"OK","limitRemaining":4294967295}]}"#
                .to_owned()
        )
    );
    assert_eq!(server.http("POST", "/json", "").await.0, 400);
    assert_eq!(server.http("POST", "/json", "{not json").await.0, 400);
    assert_eq!(
        server
            .http("POST", "/json", r#"{"domain":"","descriptors":[]}"#)
            .await,
        (400, "bad request: domain: must not be empty\n".to_owned())
    );
}

#[tokio::test]
async fn config_lists_one_line_per_limit() {
    let server = start(&[("dummy.yaml", CONFIG)]).await;
    assert_eq!(
        server.http("GET", "/config", "").await,
        (
            200,
            "dummy.free: unlimited, shadow_mode: false, quota_mode: false\n\
             dummy.one_per_day: unit=DAY requests_per_unit=1, shadow_mode: false, quota_mode: false\n\
             dummy.parent_p.child: unit=SECOND requests_per_unit=5, shadow_mode: true, quota_mode: false\n"
                .to_owned()
        )
    );
}

#[tokio::test]
async fn config_names_what_a_limits_charges_are_and_a_concurrency_limit() {
    let rules = r#"
domain: ai
descriptors:
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 10000, charges: usage}
  - key: in_flight
    rate_limit: {name: in_flight, unit: minute, requests_per_unit: 4, algorithm: concurrency}
"#;
    let server = start(&[("ai.yaml", rules)]).await;
    assert_eq!(
        server.http("GET", "/config", "").await,
        (
            200,
            "ai.in_flight: unit=MINUTE requests_per_unit=4 algorithm=concurrency, shadow_mode: false, quota_mode: false\n\
             ai.tokens: unit=HOUR requests_per_unit=10000 charges=usage, shadow_mode: false, quota_mode: false\n"
                .to_owned()
        )
    );
}

async fn grpc_health(
    server_addr: std::net::SocketAddr,
    service: &str,
) -> Result<i32, tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{server_addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = HealthClient::new(channel);
    client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|response| response.into_inner().status)
}

#[tokio::test]
async fn health_serves_the_three_names_then_flips_to_not_serving_on_shutdown() {
    let options = Options {
        shutdown: tollgate::shutdown::ShutdownOptions {
            delay: Duration::from_secs(2),
            ..Default::default()
        },
        ..Options::default()
    };
    let mut server = start_with(
        &[("dummy.yaml", CONFIG)],
        Setup {
            options,
            ..Setup::default()
        },
    )
    .await;
    for name in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        assert_eq!(
            grpc_health(server.grpc, name).await.unwrap(),
            ServingStatus::Serving as i32,
            "{name:?}"
        );
    }
    assert_eq!(
        server.http("GET", "/healthcheck", "").await,
        (200, "OK".to_owned())
    );
    assert_eq!(
        server.http("GET", "/healthz", "").await,
        (200, "OK".to_owned())
    );

    server.trigger_stop();
    // During the shutdown delay the listeners still answer, and say NOT_SERVING.
    let mut flipped = false;
    for _ in 0..100 {
        if grpc_health(server.grpc, "ratelimit").await.unwrap() == ServingStatus::NotServing as i32
        {
            flipped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(flipped, "health never flipped");
    for name in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        assert_eq!(
            grpc_health(server.grpc, name).await.unwrap(),
            ServingStatus::NotServing as i32
        );
    }
    assert_eq!(
        server.http("GET", "/healthcheck", "").await,
        (500, "NOT OK".to_owned())
    );
    assert_eq!(server.http("GET", "/readyz", "").await.0, 500);
    assert_eq!(server.http("GET", "/healthz", "").await.0, 200);
    // Decisions are still answered while draining.
    let response = server.ok(request("dummy", &[&[("free", "x")]])).await;
    assert_eq!(response.overall_code, OK);
    server.take_task().await.unwrap().unwrap();
}

#[tokio::test]
async fn in_flight_calls_finish_when_shutdown_starts() {
    let mut server = start(&[("dummy.yaml", CONFIG)]).await;
    let client = server.client().await;
    let calls: Vec<_> = (0..50)
        .map(|n| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .should_rate_limit(request("dummy", &[&[("one_per_day", &n.to_string())]]))
                    .await
            })
        })
        .collect();
    tokio::task::yield_now().await;
    server.trigger_stop();
    let mut answered = 0;
    let mut refused = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(response) => {
                assert_eq!(
                    shapes(&response.into_inner()),
                    [limited(OK, "1/DAY", 0, 84_178)]
                );
                answered += 1;
            }
            // Calls that had not reached the server before it stopped accepting are refused
            // by the transport, never cut off half-way with a wrong answer.
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                refused += 1;
            }
        }
    }
    assert_eq!(answered + refused, 50);
    server.take_task().await.unwrap().unwrap();
}

/// `--admin-token`: the mutating endpoints want it as a bearer token (401 without it or with
/// another); reads stay open. `--admin-writes off`: they answer 403 whatever is sent. With
/// neither token nor `--admin-writes on` (the default), they are off.
#[tokio::test]
async fn the_admin_token_guards_the_mutating_endpoints_and_writes_can_be_turned_off() {
    use tollgate::admin::writes::{AdminWrites, WritesMode};
    let body =
        r#"{"domain":"dummy","descriptors":[{"entries":[{"key":"one_per_day","value":"x"}]}]}"#;
    let guarded = start_with(
        &[("admin.yaml", CONFIG)],
        Setup {
            options: Options {
                admin_writes: AdminWrites {
                    mode: WritesMode::Auto,
                    token: Some("s3cret".into()),
                },
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    for path in ["/json", "/reset"] {
        let (status, text) = guarded.http("POST", path, body).await;
        assert_eq!(status, 401, "{path}: {text}");
        let wrong = [("Authorization", "Bearer s3cre")];
        assert_eq!(
            http_with(guarded.http, "POST", path, body, &wrong).await.0,
            401
        );
    }
    let right = [("Authorization", "Bearer s3cret")];
    assert_eq!(
        http_with(guarded.http, "POST", "/json", body, &right)
            .await
            .0,
        200
    );
    assert_eq!(
        http_with(guarded.http, "POST", "/reset", body, &right).await,
        (200, r#"{"reset":1}"#.to_owned())
    );
    assert_eq!(
        guarded.http("GET", "/config", "").await.0,
        200,
        "reads stay open"
    );

    let off = start_with(
        &[("admin.yaml", CONFIG)],
        Setup {
            options: Options {
                admin_writes: AdminWrites {
                    mode: WritesMode::Off,
                    token: Some("s3cret".into()),
                },
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    for path in ["/json", "/reset"] {
        let (status, text) = off.http("POST", path, body).await;
        assert_eq!(
            (status, text.as_str()),
            (403, "disabled: this server runs with --admin-writes off\n"),
            "{path}"
        );
    }
    assert_eq!(off.http("GET", "/metrics", "").await.0, 200);

    let by_default = start(&[("admin.yaml", CONFIG)]).await;
    for path in ["/json", "/reset"] {
        assert_eq!(
            by_default.http("POST", path, body).await,
            (
                403,
                "disabled: set --admin-token (callers then send it) or --admin-writes on\n"
                    .to_owned()
            ),
            "{path}"
        );
    }
}

/// `--admin-writes on`: the mutating endpoints open without a token.
fn writes_on() -> Setup {
    Setup {
        options: Options {
            admin_writes: tollgate::admin::writes::AdminWrites {
                mode: tollgate::admin::writes::WritesMode::On,
                token: None,
            },
            ..Options::default()
        },
        ..Setup::default()
    }
}

/// A store whose client is stuck while `stuck` is set (as `storage/redis/doctor.rs` reports
/// it), and answers otherwise.
struct StuckWhile {
    stuck: std::sync::atomic::AtomicBool,
}

#[tonic::async_trait]
impl tollgate::storage::CounterStore for StuckWhile {
    async fn apply(
        &self,
        hits: &[tollgate::storage::Hit],
    ) -> Result<Vec<tollgate::algorithm::Outcome>, tollgate::storage::StoreError> {
        Ok(vec![tollgate::algorithm::Outcome::default(); hits.len()])
    }

    async fn ping(&self) -> Result<(), tollgate::storage::StoreError> {
        if self.stuck.load(std::sync::atomic::Ordering::SeqCst) {
            Err(tollgate::storage::StoreError::Stuck(
                "every call has failed for 61s".into(),
            ))
        } else {
            Ok(())
        }
    }
}

#[tonic::async_trait]
impl tollgate::storage::CounterReset for StuckWhile {
    async fn forget(
        &self,
        _: &[tollgate::storage::Hit],
    ) -> Result<(), tollgate::storage::StoreError> {
        Ok(())
    }
}

/// Polls `path` until it answers `status`, for up to 10 s.
async fn answers(server: &TestServer, path: &str, status: u16) -> (u16, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = server.http("GET", path, "").await;
        if answer.0 == status || std::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn liveness_fails_while_the_store_reports_its_client_stuck_and_only_then() {
    let store = std::sync::Arc::new(StuckWhile {
        stuck: std::sync::atomic::AtomicBool::new(false),
    });
    let server = start_with(
        &[("dummy.yaml", CONFIG)],
        Setup {
            own_store: Some(tollgate::storage::Store::local(std::sync::Arc::clone(
                &store,
            ))),
            options: Options {
                probe_every: Duration::from_millis(50),
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    assert_eq!(
        server.http("GET", "/healthz", "").await,
        (200, "OK".to_owned())
    );
    store.stuck.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        answers(&server, "/healthz", 500).await,
        (
            500,
            "store client stuck: every call has failed for 61s\n".to_owned()
        )
    );
    assert_eq!(server.http("GET", "/readyz", "").await.0, 500);
    store
        .stuck
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        answers(&server, "/healthz", 200).await,
        (200, "OK".to_owned())
    );
    assert_eq!(answers(&server, "/readyz", 200).await.0, 200);
}
