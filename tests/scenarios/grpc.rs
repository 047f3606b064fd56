//! ShouldRateLimit over a real gRPC listener on 127.0.0.1, with the clock fixed at t = 2222 s
//! (a minute window then has 58 s left, an hour 1378 s, a day 84178 s).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use tollgate::clock::MICROS_PER_SECOND;
use tollgate::limiter::Modes;
use tollgate::pb::rate_limit_descriptor::RateLimitOverride;
use tollgate::server::Options;
use tonic::Code;

const API: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: unlimited
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: a_b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

const MODES: &str = r#"
domain: modes
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quota_layered
    quota_mode: true
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: day, requests_per_unit: 100}
  - key: old
    rate_limit: {unit: minute, requests_per_unit: 1, name: old_limit}
  - key: new
    rate_limit: {unit: minute, requests_per_unit: 3, replaces: [{name: old_limit}]}
"#;

async fn the_three_status_shapes(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    let unknown_domain = server.ok(request("nope", &[&[("user", "x")]])).await;
    assert_eq!(unknown_domain.overall_code, OK);
    assert_eq!(shapes(&unknown_domain), [limited(OK, "-", 0, -1)]);
    let no_rule = server.ok(request("api", &[&[("nothing", "x")]])).await;
    assert_eq!(shapes(&no_rule), [limited(OK, "-", 0, -1)]);
    let unlimited = server.ok(request("api", &[&[("unlimited", "x")]])).await;
    assert_eq!(shapes(&unlimited), [limited(OK, "-", u32::MAX, -1)]);
    let limited_one = server.ok(request("api", &[&[("key2", "x")]])).await;
    assert_eq!(shapes(&limited_one), [limited(OK, "20/MINUTE", 19, 58)]);
    assert_eq!(
        limited_one.statuses[0].current_limit.as_ref().unwrap().name,
        ""
    );
}

async fn a_limit_of_n_admits_n_per_epoch_aligned_window(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    let one = request("api", &[&[("user", "alice")]]);
    for remaining in [2, 1, 0] {
        assert_eq!(
            shapes(&server.ok(one.clone()).await),
            [limited(OK, "3/MINUTE", remaining, 58)]
        );
    }
    let over = server.ok(one.clone()).await;
    assert_eq!(over.overall_code, OVER);
    assert_eq!(shapes(&over), [limited(OVER, "3/MINUTE", 0, 58)]);
    // Another user has a counter of their own.
    assert_eq!(
        shapes(&server.ok(request("api", &[&[("user", "bob")]])).await),
        [limited(OK, "3/MINUTE", 2, 58)]
    );
    // 58 s later a new minute starts (2280 = 38 × 60).
    server.clock.advance(58 * MICROS_PER_SECOND);
    assert_eq!(
        shapes(&server.ok(one).await),
        [limited(OK, "3/MINUTE", 2, 60)]
    );
}

async fn reset_rounds_up_to_whole_seconds(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    server.clock.advance(MICROS_PER_SECOND / 2);
    let response = server.ok(request("api", &[&[("key3", "x")]])).await;
    assert_eq!(shapes(&response), [limited(OK, "10/HOUR", 9, 1378)]);
}

async fn requests_per_unit_zero_is_always_over(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    let response = server.ok(request("api", &[&[("blocked", "x")]])).await;
    assert_eq!(response.overall_code, OVER);
    assert_eq!(shapes(&response), [limited(OVER, "0/SECOND", 0, 1)]);
}

async fn hits_addend_descriptor_value_wins_even_zero_and_request_zero_means_one(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    let mut five = request("api", &[&[("key2", "h")]]);
    five.hits_addend = 5;
    assert_eq!(
        shapes(&server.ok(five.clone()).await),
        [limited(OK, "20/MINUTE", 15, 58)]
    );
    let mut own_two = five.clone();
    own_two.descriptors[0].hits_addend = Some(2);
    assert_eq!(
        shapes(&server.ok(own_two).await),
        [limited(OK, "20/MINUTE", 13, 58)]
    );
    let mut check_only = five.clone();
    check_only.descriptors[0].hits_addend = Some(0);
    assert_eq!(
        shapes(&server.ok(check_only.clone()).await),
        [limited(OK, "20/MINUTE", 13, 58)]
    );
    assert_eq!(
        shapes(&server.ok(check_only).await),
        [limited(OK, "20/MINUTE", 13, 58)]
    );
    let zero = request("api", &[&[("key2", "h")]]);
    assert_eq!(
        shapes(&server.ok(zero).await),
        [limited(OK, "20/MINUTE", 12, 58)]
    );
}

