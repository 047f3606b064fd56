//! Giving back what the committed calls of a vetoed or failed request consumed: on a cluster a
//! request is one call per node, and on two stores (`--store-per-second`) one per store, so a
//! denial in one call can veto hits another call has already counted. The refunds are worked
//! out from the replies as owned values, so that any caller holding them can send them.

use super::connection::Connection;
use super::script::{Call, Mode, Reply};
use super::slots::{Group, split_by_slot};
use crate::algorithm::{Charge, Outcome};
use crate::clock::Micros;
use crate::storage::{Hit, StoreError};

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

/// What one slot of a committed call of a vetoed request gives back.
pub struct Refund {
    /// The hits, by index into the request's.
    indices: Vec<usize>,
    /// The hits, with `hits` 0 for those that did not consume.
    hits: Vec<Hit>,
    /// When the apply call consumed.
    at: Micros,
    /// The state the apply call left, which an `IfUnchanged` algorithm's refund requires.
    expected: Vec<(i64, i64)>,
}

/// What the committed calls in `sent` (each a group, its own hit list and its reply) give
/// back: one refund per slot, routed by key (refunds are rare). A group's hits are at
/// positions 0.. of its own hit list.
pub fn refunds_of(sent: &[(Group<'_>, Vec<Hit>, Reply)]) -> Vec<Refund> {
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
                            hits: if reply.outcomes[p].allowed {
                                hits[p].hits
                            } else {
                                0
                            },
                            ..hits[p].clone()
                        })
                        .collect(),
                    at: reply.now,
                    expected: slot.indices.iter().map(|&p| reply.states[p]).collect(),
                })
        })
        .collect()
}

/// Sends `refunds`; their allowed hits then report their counters as they are after the
/// refund. The refund runs as its own task, so a caller that goes away (a client deadline)
/// does not leave hits consumed; if it fails, the request is still answered as vetoed (or
/// failed), its counters under-admitting briefly.
pub async fn give_back(
    connection: &Connection,
    prefix: &str,
    refunds: Vec<Refund>,
    outcomes: &mut [Outcome],
) {
    if refunds.is_empty() {
        return;
    }
    let (connection, prefix) = (connection.clone(), prefix.to_owned());
    let task = tokio::spawn(async move {
        let calls = refunds.iter().map(|refund| {
            let call = Call {
                mode: Mode::Refund { at: refund.at },
                hits: &refund.hits,
                node: None,
                now: None,
                charge: Charge::IfAllowed,
                complete: false,
                expected: &refund.expected,
                prefix: &prefix,
                // A refund never creates a counter (it keeps the found one's expiry).
                grace_ms: 0,
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
