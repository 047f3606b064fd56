//! One request, one round trip: the hits of a request become one call (a single Redis, or
//! every counter in one slot) or, on a cluster, one call per node serving their slots, all in
//! flight at once (`slots::plan`). Within a call the Lua code applies the request rule itself.
//! Across calls, a request vetoed by a denial in one of them, or failed in one of them, gives
//! back what the others committed (a `GiveBack` call per slot): a rejected request never
//! over-admits, and may briefly under-admit while the refund is in flight. The same refunds
//! serve a request spread over the two stores of `--store-per-second` (`per_second.rs`).

use super::RedisStore;
use super::call::{Call, Op, Reply};
use super::connection::Connection;
use super::slots::{Group, plan, split_by_slot};
use crate::algorithm::{Charge, Outcome, State};
use crate::clock::Micros;
use crate::storage::rule::{undone_by_veto, vetoes};
use crate::storage::{Hit, Role, StoreError};

/// What the calls of (part of) a request found: every hit's outcome (default where its call
/// failed), what the committed calls would give back, and the first failure.
pub struct Part {
    pub outcomes: Vec<Outcome>,
    pub refunds: Vec<Refund>,
    pub failure: Option<StoreError>,
}

impl Part {
    pub fn failed(hits: usize, error: StoreError) -> Self {
        Self {
            outcomes: vec![Outcome::default(); hits],
            refunds: Vec::new(),
            failure: Some(error),
        }
    }
}

/// What one slot of a committed call gives back when its request is vetoed elsewhere.
pub struct Refund {
    /// The hits, by index into the request's.
    indices: Vec<usize>,
    /// The hits, with `hits` 0 for those that did not consume.
    hits: Vec<Hit>,
    /// When the consuming call decided.
    at: Micros,
    /// The state the consuming call left each counter in.
    expected: Vec<Option<State>>,
}

impl RedisStore {
    /// Applies a whole request at `now`: one call, or one per node and a refund if vetoed.
    pub(super) async fn apply_remote(
        &self,
        connection: &Connection,
        hits: &[Hit],
        now: Micros,
    ) -> Result<Vec<Outcome>, StoreError> {
        let grouped = connection.is_cluster() && hits.len() > 1;
        // Held for the call: the groups borrow their nodes' addresses from it.
        let owners = grouped.then(|| self.topology.owners()).flatten();
        let groups = if grouped {
            plan(hits, owners.as_deref())
        } else {
            Vec::new()
        };
        // The whole request in one call (a single Redis, or every counter in one slot): the
        // Lua code applies the whole rule itself; no regrouping, no refund.
        if groups.len() <= 1 && !groups.first().is_some_and(|group| group.cross_slot) {
            let call = self.call(Op::Apply { now }, hits, None, true);
            return Ok(connection.call(&call).await?.outcomes);
        }
        let complete = groups.len() == 1;
        let mut part = self.gather(connection, hits, groups, now, complete).await;
        let give = undone_by_veto(hits)
            && (part.failure.is_some() || vetoes(hits, |index| part.outcomes[index].allowed, true));
        if give {
            let refunds = std::mem::take(&mut part.refunds);
            self.give_back(connection, refunds, &mut part.outcomes)
                .await;
        }
        match part.failure {
            Some(error) => Err(error),
            None => Ok(part.outcomes),
        }
    }

    /// Applies `hits` as one part of a request that spans two stores (`--store-per-second`):
    /// the calls veto only within themselves, and the caller, who sees the whole request,
    /// gives back (`give_back_part`) what a veto or a failure elsewhere undoes.
    pub async fn apply_part(&self, hits: &[Hit]) -> Part {
        let (connection, now) = match self.pool.connection().and_then(|c| Ok((c, self.now()?))) {
            Ok(found) => found,
            Err(error) => return Part::failed(hits.len(), error),
        };
        let owners = connection
            .is_cluster()
            .then(|| self.topology.owners())
            .flatten();
        let groups = if connection.is_cluster() {
            plan(hits, owners.as_deref())
        } else {
            vec![Group {
                indices: (0..hits.len()).collect(),
                cross_slot: false,
                node: None,
            }]
        };
        let part = self.gather(&connection, hits, groups, now, false).await;
        match &part.failure {
            Some(error) => self.treat(error),
            None => self.doctor.succeeded(),
        }
        part
    }

    /// Sends `refunds` of a part (see `apply_part`).
    pub async fn give_back_part(&self, refunds: Vec<Refund>, outcomes: &mut [Outcome]) {
        match self.pool.connection() {
            Ok(connection) => self.give_back(&connection, refunds, outcomes).await,
            Err(error) => {
                tracing::warn!(%error, "refund of a vetoed request failed; its counters under-admit until they reset")
            }
        }
    }