async fn a_request_over_its_hits_is_denied_without_consuming(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    let mut big = request("api", &[&[("key2", "big")]]);
    big.hits_addend = 21;
    assert_eq!(
        shapes(&server.ok(big).await),
        [limited(OVER, "20/MINUTE", 0, 58)]
    );
    let one = request("api", &[&[("key2", "big")]]);
    assert_eq!(
        shapes(&server.ok(one).await),
        [limited(OK, "20/MINUTE", 19, 58)]
    );
}

async fn overrides_apply_when_the_domain_exists(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    let mut with_override = request("api", &[&[("anything", "x")]]);
    with_override.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 10,
        unit: 4, // DAY
    });
    assert_eq!(
        shapes(&server.ok(with_override.clone()).await),
        [limited(OK, "10/DAY", 9, 84_178)]
    );
    assert_eq!(
        shapes(&server.ok(with_override.clone()).await),
        [limited(OK, "10/DAY", 8, 84_178)]
    );
    let mut other_domain = with_override.clone();
    other_domain.domain = "nope".into();
    assert_eq!(
        shapes(&server.ok(other_domain).await),
        [limited(OK, "-", 0, -1)]
    );
    let mut unknown_unit = with_override;
    unknown_unit.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 10,
        unit: 0,
    });
    let error = server.call(unknown_unit).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert_eq!(
        error.message(),
        "descriptors[0].limit.unit: must be one of SECOND|MINUTE|HOUR|DAY|WEEK|MONTH|YEAR, got 0"
    );
}

async fn replaced_limits_report_no_limit_and_are_not_counted(store: StoreKind) {
    let server = start_on(store, &[("modes.yaml", MODES)]).await;
    let both = request("modes", &[&[("old", "x")], &[("new", "x")]]);
    for remaining in [2, 1, 0] {
        let response = server.ok(both.clone()).await;
        assert_eq!(
            shapes(&response),
            [
                limited(OK, "-", 0, -1),
                limited(OK, "3/MINUTE", remaining, 58)
            ]
        );
    }
    // The replaced limit's counter was never touched: alone, it still admits one.
    let alone = server.ok(request("modes", &[&[("old", "x")]])).await;
    assert_eq!(shapes(&alone), [limited(OK, "1/MINUTE", 0, 58)]);
}

async fn a_shadow_rule_reports_but_never_denies(store: StoreKind) {
    let server = start_on(store, &[("modes.yaml", MODES)]).await;
    let shadow = request("modes", &[&[("shadow", "x")]]);
    assert_eq!(
        shapes(&server.ok(shadow.clone()).await),
        [limited(OK, "1/MINUTE", 0, 58)]
    );
    let second = server.ok(shadow).await;
    assert_eq!(second.overall_code, OK);
    assert_eq!(shapes(&second), [limited(OK, "1/MINUTE", 0, 58)]);
}

/// A server with MODES and global `modes`.
async fn with_modes(store: StoreKind, modes: Modes) -> TestServer {
    let options = Options {
        modes,
        ..Options::default()
    };
    let setup = Setup {
        store,
        options,
        ..Setup::default()
    };
    start_with(&[("modes.yaml", MODES)], setup).await
}

async fn global_shadow_mode_answers_ok_and_keeps_statuses(store: StoreKind) {
    let modes = Modes {
        global_shadow: true,
        ..Modes::default()
    };
    let server = with_modes(store, modes).await;
    let plain = request("modes", &[&[("plain", "x")]]);
    server.ok(plain.clone()).await;
    let second = server.ok(plain).await;
    assert_eq!(second.overall_code, OK);
    assert_eq!(shapes(&second), [limited(OVER, "1/MINUTE", 0, 58)]);
}

