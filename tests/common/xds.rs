//! A control plane for the tests: a tonic Aggregated Discovery Service that serves the
//! `RateLimitConfig` snapshot it is told to serve (state of the world, one response per
//! snapshot, nonces counting up), records every request it receives (ACKs and NACKs), and can
//! be stopped and started again on the same port.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tollgate::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use tollgate::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tollgate::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use tollgate::xds::TYPE_URL;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// The snapshot served: a version and the whole set of configs.
type Snapshot = (String, Vec<RateLimitConfig>);

#[derive(Default)]
struct Seen {
    requests: Vec<DiscoveryRequest>,
    /// The value of the `x-token` metadata on each stream opened.
    tokens: Vec<Option<String>>,
}

#[derive(Clone)]
struct Plane {
    snapshot: watch::Receiver<Snapshot>,
    seen: Arc<Mutex<Seen>>,
    /// Ends every open stream (with UNAVAILABLE), as a control plane going away does.
    kill: broadcast::Sender<()>,
}

/// TLS of the control plane: its certificate, and the CA its clients' certificates must
/// come from.
pub struct PlaneTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

pub struct ControlPlane {
    pub addr: SocketAddr,
    snapshot: watch::Sender<Snapshot>,
    seen: Arc<Mutex<Seen>>,
    kill: broadcast::Sender<()>,
    task: Option<JoinHandle<()>>,
}

impl ControlPlane {
    /// Starts on a free loopback port (or `port`), serving nothing until `push`.
    pub async fn start(port: Option<u16>, tls: Option<&PlaneTls>) -> Self {
        let (snapshot, _) = watch::channel((String::new(), Vec::new()));
        let mut plane = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port.unwrap_or(0))),
            snapshot,
            seen: Arc::default(),
            kill: broadcast::channel(4).0,
            task: None,
        };
        plane.serve(tls).await;
        plane
    }

    async fn serve(&mut self, tls: Option<&PlaneTls>) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.addr = listener.local_addr().unwrap();
        let plane = Plane {
            snapshot: self.snapshot.subscribe(),
            seen: Arc::clone(&self.seen),
            kill: self.kill.clone(),
        };
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            let identity = Identity::from_pem(
                std::fs::read(&tls.cert).unwrap(),
                std::fs::read(&tls.key).unwrap(),
            );
            let client_ca = Certificate::from_pem(std::fs::read(&tls.client_ca).unwrap());
            builder = builder
                .tls_config(
                    ServerTlsConfig::new()
                        .identity(identity)
                        .client_ca_root(client_ca),
                )
                .unwrap();
        }
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(plane));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        self.task = Some(tokio::spawn(async move {
            let _ = router.serve_with_incoming(incoming).await;
        }));
    }

    /// Serves this snapshot from now on (to open streams at once).
    pub fn push(&self, version: &str, configs: Vec<RateLimitConfig>) {
        self.snapshot.send_replace((version.to_owned(), configs));
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        self.seen.lock().unwrap().requests.clone()
    }

    /// The `x-token` metadata of each stream opened so far.
    pub fn tokens(&self) -> Vec<Option<String>> {
        self.seen.lock().unwrap().tokens.clone()
    }

    /// The first request (within 10 s) that `matches`.
    pub async fn request_where(
        &self,
        matches: impl Fn(&DiscoveryRequest) -> bool,
    ) -> DiscoveryRequest {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(found) = self.requests().into_iter().find(|r| matches(r)) {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no such request: {:?}",
                self.requests()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops accepting and ends every open stream.
    pub async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        let _ = self.kill.send(());
    }

    /// Starts again on the same port.
    pub async fn restart(&mut self, tls: Option<&PlaneTls>) {
        self.serve(tls).await;
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let _ = self.kill.send(());
    }
}

fn response(snapshot: &Snapshot, nonce: u64) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: snapshot.0.clone(),
        resources: snapshot
            .1
            .iter()
            .map(|config| prost_types::Any {
                type_url: TYPE_URL.into(),
                value: config.encode_to_vec(),
            })
            .collect(),
        type_url: TYPE_URL.into(),
        nonce: nonce.to_string(),
        ..Default::default()
    }
}

type Responses =
    Pin<Box<dyn futures_util::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Plane {
    type StreamAggregatedResourcesStream = Responses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let token = request
            .metadata()
            .get("x-token")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        self.seen.lock().unwrap().tokens.push(token);
        let mut incoming = request.into_inner();
        let (sender, receiver) = mpsc::channel::<Result<DiscoveryResponse, Status>>(8);
        let (seen, mut snapshots, mut kill) = (
            Arc::clone(&self.seen),
            self.snapshot.clone(),
            self.kill.subscribe(),
        );
        tokio::spawn(async move {
            let mut nonce = 0;
            let mut subscribed = false;
            loop {
                let send = tokio::select! {
                    request = incoming.message() => match request {
                        Ok(Some(request)) => {
                            seen.lock().unwrap().requests.push(request);
                            // The first request subscribes: answer with what there is.
                            !std::mem::replace(&mut subscribed, true)
                        }
                        _ => return,
                    },
                    changed = snapshots.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        subscribed
                    }
                    _ = kill.recv() => {
                        let _ = sender.send(Err(Status::unavailable("control plane stopping"))).await;
                        return;
                    }
                };
                if !send {
                    // Marking the snapshot seen here would lose one pushed while this request
                    // (an ACK) was read: it is sent when `changed` fires on the next turn.
                    continue;
                }
                let snapshot = snapshots.borrow_and_update().clone();
                if !snapshot.0.is_empty() {
                    nonce += 1;
                    if sender.send(Ok(response(&snapshot, nonce))).await.is_err() {
                        return;
                    }
                }
            }
        });
        let responses = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|response| (response, receiver))
        });
        Ok(Response::new(Box::pin(responses)))
    }
}
