//! The decision, free of transport types: rules + algorithms + store → a status per
//! descriptor and an overall code, with the reference's shapes and modes.
//!
//! For one request: take the current rules (one atomic load), resolve each descriptor to a
//! limit (the request's own override when the domain exists, else the matched rule), drop the
//! limits that another matched limit `replaces`, send every remaining counter to the store in
//! one call, then build statuses in request order and the overall code (quota and shadow
//! modes as the reference computes them).

mod stats;

use std::sync::Arc;

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tracing::Instrument;

use crate::algorithm::Outcome;
use crate::clock::Micros;
use crate::descriptor::{Descriptor, Request};
use crate::limit::Limit;
use crate::metrics::{self, Metrics};
use crate::rules::matcher::{self, Match};
use crate::rules::{Policy, Rule, RuleSet};
use crate::storage::keys::{self, EntryValue};
use crate::storage::rule::rejects;
use crate::storage::{CounterReset, CounterStore, Hit, PerHit, Role, Store, StoreError};

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
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub overall: Code,
    pub statuses: Vec<DescriptorStatus>,
    /// Per descriptor, the `metadata` of the rule it matched, if any; empty when no descriptor
    /// matched a rule with metadata.
    pub metadata: Vec<Option<Arc<serde_json::Value>>>,
}

/// Switches that change decisions for every request (flags of `tollgate serve`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Decisions")]
pub struct Modes {
    /// Never answer OVER_LIMIT overall; statuses still show which descriptor is over.
    #[arg(long = "shadow-mode", env = "TOLLGATE_SHADOW_MODE", value_parser = clap::builder::BoolishValueParser::new())]
    pub global_shadow: bool,
    /// Treat every rule as `quota_mode: true`: the request is over only when all its quota
    /// descriptors are (the reference's QUOTA_MODE); shadow rules and per-request overrides
    /// keep their own role.
    #[arg(long = "quota-mode", env = "TOLLGATE_QUOTA_MODE", value_parser = clap::builder::BoolishValueParser::new())]
    pub global_quota: bool,
}

pub struct RateLimiter {
    rules: Arc<ArcSwap<RuleSet>>,
    store: Arc<dyn CounterStore>,
    reset: Arc<dyn CounterReset>,
    modes: Modes,
    metrics: Arc<Metrics>,
}

/// Why a request was not decided.
#[derive(Debug, thiserror::Error)]
pub enum Undecided {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No rules were ever loaded (`RuleSet::not_loaded`); the reference's words.
    #[error("no rate limit configuration loaded")]
    NoConfig,
}

/// Per request, one item per descriptor (or per counter, for hits), held inline for the
/// common request of one descriptor with one limit: deciding it allocates only its key.
type PerDescriptor<T> = SmallVec<[T; 1]>;

/// What one descriptor resolved to before counting.
enum Resolved<'r> {
    NoLimit,
    Unlimited,
    /// Its limits, counted by the hits from `first_hit` on, one per limit.
    Limited {
        limits: &'r [Limit],
        rule: Option<&'r Rule>,
        role: Role,
        first_hit: usize,
    },
}

impl Resolved<'_> {
    /// For a limited descriptor: its role and whether any of its limits denied.
    fn verdict(&self, outcomes: &[Outcome]) -> Option<(Role, bool)> {
        match self {
            Resolved::Limited {
                limits,
                role,
                first_hit,
                ..
            } => {
                let own = &outcomes[*first_hit..*first_hit + limits.len()];
                Some((*role, own.iter().any(|outcome| !outcome.allowed)))
            }
            Resolved::NoLimit | Resolved::Unlimited => None,
        }
    }
}

