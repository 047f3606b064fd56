//! Leases: a busy fixed window's budget, held in part by the replica that sees it busy, which
//! then decides its hits without a store call each (docs/design.md, "Leases").
//!
//! A replica that sees a leasable counter busy (`--lease-busy-rate` hits a second on this
//! replica) takes a slice of what its window has left in one store call (`CounterLease`); the
//! store counts the slice as hits, so slices outstanding never exceed what the limit has left
//! and the fleet never admits more than the limit. A request whose every hit fits in this
//! replica's slices is answered from them; any other request goes to the store as it would
//! without leases, slices untouched, so a request stays all-or-nothing whatever its mix. The
//! next slice is asked for in the background when the slice runs low: a decision never waits
//! on a lease. Unused budget goes back (a `LeaseReturn`) when a slice has lived
//! `--deny-cache-max-ttl` (so a reset reaches every replica within it), when its counter
//! cools down, and on shutdown; a slice of a window that has ended is dropped, its counter
//! with it. A replica that dies loses its slices: the fleet under-admits, never over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::keys::CounterKey;
use super::{CounterLease, CounterStore, Grant, HeldLeases, Hit, Role, StoreError};
use crate::algorithm::{Algorithm, Anchor, Outcome, Params};
use crate::clock::{MICROS_PER_SECOND, Micros};
use crate::limit::Lease;
use crate::metrics::Metrics;
use crate::metrics::lease::LeaseMetrics;
use slice::{Followed, Slice, follow, take, window_of};

/// How this replica leases (`--lease` and its companions).
#[derive(Debug, Clone, Copy)]
pub struct LeaseSettings {
    /// Whether a counter whose rule does not say is leased when busy (`--lease auto`).
    pub by_default: bool,
    /// Hits a second on one counter, seen by this replica, from which it leases.
    pub busy_rate: u64,
    /// The longest a slice is used after it was first leased (`--deny-cache-max-ttl`): a
    /// reset of the counter reaches this replica within it.
    pub slice_life: Micros,
}

/// A slice covers about this long of this replica's demand, so that the next one, asked for
/// when it runs half out, comes back before it is gone.
const LOOKAHEAD: Micros = 200_000;
/// A lease of fewer hits than this is not worth a call: the last few hits of a window, and
/// limits too small to split, are decided per request.
const MIN_SLICE: u64 = 8;
/// A counter unused this long gives its slice back and is forgotten.
const COOL_AFTER: Micros = 2 * MICROS_PER_SECOND;

/// The store as served, with leases in front of its per-request path.
pub struct Leased {
    store: Arc<dyn CounterStore>,
    leases: Arc<dyn CounterLease>,
    settings: LeaseSettings,
    counters: Mutex<HashMap<CounterKey, Followed>>,
    metrics: LeaseMetrics,
    me: Weak<Leased>,
}

/// Whether a limit's counter is leased while busy: a fixed window aligned on the epoch, large
/// enough to split, leased by its rule (`lease`) or by default (`--lease auto`).
pub fn leased_when_busy(lease: Lease, params: &Params, by_default: bool) -> bool {
    let wanted = match lease {
        Lease::Auto => true,
        Lease::Off => false,
        Lease::AsConfigured => by_default,
    };
    wanted
        && params.algorithm
            == (Algorithm::FixedWindow {
                anchor: Anchor::Epoch,
            })
        && params.requests >= MIN_SLICE * 2
}

impl Leased {
    pub fn new(
        store: Arc<dyn CounterStore>,
        leases: Arc<dyn CounterLease>,
        settings: LeaseSettings,
        metrics: &Metrics,
    ) -> Arc<Self> {
        let leased = Arc::new_cyclic(|me| Self {
            store,
            leases,
            settings,
            counters: Mutex::new(HashMap::new()),
            metrics: metrics.lease.clone(),
            me: me.clone(),
        });
        tokio::spawn(cool_down(Arc::downgrade(&leased)));
        leased
    }

