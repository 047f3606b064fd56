//! A rolling upgrade on one Redis (docs/operations.md, "Upgrades"). Replicas of the build
//! before the sliding window's counters layout and the packed states (its function
//! library exactly as that build loaded it, tests/fixtures/redis/library-4648178.lua) and
//! replicas of this build, writing either layout, take turns deciding one limit's hits, as a
//! deploy and then the switch to the newer layout put them side by side. Every outcome must be
//! the one a single Rust limiter gives for the same hits, and what Redis holds must add up to
//! its state: nothing is over-admitted, no call fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::redis_process::RedisServer;
use common::rng::Rng;
use common::sliding_window;
use redis::Value;
use tollgate::algorithm::{self, Algorithm, Charge, Params, State};
use tollgate::clock::{MICROS_PER_SECOND, Micros};
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::redis::call::numbers::state_numbers;
use tollgate::storage::redis::call::{Call, Layout, Op, Reply, SlidingWindowLayout, StateLayout};
use tollgate::storage::redis::connection::call_on;
use tollgate::storage::{Hit, Role};

const SECOND: Micros = MICROS_PER_SECOND;
const START: Micros = 1_795_000_000 * SECOND + 123_457;

/// The library of the build before the counters layout.
const EARLIER_LIBRARY: &str = include_str!("../fixtures/redis/library-4648178.lua");

/// Who decides a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replica {
    /// The build before the newer layouts, through its own functions.
    Earlier,
    /// This build, writing sliding windows and the other states in these layouts.
    This(SlidingWindowLayout, StateLayout),
}

/// This build as it is deployed: every layout text.
const TEXT: Replica = Replica::This(SlidingWindowLayout::Text, StateLayout::Text);

/// `call` decided by `replica`.
async fn send(
    connection: &mut redis::aio::MultiplexedConnection,
    replica: Replica,
    call: &Call<'_>,
) -> Reply {
    let Replica::Earlier = replica else {
        return call_on(connection, call).await.unwrap();
    };
    let reply = by_earlier_build(connection, call).await.unwrap();
    Layout::of(call).decode(call, reply).unwrap()
}

/// `call` by the earlier build's function for its layout: the raw reply.
async fn by_earlier_build(
    connection: &mut redis::aio::MultiplexedConnection,
    call: &Call<'_>,
) -> redis::RedisResult<Value> {
    let version = EARLIER_LIBRARY
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("#!lua name=tollgate_"))
        .unwrap();
    let layout = Layout::of(call);
    let mut command = redis::cmd("FCALL");
    command
        .arg(format!("tollgate_{}_{version}", layout.name()))
        .arg(call.hits.len());
    for hit in call.hits {
        command.arg(call.key(hit));
    }
    layout.encode(call, &mut command);
    command.query_async(connection).await
}

/// A Redis with the earlier build's library loaded (this build's loads at its first call).
async fn with_earlier_library() -> (RedisServer, redis::aio::MultiplexedConnection) {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(EARLIER_LIBRARY)
        .query_async(&mut connection)
        .await
        .unwrap();
    (server, connection)
}

struct Upgrade {
    rng: Rng,
    params: Params,
    hit: Hit,
    /// Always over: a request that carries it is vetoed.
    blocker: Hit,
    /// The state a single Rust limiter holds after the same calls.
    state: Option<State>,
    /// Committed hits a later call gives back, as a cluster does when another node vetoed
    /// their request: instant, hits, the state left.
    committed: Vec<(Micros, u64, Option<State>)>,
    now: Micros,
    calls: usize,
    /// Calls after which the counter was stored packed.
    packed: usize,
}

