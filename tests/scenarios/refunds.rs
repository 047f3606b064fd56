//! Refunds (Envoy's `is_negative_hits`) over gRPC, for every algorithm: spend, refund, spend
//! again with the exact remaining after each step; a refund larger than what was spent; a
//! refund that reopens a limit that was over (the deny cache, on for Redis, must not keep
//! answering the denial); a charge and a refund in one request, vetoed or not; the request's
//! `hits_addend` as the amount. The clock stands still at t = 2222 s, so no budget comes back
//! by itself (a token bucket does not refill, a window does not end).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;

const REFUNDS: &str = r#"
domain: refunds
descriptors:
  - key: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: sliding_window
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 10}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: gcra, burst: 10}
  - key: first_hit
    rate_limit: {unit: minute, requests_per_unit: 10, anchor: first_hit}
  - key: second
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: unlimited
    rate_limit: {unlimited: true}
"#;

const ALGORITHMS: [&str; 7] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "gcra",
    "first_hit",
    "second",
];

/// One descriptor `key=user` with its own hits; a refund when `refund`.
fn part(key: &str, hits: u32, refund: bool) -> tollgate::pb::RateLimitDescriptor {
    tollgate::pb::RateLimitDescriptor {
        hits_addend: Some(u64::from(hits)),
        is_negative_hits: refund,
        ..descriptor(&[(key, "user")])
    }
}

fn of(parts: Vec<tollgate::pb::RateLimitDescriptor>) -> tollgate::pb::RateLimitRequest {
    tollgate::pb::RateLimitRequest {
        domain: "refunds".into(),
        descriptors: parts,
        hits_addend: 0,
    }
}

/// The overall code, then each status's code and remaining.
async fn ask(
    server: &TestServer,
    parts: Vec<tollgate::pb::RateLimitDescriptor>,
) -> (i32, Vec<(i32, u32)>) {
    let response = server.ok(of(parts)).await;
    let statuses = response
        .statuses
        .iter()
        .map(|status| (status.code, status.limit_remaining))
        .collect();
    (response.overall_code, statuses)
}

pub(crate) async fn spend_refund_and_spend_again_exactly(store: StoreKind) {
    let server = start_on(store, &[("refunds.yaml", REFUNDS)]).await;
    // The per-second limit's window has 1 s left: the steps below take far less.
    for key in ALGORITHMS {
        let (limit, step) = if key == "second" { (5, 2) } else { (10, 4) };
        let spend = |hits| part(key, hits, false);
        let refund = |hits| part(key, hits, true);
        assert_eq!(
            ask(&server, vec![spend(step)]).await,
            (OK, vec![(OK, limit - step)]),
            "{key}: spent"
        );
        assert_eq!(
            ask(&server, vec![refund(step - 1)]).await,
            (OK, vec![(OK, limit - 1)]),
            "{key}: refunded"
        );
        assert_eq!(
            ask(&server, vec![spend(2)]).await,
            (OK, vec![(OK, limit - 3)]),
            "{key}: spent again"
        );
        // More than was spent: the budget is full again, never more than full.
        assert_eq!(
            ask(&server, vec![refund(100)]).await,
            (OK, vec![(OK, limit)]),
            "{key}: over-refunded"
        );
        assert_eq!(
            ask(&server, vec![spend(limit)]).await,
            (OK, vec![(OK, 0)]),
            "{key}: the whole budget, not more"
        );
        // Over, twice (the second denial may come from the deny cache), then reopened.
        for _ in 0..2 {
            assert_eq!(
                ask(&server, vec![spend(1)]).await,
                (OVER, vec![(OVER, 0)]),
                "{key}: over"
            );
        }
        assert_eq!(
            ask(&server, vec![refund(1)]).await,
            (OK, vec![(OK, 1)]),
            "{key}: reopened"
        );
        assert_eq!(
            ask(&server, vec![spend(1)]).await,
            (OK, vec![(OK, 0)]),
            "{key}: the refunded hit is admitted at once"
        );
    }
}

