//! One decision step of each algorithm (the pure functions the memory store calls), on a
//! counter with state, at a moving instant. `cargo bench --bench algorithms`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::algorithm::{Algorithm, Anchor, Charge, Params, State, decide};

const BASE: u64 = 1_763_000_000_000_000;

fn bench(c: &mut Criterion) {
    let minute = 60_000_000;
    let algorithms = [
        (
            "fixed_window",
            Algorithm::FixedWindow {
                anchor: Anchor::Epoch,
            },
        ),
        ("sliding_window", Algorithm::SlidingWindow),
        ("sliding_log", Algorithm::SlidingLog { min_interval: 0 }),
        ("token_bucket", Algorithm::TokenBucket { burst: 1_000 }),
        ("gcra", Algorithm::Gcra { burst: 1_000 }),
    ];
    let mut group = c.benchmark_group("decide");
    for (name, algorithm) in algorithms {
        let params = Params {
            algorithm,
            requests: 1_000,
            window: minute,
        };
        // A counter half full: 500 hits spread over the last 30 s.
        let mut state: Option<State> = None;
        for i in 0..500u64 {
            let d = decide(
                &params,
                state.as_ref(),
                BASE + i * 60_000,
                1,
                Charge::IfAllowed,
            );
            state = d.state.or(state);
        }
        let mut now = BASE + 30_000_000;
        group.bench_function(name, |b| {
            b.iter(|| {
                now += 1;
                let decision = decide(
                    &params,
                    black_box(state.as_ref()),
                    now,
                    1,
                    Charge::IfAllowed,
                );
                black_box(decision.outcome)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
