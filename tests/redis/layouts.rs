//! Every call layout that decides (`storage::redis::call::Layout`) against the request rule: random requests
//! (applies, requests vetoed by another descriptor, check-only hits, the same counter twice,
//! every algorithm, both charges and both in one request, roles, declared keys and the
//! cross-slot forms, parts of a
//! request and refunds of committed calls) go to a real redis-server as calls, each in the
//! layout `Layout::of` gives it, and through the Rust rule (`storage::rule::decide`,
//! `algorithm::given_back::give_back`) on a model of the stored states; requests without refunds go to the
//! memory store too. Outcomes and every stored state must be identical after each step.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use common::redis_process::RedisServer;
use common::rng::Rng;
use common::sliding_window;
use tollgate::algorithm::{self, Algorithm, Anchor, Charge, Outcome, Params, State};
use tollgate::clock::{MICROS_PER_SECOND, ManualClock, Micros};
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::memory::MemoryStore;
use tollgate::storage::redis::call::numbers::{is_counter, state_from_numbers, window_start};
use tollgate::storage::redis::call::{Call, Layout, Op, Reply, SlidingWindowLayout, StateLayout};
use tollgate::storage::redis::connection::call_on;
use tollgate::storage::rule;
use tollgate::storage::{CounterStore, Hit, Role};

const SECOND: Micros = MICROS_PER_SECOND;
const START: Micros = 1_795_000_000 * SECOND + 123_457;

/// The counters requests draw from: every algorithm, a long sliding log (which a lone hit
/// sends by Apply), and a limit of 0 that vetoes whatever carries it.
fn counters() -> Vec<Params> {
    let params = |algorithm, requests, window| Params {
        algorithm,
        requests,
        window,
    };
    vec![
        params(Algorithm::default(), 3, 10 * SECOND),
        params(Algorithm::default(), 5, SECOND),
        params(
            Algorithm::FixedWindow {
                anchor: Anchor::FirstHit,
            },
            4,
            10 * SECOND,
        ),
        params(Algorithm::SlidingWindow, 5, 10 * SECOND),
        params(Algorithm::SlidingLog { min_interval: 0 }, 4, 10 * SECOND),
        params(Algorithm::SlidingLog { min_interval: 0 }, 100, 60 * SECOND),
        params(Algorithm::TokenBucket { burst: 3 }, 3, SECOND),
        params(Algorithm::Gcra { burst: 2 }, 2, SECOND),
        params(Algorithm::default(), 0, SECOND),
        params(Algorithm::Concurrency, 3, 10 * SECOND),
    ]
}

/// Counter 8 (limit 0) is over whatever the hits.
const BLOCKER: usize = 8;

/// How a sequence's charges count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Charges {
    /// Only when admitted (tollgate's default).
    Admission,
    /// Whether admitted or not (usage, `--count-denied`).
    Usage,
    /// Each hit one or the other, at random: a usage charge beside admissions.
    Mixed,
}

/// What a step sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// One hit on an epoch window.
    LoneCounter,
    /// One hit on another algorithm.
    LoneOther,
    /// Several hits on epoch windows only.
    Counters,
    /// Several hits, algorithms mixed.
    Mixed,
}

struct Sequence {
    rng: Rng,
    name: String,
    counters: Vec<Params>,
    charges: Charges,
    /// Whether calls may hold part of a request and refunds be sent (the memory store, which
    /// has neither, is then left out).
    parts_and_refunds: bool,
}

impl Sequence {
    /// Each call writes its sliding windows in a layout drawn at random: replicas writing
    /// either share a counter exactly.
    fn sliding_window_layout(&mut self) -> SlidingWindowLayout {
        if self.rng.below(2) == 0 {
            SlidingWindowLayout::Text
        } else {
            SlidingWindowLayout::Counters
        }
    }

    /// A hit's charge, as the sequence's `charges` say.
    fn charge(&mut self) -> Charge {
        match self.charges {
            Charges::Admission => Charge::IfAllowed,
            Charges::Usage => Charge::Always,
            Charges::Mixed if self.rng.below(3) == 0 => Charge::Always,
            Charges::Mixed => Charge::IfAllowed,
        }
    }

    fn hit(&self, counter: usize, descriptor: usize, hits: u64, role: Role) -> Hit {
        let params = self.counters[counter];
        Hit {
            descriptor,
            key: counter_key(
                "layouts",
                [(
                    "counter",
                    EntryValue::Actual(&format!("{}-{counter}", self.name)),
                )],
                &params,
            ),
            params,
            hits,
            role,
            charge: tollgate::algorithm::Charge::IfAllowed,
            lease: tollgate::limit::Lease::AsConfigured,
        }
    }

