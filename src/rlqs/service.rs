//! RLQS over gRPC: one task per stream reads the reports into the registry; the response
//! stream is the stream's outbox, which the registry writes to. The stream ends when the
//! client goes, or after an INVALID_ARGUMENT for a report that breaks the protocol.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use futures_util::Stream;
use tokio::sync::{mpsc, oneshot};
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};

use super::QuotaOptions;
use super::registry::{Registry, StreamId};
use super::report::ReportError;
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::pb::{
    RateLimitQuotaResponse, RateLimitQuotaService, RateLimitQuotaServiceServer,
    RateLimitQuotaUsageReports,
};
use crate::rules::RuleSet;
use crate::storage::DemandShare;

/// Responses waiting for a slow client; past this, renewals are skipped until it catches up.
const OUTBOX_SIZE: usize = 16;

/// The quota service as served: the registry and the task that rebalances it.
pub struct Quotas {
    pub registry: Arc<Registry>,
    rebalancer: tokio::task::JoinHandle<()>,
}

impl Quotas {
    /// Starts rebalancing every `rlqs_interval`, sharing demand through `demand` when the
    /// store is shared; must run inside a tokio runtime.
    pub fn start(
        options: QuotaOptions,
        rules: Arc<ArcSwap<RuleSet>>,
        demand: Option<Arc<dyn DemandShare>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let registry = Arc::new(Registry::new(options, rules, metrics));
        let rebalancer = super::rebalance::spawn(Arc::clone(&registry), demand);
        Self {
            registry,
            rebalancer,
        }
    }

    pub fn service(&self) -> QuotaService {
        QuotaService::new(Arc::clone(&self.registry))
    }

    /// Before the listeners close: the data planes are told their assignments expired (so
    /// their expired-assignment behaviour applies now), and every stream ends.
    pub fn stop(&self) {
        self.rebalancer.abort();
        self.registry.expire_all();
        self.registry.end_all();
    }
}

#[derive(Clone)]
pub struct QuotaService {
    registry: Arc<Registry>,
}

impl QuotaService {
    pub fn new(registry: Arc<Registry>) -> Self {
        Self { registry }
    }

    /// The gRPC route of RLQS, each stream's reports held to `intake`'s bounds message by
    /// message.
    pub fn route(self, intake: Arc<Intake>) -> QuotaRoute {
        QuotaRoute {
            server: RateLimitQuotaServiceServer::new(self)
                .max_decoding_message_size(MAX_REPORT_BYTES),
            intake,
        }
    }
}

/// Largest report message: Envoy sends every bucket it knows in one.
const MAX_REPORT_BYTES: usize = 4 * 1024 * 1024;

/// RLQS as tonic's router serves it: the generated server, its request bodies metered.
#[derive(Clone)]
pub struct QuotaRoute {
    server: RateLimitQuotaServiceServer<QuotaService>,
    intake: Arc<Intake>,
}

impl Service<http::Request<Body>> for QuotaRoute {
    type Response =
        <RateLimitQuotaServiceServer<QuotaService> as Service<http::Request<Body>>>::Response;
    type Error = <RateLimitQuotaServiceServer<QuotaService> as Service<http::Request<Body>>>::Error;
    type Future =
        <RateLimitQuotaServiceServer<QuotaService> as Service<http::Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<http::Request<Body>>::poll_ready(&mut self.server, cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let request = request.map(|body| Body::new(self.intake.metered(body)));
        self.server.call(request)
    }
}

impl NamedService for QuotaRoute {
    const NAME: &'static str = <RateLimitQuotaServiceServer<QuotaService> as NamedService>::NAME;
}

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Responses>, Status> {
        let reports = request.into_inner();
        let (outbox, inbox) = mpsc::channel(OUTBOX_SIZE);
        // The registry holds the only sender: when it forgets the stream, the responses end.
        let (id, ended) = self.registry.open(outbox);
        tokio::spawn(read_reports(Arc::clone(&self.registry), id, reports, ended));
        let responses = futures_util::stream::unfold(inbox, |mut inbox| async move {
            let response = inbox.recv().await?;
            Some((response.map_err(Status::from), inbox))
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// Feeds a stream's reports to the registry until the client closes it, breaks the protocol
/// or the registry ends it (shutdown); then the registry forgets the stream, which ends the
/// responses, and dropping `reports` resets the client's half of the stream.
async fn read_reports(
    registry: Arc<Registry>,
    id: StreamId,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    mut ended: oneshot::Receiver<()>,
) {
    let _forget = Forget(&registry, id);
    loop {
        let message = tokio::select! {
            message = reports.message() => message,
            _ = &mut ended => return,
        };
        match message {
            Ok(Some(report)) => {
                if let Err(error) = registry.report(id, report) {
                    tracing::debug!(%error, "RLQS stream refused");
                    registry.refuse(id, error);
                    return;
                }
            }
            Ok(None) => return,
            Err(status) => {
                tracing::debug!(%status, "RLQS stream ended");
                return;
            }
        }
    }
}

/// A refused report ends its stream as INVALID_ARGUMENT naming what was wrong; a stream that
/// closed while its report was read, as CANCELLED.
impl From<ReportError> for Status {
    fn from(error: ReportError) -> Self {
        match error {
            ReportError::Closed => Status::cancelled(error.to_string()),
            error => Status::invalid_argument(error.to_string()),
        }
    }
}

/// Forgets the stream however `read_reports` ends (a panic included).
struct Forget<'a>(&'a Registry, StreamId);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.close(self.1);
    }
}
