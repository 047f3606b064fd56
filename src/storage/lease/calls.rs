//! The lease and return calls of `Leased`, in the background: a grant added to its
//! counter's slice, or given back when it can no longer be used.

use super::slice::{Return, Slice, window_of};
use super::{Asked, Book, Leased};
use crate::algorithm::{State, leased};
use crate::clock::Micros;
use crate::storage::{Grant, Hit, StoreError};

impl Leased {
    /// Asks for a lease in the background.
    pub(super) fn spawn_lease(&self, asked: Asked) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let result = me
                .leases
                .lease(&asked.hit, asked.at, asked.held, asked.life)
                .await;
            me.granted(&asked, result);
        });
    }

    /// Adds what a lease granted to the counter's slice of that window, and lets the slice
    /// live `slice_life` from the lease: the store found the slice's budget still counted.
    /// If it did not (a reset, a flush, a failover since), the slice is stale and replaced by
    /// the grant. A grant for a window that has ended meanwhile is dropped (its counter ends
    /// with it); one asked for under another limit, before a reset of this replica's, or
    /// before the store denied a hit of the counter (usage may have taken it past its limit
    /// since the grant was counted), goes back at once.
    pub(super) fn granted(&self, asked: &Asked, result: Result<Grant, StoreError>) {
        if let Some((unused, at, after, call)) = self.land(asked, result) {
            self.spawn_return(unused, at, after, call);
        }
    }

    /// `granted` under the book's lock: the return it leads to, numbered as the counter's
    /// call, if any.
    fn land(&self, asked: &Asked, result: Result<Grant, StoreError>) -> Option<Return> {
        let mut guard = self.book();
        let Book {
            counters,
            calls,
            resets,
            ..
        } = &mut *guard;
        let followed = counters.get_mut(&asked.hit.key)?;
        let grant = match result {
            Ok(grant) => grant,
            Err(error) => {
                tracing::debug!(%error, "a lease call failed; the counter is decided per request");
                self.metrics.failed.inc();
                followed.ended(asked.call);
                return followed.next_parked(calls);
            }
        };
        self.metrics.taken(grant.granted);
        let hit = &asked.hit;
        let (window, end) = window_of(hit, asked.at);
        let trusted = *resets == asked.resets
            && followed.hit.params == hit.params
            && followed.denied < asked.call;
        if !trusted && grant.granted > 0 && followed.call == Some(asked.call) {
            // Asked before a reset, a denial or under another limit: it goes back, as the
            // counter's one call in flight.
            let call = Book::call(calls);
            followed.call = Some(call);
            let unused = Hit {
                hits: grant.granted,
                ..hit.clone()
            };
            return Some((unused, asked.at, grant.after, call));
        }
        followed.ended(asked.call);
        // A grant of a window before the one this replica holds budget of is never used
        // (its window has ended) and leaves the tally of the later one alone.
        if !trusted || window < followed.tally.0 {
            return followed.next_parked(calls);
        }
        followed.holders = grant.holders;
        followed.unleased = Some((window, grant.unleased));
        if grant.overrun {
            // Usage counted past the limit: nothing held is budget left, and it goes back
            // (the grant is nothing: nothing was left).
            return followed
                .return_slice(asked.at, calls)
                .or_else(|| followed.next_parked(calls));
        }
        if !grant.intact {
            tracing::debug!(
                "a leased counter was reset, flushed or rolled back; its slice is dropped"
            );
            followed.tally = (window, 0);
            followed.slice = followed.slice.take().filter(|slice| slice.window != window);
        }
        if followed.tally.0 == window {
            followed.tally.1 = followed.tally.1.saturating_add(grant.granted);
        } else {
            followed.tally = (window, grant.granted);
        }
        let until = asked.at.saturating_add(asked.life).min(end);
        let full_at = asked.at.saturating_add(grant.reset_after);
        let slice = Slice {
            window,
            at: asked.at,
            left: grant.granted,
            spent: 0,
            until,
            expiring: None,
            last: grant.after.map(|after| (after, grant.granted)),
            full_at,
        };
        match &mut followed.slice {
            // A bucket's grant is good for its own life: it never renews the slice held.
            Some(held) if leased::is_bucket(&hit.params) => {
                if grant.granted > 0 {
                    add_to_bucket_slice(held, slice, asked.at);
                }
            }
            Some(held) if held.window == window => {
                held.left = held.left.saturating_add(grant.granted);
                held.until = held.until.max(until);
                held.full_at = full_at;
            }
            Some(held) if held.window > window => {}
            _ if grant.granted == 0 => {}
            _ => followed.slice = Some(slice),
        }
        followed.next_parked(calls)
    }

    /// Gives back in the background, as the counter's call numbered `call`: its next lease
    /// waits for the answer.
    pub(super) fn spawn_return(&self, hit: Hit, at: Micros, after: Option<State>, call: u64) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            me.give_back(&hit, at, after.as_ref()).await;
            me.ended(&hit.key, call);
        });
    }

    pub(super) async fn give_back(&self, hit: &Hit, at: Micros, after: Option<&State>) {
        match self.leases.give_back_lease(hit, at, after).await {
            Ok(back) => self.metrics.returned(back),
            Err(error) => {
                tracing::debug!(%error, "returning a lease's unused budget failed; the counter under-admits until its window ends");
                self.metrics.failed.inc();
            }
        }
    }
}

/// A bucket's new grant (`granted`, a slice of its own) added to the slice held: what the
/// held slice has left becomes the part that expires first (with what an earlier grant left,
/// at the earlier of their ends), and the slice lives to the new grant's end. Only the new
/// grant can go back.
pub(super) fn add_to_bucket_slice(held: &mut Slice, granted: Slice, now: Micros) {
    held.settle(now);
    if held.left > 0 && held.until > now {
        let by = held
            .expiring
            .map_or(held.until, |(_, by)| by.min(held.until));
        held.expiring = Some((held.left, by));
        held.left = held.left.saturating_add(granted.left);
    } else {
        held.expiring = None;
        held.left = granted.left;
    }
    held.at = granted.at;
    held.until = granted.until;
    held.last = granted.last;
    held.full_at = granted.full_at;
}
