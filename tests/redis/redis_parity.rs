//! Parity: each algorithm's Lua port (src/storage/redis/lua/) answers exactly what its Rust
//! functions answer. Long random sequences of applies, vetoed applies, give-backs and the
//! client's refunds (Envoy's `is_negative_hits`, alone or in a vetoed request), with explicit
//! instants, go through `algorithm::decide`, `algorithm::given_back::give_back` and `algorithm::given_back::refund`
//! and through the script on a real redis-server, call by call: every outcome and every stored state must be
//! identical, for both charges and for limits large enough to count in millisecond ticks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::redis_process::RedisServer;
use common::rng::Rng;
use common::sliding_window;
use tollgate::algorithm::{self, Algorithm, Anchor, Charge, Params, State};
use tollgate::clock::{MICROS_PER_SECOND, Micros};
use tollgate::storage::keys::{CounterKey, EntryValue, counter_key};
use tollgate::storage::redis::call::numbers::LONGEST_LOG;
use tollgate::storage::redis::call::numbers::state_numbers;
use tollgate::storage::redis::call::{self, Call, SlidingWindowLayout, StateLayout};
use tollgate::storage::redis::connection::call_on;
use tollgate::storage::{Hit, Role};

const SECOND: Micros = MICROS_PER_SECOND;
const DAY: Micros = 86_400 * SECOND;
/// November 2026, so that instants are as large as in production.
const START: Micros = 1_795_000_000 * SECOND + 123_457;

/// A step: the gap since the previous call and the hits, shaped by the window and limit so
/// that calls land inside windows, across boundaries and after long pauses.
fn step(rng: &mut Rng, params: &Params) -> (Micros, u64) {
    let window = params.window;
    let gap = match rng.below(100) {
        0..5 => 0,
        5..55 => rng.below(window / 20 + 1),
        55..85 => rng.below(window / 2 + 1),
        85..97 => rng.below(2 * window + 1),
        _ => rng.below(3) * window,
    };
    let limit = params.requests.max(1);
    let hits = match rng.below(100) {
        0..12 => 0,
        12..80 => 1,
        80..95 => 2 + rng.below(3),
        _ => limit + rng.below(limit * 2),
    };
    (gap, hits)
}

struct Tally {
    allowed: u64,
    denied: u64,
    vetoed: u64,
    refunded: u64,
    client_refunds: u64,
    /// Steps after which the counter was stored packed (`StateLayout::Packed`).
    packed: u64,
}

/// What a step does to the counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// A call of its own, committed unless denied.
    Apply,
    /// A call vetoed by another descriptor of the same request, which is always over: it
    /// consumes nothing, and admitted hits report a check.
    Veto,
    /// Gives back what one of the last few committed applies consumed (possibly after later
    /// ones), as a cluster does when another node vetoed the request.
    Refund,
    /// The client gives hits back (`Role::Refund`), in a call of its own.
    ClientRefund,
    /// The same in a request another descriptor vetoes: the refund still applies.
    VetoedClientRefund,
}

fn op(rng: &mut Rng, charge: Charge) -> Op {
    if charge == Charge::Always {
        // Every attempt counts, vetoed or not (beside a blocker a veto would undo): nothing
        // is given back; the client still refunds.
        return match rng.below(100) {
            0..70 => Op::Apply,
            70..85 => Op::Veto,
            _ => Op::ClientRefund,
        };
    }
    match rng.below(100) {
        0..60 => Op::Apply,
        60..73 => Op::Veto,
        73..85 => Op::Refund,
        85..95 => Op::ClientRefund,
        _ => Op::VetoedClientRefund,
    }
}

/// A fixed window aligned on the epoch is stored as one integer per window, under its key
/// with the window's number appended (src/storage/redis/counter.rs); the other counters as
/// their state's numbers under their key.
fn one_integer_per_window(params: &Params) -> bool {
    params.algorithm
        == Algorithm::FixedWindow {
            anchor: Anchor::Epoch,
        }
}

/// What a counter holds at `now`, as a state's numbers: for one integer per window, the
/// window and the count it holds for the window `now` is in (a state of an earlier window, or
/// none, holds 0 for it: the algorithm decides the same on either).
fn as_of(params: &Params, now: Micros, numbers: Option<Vec<u64>>) -> Option<Vec<u64>> {
    if !one_integer_per_window(params) {
        return numbers;
    }
    let start = now - now % params.window;
    let count = match numbers.as_deref() {
        Some(&[window_start, count]) if window_start == start => count,
        Some(&[count]) => count,
        _ => 0,
    };
    Some(vec![start, count])
}

