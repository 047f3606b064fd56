//! `--dynamic-metadata`: the response's `dynamic_metadata`, as envoyproxy/ratelimit builds it,
//! so Envoy can route or log by it (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit:…)%`):
//! `domain`; `descriptors` (each `{entries: ["k=v", …], limit: "N/UNIT" if overridden,
//! hitsAddend if set}`); `hitsAddend` (the request's, if not zero); and `metadata`, the rules'
//! `metadata` of every descriptor that is not OVER_LIMIT, merged (the first descriptor wins a
//! conflicting value).
//!
//! Whether asked for or not, `reserved` carries what the request reserved on the limits that
//! report it (`Limit::reserved_as`), `{name: hits}`, so that the end of the stream gives back
//! exactly that (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit:reserved:NAME)%` as its
//! refund's `hits_addend`), and nothing for a request that reserved nothing.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

use crate::limiter::{Code, Decision, DescriptorStatus};
use crate::pb;

pub fn build(request: &pb::RateLimitRequest, decision: &Decision) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("domain".to_owned(), string(&request.domain));
    let descriptors = request.descriptors.iter().map(descriptor).collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            number(f64::from(request.hits_addend)),
        );
    }
    let mut merged = serde_json::Map::new();
    for (status, metadata) in decision.statuses.iter().zip(&decision.metadata) {
        let over = matches!(
            status,
            DescriptorStatus::Limited {
                code: Code::OverLimit,
                ..
            }
        );
        if let (false, Some(serde_json::Value::Object(map))) = (over, metadata.as_deref()) {
            merge(&mut merged, map);
        }
    }
    if !merged.is_empty() {
        fields.insert(
            "metadata".to_owned(),
            json(&serde_json::Value::Object(merged)),
        );
    }
    Struct { fields }
}

/// `metadata` (the reference's, or none) with `reserved` added when the request reserved
/// anything; `None` when there is nothing to send.
pub fn with_reserved(metadata: Option<Struct>, decision: &Decision) -> Option<Struct> {
    if decision.reserved.is_empty() {
        return metadata;
    }
    let mut metadata = metadata.unwrap_or_default();
    let reserved = decision
        .reserved
        .iter()
        .map(|(name, hits)| (name.clone(), hits_value(*hits)))
        .collect();
    metadata.fields.insert(
        "reserved".to_owned(),
        Value {
            kind: Some(Kind::StructValue(Struct { fields: reserved })),
        },
    );
    Some(metadata)
}

/// A count of hits as Envoy reads it back into a `hits_addend`.
fn hits_value(hits: u64) -> Value {
    number(hits as f64)
}

fn descriptor(descriptor: &pb::RateLimitDescriptor) -> Value {
    let mut fields = std::collections::BTreeMap::new();
    let entries = descriptor
        .entries
        .iter()
        .map(|entry| string(&format!("{}={}", entry.key, entry.value)))
        .collect();
    fields.insert("entries".to_owned(), list(entries));
    if let Some(limit) = &descriptor.limit {
        let unit = pb::envoy::r#type::v3::RateLimitUnit::try_from(limit.unit)
            .map_or("UNKNOWN", |unit| unit.as_str_name());
        fields.insert(
            "limit".to_owned(),
            string(&format!("{}/{unit}", limit.requests_per_unit)),
        );
    }
    if let Some(hits) = descriptor.hits_addend {
        fields.insert("hitsAddend".to_owned(), number(hits as f64));
    }
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

/// Adds `from` into `into`; existing scalars win, maps merge recursively.
fn merge(
    into: &mut serde_json::Map<String, serde_json::Value>,
    from: &serde_json::Map<String, serde_json::Value>,
) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(serde_json::Value::Object(existing)), serde_json::Value::Object(more)) => {
                merge(existing, more);
            }
            (Some(_), _) => {}
            (None, value) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

fn json(value: &serde_json::Value) -> Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json).collect(),
        }),
        serde_json::Value::Object(map) => Kind::StructValue(Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), json(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

fn string(text: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.to_owned())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}
