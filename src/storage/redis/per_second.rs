//! Per-second limits in a Redis of their own (`--store-per-second`, the reference's
//! `REDIS_PERSECOND`): the busiest counters, which live one second, kept apart from the rest.
//!
//! A request whose limits are all on one side is one call to that store, as usual. A request
//! with limits on both sides is one call to each, at once, and stays all-or-nothing as a
//! request spread over cluster nodes does: each call vetoes what it can see, and when the
//! request as a whole is vetoed (a denial on the other side) or a call fails, what the other
//! call committed is given back. A rejected request therefore never over-admits; it may
//! under-admit for the moment the refund is in flight.

use std::sync::Arc;

use super::RedisStore;
use super::fanout::Part;
use crate::algorithm::{Outcome, State};
use crate::clock::MICROS_PER_SECOND;
use crate::clock::Micros;
use crate::storage::rule::{undone_by_veto, vetoes};
use crate::storage::{
    CountLater, CounterLease, CounterReset, CounterStore, Demand, DemandPost, DemandShare, Grant,
    Hit, StoreClock, StoreError,
};

pub struct PerSecondSplit {
    main: Arc<RedisStore>,
    per_second: Arc<RedisStore>,
}

impl PerSecondSplit {
    pub fn new(main: Arc<RedisStore>, per_second: Arc<RedisStore>) -> Self {
        Self { main, per_second }
    }
}

/// Whether a hit counts in the per-second store: its limit's window is one second.
fn is_per_second(hit: &Hit) -> bool {
    hit.params.window == MICROS_PER_SECOND
}

/// The hits at `indices`, as a part of their own.
fn part_of(hits: &[Hit], indices: &[usize]) -> Vec<Hit> {
    indices.iter().map(|&index| hits[index].clone()).collect()
}

/// Copies a part's outcomes to their places in the request's.
fn place(outcomes: &mut [Outcome], indices: &[usize], part: &Part) {
    for (&index, outcome) in indices.iter().zip(&part.outcomes) {
        outcomes[index] = *outcome;
    }
}

#[tonic::async_trait]
impl CounterStore for PerSecondSplit {
    async fn apply(&self, hits: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        let (seconds, others): (Vec<usize>, Vec<usize>) =
            (0..hits.len()).partition(|&index| is_per_second(&hits[index]));
        if seconds.is_empty() {
            return self.main.apply(hits).await;
        }
        if others.is_empty() {
            return self.per_second.apply(hits).await;
        }
        let (second_hits, other_hits) = (part_of(hits, &seconds), part_of(hits, &others));
        let (mut main, mut fast) = futures_util::future::join(
            self.main.apply_part(&other_hits),
            self.per_second.apply_part(&second_hits),
        )
        .await;
        let mut outcomes = vec![Outcome::default(); hits.len()];
        place(&mut outcomes, &others, &main);
        place(&mut outcomes, &seconds, &fast);
        let failure = main.failure.take().or(fast.failure.take());
        let give = undone_by_veto(hits)
            && (failure.is_some() || vetoes(hits, |index| outcomes[index].allowed, true));
        if give {
            let (main_refunds, fast_refunds) = (
                std::mem::take(&mut main.refunds),
                std::mem::take(&mut fast.refunds),
            );
            futures_util::future::join(
                self.main.give_back_part(main_refunds, &mut main.outcomes),
                self.per_second
                    .give_back_part(fast_refunds, &mut fast.outcomes),
            )
            .await;
            place(&mut outcomes, &others, &main);
            place(&mut outcomes, &seconds, &fast);
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(outcomes),
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.main.ping().await?;
        self.per_second.ping().await
    }

    /// Which of the two did not answer is not known: both learn (a success on the other
    /// ends its streak).
    fn gave_up(&self, error: &StoreError) {
        self.main.gave_up(error);
        self.per_second.gave_up(error);
    }
}

#[tonic::async_trait]
impl CounterReset for PerSecondSplit {
    /// A key lives in one of the two stores; deleting it from both is simplest.
    async fn forget(&self, hits: &[Hit]) -> Result<(), StoreError> {
        self.main.forget(hits).await?;
        self.per_second.forget(hits).await
    }
}

#[tonic::async_trait]
impl DemandShare for PerSecondSplit {
    /// Demand is not per second: it lives with the other limits.
    async fn share_demand(&self, post: &DemandPost<'_>) -> Result<Vec<Demand>, StoreError> {
        self.main.share_demand(post).await
    }
}

/// A counter's leases go to the store that counts it.
impl StoreClock for PerSecondSplit {
    fn instant(&self, hit: &Hit) -> Result<Micros, StoreError> {
        self.store_of(hit).instant(hit)
    }
}

#[tonic::async_trait]
impl CountLater for PerSecondSplit {
    /// `hits` are one counter's (`CountLater`), so they live in one of the two stores.
    async fn apply_at(&self, hits: &[Hit], at: Micros) -> Result<Vec<Outcome>, StoreError> {
        match hits.first() {
            Some(hit) => self.store_of(hit).apply_at(hits, at).await,
            None => Ok(Vec::new()),
        }
    }
}

#[tonic::async_trait]
impl CounterLease for PerSecondSplit {
    async fn lease(
        &self,
        hit: &Hit,
        at: Micros,
        held: u64,
        life: Micros,
    ) -> Result<Grant, StoreError> {
        self.store_of(hit).lease(hit, at, held, life).await
    }

    async fn give_back_lease(
        &self,
        hit: &Hit,
        at: Micros,
        after: Option<&State>,
    ) -> Result<u64, StoreError> {
        self.store_of(hit).give_back_lease(hit, at, after).await
    }
}

impl PerSecondSplit {
    fn store_of(&self, hit: &Hit) -> &RedisStore {
        if is_per_second(hit) {
            &self.per_second
        } else {
            &self.main
        }
    }
}
