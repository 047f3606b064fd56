//! Leases of buckets (token bucket, GCRA) on a real redis-server: the lease layout takes what
//! the algorithm's Rust lease takes, step for step, and counts as holders the replicas whose
//! slices still live; a bucket's return goes back only while the bucket is as its lease left
//! it; and replicas leasing one busy bucket share its burst and its refill without exceeding
//! them, most decisions answered from slices. (That slices are used only within their life,
//! with the life's refill held back, is held by the property tests of `algorithm::leased` and
//! `storage::lease`, whose instants a test chooses.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::redis_process::RedisServer;
use tollgate::algorithm::{Algorithm, Params, leased};
use tollgate::clock::{MICROS_PER_SECOND, ManualClock, Micros};
use tollgate::limit::Lease;
use tollgate::storage::keys::{EntryValue, counter_key};
use tollgate::storage::options::LeaseMode;
use tollgate::storage::{CounterLease, Hit, Role, StoreClock};

use super::leases::{Fleet, options, ready, redis};

const T0: u64 = 1_795_000_020;
const MINUTE: Micros = 60 * MICROS_PER_SECOND;

fn bucket(algorithm: Algorithm, requests: u64, hits: u64) -> Hit {
    let params = Params {
        algorithm,
        requests,
        window: MINUTE,
    };
    Hit {
        descriptor: 0,
        key: counter_key("lease", [("route", EntryValue::Actual("bucket"))], &params),
        params,
        hits,
        role: Role::Enforced,
        charge: tollgate::algorithm::Charge::IfAllowed,
        lease: Lease::Auto,
    }
}

#[tokio::test]
async fn a_buckets_lease_takes_what_its_algorithm_takes_and_goes_back_only_as_left() {
    let server = RedisServer::start();
    let clock = ManualClock::at_seconds(T0);
    let options = options(&clock, LeaseMode::Off);
    let (a, b) = (redis(&server, &options), redis(&server, &options));
    ready(&a).await;
    ready(&b).await;
    let now = a
        .instant(&bucket(Algorithm::Gcra { burst: 1 }, 100, 0))
        .unwrap();
    let second = MICROS_PER_SECOND;
    for algorithm in [
        Algorithm::TokenBucket { burst: 100 },
        Algorithm::Gcra { burst: 100 },
    ] {
        let of = |hits| bucket(algorithm, 100, hits);
        // 100 a minute, a burst of 100, full: a lease for 1 s holds back its refill (1.67
        // hits) and takes 30; 68 and a third are left, full again in 19 s.
        let first = a.lease(&of(30), now, 0, second).await.unwrap();
        assert_eq!(
            (
                first.granted,
                first.unleased,
                first.reset_after,
                first.holders
            ),
            (30, 68, 19_000_001, 1),
            "{algorithm}"
        );
        let (mut state, taken) = leased::lease(&of(0).params, None, now, 30, second);
        assert_eq!(
            (first.granted, first.unleased, first.reset_after),
            (taken.granted, taken.remaining, taken.reset_after)
        );
        assert_eq!(first.after, state);
        // Then as the Rust lease answers, step for step, whoever leases.
        let steps = [
            (now, 50, 10 * second),
            (now + 2 * second, 100, second),
            (now + 30 * second, 5, 20 * second),
            (now + 31 * second, 100, 40 * second),
        ];
        for (at, want, life) in steps {
            let grant = b.lease(&of(want), at, 0, life).await.unwrap();
            let (after, taken) = leased::lease(&of(0).params, state.as_ref(), at, want, life);
            assert_eq!(
                (
                    grant.granted,
                    grant.unleased,
                    grant.reset_after,
                    &grant.after
                ),
                (taken.granted, taken.remaining, taken.reset_after, &after),
                "{algorithm}: {want} at {at} for {life}"
            );
            state = after.or(state);
        }
        // A return goes back only while the bucket is as its lease left it: a's first lease
        // has been followed by b's, b's last is the bucket's state.
        let at = now + 40 * second;
        let taken = a.lease(&of(10), at, 0, second).await.unwrap();
        assert_eq!(taken.granted, 10, "{algorithm}");
        let taken_after = b.lease(&of(5), at, 0, second).await.unwrap();
        assert_eq!(
            (taken_after.granted, taken_after.holders),
            (5, 2),
            "{algorithm}"
        );
        let back = a.give_back_lease(&of(10), at, taken.after.as_ref()).await;
        assert_eq!(back.unwrap(), 0, "{algorithm}");
        let back = b
            .give_back_lease(&of(5), at, taken_after.after.as_ref())
            .await;
        assert_eq!(back.unwrap(), 5, "{algorithm}");
        // The 5 are back: a lease now finds what it found before b took them.
        let again = b.lease(&of(100), at, 0, second).await.unwrap();
        assert_eq!(again.granted, taken_after.unleased + 5, "{algorithm}");
        // Once a's slice has ended, only b holds one.
        let later = b.lease(&of(1), at + 2 * second, 0, second).await.unwrap();
        assert_eq!((later.granted, later.holders), (1, 1), "{algorithm}");
    }
}

#[tokio::test]
async fn replicas_leasing_one_bucket_share_its_burst_and_refill_without_exceeding_them() {
    const LIMIT: u64 = 6_000;
    let fleet = Fleet::start(4);
    fleet.ready().await;
    let of = bucket(Algorithm::Gcra { burst: LIMIT }, LIMIT, 1);
    // At one instant a bucket admits its burst at most, whoever asks, however leased.
    let shares = [900, 1_800, 2_700, 3_600];
    let admitted = fleet.offer(&shares, &of, 16).await;
    let total: u64 = admitted.iter().sum();
    assert!(
        total <= LIMIT,
        "admitted {total} of a burst of {LIMIT}: {admitted:?}"
    );
    let calls = fleet.server.script_calls();
    let offered: u64 = shares.iter().sum();
    assert!(
        calls * 5 < offered,
        "{calls} Redis calls for {offered} decisions: leases should answer most of them"
    );
    let leased: u64 = (0..4)
        .map(|index| fleet.metrics[index].lease.leased_hits.get())
        .sum();
    assert!(leased > 0, "no lease taken");
    // Ten seconds on, 1,000 more have refilled: in all, at most the burst and them.
    fleet.clock.advance(10 * MICROS_PER_SECOND);
    let more = fleet.offer(&[1_000, 1_000, 1_000, 1_000], &of, 8).await;
    let total = total + more.iter().sum::<u64>();
    assert!(
        total <= LIMIT + 1_000,
        "admitted {total} of a burst of {LIMIT} and 1,000 refilled: {admitted:?} then {more:?}"
    );
    fleet.settle().await;
}
