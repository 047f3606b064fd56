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
use crate::inbound::conduct::Conduct;
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

/// Largest report message. Envoy sends every bucket it knows in one: a megabyte holds about
/// ten thousand buckets of a few entries.
const MAX_REPORT_BYTES: usize = 1024 * 1024;

/// How long a refused stream's connection stays open for the refusal to reach its client.
const REFUSAL_FLUSH: std::time::Duration = std::time::Duration::from_millis(100);

/// Buckets of a report taken at a time; between two slices the stream's task yields, so that
/// a report of thousands of buckets never holds a worker (and the RLS calls queued behind it)
/// for long.
const REPORT_SLICE: usize = 64;

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
        let conduct = request.extensions().get::<Conduct>().cloned();
        let reports = request.into_inner();
        let (outbox, inbox) = mpsc::channel(OUTBOX_SIZE);
        // The registry holds the only sender: when it forgets the stream, the responses end.
        let (id, ended) = self.registry.open(outbox).map_err(Status::from)?;
        tokio::spawn(read_reports(
            Arc::clone(&self.registry),
            (id, conduct),
            reports,
            ended,
        ));
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
    (id, conduct): (StreamId, Option<Conduct>),
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    mut ended: oneshot::Receiver<()>,
) {
    let _forget = Forget(&registry, id);
    let _open = conduct.as_ref().map(Conduct::stream_open);
    loop {
        let message = tokio::select! {
            message = reports.message() => message,
            _ = &mut ended => return,
        };
        match message {
            Ok(Some(report)) => {
                if let Err(error) = take_report(&registry, id, report).await {
                    tracing::debug!(%error, "RLQS stream refused");
                    // Past a bound of the whole service, a client whose connection carries
                    // this stream alone loses it too (once the refusal has had time to reach
                    // it), and its listener pauses: reconnecting to fill the service again
                    // costs it more than it costs tollgate. Streams beside it on the same
                    // connection are another caller's, served as before.
                    if let (ReportError::Full(_), Some(conduct)) = (&error, conduct)
                        && conduct.streams_now() <= 1
                    {
                        tokio::spawn(async move {
                            tokio::time::sleep(REFUSAL_FLUSH).await;
                            conduct.close();
                        });
                    }
                    registry.refuse(id, error);
                    return;
                }
            }
            Ok(None) => return,
            // The client went: nobody is left to tell.
            Err(status) if status.code() == tonic::Code::Cancelled => return,
            Err(status) => {
                tracing::debug!(%status, "RLQS stream ended");
                let (code, message) = (status.code() as i32, status.message().to_owned());
                registry.refuse(id, ReportError::Unreadable { code, message });
                return;
            }
        }
    }
}

/// A report given to the registry `REPORT_SLICE` buckets at a time, yielding between.
async fn take_report(
    registry: &Registry,
    id: StreamId,
    mut report: RateLimitQuotaUsageReports,
) -> Result<(), ReportError> {
    registry.metrics.quota.reports.inc();
    let mut usages = std::mem::take(&mut report.bucket_quota_usages);
    loop {
        let rest = usages.split_off(usages.len().min(REPORT_SLICE));
        let slice = RateLimitQuotaUsageReports {
            domain: report.domain.clone(),
            bucket_quota_usages: usages,
        };
        registry.report(id, slice)?;
        if rest.is_empty() {
            return Ok(());
        }
        usages = rest;
        tokio::task::yield_now().await;
    }
}

/// A refused report ends its stream as INVALID_ARGUMENT naming what was wrong; one past a
/// bound of the whole service, as RESOURCE_EXHAUSTED naming the bound; a stream that closed
/// while its report was read, as CANCELLED.
impl From<ReportError> for Status {
    fn from(error: ReportError) -> Self {
        match error {
            ReportError::Closed => Status::cancelled(error.to_string()),
            ReportError::Full(_) => Status::resource_exhausted(error.to_string()),
            ReportError::Unreadable { code, message } => Status::new(code.into(), message),
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
