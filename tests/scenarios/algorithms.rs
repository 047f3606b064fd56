//! Each algorithm's signature behaviour through the gRPC server on every store (a contract test
//! per store: memory, redis, cluster), with a
//! hand-driven clock starting at t = 2222 s, and several limits on one descriptor.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use tollgate::clock::MICROS_PER_SECOND;

const SECOND: u64 = MICROS_PER_SECOND;

const ALGO: &str = r#"
domain: algo
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 5}
  - key: gcra
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra, burst: 5}
  - key: push
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log, min_interval: 3s}
  - key: ten_seconds
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 2}
  - key: layered
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5}
  - key: first
    rate_limit: {unit: minute, requests_per_unit: 1, anchor: first_hit}
"#;

async fn server(store: StoreKind) -> TestServer {
    start_on(store, &[("algo.yaml", ALGO)]).await
}

async fn one(server: &TestServer, key: &str) -> (i32, String, u32, i64) {
    let response = server.ok(request("algo", &[&[(key, "x")]])).await;
    assert_eq!(response.statuses.len(), 1);
    shape(&response.statuses[0])
}

async fn fixed_window_lets_twice_the_limit_through_a_boundary_and_sliding_log_does_not(
    store: StoreKind,
) {
    let server = server(store).await;
    // Half a second before the minute boundary at 2280 s.
    server.clock.advance(57 * SECOND + SECOND / 2);
    for remaining in [2, 1, 0] {
        assert_eq!(
            one(&server, "fixed").await,
            limited(OK, "3/MINUTE", remaining, 1)
        );
        assert_eq!(
            one(&server, "log").await,
            limited(OK, "3/MINUTE", remaining, 60)
        );
    }
    server.clock.advance(SECOND);
    for remaining in [2, 1, 0] {
        assert_eq!(
            one(&server, "fixed").await,
            limited(OK, "3/MINUTE", remaining, 60)
        );
    }
    // The log still holds the 3 hits of one second ago: the next fits 59 s from now.
    assert_eq!(one(&server, "log").await, limited(OVER, "3/MINUTE", 0, 59));
}

async fn sliding_window_weights_the_previous_minute(store: StoreKind) {
    let server = server(store).await;
    server.clock.advance(57 * SECOND); // 2279 s: the last second of a minute
    for remaining in (0..10).rev() {
        assert_eq!(
            one(&server, "sliding").await,
            limited(OK, "10/MINUTE", remaining, 61)
        );
    }
    server.clock.advance(16 * SECOND); // 2295 s: 15 s into the next minute, 45/60 of 10 count
    assert_eq!(
        one(&server, "sliding").await,
        limited(OK, "10/MINUTE", 1, 105)
    );
    assert_eq!(
        one(&server, "sliding").await,
        limited(OK, "10/MINUTE", 0, 105)
    );
    // 7.5 + 2 = 9.5: one more fits when the carried part is 7, at 18 s.
    assert_eq!(
        one(&server, "sliding").await,
        limited(OVER, "10/MINUTE", 0, 3)
    );
    server.clock.advance(3 * SECOND);
    assert_eq!(
        one(&server, "sliding").await,
        limited(OK, "10/MINUTE", 0, 102)
    );
}

async fn token_bucket_and_gcra_admit_the_burst_then_one_per_second(store: StoreKind) {
    for key in ["bucket", "gcra"] {
        let server = server(store).await;
        for (remaining, reset) in [(4, 1), (3, 2), (2, 3), (1, 4), (0, 5)] {
            assert_eq!(
                one(&server, key).await,
                limited(OK, "1/SECOND", remaining, reset),
                "{key}"
            );
        }
        assert_eq!(
            one(&server, key).await,
            limited(OVER, "1/SECOND", 0, 1),
            "{key}"
        );
        server.clock.advance(SECOND);
        assert_eq!(
            one(&server, key).await,
            limited(OK, "1/SECOND", 0, 5),
            "{key}"
        );
        server.clock.advance(SECOND / 2);
        assert_eq!(
            one(&server, key).await,
            limited(OVER, "1/SECOND", 0, 1),
            "{key}"
        );
        server.clock.advance(SECOND / 2);
        assert_eq!(
            one(&server, key).await,
            limited(OK, "1/SECOND", 0, 5),
            "{key}"
        );
    }
}

