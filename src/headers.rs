//! Rate-limit response headers (`--response-headers`, docs/design.md "Responses"), added to
//! `response_headers_to_add` so that Envoy (or any client) passes them on. They describe one
//! descriptor: when the request is denied, the descriptor that denies (the one that frees up
//! last, if several do), else the one with the least remaining. `Retry-After` is added when
//! the request is over the limit, except in `legacy` mode.
//!
//! - `draft03`: `X-RateLimit-Limit: 10, 10;w=60` (`;name="…"` for a named limit),
//!   `X-RateLimit-Remaining`, `X-RateLimit-Reset`: the form Envoy itself emits with
//!   `enable_x_ratelimit_headers: DRAFT_VERSION_03` (enable one or the other, not both).
//! - `ietf`: `RateLimit-Policy: "default";q=10;w=60` and `RateLimit: "default";r=7;t=58`
//!   (draft-ietf-httpapi-ratelimit-headers; the policy is named after the limit, or
//!   `default`).
//! - `legacy`: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`, plain numbers:
//!   envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED` headers, exactly.

use crate::clock::whole_seconds_up;
use crate::limit::Limit;
use crate::limiter::{Code, Decision, DescriptorStatus};

/// The `legacy` headers' names (renamed by `--legacy-header-names`).
pub const LEGACY_HEADER_NAMES: [&str; 3] =
    ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];

/// Which headers to add.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HeaderMode {
    #[default]
    Off,
    Draft03,
    Ietf,
    Legacy,
}

/// The descriptor a response's headers describe, with its reset in whole seconds.
struct Reported<'d> {
    limit: &'d Limit,
    remaining: u64,
    reset: u64,
}

fn reported(decision: &Decision) -> Option<Reported<'_>> {
    let limited = decision.statuses.iter().filter_map(|status| match status {
        DescriptorStatus::Limited {
            code,
            limit,
            remaining,
            until_reset,
        } => Some((*code, limit, *remaining, whole_seconds_up(*until_reset))),
        DescriptorStatus::NoLimit | DescriptorStatus::Unlimited => None,
    });
    // A descriptor over its limit is reported only when the request is denied: in shadow or
    // quota mode an over descriptor did not block anything.
    let denied = decision.overall == Code::OverLimit;
    let denying = limited
        .clone()
        .filter(|(code, ..)| denied && *code == Code::OverLimit)
        .enumerate()
        .max_by_key(|(index, (.., reset))| (*reset, std::cmp::Reverse(*index)))
        .map(|(_, status)| status);
    let chosen = denying.or_else(|| {
        limited
            .enumerate()
            .min_by_key(|(index, (_, _, remaining, _))| (*remaining, *index))
            .map(|(_, status)| status)
    })?;
    let (_, limit, remaining, reset) = chosen;
    Some(Reported {
        limit,
        remaining,
        reset,
    })
}

/// The headers for `decision` in `mode`, as (name, value) pairs.
pub fn headers(mode: HeaderMode, decision: &Decision) -> Vec<(&'static str, String)> {
    if mode == HeaderMode::Off {
        return Vec::new();
    }
    let Some(reported) = reported(decision) else {
        return Vec::new();
    };
    let Reported {
        limit,
        remaining,
        reset,
    } = reported;
    let quota = limit.requests_per_unit;
    let window = limit.window_seconds();
    let mut out = match mode {
        HeaderMode::Off => Vec::new(),
        HeaderMode::Draft03 => {
            let name = limit
                .name
                .as_ref()
                .map(|name| format!(";name=\"{}\"", quoted(name)))
                .unwrap_or_default();
            vec![
                (
                    "X-RateLimit-Limit",
                    format!("{quota}, {quota};w={window}{name}"),
                ),
                ("X-RateLimit-Remaining", remaining.to_string()),
                ("X-RateLimit-Reset", reset.to_string()),
            ]
        }
        HeaderMode::Ietf => {
            let policy = quoted(limit.name.as_deref().unwrap_or("default"));
            vec![
                (
                    "RateLimit-Policy",
                    format!("\"{policy}\";q={quota};w={window}"),
                ),
                ("RateLimit", format!("\"{policy}\";r={remaining};t={reset}")),
            ]
        }
        HeaderMode::Legacy => LEGACY_HEADER_NAMES
            .into_iter()
            .zip([u64::from(quota), remaining, reset].map(|n| n.to_string()))
            .collect(),
    };
    // Legacy mode is the reference's headers exactly, which include no `Retry-After`.
    if decision.overall == Code::OverLimit && mode != HeaderMode::Legacy {
        out.push(("Retry-After", reset.to_string()));
    }
    out
}

/// The limit, remaining and reset (whole seconds) of the descriptor the headers describe, as
/// the `legacy` headers carry them: the upstream headers (`--upstream-limit-headers`).
pub fn limit_state(decision: &Decision) -> Option<[String; 3]> {
    let reported = reported(decision)?;
    Some(
        [
            u64::from(reported.limit.requests_per_unit),
            reported.remaining,
            reported.reset,
        ]
        .map(|n| n.to_string()),
    )
}

/// A structured-field string's content: `"` and `\` escaped.
fn quoted(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}
