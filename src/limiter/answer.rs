//! A decision from what the store decided: the overall code, each descriptor's status (the
//! limit it reports, its remaining and reset), the matched rules' metadata, what the request
//! reserved, and the per-limit metrics counted.

use std::sync::Arc;

use super::{Code, Decision, DescriptorStatus, Found, PerDescriptor, RateLimiter, Resolved};
use crate::algorithm::{Charge, Outcome};
use crate::descriptor::Request;
use crate::storage::rule::rejects;
use crate::storage::{Hit, Role};

impl RateLimiter {
    /// The answer, from what the store decided, and the per-limit metrics counted.
    pub(super) fn conclude(
        &self,
        request: &Request,
        matches: &[Found<'_>],
        resolved: PerDescriptor<Resolved<'_>>,
        hits: &[Hit],
        outcomes: &[Outcome],
    ) -> Decision {
        // The store vetoes by the same rule, so the answer matches what was consumed.
        let over = rejects(resolved.iter().filter_map(|r| r.verdict(outcomes)));
        let overall = if over { Code::OverLimit } else { Code::Ok };
        self.record(request, matches, &resolved, outcomes);
        let metadata = rule_metadata(matches, &resolved);
        let reserved = reserved(&resolved, hits, outcomes, over);
        let statuses: Vec<DescriptorStatus> = resolved
            .into_iter()
            .map(|resolved| status(resolved, outcomes))
            .collect();
        Decision {
            overall,
            statuses,
            metadata,
            reserved,
        }
    }
}

/// What the request consumed on each limit that reports it (`Limit::reserved_as`), by name:
/// a charge admitted by a request that was not rejected, or a charge that counts whatever
/// its fate. A charge settling a refund of its counter (`RateLimiter::settle`) reserves nothing:
/// it reports what a stream spent. Two descriptors reporting one name report the smaller:
/// the end of the stream then never gives back more than either reserved.
fn reserved(
    resolved: &[Resolved<'_>],
    hits: &[Hit],
    outcomes: &[Outcome],
    over: bool,
) -> Vec<(String, u64)> {
    let mut reserved: Vec<(String, u64)> = Vec::new();
    for resolved in resolved {
        let Resolved::Limited {
            limits, first_hit, ..
        } = resolved
        else {
            continue;
        };
        for (offset, limit) in limits.iter().enumerate() {
            let (Some(name), Some(hit), Some(outcome)) = (
                limit.reserved_as(),
                hits.get(first_hit + offset),
                outcomes.get(first_hit + offset),
            ) else {
                continue;
            };
            let consumed = match hit.charge {
                Charge::Always => true,
                Charge::IfAllowed => outcome.allowed && !over,
            };
            let settles = || {
                hits.iter()
                    .any(|other| other.role == Role::Refund && other.key == hit.key)
            };
            if hit.role == Role::Refund || hit.hits == 0 || !consumed || settles() {
                continue;
            }
            match reserved.iter_mut().find(|(known, _)| known == name) {
                Some((_, hits)) => *hits = (*hits).min(hit.hits),
                None => reserved.push((name.to_owned(), hit.hits)),
            }
        }
    }
    reserved
}

/// Per descriptor, the metadata of the rule it matched; empty (no allocation) when none has
/// any. A replaced rule's metadata does not count (its descriptor reports no limit).
fn rule_metadata(
    matches: &[Found<'_>],
    resolved: &[Resolved<'_>],
) -> Vec<Option<Arc<serde_json::Value>>> {
    fn of<'a>(
        (found, resolved): (&'a Found<'_>, &Resolved<'_>),
    ) -> Option<&'a Arc<serde_json::Value>> {
        match (found, resolved) {
            (_, Resolved::NoLimit) => None,
            (Found::Rule(found), _) => found.rule.metadata.as_ref(),
            _ => None,
        }
    }
    let pairs = || matches.iter().zip(resolved);
    if pairs().all(|pair| of(pair).is_none()) {
        return Vec::new();
    }
    pairs().map(|pair| of(pair).cloned()).collect()
}

fn status(resolved: Resolved<'_>, outcomes: &[Outcome]) -> DescriptorStatus {
    match resolved {
        Resolved::NoLimit => DescriptorStatus::NoLimit,
        Resolved::Unlimited => DescriptorStatus::Unlimited,
        Resolved::Limited {
            limits,
            rule,
            first_hit,
            ..
        } => {
            let own = &outcomes[first_hit..first_hit + limits.len()];
            let (index, outcome) = reported(own);
            // A shadow rule reports its remaining count but never says OVER_LIMIT.
            let shadow = rule.is_some_and(|rule| rule.shadow_mode);
            let code = if outcome.allowed || shadow {
                Code::Ok
            } else {
                Code::OverLimit
            };
            DescriptorStatus::Limited {
                code,
                limit: limits[index].clone(),
                // A denied limit's `remaining` is the room it found; the wire says 0.
                remaining: if outcome.allowed {
                    outcome.remaining
                } else {
                    0
                },
                until_reset: if outcome.allowed {
                    outcome.reset_after
                } else {
                    outcome.retry_after
                },
            }
        }
    }
}

/// Which of a descriptor's limits its status reports: the denying one that frees up last (the
/// one the client must wait for), else the one with the least remaining.
pub(super) fn reported(outcomes: &[Outcome]) -> (usize, Outcome) {
    let denied = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.allowed)
        .max_by_key(|(index, o)| (o.retry_after, std::cmp::Reverse(*index)));
    let chosen = denied.or_else(|| {
        outcomes
            .iter()
            .enumerate()
            .min_by_key(|(index, o)| (o.remaining, *index))
    });
    chosen.map_or((0, Outcome::default()), |(index, outcome)| {
        (index, *outcome)
    })
}
