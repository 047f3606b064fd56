//! The decision, free of transport types: rules + algorithms + store → a status per
//! descriptor and an overall code, with the reference's shapes and modes.
//!
//! For one request: take the current rules (one atomic load), resolve each descriptor to a
//! limit (the request's own override when the domain exists, else the matched rule), drop the
//! limits that another matched limit `replaces`, say of each counter's hits whether they
//! count only when admitted (`charge_of`), send every remaining counter to the store in one
//! call, then build statuses in request order, the overall code (quota and shadow modes as
//! the reference computes them) and what the request reserved.

mod answer;
mod charges;
mod stats;

use std::pin::Pin;
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
use crate::storage::{
    CounterReset, CounterStore, DecideAtOnce, Hit, PerHit, Role, Store, StoreError,
};

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
    /// What the request reserved on the limits that report it (`Limit::reserved_as`), by
    /// name: the hits it consumed there; empty when it reserved nothing.
    pub reserved: Vec<(String, u64)>,
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
    /// Count every charge in full, even when it is denied or its request rejected (the
    /// reference's behaviour), on the rules that do not say otherwise (`charges`). By default
    /// a rejected request consumes nothing.
    #[arg(long = "count-denied", env = "TOLLGATE_COUNT_DENIED", num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub count_denied: bool,
    /// Whether clients' refunds (Envoy's `is_negative_hits`) give back, on the rules that do
    /// not say (`refunds`). Any client of the gRPC port may send one for any key: refuse them
    /// where no data plane is configured to send them, or let only trusted clients reach the
    /// port (mutual TLS).
    #[arg(long = "refunds", env = "TOLLGATE_REFUNDS", value_enum, default_value_t = RefundPolicy::Allow)]
    pub refunds: RefundPolicy,
}

/// `--refunds`: what a client's refund does on the rules that do not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RefundPolicy {
    /// Given back, never more than the counter holds in its window.
    #[default]
    Allow,
    /// Answered with the counter as it is, changing nothing, and counted.
    Refuse,
}

