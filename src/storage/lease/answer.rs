//! A request answered from this replica's slices: at once, when every hit's counter is
//! followed and its slice holds what the request asks (`answer_at_once`, with nothing done
//! when it cannot); else on the way to the store, following the counters' demand and
//! returning stale slices (`answer_from_slices`). Either way the next leases are asked for in
//! the background, and the store's own answers say what is left to lease (`learn`).

use super::slice::{Followed, follow, take, window_of};
use super::{Asked, Book, LOOKAHEAD, Leased, MIN_SLICE, budget};
use crate::algorithm::{Charge, Outcome};
use crate::clock::{MICROS_PER_SECOND, Micros};
use crate::storage::{Hit, PerHit, Role};

impl Leased {
    /// Each leasable hit's instant, by its own store's clock (`--store-per-second` has two).
    pub(super) fn instants(&self, hits: &[Hit]) -> PerHit<Option<Micros>> {
        hits.iter()
            .map(|hit| {
                self.leasable(hit)
                    .then(|| self.leases.instant(hit).ok())
                    .flatten()
            })
            .collect()
    }

    /// The request answered from this replica's slices, if every hit is leasable, its
    /// counter followed under the same limit, and its slice usable and holding what the
    /// request asks of it; the demand followed and the next leases asked for. `None`, with
    /// nothing done, otherwise: `answer_from_slices` then sees the request as if this was
    /// never asked.
    pub(super) fn answer_at_once(&self, hits: &[Hit]) -> Option<PerHit<Outcome>> {
        if !hits.iter().all(|hit| self.leasable(hit)) {
            return None;
        }
        let mut guard = self.book();
        let book = &mut *guard;
        // A counter not followed is the common miss (a cold key): found out before the
        // clock is read.
        let mut found: PerHit<Option<usize>> = PerHit::with_capacity(hits.len());
        for hit in hits {
            found.push(Some(book.counters.get_index_of(&hit.key)?));
        }
        let mut nows: PerHit<Option<Micros>> = PerHit::with_capacity(hits.len());
        for (hit, index) in hits.iter().zip(&found) {
            let now = self.leases.instant(hit).ok()?;
            let (_, followed) = book.counters.get_index((*index)?)?;
            let fresh = followed.hit.params == hit.params
                && followed
                    .slice
                    .as_ref()
                    .is_some_and(|slice| slice.usable(hit, now));
            if !fresh {
                return None;
            }
            nows.push(Some(now));
        }
        let outcomes = take(&mut book.counters, hits, &nows, &found)?;
        for ((hit, now), index) in hits.iter().zip(&nows).zip(&found) {
            if let (Some(now), Some(index), false) = (*now, *index, hit.role == Role::Refund)
                && let Some((_, followed)) = book.counters.get_index_mut(index)
            {
                followed.demand.add(now, hit.hits.max(1));
                followed.last_used = now;
            }
        }
        let leases = self.next_leases(book, hits, &nows, &found);
        drop(guard);
        for asked in leases {
            self.spawn_lease(asked);
        }
        self.metrics.from_slice.inc();
        Some(outcomes)
    }

    /// The request answered from this replica's slices, if every hit is leasable and fits in
    /// its counter's slice; the demand followed and the next leases asked for either way.
    pub(super) fn answer_from_slices(
        &self,
        hits: &[Hit],
        nows: &[Option<Micros>],
    ) -> Option<PerHit<Outcome>> {
        let mut guard = self.book();
        let book = &mut *guard;
        let mut local = true;
        let mut returns = Vec::new();
        // Each hit's counter in the book, found once (its key hashed once a request).
        let mut found: PerHit<Option<usize>> = PerHit::with_capacity(hits.len());
        for (hit, now) in hits.iter().zip(nows) {
            let Some(now) = *now else {
                local = false;
                found.push(None);
                continue;
            };
            // A refund is no demand: it goes back into a slice held and usable under the
            // same limit, or to the store.
            if hit.role == Role::Refund {
                let held = book.counters.get_index_of(&hit.key).filter(|&index| {
                    book.counters.get_index(index).is_some_and(|(_, followed)| {
                        followed.hit.params == hit.params
                            && followed
                                .slice
                                .as_ref()
                                .is_some_and(|slice| slice.usable(hit, now))
                    })
                });
                local &= held.is_some();
                found.push(held);
                continue;
            }
            let hits_now = hit.hits.max(1);
            let busy_rate = self.settings.busy_rate;
            let spotter = &mut book.spotter;
            let busy = || spotter.busy(&hit.key, now, hits_now, busy_rate);
            let Some(index) = follow(&mut book.counters, hit, now, busy) else {
                local = false;
                found.push(None);
                continue;
            };
            found.push(Some(index));
            let Some((_, followed)) = book.counters.get_index_mut(index) else {
                continue;
            };
            followed.demand.add(now, hits_now);
            followed.last_used = now;
            // The rules changed the limit (the key is the same): what was leased under the
            // old one goes back under the old one, and the next lease asks under the new one.
            let changed = followed.hit.params != hit.params;
            let stale = followed
                .slice
                .as_ref()
                .is_some_and(|slice| !slice.usable(hit, now));
            if changed || stale {
                // One call at a time per counter: with a call in flight, what the slice
                // holds goes back once it ends.
                returns.extend(followed.return_slice(now, &mut book.calls));
            }
            if changed {
                followed.hit.params = hit.params;
                followed.unleased = None;
            }
        }
        let outcomes = if local {
            take(&mut book.counters, hits, nows, &found)
        } else {
            None
        };
        let waited = outcomes.is_none()
            && hits.iter().all(|hit| self.leasable(hit))
            && found.iter().flatten().any(|&index| {
                book.counters
                    .get_index(index)
                    .is_some_and(|(_, followed)| followed.call.is_some())
            });
        let leases = self.next_leases(book, hits, nows, &found);
        drop(guard);
        for asked in leases {
            self.spawn_lease(asked);
        }
        for (hit, at, after, call) in returns {
            self.spawn_return(hit, at, after, call);
        }
        if outcomes.is_some() {
            self.metrics.from_slice.inc();
        } else if waited {
            self.metrics.while_leasing.inc();
        }
        outcomes
    }

