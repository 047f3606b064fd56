//! Denied charges that must still count, answered by the deny cache without a store call:
//! a charge that counts whether admitted or not (usage reported when a stream ends,
//! `--count-denied`) is denied locally as any other, and counted in the store later, in a
//! batch.
//!
//! Each counter's deferred hits are added up and counted by one call every `FLUSH_EVERY`,
//! at the instant of the first of them by the store's clock, so a client hammering a limit
//! it is over costs the store one call per counter per period rather than one per request,
//! and every hit is counted in full. A fixed window's hits of two windows are counted apart,
//! each in its own. Bound: a deferred hit reaches the store within `FLUSH_EVERY` and one
//! call (the store timeout) after the batch it joined began, counted at that batch's first
//! instant, never in another fixed window; well within the grace a counter is kept past its
//! window's end, so the window it counts in still exists. A flush that fails (or times out,
//! when the store may still have counted it) is counted in
//! `tollgate_deferred_hits_lost_total` and logged (the store was failing every call then).
//! Shutdown counts what is left, after any flush in flight (`Deferred::flush_all`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use super::keys::CounterKey;
use super::{CountLater, Flush, Hit, StoreError};
use crate::algorithm::{Algorithm, Anchor, Charge};
use crate::clock::Micros;
use crate::metrics::Metrics;

/// How often deferred hits are counted: short enough that they land within a counter's
/// grace past its window (the store timeout and more), long enough that a counter hammered
/// at thousands of requests a second costs the store tens of calls.
pub const FLUSH_EVERY: Duration = Duration::from_millis(25);

/// One counter's hits waiting to be counted: the hit (its `hits`, their sum) and the instant
/// of the first of them.
struct Pending {
    hit: Hit,
    at: Micros,
}

pub struct Deferred {
    /// By counter and, for a fixed window aligned on the epoch, its window's number.
    pending: Mutex<HashMap<(CounterKey, u64), Pending>>,
    /// Held by a flush while it sends: shutdown's flush waits for the one in flight.
    flushing: tokio::sync::Mutex<()>,
    store: Arc<dyn CountLater>,
    timeout: Duration,
    /// `tollgate_deferred_hits_total`.
    deferred: Counter,
    /// `tollgate_deferred_hits_lost_total`.
    lost: Counter,
}

impl Deferred {
    /// Defers to `store`, each flush within `timeout`; counts every `FLUSH_EVERY` until
    /// dropped. Must run inside a tokio runtime.
    pub fn start(store: Arc<dyn CountLater>, timeout: Duration, metrics: &Metrics) -> Arc<Self> {
        let deferred = Arc::new(Self {
            pending: Mutex::new(HashMap::new()),
            flushing: tokio::sync::Mutex::new(()),
            store,
            timeout,
            deferred: metrics.store.deferred_hits.clone(),
            lost: metrics.store.deferred_hits_lost.clone(),
        });
        tokio::spawn(flush_every(Arc::downgrade(&deferred)));
        deferred
    }

