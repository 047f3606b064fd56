//! A real Prometheus (Debian's package, installed by scripts/test) on a free loopback port,
//! scraping the targets it is given every second, stopped when dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{ChildGuard, free_port, get, require};

pub struct Prometheus {
    pub addr: SocketAddr,
    _process: ChildGuard,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `targets` (`host:port`, `/metrics`) every second, evaluating `rule_files`;
    /// returns once it says it is ready (60 s at most).
    pub async fn start(targets: &[String], rule_files: &[&Path]) -> Self {
        require("prometheus", "prometheus");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("prometheus.yml");
        let rules: Vec<String> = rule_files
            .iter()
            .map(|file| file.display().to_string())
            .collect();
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: {rules:?}\nscrape_configs:\n  - job_name: scraped\n    static_configs: [{{targets: {targets:?}}}]\n",
            ),
        )
        .unwrap();
        let process = ChildGuard(
            Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn prometheus"),
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(addr).await.is_err()
            || get(addr, "/-/ready", &[]).await.status != 200
        {
            assert!(Instant::now() < deadline, "prometheus never became ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            addr,
            _process: process,
            _dir: dir,
        }
    }

    /// The result of a PromQL query (`data.result`).
    pub async fn query(&self, promql: &str) -> Vec<Value> {
        let encoded =
            percent_encoding::utf8_percent_encode(promql, percent_encoding::NON_ALPHANUMERIC);
        let response = get(self.addr, &format!("/api/v1/query?query={encoded}"), &[]).await;
        assert_eq!(response.status, 200, "{promql}: {}", response.body);
        let body: Value = serde_json::from_str(&response.body).unwrap();
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits (60 s at most) until `promql` returns samples, and returns them.
    pub async fn until_samples(&self, promql: &str) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let result = self.query(promql).await;
            if !result.is_empty() {
                return result;
            }
            assert!(Instant::now() < deadline, "no samples for {promql}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Its rules as it evaluates them (`/api/v1/rules`).
    pub async fn rules(&self) -> String {
        get(self.addr, "/api/v1/rules", &[]).await.body
    }
}
