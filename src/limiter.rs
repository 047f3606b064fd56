//! The decision, free of transport types: rules + algorithms + store → a status per
//! descriptor and an overall code, with the reference's shapes and modes.
//!
//! For one request: take the current rules (one atomic load), resolve each descriptor to a
//! limit (the request's own override when the domain exists, else the matched rule), drop the
//! limits that another matched limit `replaces`, send every remaining counter to the store in
//! one call, then build statuses in request order and the overall code (quota and shadow
//! modes as the reference computes them).

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::algorithm::Params;
use crate::clock::Micros;
use crate::descriptor::{Descriptor, Request};
use crate::limit::Limit;
use crate::rules::matcher::{self, Match};
use crate::rules::{Policy, Rule, RuleSet};
use crate::storage::keys::{self, EntryValue};
use crate::storage::{CounterStore, Hit, Role, StoreError};

/// A decision code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The answer for one descriptor, in one of the reference's three shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescriptorStatus {
    /// No rule matched (or it was replaced): `{code: OK}` and nothing else.
    NoLimit,
    /// The matched rule is `unlimited`.
    Unlimited,
    Limited {
        code: Code,
        limit: Limit,
        remaining: u64,
        /// `retry_after` when denied, else `reset_after` (see `algorithm::Outcome`).
        until_reset: Micros,
    },
}

/// The answer for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub overall: Code,
    pub statuses: Vec<DescriptorStatus>,
}

/// Switches that change decisions for every request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Modes {
    /// `--shadow-mode`: count and report as usual, but never answer OVER_LIMIT overall.
    pub global_shadow: bool,
}

pub struct RateLimiter {
    rules: Arc<ArcSwap<RuleSet>>,
    store: Arc<dyn CounterStore>,
    modes: Modes,
}

/// What one descriptor resolved to before counting.
enum Resolved<'r> {
    NoLimit,
    Unlimited,
    Limited {
        limit: Limit,
        rule: Option<&'r Rule>,
        hit: usize,
    },
}

impl RateLimiter {
    pub fn new(rules: Arc<ArcSwap<RuleSet>>, store: Arc<dyn CounterStore>, modes: Modes) -> Self {
        Self {
            rules,
            store,
            modes,
        }
    }

