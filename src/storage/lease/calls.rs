//! The lease and return calls of `Leased`, in the background: a grant added to its
//! counter's slice, or given back when it can no longer be used.

use super::slice::{Slice, window_of};
use super::{Asked, Book, Leased};
use crate::clock::Micros;
use crate::storage::{Grant, Hit, StoreError};

impl Leased {
    /// Asks for a lease in the background.
    pub(super) fn spawn_lease(&self, asked: Asked) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let result = me.leases.lease(&asked.hit, asked.at, asked.held).await;
            me.granted(&asked, result);
        });
    }

    /// Adds what a lease granted to the counter's slice of that window, and lets the slice
    /// live `slice_life` from the lease: the store found the slice's budget still counted.
    /// If it did not (a reset, a flush, a failover since), the slice is stale and replaced by
    /// the grant. A grant for a window that has ended meanwhile is dropped (its counter ends
    /// with it); one asked for under another limit, or before a reset of this replica's, goes
    /// back at once.
    pub(super) fn granted(&self, asked: &Asked, result: Result<Grant, StoreError>) {
        let mut guard = self.book();
        let book = &mut *guard;
        let resets = book.resets;
        let Some(followed) = book.counters.get_mut(&asked.hit.key) else {
            return;
        };
        let grant = match result {
            Ok(grant) => grant,
            Err(error) => {
                tracing::debug!(%error, "a lease call failed; the counter is decided per request");
                self.metrics.failed.inc();
                followed.ended(asked.call);
                return;
            }
        };
        self.metrics.taken(grant.granted);
        let hit = &asked.hit;
        let (window, end) = window_of(hit, asked.at);
        let trusted = resets == asked.resets && followed.hit.params == hit.params;
        if !trusted && grant.granted > 0 && followed.call == Some(asked.call) {
            // Asked before a reset or under another limit: it goes back, as the counter's
            // one call in flight.
            let call = Book::call(&mut book.calls);
            followed.call = Some(call);
            let unused = Hit {
                hits: grant.granted,
                ..hit.clone()
            };
            drop(guard);
            self.spawn_return(unused, asked.at, call);
            return;
        }
        followed.ended(asked.call);
        // A grant of a window before the one this replica holds budget of is never used
        // (its window has ended) and leaves the tally of the later one alone.
        if !trusted || window < followed.tally.0 {
            return;
        }
        followed.holders = grant.holders;
        followed.unleased = Some((window, hit.params.requests.saturating_sub(grant.count)));
        if !grant.intact {
            tracing::debug!(
                "a leased counter was reset, flushed or rolled back; its slice is dropped"
            );
            followed.tally = (window, 0);
            followed.slice = followed.slice.filter(|slice| slice.window != window);
        }
        if followed.tally.0 == window {
            followed.tally.1 = followed.tally.1.saturating_add(grant.granted);
        } else {
            followed.tally = (window, grant.granted);
        }
        let until = asked.at.saturating_add(self.settings.slice_life).min(end);
        match &mut followed.slice {
            Some(slice) if slice.window == window => {
                slice.left = slice.left.saturating_add(grant.granted);
                slice.until = slice.until.max(until);
            }
            Some(slice) if slice.window > window => {}
            _ if grant.granted == 0 => {}
            _ => {
                followed.slice = Some(Slice {
                    window,
                    at: asked.at,
                    left: grant.granted,
                    until,
                })
            }
        }
    }

    /// Gives back in the background, as the counter's call numbered `call`: its next lease
    /// waits for the answer.
    pub(super) fn spawn_return(&self, hit: Hit, at: Micros, call: u64) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            me.give_back(&hit, at).await;
            me.ended(&hit.key, call);
        });
    }

    pub(super) async fn give_back(&self, hit: &Hit, at: Micros) {
        match self.leases.give_back_lease(hit, at).await {
            Ok(back) => self.metrics.returned(back),
            Err(error) => {
                tracing::debug!(%error, "returning a lease's unused budget failed; the counter under-admits until its window ends");
                self.metrics.failed.inc();
            }
        }
    }
}