/// The counter as stored in Redis: its numbers, and whether they were packed.
async fn stored(
    connection: &mut redis::aio::MultiplexedConnection,
    key: &CounterKey,
    params: &Params,
    now: Micros,
) -> (Option<Vec<u64>>, bool) {
    let key = if one_integer_per_window(params) {
        format!("{}:{}", key.as_str(), now / params.window)
    } else {
        key.as_str().to_owned()
    };
    common::stored::numbers(connection, &key).await
}

/// The layouts a call writes a sliding window, and a bucket or a short sliding log, in (the other
/// algorithms have one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layouts {
    sliding_window: SlidingWindowLayout,
    state_layout: StateLayout,
}

/// Every layout as the builds before them wrote.
const TEXT: Layouts = Layouts {
    sliding_window: SlidingWindowLayout::Text,
    state_layout: StateLayout::Text,
};

/// Every layout but text.
const NEWER: Layouts = Layouts {
    sliding_window: SlidingWindowLayout::Counters,
    state_layout: StateLayout::Packed,
};

/// How a sequence's calls write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writes {
    /// Every call in these layouts.
    All(Layouts),
    /// Each call as a replica drawn at random writes, text or the newer layouts, as replicas
    /// switched one at a time do.
    Mixed,
}

impl Writes {
    fn layouts(self, rng: &mut Rng) -> Layouts {
        match self {
            Writes::All(layouts) => layouts,
            Writes::Mixed if rng.below(2) == 0 => TEXT,
            Writes::Mixed => NEWER,
        }
    }
}

/// A committed apply that a later step may refund.
struct Committed {
    at: Micros,
    hits: u64,
    /// The state it left, in Rust and as the call reported it.
    state: Option<State>,
    reported: Vec<Option<State>>,
}

/// An Apply call of the counter's hit, with the always-over blocker when `vetoed`.
async fn apply(
    connection: &mut redis::aio::MultiplexedConnection,
    calls: &[Hit; 2],
    vetoed: bool,
    now: Micros,
    layouts: Layouts,
    context: &str,
) -> call::Reply {
    let call = Call {
        op: call::Op::Apply { now },
        hits: if vetoed { &calls[..] } else { &calls[..1] },
        node: None,
        complete: true,
        prefix: "",
        grace_ms: 3_600_000,
        sliding_window: layouts.sliding_window,
        state_layout: layouts.state_layout,
    };
    call_on(connection, &call)
        .await
        .unwrap_or_else(|error| panic!("{context}: {error}"))
}

