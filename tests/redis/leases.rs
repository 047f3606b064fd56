//! Leases on a real redis-server: the two lease layouts (a grant never past the limit, a
//! return never past what its holder holds), and replicas leasing one busy counter, which
//! together never admit more than its limit, whatever their shares, however many requests
//! they answer from their slices, and when one of them is lost with its slices.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_process::RedisServer;
use tollgate::algorithm::{Algorithm, Params};
use tollgate::clock::{Clock, MICROS_PER_SECOND, ManualClock, Micros};
use tollgate::limit::Lease;
use tollgate::metrics::Metrics;
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::options::{LeaseMode, StoreOptions};
use tollgate::storage::redis::{RedisSpec, RedisStore};
use tollgate::storage::stack::remote_stack;
use tollgate::storage::{CounterLease, CounterReset, Grant, Hit, Role, Store, StoreClock};

const T0: u64 = 1_795_000_020;
const MINUTE: Micros = 60 * MICROS_PER_SECOND;

pub(crate) fn hit(user: &str, requests: u64, hits: u64) -> Hit {
    let params = Params {
        algorithm: Algorithm::default(),
        requests,
        window: MINUTE,
    };
    Hit {
        descriptor: 0,
        key: counter_key("lease", [("route", EntryValue::Actual(user))], &params),
        params,
        hits,
        role: Role::Enforced,
        charge: tollgate::algorithm::Charge::IfAllowed,
        lease: Lease::Auto,
    }
}

pub(crate) fn options(clock: &ManualClock, lease: LeaseMode) -> StoreOptions {
    StoreOptions {
        timeout: Duration::from_secs(2),
        clock: Some(Arc::new(clock.clone())),
        lease,
        lease_busy_rate: 50,
        ..StoreOptions::default()
    }
}

pub(crate) fn redis(server: &RedisServer, options: &StoreOptions) -> Arc<RedisStore> {
    RedisStore::start(
        RedisSpec::parse(&server.url(), None).unwrap().unwrap(),
        options.clone(),
    )
}

