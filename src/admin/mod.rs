//! The HTTP admin listener (port 8080 by default), with the reference's endpoints:
//! `/healthcheck` (200 `OK` when ready, else 500), `/healthz` (liveness: 200 while the process
//! runs, 500 when the store client is stuck), `/readyz` (as `/healthcheck`, plus the store's state), `POST /json` (a `RateLimitRequest` as protojson; 200
//! OK, 429 OVER_LIMIT, 400 invalid request, 503 store unavailable), `GET /config` (the
//! active rules, one line per limit), and tollgate's own `POST /reset` (an operator's reset
//! of the counters a request names). `writes.rs` guards the two that change state.

pub mod debug;
pub mod describe;
pub mod json;
pub mod writes;

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::health::Health;
use crate::limiter::RateLimiter;
use crate::metrics::Metrics;
use crate::reload::ReloadStatus;
use crate::rlqs::registry::Registry;
use crate::service::{self, RlsService};

#[derive(Clone)]
struct Admin {
    service: RlsService,
    limiter: Arc<RateLimiter>,
    health: Health,
    metrics: Arc<Metrics>,
    reload: Arc<ReloadStatus>,
    quotas: Arc<Registry>,
}

/// The admin routes; `writes` guards the mutating ones.
pub fn router(
    writes: writes::AdminWrites,
    service: RlsService,
    limiter: Arc<RateLimiter>,
    health: Health,
    metrics: Arc<Metrics>,
    reload: Arc<ReloadStatus>,
    quotas: Arc<Registry>,
) -> Router {
    let mutating = Router::new()
        .route("/json", post(decide_json))
        .route("/reset", post(reset_counters))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::new(writes),
            writes::guard,
        ));
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthcheck", get(readiness))
        .route("/readyz", get(readiness_with_store))
        .route("/healthz", get(liveness))
        .route("/config", get(config))
        .merge(mutating)
        .with_state(Admin {
            service,
            limiter,
            health,
            metrics,
            reload,
            quotas,
        })
}

async fn metrics_text(State(admin): State<Admin>) -> Response {
    exposition(&admin.metrics)
}

/// The metrics alone at `path`, for a listener of their own (`--metrics-addr`).
pub fn metrics_router(metrics: Arc<Metrics>, path: &str) -> Router {
    Router::new()
        .route(
            path,
            get(|State(metrics): State<Arc<Metrics>>| async move { exposition(&metrics) }),
        )
        .with_state(metrics)
}

fn exposition(metrics: &Metrics) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
        .into_response()
}

/// 200 while the process runs, unless the store client is stuck (`Health::stuck`).
async fn liveness(State(admin): State<Admin>) -> (StatusCode, String) {
    match admin.health.stuck() {
        None => (StatusCode::OK, "OK".into()),
        Some(why) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("store client stuck: {why}\n"),
        ),
    }
}

async fn readiness(State(admin): State<Admin>) -> (StatusCode, &'static str) {
    if admin.health.is_ready() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK")
    }
}

/// As `/healthcheck`, then the store's own state on a second line (`store: up` or `store:
/// down`), which with `--on-store-error allow|deny` can be down while the server is ready.
async fn readiness_with_store(State(admin): State<Admin>) -> (StatusCode, String) {
    let (status, text) = readiness(State(admin.clone())).await;
    let store = if admin.health.is_store_ok() {
        "up"
    } else {
        "down"
    };
    (status, format!("{text}\nstore: {store}\n"))
}

async fn decide_json(State(admin): State<Admin>, body: Bytes) -> Response {
    let request = match json::decode_request(&body) {
        Ok(request) => request,
        Err(error) => {
            return (StatusCode::BAD_REQUEST, format!("bad request: {error}\n")).into_response();
        }
    };
    match admin.service.answer(request, None).await {
        Ok(response) => {
            let status = match json::overall_code(&response) {
                "OK" => StatusCode::OK,
                "OVER_LIMIT" => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            let body = json::encode_response(&response);
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(service::Error::Request(error)) => {
            (StatusCode::BAD_REQUEST, format!("bad request: {error}\n")).into_response()
        }
        Err(service::Error::Overloaded(error)) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response()
        }
        // The reference answers its service errors with 400.
        Err(error @ service::Error::NoConfig) => {
            (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response()
        }
        Err(service::Error::Store(_)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "rate limit store unavailable\n",
        )
            .into_response(),
        // Not sent here (a JSON request carries no deadline), but named for what it is.
        Err(error @ service::Error::DeadlinePassed) => {
            (StatusCode::GATEWAY_TIMEOUT, format!("{error}\n")).into_response()
        }
    }
}

/// `POST /reset` with a request as for `/json`: forgets the counters its descriptors would
/// count on, in the store and in this replica's deny cache. 200 `{"reset": N}`.
async fn reset_counters(State(admin): State<Admin>, body: Bytes) -> Response {
    let request = match json::decode_request(&body) {
        Ok(request) => request,
        Err(error) => {
            return (StatusCode::BAD_REQUEST, format!("bad request: {error}\n")).into_response();
        }
    };
    match admin.service.reset(request).await {
        Ok(count) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            format!("{{\"reset\":{count}}}"),
        )
            .into_response(),
        Err(service::Error::Request(error)) => {
            (StatusCode::BAD_REQUEST, format!("bad request: {error}\n")).into_response()
        }
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response(),
    }
}

/// The rules in force, then, if the latest reload failed, its errors (the rules shown are
/// the last good ones).
async fn config(State(admin): State<Admin>) -> String {
    let form = describe::Form::Tollgate {
        leasing: admin.limiter.leasing(),
    };
    let mut out = describe::describe(&admin.limiter.rules(), form);
    if let Some(source) = admin.reload.source() {
        let _ = write!(out, "\nsource: {source}\n");
    }
    let buckets = admin.quotas.describe();
    if !buckets.is_empty() {
        let _ = write!(out, "\nquota buckets (RLQS):\n{buckets}");
    }
    if let Some(error) = admin.reload.last_error() {
        let _ = write!(
            out,
            "\nlast reload failed; the config above stays in force:\n{error}\n"
        );
    }
    out
}
