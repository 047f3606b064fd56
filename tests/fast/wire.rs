//! Wire compatibility with Envoy's RLS v3 messages, proven on bytes assembled by hand from
//! Envoy's field numbers and types (envoy/service/ratelimit/v3/rls.proto and
//! envoy/extensions/common/ratelimit/v3/ratelimit.proto), independent of our proto files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use prost::Message;
use tollgate::pb::{self, rate_limit_descriptor as desc, rate_limit_response as rls};

/// A RateLimitRequest as Envoy encodes it: domain "d", one descriptor (entry k=v, override
/// 10/DAY, hits_addend 7, is_negative_hits), request hits_addend 5.
const REQUEST: &[u8] = &[
    0x0a, 0x01, b'd', // 1: domain (string)
    0x12, 0x14, // 2: descriptors (message, 20 bytes)
    0x0a, 0x06, // . 1: entries (message, 6 bytes)
    0x0a, 0x01, b'k', // . . 1: key
    0x12, 0x01, b'v', // . . 2: value
    0x12, 0x04, // . 2: limit (RateLimitOverride, 4 bytes)
    0x08, 0x0a, // . . 1: requests_per_unit = 10
    0x10, 0x04, // . . 2: unit = DAY (envoy.type.v3.RateLimitUnit)
    0x1a, 0x02, // . 3: hits_addend (google.protobuf.UInt64Value, 2 bytes)
    0x08, 0x07, // . . 1: value = 7
    0x20, 0x01, // . 4: is_negative_hits (bool) = true (Envoy 1.38+)
    0x18, 0x05, // 3: hits_addend (uint32) = 5
];

/// A RateLimitResponse as Envoy expects it, fields in number order.
const RESPONSE: &[u8] = &[
    0x08, 0x02, // 1: overall_code = OVER_LIMIT
    0x12, 0x11, // 2: statuses (DescriptorStatus, 17 bytes)
    0x08, 0x02, // . 1: code = OVER_LIMIT
    0x12, 0x07, // . 2: current_limit (RateLimit, 7 bytes)
    0x08, 0x0a, // . . 1: requests_per_unit = 10
    0x10, 0x07, // . . 2: unit = WEEK (RateLimitResponse.RateLimit.Unit numbers WEEK 7)
    0x1a, 0x01, b'n', // . . 3: name = "n"
    0x18, 0x03, // . 3: limit_remaining = 3
    0x22, 0x02, // . 4: duration_until_reset (google.protobuf.Duration, 2 bytes)
    0x08, 0x3a, // . . 1: seconds = 58
    0x1a, 0x06, // 3: response_headers_to_add (HeaderValue, 6 bytes)
    0x0a, 0x01, b'a', // . 1: key
    0x12, 0x01, b'b', // . 2: value
];

fn expected_response() -> pb::RateLimitResponse {
    pb::RateLimitResponse {
        overall_code: rls::Code::OverLimit as i32,
        statuses: vec![rls::DescriptorStatus {
            code: rls::Code::OverLimit as i32,
            current_limit: Some(rls::RateLimit {
                name: "n".into(),
                requests_per_unit: 10,
                unit: rls::rate_limit::Unit::Week as i32,
                unit_multiplier: None,
            }),
            limit_remaining: 3,
            duration_until_reset: Some(prost_types::Duration {
                seconds: 58,
                nanos: 0,
            }),
            quota: None,
        }],
        response_headers_to_add: vec![pb::envoy::config::core::v3::HeaderValue {
            key: "a".into(),
            value: "b".into(),
            raw_value: Vec::new(),
        }],
        ..Default::default()
    }
}

#[test]
fn envoy_request_bytes_decode_field_by_field() {
    let request = pb::RateLimitRequest::decode(REQUEST).unwrap();
    assert_eq!(
        request,
        pb::RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![pb::RateLimitDescriptor {
                entries: vec![desc::Entry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                limit: Some(desc::RateLimitOverride {
                    requests_per_unit: 10,
                    unit: pb::envoy::r#type::v3::RateLimitUnit::Day as i32,
                }),
                hits_addend: Some(7),
                is_negative_hits: true,
            }],
            hits_addend: 5,
        }
    );
}

#[test]
fn envoy_response_bytes_decode_to_our_types_and_ours_round_trip() {
    assert_eq!(
        pb::RateLimitResponse::decode(RESPONSE).unwrap(),
        expected_response()
    );
    let ours = expected_response().encode_to_vec();
    assert_eq!(
        pb::RateLimitResponse::decode(ours.as_slice()).unwrap(),
        expected_response()
    );
    assert_eq!(ours.len(), RESPONSE.len());
}

#[test]
fn unknown_fields_from_newer_envoys_are_tolerated() {
    // RateLimitOverride field 3 does not exist yet; a newer Envoy may send it.
    let mut with_unknown = REQUEST.to_vec();
    with_unknown.extend_from_slice(&[0x50, 0x01]); // field 10, varint 1
    assert_eq!(
        pb::RateLimitRequest::decode(with_unknown.as_slice())
            .unwrap()
            .domain,
        "d"
    );
}

#[test]
fn the_grpc_path_is_envoys() {
    assert_eq!(
        <pb::RateLimitServiceServer<tollgate::service::RlsService> as tonic::server::NamedService>::NAME,
        "envoy.service.ratelimit.v3.RateLimitService"
    );
}