async fn global_quota_mode_makes_every_rule_a_quota_rule_but_shadow_ones(store: StoreKind) {
    let modes = Modes {
        global_quota: true,
        ..Modes::default()
    };
    let server = with_modes(store, modes).await;
    // `plain` (1/min) and `quota2` (2/min) are both quota limits: over together only.
    let both = request("modes", &[&[("plain", "x")], &[("quota2", "x")]]);
    assert_eq!(server.ok(both.clone()).await.overall_code, OK);
    let one_over = server.ok(both.clone()).await;
    assert_eq!(one_over.overall_code, OK);
    assert_eq!(
        shapes(&one_over),
        [
            limited(OVER, "1/MINUTE", 0, 58),
            limited(OK, "2/MINUTE", 0, 58)
        ]
    );
    assert_eq!(server.ok(both).await.overall_code, OVER);
    // A shadow rule stays a shadow rule: never over overall.
    let shadow = request("modes", &[&[("shadow", "x")]]);
    server.ok(shadow.clone()).await;
    assert_eq!(server.ok(shadow).await.overall_code, OK);
}

async fn quota_mode_is_over_only_when_every_quota_descriptor_is_over(store: StoreKind) {
    let server = start_on(store, &[("modes.yaml", MODES)]).await;
    let both = request("modes", &[&[("quota1", "x")], &[("quota2", "x")]]);
    let first = server.ok(both.clone()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        shapes(&first),
        [
            limited(OK, "1/MINUTE", 0, 58),
            limited(OK, "2/MINUTE", 1, 58)
        ]
    );
    let one_over = server.ok(both.clone()).await;
    assert_eq!(one_over.overall_code, OK);
    assert_eq!(
        shapes(&one_over),
        [
            limited(OVER, "1/MINUTE", 0, 58),
            limited(OK, "2/MINUTE", 0, 58)
        ]
    );
    let all_over = server.ok(both).await;
    assert_eq!(all_over.overall_code, OVER);
    assert_eq!(
        shapes(&all_over),
        [
            limited(OVER, "1/MINUTE", 0, 58),
            limited(OVER, "2/MINUTE", 0, 58)
        ]
    );
    // A regular descriptor over limit makes the request over, whatever the quota says.
    let plain = request("modes", &[&[("plain", "y")]]);
    server.ok(plain).await;
    let mixed = server
        .ok(request("modes", &[&[("plain", "y")], &[("quota1", "z")]]))
        .await;
    assert_eq!(mixed.overall_code, OVER);
    // Nothing was consumed on the quota descriptor, so it still has its one hit.
    assert_eq!(
        shapes(&mixed),
        [
            limited(OVER, "1/MINUTE", 0, 58),
            limited(OK, "1/MINUTE", 1, 58)
        ]
    );
}

async fn a_quota_descriptor_with_several_limits_is_over_when_any_limit_is(store: StoreKind) {
    let server = start_on(store, &[("modes.yaml", MODES)]).await;
    let both = request("modes", &[&[("quota_layered", "x")], &[("plain", "p")]]);
    let first = server.ok(both.clone()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        shapes(&first),
        [
            limited(OK, "1/SECOND", 0, 1),
            limited(OK, "1/MINUTE", 0, 58)
        ]
    );
    // Same second: the only quota descriptor is over, so the request is rejected and, as
    // answered, nothing is consumed (the day limit and `plain` keep their counts).
    let second = server
        .ok(request(
            "modes",
            &[&[("quota_layered", "x")], &[("plain", "q")]],
        ))
        .await;
    assert_eq!(second.overall_code, OVER);
    assert_eq!(
        shapes(&second),
        [
            limited(OVER, "1/SECOND", 0, 1),
            limited(OK, "1/MINUTE", 1, 58)
        ]
    );
    server.clock.advance(tollgate::clock::MICROS_PER_SECOND);
    let third = server
        .ok(request(
            "modes",
            &[&[("quota_layered", "x")], &[("plain", "q")]],
        ))
        .await;
    assert_eq!(third.overall_code, OK);
    assert_eq!(
        shapes(&third),
        [
            limited(OK, "1/SECOND", 0, 1),
            limited(OK, "1/MINUTE", 0, 57)
        ]
    );
}

