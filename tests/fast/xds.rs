//! Rules pushed by a control plane over xDS (`--config-xds`): a test control plane drives a
//! running tollgate through updates, a rejected snapshot, and its own restart; and start-up
//! before the first snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::xds::ControlPlane;
use common::*;
use tollgate::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tollgate::server::Options;
use tollgate::xds::XdsOptions;

/// Domain `domain` with key `k` limited to `n` per minute, as resource `name`.
fn config(name: &str, domain: &str, n: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// The limit a check-only call on `(k, x)` of `domain` reports: `None` when no rule matches;
/// `Some(0)` before any rules are loaded (the call is refused).
async fn limit_of(server: &TestServer, domain: &str) -> Option<u32> {
    let mut check = request(domain, &[&[("k", "x")]]);
    check.descriptors[0].hits_addend = Some(0);
    let response = match server.call(check).await {
        Ok(response) => response,
        Err(status) => {
            assert_eq!(
                (status.code(), status.message()),
                (tonic::Code::Unknown, "no rate limit configuration loaded")
            );
            return Some(0);
        }
    };
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|limit| limit.requests_per_unit)
}

/// How long until `domain` reports `expected` (at most 10 s).
async fn until_serving(server: &TestServer, domain: &str, expected: Option<u32>) -> Duration {
    let start = Instant::now();
    loop {
        let seen = limit_of(server, domain).await;
        if seen == expected {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{domain}: still {seen:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn follow(plane: &ControlPlane) -> XdsOptions {
    XdsOptions {
        server: plane.addr.to_string(),
        node_id: "test-node".into(),
        node_metadata: vec![("zone".into(), "a".into())],
        headers: vec![("x-token".into(), "secret".into())],
        tls: None,
        backoff: (Duration::from_millis(100), Duration::from_millis(500)),
        max_message_bytes: None,
        merge_domains: false,
    }
}

async fn start_following(plane: &ControlPlane, serve_before_config: bool) -> TestServer {
    let options = Options {
        xds: Some(follow(plane)),
        serve_before_config,
        probe_every: Duration::from_millis(100),
        ..Options::default()
    };
    start_with(
        &[],
        Setup {
            options,
            ..Setup::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_follow_the_control_plane_through_updates_a_rejection_and_its_restart() {
    let mut plane = ControlPlane::start(None, None).await;
    plane.push("1", vec![config("a", "a", 2)]);
    let server = start_following(&plane, false).await;
    until_serving(&server, "a", Some(2)).await;
    // The subscription: node id and metadata, wildcard, our type, the token header.
    let first = plane.requests()[0].clone();
    let node = first.node.unwrap();
    assert_eq!(node.id, "test-node");
    assert!(first.resource_names.is_empty());
    assert_eq!(first.type_url, tollgate::xds::TYPE_URL);
    assert_eq!(plane.tokens(), [Some("secret".to_owned())]);
    plane
        .request_where(|r| {
            r.version_info == "1" && r.response_nonce == "1" && r.error_detail.is_none()
        })
        .await;

    // A changed limit and an added domain.
    plane.push("2", vec![config("a", "a", 5), config("b", "b", 3)]);
    let changed = until_serving(&server, "a", Some(5)).await;
    assert!(changed < Duration::from_secs(1), "took {changed:?}");
    assert_eq!(limit_of(&server, "b").await, Some(3));
    plane
        .request_where(|r| {
            r.version_info == "2" && r.response_nonce == "2" && r.error_detail.is_none()
        })
        .await;
    // A removed domain.
    plane.push("3", vec![config("a", "a", 5)]);
    let removed = until_serving(&server, "b", None).await;
    assert!(removed < Duration::from_secs(1), "took {removed:?}");

    // An invalid snapshot: NACK naming the resource, the version still 3, decisions unchanged.
    let mut broken = config("broken-a", "a", 9);
    broken.descriptors[0].rate_limit.as_mut().unwrap().unit = RateLimitUnit::Unknown as i32;
    plane.push("4", vec![broken]);
    let nack = plane.request_where(|r| r.response_nonce == "4").await;
    assert_eq!(nack.version_info, "3");
    let detail = nack.error_detail.unwrap();
    assert_eq!(detail.code, tonic::Code::InvalidArgument as i32);
    assert!(
        detail.message.starts_with("xds:broken-a: domain \"a\""),
        "{}",
        detail.message
    );
    assert_eq!(limit_of(&server, "a").await, Some(5));
    let (_, config_page) = server.http("GET", "/config", "").await;
    assert!(config_page.contains("source: xds"), "{config_page}");
    assert!(config_page.contains("version 3"), "{config_page}");
    let (_, metrics) = server.http("GET", "/metrics", "").await;
    assert!(
        metrics.contains("tollgate_config_source_info{source=\"xds\",version=\"3\"} 1"),
        "{metrics}"
    );

    // The control plane goes away: decisions go on with the last good rules.
    plane.stop().await;
    for remaining in [4, 3] {
        let response = server.ok(request("a", &[&[("k", "y")]])).await;
        assert_eq!(response.statuses[0].limit_remaining, remaining);
    }
    // Back, with a new snapshot: the stream is re-established (its first request carries the
    // version applied) and the snapshot applied.
    let streams_before = plane.tokens().len();
    plane.push("5", vec![config("a", "a", 7)]);
    plane.restart(None).await;
    until_serving(&server, "a", Some(7)).await;
    // The counter of (k, y) lived through the update: 2 used, 7 now allowed.
    let response = server.ok(request("a", &[&[("k", "y")]])).await;
    assert_eq!(response.statuses[0].limit_remaining, 4);
    assert!(plane.tokens().len() > streams_before, "a new stream");
    plane
        .request_where(|r| r.version_info == "3" && r.response_nonce.is_empty())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_first_snapshot_not_ready_unless_told_to_serve_before_it() {
    let plane = ControlPlane::start(None, None).await;
    let waiting = start_following(&plane, false).await;
    let readyz = |server: &TestServer| {
        let addr = server.http;
        async move { http(addr, "GET", "/readyz", "").await.0 }
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        readyz(&waiting).await,
        500,
        "not ready before the first snapshot"
    );
    // Calls are refused meanwhile, with the reference's words.
    assert_eq!(limit_of(&waiting, "a").await, Some(0));
    let eager = start_following(&plane, true).await;
    assert_eq!(readyz(&eager).await, 200, "ready at once when told to");
    // Unknown domains are answered OK meanwhile, as the reference does.
    let unknown = eager.ok(request("nobody", &[&[("k", "x")]])).await;
    assert_eq!(unknown.overall_code, OK);

    plane.push("1", vec![config("a", "a", 2)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while readyz(&waiting).await != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready after the first snapshot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(limit_of(&waiting, "a").await, Some(2));
}

/// The reference's field 8: a descriptor's metadata pushed by the control plane is served as
/// dynamic metadata, exactly as the YAML `metadata`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_pushed_with_a_descriptor_is_served_as_dynamic_metadata() {
    use prost_types::value::Kind;
    let plane = ControlPlane::start(None, None).await;
    let mut tagged = config("a", "a", 2);
    let string = |text: &str| prost_types::Value {
        kind: Some(Kind::StringValue(text.into())),
    };
    tagged.descriptors[0].metadata = Some(prost_types::Struct {
        fields: [
            ("backend".to_owned(), string("gpt-small")),
            (
                "tier".to_owned(),
                prost_types::Value {
                    kind: Some(Kind::StructValue(prost_types::Struct {
                        fields: [(
                            "level".to_owned(),
                            prost_types::Value {
                                kind: Some(Kind::NumberValue(2.0)),
                            },
                        )]
                        .into(),
                    })),
                },
            ),
        ]
        .into(),
    });
    plane.push("1", vec![tagged]);
    let options = Options {
        xds: Some(follow(&plane)),
        probe_every: Duration::from_millis(100),
        service: tollgate::service::ServiceOptions {
            dynamic_metadata: true,
            ..Default::default()
        },
        ..Options::default()
    };
    let server = start_with(
        &[],
        Setup {
            options,
            ..Setup::default()
        },
    )
    .await;
    until_serving(&server, "a", Some(2)).await;
    let response = server.ok(request("a", &[&[("k", "x")]])).await;
    assert_eq!(
        struct_json(response.dynamic_metadata.as_ref().unwrap())["metadata"],
        serde_json::json!({"backend": "gpt-small", "tier": {"level": 2.0}})
    );
}
