//! One config file: serde "raw" structs that mirror the YAML exactly (unknown keys are
//! errors), then a conversion into the compiled rules that checks everything else. Every error
//! carries the file, the line and the path to the offending field.

use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::ConfigError;
use crate::limit::{Limit, Unit};
use crate::rules::{DomainRules, Level, Node, Policy, Rule, Selector};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: Option<Spanned<String>>,
    #[serde(default)]
    descriptors: Vec<Spanned<RawDescriptor>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: Spanned<String>,
    value: Option<Spanned<String>>,
    rate_limit: Option<Spanned<RawRateLimit>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    share_threshold: Option<Spanned<bool>>,
    metadata: Option<Spanned<serde_json::Value>>,
    #[serde(default)]
    descriptors: Vec<Spanned<RawDescriptor>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    unit: Option<Spanned<String>>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Spanned<RawReplace>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: String,
}

/// Parses and validates the text of one config file.
pub fn parse(file: &Path, text: &str) -> Result<DomainRules, ConfigError> {
    let raw = deserialize(file, text)?;
    let error = |line: u64, path: String, reason: String| ConfigError {
        file: file.to_path_buf(),
        line: Some(line),
        path,
        reason,
    };
    let domain = match raw.domain {
        Some(domain) if !domain.value.is_empty() => domain.value,
        Some(domain) => {
            return Err(error(
                domain.referenced.line(),
                "domain".into(),
                "must not be empty".into(),
            ));
        }
        None => {
            return Err(error(
                1,
                "domain".into(),
                "missing; every file names its domain".into(),
            ));
        }
    };
    let mut builder = Builder { file };
    let root = builder.level(&raw.descriptors, &format!("domain {domain:?}"), &domain)?;
    Ok(DomainRules { name: domain, root })
}

/// Runs serde over the YAML, keeping the path of a failure.
fn deserialize(file: &Path, text: &str) -> Result<RawFile, ConfigError> {
    let mut track = serde_path_to_error::Track::new();
    let result = serde_saphyr::with_deserializer_from_str(text, |de| {
        RawFile::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
    });
    result.map_err(|error| ConfigError {
        file: file.to_path_buf(),
        line: error.location().map(|location| location.line()),
        path: yaml_path(&track.path()),
        reason: yaml_reason(&error),
    })
}

/// The path serde was at, without the `value` steps that `Spanned` wrappers add: every list
/// element and the fields in `SPANNED_FIELDS` are `Spanned`, so a `value` right after them is
/// the wrapper's, not a YAML key.
fn yaml_path(path: &serde_path_to_error::Path) -> String {
    const SPANNED_FIELDS: [&str; 6] = ["domain", "key", "value", "rate_limit", "unit", "metadata"];
    use serde_path_to_error::Segment;
    let mut out = String::new();
    let mut wrapper_next = false;
    for segment in path.iter() {
        match segment {
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if wrapper_next && key == "value" {
                    wrapper_next = false;
                    continue;
                }
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
                wrapper_next = SPANNED_FIELDS.contains(&key.as_str());
            }
            Segment::Seq { index } => {
                out.push_str(&format!("[{index}]"));
                wrapper_next = true;
            }
            Segment::Unknown => wrapper_next = false,
        }
    }
    out
}

/// The YAML error's own message, without the location and source snippet that its `Display`
/// adds (we print the location ourselves, in the `file:line:` form).
fn yaml_reason(error: &serde_saphyr::Error) -> String {
    if matches!(
        error.without_snippet(),
        serde_saphyr::Error::MultipleDocuments { .. }
    ) {
        return "more than one YAML document; a config file holds exactly one domain".to_owned();
    }
    let text = error.without_snippet().to_string();
    let first_line = text.lines().next().unwrap_or_default();
    let reason = match first_line.rfind(" at line ") {
        Some(at) => &first_line[..at],
        None => first_line,
    };
    // Say what is expected in the config's terms rather than Rust's.
    match reason {
        "invalid u32" => "expected a whole number from 0 to 4294967295".to_owned(),
        "invalid boolean" => "expected true or false".to_owned(),
        other => other.to_owned(),
    }
}

struct Builder<'a> {
    file: &'a Path,
}

