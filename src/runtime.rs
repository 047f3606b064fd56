//! The tokio runtime tollgate serves on, shared with the benchmarks' null-handler server so
//! that both are measured on the same settings.
//!
//! The default multi-threaded runtime, one worker per core (`TOKIO_WORKER_THREADS` overrides
//! it). Measured against one current-thread runtime per core, each accepting on its own
//! `SO_REUSEPORT` listener (examples/null_server.rs `--per-core`), the per-core design served
//! the same load with about a third less CPU per request (docs/performance.md). It is not
//! adopted yet: with few long-lived HTTP/2 connections, as Envoy opens, the kernel's
//! connection hashing can put them all on one core, which a per-core runtime cannot undo and
//! the work-stealing scheduler does not suffer from; tollgate's own per-core variant, with
//! its shared store and background tasks, has not been measured.

pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}
