//! The tests that need Redis (real redis-server, redis-sentinel and Redis Cluster processes,
//! started on free loopback ports and stopped by each test): the scenarios on a Redis and a
//! 3-master cluster, every call layout against the request rule, the algorithms' Lua ports,
//! refunds, clusters and their faults, the per-second Redis, restarts, runtimes, overload and
//! RLQS demand shared through Redis, and the calls the cost scripts send. `cargo test --test
//! redis`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

/// The scenarios run here on a Redis and a 3-master cluster; the fast target runs them on
/// the memory store.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        crate::scenarios_on!([redis = Redis, cluster = Cluster]; $($name),*);
    };
}

/// What a scenario file tests besides its scenarios runs in the fast target only.
macro_rules! memory_only {
    ($($item:item)*) => {};
}

#[path = "../scenarios/algorithms.rs"]
mod algorithms;
#[path = "../scenarios/grpc.rs"]
mod grpc;
#[path = "../scenarios/refunds.rs"]
mod refunds;
#[path = "../scenarios/window_edges.rs"]
mod window_edges;

mod bench_calls;
mod bucket_leases;
mod concurrency;
mod failover;
mod layouts;
mod leases;
mod overload;
mod redis_cluster;
mod redis_faults;
mod redis_parity;
mod redis_per_second;
mod redis_refund;
mod restart;
mod rlqs_stream;
mod rolling_upgrade;
mod runtime;
mod slot_migrations;
mod window_counters;
