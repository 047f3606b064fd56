//! The counters behind the per-limit metrics, held by the rules that count into them, and the
//! label vocabulary. A leaf of `metrics`: `mod.rs` builds on it.

use std::fmt;
use std::sync::{Arc, OnceLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

pub type Labels = Vec<(&'static str, String)>;

/// Per-limit counters.
#[derive(Default)]
pub(super) struct PerLimit {
    pub(super) total_hits: Family<Labels, Counter>,
    pub(super) over_limit: Family<Labels, Counter>,
    pub(super) near_limit: Family<Labels, Counter>,
    pub(super) within_limit: Family<Labels, Counter>,
    pub(super) shadow_mode: Family<Labels, Counter>,
    pub(super) total_negative_hits: Family<Labels, Counter>,
}

/// One label set's six per-limit counters, each fetched from its family on first use (so a
/// series appears only once it counts something) and held from then on.
pub(super) struct LimitCounters {
    pub(super) labels: Labels,
    pub(super) total_hits: OnceLock<Counter>,
    pub(super) over_limit: OnceLock<Counter>,
    pub(super) near_limit: OnceLock<Counter>,
    pub(super) within_limit: OnceLock<Counter>,
    pub(super) shadow_mode: OnceLock<Counter>,
    pub(super) total_negative_hits: OnceLock<Counter>,
}

impl LimitCounters {
    pub(super) fn new(labels: Labels) -> Self {
        Self {
            labels,
            total_hits: OnceLock::new(),
            over_limit: OnceLock::new(),
            near_limit: OnceLock::new(),
            within_limit: OnceLock::new(),
            shadow_mode: OnceLock::new(),
            total_negative_hits: OnceLock::new(),
        }
    }

    pub(super) fn add(
        &self,
        held: &OnceLock<Counter>,
        family: &Family<Labels, Counter>,
        hits: u64,
    ) {
        held.get_or_init(|| family.get_or_create(&self.labels).clone())
            .inc_by(hits);
    }
}

/// A rule's per-limit counters, held by the rule (`Rule::counters`) once its first hit has
/// found them, so that counting a hit of a configured rule is a few atomic adds: no lookup.
/// They belong to the `Metrics` that found them; another `Metrics` (tests build several) is
/// not given them and looks its own up.
#[derive(Default)]
pub struct HeldCounters(OnceLock<(usize, Arc<LimitCounters>)>);

impl HeldCounters {
    /// The counters held for the `Metrics` numbered `owner`, if any.
    pub(super) fn get(&self, owner: usize) -> Option<&LimitCounters> {
        let (held_for, counters) = self.0.get()?;
        (*held_for == owner).then_some(&**counters)
    }

    /// Holds `counters` for `owner` unless some are held already; returns them either way.
    pub(super) fn hold(&self, owner: usize, counters: Arc<LimitCounters>) -> Arc<LimitCounters> {
        let _ = self.0.set((owner, Arc::clone(&counters)));
        counters
    }
}

impl fmt::Debug for HeldCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HeldCounters")
    }
}

/// A one-label set.
pub fn label(name: &'static str, value: impl Into<String>) -> Labels {
    vec![(name, value.into())]
}

/// A gRPC status code as gRPC spells it (`OK`, `INVALID_ARGUMENT`), which is what dashboards
/// and other exporters use.
pub fn grpc_code(code: tonic::Code) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    // `Code` is numbered as the gRPC spec numbers its codes, 0 to 16.
    NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_are_spelled_as_grpc_spells_them() {
        assert_eq!(grpc_code(tonic::Code::Ok), "OK");
        assert_eq!(grpc_code(tonic::Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(grpc_code(tonic::Code::Unauthenticated), "UNAUTHENTICATED");
    }
}