    /// The leases to ask for after a request (`nows`: its hits' instants; `found`: their
    /// counters in the book), each numbered as its counter's call in flight.
    fn next_leases(
        &self,
        book: &mut Book,
        hits: &[Hit],
        nows: &[Option<Micros>],
        found: &[Option<usize>],
    ) -> Vec<Asked> {
        let mut leases = Vec::new();
        for ((hit, now), index) in hits.iter().zip(nows).zip(found) {
            let (Some(now), Some(index)) = (*now, *index) else {
                continue;
            };
            let Some((_, followed)) = book.counters.get_index_mut(index) else {
                continue;
            };
            let life = self.life(&followed.hit);
            let Some(want) = self.next_lease(followed, now, life) else {
                continue;
            };
            let call = Book::call(&mut book.calls);
            followed.call = Some(call);
            leases.push(Asked {
                hit: Hit {
                    hits: want,
                    ..followed.hit.clone()
                },
                at: now,
                life,
                held: followed.held_in(window_of(hit, now).0),
                resets: book.resets,
                call,
            });
        }
        leases
    }

    /// What the store's answers say nobody holds of the followed counters: the next lease's
    /// size goes by it. A denied charge that counts whatever its fate (usage) gives this
    /// replica's slice of its counter back: usage may have taken the count past the limit,
    /// and what the slice holds is then no budget left. (An admission's denial leaves the
    /// slice: without usage, budget held is budget counted within the limit.)
    pub(super) fn learn(&self, hits: &[Hit], outcomes: &[Outcome], nows: &[Option<Micros>]) {
        let mut returns = Vec::new();
        {
            let mut guard = self.book();
            let Book {
                counters, calls, ..
            } = &mut *guard;
            for ((hit, outcome), now) in hits.iter().zip(outcomes).zip(nows) {
                let (Some(now), Some(followed)) = (*now, counters.get_mut(&hit.key)) else {
                    continue;
                };
                if followed.hit.params != hit.params {
                    continue;
                }
                followed.unleased = Some((window_of(hit, now).0, outcome.remaining));
                if outcome.allowed || hit.charge != Charge::Always {
                    continue;
                }
                followed.denied = *calls;
                returns.extend(followed.return_slice(now, calls));
            }
        }
        for (hit, at, after, call) in returns {
            self.spawn_return(hit, at, after, call);
        }
    }

    /// How much to lease for `followed` now, if it is busy, no call is in flight, and its
    /// slice has run below half of what its demand calls for over `LOOKAHEAD`, or half the
    /// slice's `life` if shorter (a bucket's grant is used within its own life).
    fn next_lease(&self, followed: &Followed, now: Micros, life: Micros) -> Option<u64> {
        let rate = followed.demand.rate();
        if followed.call.is_some() || rate < self.settings.busy_rate || life == 0 {
            return None;
        }
        let (window, _) = window_of(&followed.hit, now);
        let wanted = rate
            .saturating_mul(LOOKAHEAD.min(life / 2))
            .div_ceil(MICROS_PER_SECOND)
            .max(MIN_SLICE);
        let held = followed
            .slice
            .as_ref()
            .filter(|slice| slice.window == window)
            .map_or(0, |slice| slice.left);
        if held > wanted / 2 {
            return None;
        }
        // Never more than a share of what is left: half of it split among the holders, so
        // that the others' slices and per-request hits find budget too.
        let limit = budget(&followed.hit.params);
        let (unleased, holders) = match followed.unleased {
            Some((seen_in, unleased)) if seen_in == window => (unleased, followed.holders.max(1)),
            _ => (limit, 1),
        };
        let share = unleased / (2 * (holders + 1));
        let want = wanted.min(share).min(limit / 4);
        (want >= MIN_SLICE).then_some(want)
    }
}
