//! The quota buckets as `GET /config` shows them: one line per bucket this replica's streams
//! report, with the rule it falls under, what that gives, and the split as last computed;
//! at most `MAX_LISTED` of them.

use std::fmt::Write as _;

use super::bucket::{self, Quota};
use super::rebalance::label;
use super::registry::Registry;

/// Most buckets listed, so that `/config` stays short whatever data planes report.
const MAX_LISTED: usize = 1_000;

impl Registry {
    /// `<domain> <key=value,…>: rule <path>, <quota>, streams <n> (all replicas), demand
    /// <r>/s, assigned here <r>/s`, sorted; empty with no bucket.
    pub fn describe(&self) -> String {
        let rules = self.rules.load();
        let state = self.state();
        let mut lines = Vec::new();
        for (domain, buckets) in &state.domains {
            for bucket in buckets.values() {
                let (quota, path) = bucket::quota(&rules, domain, &bucket.key);
                let quota = match quota {
                    Quota::AllowAll => "allow all".to_owned(),
                    Quota::DenyAll => "deny all".to_owned(),
                    Quota::Rate { per_second } => format!("{per_second:.3}/s"),
                };
                let (demand, assigned, streams) = bucket.figures();
                lines.push(format!(
                    "{domain} {}: rule {}, {quota}, streams {streams} (all replicas), demand {demand:.3}/s, assigned here {assigned:.3}/s",
                    label(&bucket.key),
                    path.as_deref().unwrap_or("none"),
                ));
            }
        }
        lines.sort();
        let mut out = String::new();
        let shown = lines.len().min(MAX_LISTED);
        for line in &lines[..shown] {
            let _ = writeln!(out, "{line}");
        }
        if lines.len() > shown {
            let _ = writeln!(out, "… and {} more buckets", lines.len() - shown);
        }
        out
    }
}