    fn counter_of(&mut self, shape: Shape) -> usize {
        let epoch = [0, 1];
        let other = [2, 3, 4, 5, 6, 7, 9];
        let any = [0, 1, 2, 3, 4, 5, 6, 7, 9];
        match shape {
            Shape::LoneCounter | Shape::Counters => epoch[self.rng.below(2) as usize],
            Shape::LoneOther => other[self.rng.below(7) as usize],
            Shape::Mixed => any[self.rng.below(9) as usize],
        }
    }

    /// A random request: its hits, in descriptor order, a blocker among them when `veto`.
    fn request(&mut self, shape: Shape, veto: bool) -> Vec<Hit> {
        let count = match shape {
            Shape::LoneCounter | Shape::LoneOther => 1,
            Shape::Counters | Shape::Mixed => 2 + self.rng.below(3) as usize,
        };
        let mut hits = Vec::new();
        let mut descriptor = 0;
        for _ in 0..count {
            let counter = self.counter_of(shape);
            let amount = match self.rng.below(100) {
                0..15 => 0,
                15..80 => 1,
                80..95 => 2,
                _ => 5,
            };
            let role = match self.rng.below(10) {
                0 => Role::Shadow,
                1 => Role::Quota,
                _ => Role::Enforced,
            };
            // A descriptor of one or two limits: consecutive hits may share it.
            if !hits.is_empty() && self.rng.below(4) != 0 {
                descriptor += 1;
            }
            let charge = self.charge();
            hits.push(Hit {
                charge,
                ..self.hit(counter, descriptor, amount, role)
            });
        }
        if veto {
            hits.push(self.hit(BLOCKER, descriptor + 1, 1, Role::Enforced));
        }
        hits
    }
}

/// The stored states as the Rust rule leaves them, by Redis key.
#[derive(Default)]
struct Model {
    states: HashMap<String, State>,
}

impl Model {
    fn found<'a>(&'a self, call: &Call<'_>) -> Vec<Option<&'a State>> {
        call.hits
            .iter()
            .map(|hit| self.states.get(&call.key(hit)))
            .collect()
    }

    /// The rule on the model; the states it writes are stored.
    fn apply(&mut self, call: &Call<'_>, now: Micros) -> rule::Decided {
        let found: Vec<Option<State>> = self
            .found(call)
            .into_iter()
            .map(Option::<&State>::cloned)
            .collect();
        let found: Vec<Option<&State>> = found.iter().map(Option::as_ref).collect();
        let decided = rule::decide(call.hits, &found, now, call.complete);
        for (hit, write) in call.hits.iter().zip(&decided.writes) {
            if let Some((state, _)) = write {
                self.states.insert(call.key(hit), state.clone());
            }
        }
        decided
    }

    /// The refunds of `call` (a GiveBack) by `algorithm::given_back::give_back`; the outcomes a check then
    /// finds.
    fn give_back(
        &mut self,
        call: &Call<'_>,
        at: Micros,
        expected: &[Option<State>],
    ) -> Vec<Outcome> {
        let mut done: Vec<String> = Vec::new();
        for (index, hit) in call.hits.iter().enumerate() {
            let key = call.key(hit);
            if done.contains(&key) {
                continue;
            }
            done.push(key.clone());
            let total: u64 = call.hits[index..]
                .iter()
                .filter(|other| other.key == hit.key)
                .map(|other| other.hits)
                .sum();
            let stored = self.states.get(&key);
            if let Some(next) = algorithm::given_back::give_back(
                &hit.params,
                stored,
                expected[index].as_ref(),
                at,
                total,
            ) {
                self.states.insert(key, next);
            }
        }
        call.hits
            .iter()
            .map(|hit| {
                let state = self.states.get(&call.key(hit));
                algorithm::decide(&hit.params, state, at, 0, Charge::IfAllowed).outcome
            })
            .collect()
    }
}

/// What Redis holds for a hit's counter, as a state (an epoch window's integer as its window
/// and count).
async fn stored(
    connection: &mut redis::aio::MultiplexedConnection,
    call: &Call<'_>,
    hit: &Hit,
) -> Option<State> {
    let text: Option<String> = redis::cmd("GET")
        .arg(call.key(hit))
        .query_async(connection)
        .await
        .unwrap();
    let numbers: Vec<u64> = text?
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    if is_counter(&hit.params) {
        let start = window_start(&hit.params, call.instant());
        return (numbers[0] > 0)
            .then(|| state_from_numbers(hit.params.algorithm, &[start, numbers[0]]))
            .flatten();
    }
    state_from_numbers(hit.params.algorithm, &numbers)
}

/// The model's state for a hit's counter, as Redis would hold it: an epoch window's count is
/// per window, and a count of 0 is no counter.
fn modelled(model: &Model, call: &Call<'_>, hit: &Hit) -> Option<State> {
    let state = model.states.get(&call.key(hit)).cloned();
    match state {
        Some(State::FixedWindow(window)) if is_counter(&hit.params) && window.count == 0 => None,
        state => state,
    }
}

