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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_by_one_open_and_written_by_the_next_never_serves_its_middle() {
    let server = start_with(&[("a.yaml", &limits("a", 5))], watching(None)).await;
    let path = server.config_dir().join("a.yaml");
    // `> a.yaml` with the domain alone, then, 700 ms later, `>> a.yaml` with its descriptors.
    std::fs::write(&path, "domain: a\n").unwrap();
    let started = Instant::now();
    let mut seen = Vec::new();
    let mut appended = false;
    while started.elapsed() < Duration::from_secs(4) {
        if !appended && started.elapsed() >= Duration::from_millis(700) {
            use std::io::Write as _;
            let rest = &limits("a", 7)["domain: a\n".len()..];
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            file.write_all(rest.as_bytes()).unwrap();
            appended = true;
        }
        seen.push(limit_of(&server, "a").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        seen.iter().all(|limit| matches!(limit, Some(5 | 7))),
        "a limit lifted in between: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&Some(7)));
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

/// One rewrite of the storm below: how it is made.
#[derive(Clone, Copy, Debug)]
enum Rewrite {
    /// A ConfigMap update: a new `..<n>` directory, `..data` renamed over.
    Swap,
    /// The file written in place, its writer stalling between the halves.
    SlowInPlace,
    /// The file's link removed, written, and linked again after a gap.
    DeleteAndRecreate,
}

/// `edge.yaml` in block style, so that a half-written file (cut within the number) is valid
/// YAML with another limit: were it ever read, the storm would see that limit.
fn block_limits(n: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: {n}\n"
    )
}

#[cfg(unix)]
fn configmap(dir: &Path, generation: u32, n: u32) {
    use std::os::unix::fs::symlink;
    let data = dir.join(format!("..{generation}"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("edge.yaml"), block_limits(n)).unwrap();
    let _ = std::fs::remove_file(dir.join("..data_tmp"));
    symlink(format!("..{generation}"), dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if std::fs::symlink_metadata(dir.join("edge.yaml")).is_err() {
        symlink("..data/edge.yaml", dir.join("edge.yaml")).unwrap();
    }
    if generation > 0 {
        let _ = std::fs::remove_dir_all(dir.join(format!("..{}", generation - 1)));
    }
}

/// Acceptance of the config storm: 100 rewrites in about 10 s (ConfigMap swaps, slow writes in
/// place, deletes with gaps) while decisions are asked every 20 ms: every decision sees the
/// limit of a whole write (never a half-written one, never none), and at most one write older
/// than the last one whole 3 s before. (On a quiet machine the rules in force trail by under
/// a second, docs/configuration.md; the margin is for a loaded one, where the reload's timers
/// and loads wait their turn.)
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_rewrites_never_serves_a_half_written_or_missing_rule_set() {
    storm(Duration::from_secs(3)).await;
}

/// The directory itself removed and made again (ten times, with gaps of 300 ms, decisions
/// asked meanwhile): the rules in force stay while it is gone, never none, and each new
/// directory's rules are taken.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_removed_and_made_again_keeps_the_rules_and_is_watched_anew() {
    let server = start_with(&[], watching(None)).await;
    let dir = server.config_dir().to_owned();
    configmap(&dir, 0, 1_000);
    serves(&server, "edge", Some(1_000)).await;
    for generation in 1..=10 {
        std::fs::remove_dir_all(&dir).unwrap();
        let gap = Instant::now() + Duration::from_millis(300);
        while Instant::now() < gap {
            let limit = limit_of(&server, "edge").await;
            assert_eq!(
                limit,
                Some(1_000 + generation - 1),
                "while the directory is gone"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::create_dir(&dir).unwrap();
        configmap(&dir, generation, 1_000 + generation);
        serves(&server, "edge", Some(1_000 + generation)).await;
    }
}

/// The storm: 100 rewrites, decisions asked meanwhile; `freshness` is how far behind the
/// rules in force may be.
#[cfg(unix)]
async fn storm(freshness: Duration) {
    use std::io::Write as _;
    use std::os::unix::fs::symlink;
    let server = start_with(&[], watching(None)).await;
    let dir = server.config_dir().to_owned();
    configmap(&dir, 0, 1_000);
    serves(&server, "edge", Some(1_000)).await;
    let started = Instant::now();
    // (when whole, limit), in order.
    let written = std::sync::Arc::new(std::sync::Mutex::new(vec![(Duration::ZERO, 1_000)]));
    let writer = {
        let (dir, written) = (dir.clone(), std::sync::Arc::clone(&written));
        tokio::task::spawn_blocking(move || {
            let gap = || std::thread::sleep(Duration::from_millis(300));
            for i in 1..=100u32 {
                let n = 1_000 + i;
                let rewrite = match i % 10 {
                    3 => Rewrite::SlowInPlace,
                    6 => Rewrite::DeleteAndRecreate,
                    _ => Rewrite::Swap,
                };
                match rewrite {
                    Rewrite::Swap => configmap(&dir, i, n),
                    Rewrite::SlowInPlace => {
                        let text = block_limits(n);
                        let (head, tail) = text.split_at(text.len() - 3);
                        let mut file = std::fs::File::create(dir.join("..data/edge.yaml")).unwrap();
                        file.write_all(head.as_bytes()).unwrap();
                        file.flush().unwrap();
                        std::thread::sleep(Duration::from_millis(350));
                        file.write_all(tail.as_bytes()).unwrap();
                    }
                    Rewrite::DeleteAndRecreate => {
                        std::fs::remove_file(dir.join("edge.yaml")).unwrap();
                        gap();
                        std::fs::write(dir.join("..data/edge.yaml"), block_limits(n)).unwrap();
                        symlink("..data/edge.yaml", dir.join("edge.yaml")).unwrap();
                    }
                }
                written.lock().unwrap().push((started.elapsed(), n));
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let mut seen = Vec::new();
    while !writer.is_finished() {
        seen.push((started.elapsed(), limit_of(&server, "edge").await));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writer.await.unwrap();
    let written = written.lock().unwrap().clone();
    eprintln!(
        "{} rewrites in {:?}, {} decisions",
        written.len() - 1,
        started.elapsed(),
        seen.len()
    );
    let mut lags: Vec<(Duration, Duration)> = seen
        .iter()
        .filter_map(|(at, limit)| {
            let index = written.iter().position(|(_, n)| Some(*n) == *limit)?;
            let superseded = written.get(index + 1).map_or(*at, |(when, _)| *when);
            Some((at.saturating_sub(superseded), *at))
        })
        .collect();
    lags.sort();
    eprintln!("worst lags: {:?}", &lags[lags.len().saturating_sub(5)..]);
    for (at, limit) in &seen {
        let limit = limit.unwrap_or_else(|| panic!("no limit in force at {at:?}"));
        let index = written
            .iter()
            .position(|(_, n)| *n == limit)
            .unwrap_or_else(|| panic!("limit {limit} at {at:?} was never written whole"));
        // The last write whole `freshness` before, and the one before it.
        let before = at.saturating_sub(freshness);
        let last = written
            .iter()
            .rposition(|(when, _)| *when <= before)
            .unwrap_or(0);
        assert!(
            index + 1 >= last,
            "at {at:?} the limit was {limit} (write {index}), while write {last} was whole by {before:?}"
        );
    }
    // Once the storm is over, the last write is in force.
    serves(&server, "edge", Some(1_100)).await;
}
