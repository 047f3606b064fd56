//! TLS and mutual TLS on the gRPC listener, with certificates generated here (rcgen): a client
//! without a certificate is refused, one with a certificate from the client CA is served, and
//! rotated server certificates are picked up without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::certs::{Ca, ca, leaf};
use common::*;
use tollgate::pb;
use tollgate::server::Options;
use tollgate::tls::TlsFiles;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const LIMITS: &str =
    "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

fn write_server_cert(dir: &Path, ca: &Ca) {
    let (cert, key) = leaf(ca, &["localhost"]);
    // Key first, then the certificate: the pair is complete when the certificate changes.
    std::fs::write(dir.join("server.key"), key).unwrap();
    std::fs::write(dir.join("server.crt"), cert).unwrap();
}

/// A server with mutual TLS (certificates in `dir`), requiring `client_san` if given; with
/// its server CA and client CA.
async fn mtls_server(dir: &Path, client_san: Option<&str>) -> (TestServer, Ca, Ca) {
    let server_ca = ca("server ca");
    let client_ca = ca("client ca");
    write_server_cert(dir, &server_ca);
    std::fs::write(dir.join("client-ca.crt"), &client_ca.pem).unwrap();
    let server = start_with(
        &[("t.yaml", LIMITS)],
        Setup {
            options: Options {
                tls: Some(TlsFiles {
                    cert: dir.join("server.crt"),
                    key: dir.join("server.key"),
                    client_ca: Some(dir.join("client-ca.crt")),
                    client_san: client_san.map(str::to_owned),
                }),
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    (server, server_ca, client_ca)
}

async fn call(port: u16, server_ca: &str, client: Option<(String, String)>) -> Result<i32, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_ca))
        .domain_name("localhost");
    if let Some((cert, key)) = client {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    pb::RateLimitServiceClient::new(channel)
        .should_rate_limit(request("t", &[&[("k", "x")]]))
        .await
        .map(|r| r.into_inner().statuses[0].limit_remaining as i32)
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_clients_without_a_certificate_serves_valid_ones_and_picks_up_rotation() {
    let certs = tempfile::tempdir().unwrap();
    let (server, server_ca, client_ca) = mtls_server(certs.path(), None).await;
    let port = server.grpc.port();

    assert!(
        call(port, &server_ca.pem, None).await.is_err(),
        "no client certificate"
    );
    let stranger = leaf(&ca("another ca"), &["client"]);
    assert!(
        call(port, &server_ca.pem, Some(stranger)).await.is_err(),
        "a certificate from another CA"
    );
    assert!(
        server.call(request("t", &[&[("k", "x")]])).await.is_err(),
        "plaintext"
    );
    let client = leaf(&client_ca, &["client"]);
    assert_eq!(
        call(port, &server_ca.pem, Some(client.clone())).await,
        Ok(4)
    );

    // Rotate the server certificate to one from a new CA: new connections get it.
    let rotated_ca = ca("rotated server ca");
    write_server_cert(certs.path(), &rotated_ca);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(remaining) = call(port, &rotated_ca.pem, Some(client.clone())).await {
            assert_eq!(remaining, 3);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rotated certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        call(port, &server_ca.pem, Some(client)).await.is_err(),
        "the old certificate is gone"
    );
}

/// `--tls-client-san` (the reference's GRPC_CLIENT_TLS_SAN): of the clients the CA signed,
/// only those whose certificate is valid for the name are served.
#[tokio::test]
async fn a_required_client_san_refuses_certificates_for_other_names() {
    let certs = tempfile::tempdir().unwrap();
    let (server, server_ca, client_ca) = mtls_server(certs.path(), Some("envoy.edge.svc")).await;
    let port = server.grpc.port();
    let other = leaf(&client_ca, &["someone.else.svc"]);
    assert!(
        call(port, &server_ca.pem, Some(other)).await.is_err(),
        "a certificate for another name"
    );
    let envoy = leaf(&client_ca, &["envoy.edge.svc"]);
    assert_eq!(call(port, &server_ca.pem, Some(envoy)).await, Ok(4));
}

#[test]
fn the_per_core_runtime_refuses_tls_with_a_clear_error() {
    let certs = tempfile::tempdir().unwrap();
    write_server_cert(certs.path(), &ca("server ca"));
    let config = config_dir(&[("t.yaml", LIMITS)]);
    let child = tollgate_bin()
        .args(["serve", "--runtime", "per-core", "--config"])
        .arg(config.path())
        .arg("--tls-cert")
        .arg(certs.path().join("server.crt"))
        .arg("--tls-key")
        .arg(certs.path().join("server.key"))
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "tollgate kept running");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("--runtime per-core does not serve TLS yet; use --runtime multi-thread"),
        "{stderr}"
    );
}

/// Runs the `tollgate` binary off the runtime (the server under test runs on it).
async fn tollgate(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || tollgate_bin().args(&args).output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_and_health_reach_a_mutual_tls_server_with_a_private_ca() {
    let certs = tempfile::tempdir().unwrap();
    let server_ca = ca("server ca");
    let client_ca = ca("client ca");
    write_server_cert(certs.path(), &server_ca);
    let dir = certs.path();
    std::fs::write(dir.join("client-ca.crt"), &client_ca.pem).unwrap();
    std::fs::write(dir.join("server-ca.crt"), &server_ca.pem).unwrap();
    let (cert, key) = leaf(&client_ca, &["client"]);
    std::fs::write(dir.join("client.crt"), cert).unwrap();
    std::fs::write(dir.join("client.key"), key).unwrap();
    let server = start_with(
        &[("t.yaml", LIMITS)],
        Setup {
            options: Options {
                tls: Some(TlsFiles {
                    cert: dir.join("server.crt"),
                    key: dir.join("server.key"),
                    client_ca: Some(dir.join("client-ca.crt")),
                    client_san: None,
                }),
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    let path = |name: &str| dir.join(name).display().to_string();
    // No scheme: https, because a CA is given; the certificate names localhost.
    let tls = |command: &str| -> Vec<String> {
        vec![
            command.to_owned(),
            "--addr".into(),
            format!("localhost:{}", server.grpc.port()),
            "--ca-file".into(),
            path("server-ca.crt"),
            "--cert-file".into(),
            path("client.crt"),
            "--key-file".into(),
            path("client.key"),
        ]
    };

    let mut query = tls("query");
    query.extend(["--domain", "t", "--descriptor", "k=cli"].map(String::from));
    let output = tollgate(query).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        stdout,
        "k=cli: OK limit=5/MINUTE remaining=4 reset=58s\noverall: OK\n"
    );

    let output = tollgate(tls("health")).await;
    assert!(output.status.success(), "{output:?}");

    // Without the private CA the server is not trusted, and the error says why.
    let untrusted = vec![
        "health".to_owned(),
        "--addr".into(),
        format!("https://localhost:{}", server.grpc.port()),
    ];
    let output = tollgate(untrusted).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(&format!(
            "cannot connect to https://localhost:{}: transport error",
            server.grpc.port()
        )) && stderr.contains("certificate"),
        "{stderr}"
    );
}
