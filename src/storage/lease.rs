//! Leases: a busy counter's budget (a fixed window's, a token bucket's, a GCRA limit's), held
//! in part by the replica that sees it busy, which then decides its hits without a store call
//! each (docs/design.md, "Leases").
//!
//! A replica that sees a leasable counter busy (`--lease-busy-rate` hits a second on this
//! replica) takes a slice of what its window has left in one store call (`CounterLease`); the
//! store counts the slice as hits, so slices outstanding never exceed what the limit has left
//! and the fleet never admits more than the limit. A request whose every hit fits in this
//! replica's slices is answered from them (a client's refund of a fixed window's goes back
//! into the slice, up to what the slice spent in its window: as the store would have given
//! it back off a count that holds the slice's grant); any other request goes to the store as
//! it would without leases, slices untouched, so a request stays all-or-nothing whatever its
//! mix, and a charge that counts whether admitted or not (usage, `--count-denied`) and does
//! not fit is counted there, past the limit too. The
//! next slice is asked for in the background when the slice runs low: a decision never waits
//! on a lease, and each lease checks that the store still counts what this replica holds
//! (a reset, a flush or a failover since makes the slice stale). Unused budget goes back (a
//! `LeaseReturn`) when a slice has gone `--deny-cache-max-ttl` without a lease renewing it
//! (so a reset reaches every replica within it), when its counter cools down, and on
//! shutdown; a slice of a window that has ended is dropped, its counter
//! with it. A replica that dies loses its slices: the fleet under-admits, never over.
//!
//! A bucket's slice differs in two ways (`algorithm::leased`): each grant is good for its
//! own life only (at most `--deny-cache-max-ttl`, and half the burst's refill), never renewed,
//! so hits left of an earlier grant are dropped when its life ends; and what goes back is at
//! most the last grant, only while the bucket is as that grant left it (nobody has taken from
//! it since, so the hits go back as if never taken). Anything else unused is lost.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::keys::CounterKey;
use super::{CounterLease, CounterStore, DecideAtOnce, HeldLeases, Hit, PerHit, Role, StoreError};
use crate::algorithm::{Algorithm, Anchor, Outcome, Params, leased};
use crate::clock::{MICROS_PER_SECOND, Micros};
use crate::limit::Lease;
use crate::metrics::Metrics;
use crate::metrics::lease::LeaseMetrics;
use slice::{Followers, Return, Spotter};

/// How this replica leases (`--lease` and its companions).
#[derive(Debug, Clone, Copy)]
pub struct LeaseSettings {
    /// Whether a counter whose rule does not say is leased when busy (`--lease auto`).
    pub by_default: bool,
    /// Hits a second on one counter, seen by this replica, from which it leases.
    pub busy_rate: u64,
    /// The longest a slice is used after the last lease that found it intact
    /// (`--deny-cache-max-ttl`): a reset of the counter reaches this replica within it.
    pub slice_life: Micros,
}

/// A slice covers about this long of this replica's demand, so that the next one, asked for
/// when it runs half out, comes back before it is gone, and a busy counter costs a few calls
/// a second whatever its rate.
const LOOKAHEAD: Micros = 500_000;
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
    book: Mutex<Book>,
    metrics: LeaseMetrics,
    me: Weak<Leased>,
}

/// The counters this replica follows, and what it knows of the others.
#[derive(Default)]
struct Book {
    counters: Followers,
    spotter: Spotter,
    /// Resets of counters so far: a grant asked for before one is not trusted.
    resets: u64,
    /// Calls made so far, which number the next (`Followed::call`).
    calls: u64,
}

impl Book {
    /// The number of a new call.
    fn call(calls: &mut u64) -> u64 {
        *calls += 1;
        *calls
    }
}

/// Whether a limit's counter is leased while busy: a fixed window aligned on the epoch or a
/// bucket whose slices can live long enough (`leased::slice_life`), large enough to split,
/// leased by its rule (`lease`) or by default (`--lease auto`).
pub fn leased_when_busy(lease: Lease, params: &Params, by_default: bool) -> bool {
    let wanted = match lease {
        Lease::Auto => true,
        Lease::Off => false,
        Lease::AsConfigured => by_default,
    };
    let leasable = if leased::is_bucket(params) {
        leased::slice_life(params, Micros::MAX).is_some()
    } else {
        params.algorithm
            == (Algorithm::FixedWindow {
                anchor: Anchor::Epoch,
            })
    };
    wanted && leasable && budget(params) >= MIN_SLICE * 2
}

/// The most a counter can hand out at once: a fixed window's limit, a bucket's burst.
fn budget(params: &Params) -> u64 {
    match params.algorithm {
        Algorithm::TokenBucket { burst } | Algorithm::Gcra { burst } => burst,
        _ => params.requests,
    }
}

