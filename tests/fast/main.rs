//! The fast tests: everything that needs no process but tollgate's own (no Redis, no Envoy,
//! no Prometheus), run alone by `cargo test --test fast` (docs/design.md, "Tests"): the
//! service over gRPC on the memory store, the rules, the algorithms' behaviour, config
//! errors, the admin endpoints, headers, metrics, reload, TLS, tracing, the wire format, xDS,
//! and the command line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

/// The scenarios run here on the memory store; the redis target runs them on Redis.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        crate::scenarios_on!([memory = Memory]; $($name),*);
    };
}

/// What a scenario file tests besides its scenarios runs here, once.
macro_rules! memory_only {
    ($($item:item)*) => {
        $($item)*
    };
}

#[path = "../scenarios/algorithms.rs"]
mod algorithms;
#[path = "../scenarios/grpc.rs"]
mod grpc;
#[path = "../scenarios/refunds.rs"]
mod refunds;
#[path = "../scenarios/window_edges.rs"]
mod window_edges;

mod admin;
mod cli;
mod config_errors;
mod connections;
mod headers;
mod hostile_input;
mod metrics;
mod reference_stats;
mod reload;
mod startup;
mod tls;
mod tracing;
mod wire;
mod xds;