/// Redis holds for a hit's counter what the model holds; a sliding window as the counts a
/// decision sees, its two layouts added up.
async fn assert_stored(
    connection: &mut redis::aio::MultiplexedConnection,
    model: &Model,
    call: &Call<'_>,
    hit: &Hit,
    context: &str,
) {
    if hit.params.algorithm == Algorithm::SlidingWindow {
        let state = model.states.get(&call.key(hit));
        let newest = sliding_window::newest_window(&hit.params, state, call.instant());
        assert_eq!(
            sliding_window::stored(connection, &call.key(hit), &hit.params, newest).await,
            sliding_window::modelled(&hit.params, state, newest),
            "{context}: the counts of {hit:?} in window {newest} and the one before"
        );
        return;
    }
    assert_eq!(
        stored(connection, call, hit).await,
        modelled(model, call, hit),
        "{context}: stored state of {hit:?}"
    );
}

/// A committed call a later step may give back.
struct Committed {
    hits: Vec<Hit>,
    at: Micros,
    after: Vec<Option<State>>,
}

async fn run(
    connection: &mut redis::aio::MultiplexedConnection,
    mut sequence: Sequence,
    steps: usize,
) -> HashMap<(Layout, bool), usize> {
    let clock = ManualClock::default();
    let memory =
        (!sequence.parts_and_refunds).then(|| MemoryStore::new(10_000, Arc::new(clock.clone())));
    let mut model = Model::default();
    let mut used: HashMap<(Layout, bool), usize> = HashMap::new();
    let mut pending: Vec<Committed> = Vec::new();
    let mut now = START;
    for step in 0..steps {
        now += match sequence.rng.below(10) {
            0..6 => sequence.rng.below(SECOND / 10),
            6..9 => sequence.rng.below(2 * SECOND),
            _ => sequence.rng.below(20 * SECOND),
        };
        let refund =
            sequence.parts_and_refunds && !pending.is_empty() && sequence.rng.below(8) == 0;
        let context = format!(
            "{} ({:?}) step {step} at {now}",
            sequence.name, sequence.charges
        );
        if refund {
            let pick = sequence.rng.below(pending.len() as u64) as usize;
            let consumed = pending.remove(pick);
            let call = Call {
                op: Op::GiveBack {
                    at: consumed.at,
                    expected: &consumed.after,
                },
                hits: &consumed.hits,
                node: None,
                complete: false,
                prefix: "",
                grace_ms: 3_600_000,
                sliding_window: sequence.sliding_window_layout(),
                state_layout: StateLayout::Text,
            };
            let reply = call_on(connection, &call)
                .await
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            let expected = model.give_back(&call, consumed.at, &consumed.after);
            assert_eq!(
                reply.outcomes, expected,
                "{context}: refund of {:?}",
                consumed.hits
            );
            *used.entry((Layout::GiveBack, false)).or_default() += 1;
            for hit in call.hits {
                assert_stored(connection, &model, &call, hit, &context).await;
            }
            continue;
        }
        let shape = match sequence.rng.below(10) {
            0..3 => Shape::LoneCounter,
            3..5 => Shape::LoneOther,
            5..7 => Shape::Counters,
            _ => Shape::Mixed,
        };
        let veto = sequence.rng.below(6) == 0;
        let hits = sequence.request(shape, veto);
        let cross_slot = hits.len() > 1 && sequence.rng.below(3) == 0;
        let complete = !sequence.parts_and_refunds || sequence.rng.below(3) != 0;
        // With parts and refunds, one request in ten is decided late: at an instant up to
        // 200 ms before the last one's, as when it reaches Redis after a later one (the
        // memory store, which never decides before an instant it has seen, is left out).
        let at = if sequence.parts_and_refunds && sequence.rng.below(10) == 0 {
            now - sequence.rng.below(SECOND / 5)
        } else {
            now
        };
        let call = Call {
            op: Op::Apply { now: at },
            hits: &hits,
            node: cross_slot.then_some(("127.0.0.1", 1)),
            complete,
            prefix: "",
            grace_ms: 3_600_000,
            sliding_window: sequence.sliding_window_layout(),
            state_layout: StateLayout::Text,
        };
        let layout = Layout::of(&call);
        *used.entry((layout, cross_slot)).or_default() += 1;
        let reply: Reply = call_on(connection, &call)
            .await
            .unwrap_or_else(|error| panic!("{context}: {layout:?}: {error}"));
        let decided = model.apply(&call, at);
        let context = format!("{context}: {layout:?} of {hits:?}");
        assert_eq!(
            reply.outcomes,
            decided.outcomes.to_vec(),
            "{context}: Redis vs the rule"
        );
        assert_eq!(reply.committed, decided.committed, "{context}: committed");
        if let Some(memory) = &memory {
            clock.set(now);
            let outcomes = memory.apply(&hits).await.unwrap();
            assert_eq!(outcomes, reply.outcomes, "{context}: memory vs Redis");
        }
        for hit in &hits {
            assert_stored(connection, &model, &call, hit, &context).await;
        }
        // What a give-back would undo (as fanout.rs sends it): admitted charges that count
        // only when admitted.
        let undone = |(hit, outcome): (&Hit, &Outcome)| {
            outcome.allowed && hit.charge == Charge::IfAllowed && hit.role != Role::Refund
        };
        if reply.committed && hits.iter().zip(&reply.outcomes).any(undone) {
            let given: Vec<Hit> = hits
                .iter()
                .zip(&reply.outcomes)
                .map(|pair| Hit {
                    hits: if undone(pair) { pair.0.hits } else { 0 },
                    ..pair.0.clone()
                })
                .collect();
            pending.push(Committed {
                hits: given,
                at,
                after: reply.after.clone(),
            });
            if pending.len() > 4 {
                pending.remove(0);
            }
        }
    }
    used
}

