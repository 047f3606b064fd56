//! The per-limit metrics (labels `domain` and `limit`, the rule's config path in the
//! reference's stats notation, e.g. `api.user`): `total_hits`, `over_limit`, `near_limit`,
//! `within_limit`, `shadow_mode`, counted in hits as the reference counts them, and
//! `total_negative_hits`, the hits given back by refunds (which count in no other). Client values
//! appear in a label only for rules with `detailed_metric` or levels with `value_to_metric`,
//! and then at most `max_detailed` distinct label sets: beyond that a hit counts under the
//! rule's plain path, so cardinality stays bounded whatever clients send.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;

use super::counters::{HeldCounters, Labels, LimitCounters, PerLimit};

/// Per domain, per rule path: the plain (no client value) label sets, found by borrowed
/// strings so that counting a hit allocates nothing. Behind an `ArcSwap`, because every
/// limited descriptor reads it and new paths are rare: a read takes no lock and writes no
/// shared memory (a `RwLock` would bounce its reader count between cores on every call).
type PlainCounters = HashMap<String, HashMap<String, Arc<LimitCounters>>>;

pub struct LimitMetrics {
    /// Tells this instance from others (see `HeldCounters`).
    identity: usize,
    per_limit: PerLimit,
    plain: ArcSwap<PlainCounters>,
    /// Detailed (client-valued) label sets seen, bounded by `max_detailed`.
    detailed: Mutex<HashSet<(String, String)>>,
    max_detailed: usize,
    near_limit_ratio: f64,
}

/// One descriptor's count, as the limiter saw it.
pub struct LimitHit<'a> {
    pub domain: &'a str,
    /// The rule's config path, and the path with client values when it has some.
    pub path: &'a str,
    pub detailed_path: Option<String>,
    /// Where the rule holds the counters of `path`, for a configured rule.
    pub held: Option<&'a HeldCounters>,
    pub hits: u64,
    pub limit: u64,
    /// After the call; for a denied one, the room it found (see `algorithm::Outcome`).
    pub remaining: u64,
    pub allowed: bool,
    pub shadow: bool,
    /// Given back (Envoy's `is_negative_hits`): counted in `total_negative_hits` alone.
    pub refund: bool,
}