async fn min_interval_denies_a_hit_1s_after_the_last_and_admits_one_3s_after(store: StoreKind) {
    let server = server(store).await;
    assert_eq!(one(&server, "push").await, limited(OK, "10/MINUTE", 9, 60));
    server.clock.advance(SECOND);
    assert_eq!(one(&server, "push").await, limited(OVER, "10/MINUTE", 0, 2));
    server.clock.advance(2 * SECOND);
    assert_eq!(one(&server, "push").await, limited(OK, "10/MINUTE", 8, 60));
}

async fn a_ten_second_window_is_reported_with_its_multiplier(store: StoreKind) {
    let server = server(store).await;
    // 2222 s: the 10-second window started at 2220.
    assert_eq!(
        one(&server, "ten_seconds").await,
        limited(OK, "2/SECOND", 1, 8)
    );
    assert_eq!(
        one(&server, "ten_seconds").await,
        limited(OK, "2/SECOND", 0, 8)
    );
    let over = server.ok(request("algo", &[&[("ten_seconds", "x")]])).await;
    assert_eq!(shape(&over.statuses[0]), limited(OVER, "2/SECOND", 0, 8));
    assert_eq!(
        over.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .unit_multiplier,
        Some(10)
    );
    server.clock.advance(8 * SECOND);
    assert_eq!(
        one(&server, "ten_seconds").await,
        limited(OK, "2/SECOND", 1, 10)
    );
}

async fn per_second_and_per_minute_on_one_descriptor_report_the_tighter_and_share_nothing_on_denial(
    store: StoreKind,
) {
    let server = server(store).await;
    // 2222 s; the minute ends at 2280.
    assert_eq!(one(&server, "layered").await, limited(OK, "2/SECOND", 1, 1));
    assert_eq!(one(&server, "layered").await, limited(OK, "2/SECOND", 0, 1));
    assert_eq!(
        one(&server, "layered").await,
        limited(OVER, "2/SECOND", 0, 1)
    );
    server.clock.advance(SECOND);
    assert_eq!(one(&server, "layered").await, limited(OK, "2/SECOND", 1, 1));
    assert_eq!(one(&server, "layered").await, limited(OK, "2/SECOND", 0, 1));
    server.clock.advance(SECOND);
    // Had the denied third call consumed on the minute limit, this one would be over.
    assert_eq!(
        one(&server, "layered").await,
        limited(OK, "5/MINUTE", 0, 56)
    );
    assert_eq!(
        one(&server, "layered").await,
        limited(OVER, "5/MINUTE", 0, 56)
    );
}

async fn first_hit_anchor_counts_a_minute_from_the_first_hit(store: StoreKind) {
    let server = server(store).await;
    assert_eq!(one(&server, "first").await, limited(OK, "1/MINUTE", 0, 60));
    server.clock.advance(59 * SECOND);
    assert_eq!(one(&server, "first").await, limited(OVER, "1/MINUTE", 0, 1));
    server.clock.advance(SECOND);
    assert_eq!(one(&server, "first").await, limited(OK, "1/MINUTE", 0, 60));
}

on_every_store!(
    per_second_and_per_minute_on_one_descriptor_report_the_tighter_and_share_nothing_on_denial,
    fixed_window_lets_twice_the_limit_through_a_boundary_and_sliding_log_does_not,
    sliding_window_weights_the_previous_minute,
    token_bucket_and_gcra_admit_the_burst_then_one_per_second,
    min_interval_denies_a_hit_1s_after_the_last_and_admits_one_3s_after,
    a_ten_second_window_is_reported_with_its_multiplier,
    first_hit_anchor_counts_a_minute_from_the_first_hit,
);
