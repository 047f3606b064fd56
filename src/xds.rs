//! Rules pushed by a control plane over xDS (`--config-xds`, the reference's
//! `CONFIG_TYPE=GRPC_XDS_SOTW`), as Envoy Gateway pushes them to its rate-limit service: one
//! Aggregated Discovery Service stream, state of the world, a wildcard subscription to
//! `RateLimitConfig` resources.
//!
//! Each response is the whole rule set. It goes through the file loader's validation
//! (`config::xds`); if it loads, it replaces the rules in one atomic swap (counters are keyed
//! by rule identity, so unchanged rules keep theirs) and is acknowledged with its version and
//! nonce; if not, it is rejected (NACK) with the errors naming the resource, and the last good
//! rules stay. When the control plane is away, the last good rules keep serving while the
//! stream is re-established with backoff.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use prost::Message as _;
use tokio::sync::mpsc;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::config;
use crate::metrics::{self, Metrics};
use crate::pb::envoy::config::core::v3::Node;
use crate::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use crate::pb::google::rpc::Status;
use crate::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use crate::reload::ReloadStatus;
use crate::rules::RuleSet;

/// The resource type tollgate subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// How to reach the control plane and who to say we are.
#[derive(Debug, Clone, PartialEq)]
pub struct XdsOptions {
    /// `host:port`, or a URL (`http://`, `https://`).
    pub server: String,
    pub node_id: String,
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent with the stream (e.g. an authorization token).
    pub headers: Vec<(String, String)>,
    pub tls: Option<XdsTls>,
    /// First and longest wait before reconnecting; jittered by up to half.
    pub backoff: (Duration, Duration),
    pub max_message_bytes: Option<usize>,
    /// Resources of one domain are merged (as `--merge-domains`).
    pub merge_domains: bool,
}

/// TLS to the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    pub ca: PathBuf,
    /// A client certificate and key, for a control plane that requires one.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name the control plane's certificate must carry (default: the host of `server`).
    pub server_name: Option<String>,
}

/// Why a stream ended (logged; the stream is then re-established).
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("{0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("{0}")]
    Status(#[from] tonic::Status),
    #[error("{0}")]
    Setup(String),
}

/// Follows the control plane until the returned task is aborted; each set applied replaces
/// `rules` (the first one, `RuleSet::not_loaded` until then).
pub fn spawn(
    options: XdsOptions,
    rules: Arc<ArcSwap<RuleSet>>,
    status: Arc<ReloadStatus>,
    metrics: Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut client = Client {
            options,
            rules,
            status,
            metrics,
            applied: String::new(),
        };
        let mut wait = client.options.backoff.0;
        loop {
            let received = client.follow().await;
            match &received {
                Ok(true) | Err((true, _)) => wait = client.options.backoff.0,
                _ => {}
            }
            if let Err((_, error)) = received {
                tracing::warn!(server = %client.options.server, %error, "xDS stream ended; the rules in force stay");
            }
            let pause = jittered(wait);
            tracing::info!(server = %client.options.server, retry_in = ?pause, "reconnecting to the control plane");
            tokio::time::sleep(pause).await;
            wait = (wait * 2).min(client.options.backoff.1);
        }
    })
}

/// `wait`, less up to half of it (spreads reconnections of many replicas).
fn jittered(wait: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    let share = f64::from(nanos % 1000) / 2000.0;
    wait.mul_f64(1.0 - share)
}

struct Client {
    options: XdsOptions,
    rules: Arc<ArcSwap<RuleSet>>,
    status: Arc<ReloadStatus>,
    metrics: Arc<Metrics>,
    /// The version last applied ("" before any).
    applied: String,
}

