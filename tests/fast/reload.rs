//! Hot reload, observed through gRPC decisions without restarting the server: a file added,
//! a limit changed, a broken file (the old config keeps serving, `/config` shows the error,
//! the metric counts it), the fix, a Kubernetes ConfigMap `..data` symlink swap, and the
//! polling fallback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// A limit of `n` per minute on key `k` of `domain`.
fn limits(domain: &str, n: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n"
    )
}

/// The limit a check-only call on `(k, x)` of `domain` reports: `None` when no rule matches.
async fn limit_of(server: &TestServer, domain: &str) -> Option<u32> {
    let mut check = request(domain, &[&[("k", "x")]]);
    check.descriptors[0].hits_addend = Some(0);
    let response = server.ok(check).await;
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|limit| limit.requests_per_unit)
}

/// Waits (up to 10 s, for a loaded machine) until `domain` reports `expected`.
async fn serves(server: &TestServer, domain: &str, expected: Option<u32>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = limit_of(server, domain).await;
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{domain}: still {seen:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn write(dir: &Path, name: &str, text: &str) {
    // Write then rename, as editors and config tools do, so a half-written file is never read.
    let temp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, dir.join(name)).unwrap();
}

async fn reload_errors(server: &TestServer) -> String {
    let text = server.http("GET", "/metrics", "").await.1;
    text.lines()
        .find_map(|line| line.strip_prefix("tollgate_config_reloads_total{result=\"error\"} "))
        .unwrap_or("0")
        .to_owned()
}

fn watching(poll: Option<Duration>) -> Setup {
    Setup {
        reload: Some(poll),
        ..Setup::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_changed_broken_and_fixed_files_are_reloaded_and_a_broken_one_keeps_the_old() {
    let server = start_with(&[("a.yaml", &limits("a", 1))], watching(None)).await;
    let dir = server.config_dir().to_owned();
    assert_eq!(limit_of(&server, "a").await, Some(1));
    assert_eq!(limit_of(&server, "b").await, None);

    write(&dir, "b.yaml", &limits("b", 2));
    serves(&server, "b", Some(2)).await;

    write(&dir, "a.yaml", &limits("a", 5));
    serves(&server, "a", Some(5)).await;

    let broken = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n";
    write(&dir, "a.yaml", broken);
    wait_for_failed_reload(&server).await;
    assert_eq!(
        limit_of(&server, "a").await,
        Some(5),
        "the old config keeps serving"
    );
    assert_eq!(limit_of(&server, "b").await, Some(2));
    let config = server.http("GET", "/config", "").await.1;
    assert!(config.contains("last reload failed"), "{config}");
    assert!(
        config.contains(
            "a.yaml:4: domain \"a\" > descriptors[0] (key \"k\") > rate_limit.unit: expected one of"
        ),
        "{config}"
    );

    write(&dir, "a.yaml", &limits("a", 7));
    serves(&server, "a", Some(7)).await;
    let config = server.http("GET", "/config", "").await.1;
    assert!(!config.contains("last reload failed"), "{config}");
    assert_eq!(reload_errors(&server).await, "1");
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_data_symlink_swap_is_reloaded() {
    use std::os::unix::fs::symlink;
    let server = start_with(&[], watching(None)).await;
    let dir = server.config_dir().to_owned();
    // What the kubelet creates: ..<timestamp>/edge.yaml, ..data -> it, edge.yaml -> ..data/.
    std::fs::create_dir(dir.join("..2026_11_21_01")).unwrap();
    std::fs::write(dir.join("..2026_11_21_01/edge.yaml"), limits("edge", 3)).unwrap();
    symlink("..2026_11_21_01", dir.join("..data")).unwrap();
    symlink("..data/edge.yaml", dir.join("edge.yaml")).unwrap();
    serves(&server, "edge", Some(3)).await;

    // An update: a new timestamped directory, a new ..data link renamed over the old one,
    // the old directory removed.
    std::fs::create_dir(dir.join("..2026_11_21_02")).unwrap();
    std::fs::write(dir.join("..2026_11_21_02/edge.yaml"), limits("edge", 9)).unwrap();
    symlink("..2026_11_21_02", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join("..2026_11_21_01")).unwrap();
    serves(&server, "edge", Some(9)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_poll_reloads_without_file_events() {
    let server = start_with(
        &[("a.yaml", &limits("a", 1))],
        watching(Some(Duration::from_millis(100))),
    )
    .await;
    write(server.config_dir(), "a.yaml", &limits("a", 4));
    serves(&server, "a", Some(4)).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_unreadable_entry_that_broke_a_reload_is_seen() {
    let server = start_with(&[("a.yaml", &limits("a", 1))], watching(None)).await;
    let dir = server.config_dir().to_owned();
    // A new valid file together with a dangling link: the load fails as a whole.
    write(&dir, "b.yaml", &limits("b", 2));
    std::os::unix::fs::symlink("missing.yaml", dir.join("dangling.yaml")).unwrap();
    wait_for_failed_reload(&server).await;
    assert_eq!(limit_of(&server, "b").await, None);
    std::fs::remove_file(dir.join("dangling.yaml")).unwrap();
    serves(&server, "b", Some(2)).await;
}

/// Waits (up to 10 s) until one failed reload is counted.
async fn wait_for_failed_reload(server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while reload_errors(server).await != "1" {
        assert!(
            Instant::now() < deadline,
            "the failed reload was never counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The reference's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: not ready while the rules name
/// no domain, ready once a reload brings one.
#[tokio::test]
async fn ready_needs_rules_waits_for_a_domain() {
    let mut setup = watching(Some(Duration::from_millis(100)));
    setup.options.ready_needs_rules = true;
    setup.options.probe_every = Duration::from_millis(100);
    let server = start_with(&[], setup).await;
    let readyz = || async { server.http("GET", "/readyz", "").await.0 };
    assert_eq!(readyz().await, 500);
    write(server.config_dir(), "a.yaml", &limits("a", 5));
    let deadline = Instant::now() + Duration::from_secs(10);
    while readyz().await != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready after a domain arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And not again if the rules lose their last domain.
    std::fs::remove_file(server.config_dir().join("a.yaml")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while readyz().await != 500 {
        assert!(Instant::now() < deadline, "still ready with no domain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