/// A lease asked for: the hit to lease with (`hits` asked), its instant, the life of its
/// slice, what this replica believes it holds of the counter, the resets seen when it was
/// asked, and its number.
struct Asked {
    hit: Hit,
    at: Micros,
    life: Micros,
    held: u64,
    resets: u64,
    call: u64,
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
            book: Mutex::new(Book::default()),
            metrics: metrics.lease.clone(),
            me: me.clone(),
        });
        tokio::spawn(cool_down(Arc::downgrade(&leased)));
        leased
    }

    /// Whether `hit` may be answered from its counter's slice: a charge on a counter leased
    /// when busy, or a client's refund of a fixed window's, which goes back into the slice
    /// it was spent from (`slice::take`; a bucket's goes to the store, which knows which
    /// emission slots it frees).
    fn leasable(&self, hit: &Hit) -> bool {
        let into_slice = hit.role != Role::Refund || !leased::is_bucket(&hit.params);
        into_slice && leased_when_busy(hit.lease, &hit.params, self.settings.by_default)
    }

    /// How long a slice of `hit`'s counter is used: a fixed window's, `--deny-cache-max-ttl`
    /// from the last lease that found it counted; a bucket's, from its lease, and no longer
    /// than half its burst's refill.
    fn life(&self, hit: &Hit) -> Micros {
        if leased::is_bucket(&hit.params) {
            leased::slice_life(&hit.params, self.settings.slice_life).unwrap_or(0)
        } else {
            self.settings.slice_life
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A panic elsewhere while holding the lock leaves only demand figures behind.
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Gives back the slices of the counters idle for `idle_for` by their store's clock, or
    /// of all of them (shutdown), and forgets those counters once no call of theirs is in
    /// flight (a counter with one gives back at the next pass, or, at shutdown, not at all).
    /// Returns once the returns are answered.
    async fn give_back_where(&self, idle_for: Option<Micros>) {
        let returns: Vec<Return> = {
            let mut guard = self.book();
            let book = &mut *guard;
            let mut returns = Vec::new();
            let calls = &mut book.calls;
            book.counters.retain(|_, followed| {
                let Ok(now) = self.leases.instant(&followed.hit) else {
                    return true;
                };
                let idle =
                    idle_for.is_none_or(|idle| followed.last_used.saturating_add(idle) < now);
                if !idle || followed.call.is_some() {
                    return true;
                }
                let Some((unused, at, after)) = followed.give_back_slice(now) else {
                    return false;
                };
                let call = Book::call(calls);
                followed.call = Some(call);
                returns.push((unused, at, after, call));
                true
            });
            returns
        };
        let giving = returns.iter().map(|(hit, at, after, call)| async move {
            self.give_back(hit, *at, after.as_ref()).await;
            self.ended(&hit.key, *call);
        });
        futures_util::future::join_all(giving).await;
    }

    /// Ends the call numbered `call` on the counter of `key`, if it is the one in flight;
    /// then sends the return parked meanwhile, if any.
    fn ended(&self, key: &CounterKey, call: u64) {
        let parked = {
            let mut guard = self.book();
            let Book {
                counters, calls, ..
            } = &mut *guard;
            let Some(followed) = counters.get_mut(key) else {
                return;
            };
            followed.ended(call);
            followed.next_parked(calls)
        };
        if let Some((hit, at, after, call)) = parked {
            self.spawn_return(hit, at, after, call);
        }
    }

    /// Forgets the slices of these counters and what they held (a reset: the store forgets
    /// what was leased), and every grant asked for before. Called before the store forgets
    /// and again after, so that a lease landing in between is not used either.
    pub fn forget(&self, hits: &[Hit]) {
        let mut book = self.book();
        book.resets += 1;
        for hit in hits {
            if let Some(followed) = book.counters.get_mut(&hit.key) {
                followed.forget();
            }
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
        if !hits.iter().any(|hit| self.leasable(hit)) {
            return self.store.apply(hits).await;
        }
        let nows = self.instants(hits);
        if let Some(outcomes) = self.answer_from_slices(hits, &nows) {
            return Ok(outcomes.into_vec());
        }
        let outcomes = self.store.apply(hits).await?;
        self.learn(hits, &outcomes, &nows);
        Ok(outcomes)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }
}

impl DecideAtOnce for Leased {
    fn apply_at_once(&self, hits: &[Hit]) -> Option<Result<PerHit<Outcome>, StoreError>> {
        self.answer_at_once(hits).map(Ok)
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
        leased.give_back_where(Some(COOL_AFTER)).await;
        let followed = leased.book().counters.len();
        leased.metrics.followed(followed);
    }
}

mod answer;
mod calls;
mod slice;
#[cfg(test)]
mod tests;