#[tokio::test]
async fn every_layout_answers_what_the_request_rule_answers() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let mut used: HashMap<(Layout, bool), usize> = HashMap::new();
    for (seed, charges, parts_and_refunds) in [
        (1, Charges::Admission, false),
        (2, Charges::Usage, false),
        (3, Charges::Admission, true),
        (4, Charges::Usage, true),
        (5, Charges::Mixed, false),
        (6, Charges::Mixed, true),
    ] {
        let name = format!("seed-{seed}");
        let sequence = Sequence {
            rng: Rng(0x5eed_0000 + seed),
            counters: counters(),
            name,
            charges,
            parts_and_refunds,
        };
        for (layout, count) in run(&mut connection, sequence, 1_500).await {
            *used.entry(layout).or_default() += count;
        }
    }
    // Everything the calls wrote expires: counters a call created and then took back too.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(keys.len() > 100, "{} keys", keys.len());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} expires in {ttl} ms");
    }
    // The lease layouts decide no hit: tests/redis/leases.rs holds them to their answers.
    let deciding = Layout::ALL.into_iter().filter(|layout| layout.decides());
    for layout in deciding {
        for cross_slot in [false, true] {
            if layout.entry(cross_slot).is_some() {
                let count = used.get(&(layout, cross_slot)).copied().unwrap_or(0);
                assert!(
                    count > 100,
                    "{layout:?} (cross-slot {cross_slot}) ran {count} times"
                );
            }
        }
    }
}

/// A Redis of its own and a connection to it.
async fn connected() -> (RedisServer, redis::aio::MultiplexedConnection) {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let connection = client.get_multiplexed_async_connection().await.unwrap();
    (server, connection)
}

impl Sequence {
    /// A sequence for building hits by hand: the usual counters, denied hits not counted.
    fn named(name: &str) -> Self {
        Sequence {
            rng: Rng(1),
            name: name.to_owned(),
            counters: counters(),
            charges: Charges::Admission,
            parts_and_refunds: false,
        }
    }
}

/// A counter that holds something other than a count (written by something else) fails the
/// call, and the call leaves every counter as it was: the counters it added to before
/// meeting that one are taken back.
#[tokio::test]
async fn a_count_call_meeting_a_counter_that_is_not_a_count_fails_and_changes_nothing() {
    let (server, mut connection) = connected().await;
    let sequence = Sequence::named("not-a-count");
    let hits = [
        sequence.hit(0, 0, 1, Role::Enforced),
        sequence.hit(1, 1, 1, Role::Enforced),
    ];
    for cross_slot in [false, true] {
        let call = Call {
            op: Op::Apply { now: START },
            hits: &hits,
            node: cross_slot.then_some(("127.0.0.1", 1)),
            complete: true,
            prefix: "",
            grace_ms: 3_600_000,
            sliding_window: SlidingWindowLayout::Text,
            state_layout: StateLayout::Text,
        };
        assert_eq!(Layout::of(&call), Layout::Count);
        let (first, second) = (call.key(&hits[0]), call.key(&hits[1]));
        server.query(&["SET", &first, "2", "PX", "60000"]);
        server.query(&["SET", &second, "two"]);
        let error = call_on(&mut connection, &call).await.unwrap_err();
        assert!(error.to_string().contains("malformed counter 2"), "{error}");
        assert_eq!(server.query(&["GET", &first]), "2");
        assert_eq!(server.query(&["GET", &second]), "two");
        let ttl: i64 = server.query(&["PTTL", &first]).parse().unwrap();
        assert!((1..=60_000).contains(&ttl), "{ttl}");
    }
}

/// The value under `key`, as bytes (a packed state is not text).
async fn stored_bytes(connection: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<u8> {
    redis::cmd("GET")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap()
}

/// Sets `key` to `value`, as bytes.
async fn store_bytes(connection: &mut redis::aio::MultiplexedConnection, key: &str, value: &[u8]) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(connection)
        .await
        .unwrap();
}

