//! Envoy AI Gateway's QuotaPolicy deployment: a second `/bin/ratelimit` (started with an
//! argument, as its manifests start it) fed over plain-text xDS as the node
//! `envoy-ai-gateway-ratelimit`, one domain, `ai-gateway-quota`, whose limits are all in
//! quota mode: `backend_name` (`<namespace>/<AIServiceBackend>`), then
//! `model_name_override`, then one link per bucket rule (`rule-<r>-<header>|<value>-match-<m>`)
//! and the model's default bucket (`rule-<rules>-match--1`), with a service quota for any
//! model. Envoy sends one descriptor per bucket a request falls in, each charged 1 when the
//! request arrives and its token cost when the response ends. Decided as the reference
//! decides quota mode: a request is refused only when every quota descriptor it carries is
//! over its limit; each descriptor's own status says whether it is.

use tollgate::pb;
use tollgate::pb::ratelimit::config::ratelimit::v3::RateLimitDescriptor;

use super::super::reference_env::start_ratelimit_with;
use super::{config, hourly, node};
use crate::common::redis_process::RedisServer;
use crate::common::xds::ControlPlane;
use crate::common::{away_from_the_hour_boundary, descriptor, free_port};

const DOMAIN: &str = "ai-gateway-quota";
const BACKEND: &str = "default/openai";
const MODEL: &str = "gpt-4o-mini";
const TENANT_RULE: &str = "rule-0-x-tenant|acme-match-0";
const DEFAULT_BUCKET: &str = "rule-1-match--1";

fn quota(mut limit: RateLimitDescriptor) -> RateLimitDescriptor {
    limit.quota_mode = true;
    limit
}

/// A QuotaPolicy with one bucket rule (tenant `acme`, 3 an hour), the model's default
/// bucket (5 an hour), and a service quota for every other model (1,000 an hour).
fn policy() -> pb::ratelimit::config::ratelimit::v3::RateLimitConfig {
    let service = quota(hourly("model_name_override", "", 1_000));
    config(
        DOMAIN,
        vec![node(
            "backend_name",
            BACKEND,
            vec![
                node(
                    "model_name_override",
                    MODEL,
                    vec![
                        quota(hourly(TENANT_RULE, TENANT_RULE, 3)),
                        quota(hourly(DEFAULT_BUCKET, DEFAULT_BUCKET, 5)),
                    ],
                ),
                service,
            ],
        )],
    )
}

/// What Envoy sends for a request of `model` from tenant `acme` (or from anyone), charged
/// `cost`.
fn request(model: &str, acme: bool, cost: u32) -> pb::RateLimitRequest {
    let bucket = |rule: &str| {
        descriptor(&[
            ("backend_name", BACKEND),
            ("model_name_override", model),
            (rule, rule),
        ])
    };
    let mut descriptors = Vec::new();
    if acme {
        descriptors.push(bucket(TENANT_RULE));
    }
    descriptors.push(bucket(DEFAULT_BUCKET));
    pb::RateLimitRequest {
        domain: DOMAIN.into(),
        descriptors,
        hits_addend: cost,
    }
}

type Codes = (i32, Vec<i32>);

fn codes(response: &pb::RateLimitResponse) -> Codes {
    (
        response.overall_code,
        response.statuses.iter().map(|status| status.code).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_policy_deployment_decides_quota_mode_as_the_reference() {
    use pb::rate_limit_response::Code;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let plane = ControlPlane::start(None, None).await;
    plane.push("1", vec![policy()]);
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        (
            "CONFIG_GRPC_XDS_NODE_ID",
            "envoy-ai-gateway-ratelimit".into(),
        ),
        ("CONFIG_GRPC_XDS_SERVER_URL", plane.addr.to_string()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("USE_STATSD", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
    ];
    let grpc = free_port();
    let _ratelimit =
        start_ratelimit_with(dir.path(), grpc, &env, &["--unknown-to-the-reference"]).await;
    plane
        .request_where(|request| {
            request.version_info == "1"
                && request
                    .node
                    .as_ref()
                    .is_some_and(|node| node.id == "envoy-ai-gateway-ratelimit")
        })
        .await;
    let mut client = pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    away_from_the_hour_boundary().await;
    let mut decide = async |request: pb::RateLimitRequest| {
        codes(
            &client
                .should_rate_limit(request)
                .await
                .unwrap()
                .into_inner(),
        )
    };

    // acme's bucket (3) runs out first; the default bucket (5) still admits: only when both
    // are over is the request refused.
    let mut acme = Vec::new();
    for _ in 0..6 {
        acme.push(decide(request(MODEL, true, 1)).await);
    }
    assert_eq!(
        acme,
        [
            (ok, vec![ok, ok]),
            (ok, vec![ok, ok]),
            (ok, vec![ok, ok]),
            (ok, vec![over, ok]),
            (ok, vec![over, ok]),
            (over, vec![over, over]),
        ]
    );
    // The default bucket is everyone's: spent by acme, it refuses another tenant at once.
    assert_eq!(decide(request(MODEL, false, 1)).await, (over, vec![over]));
    // A stream's token cost at its end (`quota_cost`): counted whatever the answer.
    assert_eq!(decide(request(MODEL, false, 250)).await, (over, vec![over]));
    // Another model falls under the service quota (a descriptor per model, 1,000 an hour),
    // its default-bucket key unknown there: only the model's own link is limited.
    let other = pb::RateLimitRequest {
        domain: DOMAIN.into(),
        descriptors: vec![descriptor(&[
            ("backend_name", BACKEND),
            ("model_name_override", "gpt-5"),
        ])],
        hits_addend: 999,
    };
    assert_eq!(decide(other.clone()).await, (ok, vec![ok]));
    assert_eq!(decide(other).await, (over, vec![over]));
}
