//! Envoy Gateway's rate-limit deployment with tollgate's image and nothing else changed:
//! `/bin/ratelimit` with exactly the environment Envoy Gateway's controller writes (its 23
//! variables; only the addresses are this machine's loopback ones), its certificates
//! (`certs.rs`), its RateLimitConfigs pushed over xDS on mutual TLS by a control plane that
//! serves only the node `envoy-ratelimit`, and a real Envoy configured as the gateway's
//! translator configures it (`envoy.rs`). `cases.rs` and `policies.rs` port the gateway's
//! own global rate-limit end-to-end cases; `deployment.rs` what the deployment itself must do
//! (probes through a Redis outage, `egctl`'s view of the rules, Redis over TLS, tracing,
//! bursts); `ai_gateway.rs` Envoy AI Gateway's QuotaPolicy deployment beside it.

mod ai_gateway;
mod cases;
mod certs;
mod deployment;
mod envoy;
mod policies;

use std::net::SocketAddr;
use std::path::Path;

use crate::common;
use common::redis_process::RedisServer;
use common::xds::{ControlPlane, PlaneTls};
use common::{free_port, get};
use tollgate::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

use super::reference_env::{Ratelimit, start_ratelimit};
use certs::Certs;
use envoy::{Envoy, Listener};

/// The namespace of every resource of the gateway's end-to-end tests.
pub const NS: &str = "gateway-conformance-infra";

/// The statsd-exporter mapping Envoy Gateway mounts at `PROMETHEUS_MAPPER_YAML` (its
/// `statsd-exporter-config` ConfigMap): the response time is not scaled.
const MAPPER: &str = r#"mappings:
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "ratelimit_service_rate_limit_over_limit"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    labels:
      grpc_method: "$1"
"#;

/// The IR name of the listener `listener` of the gateway `gateway`: a listener's domain.
pub fn listener_domain(gateway: &str, listener: &str) -> String {
    format!("{NS}/{gateway}/{listener}")
}

/// The IR name of an HTTPRoute's first rule and match on the `*` host: its descriptor key.
pub fn route_key(route: &str) -> String {
    format!("httproute/{NS}/{route}/rule/0/match/0/*")
}

/// A rule of a RateLimitConfig: `key` (and `value`, if not empty) over `children`.
pub fn node(key: &str, value: &str, children: Vec<RateLimitDescriptor>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.to_owned(),
        value: value.to_owned(),
        descriptors: children,
        ..Default::default()
    }
}

/// A last link: `key` (and `value`) limited to `per_hour` an hour.
pub fn hourly(key: &str, value: &str, per_hour: u32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Hour as i32,
            requests_per_unit: per_hour,
            ..Default::default()
        }),
        ..node(key, value, Vec::new())
    }
}

/// A config as the gateway names it: after its domain.
pub fn config(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.to_owned(),
        domain: domain.to_owned(),
        descriptors,
    }
}

/// A response as the gateway's tests read it: the status and the `x-ratelimit-*` values,
/// every line of a header joined with `,`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub limit: Option<String>,
    pub remaining: Option<String>,
}

/// The rate-limit service as Envoy Gateway deploys it, with its control plane and Redis.
pub struct Deployment {
    pub dir: tempfile::TempDir,
    pub certs: Certs,
    pub redis: RedisServer,
    pub plane: ControlPlane,
    pub grpc: u16,
    /// `PROMETHEUS_ADDR`'s port.
    pub metrics: u16,
    /// `DEBUG_PORT`.
    pub debug: u16,
    pub ratelimit: Ratelimit,
    pushed: u32,
}

impl Deployment {
    pub async fn start() -> Self {
        Self::start_with(RedisServer::start(), |_, _| {}).await
    }