    /// Whether `hit`'s counter may be leased when busy (a refund goes to the store).
    fn leasable(&self, hit: &Hit) -> bool {
        hit.role != Role::Refund
            && leased_when_busy(hit.lease, &hit.params, self.settings.by_default)
    }

    fn counters(&self) -> MutexGuard<'_, HashMap<CounterKey, Followed>> {
        // A panic elsewhere while holding the lock leaves only demand figures behind.
        self.counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The request answered from this replica's slices, if every hit is leasable and fits in
    /// its counter's slice; the demand followed and the next leases asked for either way.
    fn answer_from_slices(&self, hits: &[Hit], now: Micros) -> Option<Vec<Outcome>> {
        let mut counters = self.counters();
        let mut local = true;
        let mut returns = Vec::new();
        for hit in hits {
            if !self.leasable(hit) {
                local = false;
                continue;
            }
            let Some(followed) = follow(&mut counters, hit, now) else {
                local = false;
                continue;
            };
            followed.demand.add(now, hit.hits.max(1));
            followed.last_used = now;
            if let Some(slice) = followed.slice.take_if(|slice| !slice.usable(hit, now)) {
                returns.extend(slice.unused_of_current(hit, now));
            }
        }
        let outcomes = if local {
            take(&mut counters, hits, now)
        } else {
            None
        };
        let waited = outcomes.is_none()
            && hits.iter().any(|hit| {
                counters
                    .get(&hit.key)
                    .is_some_and(|followed| followed.leasing)
            });
        let leases: Vec<(Hit, u64)> = hits
            .iter()
            .filter(|hit| self.leasable(hit))
            .filter_map(|hit| {
                let followed = counters.get_mut(&hit.key)?;
                let want = self.next_lease(followed, now)?;
                followed.leasing = true;
                Some((followed.hit.clone(), want))
            })
            .collect();
        drop(counters);
        for (hit, want) in leases {
            self.spawn_lease(hit, want, now);
        }
        for (hit, at) in returns {
            self.spawn_return(hit, at);
        }
        if outcomes.is_some() {
            self.metrics.from_slice.inc();
        } else if waited {
            self.metrics.while_leasing.inc();
        }
        outcomes
    }

    /// How much to lease for `followed` now, if it is busy, no lease is in flight, and its
    /// slice has run below half of what its demand calls for.
    fn next_lease(&self, followed: &Followed, now: Micros) -> Option<u64> {
        let rate = followed.demand.rate();
        if followed.leasing || rate < self.settings.busy_rate {
            return None;
        }
        let (window, _) = window_of(&followed.hit, now);
        let wanted = (rate * LOOKAHEAD)
            .div_ceil(MICROS_PER_SECOND)
            .max(MIN_SLICE);
        let held = followed
            .slice
            .filter(|slice| slice.window == window)
            .map_or(0, |slice| slice.left);
        if held > wanted / 2 {
            return None;
        }
        // Never more than a share of what is left: half of it split among the holders, so
        // that the others' slices and per-request hits find budget too.
        let limit = followed.hit.params.requests;
        let (unleased, holders) = match followed.unleased {
            Some((seen_in, unleased)) if seen_in == window => (unleased, followed.holders.max(1)),
            _ => (limit, 1),
        };
        let share = unleased / (2 * (holders + 1));
        let want = wanted.min(share).min(limit / 4);
        (want >= MIN_SLICE).then_some(want)
    }

