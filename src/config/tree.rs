//! Raw descriptors → the compiled lookup tree of `rules`, checking keys, values, duplicates and
//! metadata; the limits themselves are built by `limits`.

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::Path;

use serde_saphyr::Spanned;

use super::error::ConfigError;
use super::limits;
use super::raw::RawDescriptor;
use crate::rules::{Level, Node, Rule, Selector};

/// Builds the levels of one file.
pub(super) struct Builder<'a> {
    file: &'a Path,
    /// The stats paths given to rules so far (the metrics' `limit` label).
    paths: RefCell<HashSet<String>>,
}

impl<'a> Builder<'a> {
    pub(super) fn new(file: &'a Path) -> Self {
        Self {
            file,
            paths: RefCell::default(),
        }
    }

    /// `stats`, or, when another rule of the file already has it (key `a_b` and key `a` with
    /// value `b` are both `d.a_b` in the reference's notation), `stats~2`, `stats~3`…: two
    /// rules never count under one metrics label.
    fn unique_path(&self, stats: &str) -> String {
        let mut paths = self.paths.borrow_mut();
        if paths.insert(stats.to_owned()) {
            return stats.to_owned();
        }
        let unique = (2u32..)
            .map(|n| format!("{stats}~{n}"))
            .find(|candidate| !paths.contains(candidate))
            .unwrap_or_else(|| stats.to_owned());
        paths.insert(unique.clone());
        tracing::warn!(file = %self.file.display(), path = stats, label = %unique, "two rules share a stats path; the later one is labelled apart");
        unique
    }

    fn error(&self, line: u64, path: String, reason: impl Into<String>) -> ConfigError {
        ConfigError::at(self.file, line, path, reason)
    }

    /// Builds one level; `path` names the parent for errors, `stats` is its stats path.
    pub(super) fn level(
        &self,
        descriptors: &[Spanned<RawDescriptor>],
        path: &str,
        stats: &str,
    ) -> Result<Level, ConfigError> {
        let mut level = Level::default();
        for (index, raw) in descriptors.iter().enumerate() {
            let line = raw.referenced.line();
            let raw = &raw.value;
            let here = format!("{path} > descriptors[{index}] (key {:?})", raw.key.value);
            let node = self.node(raw, &here, stats)?;
            let composite = node.stats_segment();
            if level.insert(node).is_err() {
                return Err(self.error(
                    line,
                    here,
                    format!("duplicate descriptor: another one at this level has the same key and value ({stats}.{composite})"),
                ));
            }
        }
        Ok(level)
    }

    fn node(
        &self,
        raw: &RawDescriptor,
        here: &str,
        parent_stats: &str,
    ) -> Result<Node, ConfigError> {
        if raw.key.value.is_empty() {
            return Err(self.error(
                raw.key.referenced.line(),
                format!("{here} > key"),
                "must not be empty",
            ));
        }
        let selector = Selector::from_config(raw.value.as_ref().map(|v| v.value.as_str()));
        let share_threshold = raw.share_threshold.as_ref().is_some_and(|s| s.value);
        if let Some(flag) = raw.share_threshold.as_ref().filter(|_| share_threshold)
            && !matches!(selector, Selector::Wildcard(_))
        {
            return Err(self.error(
                flag.referenced.line(),
                format!("{here} > share_threshold"),
                "only applies to a wildcard value (one containing '*')",
            ));
        }
        let mut node = Node {
            key: raw.key.value.clone(),
            selector,
            rule: None,
            share_threshold,
            value_to_metric: raw.value_to_metric,
            children: Level::default(),
        };
        let stats = format!("{parent_stats}.{}", node.stats_segment());
        node.rule = self.rule(raw, here, &stats)?;
        node.children = self.level(&raw.descriptors, here, &stats)?;
        Ok(node)
    }

    fn rule(
        &self,
        raw: &RawDescriptor,
        here: &str,
        stats: &str,
    ) -> Result<Option<Rule>, ConfigError> {
        let Some((policy, replaces)) = limits::policy(self.file, raw, here)? else {
            return Ok(None);
        };
        let metadata = match &raw.metadata {
            Some(metadata) if !metadata.value.is_object() => {
                return Err(self.error(
                    metadata.referenced.line(),
                    format!("{here} > metadata"),
                    "expected a map",
                ));
            }
            Some(metadata) => Some(std::sync::Arc::new(metadata.value.clone())),
            None => None,
        };
        Ok(Some(Rule {
            policy,
            replaces,
            shadow_mode: raw.shadow_mode,
            quota_mode: raw.quota_mode,
            detailed_metric: raw.detailed_metric,
            metadata,
            path: self.unique_path(stats),
            counters: Default::default(),
        }))
    }
}