impl Upgrade {
    /// One call by a replica drawn from `replicas`: a lone hit, a vetoed request, a give-back
    /// or the client's refund, each checked against the Rust limiter.
    async fn step(
        &mut self,
        connection: &mut redis::aio::MultiplexedConnection,
        replicas: &[Replica],
    ) {
        self.now += match self.rng.below(10) {
            0..5 => self.rng.below(SECOND / 5),
            5..9 => self.rng.below(SECOND),
            _ => self.rng.below(5 * SECOND),
        };
        let replica = replicas[self.rng.below(replicas.len() as u64) as usize];
        let (sliding_window, state_layout) = match replica {
            Replica::Earlier => (SlidingWindowLayout::Text, StateLayout::Text),
            Replica::This(sliding_window, state_layout) => (sliding_window, state_layout),
        };
        let hits = 1 + self.rng.below(2);
        // One call in six is decided late: at an instant up to 200 ms before the last one's,
        // as when it reaches Redis after a later one (often in the window before).
        let now = if self.rng.below(6) == 0 {
            self.now - self.rng.below(SECOND / 5)
        } else {
            self.now
        };
        let context = format!("call {} at {now} by {replica:?}", self.calls);
        self.calls += 1;
        let base = |op, hits| Call {
            op,
            hits,
            node: None,
            complete: true,
            prefix: "",
            grace_ms: 3_600_000,
            sliding_window,
            state_layout,
        };
        match self.rng.below(10) {
            0 if !self.committed.is_empty() => {
                let (at, hits, left) = self.committed.remove(0);
                let given = [Hit {
                    hits,
                    ..self.hit.clone()
                }];
                let expected = [left.clone()];
                let call = Call {
                    complete: false,
                    ..base(
                        Op::GiveBack {
                            at,
                            expected: &expected,
                        },
                        &given,
                    )
                };
                send(connection, replica, &call).await;
                if let Some(next) = algorithm::given_back::give_back(
                    &self.params,
                    self.state.as_ref(),
                    left.as_ref(),
                    at,
                    hits,
                ) {
                    self.state = Some(next);
                }
            }
            1 => {
                let refund = [Hit {
                    role: Role::Refund,
                    hits,
                    ..self.hit.clone()
                }];
                let reply = send(connection, replica, &base(Op::Apply { now }, &refund)).await;
                let expected =
                    algorithm::given_back::refund(&self.params, self.state.as_ref(), now, hits);
                assert_eq!(reply.outcomes[0], expected.outcome, "{context}: refund");
                if let Some(next) = expected.state {
                    self.state = Some(next);
                }
            }
            2 => {
                let vetoed = [
                    Hit {
                        hits,
                        ..self.hit.clone()
                    },
                    self.blocker.clone(),
                ];
                let reply = send(connection, replica, &base(Op::Apply { now }, &vetoed)).await;
                // Vetoed, the hits consume nothing: admitted, they report a check.
                let decide = |hits| {
                    algorithm::decide(
                        &self.params,
                        self.state.as_ref(),
                        now,
                        hits,
                        Charge::IfAllowed,
                    )
                    .outcome
                };
                let mut expected = decide(hits);
                if expected.allowed {
                    expected = decide(0);
                }
                assert!(!reply.committed, "{context}: vetoed");
                assert_eq!(reply.outcomes[0], expected, "{context}: vetoed");
            }
            _ => {
                let lone = [Hit {
                    hits,
                    ..self.hit.clone()
                }];
                let reply = send(connection, replica, &base(Op::Apply { now }, &lone)).await;
                let decided = algorithm::decide(
                    &self.params,
                    self.state.as_ref(),
                    now,
                    hits,
                    Charge::IfAllowed,
                );
                assert_eq!(reply.outcomes[0], decided.outcome, "{context}: {hits} hits");
                if let Some(next) = decided.state {
                    self.state = Some(next);
                }
                if decided.outcome.allowed {
                    self.committed.push((now, hits, reply.after[0].clone()));
                    if self.committed.len() > 3 {
                        self.committed.remove(0);
                    }
                }
            }
        }
        if self.params.algorithm != Algorithm::SlidingWindow {
            let (numbers, packed) =
                common::stored::numbers(connection, self.hit.key.as_str()).await;
            self.packed += usize::from(packed);
            assert_eq!(
                numbers,
                self.state.as_ref().map(state_numbers),
                "{context}: stored state"
            );
            return;
        }
        let newest = sliding_window::newest_window(&self.params, self.state.as_ref(), now);
        assert_eq!(
            sliding_window::stored(connection, self.hit.key.as_str(), &self.params, newest).await,
            sliding_window::modelled(&self.params, self.state.as_ref(), newest),
            "{context}: stored counts in window {newest} and the one before"
        );
    }
}

/// An upgrade of one limit of `params`, its calls drawn by `seed`.
fn upgrade(params: Params, seed: u64) -> Upgrade {
    let hit = |name: &str, params: Params| Hit {
        descriptor: 0,
        key: counter_key("upgrade", [("user", EntryValue::Actual(name))], &params),
        params,
        hits: 1,
        role: Role::Enforced,
        charge: tollgate::algorithm::Charge::IfAllowed,
        lease: tollgate::limit::Lease::AsConfigured,
    };
    let blocker = Hit {
        descriptor: 1,
        ..hit(
            "blocker",
            Params {
                algorithm: Algorithm::default(),
                requests: 0,
                window: SECOND,
            },
        )
    };
    Upgrade {
        rng: Rng(seed),
        params,
        hit: hit("shared", params),
        blocker,
        state: None,
        committed: Vec::new(),
        now: START,
        calls: 0,
        packed: 0,
    }
}