impl Client {
    /// One stream, until it ends: `Ok(received any)`, or the error with whether any response
    /// had been received (which resets the backoff).
    async fn follow(&mut self) -> Result<bool, (bool, StreamError)> {
        let mut received = false;
        let (sender, mut responses) = self.open().await.map_err(|error| (false, error))?;
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return Ok(received),
                Err(status) => return Err((received, status.into())),
            };
            received = true;
            let answer = self.apply(&response);
            if sender.send(answer).await.is_err() {
                return Ok(received);
            }
        }
    }

    async fn open(
        &self,
    ) -> Result<
        (
            mpsc::Sender<DiscoveryRequest>,
            tonic::Streaming<DiscoveryResponse>,
        ),
        StreamError,
    > {
        let channel = self.endpoint()?.connect().await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(limit) = self.options.max_message_bytes {
            client = client.max_decoding_message_size(limit);
        }
        let (sender, receiver) = mpsc::channel(4);
        // The first request subscribes; it carries the version applied before a reconnect.
        let subscribe = self.request(self.applied.clone(), String::new(), None);
        sender
            .send(subscribe)
            .await
            .map_err(|_| StreamError::Setup("request channel closed".into()))?;
        let outgoing = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|request| (request, receiver))
        });
        let mut request = tonic::Request::new(outgoing);
        for (key, value) in &self.options.headers {
            let key = MetadataKey::from_bytes(key.as_bytes())
                .map_err(|_| StreamError::Setup(format!("header name {key:?}")))?;
            let value = MetadataValue::try_from(value.as_str())
                .map_err(|_| StreamError::Setup(format!("header value for {key:?}")))?;
            request.metadata_mut().insert(key, value);
        }
        let responses = client
            .stream_aggregated_resources(request)
            .await?
            .into_inner();
        tracing::info!(server = %self.options.server, node = %self.options.node_id, "subscribed to rate limit configs over xDS");
        Ok((sender, responses))
    }

    fn endpoint(&self) -> Result<Endpoint, StreamError> {
        let server = &self.options.server;
        let uri = match (server.contains("://"), &self.options.tls) {
            (true, _) => server.clone(),
            (false, Some(_)) => format!("https://{server}"),
            (false, None) => format!("http://{server}"),
        };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|error| StreamError::Setup(format!("--config-xds {server}: {error}")))?
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(30));
        if let Some(tls) = &self.options.tls {
            endpoint = endpoint.tls_config(tls_config(tls)?)?;
        }
        Ok(endpoint)
    }

    /// Applies a response if it loads; the ACK or NACK to send.
    fn apply(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        let nonce = response.nonce.clone();
        match self.load(response) {
            Ok(rules) => {
                let domains = rules.domains().len();
                self.rules.store(Arc::new(rules));
                self.applied = response.version_info.clone();
                self.status.set(None);
                let source = format!("xds {}, version {}", self.options.server, self.applied);
                self.status.set_source(source);
                self.metrics.config.source("xds", &self.applied);
                self.count("success");
                tracing::info!(version = %self.applied, domains, "applied rate limit configs from xDS");
                self.request(self.applied.clone(), nonce, None)
            }
            Err(reason) => {
                tracing::error!(version = %response.version_info, %reason, "rejected rate limit configs from xDS; the rules in force stay");
                self.status.set(Some(reason.clone()));
                self.count("error");
                let rejected = Status {
                    code: tonic::Code::InvalidArgument as i32,
                    message: reason,
                    details: Vec::new(),
                };
                self.request(self.applied.clone(), nonce, Some(rejected))
            }
        }
    }

    /// The rule set a response carries, or why it does not load.
    fn load(&self, response: &DiscoveryResponse) -> Result<RuleSet, String> {
        let mut configs = Vec::with_capacity(response.resources.len());
        for (index, resource) in response.resources.iter().enumerate() {
            if resource.type_url != TYPE_URL {
                return Err(format!(
                    "resources[{index}]: type {:?}, expected {TYPE_URL}",
                    resource.type_url
                ));
            }
            let config = RateLimitConfig::decode(resource.value.as_slice())
                .map_err(|error| format!("resources[{index}]: {error}"))?;
            configs.push(config);
        }
        config::xds::from_resources(&configs, self.options.merge_domains)
            .map_err(|errors| errors.to_string())
    }

    fn request(&self, version: String, nonce: String, error: Option<Status>) -> DiscoveryRequest {
        let fields = self
            .options
            .node_metadata
            .iter()
            .map(|(key, value)| {
                let value = prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(value.clone())),
                };
                (key.clone(), value)
            })
            .collect();
        DiscoveryRequest {
            version_info: version,
            node: Some(Node {
                id: self.options.node_id.clone(),
                metadata: Some(prost_types::Struct { fields }),
                user_agent_name: "tollgate".into(),
                user_agent_version: env!("CARGO_PKG_VERSION").into(),
                ..Node::default()
            }),
            resource_names: Vec::new(),
            type_url: TYPE_URL.into(),
            response_nonce: nonce,
            error_detail: error,
        }
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .config
            .reloads
            .get_or_create(&metrics::label("result", result))
            .inc();
        self.metrics.config.loaded(result == "success");
    }
}

fn tls_config(tls: &XdsTls) -> Result<ClientTlsConfig, StreamError> {
    let read = |path: &PathBuf| {
        std::fs::read(path)
            .map_err(|error| StreamError::Setup(format!("{}: {error}", path.display())))
    };
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}
