//! How the client commands (`query`, `health`, `bench`) reach a server: an address with or
//! without a scheme, and TLS with a private CA and, for mutual TLS, a client certificate.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Where the server is and how to trust it.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Server address: `host:port`, `http://host:port`, or `https://host:port` (TLS; the
    /// default scheme when --ca-file or --cert-file is given).
    #[arg(long, env = "TOLLGATE_ADDR", default_value = "http://127.0.0.1:8081")]
    pub addr: String,

    /// PEM CA certificates that the server's certificate must chain to (a private CA).
    #[arg(long, env = "TOLLGATE_CA_FILE")]
    pub ca_file: Option<PathBuf>,

    /// PEM client certificate, for a server that requires mutual TLS (with --key-file).
    #[arg(long, env = "TOLLGATE_CERT_FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,

    /// PEM private key for --cert-file.
    #[arg(long, env = "TOLLGATE_KEY_FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,

    /// The name the server's certificate must carry, when it is not the address's host (for
    /// example `localhost` when connecting to 127.0.0.1).
    #[arg(long, env = "TOLLGATE_SERVER_NAME")]
    pub server_name: Option<String>,
}

/// Why a client command could not reach the server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--addr {addr:?}: {reason}")]
    Address { addr: String, reason: String },
    #[error("{flag} {path}: cannot read: {error}")]
    File {
        flag: &'static str,
        path: String,
        error: std::io::Error,
    },
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
}

impl ClientArgs {
    /// Plain loopback defaults, for callers that build the arguments in code.
    pub fn at(addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: None,
        }
    }

    fn uses_tls(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.addr.starts_with("https://")
    }

    /// The address with its scheme.
    pub fn uri(&self) -> String {
        if self.addr.contains("://") {
            self.addr.clone()
        } else if self.uses_tls() {
            format!("https://{}", self.addr)
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// The endpoint, TLS set up, not yet connected.
    pub fn endpoint(&self) -> Result<Endpoint, ClientError> {
        let uri = self.uri();
        let endpoint = Endpoint::from_shared(uri).map_err(|error| ClientError::Address {
            addr: self.addr.clone(),
            reason: causes(&error),
        })?;
        if !self.uses_tls() {
            return Ok(endpoint);
        }
        let mut tls = ClientTlsConfig::new().with_enabled_roots();
        if let Some(path) = &self.ca_file {
            tls = tls.ca_certificate(Certificate::from_pem(read("--ca-file", path)?));
        }
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            tls = tls.identity(Identity::from_pem(
                read("--cert-file", cert)?,
                read("--key-file", key)?,
            ));
        }
        if let Some(name) = &self.server_name {
            tls = tls.domain_name(name.clone());
        }
        endpoint
            .tls_config(tls)
            .map_err(|error| ClientError::Address {
                addr: self.addr.clone(),
                reason: causes(&error),
            })
    }

    /// Connects within `timeout` (also the bound of each call on the channel).
    pub async fn connect(&self, timeout: Duration) -> Result<Channel, ClientError> {
        self.endpoint()?
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect()
            .await
            .map_err(|error| ClientError::Connect {
                addr: self.uri(),
                reason: causes(&error),
            })
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|error| ClientError::File {
        flag,
        path: path.display().to_string(),
        error,
    })
}

/// An error and its causes, `: `-separated: tonic's transport error alone says only
/// "transport error", its causes say what happened.
pub fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_without_a_scheme_gets_http_or_https_when_tls_is_asked_for() {
        assert_eq!(
            ClientArgs::at("127.0.0.1:8081").uri(),
            "http://127.0.0.1:8081"
        );
        let tls = ClientArgs {
            ca_file: Some("ca.pem".into()),
            ..ClientArgs::at("localhost:8081")
        };
        assert_eq!(tls.uri(), "https://localhost:8081");
        assert_eq!(
            ClientArgs::at("https://h:1").uri(),
            "https://h:1",
            "kept as given"
        );
    }

    #[test]
    fn an_unreadable_ca_file_names_the_flag_and_the_path() {
        let args = ClientArgs {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..ClientArgs::at("localhost:8081")
        };
        let error = args.endpoint().unwrap_err().to_string();
        assert!(
            error.starts_with("--ca-file /nonexistent/ca.pem: cannot read: "),
            "{error}"
        );
    }
}