impl Builder<'_> {
    fn error(&self, line: u64, path: String, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            line: Some(line),
            path,
            reason: reason.into(),
        }
    }

    /// Builds one level; `path` names the parent for errors, `stats` is its stats path.
    fn level(
        &mut self,
        descriptors: &[Spanned<RawDescriptor>],
        path: &str,
        stats: &str,
    ) -> Result<Level, ConfigError> {
        let mut level = Level::default();
        for (index, raw) in descriptors.iter().enumerate() {
            let line = raw.referenced.line();
            let raw = &raw.value;
            let here = format!("{path} > descriptors[{index}] (key {:?})", raw.key.value);
            let node = self.node(raw, &here, stats)?;
            let composite = stats_segment(&node);
            if level.insert(node).is_err() {
                return Err(self.error(
                    line,
                    here,
                    format!("duplicate descriptor: another one at this level has the same key and value ({stats}.{composite})"),
                ));
            }
        }
        Ok(level)
    }

    fn node(
        &mut self,
        raw: &RawDescriptor,
        here: &str,
        parent_stats: &str,
    ) -> Result<Node, ConfigError> {
        if raw.key.value.is_empty() {
            return Err(self.error(
                raw.key.referenced.line(),
                format!("{here} > key"),
                "must not be empty",
            ));
        }
        let selector = Selector::from_config(raw.value.as_ref().map(|v| v.value.as_str()));
        let share_threshold = raw.share_threshold.as_ref().is_some_and(|s| s.value);
        if let Some(flag) = raw.share_threshold.as_ref().filter(|_| share_threshold)
            && !matches!(selector, Selector::Wildcard(_))
        {
            return Err(self.error(
                flag.referenced.line(),
                format!("{here} > share_threshold"),
                "only applies to a wildcard value (one containing '*')",
            ));
        }
        let mut node = Node {
            key: raw.key.value.clone(),
            selector,
            rule: None,
            share_threshold,
            value_to_metric: raw.value_to_metric,
            children: Level::default(),
        };
        let stats = format!("{parent_stats}.{}", stats_segment(&node));
        node.rule = self.rule(raw, here, &stats)?;
        node.children = self.level(&raw.descriptors, here, &stats)?;
        Ok(node)
    }

    fn rule(
        &mut self,
        raw: &RawDescriptor,
        here: &str,
        stats: &str,
    ) -> Result<Option<Rule>, ConfigError> {
        let Some(rate_limit) = &raw.rate_limit else {
            return Ok(None);
        };
        let line = rate_limit.referenced.line();
        let rate_limit = &rate_limit.value;
        let name = rate_limit.name.clone().filter(|name| !name.is_empty());
        let policy = if rate_limit.unlimited {
            if let Some(unit) = &rate_limit.unit {
                return Err(self.error(
                    unit.referenced.line(),
                    format!("{here} > rate_limit.unit"),
                    "must not be set when unlimited is true",
                ));
            }
            Policy::Unlimited { name: name.clone() }
        } else {
            let unit = self.unit(rate_limit.unit.as_ref(), line, here)?;
            let Some(requests_per_unit) = rate_limit.requests_per_unit else {
                return Err(self.error(
                    line,
                    format!("{here} > rate_limit.requests_per_unit"),
                    "missing; write 0 to deny every request",
                ));
            };
            let mut limit = Limit::new(requests_per_unit, unit);
            limit.name = name.clone();
            Policy::Limited(limit)
        };
        let replaces = self.replaces(&rate_limit.replaces, name.as_deref(), here)?;
        let metadata = match &raw.metadata {
            Some(metadata) if !metadata.value.is_object() => {
                return Err(self.error(
                    metadata.referenced.line(),
                    format!("{here} > metadata"),
                    "expected a map",
                ));
            }
            Some(metadata) => Some(metadata.value.clone()),
            None => None,
        };
        Ok(Some(Rule {
            policy,
            replaces,
            shadow_mode: raw.shadow_mode,
            quota_mode: raw.quota_mode,
            detailed_metric: raw.detailed_metric,
            metadata,
            path: stats.to_owned(),
        }))
    }

    fn unit(
        &self,
        unit: Option<&Spanned<String>>,
        line: u64,
        here: &str,
    ) -> Result<Unit, ConfigError> {
        let expected = Unit::ALL.map(Unit::as_str).join("|");
        let path = format!("{here} > rate_limit.unit");
        match unit {
            None => Err(self.error(line, path, format!("missing; expected one of {expected}"))),
            Some(unit) => Unit::parse(&unit.value).ok_or_else(|| {
                self.error(
                    unit.referenced.line(),
                    path,
                    format!("expected one of {expected}, got {:?}", unit.value),
                )
            }),
        }
    }

    fn replaces(
        &self,
        replaces: &[Spanned<RawReplace>],
        own_name: Option<&str>,
        here: &str,
    ) -> Result<Vec<String>, ConfigError> {
        replaces
            .iter()
            .enumerate()
            .map(|(index, replace)| {
                let path = format!("{here} > rate_limit.replaces[{index}].name");
                let name = &replace.value.name;
                if name.is_empty() {
                    Err(self.error(replace.referenced.line(), path, "must not be empty"))
                } else if Some(name.as_str()) == own_name {
                    Err(self.error(
                        replace.referenced.line(),
                        path,
                        format!("a limit cannot replace itself ({name:?})"),
                    ))
                } else {
                    Ok(name.clone())
                }
            })
            .collect()
    }
}

/// A node's segment of the stats path: `key` for key-only nodes, else `key_value` (patterns
/// kept as written), as the reference names its stats.
fn stats_segment(node: &Node) -> String {
    match &node.selector {
        Selector::Any => node.key.clone(),
        selector => format!("{}_{}", node.key, selector.text()),
    }
}