async fn a_rejected_request_consumes_nothing_on_its_other_descriptors(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    let pair = request("api", &[&[("a", "1")], &[("b", "1")]]);
    assert_eq!(
        shapes(&server.ok(pair.clone()).await),
        [
            limited(OK, "5/MINUTE", 4, 58),
            limited(OK, "1/MINUTE", 0, 58)
        ]
    );
    let rejected = server.ok(pair).await;
    assert_eq!(rejected.overall_code, OVER);
    assert_eq!(
        shapes(&rejected),
        [
            limited(OK, "5/MINUTE", 4, 58),
            limited(OVER, "1/MINUTE", 0, 58)
        ]
    );
    let alone = server.ok(request("api", &[&[("a", "1")]])).await;
    assert_eq!(shapes(&alone), [limited(OK, "5/MINUTE", 3, 58)]);
}

async fn count_denied_counts_every_descriptor_like_the_reference(store: StoreKind) {
    let server = start_with(
        &[("api.yaml", API)],
        Setup {
            store,
            options: counting_denied(),
            ..Setup::default()
        },
    )
    .await;
    let pair = request("api", &[&[("a", "1")], &[("b", "1")]]);
    server.ok(pair.clone()).await;
    let rejected = server.ok(pair).await;
    assert_eq!(
        shapes(&rejected),
        [
            limited(OK, "5/MINUTE", 3, 58),
            limited(OVER, "1/MINUTE", 0, 58)
        ]
    );
    let alone = server.ok(request("api", &[&[("a", "1")]])).await;
    assert_eq!(shapes(&alone), [limited(OK, "5/MINUTE", 2, 58)]);
}

async fn the_reference_two_descriptor_scenario_freezes_the_passing_counter(store: StoreKind) {
    // Reference integration scenario 4 (key2 20/min + key3 10/h, 15 calls): from call 11 the
    // request is over; with all-or-nothing key2 stays at 10 remaining, as the reference's
    // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT promises (without its race).
    let server = start_on(store, &[("api.yaml", API)]).await;
    let both = request("api", &[&[("key2", "r")], &[("key3", "r")]]);
    for call in 1..=15u32 {
        let response = server.ok(both.clone()).await;
        if call <= 10 {
            assert_eq!(response.overall_code, OK, "call {call}");
            assert_eq!(
                shapes(&response),
                [
                    limited(OK, "20/MINUTE", 20 - call, 58),
                    limited(OK, "10/HOUR", 10 - call, 1378)
                ]
            );
        } else {
            assert_eq!(response.overall_code, OVER, "call {call}");
            assert_eq!(
                shapes(&response),
                [
                    limited(OK, "20/MINUTE", 10, 58),
                    limited(OVER, "10/HOUR", 0, 1378)
                ]
            );
        }
    }
}

async fn share_threshold_shares_one_counter_and_plain_wildcards_do_not(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    for _ in 0..10 {
        server
            .ok(request("api", &[&[("files", "files/a.pdf")]]))
            .await;
    }
    let shared = server
        .ok(request("api", &[&[("files", "files/b.csv")]]))
        .await;
    assert_eq!(shapes(&shared), [limited(OVER, "10/HOUR", 0, 1378)]);
    for n in 0..10 {
        let unique = format!("files_no_share/{n}");
        let response = server
            .ok(request("api", &[&[("files_no_share", &unique)]]))
            .await;
        assert_eq!(shapes(&response), [limited(OK, "10/HOUR", 9, 1378)]);
    }
}

async fn separators_in_keys_and_values_never_share_a_counter(store: StoreKind) {
    let server = start_on(store, &[("api.yaml", API)]).await;
    // The reference keys both as `api_a_b_c_…` and would count them together.
    let first = server.ok(request("api", &[&[("a_b", "c")]])).await;
    assert_eq!(shapes(&first), [limited(OK, "1/MINUTE", 0, 58)]);
    let second = server.ok(request("api", &[&[("b", "b_c")]])).await;
    assert_eq!(shapes(&second), [limited(OK, "1/MINUTE", 0, 58)]);
    let colon_one = server.ok(request("api", &[&[("b", "x:y")]])).await;
    let colon_two = server.ok(request("api", &[&[("b", "x"), ("y", "")]])).await;
    assert_eq!(shapes(&colon_one), [limited(OK, "1/MINUTE", 0, 58)]);
    assert_eq!(shapes(&colon_two), [limited(OK, "-", 0, -1)]);
}

