//! The reference's JSON form of the RLS messages (protobuf's canonical JSON mapping) for
//! `POST /json`: camelCase or snake_case field names, enums by name or number, 64-bit integers
//! as numbers or strings; responses in camelCase with zero values omitted. Written by hand for
//! the six message shapes involved rather than generating serde code for every proto type.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::pb::{self, rate_limit_descriptor as desc, rate_limit_response as rls};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Number>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: Option<Number>,
    #[serde(default)]
    unit: Option<UnitName>,
}

/// A protojson integer: a JSON number or a decimal string.
#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Int(u64),
    Text(String),
}

impl Number {
    fn get(&self, field: &str) -> Result<u64, String> {
        match self {
            Number::Int(n) => Ok(*n),
            Number::Text(text) => text
                .parse()
                .map_err(|_| format!("{field}: expected an unsigned integer, got {text:?}")),
        }
    }
}

/// A protojson enum: its name or its number.
#[derive(Deserialize)]
#[serde(untagged)]
enum UnitName {
    Number(i32),
    Name(String),
}

/// Decodes a JSON `RateLimitRequest`.
pub fn decode_request(body: &[u8]) -> Result<pb::RateLimitRequest, String> {
    let request: JsonRequest = serde_json::from_slice(body).map_err(|error| error.to_string())?;
    let hits_addend = match &request.hits_addend {
        Some(n) => {
            u32::try_from(n.get("hitsAddend")?).map_err(|_| "hitsAddend: over 2^32-1".to_owned())?
        }
        None => 0,
    };
    let descriptors = request
        .descriptors
        .into_iter()
        .map(decode_descriptor)
        .collect::<Result<_, _>>()?;
    Ok(pb::RateLimitRequest {
        domain: request.domain,
        descriptors,
        hits_addend,
    })
}

fn decode_descriptor(descriptor: JsonDescriptor) -> Result<pb::RateLimitDescriptor, String> {
    let limit = match descriptor.limit {
        Some(limit) => Some(desc::RateLimitOverride {
            requests_per_unit: match &limit.requests_per_unit {
                Some(n) => u32::try_from(n.get("requestsPerUnit")?)
                    .map_err(|_| "requestsPerUnit: over 2^32-1".to_owned())?,
                None => 0,
            },
            unit: match limit.unit {
                Some(UnitName::Number(n)) => n,
                Some(UnitName::Name(name)) => {
                    pb::envoy::r#type::v3::RateLimitUnit::from_str_name(&name)
                        .ok_or_else(|| format!("limit.unit: unknown unit {name:?}"))?
                        as i32
                }
                None => 0,
            },
        }),
        None => None,
    };
    Ok(pb::RateLimitDescriptor {
        entries: descriptor
            .entries
            .into_iter()
            .map(|entry| desc::Entry {
                key: entry.key,
                value: entry.value,
            })
            .collect(),
        limit,
        hits_addend: descriptor
            .hits_addend
            .map(|n| n.get("hitsAddend"))
            .transpose()?,
        is_negative_hits: descriptor.is_negative_hits,
    })
}

/// The overall code's protojson name.
pub fn overall_code(response: &pb::RateLimitResponse) -> &'static str {
    code_name(response.overall_code)
}

fn code_name(code: i32) -> &'static str {
    rls::Code::try_from(code).map_or("UNKNOWN", |code| code.as_str_name())
}

/// Encodes a `RateLimitResponse` as protojson (camelCase, zero values omitted).
pub fn encode_response(response: &pb::RateLimitResponse) -> String {
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(overall_code(response)));
    if !response.statuses.is_empty() {
        let statuses: Vec<Value> = response.statuses.iter().map(encode_status).collect();
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|header| json!({"key": header.key, "value": header.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out).to_string()
}

/// A request as `decode_request` reads it (domain, descriptors' entries, hits_addend), for
/// the client commands that call the admin endpoints.
pub fn encode_request(request: &pb::RateLimitRequest) -> String {
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let entries: Vec<Value> = descriptor
                .entries
                .iter()
                .map(|entry| json!({"key": entry.key, "value": entry.value}))
                .collect();
            json!({ "entries": entries })
        })
        .collect();
    let mut out = Map::new();
    out.insert("domain".into(), json!(request.domain));
    out.insert("descriptors".into(), Value::Array(descriptors));
    if request.hits_addend != 0 {
        out.insert("hitsAddend".into(), json!(request.hits_addend));
    }
    Value::Object(out).to_string()
}