impl LimitMetrics {
    pub fn new(near_limit_ratio: f64, max_detailed: usize) -> Self {
        static INSTANCES: AtomicUsize = AtomicUsize::new(0);
        Self {
            identity: INSTANCES.fetch_add(1, Ordering::Relaxed),
            per_limit: PerLimit::default(),
            plain: ArcSwap::default(),
            detailed: Mutex::new(HashSet::new()),
            max_detailed,
            near_limit_ratio,
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        let per_limit = &self.per_limit;
        registry.register(
            "total_hits",
            "Hits counted per limit",
            per_limit.total_hits.clone(),
        );
        registry.register(
            "over_limit",
            "Hits over the limit",
            per_limit.over_limit.clone(),
        );
        registry.register(
            "near_limit",
            "Hits within the limit but past --near-limit-ratio of it",
            per_limit.near_limit.clone(),
        );
        registry.register(
            "within_limit",
            "Hits within the limit",
            per_limit.within_limit.clone(),
        );
        registry.register(
            "shadow_mode",
            "Hits over the limit let through by shadow mode",
            per_limit.shadow_mode.clone(),
        );
        registry.register(
            "total_negative_hits",
            "Hits given back by refunds (Envoy's is_negative_hits)",
            per_limit.total_negative_hits.clone(),
        );
    }

    /// Counts one limited descriptor.
    pub fn count(&self, hit: &LimitHit<'_>) {
        match (&hit.detailed_path, hit.held) {
            (None, Some(held)) => match held.get(self.identity) {
                Some(counters) => self.add(counters, hit),
                None => self.add(
                    &held.hold(self.identity, self.plain(hit.domain, hit.path)),
                    hit,
                ),
            },
            (None, None) => self.add(&self.plain(hit.domain, hit.path), hit),
            (Some(_), _) => self.add(&LimitCounters::new(self.labels(hit)), hit),
        }
    }

    fn add(&self, counters: &LimitCounters, hit: &LimitHit<'_>) {
        let per = &self.per_limit;
        if hit.refund {
            counters.add(
                &counters.total_negative_hits,
                &per.total_negative_hits,
                hit.hits,
            );
            return;
        }
        counters.add(&counters.total_hits, &per.total_hits, hit.hits);
        if hit.allowed {
            counters.add(&counters.within_limit, &per.within_limit, hit.hits);
            let near = self.near_hits(hit);
            if near > 0 {
                counters.add(&counters.near_limit, &per.near_limit, near);
            }
        } else {
            // As the reference splits a request that goes partly over: the hits past the
            // room the limit had are over, those within it count as near where past the
            // threshold (limit 20, count 19, 3 hits: 2 over, 1 near).
            let room = if hit.remaining < hit.hits {
                hit.remaining
            } else {
                0
            };
            let over = hit.hits - room;
            counters.add(&counters.over_limit, &per.over_limit, over);
            let near = self.near_of_room(hit.limit, room);
            if near > 0 {
                counters.add(&counters.near_limit, &per.near_limit, near);
            }
            if hit.shadow {
                counters.add(&counters.shadow_mode, &per.shadow_mode, over);
            }
        }
    }

    /// Of the last `room` hits of `limit`, how many are past the near-limit threshold.
    fn near_of_room(&self, limit: u64, room: u64) -> u64 {
        let threshold = (limit as f64 * self.near_limit_ratio).floor() as u64;
        let before = limit.saturating_sub(room);
        limit.saturating_sub(before.max(threshold))
    }

    /// The counters of a rule's plain path.
    fn plain(&self, domain: &str, path: &str) -> Arc<LimitCounters> {
        let held = self.plain.load();
        match held.get(domain).and_then(|paths| paths.get(path)) {
            Some(counters) => Arc::clone(counters),
            None => self.hold_plain(domain, path),
        }
    }

    /// Holds the counters of a rule's plain path from now on (their number is bounded by the
    /// config), keeping the ones another call may have added meanwhile.
    fn hold_plain(&self, domain: &str, path: &str) -> Arc<LimitCounters> {
        let fresh = Arc::new(LimitCounters::new(vec![
            ("domain", domain.to_owned()),
            ("limit", path.to_owned()),
        ]));
        let mut held = None;
        self.plain.rcu(|current| {
            let mut next = PlainCounters::clone(current);
            let counters = next
                .entry(domain.to_owned())
                .or_default()
                .entry(path.to_owned())
                .or_insert_with(|| Arc::clone(&fresh));
            held = Some(Arc::clone(counters));
            next
        });
        held.unwrap_or(fresh)
    }

    /// Hits of an admitted call past the near-limit threshold, as the reference counts them.
    fn near_hits(&self, hit: &LimitHit<'_>) -> u64 {
        let threshold = (hit.limit as f64 * self.near_limit_ratio).floor() as u64;
        let after = hit.limit.saturating_sub(hit.remaining);
        let before = after.saturating_sub(hit.hits);
        if after <= threshold {
            0
        } else if before >= threshold {
            hit.hits
        } else {
            after - threshold
        }
    }

    /// The label set: the detailed path while there is room for another, else the plain path.
    fn labels(&self, hit: &LimitHit<'_>) -> Labels {
        let path = match &hit.detailed_path {
            Some(detailed) => {
                let mut seen = self.detailed.lock().unwrap_or_else(PoisonError::into_inner);
                let key = (hit.domain.to_owned(), detailed.clone());
                if seen.contains(&key) || seen.len() < self.max_detailed {
                    seen.insert(key);
                    detailed.clone()
                } else {
                    hit.path.to_owned()
                }
            }
            None => hit.path.to_owned(),
        };
        vec![("domain", hit.domain.to_owned()), ("limit", path)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit<'a>(held: &'a HeldCounters, hits: u64) -> LimitHit<'a> {
        LimitHit {
            domain: "d",
            path: "d.user",
            detailed_path: None,
            held: Some(held),
            hits,
            limit: 100,
            remaining: 50,
            allowed: true,
            shadow: false,
            refund: false,
        }
    }

    fn total_hits(metrics: &LimitMetrics) -> Option<u64> {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines().find_map(|line| {
            line.strip_prefix("total_hits_total{domain=\"d\",limit=\"d.user\"} ")?
                .parse()
                .ok()
        })
    }

    #[test]
    fn a_rule_holds_its_counters_for_the_metrics_that_found_them_only() {
        let rule_counters = HeldCounters::default();
        let (first, second) = (LimitMetrics::new(0.8, 1_000), LimitMetrics::new(0.8, 1_000));
        first.count(&hit(&rule_counters, 2));
        first.count(&hit(&rule_counters, 3));
        // Held by the rule now, for `first`; `second` counts into its own registry.
        assert!(rule_counters.get(first.identity).is_some());
        assert!(rule_counters.get(second.identity).is_none());
        second.count(&hit(&rule_counters, 7));
        assert_eq!(total_hits(&first), Some(5));
        assert_eq!(total_hits(&second), Some(7));
        // The same rule loaded again (a reload) finds the same counters.
        first.count(&hit(&HeldCounters::default(), 1));
        assert_eq!(total_hits(&first), Some(6));
    }
}