    /// The rules currently in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    pub async fn should_rate_limit(&self, request: &Request) -> Result<Decision, StoreError> {
        let rules = self.rules.load_full();
        let matches = match_descriptors(&rules, request);
        let replaced = replaced_names(&matches);
        let mut hits = Vec::new();
        let resolved: Vec<Resolved<'_>> = request
            .descriptors
            .iter()
            .zip(&matches)
            .map(|(descriptor, found)| {
                self.resolve(request, descriptor, found, &replaced, &mut hits)
            })
            .collect();
        let outcomes = if hits.is_empty() {
            Vec::new()
        } else {
            let outcomes = self.store.apply(&hits).await?;
            if outcomes.len() != hits.len() {
                return Err(StoreError::Unavailable(format!(
                    "store answered {} outcomes for {} counters",
                    outcomes.len(),
                    hits.len()
                )));
            }
            outcomes
        };
        let statuses: Vec<DescriptorStatus> = resolved
            .into_iter()
            .map(|resolved| status(resolved, &outcomes))
            .collect();
        let overall = self.overall(&matches, &statuses);
        Ok(Decision { overall, statuses })
    }

    fn resolve<'r>(
        &self,
        request: &Request,
        descriptor: &Descriptor,
        found: &Found<'r>,
        replaced: &[&str],
        hits: &mut Vec<Hit>,
    ) -> Resolved<'r> {
        let (limit, rule, role) = match found {
            Found::NoDomain | Found::NoRule => return Resolved::NoLimit,
            Found::Override(limit) => (limit.clone(), None, Role::Enforced),
            Found::Rule(found) => {
                let rule = found.rule;
                if rule.name().is_some_and(|name| replaced.contains(&name)) {
                    return Resolved::NoLimit;
                }
                let Policy::Limited(limit) = &rule.policy else {
                    return Resolved::Unlimited;
                };
                let role = if rule.shadow_mode {
                    Role::Shadow
                } else if rule.quota_mode {
                    Role::Quota
                } else {
                    Role::Enforced
                };
                (limit.clone(), Some(rule), role)
            }
        };
        let role = if self.modes.global_shadow {
            Role::Shadow
        } else {
            role
        };
        let shared = match found {
            Found::Rule(found) => found
                .nodes
                .iter()
                .map(|node| node.share_threshold.then(|| node.selector.text()))
                .collect(),
            _ => Vec::new(),
        };
        let entries = descriptor.entries.iter().enumerate().map(|(index, entry)| {
            let value = match shared.get(index).copied().flatten() {
                Some(pattern) => EntryValue::Shared(pattern),
                None => EntryValue::Actual(entry.value.as_str()),
            };
            (entry.key.as_str(), value)
        });
        hits.push(Hit {
            key: keys::counter_key(&request.domain, entries, limit.algorithm, limit.window()),
            params: Params {
                algorithm: limit.algorithm,
                requests: u64::from(limit.requests_per_unit),
                window: limit.window(),
            },
            hits: descriptor.hits,
            role,
        });
        Resolved::Limited {
            limit,
            rule,
            hit: hits.len() - 1,
        }
    }

    /// OVER_LIMIT when a non-quota descriptor is over, or when every quota descriptor is over
    /// (there being at least one); global shadow mode turns OVER_LIMIT into OK.
    fn overall(&self, matches: &[Found<'_>], statuses: &[DescriptorStatus]) -> Code {
        let mut quota = 0;
        let mut quota_over = 0;
        let mut over = false;
        for (status, found) in statuses.iter().zip(matches) {
            let is_over = matches!(
                status,
                DescriptorStatus::Limited {
                    code: Code::OverLimit,
                    ..
                }
            );
            let is_quota = matches!(found, Found::Rule(m) if m.rule.quota_mode);
            if is_quota {
                quota += 1;
                quota_over += usize::from(is_over);
            } else {
                over |= is_over;
            }
        }
        let over = over || (quota > 0 && quota_over == quota);
        if over && !self.modes.global_shadow {
            Code::OverLimit
        } else {
            Code::Ok
        }
    }
}

/// How one descriptor met the rules.
enum Found<'r> {
    NoDomain,
    NoRule,
    Override(Limit),
    Rule(Match<'r>),
}

fn match_descriptors<'r>(rules: &'r RuleSet, request: &Request) -> Vec<Found<'r>> {
    let Some(domain) = rules.domain(&request.domain) else {
        return request
            .descriptors
            .iter()
            .map(|_| Found::NoDomain)
            .collect();
    };
    request
        .descriptors
        .iter()
        .map(|descriptor| match &descriptor.limit_override {
            // The reference honours an override only when the domain is configured.
            Some(limit) => Found::Override(limit.clone()),
            None => matcher::find(domain, &descriptor.entries).map_or(Found::NoRule, Found::Rule),
        })
        .collect()
}

/// Every name listed in `replaces` by a matched rule.
fn replaced_names<'r>(matches: &[Found<'r>]) -> Vec<&'r str> {
    matches
        .iter()
        .filter_map(|found| match found {
            Found::Rule(found) => Some(found.rule.replaces.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect()
}

fn status(resolved: Resolved<'_>, outcomes: &[crate::algorithm::Outcome]) -> DescriptorStatus {
    match resolved {
        Resolved::NoLimit => DescriptorStatus::NoLimit,
        Resolved::Unlimited => DescriptorStatus::Unlimited,
        Resolved::Limited { limit, rule, hit } => {
            let outcome = outcomes[hit];
            // A shadow rule reports its remaining count but never says OVER_LIMIT.
            let shadow = rule.is_some_and(|rule| rule.shadow_mode);
            let code = if outcome.allowed || shadow {
                Code::Ok
            } else {
                Code::OverLimit
            };
            DescriptorStatus::Limited {
                code,
                limit,
                remaining: outcome.remaining,
                until_reset: if outcome.allowed {
                    outcome.reset_after
                } else {
                    outcome.retry_after
                },
            }
        }
    }
}