impl RateLimiter {
    /// Decides on `store`'s counters, and resets them through its reset.
    pub fn new(rules: Arc<ArcSwap<RuleSet>>, store: &Store, modes: Modes) -> Self {
        Self {
            rules,
            store: Arc::clone(&store.counters),
            reset: Arc::clone(&store.reset),
            modes,
            metrics: Arc::new(Metrics::default()),
        }
    }

    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        Self { metrics, ..self }
    }

    /// The rules currently in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Forgets the counters `request` would count on, in the store and in any local cache
    /// (an operator's reset); how many counters that was.
    pub async fn reset(&self, request: &Request) -> Result<usize, StoreError> {
        let rules = self.rules.load_full();
        let matches = match_descriptors(&rules, request);
        let replaced = replaced_names(&matches);
        let mut hits = PerDescriptor::new();
        for (index, (descriptor, found)) in request.descriptors.iter().zip(&matches).enumerate() {
            self.resolve(request, index, descriptor, found, &replaced, &mut hits);
        }
        self.reset.forget(&hits).await?;
        Ok(hits.len())
    }

    pub async fn should_rate_limit(&self, request: &Request) -> Result<Decision, Undecided> {
        if !crate::telemetry::traced() {
            // A span that is off still costs a wrapper and a move of the whole future.
            return self.count(request).await;
        }
        let span = crate::request_span!("decide", descriptors = request.descriptors.len());
        self.count(request).instrument(span).await
    }

    /// Resolves every descriptor, counts their hits in one store call, and answers.
    async fn count(&self, request: &Request) -> Result<Decision, Undecided> {
        let rules = self.rules.load_full();
        if !rules.is_loaded() {
            return Err(Undecided::NoConfig);
        }
        let matches = match_descriptors(&rules, request);
        let replaced = replaced_names(&matches);
        let mut hits = PerDescriptor::new();
        let resolved: PerDescriptor<Resolved<'_>> = request
            .descriptors
            .iter()
            .zip(&matches)
            .enumerate()
            .map(|(index, (descriptor, found))| {
                self.resolve(request, index, descriptor, found, &replaced, &mut hits)
            })
            .collect();
        let outcomes: PerHit<Outcome> = if hits.is_empty() {
            PerHit::new()
        } else {
            let applied = if crate::telemetry::traced() {
                self.store
                    .apply(&hits)
                    .instrument(crate::request_span!("store", counters = hits.len()))
                    .await
                    .map(PerHit::from_vec)
            } else {
                match self.store.apply_at_once(&hits) {
                    Some(applied) => applied,
                    None => self.store.apply(&hits).await.map(PerHit::from_vec),
                }
            };
            let outcomes = applied.inspect_err(|error| {
                self.metrics
                    .store
                    .errors
                    .get_or_create(&metrics::label("kind", error.kind()))
                    .inc();
            })?;
            if outcomes.len() != hits.len() {
                return Err(Undecided::Store(StoreError::MalformedReply(format!(
                    "{} outcomes for {} counters",
                    outcomes.len(),
                    hits.len()
                ))));
            }
            outcomes
        };
        // The store vetoes by the same rule, so the answer matches what was consumed.
        let over = rejects(resolved.iter().filter_map(|r| r.verdict(&outcomes)));
        let overall = if over { Code::OverLimit } else { Code::Ok };
        self.record(request, &matches, &resolved, &outcomes);
        let metadata = rule_metadata(&matches, &resolved);
        let statuses: Vec<DescriptorStatus> = resolved
            .into_iter()
            .map(|resolved| status(resolved, &outcomes))
            .collect();
        Ok(Decision {
            overall,
            statuses,
            metadata,
        })
    }

    fn resolve<'f, 'r: 'f>(
        &self,
        request: &Request,
        index: usize,
        descriptor: &Descriptor,
        found: &'f Found<'r>,
        replaced: &[&str],
        hits: &mut PerDescriptor<Hit>,
    ) -> Resolved<'f> {
        let (limits, rule, role) = match found {
            Found::NoDomain | Found::NoRule => return Resolved::NoLimit,
            Found::Override(limit) => (std::slice::from_ref(limit), None, Role::Enforced),
            Found::Rule(found) => {
                let rule = found.rule;
                if replaced.iter().any(|name| rule.is_named(name)) {
                    return Resolved::NoLimit;
                }
                let Policy::Limited(limits) = &rule.policy else {
                    return Resolved::Unlimited;
                };
                let role = match role_of(rule) {
                    Role::Enforced if self.modes.global_quota => Role::Quota,
                    role => role,
                };
                (limits.as_slice(), Some(rule), role)
            }
        };
        let role = if descriptor.refund {
            Role::Refund
        } else if self.modes.global_shadow {
            Role::Shadow
        } else {
            role
        };
        let entries = identity(descriptor, found);
        let first_hit = hits.len();
        for limit in limits {
            hits.push(Hit {
                descriptor: index,
                key: keys::counter_key(&request.domain, entries.iter().copied(), &limit.params()),
                params: limit.params(),
                hits: descriptor.hits,
                role,
            });
        }
        Resolved::Limited {
            limits,
            rule,
            role,
            first_hit,
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

fn match_descriptors<'r>(rules: &'r RuleSet, request: &Request) -> PerDescriptor<Found<'r>> {
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
fn reported(outcomes: &[Outcome]) -> (usize, Outcome) {
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

/// The counter identity of a descriptor: its entries, with a shared bucket's pattern in place
/// of the value where the matched node has `share_threshold`. Held inline up to four entries.
fn identity<'a>(
    descriptor: &'a Descriptor,
    found: &'a Found<'_>,
) -> SmallVec<[(&'a str, EntryValue<'a>); 4]> {
    descriptor
        .entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let shared = match found {
                Found::Rule(found) => found.nodes.get(index).filter(|node| node.share_threshold),
                _ => None,
            };
            let value = match shared {
                Some(node) => EntryValue::Shared(node.selector.text()),
                None => EntryValue::Actual(entry.value.as_str()),
            };
            (entry.key.as_str(), value)
        })
        .collect()
}

fn role_of(rule: &Rule) -> Role {
    if rule.shadow_mode {
        Role::Shadow
    } else if rule.quota_mode {
        Role::Quota
    } else {
        Role::Enforced
    }
}
