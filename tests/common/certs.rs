//! Certificates made for a test (rcgen): a CA, and leaf certificates it signs.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A CA: its PEM and an issuer for signing.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

pub fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let pem = params.self_signed(&key).unwrap().pem();
    Ca {
        pem,
        issuer: Issuer::new(params, key),
    }
}

/// A leaf certificate for `names` (DNS names or IP addresses), signed by `ca`: (cert PEM, key
/// PEM).
pub fn leaf(ca: &Ca, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca.issuer)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Ca {
    /// Writes the CA as `dir/stem.crt`.
    pub fn write(&self, dir: &Path, stem: &str) -> PathBuf {
        let path = dir.join(format!("{stem}.crt"));
        std::fs::write(&path, &self.pem).unwrap();
        path
    }

    /// A leaf for `names`, written as `dir/stem.crt` and `dir/stem.key`.
    pub fn write_leaf(&self, dir: &Path, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let (cert, key) = leaf(self, names);
        let (cert_path, key_path) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&cert_path, cert).unwrap();
        std::fs::write(&key_path, key).unwrap();
        (cert_path, key_path)
    }
}
