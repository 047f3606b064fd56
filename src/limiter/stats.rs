//! A decision counted in the per-limit metrics: each limited descriptor under its rule's stats
//! path (with the client's values where the rule asks for them), the limit it reported and
//! whether it was allowed.

use super::answer::reported;
use super::{Found, RateLimiter, Resolved};
use crate::algorithm::Outcome;
use crate::descriptor::{Descriptor, Request};
use crate::metrics::LimitHit;
use crate::rules::matcher::Match;

impl RateLimiter {
    /// Counts every limited descriptor in the per-limit metrics.
    pub(super) fn record(
        &self,
        request: &Request,
        matches: &[Found<'_>],
        resolved: &[Resolved<'_>],
        outcomes: &[Outcome],
    ) {
        let items = request.descriptors.iter().zip(matches).zip(resolved);
        for ((descriptor, found), resolved) in items {
            let Resolved::Limited {
                limits,
                rule,
                first_hit,
                ..
            } = resolved
            else {
                continue;
            };
            let (index, outcome) = reported(&outcomes[*first_hit..*first_hit + limits.len()]);
            let (path, detailed_path, held) = match found {
                Found::Rule(found) => (
                    found.rule.path.as_str(),
                    detailed_path(&request.domain, found, descriptor),
                    Some(&found.rule.counters),
                ),
                _ => ("override", None, None),
            };
            self.metrics.limits.count(&LimitHit {
                domain: &request.domain,
                path,
                detailed_path,
                held,
                hits: descriptor.hits,
                limit: u64::from(limits[index].requests_per_unit),
                remaining: outcome.remaining,
                allowed: outcome.allowed,
                shadow: self.modes.global_shadow || rule.is_some_and(|rule| rule.shadow_mode),
                refund: descriptor.refund,
            });
        }
    }
}

/// The stats path with client values, where the rule has `detailed_metric` (every level) or
/// a level has `value_to_metric`; `None` when it names no client value.
fn detailed_path(domain: &str, found: &Match<'_>, descriptor: &Descriptor) -> Option<String> {
    let detailed = found.rule.detailed_metric;
    if !detailed && !found.nodes.iter().any(|node| node.value_to_metric) {
        return None;
    }
    let mut path = domain.to_owned();
    for (node, entry) in found.nodes.iter().zip(&descriptor.entries) {
        path.push('.');
        if (detailed || node.value_to_metric) && !node.share_threshold {
            path.push_str(&entry.key);
            // The reference leaves an empty value out, separator included, unless the rule
            // has `detailed_metric`.
            if detailed || !entry.value.is_empty() {
                path.push('_');
                path.push_str(&entry.value);
            }
        } else {
            path.push_str(&node.stats_segment());
        }
    }
    Some(path)
}
