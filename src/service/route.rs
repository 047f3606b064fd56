//! `ShouldRateLimit` as an HTTP/2 route: what a generated gRPC server does for one unary
//! method, with tollgate's bounds where it reads and decodes. A request the admission queue
//! has no room for is refused before a byte of it is read; the message is read by `Intake`
//! (a deadline to arrive whole, a bound on what requests still arriving hold); a message that
//! is not a `RateLimitRequest` is INVALID_ARGUMENT naming the decoding error. Every request
//! refused here counts in `tollgate_requests_total` as the handler counts the rest.
//!
//! The route serves any `Handler`: tollgate's `RlsService`, or the benchmarks' null handler
//! (examples/null_server.rs), which so pays for exactly the transport tollgate pays for.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::future::Future;

use futures_util::future::BoxFuture;
use http_body::Frame;
use prost::Message as _;
use prost::bytes::{BufMut as _, Bytes, BytesMut};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::transport::server::TlsConnectInfo;

use super::RlsService;
use crate::inbound::conduct::Conduct;
use crate::intake::{Intake, Waiting};
use crate::pb;

/// The one method of the service.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// What answers the requests the route has read, and counts those refused before it.
pub trait Handler: Clone + Send + Sync + 'static {
    /// One request decided (or refused with its status).
    fn handle(
        &self,
        metadata: &MetadataMap,
        request: pb::RateLimitRequest,
    ) -> impl Future<Output = Result<pb::RateLimitResponse, Status>> + Send;

    /// The refusal of a request not to be read at all, when the handler is overloaded.
    fn refuses_at_once(&self) -> Option<Status>;

    /// A request the intake refused while reading it, for `reason`.
    fn count_intake_refusal(&self, reason: &'static str);

    /// A request refused before it reached `handle`, with `code`.
    fn count_refused(&self, code: tonic::Code);
}

impl Handler for RlsService {
    fn handle(
        &self,
        metadata: &MetadataMap,
        request: pb::RateLimitRequest,
    ) -> impl Future<Output = Result<pb::RateLimitResponse, Status>> + Send {
        RlsService::handle(self, metadata, request)
    }

    fn refuses_at_once(&self) -> Option<Status> {
        let overloaded = self.admission.refuses_at_once()?;
        Some(Status::resource_exhausted(overloaded.to_string()))
    }

    fn count_intake_refusal(&self, reason: &'static str) {
        self.metrics.service.count_refusal(reason);
    }

    fn count_refused(&self, code: tonic::Code) {
        // Observed as answered at once, so that the decision histogram still counts every
        // answered request.
        let metrics = &self.metrics.service;
        metrics.observe_decision(Duration::ZERO);
        metrics.count_request(code);
    }
}

/// RLS v3 as tonic's router serves it.
#[derive(Clone)]
pub struct RlsRoute<H = RlsService> {
    service: H,
    intake: Arc<Intake>,
    max_request_bytes: usize,
}

impl<H: Handler> RlsRoute<H> {
    pub fn new(service: H, intake: Arc<Intake>, max_request_bytes: usize) -> Self {
        Self {
            service,
            intake,
            max_request_bytes,
        }
    }

    async fn answer(self, request: http::Request<Body>) -> http::Response<Body> {
        let (parts, body) = request.into_parts();
        if parts.uri.path() != SHOULD_RATE_LIMIT {
            return Status::unimplemented(format!("no method {}", parts.uri.path())).into_http();
        }
        let conduct = parts
            .extensions
            .get::<Conduct>()
            .or_else(|| {
                let tls = parts.extensions.get::<TlsConnectInfo<Conduct>>();
                tls.map(TlsConnectInfo::get_ref)
            })
            .cloned();
        let metadata = MetadataMap::from_headers(parts.headers);
        match self.read(body, conduct.as_ref()).await {
            Ok(request) => match self.service.handle(&metadata, request).await {
                // Until its client takes it, the answer waits on it.
                Ok(response) => match self.intake.waiting(conduct.as_ref()) {
                    Ok(waiting) => grpc_response(&response, waiting),
                    Err(refusal) => Status::from(refusal).into_http(),
                },
                Err(status) => status.into_http(),
            },
            Err(status) => {
                // Counted as the handler counts its own refusals.
                self.service.count_refused(status.code());
                status.into_http()
            }
        }
    }

    /// The request, unless it is refused before it is decided.
    async fn read(
        &self,
        body: Body,
        conduct: Option<&Conduct>,
    ) -> Result<pb::RateLimitRequest, Status> {
        if let Some(refused) = self.service.refuses_at_once() {
            return Err(refused);
        }
        let message = self
            .intake
            .unary(body, self.max_request_bytes, conduct)
            .await
            .map_err(|refusal| {
                self.service.count_intake_refusal(refusal.reason());
                Status::from(refusal)
            })?;
        pb::RateLimitRequest::decode(message)
            .map_err(|error| Status::invalid_argument(format!("malformed request: {error}")))
    }
}

impl<H: Handler> Service<http::Request<Body>> for RlsRoute<H> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let route = self.clone();
        Box::pin(async move { Ok(route.answer(request).await) })
    }
}

impl<H> NamedService for RlsRoute<H> {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

/// A unary call's successful answer: `message` as the one message of the body, then the
/// trailers of an OK.
fn grpc_response(message: &pb::RateLimitResponse, waiting: Waiting) -> http::Response<Body> {
    let length = message.encoded_len();
    let mut bytes = BytesMut::with_capacity(5 + length);
    bytes.put_u8(0);
    // A response is bounded by the request's descriptors: far below 4 GiB.
    bytes.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message.encode_raw(&mut bytes);
    let mut response = http::Response::new(Body::new(Answer {
        message: Some(bytes.freeze()),
        done: false,
        _waiting: waiting,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A body of one message and the trailers of an OK, waiting on its client until taken.
struct Answer {
    message: Option<Bytes>,
    done: bool,
    _waiting: Waiting,
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        self.done = true;
        let mut trailers = http::HeaderMap::with_capacity(1);
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