    fn spawn_lease(&self, hit: Hit, want: u64, now: Micros) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let asked = Hit { hits: want, ..hit };
            let result = me.leases.lease(&asked, now).await;
            me.granted(&asked, now, result);
        });
    }

    /// Adds what a lease granted to the counter's slice of that window; a grant for a window
    /// that has ended meanwhile is dropped (its counter ends with it).
    fn granted(&self, hit: &Hit, at: Micros, result: Result<Grant, StoreError>) {
        let mut counters = self.counters();
        let grant = match result {
            Ok(grant) => grant,
            Err(error) => {
                tracing::debug!(%error, "a lease call failed; the counter is decided per request");
                self.metrics.failed.inc();
                if let Some(followed) = counters.get_mut(&hit.key) {
                    followed.leasing = false;
                }
                return;
            }
        };
        self.metrics.taken(grant.granted);
        let (window, end) = window_of(hit, at);
        let Some(followed) = counters.get_mut(&hit.key) else {
            drop(counters);
            // Forgotten meanwhile (a reset): the grant goes back at once.
            self.spawn_return(
                Hit {
                    hits: grant.granted,
                    ..hit.clone()
                },
                at,
            );
            return;
        };
        followed.leasing = false;
        followed.holders = grant.holders;
        followed.unleased = Some((window, hit.params.requests.saturating_sub(grant.count)));
        if grant.granted == 0 {
            return;
        }
        match &mut followed.slice {
            Some(slice) if slice.window == window => slice.left += grant.granted,
            Some(slice) if slice.window > window => {}
            _ => {
                followed.slice = Some(Slice {
                    window,
                    at,
                    left: grant.granted,
                    until: (at + self.settings.slice_life).min(end),
                })
            }
        }
    }

    fn spawn_return(&self, hit: Hit, at: Micros) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move { me.give_back(&hit, at).await });
    }

    async fn give_back(&self, hit: &Hit, at: Micros) {
        match self.leases.give_back_lease(hit, at).await {
            Ok(back) => self.metrics.returned(back),
            Err(error) => {
                tracing::debug!(%error, "returning a lease's unused budget failed; the counter under-admits until its window ends");
                self.metrics.failed.inc();
            }
        }
    }

    /// Gives back every slice of a current window: the counters that cooled down, or all of
    /// them (shutdown). Returns once the returns are answered.
    async fn give_back_where(&self, idle_since: Option<Micros>) {
        let returns: Vec<(Hit, Micros)> = {
            let mut counters = self.counters();
            let mut returns = Vec::new();
            counters.retain(|_, followed| {
                let idle = idle_since.is_none_or(|since| followed.last_used < since);
                if idle {
                    let now = self.leases.instant(&followed.hit);
                    if let (Some(slice), Ok(now)) = (followed.slice.take(), now) {
                        returns.extend(slice.unused_of_current(&followed.hit, now));
                    }
                }
                !idle || followed.leasing
            });
            returns
        };
        let giving = returns.iter().map(|(hit, at)| self.give_back(hit, *at));
        futures_util::future::join_all(giving).await;
    }

    /// The store's instant now, if any counter is followed (the cool-down's clock).
    fn latest(&self) -> Option<Micros> {
        let counters = self.counters();
        let followed = counters.values().next()?;
        self.leases.instant(&followed.hit).ok()
    }

    /// Forgets the slices of these counters (a reset: the store forgets what was leased).
    pub fn forget(&self, hits: &[Hit]) {
        let mut counters = self.counters();
        for hit in hits {
            counters.remove(&hit.key);
        }
    }
}

#[tonic::async_trait]
impl HeldLeases for Leased {
    fn by_default(&self) -> bool {
        self.settings.by_default
    }

    async fn give_back_all(&self) {
        self.give_back_where(None).await;
    }
}

#[tonic::async_trait]
impl CounterStore for Leased {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        if let Some(first) = hits.iter().find(|hit| self.leasable(hit))
            && let Ok(now) = self.leases.instant(first)
            && let Some(outcomes) = self.answer_from_slices(hits, now)
        {
            return Ok(outcomes);
        }
        self.store.apply(hits).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }
}

/// Every second, the counters unused for `COOL_AFTER` give their slices back and are
/// forgotten, until the store is dropped.
async fn cool_down(leased: Weak<Leased>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(leased) = leased.upgrade() else {
            return;
        };
        let Some(now) = leased.latest() else {
            continue;
        };
        leased
            .give_back_where(Some(now.saturating_sub(COOL_AFTER)))
            .await;
        leased.metrics.followed(leased.counters().len());
    }
}

mod slice;
#[cfg(test)]
mod tests;