/// Before, during and after the deploy of this build; during and after the switch to `newer`.
async fn deploy_then_switch(
    connection: &mut redis::aio::MultiplexedConnection,
    upgrade: &mut Upgrade,
    newer: Replica,
) {
    for replicas in [
        &[Replica::Earlier][..],
        &[Replica::Earlier, TEXT],
        &[TEXT],
        &[TEXT, newer],
        &[newer],
    ] {
        for _ in 0..600 {
            upgrade.step(connection, replicas).await;
        }
        // Calls after which the counter is packed: none before a replica writes packed, then
        // about half the calls beside text replicas, most with packed replicas alone (not
        // after a give-back, a refund or a vetoed call, which write text).
        let writes_packed = matches!(newer, Replica::This(_, StateLayout::Packed));
        // A log denies more hits, which write nothing.
        let alone = match upgrade.params.algorithm {
            Algorithm::SlidingLog { .. } => 300..=550,
            _ => 400..=550,
        };
        let packed = match replicas {
            [_, last] if writes_packed && *last == newer => 100..=400,
            [last] if writes_packed && *last == newer => alone,
            _ => 0..=0,
        };
        assert!(
            packed.contains(&upgrade.packed),
            "{replicas:?}: {} calls left the counter packed",
            upgrade.packed
        );
        upgrade.packed = 0;
    }
}

#[tokio::test]
async fn replicas_of_the_earlier_build_and_of_this_one_share_a_sliding_window_exactly() {
    let (_server, mut connection) = with_earlier_library().await;
    let params = Params {
        algorithm: Algorithm::SlidingWindow,
        requests: 7,
        window: 2 * SECOND,
    };
    let mut upgrade = upgrade(params, 0x0099_1ade);
    let counters = Replica::This(SlidingWindowLayout::Counters, StateLayout::Text);
    deploy_then_switch(&mut connection, &mut upgrade, counters).await;
}

#[tokio::test]
async fn replicas_of_the_earlier_build_and_of_this_one_share_a_packed_state_exactly() {
    let (_server, mut connection) = with_earlier_library().await;
    let packed = Replica::This(SlidingWindowLayout::Text, StateLayout::Packed);
    for (algorithm, seed) in [
        (Algorithm::TokenBucket { burst: 4 }, 0x00b0_c4e7),
        (Algorithm::Gcra { burst: 4 }, 0x006c_7a11),
        (Algorithm::SlidingLog { min_interval: 0 }, 0x0010_6a3d),
    ] {
        let params = Params {
            algorithm,
            requests: 3,
            window: SECOND,
        };
        let mut upgrade = upgrade(params, seed);
        deploy_then_switch(&mut connection, &mut upgrade, packed).await;
    }
}

/// Switched too early, while a replica of the earlier build still runs: that replica's calls
/// on a limit written as counters fail (its answer is then `--on-store-error`'s), rather than
/// decide without the hits counted there.
#[tokio::test]
async fn an_earlier_build_that_meets_a_limit_written_as_counters_fails_rather_than_miss_its_hits() {
    let (_server, mut connection) = with_earlier_library().await;
    let params = Params {
        algorithm: Algorithm::SlidingWindow,
        requests: 2,
        window: 10 * SECOND,
    };
    let hit = [Hit {
        descriptor: 0,
        key: counter_key("upgrade", [("user", EntryValue::Actual("early"))], &params),
        params,
        hits: 1,
        role: Role::Enforced,
        charge: tollgate::algorithm::Charge::IfAllowed,
        lease: tollgate::limit::Lease::AsConfigured,
    }];
    let call = |now, sliding_window| Call {
        op: Op::Apply { now },
        hits: &hit,
        node: None,
        complete: true,
        prefix: "",
        grace_ms: 3_600_000,
        sliding_window,
        state_layout: StateLayout::Text,
    };
    for at in [START, START + SECOND] {
        let reply = call_on(&mut connection, &call(at, SlidingWindowLayout::Counters))
            .await
            .unwrap();
        assert!(reply.outcomes[0].allowed);
    }
    let earlier = by_earlier_build(
        &mut connection,
        &call(START + 2 * SECOND, SlidingWindowLayout::Text),
    )
    .await;
    assert!(earlier.is_err(), "the earlier build answered {earlier:?}");
    // Its give-back fails too, having rewritten the marker empty: still the marker.
    let expected = [None];
    let give_back = Call {
        op: Op::GiveBack {
            at: START,
            expected: &expected,
        },
        complete: false,
        ..call(START, SlidingWindowLayout::Text)
    };
    let earlier = by_earlier_build(&mut connection, &give_back).await;
    assert!(earlier.is_err(), "the earlier build answered {earlier:?}");
    let text: String = redis::cmd("GET")
        .arg(hit[0].key.as_str())
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(text, "", "what the earlier build's give-back left");
    // This build, writing text, finds the marker and counts the limit's counters: full.
    let reply = call_on(
        &mut connection,
        &call(START + 2 * SECOND, SlidingWindowLayout::Text),
    )
    .await
    .unwrap();
    assert!(!reply.outcomes[0].allowed, "{reply:?}");
}