async fn two_hundred_concurrent_requests_against_fifty_admit_exactly_fifty(store: StoreKind) {
    let server = start_on(store, &[("hot.yaml", "domain: hot\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 50}\n")]).await;
    let client = server.client().await;
    let calls = (0..200).map(|_| {
        let mut client = client.clone();
        tokio::spawn(async move {
            client
                .should_rate_limit(request("hot", &[&[("k", "v")]]))
                .await
        })
    });
    let mut admitted = 0;
    let mut denied = 0;
    for call in calls {
        let response = call.await.unwrap().unwrap().into_inner();
        match response.overall_code {
            OK => admitted += 1,
            OVER => denied += 1,
            other => panic!("unexpected code {other}"),
        }
    }
    assert_eq!((admitted, denied), (50, 150));
}

on_every_store!(
    the_three_status_shapes,
    a_limit_of_n_admits_n_per_epoch_aligned_window,
    reset_rounds_up_to_whole_seconds,
    requests_per_unit_zero_is_always_over,
    hits_addend_descriptor_value_wins_even_zero_and_request_zero_means_one,
    a_request_over_its_hits_is_denied_without_consuming,
    overrides_apply_when_the_domain_exists,
    replaced_limits_report_no_limit_and_are_not_counted,
    a_shadow_rule_reports_but_never_denies,
    global_shadow_mode_answers_ok_and_keeps_statuses,
    quota_mode_is_over_only_when_every_quota_descriptor_is_over,
    global_quota_mode_makes_every_rule_a_quota_rule_but_shadow_ones,
    a_quota_descriptor_with_several_limits_is_over_when_any_limit_is,
    a_rejected_request_consumes_nothing_on_its_other_descriptors,
    count_denied_counts_every_descriptor_like_the_reference,
    the_reference_two_descriptor_scenario_freezes_the_passing_counter,
    share_threshold_shares_one_counter_and_plain_wildcards_do_not,
    separators_in_keys_and_values_never_share_a_counter,
    two_hundred_concurrent_requests_against_fifty_admit_exactly_fifty,
);

// Besides the scenarios, on the memory store only.
memory_only! {
    #[tokio::test]
    async fn malformed_requests_are_invalid_argument_naming_the_field() {
        let server = start(&[("api.yaml", API)]).await;
        let cases = [
            (
                request("", &[&[("user", "x")]]),
                "domain: must not be empty",
            ),
            (request("api", &[]), "descriptors: must not be empty"),
            (
                request("api", &[&[("user", "x")], &[("", "x")]]),
                "descriptors[1].entries[0].key: must not be empty",
            ),
            (
                request("api", &[&[]]),
                "descriptors[0].entries: must not be empty",
            ),
        ];
        for (bad, message) in cases {
            let error = server.call(bad).await.unwrap_err();
            assert_eq!(
                (error.code(), error.message()),
                (Code::InvalidArgument, message)
            );
        }
    }

    #[tokio::test]
    async fn reflection_lists_and_describes_the_services_as_grpcurl_asks() {
        use prost::Message as _;
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

        let server = start(&[("d.yaml", "domain: d\n")]).await;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = ServerReflectionClient::new(channel);
        let ask = |request: MessageRequest| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        };
        let asks = vec![
            ask(MessageRequest::ListServices(String::new())),
            ask(MessageRequest::FileContainingSymbol(
                "envoy.service.ratelimit.v3.RateLimitService".into(),
            )),
        ];
        let mut answers = client
            .server_reflection_info(futures_util::stream::iter(asks))
            .await
            .unwrap()
            .into_inner();

        let Some(MessageResponse::ListServicesResponse(list)) =
            answers.message().await.unwrap().unwrap().message_response
        else {
            panic!("expected the list of services");
        };
        let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
                "envoy.service.ratelimit.v3.RateLimitService",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
            ]
        );
        let Some(MessageResponse::FileDescriptorResponse(files)) =
            answers.message().await.unwrap().unwrap().message_response
        else {
            panic!("expected the file that defines the service");
        };
        let file = prost_types::FileDescriptorProto::decode(&*files.file_descriptor_proto[0]).unwrap();
        assert_eq!(file.name(), "envoy/service/ratelimit/v3/rls.proto");
        assert_eq!(file.service[0].method[0].name(), "ShouldRateLimit");
    }
}
