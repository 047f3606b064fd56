//! The quota buckets as `GET /config` shows them: one line per bucket this replica's streams
//! report, with the rule it falls under, what that gives, and the split as last computed.

use std::fmt::Write as _;

use super::bucket::{self, Quota};
use super::grant::Grant;
use super::rebalance::label;
use super::registry::Registry;

impl Registry {
    /// `<domain> <key=value,…>: rule <path>, <quota>, streams <n> (all replicas), demand
    /// <r>/s, assigned here <r>/s`, sorted; empty with no bucket.
    pub fn describe(&self) -> String {
        let rules = self.rules.load();
        let state = self.state();
        let mut lines: Vec<String> = state
            .buckets
            .iter()
            .map(|(at, bucket)| {
                let (quota, path) = bucket::quota(&rules, &at.0, &at.1);
                let quota = match quota {
                    Quota::AllowAll => "allow all".to_owned(),
                    Quota::DenyAll => "deny all".to_owned(),
                    Quota::Rate { per_second } => format!("{per_second:.3}/s"),
                };
                let subscriptions: Vec<_> = bucket
                    .streams
                    .iter()
                    .filter_map(|id| state.streams.get(id)?.subscriptions.get(&at.1))
                    .collect();
                let demand: f64 = subscriptions.iter().filter_map(|s| s.demand).fold(0.0, |sum, d| sum + d)
                    + bucket.others.iter().flatten().fold(0.0, |sum, d| sum + d);
                let assigned: f64 = subscriptions
                    .iter()
                    .map(|s| match s.sent.map(|sent| sent.grant) {
                        Some(Grant::Rate(rate)) => rate,
                        Some(Grant::AllowAll) => f64::INFINITY,
                        _ => 0.0,
                    })
                    .sum();
                format!(
                    "{} {}: rule {}, {quota}, streams {} (all replicas), demand {demand:.3}/s, assigned here {assigned:.3}/s",
                    at.0,
                    label(&at.1),
                    path.as_deref().unwrap_or("none"),
                    bucket.streams.len() + bucket.others.len(),
                )
            })
            .collect();
        lines.sort();
        let mut out = String::new();
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        out
    }
}
