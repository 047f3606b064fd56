//! The reference's stats from tollgate started in reference mode: the statsd lines its plain
//! statsd sink writes (TCP, tags in the name), and with USE_PROMETHEUS the series its
//! Prometheus sink serves, for one scripted sequence: admitted, near the limit, over it, a
//! shadow limit, a detailed metric and an extra tag.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncBufReadExt;
use tollgate::pb;

const RULES: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: client
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
";

/// Starts `tollgate` in reference mode on the memory store with `env`, plays the sequence,
/// and returns the process and its admin address.
async fn play(env: &[(&str, String)]) -> (ChildGuard, std::net::SocketAddr, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("edge.yaml"), RULES).unwrap();
    let (grpc, http) = (free_port(), free_port());
    let process = spawn_reference(root.path(), grpc, http, env);
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], http));
    let deadline = Instant::now() + Duration::from_secs(60);
    while readyz_status(admin).await != Some(200) {
        assert!(Instant::now() < deadline, "tollgate never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client = pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    let mut codes = Vec::new();
    for pairs in [
        [("user", "alice")],
        [("user", "alice")],
        [("user", "alice")],
        [("user", "alice")],
        [("trial", "t")],
        [("trial", "t")],
        [("client", "c1")],
    ] {
        let response = client
            .should_rate_limit(request("edge", &[&pairs]))
            .await
            .unwrap()
            .into_inner();
        codes.push(response.overall_code);
    }
    // OK ×3, OVER_LIMIT, then the shadow limit answers OK even when over.
    assert_eq!(codes, [1, 1, 1, 2, 1, 1, 1]);
    (process, admin, root)
}

/// What the sequence gives, by the reference's arithmetic (near: the hits past
/// floor(limit × 0.8) while admitted; over: the hits past the limit, counted even in shadow
/// mode, where shadow_mode counts them too).
const EXPECTED: [(&str, u64); 13] = [
    ("ratelimit.service.config_load_success", 1),
    ("ratelimit.service.rate_limit.edge.client_c1.total_hits", 1),
    (
        "ratelimit.service.rate_limit.edge.client_c1.within_limit",
        1,
    ),
    ("ratelimit.service.rate_limit.edge.trial.near_limit", 1),
    ("ratelimit.service.rate_limit.edge.trial.over_limit", 1),
    ("ratelimit.service.rate_limit.edge.trial.shadow_mode", 1),
    ("ratelimit.service.rate_limit.edge.trial.total_hits", 2),
    ("ratelimit.service.rate_limit.edge.trial.within_limit", 1),
    ("ratelimit.service.rate_limit.edge.user.near_limit", 1),
    ("ratelimit.service.rate_limit.edge.user.over_limit", 1),
    ("ratelimit.service.rate_limit.edge.user.total_hits", 4),
    ("ratelimit.service.rate_limit.edge.user.within_limit", 3),
    ("ratelimit_server.ShouldRateLimit.total_requests", 7),
];

fn expected() -> BTreeMap<String, u64> {
    EXPECTED
        .iter()
        .map(|(name, count)| ((*name).to_owned(), *count))
        .collect()
}

/// The rules of the reference's statsd_exporter mapping example, as globs (`*` is one name
/// part); what none matches falls to its last rule, which drops it (shadow_mode and
/// ratelimit_server.*, for the reference as for tollgate).
const EXPORTER_GLOBS: [&str; 11] = [
    "ratelimit.service.rate_limit.*.*.near_limit",
    "ratelimit.service.rate_limit.*.*.over_limit",
    "ratelimit.service.rate_limit.*.*.total_hits",
    "ratelimit.service.rate_limit.*.*.within_limit",
    "ratelimit.service.rate_limit.*.*.*.near_limit",
    "ratelimit.service.rate_limit.*.*.*.over_limit",
    "ratelimit.service.rate_limit.*.*.*.total_hits",
    "ratelimit.service.rate_limit.*.*.*.within_limit",
    "ratelimit.service.call.should_rate_limit.*",
    "ratelimit.service.config_load_success",
    "ratelimit.service.config_load_error",
];

fn glob_matches(glob: &str, name: &str) -> bool {
    let (globs, names): (Vec<&str>, Vec<&str>) =
        (glob.split('.').collect(), name.split('.').collect());
    globs.len() == names.len()
        && globs
            .iter()
            .zip(&names)
            .all(|(glob, part)| *glob == "*" && !part.is_empty() || glob == part)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_statsd_goes_over_tcp_with_tags_in_the_name_as_the_reference_writes_it() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_process, _admin, _root) = play(&[
        ("USE_STATSD", "true".into()),
        ("STATSD_HOST", "127.0.0.1".into()),
        ("STATSD_PORT", port.to_string()),
        ("STATS_FLUSH_INTERVAL", "200ms".into()),
        ("EXTRA_TAGS", "env:prod.eu".into()),
    ])
    .await;

    let (stream, _) = tokio::time::timeout(Duration::from_secs(20), listener.accept())
        .await
        .expect("tollgate connects to statsd over TCP")
        .unwrap();
    let mut lines = tokio::io::BufReader::new(stream).lines();
    let expected = expected();
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while totals != expected {
        let Ok(Ok(Some(line))) = tokio::time::timeout_at(deadline, lines.next_line()).await else {
            break;
        };
        // `name.__env=prod_eu:N|c`: a counter, the tag in the name with its dots made `_`.
        let (name, rest) = line.split_once(':').expect("name:value|type");
        let name = name
            .strip_suffix(".__env=prod_eu")
            .unwrap_or_else(|| panic!("the tag ends the name: {line}"));
        let value = rest
            .strip_suffix("|c")
            .unwrap_or_else(|| panic!("a counter: {line}"));
        let value: u64 = value.parse().unwrap();
        assert!(value > 0, "zero deltas are not sent: {line}");
        *totals.entry(name.to_owned()).or_default() += value;
    }
    assert_eq!(totals, expected);
    for name in totals.keys() {
        let mapped = EXPORTER_GLOBS.iter().any(|glob| glob_matches(glob, name));
        let dropped = name.ends_with(".shadow_mode") || name.starts_with("ratelimit_server.");
        assert!(
            mapped != dropped,
            "{name}: mapped {mapped}, dropped {dropped}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_prometheus_serves_the_reference_series_beside_tollgate_s() {
    let metrics_port = free_port();
    let (_process, admin, _root) = play(&[
        ("USE_STATSD", "false".into()),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{metrics_port}")),
    ])
    .await;
    let scrape = std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let text = http(scrape, "GET", "/metrics", "").await.1;
    let time = "ratelimit_service_response_time_seconds";
    let series: BTreeMap<&str, u64> = text
        .lines()
        .filter(|line| line.starts_with("ratelimit_") && !line.starts_with(time))
        .filter_map(|line| line.rsplit_once(' '))
        .map(|(series, value)| (series, value.parse().unwrap()))
        .collect();
    let rate = |counter: &str, key: &str, value: u64| {
        (
            format!("ratelimit_service_rate_limit_{counter}{{domain=\"edge\",key1=\"{key}\"}}"),
            value,
        )
    };
    let expected: BTreeMap<String, u64> = [
        ("ratelimit_service_config_load_success".to_owned(), 1),
        (
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}".to_owned(),
            7,
        ),
        rate("total_hits", "client_c1", 1),
        rate("within_limit", "client_c1", 1),
        rate("near_limit", "trial", 1),
        rate("over_limit", "trial", 1),
        rate("shadow_mode", "trial", 1),
        rate("total_hits", "trial", 2),
        rate("within_limit", "trial", 1),
        rate("near_limit", "user", 1),
        rate("over_limit", "user", 1),
        rate("total_hits", "user", 4),
        rate("within_limit", "user", 3),
    ]
    .into_iter()
    .collect();
    let series: BTreeMap<String, u64> =
        series.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    assert_eq!(series, expected, "{text}");
    // The response time, as the reference's histogram of its default buckets: every call
    // under 10 s, in seconds (its default mapping).
    for (series, value) in [
        (
            format!("{time}_count{{grpc_method=\"ShouldRateLimit\"}}"),
            "7",
        ),
        (
            format!("{time}_bucket{{le=\"10.0\",grpc_method=\"ShouldRateLimit\"}}"),
            "7",
        ),
    ] {
        assert!(
            text.lines().any(|line| line == format!("{series} {value}")),
            "{series} {value} in:\n{text}"
        );
    }
    // tollgate's own series are still there, and the exposition is still one OpenMetrics text.
    assert!(text.contains("\ntollgate_requests_total{"), "{text}");
    assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1);
    // The admin port's /metrics carries them too.
    let admin_text = http(admin, "GET", "/metrics", "").await.1;
    assert!(
        admin_text
            .contains("ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"user\"} 4")
    );
}