    /// Started on `redis`, with the environment changed by `edit` (given the deployment's
    /// directory) before the start.
    pub async fn start_with(
        redis: RedisServer,
        edit: impl FnOnce(&mut Vec<(&'static str, String)>, &Path),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let certs = Certs::generate(dir.path());
        let plane_tls = PlaneTls {
            cert: certs.plane.cert(),
            key: certs.plane.key(),
            client_ca: certs.plane.ca(),
        };
        let plane = ControlPlane::start(None, Some(&plane_tls)).await;
        let (grpc, metrics, debug) = (free_port(), free_port(), free_port());
        let mapper = dir.path().join("statsd-exporter/conf.yaml");
        std::fs::create_dir_all(mapper.parent().unwrap()).unwrap();
        std::fs::write(&mapper, MAPPER).unwrap();
        let [cert, key, ca] = certs.ratelimit.paths();
        let mut env: Vec<(&'static str, String)> = vec![
            (
                "RUNTIME_ROOT",
                dir.path().join("data").display().to_string(),
            ),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
            ("RUNTIME_IGNOREDOTFILES", "true".into()),
            ("RUNTIME_WATCH_ROOT", "false".into()),
            ("LOG_LEVEL", "info".into()),
            ("USE_STATSD", "false".into()),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
            (
                "CONFIG_GRPC_XDS_SERVER_URL",
                format!("localhost:{}", plane.addr.port()),
            ),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
            ("GRPC_SERVER_USE_TLS", "true".into()),
            ("GRPC_SERVER_TLS_CERT", cert.clone()),
            ("GRPC_SERVER_TLS_KEY", key.clone()),
            ("GRPC_SERVER_TLS_CA_CERT", ca.clone()),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{metrics}")),
            ("PROMETHEUS_MAPPER_YAML", mapper.display().to_string()),
            ("DEBUG_PORT", debug.to_string()),
        ];
        edit(&mut env, dir.path());
        let ratelimit = start_ratelimit(dir.path(), grpc, &env).await;
        Self {
            dir,
            certs,
            redis,
            plane,
            grpc,
            metrics,
            debug,
            ratelimit,
            pushed: 0,
        }
    }

    /// Serves `configs` as the gateway's next snapshot, and waits until tollgate took it.
    pub async fn push(&mut self, configs: Vec<RateLimitConfig>) {
        self.pushed += 1;
        let version = self.pushed.to_string();
        self.plane.push(&version, configs);
        self.plane
            .request_where(|request| {
                request.version_info == version
                    && request.error_detail.is_none()
                    && request
                        .node
                        .as_ref()
                        .is_some_and(|node| node.id == "envoy-ratelimit")
            })
            .await;
    }

    /// A real Envoy with `listeners`, calling this deployment with Envoy's certificate.
    pub async fn envoy(&self, listeners: &[Listener]) -> Envoy {
        let dir = self.dir.path().join(format!("envoy-{}", free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        Envoy::start(&dir, listeners, self.grpc, &self.certs.envoy, &[]).await
    }

    /// What `PROMETHEUS_ADDR` serves.
    pub async fn metrics(&self) -> String {
        get(loopback(self.metrics), "/metrics", &[]).await.body
    }

    /// Waits (30 s at most) until the `ratelimit_service_rate_limit_total_hits` samples of
    /// the limits whose labels name `route` add up to `hits`.
    pub async fn until_hits(&self, route: &str, hits: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let text = self.metrics().await;
            let counted: f64 = text
                .lines()
                .filter(|line| {
                    line.starts_with("ratelimit_service_rate_limit_total_hits{")
                        && line.contains(route)
                })
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            if counted as u64 == hits {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{counted} hits counted for {route}, not {hits}:\n{text}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// The sum of every `ratelimit_service_rate_limit_over_limit` sample, as the gateway's
    /// `OverLimitCount` reads it.
    pub async fn over_limit_count(&self) -> u64 {
        self.metrics()
            .await
            .lines()
            .filter(|line| line.starts_with("ratelimit_service_rate_limit_over_limit{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Sends `method path` to the gateway listener on `port` with `headers` (a `host` among
/// them replaces the default), over HTTP/1.1 as the gateway's tests do.
pub async fn send(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let host = headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("host"))
        .map_or_else(
            || format!("127.0.0.1:{port}"),
            |(_, host)| (*host).to_owned(),
        );
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case("host"))
    {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let response = common::exchange(loopback(port), request).await;
    let joined = |name: &str| {
        let values: Vec<&str> = response
            .headers
            .iter()
            .filter(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .collect();
        (!values.is_empty()).then(|| values.join(","))
    };
    Answer {
        status: response.status,
        limit: joined("x-ratelimit-limit"),
        remaining: joined("x-ratelimit-remaining"),
    }
}

/// `GET path` with `headers`, `count` times in turn: each answer's status and limit header.
pub async fn statuses(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    count: usize,
) -> Vec<(u16, Option<String>)> {
    let mut answers = Vec::new();
    for _ in 0..count {
        let answer = send(port, "GET", path, headers).await;
        answers.push((answer.status, answer.limit));
    }
    answers
}

/// `(status, Some(limit header))`, as the gateway's tests expect a limited answer.
pub fn with_limit(status: u16, limit: u32) -> (u16, Option<String>) {
    (status, Some(format!("{limit}, {limit};w=3600")))
}
