//! The local deny cache: when the store says a counter is denied until some instant, later
//! requests whose every counter is known denied are answered here, without a round trip
//! (a client hammering a limit it is over costs Redis nothing). Only for the default charge
//! (with `--count-denied` a denied hit must still be counted in the store).
//!
//! Safe: a denial lasts at least until its `retry_after` whatever other replicas do (they can
//! only consume more), except for a refund of a vetoed request, which can make room a little
//! early; the cache then under-admits briefly, never over-admits. Bounded: an LRU of
//! `capacity` counters.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use lru::LruCache;

use super::Hit;
use super::keys::CounterKey;
use crate::algorithm::{Outcome, Params};
use crate::clock::Micros;

struct Denied {
    /// The limit it was denied under (a per-request override may count the same counter
    /// against another limit).
    params: Params,
    /// Until when `need` or more hits are denied.
    until: Micros,
    /// When the counter is fully available again.
    reset_at: Micros,
    need: u64,
}

pub struct DenyCache {
    entries: Option<Mutex<LruCache<CounterKey, Denied>>>,
    hits: AtomicU64,
}

impl DenyCache {
    /// A cache of at most `capacity` counters; 0 turns it off.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: NonZeroUsize::new(capacity)
                .map(|capacity| Mutex::new(LruCache::new(capacity))),
            hits: AtomicU64::new(0),
        }
    }

    /// Requests answered from the cache.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// The outcomes of `hits` at `now` if every one of them is known denied.
    pub fn answer(&self, hits: &[Hit], now: Micros) -> Option<Vec<Outcome>> {
        let entries = self.entries.as_ref()?;
        if hits.is_empty() {
            return None;
        }
        let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
        let outcomes = hits
            .iter()
            .map(|hit| {
                let denied = entries.get(&hit.key)?;
                (denied.params == hit.params
                    && denied.until > now
                    && hit.hits.max(1) >= denied.need)
                    .then(|| Outcome {
                        allowed: false,
                        remaining: 0,
                        reset_after: denied.reset_at.saturating_sub(now),
                        retry_after: denied.until - now,
                    })
            })
            .collect::<Option<Vec<Outcome>>>()?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(outcomes)
    }

    /// Learns from a store answer: denied counters are remembered until their retry time,
    /// allowed ones forgotten.
    pub fn remember(&self, hits: &[Hit], outcomes: &[Outcome], now: Micros) {
        let Some(entries) = &self.entries else {
            return;
        };
        let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
        for (hit, outcome) in hits.iter().zip(outcomes) {
            if outcome.allowed {
                entries.pop(&hit.key);
            } else if outcome.retry_after > 0 {
                let denied = Denied {
                    params: hit.params,
                    until: now.saturating_add(outcome.retry_after),
                    reset_at: now.saturating_add(outcome.reset_after),
                    need: hit.hits.max(1),
                };
                entries.put(hit.key.clone(), denied);
            }
        }
    }
}
