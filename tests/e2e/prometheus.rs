//! The monitoring that ships in deploy/ works against the real thing: a real Prometheus
//! (Debian's package, installed by scripts/test) scrapes a running tollgate driven through OK,
//! OVER_LIMIT, shedding, a failed reload and a store outage; then every query of the Grafana
//! dashboard returns data, every metric the alert rules name exists, and promtool checks the
//! rules and runs their unit tests (each alert fires on the series that should fire it and not
//! on a healthy replica's).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::prometheus::Prometheus;
use common::redis_process::RedisServer;
use common::*;
use serde_json::Value;

fn promtool(args: &[&str]) -> String {
    require("promtool", "prometheus");
    let output = Command::new("promtool").args(args).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let checked = promtool(&["check", "rules", "deploy/prometheus/alerts.yaml"]);
    assert!(checked.contains("SUCCESS: 8 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "deploy/prometheus/alerts-test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Waits (60 s at most) until `condition` holds of tollgate's own /metrics text.
async fn until_metrics(replica: &Replica, what: &str, condition: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = http(replica.http_addr(), "GET", "/metrics", "").await.1;
        if condition(&text) {
            return;
        }
        assert!(Instant::now() < deadline, "never {what}:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends bursts of concurrent calls until one is shed (RESOURCE_EXHAUSTED).
async fn shed_some(replica: &Replica) {
    for _ in 0..20 {
        let calls = (0..200).map(|index| {
            let grpc = replica.grpc;
            async move {
                let mut client = tollgate::pb::RateLimitServiceClient::connect(format!(
                    "http://127.0.0.1:{grpc}"
                ))
                .await
                .unwrap();
                let user = format!("burst-{index}");
                client
                    .should_rate_limit(request("mon", &[&[("user", &user)]]))
                    .await
            }
        });
        let results = futures_util::future::join_all(calls).await;
        if results.iter().any(|result| {
            result
                .as_ref()
                .is_err_and(|status| status.code() == tonic::Code::ResourceExhausted)
        }) {
            return;
        }
    }
    panic!("no request was shed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_and_alert_metric_has_data_from_a_running_tollgate() {
    require("prometheus", "prometheus");
    let mut redis = RedisServer::start();
    let config = config_dir(&[(
        "mon.yaml",
        "domain: mon\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )]);
    let replica = Replica::spawn(
        config.path(),
        &[
            "--store",
            &redis.url(),
            "--store-timeout",
            "500ms",
            "--max-in-flight",
            "1",
            "--max-queue-time",
            "1ms",
        ],
    );
    replica.wait_ready().await;

    // Prometheus, scraping it every second and evaluating the shipped rules.
    let alerts = std::fs::canonicalize("deploy/prometheus/alerts.yaml").unwrap();
    let prometheus = Prometheus::start(
        &[format!("127.0.0.1:{}", replica.http)],
        &[alerts.as_path()],
    )
    .await;

    // OK, then OVER_LIMIT.
    let mut client = replica.client().await;
    let alice = request("mon", &[&[("user", "alice")]]);
    let first = client
        .should_rate_limit(alice.clone())
        .await
        .unwrap()
        .into_inner();
    let second = client.should_rate_limit(alice).await.unwrap().into_inner();
    assert_eq!((first.overall_code, second.overall_code), (OK, OVER));
    // Shedding.
    shed_some(&replica).await;
    // A failed reload.
    std::fs::write(config.path().join("broken.yaml"), "domain: [\n").unwrap();
    until_metrics(&replica, "a failed reload", |text| {
        text.contains("tollgate_config_last_load_success 0")
    })
    .await;
    // The store down.
    redis.stop();
    let failed = client
        .should_rate_limit(request("mon", &[&[("user", "bob")]]))
        .await;
    assert!(failed.is_err(), "answered without its store");
    until_metrics(&replica, "the store down", |text| {
        text.contains("tollgate_store_up 0")
    })
    .await;
    // Prometheus has seen all of that once it has seen the store down, and rates have the
    // samples they need once it holds a few scrapes.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let down = prometheus.query("tollgate_store_up == 0").await;
        let scrapes = prometheus
            .query("count_over_time(tollgate_store_up[1m]) >= 5")
            .await;
        if !down.is_empty() && !scrapes.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never saw the store down"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string("deploy/grafana/tollgate.json").unwrap())
            .unwrap();
    let expressions: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap().clone())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(expressions.len() >= 15, "{expressions:?}");
    let mut empty = Vec::new();
    for expression in &expressions {
        if prometheus.query(expression).await.is_empty() {
            empty.push(expression.clone());
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data: {empty:#?}"
    );

    let rules = std::fs::read_to_string(&alerts).unwrap();
    let mut names: Vec<&str> = rules
        .match_indices("tollgate_")
        .map(|(at, _)| {
            let rest = &rules[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() >= 8, "{names:?}");
    let mut missing = Vec::new();
    for name in names {
        if prometheus
            .query(&format!("count({{__name__=\"{name}\"}})"))
            .await
            .is_empty()
        {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "alert rules name metrics tollgate does not export: {missing:?}"
    );
    let loaded = prometheus.rules().await;
    assert!(
        loaded.contains("TollgateStoreDown") && loaded.contains("\"health\":\"ok\""),
        "{loaded}"
    );
}