/// Envoy Gateway's generated rules, as `egctl config ratelimit` reads them from the debug
/// listener: `/rlconfig` in the reference's form, byte for byte (the reference lists them in
/// its maps' order, which Go shuffles; tollgate in its rule tree's, values before keys).
const GATEWAY_RULES: &str = "domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/0
    value: httproute/default/backend/rule/0/match/0
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: hour, requests_per_unit: 3}
      - key: masked_remote_address
        value: 192.168.0.0/16
        descriptors:
          - key: remote_address
            shadow_mode: true
            rate_limit: {unit: week, requests_per_unit: 10}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_listener_serves_the_rules_as_the_reference_dumps_them() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("gateway.yaml"), GATEWAY_RULES).unwrap();
    let (grpc, admin_port, debug) = (free_port(), free_port(), free_port());
    let env = [
        ("USE_STATSD", "false".to_owned()),
        ("DEBUG_PORT", debug.to_string()),
    ];
    let _process = spawn_reference(root.path(), grpc, admin_port, &env);
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], admin_port));
    let deadline = Instant::now() + Duration::from_secs(60);
    while readyz_status(admin).await != Some(200) {
        assert!(Instant::now() < deadline, "tollgate never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let debug = std::net::SocketAddr::from(([127, 0, 0, 1], debug));
    let route = "httproute/default/backend/rule/0/match/0_httproute/default/backend/rule/0/match/0";
    assert_eq!(
        http(debug, "GET", "/rlconfig", "").await,
        (
            200,
            format!(
                "default/eg/http.{route}.masked_remote_address_192.168.0.0/16.remote_address: unit=WEEK requests_per_unit=10, shadow_mode: true, quota_mode: false\n\
                 default/eg/http.{route}.rule-0-match-0: unit=HOUR requests_per_unit=3, shadow_mode: false, quota_mode: false\n"
            )
        )
    );
    assert_eq!(
        http(debug, "GET", "/", "").await,
        (
            200,
            "/rlconfig: print out the currently loaded configuration for debugging\n\
             /stats: print out stats\n"
                .to_owned()
        )
    );
    let stats = http(debug, "GET", "/stats", "").await.1;
    assert!(
        stats.contains("ratelimit.service.config_load_success: 1\n"),
        "{stats}"
    );
}