pub struct RateLimiter {
    rules: Arc<ArcSwap<RuleSet>>,
    store: Arc<dyn CounterStore>,
    at_once: Option<Arc<dyn DecideAtOnce>>,
    reset: Arc<dyn CounterReset>,
    /// See `leasing`.
    leasing: Option<bool>,
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

/// A decision made at once, or the future that makes it.
pub enum Deciding<'a> {
    Made(Result<Decision, Undecided>),
    Waiting(Pin<Box<dyn Future<Output = Result<Decision, Undecided>> + Send + 'a>>),
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
            at_once: store.at_once.clone(),
            reset: Arc::clone(&store.reset),
            leasing: store.leases.as_ref().map(|leases| leases.by_default()),
            modes,
            metrics: Arc::new(Metrics::default()),
        }
    }

    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        Self { metrics, ..self }
    }

    /// Whether the store leases busy counters, and if so whether by default (`--lease auto`):
    /// `None` for a store that does not (memory, `--deny-cache-max-ttl 0s`).
    pub fn leasing(&self) -> Option<bool> {
        self.leasing
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
        let (_, hits) = self.resolve_all(request, &matches);
        self.reset.forget(&hits).await?;
        Ok(hits.len())
    }

    /// Decides `request` under `rules` (`loaded_rules`): at once where the store can (the
    /// memory store always, a leasing store from its slices) and no span needs a future;
    /// else through the future of the store call, boxed, so that a request's own future
    /// stays small whatever the store's. Everything the future borrows outlives it in the
    /// caller's frame, so a request the store could not decide at once is not resolved twice.
    pub fn decide<'a>(&'a self, rules: &'a RuleSet, request: &'a Request) -> Deciding<'a> {
        if crate::telemetry::traced() {
            let span = crate::request_span!("decide", descriptors = request.descriptors.len());
            return Deciding::Waiting(Box::pin(self.count(rules, request).instrument(span)));
        }
        let matches = match_descriptors(rules, request);
        let (resolved, hits) = self.resolve_all(request, &matches);
        if let Some(decided) = self.outcomes_at_once(&hits) {
            let decided = decided
                .map(|outcomes| self.conclude(request, &matches, resolved, &hits, &outcomes));
            return Deciding::Made(decided);
        }
        Deciding::Waiting(Box::pin(async move {
            let outcomes = self.outcomes(&hits).await?;
            Ok(self.conclude(request, &matches, resolved, &hits, &outcomes))
        }))
    }

    /// Resolves every descriptor, counts their hits in one store call, and answers.
    async fn count(&self, rules: &RuleSet, request: &Request) -> Result<Decision, Undecided> {
        let matches = match_descriptors(rules, request);
        let (resolved, hits) = self.resolve_all(request, &matches);
        let outcomes = self.outcomes(&hits).await?;
        Ok(self.conclude(request, &matches, resolved, &hits, &outcomes))
    }

    /// The store's outcomes for `hits` (none for none, without a call).
    async fn outcomes(&self, hits: &[Hit]) -> Result<PerHit<Outcome>, Undecided> {
        if hits.is_empty() {
            return Ok(PerHit::new());
        }
        let applied = if crate::telemetry::traced() {
            let span = crate::request_span!("store", counters = hits.len());
            self.store.apply(hits).instrument(span).await
        } else {
            self.store.apply(hits).await
        };
        self.checked(applied.map(PerHit::from_vec), hits.len())
    }

    /// `outcomes` made at once (none for none), if the store decides these hits so.
    fn outcomes_at_once(&self, hits: &[Hit]) -> Option<Result<PerHit<Outcome>, Undecided>> {
        if hits.is_empty() {
            return Some(Ok(PerHit::new()));
        }
        let at_once = self.at_once.as_deref()?;
        Some(self.checked(at_once.apply_at_once(hits)?, hits.len()))
    }

    /// The rules in force, if any were ever loaded (`RuleSet::not_loaded`).
    pub fn loaded_rules(&self) -> Result<Arc<RuleSet>, Undecided> {
        let rules = self.rules.load_full();
        if !rules.is_loaded() {
            return Err(Undecided::NoConfig);
        }
        Ok(rules)
    }

    /// Every descriptor resolved, and the hits they count.
    fn resolve_all<'r>(
        &self,
        request: &Request,
        matches: &[Found<'r>],
    ) -> (PerDescriptor<Resolved<'r>>, PerDescriptor<Hit>) {
        let replaced = replaced_names(matches);
        let mut hits = PerDescriptor::new();
        let resolved = request
            .descriptors
            .iter()
            .zip(matches)
            .enumerate()
            .map(|(index, (descriptor, found))| {
                self.resolve(request, index, descriptor, found, &replaced, &mut hits)
            })
            .collect();
        Self::settle(&mut hits);
        (resolved, hits)
    }

    /// A store's outcomes, its failures counted, and one outcome per hit checked.
    fn checked(
        &self,
        applied: Result<PerHit<Outcome>, StoreError>,
        hits: usize,
    ) -> Result<PerHit<Outcome>, Undecided> {
        let outcomes = applied.inspect_err(|error| {
            self.metrics
                .store
                .errors
                .get_or_create(&metrics::label("kind", error.kind()))
                .inc();
        })?;
        if outcomes.len() != hits {
            return Err(Undecided::Store(StoreError::MalformedReply(format!(
                "{} outcomes for {hits} counters",
                outcomes.len(),
            ))));
        }
        Ok(outcomes)
    }

    fn resolve<'r>(
        &self,
        request: &Request,
        index: usize,
        descriptor: &Descriptor,
        found: &Found<'r>,
        replaced: &[&str],
        hits: &mut PerDescriptor<Hit>,
    ) -> Resolved<'r> {
        let (limits, rule, role) = match found {
            Found::NoDomain | Found::NoRule => return Resolved::NoLimit,
            Found::Override(limit) => (std::slice::from_ref(*limit), None, Role::Enforced),
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
                hits: self.hits_of(limit, role, descriptor.hits),
                role,
                charge: self.charge_of(limit, role),
                lease: limit.lease,
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
    Override(&'r Limit),
    Rule(Match<'r>),
}

fn match_descriptors<'r>(rules: &'r RuleSet, request: &'r Request) -> PerDescriptor<Found<'r>> {
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
            Some(limit) => Found::Override(limit),
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