    /// Defers the charges of `hits` that count whether admitted or not, each at its store's
    /// instant now; an error, with nothing deferred, when a store's clock is not known (the
    /// caller then asks the store).
    pub fn defer(&self, hits: &[Hit]) -> Result<(), StoreError> {
        let counted: Vec<(&Hit, Micros)> = hits
            .iter()
            .filter(|hit| hit.charge == Charge::Always && hit.hits > 0)
            .map(|hit| Ok((hit, self.store.instant(hit)?)))
            .collect::<Result<_, StoreError>>()?;
        if counted.is_empty() {
            return Ok(());
        }
        let mut pending = self.pending();
        for (hit, at) in counted {
            let key = (hit.key.clone(), window_number(hit, at));
            let waiting = pending.entry(key).or_insert_with(|| Pending {
                hit: Hit {
                    hits: 0,
                    ..hit.clone()
                },
                at,
            });
            waiting.hit.hits = waiting.hit.hits.saturating_add(hit.hits);
            self.deferred.inc_by(hit.hits);
        }
        Ok(())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<(CounterKey, u64), Pending>> {
        // A panic elsewhere while holding the lock leaves only sums of hits behind.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts every deferred hit now, one call per counter, all at once, after the flush in
    /// flight if any.
    async fn flush(&self) {
        let _turn = self.flushing.lock().await;
        let batch: Vec<Pending> = self.pending().drain().map(|(_, pending)| pending).collect();
        let counting = batch.iter().map(|pending| async move {
            let counted = self
                .store
                .apply_at(std::slice::from_ref(&pending.hit), pending.at);
            let result = match tokio::time::timeout(self.timeout, counted).await {
                Ok(result) => result.map(drop),
                Err(_) => Err(StoreError::Timeout(self.timeout)),
            };
            if let Err(error) = result {
                self.lost.inc_by(pending.hit.hits);
                tracing::warn!(%error, hits = pending.hit.hits, "denied hits that count could not be counted in the store");
            }
        });
        futures_util::future::join_all(counting).await;
    }
}

#[tonic::async_trait]
impl Flush for Deferred {
    async fn flush_all(&self) {
        self.flush().await;
    }
}

/// The number of the window a fixed window aligned on the epoch counts `at` in (its counter
/// in the store is per window); 0 for every other counter, whose state is one.
fn window_number(hit: &Hit, at: Micros) -> u64 {
    match hit.params.algorithm {
        Algorithm::FixedWindow {
            anchor: Anchor::Epoch,
        } => at / hit.params.window.max(1),
        _ => 0,
    }
}

/// Counts what is deferred every `FLUSH_EVERY`, until the deferred counts are dropped.
async fn flush_every(deferred: Weak<Deferred>) {
    let mut every = tokio::time::interval(FLUSH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(deferred) = deferred.upgrade() else {
            return;
        };
        deferred.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Outcome, Params};
    use crate::storage::keys::{EntryValue, counter_key};
    use crate::storage::{Role, StoreClock};

    /// A store that records what it is asked to count, at which instant.
    #[derive(Default)]
    struct Recorder {
        now: Mutex<Micros>,
        counted: Mutex<Vec<(String, u64, Micros)>>,
    }

    impl StoreClock for Recorder {
        fn instant(&self, _: &Hit) -> Result<Micros, StoreError> {
            Ok(*self.now.lock().unwrap())
        }
    }

    #[tonic::async_trait]
    impl CountLater for Recorder {
        async fn apply_at(&self, hits: &[Hit], at: Micros) -> Result<Vec<Outcome>, StoreError> {
            let mut counted = self.counted.lock().unwrap();
            counted.extend(
                hits.iter()
                    .map(|hit| (hit.key.as_str().to_owned(), hit.hits, at)),
            );
            Ok(vec![Outcome::default(); hits.len()])
        }
    }

    fn usage(user: &str, hits: u64, charge: Charge) -> Hit {
        let params = Params {
            algorithm: Algorithm::default(),
            requests: 10,
            window: 60_000_000,
        };
        Hit {
            descriptor: 0,
            key: counter_key("d", [("user", EntryValue::Actual(user))], &params),
            params,
            hits,
            role: Role::Enforced,
            charge,
            lease: crate::limit::Lease::AsConfigured,
        }
    }

    #[tokio::test]
    async fn each_counters_hits_are_counted_in_one_call_at_the_first_ones_instant_per_window() {
        let store = Arc::new(Recorder::default());
        let deferred = Deferred {
            pending: Mutex::new(HashMap::new()),
            flushing: tokio::sync::Mutex::new(()),
            store: Arc::clone(&store) as Arc<dyn CountLater>,
            timeout: Duration::from_secs(1),
            deferred: Counter::default(),
            lost: Counter::default(),
        };
        let at = |micros| *store.now.lock().unwrap() = micros;
        at(119_000_000);
        deferred.defer(&[usage("a", 700, Charge::Always)]).unwrap();
        at(119_500_000);
        let admission = usage("b", 3, Charge::IfAllowed);
        deferred
            .defer(&[usage("a", 300, Charge::Always), admission])
            .unwrap();
        // The next minute: a window of its own.
        at(120_000_000);
        deferred.defer(&[usage("a", 5, Charge::Always)]).unwrap();
        deferred.flush_all().await;
        let mut counted = store.counted.lock().unwrap().clone();
        counted.sort_by_key(|&(_, _, at)| at);
        let key = usage("a", 0, Charge::Always).key.as_str().to_owned();
        assert_eq!(
            counted,
            [(key.clone(), 1_000, 119_000_000), (key, 5, 120_000_000)]
        );
        assert_eq!(deferred.deferred.get(), 1_005);
        deferred.flush_all().await;
        assert_eq!(store.counted.lock().unwrap().len(), 2, "flushed once");
    }
}
