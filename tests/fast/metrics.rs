//! `GET /metrics` after known traffic: exact per-limit counters, and bounded cardinality.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use common::*;
use tollgate::metrics::Metrics;
use tollgate::server::Options;

const LIMITS: &str = r#"
domain: m
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// The value of the sample with exactly these labels.
fn sample(text: &str, name: &str, limit: &str) -> u64 {
    let prefix = format!("{name}{{domain=\"m\",limit=\"{limit}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
        .parse()
        .unwrap()
}

/// Label sets of `total_hits` whose limit label starts with `path`.
fn label_sets(text: &str, path: &str) -> usize {
    let prefix = format!("tollgate_total_hits_total{{domain=\"m\",limit=\"{path}");
    text.lines()
        .filter(|line| line.starts_with(&prefix))
        .count()
}

/// 10,000 distinct values of `key`, 64 descriptors per request.
async fn distinct_values(server: &TestServer, key: &str) {
    let values: Vec<String> = (0..10_000).map(|i| format!("v{i}")).collect();
    for chunk in values.chunks(64) {
        let pairs: Vec<[(&str, &str); 1]> = chunk.iter().map(|v| [(key, v.as_str())]).collect();
        let descriptors: Vec<&[(&str, &str)]> = pairs.iter().map(|p| p.as_slice()).collect();
        server.ok(request("m", &descriptors)).await;
    }
}

#[tokio::test]
async fn counters_are_exact_and_client_values_never_grow_the_label_sets_unbounded() {
    let server = start_with(
        &[("m.yaml", LIMITS)],
        Setup {
            options: Options {
                metrics: Arc::new(Metrics::new(0.8, 50)),
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    for _ in 0..12 {
        server.ok(request("m", &[&[("user", "a")]])).await;
    }
    for _ in 0..3 {
        server.ok(request("m", &[&[("shadowed", "x")]])).await;
    }
    let (status, text) = server.http("GET", "/metrics", "").await;
    assert_eq!(status, 200);
    // 10 per minute, 12 hits: 10 within, 2 over; near (past 8): the 9th and 10th.
    assert_eq!(sample(&text, "tollgate_total_hits_total", "m.user"), 12);
    assert_eq!(sample(&text, "tollgate_within_limit_total", "m.user"), 10);
    assert_eq!(sample(&text, "tollgate_over_limit_total", "m.user"), 2);
    assert_eq!(sample(&text, "tollgate_near_limit_total", "m.user"), 2);
    // A shadow rule: 1 within, 2 over and let through.
    assert_eq!(sample(&text, "tollgate_total_hits_total", "m.shadowed"), 3);
    assert_eq!(sample(&text, "tollgate_over_limit_total", "m.shadowed"), 2);
    assert_eq!(sample(&text, "tollgate_shadow_mode_total", "m.shadowed"), 2);
    assert!(
        text.contains("tollgate_requests_total{code=\"OK\"} 15"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_decisions_total{overall=\"OVER_LIMIT\"} 2"),
        "{text}"
    );

    // 10,000 client values on a key-only rule: one label set, the rule's path.
    distinct_values(&server, "client").await;
    let text = server.http("GET", "/metrics", "").await.1;
    assert_eq!(label_sets(&text, "m.client"), 1);
    assert_eq!(
        sample(&text, "tollgate_total_hits_total", "m.client"),
        10_000
    );

    // With detailed_metric: at most the cap (50) of client-valued sets, the rest under the
    // plain path, and no hit lost.
    distinct_values(&server, "tenant").await;
    let text = server.http("GET", "/metrics", "").await.1;
    assert_eq!(label_sets(&text, "m.tenant_"), 50);
    assert_eq!(label_sets(&text, "m.tenant\""), 1);
    assert_eq!(
        sample(&text, "tollgate_total_hits_total", "m.tenant"),
        10_000 - 50
    );
    assert_eq!(sample(&text, "tollgate_total_hits_total", "m.tenant_v0"), 1);
    // The memory store's counters: a, x, 10,000 clients and 10,000 tenants.
    assert!(text.contains("\ntollgate_memory_keys 20002\n"), "{text}");
    assert!(
        text.contains("\ntollgate_memory_evictions_total 0\n"),
        "{text}"
    );
}

#[tokio::test]
async fn value_to_metric_leaves_out_an_empty_value_with_its_separator() {
    const ROUTES: &str = r#"
domain: m
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
"#;
    let server = start(&[("m.yaml", ROUTES)]).await;
    let entries = [("route", ""), ("http_method", "GET"), ("subject_id", "123")];
    server.ok(request("m", &[&entries])).await;
    let text = server.http("GET", "/metrics", "").await.1;
    assert_eq!(
        sample(
            &text,
            "tollgate_total_hits_total",
            "m.route.http_method_GET.subject_id"
        ),
        1
    );
}

#[tokio::test]
async fn build_process_and_config_load_metrics_are_exported() {
    // This process's CPU time in seconds, as /proc/self/stat gives it (utime + stime, 1/100 s).
    fn cpu_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let fields: Vec<u64> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|n| n.parse().unwrap())
            .collect();
        (fields[0] + fields[1]) as f64 / 100.0
    }
    let server = start(&[("m.yaml", LIMITS)]).await;
    let before = cpu_seconds();
    let text = server.http("GET", "/metrics", "").await.1;
    let after = cpu_seconds();
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(
        value(&format!(
            "tollgate_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )),
        1.0
    );
    assert_eq!(value("tollgate_config_last_load_success"), 1.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let loaded = value("tollgate_config_last_load_timestamp_seconds");
    assert!(now - 600.0 < loaded && loaded <= now, "{loaded}");
    // The test process's own figures, under the standard names.
    assert!(value("process_resident_memory_bytes") > 1_000_000.0);
    assert!(value("process_virtual_memory_bytes") > value("process_resident_memory_bytes"));
    assert!(value("process_open_fds") >= 3.0);
    let cpu = value("process_cpu_seconds_total");
    assert!(
        before <= cpu && cpu <= after,
        "{before} <= {cpu} <= {after}"
    );
    let started = value("process_start_time_seconds");
    assert!(now - 3_600.0 < started && started <= now, "{started}");
    assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1);
}

#[tokio::test]
async fn a_request_partly_over_splits_its_hits_into_near_and_over_as_the_reference_does() {
    const SPLIT: &str = r#"
domain: m
descriptors:
  - key: p
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: q
    rate_limit: {unit: minute, requests_per_unit: 20}
"#;
    let server = start(&[("m.yaml", SPLIT)]).await;
    let hits = |key: &'static str, hits: u32| {
        let mut request = request("m", &[&[(key, "v")]]);
        request.hits_addend = hits;
        request
    };
    // p: 19, then 3 more (room for 1): 2 over; near past 16: 17, 18, 19, then the 20th.
    server.ok(hits("p", 19)).await;
    assert_eq!(server.ok(hits("p", 3)).await.overall_code, 2);
    // q: 15, then 7 more (room for 5): 2 over; near: 17 to 20.
    server.ok(hits("q", 15)).await;
    assert_eq!(server.ok(hits("q", 7)).await.overall_code, 2);
    let text = server.http("GET", "/metrics", "").await.1;
    let counts = |path: &str| {
        [
            "tollgate_total_hits_total",
            "tollgate_within_limit_total",
            "tollgate_over_limit_total",
            "tollgate_near_limit_total",
        ]
        .map(|name| sample(&text, name, path))
    };
    assert_eq!(counts("m.p"), [22, 19, 2, 4]);
    assert_eq!(counts("m.q"), [22, 15, 2, 4]);
}

#[tokio::test]
async fn statsd_receives_the_reference_stat_names_with_exact_counts() {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let options = Options {
        statsd: tollgate::statsd::StatsdOptions {
            address: Some(socket.local_addr().unwrap().to_string()),
            every: std::time::Duration::from_millis(100),
            ..tollgate::statsd::StatsdOptions::default()
        },
        ..Options::default()
    };
    let server = start_with(
        &[(
            "stats.yaml",
            "domain: stats\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
        )],
        Setup {
            options,
            ..Setup::default()
        },
    )
    .await;
    // 3 admitted (the third past 80% of the limit: near), then 2 over.
    for _ in 0..5 {
        server.ok(request("stats", &[&[("user", "a")]])).await;
    }
    let expected = [
        ("ratelimit.service.rate_limit.stats.user.total_hits", 5),
        ("ratelimit.service.rate_limit.stats.user.within_limit", 3),
        ("ratelimit.service.rate_limit.stats.user.near_limit", 1),
        ("ratelimit.service.rate_limit.stats.user.over_limit", 2),
        ("ratelimit_server.ShouldRateLimit.total_requests", 5),
        ("ratelimit.service.config_load_success", 1),
    ];
    let received = receive_statsd(&socket, &expected).await;
    let expected_map = expected
        .iter()
        .map(|(name, count)| ((*name).to_owned(), *count))
        .collect();
    assert_eq!(received, expected_map);
}
