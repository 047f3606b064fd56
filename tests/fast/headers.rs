//! `--response-headers`: exact header names and values in each mode, from the descriptor that
//! denies (the one that frees up last), else the one with the least remaining; `Retry-After`
//! on OVER_LIMIT. The clock is at t = 2222 s: a minute has 58 s left, a day 84178 s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use tollgate::headers::HeaderMode;
use tollgate::server::Options;
use tollgate::service::ServiceOptions;

const LIMITS: &str = r#"
domain: h
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 5, name: daily}
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tightday
    rate_limit: {unit: day, requests_per_unit: 1}
"#;

async fn server(mode: HeaderMode) -> TestServer {
    start_with(
        &[("h.yaml", LIMITS)],
        Setup {
            options: Options {
                service: ServiceOptions {
                    response_headers: mode,
                    ..ServiceOptions::default()
                },
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await
}

async fn headers(server: &TestServer, descriptors: &[&[(&str, &str)]]) -> Vec<(String, String)> {
    server
        .ok(request("h", descriptors))
        .await
        .response_headers_to_add
        .into_iter()
        .map(|h| (h.key, h.value))
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The three situations, each mode's expected headers for them.
async fn scenario(mode: HeaderMode, expected: [&[(&str, &str)]; 3]) {
    let server = server(mode).await;
    // One descriptor, allowed.
    assert_eq!(
        headers(&server, &[&[("user", "a")]]).await,
        pairs(expected[0])
    );
    // Two allowed: the daily one has the least remaining (4 of 5 vs 9 of 10).
    assert_eq!(
        headers(&server, &[&[("user", "b")], &[("day", "x")]]).await,
        pairs(expected[1])
    );
    // Use up both tight limits, then: two deny, the one freeing up last is reported, even
    // though an allowed descriptor has less remaining... and Retry-After is added.
    server
        .ok(request("h", &[&[("tight", "z")], &[("tightday", "z")]]))
        .await;
    assert_eq!(
        headers(
            &server,
            &[&[("user", "c")], &[("tight", "z")], &[("tightday", "z")]]
        )
        .await,
        pairs(expected[2])
    );
}

#[tokio::test]
async fn off_adds_nothing() {
    scenario(HeaderMode::Off, [&[], &[], &[]]).await;
}

#[tokio::test]
async fn draft03_is_the_form_envoy_emits() {
    scenario(
        HeaderMode::Draft03,
        [
            &[
                ("X-RateLimit-Limit", "10, 10;w=60"),
                ("X-RateLimit-Remaining", "9"),
                ("X-RateLimit-Reset", "58"),
            ],
            &[
                ("X-RateLimit-Limit", "5, 5;w=86400;name=\"daily\""),
                ("X-RateLimit-Remaining", "4"),
                ("X-RateLimit-Reset", "84178"),
            ],
            &[
                ("X-RateLimit-Limit", "1, 1;w=86400"),
                ("X-RateLimit-Remaining", "0"),
                ("X-RateLimit-Reset", "84178"),
                ("Retry-After", "84178"),
            ],
        ],
    )
    .await;
}

#[tokio::test]
async fn ietf_names_the_policy() {
    scenario(
        HeaderMode::Ietf,
        [
            &[
                ("RateLimit-Policy", "\"default\";q=10;w=60"),
                ("RateLimit", "\"default\";r=9;t=58"),
            ],
            &[
                ("RateLimit-Policy", "\"daily\";q=5;w=86400"),
                ("RateLimit", "\"daily\";r=4;t=84178"),
            ],
            &[
                ("RateLimit-Policy", "\"default\";q=1;w=86400"),
                ("RateLimit", "\"default\";r=0;t=84178"),
                ("Retry-After", "84178"),
            ],
        ],
    )
    .await;
}

/// Exactly the reference's three headers, as its LIMIT_RESPONSE_HEADERS_ENABLED adds them:
/// no `Retry-After` (Envoy's own 429 handling, or the draft03/ietf modes, give that).
#[tokio::test]
async fn legacy_uses_the_reference_names() {
    scenario(
        HeaderMode::Legacy,
        [
            &[
                ("RateLimit-Limit", "10"),
                ("RateLimit-Remaining", "9"),
                ("RateLimit-Reset", "58"),
            ],
            &[
                ("RateLimit-Limit", "5"),
                ("RateLimit-Remaining", "4"),
                ("RateLimit-Reset", "84178"),
            ],
            &[
                ("RateLimit-Limit", "1"),
                ("RateLimit-Remaining", "0"),
                ("RateLimit-Reset", "84178"),
            ],
        ],
    )
    .await;
}

/// The reference's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER.
#[tokio::test]
async fn legacy_headers_can_be_renamed() {
    let server = start_with(
        &[("h.yaml", LIMITS)],
        Setup {
            options: Options {
                service: ServiceOptions {
                    response_headers: HeaderMode::Legacy,
                    legacy_header_names: vec!["X-Quota".into(), "X-Left".into(), "X-Reset".into()],
                    ..ServiceOptions::default()
                },
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    assert_eq!(
        headers(&server, &[&[("user", "a")]]).await,
        pairs(&[("X-Quota", "10"), ("X-Left", "9"), ("X-Reset", "58")])
    );
}

const TAGGED: &str = r#"
domain: m
descriptors:
  - key: tagged
    metadata: {team: payments, tier: {name: gold}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: other
    metadata: {team: search, tier: {level: 2}, extra: 1}
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

#[tokio::test]
async fn dynamic_metadata_describes_the_request_and_merges_the_metadata_of_descriptors_not_over() {
    let server = start_with(
        &[("m.yaml", TAGGED)],
        Setup {
            options: Options {
                service: ServiceOptions {
                    dynamic_metadata: true,
                    ..ServiceOptions::default()
                },
                ..Options::default()
            },
            ..Setup::default()
        },
    )
    .await;
    let mut both = request("m", &[&[("tagged", "a")], &[("other", "b")]]);
    both.hits_addend = 1;
    both.descriptors[1].hits_addend = Some(1);
    let first = server.ok(both.clone()).await;
    assert_eq!(
        struct_json(first.dynamic_metadata.as_ref().unwrap()),
        serde_json::json!({
            "domain": "m",
            "descriptors": [{"entries": ["tagged=a"]}, {"entries": ["other=b"], "hitsAddend": 1.0}],
            "hitsAddend": 1.0,
            "metadata": {"team": "payments", "tier": {"name": "gold", "level": 2.0}, "extra": 1.0}
        })
    );
    // Now "tagged" is over: only the other descriptor's metadata is merged.
    let second = server.ok(both).await;
    assert_eq!(
        struct_json(second.dynamic_metadata.as_ref().unwrap())["metadata"],
        serde_json::json!({"team": "search", "tier": {"level": 2.0}, "extra": 1.0})
    );
    // Off by default.
    let plain = start(&[("m.yaml", TAGGED)]).await;
    assert_eq!(
        plain
            .ok(request("m", &[&[("other", "c")]]))
            .await
            .dynamic_metadata,
        None
    );
}