fn encode_status(status: &rls::DescriptorStatus) -> Value {
    let mut out = Map::new();
    out.insert("code".into(), json!(code_name(status.code)));
    if let Some(limit) = &status.current_limit {
        let mut current = Map::new();
        if !limit.name.is_empty() {
            current.insert("name".into(), json!(limit.name));
        }
        if limit.requests_per_unit != 0 {
            current.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
        }
        let unit = rls::rate_limit::Unit::try_from(limit.unit)
            .map_or("UNKNOWN", |unit| unit.as_str_name());
        current.insert("unit".into(), json!(unit));
        if let Some(multiplier) = limit.unit_multiplier {
            current.insert("unitMultiplier".into(), json!(multiplier));
        }
        out.insert("currentLimit".into(), Value::Object(current));
    }
    if status.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(status.limit_remaining));
    }
    if let Some(duration) = &status.duration_until_reset {
        out.insert(
            "durationUntilReset".into(),
            json!(format!("{}s", duration.seconds)),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_camel_and_snake_case_and_enum_names_or_numbers() {
        let camel = decode_request(
            br#"{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":"5","unit":"DAY"},"hitsAddend":"0"}]}"#,
        )
        .unwrap();
        let snake = decode_request(
            br#"{"domain":"d","hits_addend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requests_per_unit":5,"unit":4},"hits_addend":0}]}"#,
        )
        .unwrap();
        assert_eq!(camel, snake);
        assert_eq!(camel.hits_addend, 2);
        assert_eq!(camel.descriptors[0].hits_addend, Some(0));
        assert_eq!(camel.descriptors[0].limit.as_ref().unwrap().unit, 4);
    }

    #[test]
    fn an_encoded_request_decodes_to_itself() {
        let request = decode_request(
            br#"{"domain":"d","hitsAddend":3,"descriptors":[{"entries":[{"key":"k","value":"v"},{"key":"q","value":""}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            decode_request(encode_request(&request).as_bytes()).unwrap(),
            request
        );
    }

    #[test]
    fn a_week_is_a_unit_by_name() {
        let weekly =
            decode_request(br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":5,"unit":"WEEK"}}]}"#)
                .unwrap();
        assert_eq!(weekly.descriptors[0].limit.as_ref().unwrap().unit, 7);
    }

    #[test]
    fn rejects_unknown_fields_and_bad_json() {
        assert!(decode_request(br#"{"domain":"d","bogus":1}"#).is_err());
        assert!(decode_request(b"").is_err());
        assert!(
            decode_request(br#"{"domain":"d","descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#)
                .is_err()
        );
    }

    #[test]
    fn encodes_the_three_status_shapes_like_protojson() {
        let response = pb::RateLimitResponse {
            overall_code: rls::Code::OverLimit as i32,
            statuses: vec![
                rls::DescriptorStatus {
                    code: rls::Code::Ok as i32,
                    ..Default::default()
                },
                rls::DescriptorStatus {
                    code: rls::Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                rls::DescriptorStatus {
                    code: rls::Code::OverLimit as i32,
                    current_limit: Some(rls::RateLimit {
                        name: String::new(),
                        requests_per_unit: 10,
                        unit: rls::rate_limit::Unit::Minute as i32,
                        unit_multiplier: None,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(prost_types::Duration {
                        seconds: 58,
                        nanos: 0,
                    }),
                    quota: None,
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            encode_response(&response),
            r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OK"},{"code":"OK","limitRemaining":4294967295},{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":10,"unit":"MINUTE"},"durationUntilReset":"58s"}]}"#
        );
    }
}