async fn run_sequence(
    connection: &mut redis::aio::MultiplexedConnection,
    name: &str,
    params: Params,
    charge: Charge,
    writes: Writes,
    steps: usize,
    seed: u64,
) -> Tally {
    let mut rng = Rng(seed);
    let key = counter_key(
        "parity",
        [(
            "case",
            EntryValue::Actual(&format!("{name}-{seed}-{charge:?}-{writes:?}")),
        )],
        &params,
    );
    let hit = |hits| Hit {
        descriptor: 0,
        key: key.clone(),
        params,
        hits,
        role: Role::Enforced,
        charge,
        lease: tollgate::limit::Lease::AsConfigured,
    };
    // Always over: a request that carries it is vetoed.
    let blocker = {
        let params = Params {
            algorithm: Algorithm::default(),
            requests: 0,
            window: SECOND,
        };
        Hit {
            descriptor: 1,
            key: counter_key("parity", [("blocker", EntryValue::Actual(name))], &params),
            params,
            hits: 1,
            role: Role::Enforced,
            charge: tollgate::algorithm::Charge::IfAllowed,
            lease: tollgate::limit::Lease::AsConfigured,
        }
    };
    let mut state: Option<State> = None;
    // Committed applies not yet refunded, newest last; each is refunded at most once.
    let mut pending: Vec<Committed> = Vec::new();
    let mut now = START;
    let mut tally = Tally {
        allowed: 0,
        denied: 0,
        vetoed: 0,
        refunded: 0,
        client_refunds: 0,
        packed: 0,
    };
    for index in 0..steps {
        let (gap, hits) = step(&mut rng, &params);
        now += gap;
        let op = op(&mut rng, charge);
        let layouts = writes.layouts(&mut rng);
        let context = format!(
            "{name} ({params:?}, {charge:?}, {writes:?}) step {index}: {op:?} {hits} hits at {now} by {layouts:?}"
        );
        if op == Op::Refund {
            if pending.is_empty() {
                continue;
            }
            let pick = usize::try_from(rng.below(pending.len() as u64)).unwrap();
            let last = pending.remove(pick);
            if let Some(next) = algorithm::given_back::give_back(
                &params,
                state.as_ref(),
                last.state.as_ref(),
                last.at,
                last.hits,
            ) {
                state = Some(next);
            }
            let one = [hit(last.hits)];
            let call = Call {
                op: call::Op::GiveBack {
                    at: last.at,
                    expected: &last.reported,
                },
                hits: &one,
                node: None,
                complete: false,
                prefix: "",
                grace_ms: 3_600_000,
                sliding_window: layouts.sliding_window,
                state_layout: layouts.state_layout,
            };
            call_on(connection, &call)
                .await
                .unwrap_or_else(|error| panic!("{context}: {error}"));
            tally.refunded += 1;
        } else if matches!(op, Op::ClientRefund | Op::VetoedClientRefund) {
            let refund = algorithm::given_back::refund(&params, state.as_ref(), now, hits);
            let calls = [
                Hit {
                    role: Role::Refund,
                    charge: Charge::IfAllowed,
                    ..hit(hits)
                },
                blocker.clone(),
            ];
            let vetoed = op == Op::VetoedClientRefund;
            let reply = apply(connection, &calls, vetoed, now, layouts, &context).await;
            assert_eq!(reply.outcomes[0], refund.outcome, "{context}: Lua vs Rust");
            if let Some(next) = refund.state {
                state = Some(next);
            }
            tally.client_refunds += 1;
        } else {
            let decided = algorithm::decide(&params, state.as_ref(), now, hits, charge);
            let mut expected = decided.outcome;
            let calls = [hit(hits), blocker.clone()];
            let reply = apply(connection, &calls, op == Op::Veto, now, layouts, &context).await;
            // A veto undoes an admission, not a charge that counts whatever its fate.
            let undone = op == Op::Veto && charge == Charge::IfAllowed;
            if op == Op::Veto {
                tally.vetoed += 1;
            }
            if undone {
                if expected.allowed {
                    expected = algorithm::decide(&params, state.as_ref(), now, 0, charge).outcome;
                }
            } else if let Some(next) = decided.state {
                state = Some(next);
                if hits > 0 && expected.allowed && op == Op::Apply {
                    if pending.len() == 4 {
                        pending.remove(0);
                    }
                    pending.push(Committed {
                        at: now,
                        hits,
                        state: state.clone(),
                        reported: reply.after.clone(),
                    });
                }
            }
            assert_eq!(reply.outcomes[0], expected, "{context}: Lua vs Rust");
            if expected.allowed {
                tally.allowed += 1;
            } else {
                tally.denied += 1;
            }
        }
        if params.algorithm == Algorithm::SlidingWindow {
            let newest = sliding_window::newest_window(&params, state.as_ref(), now);
            assert_eq!(
                sliding_window::stored(connection, key.as_str(), &params, newest).await,
                sliding_window::modelled(&params, state.as_ref(), newest),
                "{context}: stored counts in window {newest} and the one before, Lua vs Rust"
            );
        } else {
            let (numbers, packed) = stored(connection, &key, &params, now).await;
            tally.packed += u64::from(packed);
            assert_eq!(
                as_of(&params, now, numbers),
                as_of(&params, now, state.as_ref().map(state_numbers)),
                "{context}: stored state, Lua vs Rust"
            );
        }
    }
    tally
}

/// Runs 10,000 steps of the main parameters with the default charge, then shorter sequences
/// with `--count-denied` and with each variant, and checks both outcomes were exercised; then
/// the main parameters and the variants again for each of `more` ways of writing.
async fn parity(name: &str, main: Params, variants: &[Params], more: &[Writes]) {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let state = Writes::All(TEXT);
    let tally = run_sequence(
        &mut connection,
        name,
        main,
        Charge::IfAllowed,
        state,
        10_000,
        7,
    )
    .await;
    assert!(
        tally.allowed > 1_000
            && tally.denied > 500
            && tally.vetoed > 500
            && tally.refunded > 500
            && tally.client_refunds > 500,
        "{name}: the sequence must exercise both outcomes, vetoes, give-backs and refunds: {} allowed, {} denied, {} vetoed, {} given back, {} refunds",
        tally.allowed,
        tally.denied,
        tally.vetoed,
        tally.refunded,
        tally.client_refunds
    );
    let always = run_sequence(
        &mut connection,
        name,
        main,
        Charge::Always,
        state,
        2_000,
        11,
    )
    .await;
    assert_eq!(
        tally.packed + always.packed,
        0,
        "{name}: text layouts never write packed"
    );
    // Whose lone hits write packed: a bucket's, a sliding log's of a limit that small.
    let packs = match main.algorithm {
        Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } => true,
        Algorithm::SlidingLog { .. } => main.requests <= LONGEST_LOG,
        Algorithm::FixedWindow { .. } | Algorithm::SlidingWindow | Algorithm::Concurrency => false,
    };
    let log = matches!(main.algorithm, Algorithm::SlidingLog { .. });
    for &writes in [state].iter().chain(more) {
        if writes != state {
            let tally = run_sequence(
                &mut connection,
                name,
                main,
                Charge::IfAllowed,
                writes,
                4_000,
                7,
            )
            .await;
            // Steps after which the counter is packed: written so by a lone hit (most steps),
            // text again after a give-back, a refund or a vetoed call, which write text in
            // every layout; mixed, packed by about half the lone hits. A log denies more of
            // them, which write nothing.
            let packed = match writes {
                _ if !packs => 0..=0,
                Writes::All(_) if log => 2_100..=3_100,
                Writes::All(_) => 2_500..=3_500,
                Writes::Mixed => 1_000..=2_000,
            };
            assert!(
                packed.contains(&tally.packed),
                "{name} {writes:?}: {} of 4,000 steps left the counter packed",
                tally.packed
            );
            run_sequence(
                &mut connection,
                name,
                main,
                Charge::Always,
                writes,
                2_000,
                11,
            )
            .await;
        }
        for (seed, params) in (13..).zip(variants) {
            for charge in [Charge::IfAllowed, Charge::Always] {
                run_sequence(&mut connection, name, *params, charge, writes, 2_000, seed).await;
            }
        }
    }
    // Every call ran the function library (a library Redis refused to load would leave the
    // calls to the script, correct but costlier).
    assert!(server.calls("fcall") > 2_000, "{name}: calls by FCALL");
    assert_eq!(
        server.calls("evalsha") + server.calls("eval"),
        0,
        "{name}: calls by script"
    );
}

