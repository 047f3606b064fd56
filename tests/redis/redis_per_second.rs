//! Per-second limits in a Redis of their own (`--store-per-second`): each counter lives in
//! the store its unit says, counts exactly, and a request with limits in both stores is
//! all-or-nothing across them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::redis_process::RedisServer;

use common::{Backing, OK, OVER, StoreKind, limited, request, shapes, start_on};
use tollgate::clock::MICROS_PER_SECOND;

const RULES: &str = r#"
domain: split
descriptors:
  - key: fast
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: slow
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: layered
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: minute, requests_per_unit: 2}
"#;

fn servers(backing: &Backing) -> (&RedisServer, &RedisServer) {
    match backing {
        Backing::PerSecond(main, fast) => (main, fast),
        _ => panic!("expected two Redis servers"),
    }
}

#[tokio::test]
async fn each_limit_counts_in_the_store_of_its_unit_and_a_request_over_either_consumes_in_neither()
{
    let server = start_on(StoreKind::PerSecond, &[("split.yaml", RULES)]).await;
    let (main, fast) = servers(&server.backing);

    // Alone, each side is exact: 2 per second, 3 per minute.
    let only_fast = request("split", &[&[("fast", "a")]]);
    assert_eq!(server.ok(only_fast.clone()).await.overall_code, OK);
    assert_eq!(server.ok(only_fast.clone()).await.overall_code, OK);
    assert_eq!(server.ok(only_fast).await.overall_code, OVER);
    assert_eq!((main.dbsize(), fast.dbsize()), (0, 1));

    // Both in one request: the per-second counter ("fast", b) denies on the third call, and
    // the per-minute one, counted in the other Redis, is given back.
    let both = request("split", &[&[("fast", "b")], &[("slow", "b")]]);
    let first = server.ok(both.clone()).await;
    assert_eq!(
        shapes(&first),
        [
            limited(OK, "2/SECOND", 1, 1),
            limited(OK, "3/MINUTE", 2, 58)
        ]
    );
    server.ok(both.clone()).await;
    let denied = server.ok(both).await;
    assert_eq!(denied.overall_code, OVER);
    assert_eq!(
        shapes(&denied),
        [
            limited(OVER, "2/SECOND", 0, 1),
            limited(OK, "3/MINUTE", 1, 58)
        ],
        "the per-minute counter reports what it has after the refund"
    );
    assert_eq!((main.dbsize(), fast.dbsize()), (1, 2));

    // The per-minute counter kept its one unit of room: exactly one more call fits.
    let slow = request("split", &[&[("slow", "b")]]);
    assert_eq!(
        shapes(&server.ok(slow.clone()).await),
        [limited(OK, "3/MINUTE", 0, 58)]
    );
    assert_eq!(server.ok(slow).await.overall_code, OVER);

    // And the other way round: the per-minute side denies, the per-second side gives back.
    let reverse = request("split", &[&[("fast", "c")], &[("slow", "b")]]);
    let vetoed = server.ok(reverse).await;
    assert_eq!(
        shapes(&vetoed),
        [
            limited(OK, "2/SECOND", 2, 1),
            limited(OVER, "3/MINUTE", 0, 58)
        ]
    );
}

#[tokio::test]
async fn one_descriptor_with_a_per_second_and_a_per_minute_limit_is_all_or_nothing() {
    let server = start_on(StoreKind::PerSecond, &[("split.yaml", RULES)]).await;
    let layered = request("split", &[&[("layered", "x")]]);
    for remaining in [1, 0] {
        let response = server.ok(layered.clone()).await;
        assert_eq!(response.overall_code, OK);
        assert_eq!(shapes(&response)[0].2, remaining);
    }
    // The per-minute limit denies; what the per-second counter took is given back each time.
    for _ in 0..4 {
        assert_eq!(server.ok(layered.clone()).await.overall_code, OVER);
    }
    let (main, fast) = servers(&server.backing);
    assert_eq!((main.dbsize(), fast.dbsize()), (1, 1));
    server.clock.advance(60 * MICROS_PER_SECOND);
    let next_minute = server.ok(layered).await;
    assert_eq!(next_minute.overall_code, OK);
    assert_eq!(
        shapes(&next_minute)[0].2,
        1,
        "2/min: one left after this hit"
    );
}

/// Refunds on the split: per-second counters in one Redis, the others in the other, a request
/// that refunds on one and charges on the other still all-or-nothing for its charges.
#[tokio::test]
async fn refunds_on_the_per_second_split() {
    use crate::refunds::*;
    spend_refund_and_spend_again_exactly(StoreKind::PerSecond).await;
    a_refund_in_a_vetoed_request_still_gives_back(StoreKind::PerSecond).await;
    the_requests_hits_addend_is_the_refund_and_modes_keep_their_meaning(StoreKind::PerSecond).await;
}
