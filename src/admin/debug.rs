//! The reference's debug listener (`DEBUG_HOST:DEBUG_PORT`, 6070; `--debug-addr`), for the
//! tools that read it: `/rlconfig` (the rules in force in the reference's form, which
//! `egctl config ratelimit` prints), `/stats` (the reference's stats, `name: value`) and `/`
//! (the endpoints, `path: what`). The reference's Go profiler endpoints have no meaning here.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use super::describe::{Form, describe};
use crate::limiter::RateLimiter;
use crate::metrics::Metrics;
use crate::metrics::reference::stat_totals;

/// The endpoints and what each gives, sorted by path as the reference lists them.
const ENDPOINTS: [(&str, &str); 2] = [
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out stats"),
];

#[derive(Clone)]
struct Debug {
    limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
}

pub fn router(limiter: Arc<RateLimiter>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/rlconfig", get(rlconfig))
        .route("/stats", get(stats))
        .with_state(Debug { limiter, metrics })
}

async fn index() -> String {
    ENDPOINTS
        .iter()
        .map(|(path, help)| format!("{path}: {help}\n"))
        .collect()
}

/// Nothing before the first rules are loaded, as the reference prints nothing without a
/// config.
async fn rlconfig(State(debug): State<Debug>) -> String {
    describe(&debug.limiter.rules(), Form::Reference)
}

async fn stats(State(debug): State<Debug>) -> String {
    stat_totals(&debug.metrics.render())
        .into_iter()
        .map(|(name, total)| format!("{name}: {total}\n"))
        .collect()
}