fn params(algorithm: Algorithm, requests: u64, window: Micros) -> Params {
    Params {
        algorithm,
        requests,
        window,
    }
}

#[tokio::test]
async fn fixed_window() {
    let epoch = Algorithm::FixedWindow {
        anchor: Anchor::Epoch,
    };
    let first_hit = Algorithm::FixedWindow {
        anchor: Anchor::FirstHit,
    };
    parity(
        "fixed_window",
        params(epoch, 5, 10 * SECOND),
        &[
            params(first_hit, 3, 10 * SECOND),
            params(epoch, 0, SECOND),
            params(epoch, 1_000_000, DAY),
        ],
        &[],
    )
    .await;
}

#[tokio::test]
async fn sliding_window() {
    let sliding = Algorithm::SlidingWindow;
    let daily = params(sliding, 2_000_000, DAY);
    assert_eq!(daily.tick(), Some(1_000), "exercises millisecond ticks");
    parity(
        "sliding_window",
        params(sliding, 7, 10 * SECOND),
        &[
            params(sliding, 1, SECOND),
            daily,
            params(sliding, 0, SECOND),
        ],
        &[Writes::All(NEWER), Writes::Mixed],
    )
    .await;
}

#[tokio::test]
async fn sliding_log() {
    let plain = Algorithm::SlidingLog { min_interval: 0 };
    let gapped = Algorithm::SlidingLog {
        min_interval: 2 * SECOND,
    };
    let gap_past_window = Algorithm::SlidingLog {
        min_interval: 15 * SECOND,
    };
    parity(
        "sliding_log",
        params(plain, 5, 10 * SECOND),
        &[
            params(gapped, 4, 10 * SECOND),
            // The newest run outlives the window for the gap: admitted hits drop older ones.
            params(gap_past_window, 2, 10 * SECOND),
            params(plain, 0, SECOND),
            params(plain, 200, 60 * SECOND),
        ],
        &[Writes::All(NEWER), Writes::Mixed],
    )
    .await;
}

#[tokio::test]
async fn token_bucket() {
    let bucket = |burst| Algorithm::TokenBucket { burst };
    let daily = params(bucket(3_000_000), 2_000_000, DAY);
    assert_eq!(daily.tick(), Some(1_000), "exercises millisecond ticks");
    parity(
        "token_bucket",
        params(bucket(5), 3, SECOND),
        &[
            params(bucket(2), 7, 10 * SECOND),
            daily,
            params(bucket(1), 0, SECOND),
        ],
        &[Writes::All(NEWER), Writes::Mixed],
    )
    .await;
}

#[tokio::test]
async fn gcra() {
    let gcra = |burst| Algorithm::Gcra { burst };
    let daily = params(gcra(3_000_000), 2_000_000, DAY);
    assert_eq!(daily.tick(), Some(1_000), "exercises millisecond ticks");
    parity(
        "gcra",
        params(gcra(5), 3, SECOND),
        &[
            params(gcra(2), 7, 10 * SECOND),
            daily,
            params(gcra(1), 0, SECOND),
        ],
        &[Writes::All(NEWER), Writes::Mixed],
    )
    .await;
}

#[tokio::test]
async fn concurrency() {
    let concurrency = Algorithm::Concurrency;
    parity(
        "concurrency",
        params(concurrency, 5, 10 * SECOND),
        &[
            params(concurrency, 1, SECOND),
            params(concurrency, 0, SECOND),
            params(concurrency, 200, 60 * SECOND),
        ],
        &[],
    )
    .await;
}
