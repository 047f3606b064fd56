//! The request path piece by piece, in-process (no network): rule matching on a config of
//! 1,000 rules, counter key encoding, the memory store's apply (one hot key, a million keys),
//! the whole limiter call and the gRPC service handler. `cargo bench --bench hot_path`;
//! docs/performance.md lists the figures. The per-algorithm step is in benches/algorithms.rs.

use std::hint::black_box;
use std::sync::Arc;

use arc_swap::ArcSwap;
use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::FutureExt as _;
use tollgate::clock::SystemClock;
use tollgate::config;
use tollgate::descriptor::{Descriptor, Entry, Request};
use tollgate::limit::{Limit, Unit};
use tollgate::limiter::{Deciding, Modes, RateLimiter};
use tollgate::metrics::Metrics;
use tollgate::pb::{self, rate_limit_descriptor as desc};
use tollgate::rules::{RuleSet, matcher};
use tollgate::service::{RlsService, ServiceOptions};
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::memory::MemoryStore;
use tollgate::storage::{CounterStore, Hit, Role, Store};

const RULES: usize = 1_000;

/// Domain `bench`: 1,000 rules, one per key `k<i>`, every tenth of them with a nested
/// `user` level, the rest limited by key alone; values are per client.
fn rules() -> RuleSet {
    let mut yaml = String::from("domain: bench\ndescriptors:\n");
    for i in 0..RULES {
        if i % 10 == 0 {
            yaml.push_str(&format!(
                "  - key: k{i}\n    descriptors:\n      - key: user\n        rate_limit: {{unit: second, requests_per_unit: 1000000}}\n"
            ));
        } else {
            yaml.push_str(&format!(
                "  - key: k{i}\n    rate_limit: {{unit: second, requests_per_unit: 1000000}}\n"
            ));
        }
    }
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("temp dir: {error}"));
    std::fs::write(dir.path().join("bench.yaml"), yaml)
        .unwrap_or_else(|error| panic!("write config: {error}"));
    config::load_dir(dir.path()).unwrap_or_else(|errors| panic!("config: {errors}"))
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

/// `count` descriptors on distinct rules, each with a client value.
fn request(count: usize, user: usize) -> Request {
    Request {
        domain: "bench".into(),
        descriptors: (0..count)
            .map(|j| Descriptor {
                entries: vec![entry(&format!("k{}", 1 + j * 97), &format!("{user}-{j}"))],
                hits: 1,
                limit_override: None,
                refund: false,
            })
            .collect(),
    }
}

fn matching(c: &mut Criterion) {
    let rules = rules();
    let Some(domain) = rules.domain("bench") else {
        panic!("domain bench missing");
    };
    let mut group = c.benchmark_group("match (1,000 rules)");
    for count in [1, 10] {
        let request = request(count, 42);
        group.bench_function(format!("{count} descriptor(s)"), |b| {
            b.iter(|| {
                for descriptor in &black_box(&request).descriptors {
                    black_box(matcher::find(domain, &descriptor.entries));
                }
            })
        });
    }
    group.finish();
}

fn key_encoding(c: &mut Criterion) {
    let params = Limit::new(1000, Unit::Second).params();
    let mut group = c.benchmark_group("counter key");
    group.bench_function("1 entry", |b| {
        b.iter(|| {
            counter_key(
                black_box("bench"),
                [("user", EntryValue::Actual(black_box("user-123456")))],
                &params,
            )
        })
    });
    group.bench_function("3 entries", |b| {
        b.iter(|| {
            counter_key(
                black_box("bench"),
                [
                    ("tenant", EntryValue::Actual(black_box("acme-corp"))),
                    ("route", EntryValue::Shared("/api/*")),
                    ("user", EntryValue::Actual(black_box("user-123456"))),
                ],
                &params,
            )
        })
    });
    group.finish();
}