    /// Sends one call per group, all at once; a cross-slot group that found a counter off its
    /// node (a stale slot map) is sent again one slot at a time. Gathers the outcomes, what
    /// the committed calls would give back, and the first failure.
    async fn gather(
        &self,
        connection: &Connection,
        hits: &[Hit],
        groups: Vec<Group<'_>>,
        now: Micros,
        complete: bool,
    ) -> Part {
        let results = self
            .send_groups(connection, hits, &groups, now, complete)
            .await;
        let mut sent: Vec<(Group<'_>, Vec<Hit>, Reply)> = Vec::with_capacity(groups.len());
        let mut again = Vec::new();
        let mut failure = None;
        for (group, (group_hits, result)) in groups.into_iter().zip(results) {
            match result {
                Ok(Some(reply)) => sent.push((group, group_hits, reply)),
                Ok(None) => again.extend(split_by_slot(&group.indices, hits)),
                Err(error) => failure = failure.or(Some(error)),
            }
        }
        if !again.is_empty() {
            self.topology.report_stale();
        }
        if !again.is_empty() && failure.is_none() {
            let results = self.send_groups(connection, hits, &again, now, false).await;
            for (group, (group_hits, result)) in again.into_iter().zip(results) {
                match result {
                    Ok(Some(reply)) => sent.push((group, group_hits, reply)),
                    // One slot per call, routed by key: redis-rs follows the redirections.
                    Ok(None) => {
                        let moved = StoreError::unavailable("a counter's slot moved twice");
                        failure = failure.or(Some(moved));
                    }
                    Err(error) => failure = failure.or(Some(error)),
                }
            }
        }
        let mut outcomes = vec![Outcome::default(); hits.len()];
        for (group, _, reply) in &sent {
            for (&index, outcome) in group.indices.iter().zip(&reply.outcomes) {
                outcomes[index] = *outcome;
            }
        }
        Part {
            outcomes,
            refunds: refunds_of(&sent, now),
            failure,
        }
    }

    /// Applies each group's hits in one call, all at once; answers in the order of `groups`.
    /// A cross-slot group goes to its node's address (`None`: a counter was not there).
    async fn send_groups(
        &self,
        connection: &Connection,
        hits: &[Hit],
        groups: &[Group<'_>],
        now: Micros,
        complete: bool,
    ) -> Vec<(Vec<Hit>, Result<Option<Reply>, StoreError>)> {
        let grouped: Vec<Vec<Hit>> = groups
            .iter()
            .map(|group| group.indices.iter().map(|&i| hits[i].clone()).collect())
            .collect();
        let calls = groups.iter().zip(&grouped).map(|(group, group_hits)| {
            let node = group.node.filter(|_| group.cross_slot);
            async move {
                let call = self.call(Op::Apply { now }, group_hits, node, complete);
                connection.call_on_node(&call).await
            }
        });
        let results = futures_util::future::join_all(calls).await;
        grouped.into_iter().zip(results).collect()
    }

    /// Sends `refunds`; their allowed hits then report their counters as they are after the
    /// refund. The refund runs as its own task, so a caller that goes away (a client deadline)
    /// does not leave hits consumed; if it fails, the request is still answered as vetoed (or
    /// failed), its counters under-admitting briefly.
    async fn give_back(
        &self,
        connection: &Connection,
        refunds: Vec<Refund>,
        outcomes: &mut [Outcome],
    ) {
        if refunds.is_empty() {
            return;
        }
        let (connection, prefix) = (connection.clone(), self.options.key_prefix.clone());
        let sliding_window = self.options.redis_sliding_window_layout;
        let state_layout = self.options.redis_state_layout;
        let task = tokio::spawn(async move {
            let calls = refunds.iter().map(|refund| {
                let call = Call {
                    op: Op::GiveBack {
                        at: refund.at,
                        expected: &refund.expected,
                    },
                    hits: &refund.hits,
                    node: None,
                    complete: false,
                    prefix: &prefix,
                    // A refund never creates a counter (it keeps the found one's expiry).
                    grace_ms: 0,
                    sliding_window,
                    state_layout,
                };
                let connection = &connection;
                async move { connection.call(&call).await }
            });
            let replies = futures_util::future::join_all(calls).await;
            (refunds, replies)
        });
        let (refunds, replies) = match task.await {
            Ok(done) => done,
            Err(error) => {
                tracing::warn!(%error, "refund task failed");
                return;
            }
        };
        for (refund, reply) in refunds.iter().zip(replies) {
            match reply {
                Ok(reply) => {
                    for ((&index, hit), outcome) in
                        refund.indices.iter().zip(&refund.hits).zip(reply.outcomes)
                    {
                        if let Some(slot) = outcomes.get_mut(index).filter(|_| hit.hits > 0) {
                            *slot = outcome;
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "refund of a vetoed request failed; its counters under-admit until they reset");
                }
            }
        }
    }
}

/// What the committed calls in `sent` (each a group, its own hit list and its reply), decided
/// at `at`, give back: one refund per slot, routed by key (refunds are rare). A group's hits
/// are at positions 0.. of its own hit list.
fn refunds_of(sent: &[(Group<'_>, Vec<Hit>, Reply)], at: Micros) -> Vec<Refund> {
    sent.iter()
        .filter(|(_, _, reply)| reply.committed)
        .flat_map(|(group, hits, reply)| {
            let positions: Vec<usize> = (0..hits.len()).collect();
            split_by_slot(&positions, hits)
                .into_iter()
                .map(move |slot| Refund {
                    indices: slot.indices.iter().map(|&p| group.indices[p]).collect(),
                    hits: slot
                        .indices
                        .iter()
                        .map(|&p| Hit {
                            // A client's refund, and a charge that counts whatever the
                            // request's fate, are not undone by a veto (storage::rule).
                            hits: if reply.outcomes[p].allowed
                                && hits[p].role != Role::Refund
                                && hits[p].charge == Charge::IfAllowed
                            {
                                hits[p].hits
                            } else {
                                0
                            },
                            ..hits[p].clone()
                        })
                        .collect(),
                    at,
                    expected: slot
                        .indices
                        .iter()
                        .map(|&p| reply.after[p].clone())
                        .collect(),
                })
        })
        .collect()
}