pub(crate) async fn a_refund_in_a_vetoed_request_still_gives_back(store: StoreKind) {
    let server = start_on(store, &[("refunds.yaml", REFUNDS)]).await;
    for key in ALGORITHMS {
        let (limit, step) = if key == "second" { (5, 3) } else { (10, 6) };
        ask(&server, vec![part(key, step, false)]).await;
        // A denied charge vetoes the request: the refund is applied all the same, and the
        // refund never vetoes.
        assert_eq!(
            ask(&server, vec![part("blocked", 1, false), part(key, 2, true)]).await,
            (OVER, vec![(OVER, 0), (OK, limit - step + 2)]),
            "{key}: vetoed request"
        );
        // Refund then charge on the same counter, in one request: each on the other's state.
        assert_eq!(
            ask(&server, vec![part(key, 1, true), part(key, 2, false)]).await,
            (OK, vec![(OK, limit - step + 3), (OK, limit - step + 1)]),
            "{key}: refund and charge"
        );
    }
}

pub(crate) async fn the_requests_hits_addend_is_the_refund_and_modes_keep_their_meaning(
    store: StoreKind,
) {
    let server = start_on(store, &[("refunds.yaml", REFUNDS)]).await;
    ask(&server, vec![part("fixed_window", 7, false)]).await;
    // No hits_addend of its own: the request's (where 0 means 1) is given back.
    let mut request = of(vec![descriptor(&[("fixed_window", "user")])]);
    request.descriptors[0].is_negative_hits = true;
    request.hits_addend = 4;
    assert_eq!(shapes(&server.ok(request.clone()).await)[0].2, 7);
    request.hits_addend = 0;
    assert_eq!(shapes(&server.ok(request).await)[0].2, 8);

    // Shadow mode: the shadow counter is given back as it is charged.
    for _ in 0..2 {
        ask(&server, vec![part("shadow", 1, false)]).await;
    }
    assert_eq!(
        ask(&server, vec![part("shadow", 1, true)]).await,
        (OK, vec![(OK, 1)])
    );
    // Quota mode: a refund is not a quota descriptor over its limit.
    ask(&server, vec![part("quota", 2, false)]).await;
    assert_eq!(
        ask(&server, vec![part("quota", 1, true)]).await,
        (OK, vec![(OK, 1)])
    );
    // Unlimited: nothing counted, nothing given back.
    let unlimited = server.ok(of(vec![part("unlimited", 5, true)])).await;
    assert_eq!(shapes(&unlimited), [limited(OK, "-", u32::MAX, -1)]);
    // A counter never charged has nothing to give back: it stays full, and is not created
    // with credit.
    assert_eq!(
        ask(&server, vec![part("gcra", 3, true)]).await,
        (OK, vec![(OK, 10)])
    );
    assert_eq!(
        ask(&server, vec![part("gcra", 10, false)]).await,
        (OK, vec![(OK, 0)])
    );
}

const REFUSING: &str = r#"
domain: refunds
descriptors:
  - key: refused
    rate_limit: {unit: minute, requests_per_unit: 10, refunds: refuse}
  - key: allowed
    rate_limit: {unit: minute, requests_per_unit: 10, refunds: allow}
  - key: as_configured
    rate_limit: {unit: minute, requests_per_unit: 10}
"#;

/// A refund of 10^9: as much as a hostile client may ask for.
const HUGE: u32 = 1_000_000_000;

