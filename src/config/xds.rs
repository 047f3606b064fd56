//! Rules pushed over xDS (`--config-xds`): each `RateLimitConfig` resource is the YAML rule
//! document it stands for, so it goes through the same parser, the same validation and the
//! same error messages as a file, with the resource named (`xds:NAME`) where a file and line
//! would be. The resource type has no place for tollgate's extensions (algorithms, several
//! limits per descriptor); it carries what envoyproxy/ratelimit's YAML carries.

use std::path::PathBuf;

use serde_json::{Map, Value, json};

use super::{ConfigErrors, combine, file};
use crate::pb::ratelimit::config::ratelimit::v3 as rls;
use crate::rules::RuleSet;

/// The rule set of a state-of-the-world set of resources, one domain each unless `merge`.
pub fn from_resources(
    configs: &[rls::RateLimitConfig],
    merge: bool,
) -> Result<RuleSet, ConfigErrors> {
    let parsed = configs.iter().map(|config| {
        let name = if config.name.is_empty() {
            &config.domain
        } else {
            &config.name
        };
        let source = PathBuf::from(format!("xds:{name}"));
        let text = document(config).to_string();
        let domain = file::parse(&source, &text).map_err(|mut error| {
            // Lines of the generated document mean nothing to whoever pushed the resource.
            error.line = None;
            error
        });
        (source, domain)
    });
    combine(parsed, merge)
}

/// The YAML document (written as JSON, which YAML reads) a resource stands for.
fn document(config: &rls::RateLimitConfig) -> Value {
    json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    })
}

fn descriptor(descriptor: &rls::RateLimitDescriptor) -> Value {
    let mut node = Map::new();
    node.insert("key".into(), json!(descriptor.key));
    if !descriptor.value.is_empty() {
        node.insert("value".into(), json!(descriptor.value));
    }
    if let Some(policy) = &descriptor.rate_limit {
        node.insert("rate_limit".into(), rate_limit(policy));
    }
    if !descriptor.descriptors.is_empty() {
        let children: Vec<Value> = descriptor
            .descriptors
            .iter()
            .map(self::descriptor)
            .collect();
        node.insert("descriptors".into(), Value::Array(children));
    }
    for (flag, set) in [
        ("shadow_mode", descriptor.shadow_mode),
        ("detailed_metric", descriptor.detailed_metric),
        ("quota_mode", descriptor.quota_mode),
    ] {
        if set {
            node.insert(flag.into(), Value::Bool(true));
        }
    }
    if let Some(metadata) = &descriptor.metadata {
        node.insert("metadata".into(), json_object(metadata));
    }
    Value::Object(node)
}

/// A protobuf Struct as the JSON object it stands for (a number that JSON cannot hold, NaN
/// or an infinity, becomes null).
fn json_object(fields: &prost_types::Struct) -> Value {
    Value::Object(
        fields
            .fields
            .iter()
            .map(|(name, value)| (name.clone(), json_value(value)))
            .collect(),
    )
}

fn json_value(value: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(number)) => json!(number),
        Some(Kind::StringValue(text)) => json!(text),
        Some(Kind::BoolValue(flag)) => json!(flag),
        Some(Kind::StructValue(fields)) => json_object(fields),
        Some(Kind::ListValue(list)) => Value::Array(list.values.iter().map(json_value).collect()),
    }
}

fn rate_limit(policy: &rls::RateLimitPolicy) -> Value {
    let mut limit = Map::new();
    if policy.unlimited {
        limit.insert("unlimited".into(), Value::Bool(true));
    } else {
        limit.insert("unit".into(), json!(unit(policy.unit)));
        limit.insert("requests_per_unit".into(), json!(policy.requests_per_unit));
    }
    if !policy.name.is_empty() {
        limit.insert("name".into(), json!(policy.name));
    }
    if !policy.replaces.is_empty() {
        let replaces: Vec<Value> = policy
            .replaces
            .iter()
            .map(|replace| json!({"name": replace.name}))
            .collect();
        limit.insert("replaces".into(), Value::Array(replaces));
    }
    Value::Object(limit)
}

/// The unit as the YAML spells it; an unset or unknown one as the parser will refuse it.
fn unit(value: i32) -> String {
    match rls::RateLimitUnit::try_from(value) {
        Ok(rls::RateLimitUnit::Unknown) => "unknown".into(),
        Ok(unit) => unit.as_str_name().to_ascii_lowercase(),
        Err(_) => format!("unit number {value}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(unit: rls::RateLimitUnit, requests: u32) -> Option<rls::RateLimitPolicy> {
        Some(rls::RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: requests,
            ..Default::default()
        })
    }

    #[test]
    fn a_resource_is_the_domain_its_yaml_would_be() {
        let config = rls::RateLimitConfig {
            name: "gateway/http".into(),
            domain: "default/eg/http".into(),
            descriptors: vec![rls::RateLimitDescriptor {
                key: "rule-0".into(),
                value: "rule-0".into(),
                descriptors: vec![rls::RateLimitDescriptor {
                    key: "x-user-id".into(),
                    rate_limit: limit(rls::RateLimitUnit::Hour, 3),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let rules = from_resources(&[config], false).unwrap();
        let domains = rules.domains();
        assert_eq!(domains[0].name, "default/eg/http");
        assert_eq!(domains[0].root.nodes().len(), 1);
    }

    #[test]
    fn errors_name_the_resource_and_the_path_as_for_a_file() {
        let config = rls::RateLimitConfig {
            name: "broken".into(),
            domain: "d".into(),
            descriptors: vec![rls::RateLimitDescriptor {
                key: "user".into(),
                rate_limit: limit(rls::RateLimitUnit::Unknown, 5),
                ..Default::default()
            }],
        };
        let error = from_resources(std::slice::from_ref(&config), false)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("xds:broken: domain \"d\" > descriptors[0]"),
            "{error}"
        );
        assert!(error.contains("unknown"), "{error}");
        let twice = rls::RateLimitConfig {
            name: "again".into(),
            ..config
        };
        let fixed = rls::RateLimitConfig {
            descriptors: vec![],
            ..twice.clone()
        };
        let duplicate = from_resources(&[fixed.clone(), fixed], false)
            .unwrap_err()
            .to_string();
        assert!(
            duplicate.contains("duplicate domain, already defined in xds:again"),
            "{duplicate}"
        );
    }
}
