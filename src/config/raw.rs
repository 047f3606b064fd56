//! The YAML as written: serde structs that mirror a config file exactly (unknown keys are
//! errors, positions kept with `Spanned`), and the parse itself, whose errors carry the line
//! and the path serde was at.

use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::error::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) domain: Option<Spanned<String>>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub(super) descriptors: Vec<Spanned<RawDescriptor>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDescriptor {
    pub(super) key: Spanned<String>,
    pub(super) value: Option<Spanned<String>>,
    pub(super) rate_limit: Option<Spanned<RawRateLimit>>,
    /// tollgate extension: several limits on one descriptor.
    pub(super) rate_limits: Option<Spanned<Vec<Spanned<RawRateLimit>>>>,
    #[serde(default)]
    pub(super) shadow_mode: bool,
    #[serde(default)]
    pub(super) quota_mode: bool,
    #[serde(default)]
    pub(super) detailed_metric: bool,
    #[serde(default)]
    pub(super) value_to_metric: bool,
    pub(super) share_threshold: Option<Spanned<bool>>,
    pub(super) metadata: Option<Spanned<serde_json::Value>>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub(super) descriptors: Vec<Spanned<RawDescriptor>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRateLimit {
    pub(super) unit: Option<Spanned<String>>,
    pub(super) requests_per_unit: Option<u32>,
    #[serde(default)]
    pub(super) unlimited: bool,
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) replaces: Vec<Spanned<RawReplace>>,
    // tollgate extensions; see docs/algorithms.md.
    pub(super) algorithm: Option<Spanned<String>>,
    pub(super) unit_multiplier: Option<Spanned<u32>>,
    pub(super) burst: Option<Spanned<u32>>,
    pub(super) min_interval: Option<Spanned<String>>,
    pub(super) anchor: Option<Spanned<String>>,
    pub(super) lease: Option<Spanned<String>>,
    pub(super) charges: Option<Spanned<String>>,
    pub(super) refunds: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplace {
    pub(super) name: String,
}

/// A bare `descriptors:` (YAML null) is an empty list, as the reference reads it (its own
/// fixtures for an empty domain write it so).
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

/// Runs serde over the YAML, keeping the path of a failure. Empty documents around the one
/// that holds the domain (a templated ConfigMap's trailing `---`) are left out.
pub(super) fn deserialize(file: &Path, text: &str) -> Result<RawFile, ConfigError> {
    let only = match only_document(text) {
        Ok(only) => only,
        Err(second) => {
            let reason = "more than one YAML document; a config file holds exactly one domain";
            return Err(ConfigError::at(file, second, String::new(), reason));
        }
    };
    let text = only.as_deref().unwrap_or(text);
    let mut track = serde_path_to_error::Track::new();
    let result = serde_saphyr::with_deserializer_from_str(text, |de| {
        RawFile::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
    });
    result.map_err(|error| {
        let line = error.location().map(|location| location.line());
        let mut reason = yaml_reason(&error);
        let mut at = line;
        // An unclosed `{` or `[` makes the parser read on into the next lines and fail on
        // whatever it finds there: point at the bracket instead.
        if let Some((open_line, bracket)) = unclosed_bracket(text, line) {
            let close = if bracket == '{' { '}' } else { ']' };
            let read_on = match line {
                Some(line) if line > open_line => format!("read on to line {line} and "),
                _ => String::new(),
            };
            reason = format!(
                "the \"{bracket}\" on this line is never closed: end it with \"{close}\" (the YAML parser {read_on}found: {reason})"
            );
            at = Some(open_line);
        }
        ConfigError {
            file: file.to_path_buf(),
            line: at,
            path: yaml_path(&track.path()),
            reason,
        }
    })
}

/// The text with every document but the one that has content blanked out (lines kept, so
/// that errors point at the right line), when the file has more than one document and only
/// one has content; `Ok(None)` when it has one document; `Err(line)`, the first line of the
/// second document with content, when there is one. A document marker (`---`, `...`) starts
/// a line: inside a value it would be indented.
fn only_document(text: &str) -> Result<Option<String>, u64> {
    let is_marker = |line: &str| {
        ["---", "..."].iter().any(|marker| {
            line.strip_prefix(marker)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '#']))
        })
    };
    let has_content = |line: &str| {
        let line = line.trim_start();
        !line.is_empty() && !line.starts_with('#')
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut documents: Vec<(usize, usize)> = Vec::new();
    let mut start = 0;
    for (index, line) in lines.iter().enumerate() {
        // `--- {domain: a}`: content on the marker's line; left to the parser.
        if is_marker(line) && has_content(line[3..].trim_start()) {
            return Ok(None);
        }
        if is_marker(line) {
            documents.push((start, index));
            start = index + 1;
        }
    }
    documents.push((start, lines.len()));
    if documents.len() < 2 {
        return Ok(None);
    }
    let first_content =
        |&(from, to): &(usize, usize)| (from..to).find(|&index| has_content(lines[index]));
    let mut full = documents
        .iter()
        .filter(|document| first_content(document).is_some());
    let (from, to) = match (full.next(), full.next()) {
        (Some(&only), None) => only,
        (None, _) => (0, 0),
        (Some(_), Some(second)) => {
            let line = first_content(second).unwrap_or(second.0);
            return Err(u64::try_from(line + 1).unwrap_or(u64::MAX));
        }
    };
    let kept: Vec<&str> = (0..lines.len())
        .map(|index| {
            if (from..to).contains(&index) {
                lines[index]
            } else {
                ""
            }
        })
        .collect();
    Ok(Some(kept.join("\n")))
}

/// The `{` or `[` still open where the parser failed (at line `until`), outside quotes and
/// comments, and the line that opened it: the likely cause of whatever error the parser
/// reports after it. Flow collections closed before the error are no suspects.
fn unclosed_bracket(text: &str, until: Option<u64>) -> Option<(u64, char)> {
    let until = until?;
    let mut open: Vec<(u64, char)> = Vec::new();
    for (number, line) in (1u64..).zip(text.lines()).take_while(|(n, _)| *n <= until) {
        let mut quote = None;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') => break,
                (None, '{' | '[') => open.push((number, c)),
                (None, '}' | ']') => {
                    open.pop();
                }
                _ => {}
            }
        }
    }
    open.first().copied()
}

/// The path serde was at, without the `value` steps that `Spanned` wrappers add: every list
/// element and the fields in `SPANNED_FIELDS` are `Spanned`, so a `value` right after them is
/// the wrapper's, not a YAML key.
fn yaml_path(path: &serde_path_to_error::Path) -> String {
    const SPANNED_FIELDS: [&str; 16] = [
        "domain",
        "key",
        "value",
        "rate_limit",
        "rate_limits",
        "unit",
        "metadata",
        "share_threshold",
        "algorithm",
        "unit_multiplier",
        "burst",
        "min_interval",
        "anchor",
        "lease",
        "charges",
        "refunds",
    ];
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
        "expected string scalar" => {
            "expected a single value (text), got a list or a map".to_owned()
        }
        "expected mapping start" => {
            "expected a map (`name: value` lines, or `{name: value}`), got a single value or a list"
                .to_owned()
        }
        "expected sequence start" => {
            "expected a list (`- ` items, or `[…]`), got a single value or a map".to_owned()
        }
        null if null.starts_with("cannot deserialize null") => {
            "expected a value, got nothing".to_owned()
        }
        other => other.to_owned(),
    }
}
