//! The rules in force as text, one line per rule with a limit, in the reference's `/rlconfig`
//! form: `<path>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <b>, quota_mode: <b>`.
//! tollgate's `/config` adds its extensions where a limit has them; the debug listener's
//! `/rlconfig` is the reference's exactly (what `egctl config ratelimit` prints).

use std::fmt::Write as _;

use crate::algorithm::Algorithm;
use crate::limit::Limit;
use crate::rules::{Level, Policy, RuleSet};
use crate::storage::lease::leased_when_busy;

/// Which text.
#[derive(Debug, Clone, Copy)]
pub enum Form {
    /// tollgate's `/config`: several limits of a rule joined by ` + `, an unlimited rule
    /// `unlimited`, and the extensions of each limit; a limit leased while busy says
    /// `lease=auto` (`leasing`: see `RateLimiter::leasing`).
    Tollgate { leasing: Option<bool> },
    /// The reference's `/rlconfig`: a line per limit, nothing it does not know (an unlimited
    /// rule is `unit=UNKNOWN requests_per_unit=0`, as its dump shows one).
    Reference,
}

/// Every domain's rules, domains sorted by name.
pub fn describe(rules: &RuleSet, form: Form) -> String {
    let mut out = String::new();
    for domain in rules.domains() {
        describe_level(&domain.root, form, &mut out);
    }
    out
}

fn describe_level(level: &Level, form: Form, out: &mut String) {
    for node in level.nodes() {
        if let Some(rule) = &node.rule {
            let flags = format!(
                "shadow_mode: {}, quota_mode: {}",
                rule.shadow_mode, rule.quota_mode
            );
            match (&rule.policy, form) {
                (Policy::Limited(limits), Form::Tollgate { leasing }) => {
                    let limits: Vec<String> = limits
                        .iter()
                        .map(|limit| describe_limit(limit, leasing))
                        .collect();
                    let _ = writeln!(out, "{}: {}, {flags}", rule.path, limits.join(" + "));
                }
                (Policy::Limited(limits), Form::Reference) => {
                    for limit in limits {
                        let _ = writeln!(out, "{}: {}, {flags}", rule.path, counted(limit));
                    }
                }
                (Policy::Unlimited { .. }, Form::Tollgate { .. }) => {
                    let _ = writeln!(out, "{}: unlimited, {flags}", rule.path);
                }
                (Policy::Unlimited { .. }, Form::Reference) => {
                    let _ = writeln!(
                        out,
                        "{}: unit=UNKNOWN requests_per_unit=0, {flags}",
                        rule.path
                    );
                }
            }
        }
        describe_level(&node.children, form, out);
    }
}

/// `unit=MINUTE requests_per_unit=5`.
fn counted(limit: &Limit) -> String {
    format!(
        "unit={} requests_per_unit={}",
        limit.unit.as_str().to_uppercase(),
        limit.requests_per_unit
    )
}

/// `counted`, then tollgate's extensions where they differ from the reference's defaults.
fn describe_limit(limit: &Limit, leasing: Option<bool>) -> String {
    let mut out = counted(limit);
    if limit.unit_multiplier != 1 {
        let _ = write!(out, " unit_multiplier={}", limit.unit_multiplier);
    }
    // The reference's default counting needs no mention; anything else names itself.
    if limit.algorithm != Algorithm::default() {
        let _ = write!(out, " algorithm={}", limit.algorithm);
    }
    if leasing.is_some_and(|by_default| leased_when_busy(limit.lease, &limit.params(), by_default))
    {
        out.push_str(" lease=auto");
    }
    if let Some(charges) = limit.charges.name() {
        let _ = write!(out, " charges={charges}");
    }
    out
}