pub(crate) async fn refused_refunds_change_nothing_and_allowed_ones_never_give_more_than_was_charged(
    store: StoreKind,
) {
    for refuse_all in [false, true] {
        let mut options = tollgate::server::Options::default();
        if refuse_all {
            options.modes.refunds = tollgate::limiter::RefundPolicy::Refuse;
        }
        let server = start_with(
            &[("refunds.yaml", REFUSING)],
            Setup {
                store,
                options,
                ..Setup::default()
            },
        )
        .await;
        let given_back = |key| key == "allowed" || (key == "as_configured" && !refuse_all);
        for key in ["refused", "allowed", "as_configured"] {
            let spend = |hits| part(key, hits, false);
            let refund = |hits| part(key, hits, true);
            assert_eq!(ask(&server, vec![spend(3)]).await, (OK, vec![(OK, 7)]));
            // Refunds of anything up to 10^9: back to a full budget at most, or nothing.
            let after = if given_back(key) { 10 } else { 7 };
            assert_eq!(
                ask(&server, vec![refund(HUGE)]).await,
                (OK, vec![(OK, after)]),
                "{key} with --refunds {}",
                if refuse_all { "refuse" } else { "allow" }
            );
            assert_eq!(
                ask(&server, vec![spend(after)]).await,
                (OK, vec![(OK, 0)]),
                "{key}: the budget, not more"
            );
            assert_eq!(
                ask(&server, vec![spend(1)]).await,
                (OVER, vec![(OVER, 0)]),
                "{key}: over"
            );
        }
        let refused = if refuse_all { 2.0 } else { 1.0 };
        assert_eq!(
            common::rlqs::metric(server.http, "tollgate_refunds_total", "outcome=\"refused\"")
                .await,
            refused
        );
        assert_eq!(
            common::rlqs::metric(server.http, "tollgate_refunds_total", "outcome=\"given\"").await,
            3.0 - refused
        );
    }
}

on_every_store!(
    refused_refunds_change_nothing_and_allowed_ones_never_give_more_than_was_charged,
    spend_refund_and_spend_again_exactly,
    a_refund_in_a_vetoed_request_still_gives_back,
    the_requests_hits_addend_is_the_refund_and_modes_keep_their_meaning
);

// Besides the scenarios, on the memory store only.
memory_only! {
    /// With `--count-denied` denied hits count too, and a refund comes off that count.
    #[tokio::test]
    async fn with_count_denied_a_refund_comes_off_the_count_denied_hits_included() {
        let server = start_with(
            &[("refunds.yaml", REFUNDS)],
            Setup {
                options: counting_denied(),
                ..Setup::default()
            },
        )
        .await;
        ask(&server, vec![part("fixed_window", 10, false)]).await;
        assert_eq!(
            ask(&server, vec![part("fixed_window", 2, false)]).await,
            (OVER, vec![(OVER, 0)])
        );
        // 12 counted: a refund of 2 leaves it at the limit still, 3 more leave room for 3.
        assert_eq!(
            ask(&server, vec![part("fixed_window", 2, true)]).await,
            (OK, vec![(OK, 0)])
        );
        assert_eq!(
            ask(&server, vec![part("fixed_window", 3, true)]).await,
            (OK, vec![(OK, 3)])
        );
    }

    /// Refunds count in `total_negative_hits` alone, in /metrics and in the reference's stats.
    #[tokio::test]
    async fn refunds_count_as_negative_hits_and_in_no_other_counter() {
        let server = start(&[("refunds.yaml", REFUNDS)]).await;
        ask(&server, vec![part("fixed_window", 6, false)]).await;
        ask(&server, vec![part("fixed_window", 4, true)]).await;
        ask(&server, vec![part("blocked", 1, false), part("fixed_window", 1, true)]).await;
        let text = server.http("GET", "/metrics", "").await.1;
        let value = |name: &str| {
            let prefix = format!("tollgate_{name}{{domain=\"refunds\",limit=\"refunds.fixed_window\"}} ");
            text.lines()
                .find_map(|line| line.strip_prefix(&prefix))
                .map(|value| value.parse::<u64>().unwrap())
        };
        assert_eq!(value("total_hits_total"), Some(6));
        assert_eq!(value("within_limit_total"), Some(6));
        assert_eq!(value("total_negative_hits_total"), Some(5));
        let stats = tollgate::metrics::reference::stat_totals(&text);
        assert_eq!(
            stats.get("ratelimit.service.rate_limit.refunds.fixed_window.total_negative_hits"),
            Some(&5)
        );
        assert_eq!(
            stats.get("ratelimit.service.rate_limit.refunds.fixed_window.total_hits"),
            Some(&6)
        );
    }
}
