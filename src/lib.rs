//! tollgate: a rate-limit decision service that speaks Envoy's RLS v3
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) and reads
//! envoyproxy/ratelimit YAML configs.
//!
//! # Request flow
//!
//! ```text
//! service.rs   protobuf → descriptor::Request (validated), Decision → protobuf, errors → Status
//!     ↓
//! limiter.rs   rules (one atomic load) → a limit per descriptor → one store call → statuses
//!     ↓                    ↘ rules/matcher.rs: the reference's precedence, no backtracking
//! storage/     CounterStore::apply(&[Hit]): all-or-nothing over a request's counters
//!     ↓                    ↘ storage/keys.rs: injective, versioned, slot-safe counter keys
//! algorithm/   pure functions (state, now, limit, hits) → (state, outcome)
//! ```
//!
//! # Stores
//!
//! - `storage/memory.rs`: in-process, sharded, calls the algorithm functions under its locks.
//! - `storage/redis.rs`: Redis and Redis Cluster; `storage/script.rs` + `storage/lua/`: the
//!   algorithms ported to one Lua script (parity-tested against the Rust functions), called
//!   once per node group (`storage/slots.rs`: the cluster's slot map and the grouping);
//!   `storage/guard.rs`: store timeout and circuit breaker;
//!   `storage/deny_cache.rs`: local answers for counters known to be denied.
//!
//! # Layout
//!
//! - `cli`, `main.rs`: the command line; `server`: listeners, health probe, graceful shutdown;
//!   `admin`: the HTTP endpoints; `health`: gRPC/HTTP readiness; `shutdown`: signals.
//! - `config`: YAML files → `rules::RuleSet`, with `file:line: path: reason` errors.
//! - `descriptor`: the request vocabulary and its input bounds; `limit`: units and limits.
//! - `pb`: generated protobuf code; `clock`: time as a value; `bench`: the load generator.

pub mod admin;
pub mod admission;
pub mod algorithm;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod descriptor;
pub mod dynamic_metadata;
pub mod headers;
pub mod health;
pub mod limit;
pub mod limiter;
pub mod metrics;
pub mod pb;
pub mod query;
pub mod reload;
pub mod rules;
pub mod runtime;
pub mod server;
pub mod service;
pub mod shutdown;
pub mod storage;
pub mod telemetry;
pub mod tls;