/// A call of `hits` at `now` as a replica writing text sends it, with a grace of 60 s.
fn lone_call(hits: &[Hit], now: Micros) -> Call<'_> {
    Call {
        op: Op::Apply { now },
        hits,
        node: None,
        complete: true,
        prefix: "",
        grace_ms: 60_000,
        sliding_window: SlidingWindowLayout::Text,
        state_layout: StateLayout::Text,
    }
}

/// Three lone hits on `counter` (DecideOne), at START, 5 s and 12 s later, with a grace of
/// 60 s: the expiry in ms the first and the last set (ranges, for the time the calls take),
/// with what each leaves stored; the second, in the window the first began, keeps the expiry
/// it finds (set further out by hand before it, to see it).
async fn expiry_across_windows(
    counter: usize,
    first: (std::ops::RangeInclusive<i64>, &str),
    second: &str,
    last: (std::ops::RangeInclusive<i64>, &str),
) {
    let (server, mut connection) = connected().await;
    let sequence = Sequence::named(&format!("expiry-{counter}"));
    let hits = [sequence.hit(counter, 0, 1, Role::Enforced)];
    let call_at = |now| lone_call(&hits, now);
    let key = call_at(START).key(&hits[0]);
    let counts = || {
        let text = server.query(&["GET", &key]);
        text.split(' ').skip(1).collect::<Vec<_>>().join(" ")
    };
    let ttl = || server.query(&["PTTL", &key]).parse::<i64>().unwrap();

    assert_eq!(Layout::of(&call_at(START)), Layout::DecideOne);
    call_on(&mut connection, &call_at(START)).await.unwrap();
    assert_eq!(counts(), first.1);
    assert!(first.0.contains(&ttl()), "{}", ttl());

    server.query(&["PEXPIRE", &key, "600000"]);
    call_on(&mut connection, &call_at(START + 5 * SECOND))
        .await
        .unwrap();
    assert_eq!(counts(), second);
    assert!((590_000..=600_000).contains(&ttl()), "{}", ttl());

    call_on(&mut connection, &call_at(START + 12 * SECOND))
        .await
        .unwrap();
    assert_eq!(counts(), last.1);
    assert!(last.0.contains(&ttl()), "{}", ttl());
}

/// A window anchored on its first hit (counter 2: 4 hits in 10 s from the first) expires its
/// window after it starts, then the grace, and keeps that within the window: its end does not
/// move.
#[tokio::test]
async fn a_first_hit_window_s_expiry_is_set_when_its_window_starts_and_kept_within_it() {
    expiry_across_windows(2, (69_000..=70_000, "1"), "2", (69_000..=70_000, "1")).await;
}

/// A sliding window (counter 3: 5 hits in 10 s, windows on the epoch; START is 0.123457 s into
/// one) written as text expires two windows after its window's start, then the grace, and
/// keeps that within the window.
#[tokio::test]
async fn a_sliding_window_s_expiry_is_set_in_a_new_window_and_kept_within_it() {
    // Stored: start, then the window's count and the previous window's.
    expiry_across_windows(3, (79_000..=79_877, "1 0"), "2 0", (77_000..=77_877, "1 2")).await;
}

/// A sliding window whose count in its window went back to 0 (a refund) was stored with the
/// shorter expiry that leaves: the next hit in that window sets the full one again rather than
/// keep it.
#[tokio::test]
async fn a_sliding_window_refunded_to_nothing_gets_its_expiry_back_with_its_next_hit() {
    let (server, mut connection) = connected().await;
    let sequence = Sequence::named("refunded-expiry");
    let hits = [sequence.hit(3, 0, 1, Role::Enforced)];
    let call_at = |now| lone_call(&hits, now);
    let key = call_at(START).key(&hits[0]);
    call_on(&mut connection, &call_at(START)).await.unwrap();
    let text = server.query(&["GET", &key]);
    let start = text.split(' ').next().unwrap().to_owned();
    // As a refund of that hit leaves it: no count, and an expiry at the window's end.
    server.query(&["SET", &key, &format!("{start} 0 0"), "PX", "5000"]);

    call_on(&mut connection, &call_at(START + 5 * SECOND))
        .await
        .unwrap();
    assert_eq!(server.query(&["GET", &key]), format!("{start} 1 0"));
    // Two windows after the window's start (START is 0.123457 s into it), then the grace.
    let ttl: i64 = server.query(&["PTTL", &key]).parse().unwrap();
    assert!((74_000..=74_877).contains(&ttl), "{ttl}");
}

