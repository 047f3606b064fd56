//! TLS and mutual TLS on the gRPC listener (rustls, ring). `--tls-cert`/`--tls-key` serve
//! TLS; `--tls-client-ca` also requires every client to present a certificate signed by that
//! CA, and `--tls-client-san` one valid for that name. The files are checked for changes (modification time and size) at most once a second
//! as connections arrive, and a changed set is loaded for the next handshakes, so rotated
//! certificates (cert-manager, a renewed Secret) are picked up without a restart; a set that
//! fails to load is logged and the previous one stays in use.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::inbound::accept::Acceptor;
use crate::inbound::watched::Inbound;

/// How long a client may take to finish the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in progress at once; beyond, new connections wait in the kernel's backlog, so
/// idle sockets cannot exhaust the process's file descriptors.
const MAX_HANDSHAKES: usize = 1024;
/// How often, at most, the files are checked for changes.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// TLS on the gRPC listener: flags of `tollgate serve`.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct TlsOptions {
    /// PEM certificate chain for TLS on the gRPC listener (with --tls-key).
    #[arg(long, env = "TOLLGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "TOLLGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates: require clients to present a certificate signed by one (mutual
    /// TLS). Needs --tls-cert.
    #[arg(long, env = "TOLLGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// With --tls-client-ca, also require the client certificate to be valid for this DNS
    /// name or IP address (a subject alternative name; the reference's GRPC_CLIENT_TLS_SAN).
    #[arg(long, env = "TOLLGATE_TLS_CLIENT_SAN", requires = "tls_client_ca")]
    pub tls_client_san: Option<String>,
}

impl TlsOptions {
    /// The files to serve TLS with, if any.
    pub fn files(&self) -> Option<TlsFiles> {
        let (cert, key) = self.tls_cert.clone().zip(self.tls_key.clone())?;
        Some(TlsFiles {
            cert,
            key,
            client_ca: self.tls_client_ca.clone(),
            client_san: self.tls_client_san.clone(),
        })
    }
}

/// The certificate files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// And valid for this DNS name or IP address (a subject alternative name).
    pub client_san: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("TLS: {path}: {reason}")]
pub struct TlsError {
    path: String,
    reason: String,
}

fn error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

impl TlsFiles {
    /// Loads the files into a server config (HTTP/2 only, as gRPC needs).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|e| error(&self.cert, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| error(&self.cert, e))?;
        if certs.is_empty() {
            return Err(error(&self.cert, "no certificate in the file"));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| error(&self.key, e))?;
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| error(&self.cert, e))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca).map_err(|e| error(ca, e))? {
                    roots
                        .add(cert.map_err(|e| error(ca, e))?)
                        .map_err(|e| error(ca, e))?;
                }
                let mut verifier: Arc<dyn ClientCertVerifier> =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| error(ca, e))?;
                if let Some(san) = &self.client_san {
                    let name = ServerName::try_from(san.clone()).map_err(|_| {
                        error(
                            ca,
                            format!("--tls-client-san {san:?} is not a DNS name or an IP address"),
                        )
                    })?;
                    verifier = Arc::new(NamedClients {
                        inner: verifier,
                        name,
                    });
                }
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| error(&self.cert, e))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// Modification times and sizes of the files, to notice a rotation.
    fn stamp(&self) -> Vec<Option<(SystemTime, u64)>> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|path| {
                std::fs::metadata(path)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())))
            })
            .collect()
    }
}

/// Client certificates the CA signed that are also valid for one name (the reference's
/// GRPC_CLIENT_TLS_SAN).
#[derive(Debug)]
struct NamedClients {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClients {
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let certificate = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        certificate
            .verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Accepted, handshaken TLS connections, for tonic's `serve_with_incoming_shutdown`. The
/// accept loop stops when this is dropped.
pub struct TlsIncoming {
    connections: mpsc::Receiver<TlsStream<Inbound<TcpStream>>>,
    accept: JoinHandle<()>,
}

impl TlsIncoming {
    /// Starts accepting on `listener` with `files` (already loaded once into `config`).
    pub fn new(listener: Acceptor, files: TlsFiles, config: Arc<ServerConfig>) -> Self {
        let (ready, connections) = mpsc::channel(128);
        let accept = tokio::spawn(accept_loop(listener, files, config, ready));
        Self {
            connections,
            accept,
        }
    }
}

impl futures_util::Stream for TlsIncoming {
    type Item = Result<TlsStream<Inbound<TcpStream>>, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.connections.poll_recv(cx).map(|next| next.map(Ok))
    }
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(
    mut listener: Acceptor,
    files: TlsFiles,
    mut config: Arc<ServerConfig>,
    ready: mpsc::Sender<TlsStream<Inbound<TcpStream>>>,
) {
    let mut stamp = files.stamp();
    let mut checked = Instant::now();
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
            return;
        };
        let accepted = listener.accept().await;
        let peer = accepted.stream.peer_addr().ok();
        let tcp = accepted.into_inbound();
        if checked.elapsed() >= CHECK_EVERY {
            checked = Instant::now();
            let now = files.stamp();
            if now != stamp {
                stamp = now;
                match files.server_config() {
                    Ok(new) => {
                        tracing::info!("TLS certificates reloaded");
                        config = new;
                    }
                    Err(error) => {
                        tracing::error!(%error, "TLS certificates changed but do not load; keeping the previous ones");
                    }
                }
            }
        }
        let acceptor = TlsAcceptor::from(Arc::clone(&config));
        let ready = ready.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = ready.send(stream).await;
                }
                Ok(Err(error)) => tracing::debug!(?peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(?peer, "TLS handshake timed out"),
            }
        });
    }
}