pub(crate) async fn ready(store: &RedisStore) {
    for _ in 0..200 {
        if tollgate::storage::CounterStore::ping(store).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the Redis store never became ready");
}

#[tokio::test]
async fn a_lease_of_a_counter_usage_took_past_its_limit_grants_nothing_and_says_so() {
    let server = RedisServer::start();
    let clock = ManualClock::at_seconds(T0);
    let options = options(&clock, LeaseMode::Off);
    let a = redis(&server, &options);
    ready(&a).await;
    let now = a.instant(&hit("r", 100, 0)).unwrap();
    let grant = a
        .lease(&hit("r", 100, 60), now, 0, MICROS_PER_SECOND)
        .await
        .unwrap();
    assert_eq!(grant, granted(60, 60, 1, true, now));
    // 70 tokens spent, counted in full past the limit: 130 in all.
    let usage = Hit {
        charge: tollgate::algorithm::Charge::Always,
        ..hit("r", 100, 70)
    };
    let outcome = tollgate::storage::CounterStore::apply(&*a, &[usage])
        .await
        .unwrap();
    assert!(!outcome[0].allowed);
    assert_eq!(
        server.query(&["GET", &redis_key(&hit("r", 100, 0), now)]),
        "130"
    );
    let grant = a
        .lease(&hit("r", 100, 10), now, 60, MICROS_PER_SECOND)
        .await
        .unwrap();
    assert_eq!(
        grant,
        Grant {
            overrun: true,
            ..granted(0, 100, 1, true, now)
        }
    );
}

#[tokio::test]
async fn a_lease_grants_at_most_what_is_left_and_a_return_at_most_what_its_holder_holds() {
    let server = RedisServer::start();
    let clock = ManualClock::at_seconds(T0);
    let options = options(&clock, LeaseMode::Off);
    let (a, b) = (redis(&server, &options), redis(&server, &options));
    ready(&a).await;
    ready(&b).await;
    let now = a.instant(&hit("r", 100, 0)).unwrap();

    let grant = a
        .lease(&hit("r", 100, 60), now, 0, MICROS_PER_SECOND)
        .await
        .unwrap();
    assert_eq!(grant, granted(60, 60, 1, true, now));
    let grant = b
        .lease(&hit("r", 100, 60), now, 0, MICROS_PER_SECOND)
        .await
        .unwrap();
    assert_eq!(grant, granted(40, 100, 2, true, now));
    let grant = b
        .lease(&hit("r", 100, 5), now, 40, MICROS_PER_SECOND)
        .await
        .unwrap();
    assert_eq!(grant, granted(0, 100, 2, true, now));
    // Budget leased is counted: a hit decided by the store finds none left.
    let outcome = tollgate::storage::CounterStore::apply(&*a, &[hit("r", 100, 1)])
        .await
        .unwrap();
    assert!(!outcome[0].allowed);

    // A return gives back at most what its holder holds.
    assert_eq!(
        a.give_back_lease(&hit("r", 100, 80), now, None)
            .await
            .unwrap(),
        60
    );
    assert_eq!(
        a.give_back_lease(&hit("r", 100, 10), now, None)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        server.query(&["GET", &redis_key(&hit("r", 100, 0), now)]),
        "40"
    );

    // After a reset, what was leased before takes back nothing counted since, and a lease
    // tells its holder that what it held is gone.
    b.forget(&[hit("r", 100, 0)]).await.unwrap();
    let grant = a
        .lease(&hit("r", 100, 30), now, 0, MICROS_PER_SECOND)
        .await
        .unwrap();
    assert_eq!(grant, granted(30, 30, 1, true, now));
    let grant = b
        .lease(&hit("r", 100, 5), now, 40, MICROS_PER_SECOND)
        .await
        .unwrap();
    assert_eq!(grant, granted(5, 35, 2, false, now));
    assert_eq!(
        b.give_back_lease(&hit("r", 100, 40), now, None)
            .await
            .unwrap(),
        5
    );
    assert_eq!(
        server.query(&["GET", &redis_key(&hit("r", 100, 0), now)]),
        "30"
    );

    // The next window starts with its whole budget.
    let next = now + MINUTE;
    let grant = b
        .lease(&hit("r", 100, 70), next, 0, MICROS_PER_SECOND)
        .await
        .unwrap();
    assert_eq!(grant, granted(70, 70, 1, true, next));
}

/// A fixed window's grant, of a limit of 100 a minute, leased at `now`.
fn granted(granted: u64, count: u64, holders: u64, intact: bool, now: Micros) -> Grant {
    Grant {
        granted,
        unleased: 100 - count,
        overrun: false,
        holders,
        intact,
        after: None,
        reset_after: MINUTE - now % MINUTE,
    }
}

/// The counter's key in Redis at `now` (no prefix): the key and its window's number.
fn redis_key(hit: &Hit, now: Micros) -> String {
    format!("{}:{}", hit.key.as_str(), now / hit.params.window)
}

/// Replicas serving one busy counter, each a whole store as served (its own Redis
/// connections and lease holder name) on one Redis.
pub(crate) struct Fleet {
    pub(crate) server: RedisServer,
    pub(crate) clock: ManualClock,
    pub(crate) replicas: Vec<Store>,
    pub(crate) metrics: Vec<Metrics>,
}

impl Fleet {
    pub(crate) fn start(replicas: usize) -> Self {
        let server = RedisServer::start();
        let clock = ManualClock::at_seconds(T0);
        let options = options(&clock, LeaseMode::Auto);
        let metrics: Vec<Metrics> = (0..replicas).map(|_| Metrics::default()).collect();
        let replicas = metrics
            .iter()
            .map(|metrics| remote_stack(redis(&server, &options), &options, metrics))
            .collect();
        Self {
            server,
            clock,
            replicas,
            metrics,
        }
    }

    pub(crate) async fn ready(&self) {
        for replica in &self.replicas {
            for _ in 0..200 {
                if replica.counters.ping().await.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    }

    /// What replica `index` leased and neither used (every request is of one hit) nor gave
    /// back.
    pub(crate) fn unused(&self, index: usize) -> u64 {
        let lease = &self.metrics[index].lease;
        lease.leased_hits.get() - lease.from_slice.get() - lease.returned_hits.get()
    }

    /// Sends `requests` (each `of`) to each replica, `in_flight` at once per replica, all
    /// replicas at once; answers how many each admitted.
    pub(crate) async fn offer(&self, requests: &[u64], of: &Hit, in_flight: u64) -> Vec<u64> {
        let runs = self.replicas.iter().zip(requests).map(|(replica, &count)| {
            let counters = Arc::clone(&replica.counters);
            let request = [of.clone()];
            async move {
                let mut admitted = 0;
                let mut sent = 0;
                while sent < count {
                    let batch = in_flight.min(count - sent);
                    let calls = (0..batch).map(|_| counters.apply(&request));
                    for answer in futures_util::future::join_all(calls).await {
                        admitted += u64::from(answer.unwrap()[0].allowed);
                    }
                    sent += batch;
                }
                admitted
            }
        });
        futures_util::future::join_all(runs).await
    }

    /// Waits until no lease is in flight (the slices then stay as they are).
    pub(crate) async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn replicas_leasing_one_counter_never_admit_more_than_its_limit() {
    const LIMIT: u64 = 6_000;
    let fleet = Fleet::start(4);
    fleet.ready().await;
    // Uneven shares, 10/20/30/40% of 1.5 times the limit.
    let shares = [900, 1_800, 2_700, 3_600];
    let admitted = fleet.offer(&shares, &hit("global", LIMIT, 1), 16).await;
    let total: u64 = admitted.iter().sum();
    assert!(
        total <= LIMIT,
        "admitted {total} of a limit of {LIMIT}: {admitted:?}"
    );
    let calls = fleet.server.script_calls();
    let offered: u64 = shares.iter().sum();
    assert!(
        calls * 5 < offered,
        "{calls} Redis calls for {offered} decisions: leases should answer most of them"
    );

    // Each replica gives back its slices' unused budget, and the load goes on: the window's
    // whole limit is admitted but for what the slices hold unused at the end, no more,
    // however the budget was spread.
    fleet.settle().await;
    for replica in &fleet.replicas {
        replica.leases.as_ref().unwrap().give_back_all().await;
    }
    let more = fleet
        .offer(&[500, 500, 500, 500], &hit("global", LIMIT, 1), 4)
        .await;
    fleet.settle().await;
    let total = total + more.iter().sum::<u64>();
    let unused: u64 = (0..4).map(|index| fleet.unused(index)).sum();
    assert_eq!(total + unused, LIMIT, "first {admitted:?}, then {more:?}");
    // What the slices held unused goes back: Redis then counts exactly what was admitted.
    for replica in &fleet.replicas {
        replica.leases.as_ref().unwrap().give_back_all().await;
    }
    let counter = redis_key(&hit("global", LIMIT, 0), fleet.clock.now());
    assert_eq!(fleet.server.query(&["GET", &counter]), total.to_string());
}

#[tokio::test]
async fn a_replica_lost_with_its_slices_leaves_the_fleet_under_its_limit_by_them() {
    const LIMIT: u64 = 4_000;
    let mut fleet = Fleet::start(3);
    fleet.ready().await;
    let first = fleet
        .offer(&[600, 600, 600], &hit("global", LIMIT, 1), 8)
        .await;
    fleet.settle().await;
    // The third replica is lost: what it held is never returned nor used.
    let lost = fleet.unused(2);
    drop(fleet.replicas.pop());
    let rest = fleet
        .offer(&[3_000, 3_000], &hit("global", LIMIT, 1), 8)
        .await;
    let total = first.iter().sum::<u64>() + rest.iter().sum::<u64>();
    assert!(total <= LIMIT, "admitted {total} of {LIMIT}");
    fleet.settle().await;
    for replica in &fleet.replicas {
        replica.leases.as_ref().unwrap().give_back_all().await;
    }
    let last = fleet
        .offer(&[1_000, 1_000], &hit("global", LIMIT, 1), 4)
        .await;
    fleet.settle().await;
    let total = total + last.iter().sum::<u64>();
    let unused = fleet.unused(0) + fleet.unused(1);
    assert!(lost > 0, "the lost replica held no slice: {first:?}");
    assert_eq!(
        total + unused + lost,
        LIMIT,
        "first {first:?}, then {rest:?}, then {last:?}"
    );
}

const RULES: &str = r#"
domain: api
descriptors:
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 100000, lease: auto}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100000}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
"#;

#[tokio::test]
async fn a_rule_that_leases_answers_from_slices_and_the_others_call_per_request() {
    use common::{Backing, Setup, StoreKind, request, start_with};
    let server = start_with(
        &[("api.yaml", RULES)],
        Setup {
            store: StoreKind::Redis,
            ..Setup::default()
        },
    )
    .await;
    let Backing::Redis(redis) = &server.backing else {
        panic!("a Redis test server")
    };
    let (_, config) = server.http("GET", "/config", "").await;
    assert_eq!(
        config,
        "api.blocked: unit=MINUTE requests_per_unit=0, shadow_mode: false, quota_mode: false\n\
         api.route: unit=MINUTE requests_per_unit=100000 lease=auto, shadow_mode: false, quota_mode: false\n\
         api.user: unit=MINUTE requests_per_unit=100000, shadow_mode: false, quota_mode: false\n"
    );

    let mut client = server.client().await;
    let before = redis.script_calls();
    for _ in 0..1_000 {
        let answer = client
            .should_rate_limit(request("api", &[&[("route", "all")]]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.overall_code, 1, "OK");
    }
    let route_calls = redis.script_calls() - before;
    assert!(
        route_calls < 200,
        "{route_calls} Redis calls for 1000 decisions"
    );
    let (_, metrics) = server.http("GET", "/metrics", "").await;
    let from_slices: u64 = metric(&metrics, "tollgate_lease_slice_decisions_total");
    assert!(
        from_slices + route_calls >= 1_000 && from_slices >= 800,
        "{from_slices} answered from slices, {route_calls} calls"
    );

    // A request whose other descriptor is over consumes nothing on the leased counter,
    // slice or no slice: it goes to Redis whole, which vetoes it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let params = Params {
        algorithm: Algorithm::default(),
        requests: 100_000,
        window: MINUTE,
    };
    let key = counter_key("api", [("route", EntryValue::Actual("all"))], &params);
    let counter = format!("{}:{}", key.as_str(), server.clock.now() / MINUTE);
    let counted = redis.query(&["GET", &counter]);
    let (_, before) = server.http("GET", "/metrics", "").await;
    let vetoed = client
        .should_rate_limit(request("api", &[&[("route", "all")], &[("blocked", "x")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(vetoed.overall_code, 2, "OVER_LIMIT");
    assert_eq!(redis.query(&["GET", &counter]), counted);
    let (_, after) = server.http("GET", "/metrics", "").await;
    assert_eq!(
        metric(&after, "tollgate_lease_slice_decisions_total"),
        metric(&before, "tollgate_lease_slice_decisions_total")
    );

    // Per-user counters are not leased: one call per decision, as without leases.
    let before = redis.script_calls();
    for user in 0..300 {
        let user = format!("u{user}");
        let answer = client
            .should_rate_limit(request("api", &[&[("user", &user)]]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.overall_code, 1, "OK");
    }
    assert_eq!(redis.script_calls() - before, 300);

    // A graceful stop gives the unused budget back: the count is then exactly the hits
    // admitted, and the tally holds what this replica used of its slices.
    let mut server = server;
    server.trigger_stop();
    server.take_task().await.unwrap().unwrap();
    let Backing::Redis(redis) = &server.backing else {
        panic!("a Redis test server")
    };
    assert_eq!(redis.query(&["GET", &counter]), "1000");
    let tally = redis
        .try_query(&["HVALS", &format!("{counter}:leases")])
        .unwrap();
    let held: Vec<u64> = redis::from_redis_value(tally).unwrap();
    assert_eq!(held, [from_slices]);
}

/// A counter's value in the metrics' text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from the metrics"))
}

#[tokio::test]
async fn a_reset_reaches_the_other_replicas_slices_within_their_life() {
    const LIMIT: u64 = 6_000;
    let fleet = Fleet::start(2);
    fleet.ready().await;
    let before = fleet
        .offer(&[1_500, 1_500], &hit("global", LIMIT, 1), 8)
        .await;
    fleet.settle().await;
    assert!(
        fleet.unused(1) > 0,
        "the second replica holds a slice: {before:?}"
    );
    // The first replica resets the counter; the second's slice outlives the reset by at
    // most a slice's life (--deny-cache-max-ttl, 1 s here): past it, what it held before the
    // reset is never used.
    fleet.replicas[0]
        .reset
        .forget(&[hit("global", LIMIT, 1)])
        .await
        .unwrap();
    fleet.clock.advance(1_500_000);
    let after = fleet
        .offer(&[4_000, 4_000], &hit("global", LIMIT, 1), 8)
        .await;
    fleet.settle().await;
    for replica in &fleet.replicas {
        replica.leases.as_ref().unwrap().give_back_all().await;
    }
    let now = fleet.clock.now();
    let counter = redis_key(&hit("global", LIMIT, 0), now);
    let counted: u64 = fleet.server.query(&["GET", &counter]).parse().unwrap();
    let admitted: u64 = after.iter().sum();
    assert_eq!(
        admitted, counted,
        "every hit admitted since the reset was counted since"
    );
    assert!(counted <= LIMIT);
}

#[tokio::test]
async fn cold_counters_under_lease_auto_cost_one_call_each_and_answer_as_without() {
    const USERS: usize = 10_000;
    let clock = ManualClock::at_seconds(T0);
    let (leased_redis, plain_redis) = (RedisServer::start(), RedisServer::start());
    let leased_options = options(&clock, LeaseMode::Auto);
    let plain_options = options(&clock, LeaseMode::Off);
    let metrics = Metrics::default();
    let leased = remote_stack(
        redis(&leased_redis, &leased_options),
        &leased_options,
        &metrics,
    );
    let plain = remote_stack(
        redis(&plain_redis, &plain_options),
        &plain_options,
        &Metrics::default(),
    );
    for store in [&leased, &plain] {
        for _ in 0..200 {
            if store.counters.ping().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let before = (leased_redis.script_calls(), plain_redis.script_calls());
    // Each user twice, far below the busy rate, on a limit of 20 a minute: as leasable as any
    // (a fixed window, large enough, leased by default), never busy.
    let mut decisions = 0;
    for round in 0..2 {
        for user in 0..USERS {
            let user = format!("u{user}");
            let request = [Hit {
                lease: Lease::AsConfigured,
                ..hit(&user, 20, 1)
            }];
            let answer = leased.counters.apply(&request).await.unwrap();
            let expected = plain.counters.apply(&request).await.unwrap();
            assert_eq!(answer, expected, "round {round}, {user}");
            decisions += 1;
        }
    }
    let calls = (
        leased_redis.script_calls() - before.0,
        plain_redis.script_calls() - before.1,
    );
    assert_eq!(calls, (decisions, decisions));
    assert_eq!(metrics.lease.leases.get(), 0);
}