/// A lone hit on a token bucket or a GCRA limit (each written out in its Lua) sets its
/// counter's expiry to when the limit is fully available again, then the grace (60 s), and
/// stores what the algorithm does; a denied one writes nothing.
#[tokio::test]
async fn a_bucket_s_expiry_is_when_it_is_full_again_then_the_grace() {
    // Counter 6: a token bucket of 3 tokens, 3 a second (1/3 s per token): its level in
    // millionths of a token, then when it was measured. Counter 7: GCRA, 2 a second, a burst
    // of 2 (1/2 s per hit): when it is full again, then the remainder. START is
    // 1795000000.123457 s; the second hit comes 0.1 s later.
    let cases = [
        (
            6,
            ("2000000 1795000000123457", 60_334),
            ("1300000 1795000000223457", 60_567),
        ),
        (
            7,
            ("1795000000623457 0", 60_500),
            ("1795000001123457 0", 60_900),
        ),
    ];
    let (server, mut connection) = connected().await;
    for (counter, first, second) in cases {
        let sequence = Sequence::named(&format!("bucket-expiry-{counter}"));
        let one = [sequence.hit(counter, 0, 1, Role::Enforced)];
        let two = [sequence.hit(counter, 0, 2, Role::Enforced)];
        let key = lone_call(&one, START).key(&one[0]);
        let ttl = || server.query(&["PTTL", &key]).parse::<i64>().unwrap();
        for (hits, now, (stored, expiry)) in
            [(&one, START, first), (&one, START + SECOND / 10, second)]
        {
            let call = lone_call(hits, now);
            assert_eq!(Layout::of(&call), Layout::DecideOne);
            let reply = call_on(&mut connection, &call).await.unwrap();
            assert!(reply.outcomes[0].allowed, "counter {counter} at {now}");
            assert_eq!(
                server.query(&["GET", &key]),
                stored,
                "counter {counter} at {now}"
            );
            assert!(
                (expiry - 1_000..=expiry).contains(&ttl()),
                "counter {counter} at {now}: {}",
                ttl()
            );
        }
        let reply = call_on(&mut connection, &lone_call(&two, START + SECOND / 10))
            .await
            .unwrap();
        assert!(
            !reply.outcomes[0].allowed,
            "counter {counter}: two more hits"
        );
        assert_eq!(server.query(&["GET", &key]), second.0, "counter {counter}");
        assert!(
            (second.1 - 1_000..=second.1).contains(&ttl()),
            "counter {counter}: {}",
            ttl()
        );
    }
}

/// A bucket written packed (`StateLayout::Packed`) holds the numbers the text would, after
/// the tag byte, and is kept for the longest the bucket can take to fill, then the grace; a
/// replica writing text reads it and writes text, one writing packed reads the text. GCRA
/// ahead by more than its burst (one lowered since) is written as text with its own expiry.
#[tokio::test]
async fn a_bucket_written_packed_is_kept_for_its_longest_fill_and_read_as_text_is() {
    fn packed(first: u64, second: u64) -> Vec<u8> {
        [&[0xFF][..], &first.to_le_bytes(), &second.to_le_bytes()].concat()
    }
    // Counter 6: a token bucket of 3 tokens, 3 a second; counter 7: GCRA, 2 a second, a burst
    // of 2 (as in the test above). Each fills in 1 s at most: kept 61,000 ms packed.
    let cases = [
        (
            6,
            packed(2_000_000, 1_795_000_000_123_457),
            ("1300000 1795000000223457", 60_567),
            packed(1_500_000, 1_795_000_000_623_457),
        ),
        (
            7,
            packed(1_795_000_000_623_457, 0),
            ("1795000001123457 0", 60_900),
            packed(1_795_000_001_623_457, 0),
        ),
    ];
    let (server, mut connection) = connected().await;
    for (counter, first, second, third) in cases {
        let sequence = Sequence::named(&format!("bucket-packed-{counter}"));
        let one = [sequence.hit(counter, 0, 1, Role::Enforced)];
        let key = lone_call(&one, START).key(&one[0]);
        let ttl = || server.query(&["PTTL", &key]).parse::<i64>().unwrap();
        let at = |now, bucket| Call {
            state_layout: bucket,
            ..lone_call(&one, now)
        };
        let steps = [
            (START, StateLayout::Packed, first, 61_000),
            (
                START + SECOND / 10,
                StateLayout::Text,
                second.0.as_bytes().to_vec(),
                second.1,
            ),
            (START + SECOND / 2, StateLayout::Packed, third, 61_000),
        ];
        for (now, bucket, stored, expiry) in steps {
            let call = at(now, bucket);
            assert_eq!(Layout::of(&call), Layout::DecideOne);
            let reply = call_on(&mut connection, &call).await.unwrap();
            assert!(reply.outcomes[0].allowed, "counter {counter} at {now}");
            let value = stored_bytes(&mut connection, &key).await;
            assert_eq!(value, stored, "counter {counter} at {now} by {bucket:?}");
            // Within 400 ms: the expiry text would have had at each packed step (60,334 and
            // 60,500 for the token bucket, 60,500 and 61,000 for GCRA) is outside the range,
            // but for GCRA's last, which leaves a full burst to fill.
            assert!(
                (expiry - 400..=expiry).contains(&ttl()),
                "counter {counter} at {now}: {}",
                ttl()
            );
        }
    }

    let sequence = Sequence::named("bucket-packed-lowered");
    let one = [Hit {
        charge: Charge::Always,
        ..sequence.hit(7, 0, 1, Role::Enforced)
    }];
    let key = lone_call(&one, START).key(&one[0]);
    // Full again 5 s from now, where a burst of 2 at 2 a second is at most 1 s ahead.
    let ahead = format!("{} 0", START + 5 * SECOND);
    server.query(&["SET", &key, &ahead]);
    let counted = Call {
        state_layout: StateLayout::Packed,
        ..lone_call(&one, START)
    };
    let reply = call_on(&mut connection, &counted).await.unwrap();
    assert!(!reply.outcomes[0].allowed);
    assert_eq!(server.query(&["GET", &key]), ahead);
    let ttl = server.query(&["PTTL", &key]).parse::<i64>().unwrap();
    assert!((64_000..=65_000).contains(&ttl), "{ttl}");

    // A packed number no tollgate writes (past 2^52) fails the call and changes nothing: taken
    // as it stands (a TAT of 5, long past), or its bytes as the digits 11111111, the hit would
    // be admitted and the bucket rewritten.
    let out_of_range = [&[0xFF][..], &5_i64.to_le_bytes(), b"11111111"].concat();
    store_bytes(&mut connection, &key, &out_of_range).await;
    assert!(call_on(&mut connection, &counted).await.is_err());
    let value = stored_bytes(&mut connection, &key).await;
    assert_eq!(value, out_of_range);
}

