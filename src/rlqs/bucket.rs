//! What the rules give a quota bucket. A `BucketId` is an unordered map; the rules are a tree
//! whose levels name keys. The bucket's entries are put in the order the tree names their
//! keys: from the root, each level takes the bucket entry whose key it names (when it names
//! several of the bucket's keys, the alphabetically first), then the node that entry selects
//! with RLS's precedence (exact value, wildcard, key only), and so on until every entry is
//! placed. A rule at the node the last entry reaches is the bucket's rule; a bucket with
//! entries left over, or that reaches no rule, has none. As for RLS, there is no
//! backtracking.

use std::collections::BTreeMap;

use crate::descriptor::Entry;
use crate::rules::{DomainRules, Policy, RuleSet, matcher};

/// A bucket's identity: its entries, sorted by key.
pub type BucketKey = BTreeMap<String, String>;

/// What a bucket is given, for all the streams that report it together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quota {
    /// No rule, an unlimited rule, or a rule in shadow mode: nothing is refused.
    AllowAll,
    /// A limit of zero.
    DenyAll,
    /// The strictest of the rule's limits as a steady rate, to be split among the streams.
    Rate { per_second: f64 },
}

/// The quota of `bucket` in `domain`, and the path of the rule that set it (for listings).
pub fn quota(rules: &RuleSet, domain: &str, bucket: &BucketKey) -> (Quota, Option<String>) {
    let Some(rules) = rules.domain(domain) else {
        return (Quota::AllowAll, None);
    };
    let Some(entries) = ordered(rules, bucket) else {
        return (Quota::AllowAll, None);
    };
    let Some(found) = matcher::find(rules, &entries) else {
        return (Quota::AllowAll, None);
    };
    let rule = found.rule;
    let quota = match &rule.policy {
        _ if rule.shadow_mode => Quota::AllowAll,
        Policy::Unlimited { .. } => Quota::AllowAll,
        Policy::Limited(limits) => {
            let per_second = limits
                .iter()
                .map(|limit| {
                    f64::from(limit.requests_per_unit) / limit.window_seconds().max(1) as f64
                })
                .fold(f64::INFINITY, f64::min);
            if per_second <= 0.0 {
                Quota::DenyAll
            } else {
                Quota::Rate { per_second }
            }
        }
    };
    (quota, Some(rule.path.clone()))
}

/// The bucket's entries in the order the tree names their keys; `None` if some level names
/// none of the entries left.
fn ordered(rules: &DomainRules, bucket: &BucketKey) -> Option<Vec<Entry>> {
    let mut left: Vec<(&String, &String)> = bucket.iter().collect();
    let mut entries = Vec::with_capacity(left.len());
    let mut level = &rules.root;
    while !left.is_empty() {
        let at = left.iter().position(|(key, _)| level.has_key(key))?;
        let (key, value) = left.remove(at);
        let node = level.lookup(key, value)?;
        entries.push(Entry {
            key: key.clone(),
            value: value.clone(),
        });
        level = &node.children;
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(text: &str) -> RuleSet {
        let domain = crate::config::file::parse(std::path::Path::new("edge.yaml"), text);
        RuleSet::new([domain.expect("valid rules")])
    }

    fn bucket(entries: &[(&str, &str)]) -> BucketKey {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const RULES: &str = r#"
domain: edge
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /api
        rate_limit: {unit: second, requests_per_unit: 100}
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 600}
  - key: service
    value: open
    rate_limit: {unlimited: true}
  - key: service
    value: closed
    rate_limit: {unit: hour, requests_per_unit: 0}
"#;

    #[test]
    fn entries_are_ordered_by_the_tree_and_matched_with_rls_precedence() {
        let rules = load_str(RULES);
        // `path` sorts before `tenant`, but the root names only `tenant`.
        let exact = bucket(&[("path", "/api"), ("tenant", "acme")]);
        assert_eq!(
            quota(&rules, "edge", &exact),
            (
                Quota::Rate { per_second: 100.0 },
                Some("edge.tenant.path_/api".to_owned())
            )
        );
        let other = bucket(&[("path", "/else"), ("tenant", "acme")]);
        assert_eq!(
            quota(&rules, "edge", &other).0,
            Quota::Rate { per_second: 10.0 }
        );
    }

    #[test]
    fn unlimited_zero_and_unmatched_buckets_are_blanket_rules() {
        let rules = load_str(RULES);
        let quota_of = |entries: &[(&str, &str)]| quota(&rules, "edge", &bucket(entries)).0;
        assert_eq!(quota_of(&[("service", "open")]), Quota::AllowAll);
        assert_eq!(quota_of(&[("service", "closed")]), Quota::DenyAll);
        // An entry the tree has no level for, a key it does not name, another domain.
        assert_eq!(
            quota_of(&[("tenant", "acme"), ("path", "/api"), ("x", "y")]),
            Quota::AllowAll
        );
        assert_eq!(quota_of(&[("nobody", "x")]), Quota::AllowAll);
        assert_eq!(
            quota(&rules, "other", &bucket(&[("tenant", "a")])).0,
            Quota::AllowAll
        );
        // A rule on a node more entries pass through does not apply (depth mismatch).
        assert_eq!(quota_of(&[("tenant", "acme")]), Quota::AllowAll);
    }
}
