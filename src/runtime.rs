//! The tokio runtime tollgate serves on, shared with the benchmarks' null-handler server so
//! that both are measured on the same settings.
//!
//! The default multi-threaded runtime, one worker per core (`TOKIO_WORKER_THREADS` overrides
//! it): it was measured against one current-thread runtime per core, each accepting on its
//! own `SO_REUSEPORT` listener, and kept (docs/performance.md). With few long-lived HTTP/2
//! connections, as Envoy opens, the kernel's connection hashing can put them all on one core,
//! and a per-core runtime cannot move the work; the work-stealing scheduler can.

pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}