/// A sliding log written packed (`StateLayout::Packed`) holds its runs after the tag byte, kept
/// as its text is (the window, then the grace); a replica writing text reads it and writes
/// text, one writing packed reads the text. A run exactly a window old has left; hits past the
/// limit, counted, drop the oldest.
#[tokio::test]
async fn a_sliding_log_written_packed_is_kept_as_its_text_and_read_as_text_is() {
    fn packed(runs: &[(u64, u64)]) -> Vec<u8> {
        let numbers = runs.iter().flat_map(|&(at, hits)| [at, hits]);
        [vec![0xFE], numbers.flat_map(u64::to_le_bytes).collect()].concat()
    }
    let text = |runs: &[(u64, u64)]| {
        let numbers: Vec<String> = runs
            .iter()
            .flat_map(|&(at, hits)| [at.to_string(), hits.to_string()])
            .collect();
        numbers.join(" ").into_bytes()
    };
    let (server, mut connection) = connected().await;
    // Counter 4: 4 hits in 10 s, in µs ticks; kept 10 s, then the grace of 60 s.
    let sequence = Sequence::named("log-packed");
    let call = |now, hits, state_layout, charge| {
        let one = vec![Hit {
            charge,
            ..sequence.hit(4, 0, hits, Role::Enforced)
        }];
        (now, one, state_layout)
    };
    let (packed_by, text_by) = (StateLayout::Packed, StateLayout::Text);
    let counted = Charge::Always;
    let checked = Charge::IfAllowed;
    let s = START;
    let steps = [
        (call(s, 1, packed_by, checked), true, packed(&[(s, 1)])),
        (
            call(s + SECOND, 1, packed_by, checked),
            true,
            packed(&[(s, 1), (s + SECOND, 1)]),
        ),
        (
            call(s + SECOND, 2, packed_by, checked),
            true,
            packed(&[(s, 1), (s + SECOND, 3)]),
        ),
        // The first run ends exactly now.
        (
            call(s + 10 * SECOND, 1, text_by, checked),
            true,
            text(&[(s + SECOND, 3), (s + 10 * SECOND, 1)]),
        ),
        (
            call(s + 23 * SECOND / 2, 1, packed_by, checked),
            true,
            packed(&[(s + 10 * SECOND, 1), (s + 23 * SECOND / 2, 1)]),
        ),
        (
            call(s + 20 * SECOND, 1, packed_by, checked),
            true,
            packed(&[(s + 23 * SECOND / 2, 1), (s + 20 * SECOND, 1)]),
        ),
        // From a replica whose clock is behind: at the newest run's instant.
        (
            call(s + 19 * SECOND, 1, packed_by, checked),
            true,
            packed(&[(s + 23 * SECOND / 2, 1), (s + 20 * SECOND, 2)]),
        ),
        // Denied and counted: 6 hits in the log, the oldest 2 go.
        (
            call(s + 20 * SECOND, 3, packed_by, counted),
            false,
            packed(&[(s + 20 * SECOND, 4)]),
        ),
        // Every run has left.
        (
            call(s + 30 * SECOND, 1, packed_by, checked),
            true,
            packed(&[(s + 30 * SECOND, 1)]),
        ),
    ];
    let mut key = String::new();
    for ((now, one, state_layout), allowed, stored) in steps {
        let call = Call {
            state_layout,
            ..lone_call(&one, now)
        };
        assert_eq!(Layout::of(&call), Layout::DecideOne);
        key = call.key(&one[0]);
        let reply = call_on(&mut connection, &call).await.unwrap();
        assert_eq!(reply.outcomes[0].allowed, allowed, "at {now}");
        let value = stored_bytes(&mut connection, &key).await;
        assert_eq!(value, stored, "at {now} by {state_layout:?}");
        let ttl = server.query(&["PTTL", &key]).parse::<i64>().unwrap();
        assert!((69_600..=70_000).contains(&ttl), "at {now}: {ttl}");
    }

    // A packed number no tollgate writes (past 2^52, or negative), in the newest run or
    // another, or a tag with no packed form after it, fails the call and changes nothing:
    // read as digits, its bytes would be decided on and written.
    let broken_length = packed(&[(s, 1), (s + SECOND, 1)])[..25].to_vec();
    for (out_of_range, state_layout) in [
        (packed(&[(1 << 53, 1)]), packed_by),
        (packed(&[((1 << 52) + 1, 1)]), packed_by),
        (packed(&[(u64::MAX, 1)]), packed_by),
        (packed(&[(s, 1 << 53), (s + SECOND, 1)]), packed_by),
        (packed(&[(s, 1), (s + SECOND, 1 << 53)]), text_by),
        (packed(&[(s, 1), (s + SECOND, u64::MAX)]), text_by),
        (broken_length.clone(), packed_by),
        (broken_length, text_by),
    ] {
        store_bytes(&mut connection, &key, &out_of_range).await;
        let one = [sequence.hit(4, 0, 1, Role::Enforced)];
        let call = Call {
            state_layout,
            ..lone_call(&one, s + 40 * SECOND)
        };
        assert!(
            call_on(&mut connection, &call).await.is_err(),
            "{state_layout:?}"
        );
        let value = stored_bytes(&mut connection, &key).await;
        assert_eq!(value, out_of_range);
    }

    // A minimum interval longer than the window: a log is kept that long, packed as in text.
    let gapped = Sequence {
        counters: vec![Params {
            algorithm: Algorithm::SlidingLog {
                min_interval: 15 * SECOND,
            },
            requests: 2,
            window: 10 * SECOND,
        }],
        ..Sequence::named("log-packed-gap")
    };
    for (now, state_layout) in [
        (s, packed_by),
        (s + 20 * SECOND, text_by),
        (s + 40 * SECOND, packed_by),
    ] {
        let one = [gapped.hit(0, 0, 1, Role::Enforced)];
        let call = Call {
            state_layout,
            ..lone_call(&one, now)
        };
        let reply = call_on(&mut connection, &call).await.unwrap();
        assert!(reply.outcomes[0].allowed, "at {now}");
        let ttl = server
            .query(&["PTTL", &call.key(&one[0])])
            .parse::<i64>()
            .unwrap();
        assert!((74_600..=75_000).contains(&ttl), "at {now}: {ttl}");
    }
}

