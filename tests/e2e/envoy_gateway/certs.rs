//! The certificates Envoy Gateway's certgen makes, in its shapes (made with Debian's openssl,
//! which scripts/test installs): one CA (`CN=envoy-gateway`), and leaves for the control
//! plane, for Envoy and for the rate-limit service, every key RSA 2048 written in PKCS#1
//! (`BEGIN RSA PRIVATE KEY`), no leaf carrying an extended key usage, DNS names only
//! (`localhost`, as certgen writes them for a gateway outside Kubernetes).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::require;

/// A leaf's files as Envoy Gateway mounts them from its secret: `tls.crt`, `tls.key` and the
/// CA's `ca.crt` in one directory.
pub struct Secret {
    pub dir: PathBuf,
}

impl Secret {
    pub fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Each path as text, for the environment.
    pub fn paths(&self) -> [String; 3] {
        [self.cert(), self.key(), self.ca()].map(|path| path.display().to_string())
    }
}

pub struct Certs {
    /// The control plane's (`envoy-gateway`).
    pub plane: Secret,
    /// Envoy's client certificate (`envoy`).
    pub envoy: Secret,
    /// The rate-limit service's (`envoy-rate-limit`), mounted at `/certs`.
    pub ratelimit: Secret,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// An RSA 2048 key in PKCS#1, as certgen writes it.
fn rsa_key(dir: &Path, name: &str) {
    openssl(dir, &["genrsa", "-traditional", "-out", name, "2048"]);
    let pem = std::fs::read_to_string(dir.join(name)).unwrap();
    assert!(pem.starts_with("-----BEGIN RSA PRIVATE KEY-----"), "{pem}");
}

impl Certs {
    pub fn generate(dir: &Path) -> Self {
        require("openssl", "openssl");
        rsa_key(dir, "ca.key");
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "1825",
                "-subj",
                "/CN=envoy-gateway",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
            ],
        );
        Self {
            plane: leaf(dir, "envoy-gateway", "envoy-gateway"),
            envoy: leaf(dir, "envoy", "*"),
            ratelimit: leaf(dir, "envoy-rate-limit", "*"),
        }
    }
}

/// A leaf signed by the CA in `dir` (`Certs::generate`'s), written as the secret `name`.
pub fn leaf(dir: &Path, name: &str, common_name: &str) -> Secret {
    let secret = dir.join(name);
    std::fs::create_dir_all(&secret).unwrap();
    rsa_key(&secret, "tls.key");
    std::fs::write(
        secret.join("leaf.ext"),
        "subjectAltName=DNS:localhost\nkeyUsage=critical,digitalSignature,nonRepudiation,keyEncipherment,dataEncipherment\n",
    )
    .unwrap();
    openssl(
        &secret,
        &[
            "req",
            "-new",
            "-key",
            "tls.key",
            "-subj",
            &format!("/CN={common_name}"),
            "-out",
            "tls.csr",
        ],
    );
    openssl(
        &secret,
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "../ca.crt",
            "-CAkey",
            "../ca.key",
            "-set_serial",
            "1",
            "-days",
            "1825",
            "-extfile",
            "leaf.ext",
            "-out",
            "tls.crt",
        ],
    );
    std::fs::copy(dir.join("ca.crt"), secret.join("ca.crt")).unwrap();
    let text = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in", "tls.crt"])
        .current_dir(&secret)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        !text.contains("Extended Key Usage"),
        "certgen's leaves carry no extended key usage:\n{text}"
    );
    Secret { dir: secret }
}