fn hit(user: usize) -> Hit {
    let params = Limit::new(1_000_000, Unit::Hour).params();
    Hit {
        descriptor: 0,
        key: counter_key(
            "bench",
            [("user", EntryValue::Actual(&user.to_string()))],
            &params,
        ),
        params,
        hits: 1,
        role: Role::Enforced,
        charge: tollgate::algorithm::Charge::IfAllowed,
        lease: tollgate::limit::Lease::AsConfigured,
    }
}

fn apply(store: &MemoryStore, hits: &[Hit]) {
    match store.apply(hits).now_or_never() {
        Some(Ok(outcomes)) => {
            black_box(outcomes);
        }
        other => panic!("memory store did not answer at once: {other:?}"),
    }
}

fn memory_store(c: &mut Criterion) {
    const KEYS: usize = 1_000_000;
    let mut group = c.benchmark_group("memory store apply");
    let store = MemoryStore::new(2 * KEYS, Arc::new(SystemClock));
    let hot = [hit(7)];
    group.bench_function("1 hot key", |b| b.iter(|| apply(&store, &hot)));

    let hits: Vec<Hit> = (0..KEYS).map(hit).collect();
    for one in hits.chunks(1) {
        apply(&store, one);
    }
    // A large odd stride visits every key, in an order the CPU cannot prefetch.
    let mut next = 0;
    group.bench_function("1,000,000 keys", |b| {
        b.iter(|| {
            next = (next + 7_919) % KEYS;
            apply(&store, std::slice::from_ref(&hits[next]));
        })
    });
    group.finish();
}

fn limiter(rules: RuleSet) -> Arc<RateLimiter> {
    let store = Arc::new(MemoryStore::new(1_000_000, Arc::new(SystemClock)));
    Arc::new(RateLimiter::new(
        Arc::new(ArcSwap::from_pointee(rules)),
        &Store::local(store),
        Modes::default(),
    ))
}

fn whole_limiter(c: &mut Criterion) {
    let limiter = limiter(rules());
    let mut group = c.benchmark_group("limiter (1,000 rules, memory store)");
    for count in [1, 10] {
        let requests: Vec<Request> = (0..10_000).map(|user| request(count, user)).collect();
        let mut next = 0;
        group.bench_function(format!("{count} descriptor(s)"), |b| {
            b.iter(|| {
                next = (next + 1) % requests.len();
                let decided = match limiter.loaded_rules() {
                    Ok(rules) => match limiter.decide(&rules, &requests[next]) {
                        Deciding::Made(decided) => Some(decided),
                        Deciding::Waiting(decision) => decision.now_or_never(),
                    },
                    Err(undecided) => Some(Err(undecided)),
                };
                match decided {
                    Some(Ok(decision)) => black_box(decision),
                    other => panic!("limiter did not answer at once: {other:?}"),
                }
            })
        });
    }
    group.finish();
}

fn pb_request(count: usize, user: usize) -> pb::RateLimitRequest {
    pb::RateLimitRequest {
        domain: "bench".into(),
        descriptors: (0..count)
            .map(|j| pb::RateLimitDescriptor {
                entries: vec![desc::Entry {
                    key: format!("k{}", 1 + j * 97),
                    value: format!("{user}-{j}"),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

fn service_handler(c: &mut Criterion) {
    let service = RlsService::new(
        limiter(rules()),
        ServiceOptions::default(),
        Arc::new(Metrics::default()),
    );
    let mut group = c.benchmark_group("service handler (1,000 rules, memory store)");
    for count in [1, 10] {
        let requests: Vec<pb::RateLimitRequest> =
            (0..10_000).map(|user| pb_request(count, user)).collect();
        let mut next = 0;
        group.bench_function(format!("{count} descriptor(s)"), |b| {
            b.iter(|| {
                next = (next + 1) % requests.len();
                // The handler owns its request, as when tonic decodes one.
                let request = requests[next].clone();
                match service.answer(request, None).now_or_never() {
                    Some(Ok(response)) => black_box(response),
                    Some(Err(error)) => panic!("handler failed: {error}"),
                    None => panic!("handler did not answer at once"),
                }
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    matching,
    key_encoding,
    memory_store,
    whole_limiter,
    service_handler
);
criterion_main!(benches);