/// A sliding window's text of a later window than the hit's (written by a replica whose
/// clock runs ahead) is that window's state: the hit is decided at that window's start and
/// counts there.
#[tokio::test]
async fn a_sliding_window_hit_meeting_a_later_window_s_text_counts_in_that_window() {
    let (server, mut connection) = connected().await;
    let sequence = Sequence::named("later-window");
    // Counter 3: 5 hits in 10 s, windows on the epoch; START is 0.123457 s into one.
    let hits = [sequence.hit(3, 0, 1, Role::Enforced)];
    let next_window = START - 123_457 + 10 * SECOND;
    let key = lone_call(&hits, next_window).key(&hits[0]);
    call_on(&mut connection, &lone_call(&hits, next_window))
        .await
        .unwrap();
    let text = server.query(&["GET", &key]);
    let start = text.split(' ').next().unwrap().to_owned();
    // One hit in that window, two in the one before: at its start, 3 of 5 are taken, 4 with the
    // hit.
    server.query(&["SET", &key, &format!("{start} 1 2"), "KEEPTTL"]);

    // 8 s before that window: were the hit decided at its own instant (not clamped to the
    // window's start), 2 × 1.8 + 1 + 1 hits would be over 5.
    let reply = call_on(&mut connection, &lone_call(&hits, next_window - 8 * SECOND))
        .await
        .unwrap();
    assert!(reply.outcomes[0].allowed);
    assert_eq!(server.query(&["GET", &key]), format!("{start} 2 2"));
}
