//! Which layout a call takes, and where each layout's encoding and decoding are: the one
//! place that names them all.

use redis::{Cmd, Value};

use super::numbers::is_counter;
use super::{
    Call, Layout, Op, Reply, apply, count, count_one, decide_one, give_back, lease, lease_return,
};
use crate::storage::{Role, StoreError};

impl Layout {
    /// The layout of `call`: the cheapest one that can carry it.
    pub fn of(call: &Call<'_>) -> Layout {
        let counters = !call.hits.is_empty()
            && call.hits.iter().all(|hit| is_counter(&hit.params))
            && one_charge(call);
        match (&call.op, call.hits, call.node) {
            (Op::GiveBack { .. }, _, _) => Layout::GiveBack,
            (Op::Lease { .. }, _, _) => Layout::Lease,
            (Op::LeaseReturn { .. }, _, _) => Layout::LeaseReturn,
            // Only Apply decides a refund in Redis; the others decode by charging.
            (Op::Apply { .. }, _, _) if has_refund(call) => Layout::Apply,
            (Op::Apply { .. }, [_], None) if counters => Layout::CountOne,
            (Op::Apply { .. }, _, _) if counters => Layout::Count,
            (Op::Apply { .. }, [hit], None) if decide_one::takes(&hit.params) => Layout::DecideOne,
            (Op::Apply { .. }, _, _) => Layout::Apply,
        }
    }

    /// Whether this layout can carry `call` (`of` picks the cheapest that can; a measurement
    /// may ask for another).
    pub fn carries(self, call: &Call<'_>) -> bool {
        let counters = call.hits.iter().all(|hit| is_counter(&hit.params))
            && !has_refund(call)
            && one_charge(call);
        let lone = call.hits.len() == 1 && call.node.is_none();
        match (self, &call.op) {
            (Layout::GiveBack, Op::GiveBack { .. }) => true,
            (Layout::Lease, Op::Lease { .. }) | (Layout::LeaseReturn, Op::LeaseReturn { .. }) => {
                lone && counters
            }
            (Layout::Apply, Op::Apply { .. }) => true,
            (Layout::Count, Op::Apply { .. }) => counters,
            (Layout::CountOne, Op::Apply { .. }) => counters && lone,
            (Layout::DecideOne, Op::Apply { .. }) => {
                lone && !counters
                    && !has_refund(call)
                    && call.hits.iter().all(|hit| decide_one::takes(&hit.params))
            }
            (_, _) => false,
        }
    }

    /// Writes the call's arguments (after its keys, or before them across slots).
    pub fn encode(self, call: &Call<'_>, command: &mut Cmd) {
        match self {
            Layout::CountOne => count_one::encode(call, command),
            Layout::Count => count::encode(call, command),
            Layout::DecideOne => decide_one::encode(call, command),
            Layout::Apply => apply::encode(call, command),
            Layout::GiveBack => give_back::encode(call, command),
            Layout::Lease => lease::encode(call, command),
            Layout::LeaseReturn => lease_return::encode(call, command),
        }
    }

    /// Reads the reply to `call`, for a layout that decides hits: the lease layouts answer
    /// budget instead (`lease::decode`, `lease_return::decode`).
    pub fn decode(self, call: &Call<'_>, reply: Value) -> Result<Reply, StoreError> {
        match self {
            Layout::Lease | Layout::LeaseReturn => Err(call.malformed(self, &"no decision")),
            Layout::CountOne => count_one::decode(call, reply),
            Layout::Count => count::decode(call, reply),
            Layout::DecideOne => decide_one::decode(call, reply),
            Layout::Apply => apply::decode(call, reply),
            Layout::GiveBack => give_back::decode(call, reply),
        }
    }
}

/// Whether every hit of a call has the same charge: the counting layouts say it once for the
/// call (a usage charge beside an admission goes by Apply, which says it per hit).
fn one_charge(call: &Call<'_>) -> bool {
    call.hits
        .windows(2)
        .all(|pair| pair[0].charge == pair[1].charge)
}

/// Whether a call gives hits back on a client's request (`Role::Refund`).
fn has_refund(call: &Call<'_>) -> bool {
    call.hits.iter().any(|hit| hit.role == Role::Refund)
}
