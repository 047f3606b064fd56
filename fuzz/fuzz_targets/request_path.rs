//! Arbitrary bytes decoded as a RateLimitRequest and decided by the service with the memory
//! store and a config using every feature: an answer (with one status per descriptor and a
//! defined overall code) or INVALID_ARGUMENT, never a panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tollgate::algorithm::Charge;
use tollgate::clock::SystemClock;
use tollgate::limiter::{Modes, RateLimiter};
use tollgate::metrics::Metrics;
use tollgate::pb;
use tollgate::rules::RuleSet;
use tollgate::service::{RlsService, ServiceOptions};
use tollgate::storage::memory::MemoryStore;

const CONFIG: &str = include_str!("../corpus/config_loader/all_features.yaml");

struct Harness {
    runtime: tokio::runtime::Runtime,
    service: RlsService,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let domain = tollgate::config::file::parse(std::path::Path::new("f.yaml"), CONFIG)
            .expect("the fuzz config is valid");
        let rules = Arc::new(ArcSwap::from_pointee(RuleSet::new([domain])));
        let service = runtime.block_on(async {
            let store = MemoryStore::new(10_000, Charge::IfAllowed, Arc::new(SystemClock)).start();
            RlsService::new(
                Arc::new(RateLimiter::new(rules, store, Modes::default())),
                ServiceOptions::default(),
                Arc::new(Metrics::default()),
            )
        });
        Harness { runtime, service }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(request) = pb::RateLimitRequest::decode(data) else {
        return;
    };
    let harness = harness();
    let descriptors = request.descriptors.len();
    if let Ok(response) = harness.runtime.block_on(harness.service.answer(request, None)) {
        assert_eq!(response.statuses.len(), descriptors);
        assert_ne!(response.overall_code, 0, "the overall code is never UNKNOWN");
    }
});
