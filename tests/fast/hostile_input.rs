//! No request can crash or hang the server: oversized, numerous and odd inputs each get an
//! answer or INVALID_ARGUMENT, and the server keeps serving afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use tollgate::descriptor::InputLimits;
use tollgate::pb;
use tollgate::server::Options;
use tollgate::service::ServiceOptions;
use tonic::Code;

const PER_VALUE: &str = "domain: h\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

#[tokio::test]
async fn oversized_and_numerous_inputs_get_invalid_argument() {
    let server = start(&[("h.yaml", PER_VALUE)]).await;
    let big = "x".repeat(64 * 1024);
    let cases: Vec<(pb::RateLimitRequest, &str)> = vec![
        (
            request("h", &[&[("user", &big)]]),
            "descriptors[0].entries[0].value: 65536 bytes is over the limit of 4096",
        ),
        (
            request("h", &[&[(&big, "v")]]),
            "descriptors[0].entries[0].key: 65536 bytes is over the limit of 256",
        ),
        (
            request(&big, &[&[("user", "v")]]),
            "domain: 65536 bytes is over the limit of 4096",
        ),
        (
            request("h", &vec![&[("user", "v")][..]; 1000]),
            "descriptors: 1000 descriptors is over the limit of 64",
        ),
        (
            request("h", &[&vec![("user", "v"); 100]]),
            "descriptors[0].entries: 100 entries is over the limit of 16",
        ),
    ];
    for (bad, message) in cases {
        let error = server.call(bad).await.unwrap_err();
        assert_eq!(
            (error.code(), error.message()),
            (Code::InvalidArgument, message)
        );
    }
    let mut huge_hits = request("h", &[&[("user", "v")]]);
    huge_hits.descriptors[0].hits_addend = Some(u64::MAX);
    let error = server.call(huge_hits).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert_eq!(
        error.message(),
        "descriptors[0].hits_addend: 18446744073709551615 is over the limit of 1000000000"
    );
    // Still serving.
    assert_eq!(
        shapes(&server.ok(request("h", &[&[("user", "after")]])).await),
        [limited(OK, "1/MINUTE", 0, 58)]
    );
}

#[tokio::test]
async fn raised_bounds_admit_64_kib_values_and_1000_descriptors() {
    let options = Options {
        service: ServiceOptions {
            input_limits: InputLimits {
                max_descriptors: 1000,
                max_value_bytes: 64 * 1024,
                ..InputLimits::default()
            },
            ..ServiceOptions::default()
        },
        ..Options::default()
    };
    let server = start_with(
        &[("h.yaml", PER_VALUE)],
        Setup {
            options,
            ..Setup::default()
        },
    )
    .await;
    let big = "x".repeat(64 * 1024);
    assert_eq!(
        shapes(&server.ok(request("h", &[&[("user", &big)]])).await),
        [limited(OK, "1/MINUTE", 0, 58)]
    );
    let mut longer = big.clone();
    longer.pop();
    longer.push('y');
    assert_eq!(
        shapes(&server.ok(request("h", &[&[("user", &longer)]])).await),
        [limited(OK, "1/MINUTE", 0, 58)]
    );
    let values: Vec<String> = (0..1000).map(|n| format!("u{n}")).collect();
    let descriptors: Vec<pb::RateLimitDescriptor> =
        values.iter().map(|v| descriptor(&[("user", v)])).collect();
    let many = pb::RateLimitRequest {
        domain: "h".into(),
        descriptors,
        hits_addend: 0,
    };
    let response = server.ok(many).await;
    assert_eq!(response.statuses.len(), 1000);
    assert!(
        response
            .statuses
            .iter()
            .all(|s| shape(s) == limited(OK, "1/MINUTE", 0, 58))
    );
}

#[tokio::test]
async fn odd_characters_are_values_like_any_other_with_counters_of_their_own() {
    let server = start(&[("h.yaml", PER_VALUE)]).await;
    let odd = [
        "{",
        "}",
        "{tag}",
        ":",
        "a:b",
        "_",
        "a_b",
        "\0",
        "a\0b",
        "ü",
        "日本語",
        "🦀",
        "",
        " ",
    ];
    for value in odd {
        let first = server.ok(request("h", &[&[("user", value)]])).await;
        assert_eq!(
            shapes(&first),
            [limited(OK, "1/MINUTE", 0, 58)],
            "value {value:?}"
        );
    }
    for value in odd {
        let second = server.ok(request("h", &[&[("user", value)]])).await;
        assert_eq!(
            shapes(&second),
            [limited(OVER, "1/MINUTE", 0, 58)],
            "value {value:?}"
        );
    }
}

#[tokio::test]
async fn a_flood_of_new_keys_keeps_a_live_counter_and_leaves_room_for_new_users_of_every_rule() {
    const DAILY: &str = "domain: f\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 10}\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    let server = start_with(
        &[("f.yaml", DAILY)],
        Setup {
            max_keys: 1_024,
            ..Setup::default()
        },
    )
    .await;
    let victim = || request("f", &[&[("user", "victim")]]);
    // Half its day's limit before the flood: a counter the flood could take room from, were
    // it not in use.
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += u32::from(server.ok(victim()).await.overall_code == OK);
    }
    // Three times the store's bound in new keys, each counted once for the day; between
    // them, the victim again, and new users of the other rule.
    let tenant = |name: &str| request("f", &[&[("tenant", name)]]);
    for user in 0..3_072 {
        let flood = server
            .call(request("f", &[&[("user", &format!("u{user}"))]]))
            .await;
        assert_eq!(
            flood.map(|answer| answer.overall_code).ok(),
            Some(OK),
            "u{user}"
        );
        if user % 128 == 0 {
            admitted += u32::from(server.ok(victim()).await.overall_code == OK);
        }
        if user % 256 == 0 {
            let answer = server.ok(tenant(&format!("during-{user}"))).await;
            assert_eq!(
                answer.statuses[0].limit_remaining, 99,
                "a tenant during the flood"
            );
        }
    }
    let answer = server.ok(tenant("after")).await;
    assert_eq!(
        answer.statuses[0].limit_remaining, 99,
        "a tenant after the flood"
    );
    for _ in 0..20 {
        admitted += u32::from(server.ok(victim()).await.overall_code == OK);
    }
    assert_eq!(
        admitted, 10,
        "the live daily counter admits its limit and no more"
    );
    let (_, metrics) = server.http("GET", "/metrics", "").await;
    let line = |name: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in /metrics"))
            .to_owned()
    };
    assert_eq!(
        line("tollgate_memory_refusals_total"),
        "tollgate_memory_refusals_total 0"
    );
    let evicted: u64 = line("tollgate_memory_evictions_total")
        .rsplit(' ')
        .next()
        .and_then(|count| count.parse().ok())
        .unwrap();
    assert!(evicted >= 3_072 + 12 - 1_024, "{evicted}");
}
