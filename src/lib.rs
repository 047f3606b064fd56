//! tollgate: a rate-limit decision service that speaks Envoy's RLS v3
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) and reads
//! envoyproxy/ratelimit YAML configs. docs/design.md describes the architecture and the
//! semantics; this is the map.
//!
//! # Request flow
//!
//! ```text
//! service/     protobuf → descriptor::Request (validated), Decision → protobuf, errors → Status
//!     ↓
//! limiter.rs   rules (one atomic load) → a limit per descriptor → one store call → statuses
//!     ↓                    ↘ rules/matcher.rs: the reference's precedence, no backtracking
//! storage/     CounterStore::apply(&[Hit]): all-or-nothing over a request's counters
//!     ↓                    ↘ storage/keys.rs: injective, versioned, slot-safe counter keys
//! algorithm/   pure functions: decide (state, now, limit, hits) → (state, outcome), give_back, refund
//! ```
//!
//! # Modules, by layer (each imports only from its own layer or lower ones)
//!
//! - `reference_env` (`reference_env/variables.rs`: every variable and what it becomes;
//!   `reference_env/reader.rs` reads them, `reference_env/redis_vars.rs` those of Redis,
//!   `reference_env/xds_vars.rs` those of the xDS source, `reference_env/prometheus_vars.rs`
//!   those of Prometheus;
//!   `reference_env/translation.rs` what that yields):
//!   envoyproxy/ratelimit's environment turned into `serve`'s flags.
//! - `cli` (`cli/serve.rs`: `serve`'s flags, each part's options struct flattened,
//!   `cli/xds_args.rs` those of the xDS source; `cli/commands.rs` what each command does):
//!   the command line (`serve`, `check`, `query`, `bench`, `bench-rlqs`, `health`, `reset`,
//!   and the hidden `bench-calls`); `main.rs` parses it.
//! - `server`: health probe, reload task, graceful shutdown (`server/listeners.rs`: the
//!   addresses and their sockets; `server/grpc.rs`: the gRPC routes and transport;
//!   `server/http.rs`: the HTTP listeners).
//! - `admin` (`admin/json.rs`: the reference's `/json` form; `admin/writes.rs`: who may
//!   change state; `admin/describe.rs`: the rules as text; `admin/debug.rs`: the
//!   reference's debug listener): the HTTP endpoints; `query`:
//!   one-shot calls and health checks as a client; `bench` (`bench/calls.rs`: Redis calls
//!   as the store sends them; `bench/codec.rs`: pre-encoded calls; `bench/requests.rs`: the requests
//!   a run cycles through; `bench/hostile.rs`: hostile clients of the gRPC and admin ports (`bench/hostile/attack.rs` a run, `bench/hostile/streams.rs` the attacks of streams, `bench/hostile/sockets.rs` of a socket, `bench/hostile/calls.rs` of whole calls), `bench/raw_h2.rs` the
//!   frames of one that never reads; `bench/rlqs.rs`: RLQS
//!   streams): the load generators.
//! - `service`: RLS v3 over gRPC (`service/options.rs` `ServiceOptions`, the response flags;
//!   `service/encode.rs` the reference's status shapes; `service/failure.rs` the answer when
//!   the store fails; `service/deadline.rs` the client's deadline; `service/route.rs` the method as an HTTP/2
//!   route; `service/throttle.rs` the store-failure warning said at most once a second). `rlqs`: the Rate
//!   Limit Quota Service (`rlqs/bucket.rs` which rule a bucket falls under, `rlqs/demand.rs` a
//!   stream's demand from its reports, `rlqs/split.rs` a rate divided by demand, `rlqs/grant.rs` one stream's assignment, `rlqs/report.rs` what
//!   a stream may report, `rlqs/registry.rs` the
//!   streams and their subscriptions, `rlqs/rebalance.rs` the periodic split and the demand
//!   shared through the store, `rlqs/listing.rs` the buckets on `/config`, `rlqs/service.rs`
//!   the gRPC stream).
//! - `headers`: rate-limit response headers; `dynamic_metadata`: the response's metadata;
//!   `admission`: load shedding; `intake` (`intake/unary.rs` a unary call's message,
//!   `intake/metered.rs` a stream's messages): requests as they arrive; `health`: readiness; `reload`: watching the config (`reload/burst.rs` when the
//!   files are whole);
//!   `statsd`: the metrics sent to statsd (TCP or UDP) under the reference's stat names;
//!   `xds`: rules pushed by a control plane (`config/xds.rs` reads the resources).
//! - `limiter`: the decision, free of transport types (`limiter/charges.rs` says whether each
//!   hit counts only when admitted, `limiter/answer.rs` builds the answer from the store's
//!   outcomes, `limiter/stats.rs` counts it in the per-limit metrics);
//!   `config`: YAML → rules
//!   (`config/raw.rs` the YAML as written, `config/file.rs` one file, `config/tree.rs` the
//!   descriptor tree, `config/limits.rs` the limits (`config/limits/settings.rs` their lease, charges and refunds), `config/error.rs` `file:line: path:
//!   reason`).
//! - `rules` (`rules/matcher.rs`: precedence): the compiled rules; `storage`: the
//!   `CounterStore` trait and its vocabulary, with `storage/rule.rs` (the request rule every
//!   store applies), `storage/memory/` (in-process: `storage/memory/map.rs` the sharded map),
//!   `storage/redis/` (Redis, Redis Cluster and Redis Sentinel, by stage:
//!   `storage/redis/pool.rs` the connections, made in the background and made again when
//!   `storage/redis/doctor.rs` says the calls call for it, from
//!   `storage/redis/url.rs` where and `storage/redis/connection.rs` how
//!   (`storage/redis/sentinel.rs` behind sentinels); `storage/redis/fanout.rs` a request as
//!   calls, one per node (`storage/redis/slots.rs` which node), and their refunds;
//!   `storage/redis/call/` the protocol (`storage/redis/call/dispatch.rs` which layout a call
//!   takes), one file per layout (`storage/redis/call/count_one.rs`,
//!   `storage/redis/call/count.rs`, `storage/redis/call/decide_one.rs`,
//!   `storage/redis/call/apply.rs`, `storage/redis/call/give_back.rs`,
//!   `storage/redis/call/lease.rs`, `storage/redis/call/lease_return.rs`) and
//!   `storage/redis/call/numbers.rs` the numbers they send; `storage/redis/transport.rs` how a
//!   call travels, to `storage/redis/library.rs` and its `lua/`; `storage/redis/clock.rs`
//!   Redis's clock as a replica tracks it; `storage/redis/per_second.rs` the per-second
//!   Redis; `storage/redis/demand.rs` RLQS demand shared by replicas;
//!   `storage/redis/leases.rs` a busy counter's budget leased), `storage/guard.rs`
//!   (timeout and circuit breaker), `storage/deny_cache.rs` (local answers for known
//!   denials), `storage/deferred.rs` (the denied hits that count, answered by the deny cache,
//!   counted in the store in batches), `storage/lease.rs` (busy counters answered from leased slices,
//!   `storage/lease/slice.rs` a slice and a counter's demand, `storage/lease/answer.rs` a
//!   request answered from slices, at once where it can, `storage/lease/calls.rs` the
//!   lease and return calls), `storage/keys.rs` (counter keys), `storage/options.rs` (the store's flags) and
//!   `storage/stack.rs` (the store as served).
//! - `algorithm` (`algorithm/outcome.rs`, `algorithm/parameter.rs`, `algorithm/state.rs`,
//!   `algorithm/given_back.rs` (give_back and refund), `algorithm/leased.rs` (a bucket's
//!   budget taken for a slice's life), then one file per
//!   algorithm: `algorithm/fixed_window.rs`, `algorithm/sliding_window.rs`,
//!   `algorithm/sliding_log.rs`, `algorithm/token_bucket.rs`, `algorithm/gcra.rs`,
//!   `algorithm/concurrency.rs`); `limit`:
//!   units and limits; `descriptor`: the request vocabulary and its input bounds.
//! - `client`: how the client commands reach a server (address, TLS); `clock`: time as a
//!   value; `pb`: generated protobuf code; `metrics`: every metric, one small struct per part
//!   (`metrics/limits.rs` the per-limit counters on `metrics/counters.rs`, `metrics/service.rs`,
//!   `metrics/store.rs`, `metrics/lease.rs`, `metrics/config.rs`, `metrics/health.rs`, `metrics/quota.rs` RLQS,
//!   `metrics/connections.rs` the listeners;
//!   `metrics/reference.rs` the reference's stat names and Prometheus series read off them);
//!   `process`: the `process_*` metrics; `inbound` (`inbound/accept.rs` accepting within a
//!   cap, `inbound/watched.rs` one connection's deadlines, `inbound/conduct.rs` what it has
//!   waiting): connections as accepted; `telemetry`: logs and traces; `runtime`:
//!   the tokio runtimes; `shutdown`: signals; `tls`: the gRPC listener's TLS; `options`: the
//!   parts' options structs' defaults.

pub mod admin;
pub mod admission;
pub mod algorithm;
pub mod bench;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod descriptor;
pub mod dynamic_metadata;
pub mod headers;
pub mod health;
pub mod inbound;
pub mod intake;
pub mod limit;
pub mod limiter;
pub mod metrics;
pub mod options;
pub mod pb;
pub mod process;
pub mod query;
pub mod reference_env;
pub mod reload;
pub mod rlqs;
pub mod rules;
pub mod runtime;
pub mod server;
pub mod service;
pub mod shutdown;
pub mod statsd;
pub mod storage;
pub mod telemetry;
pub mod tls;
pub mod xds;
