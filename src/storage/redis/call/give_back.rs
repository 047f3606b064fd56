//! `Layout::GiveBack` (lua/give_back.lua): gives back what a committed call consumed when its
//! request was vetoed elsewhere (another node of a cluster, the other store of
//! `--store-per-second`). Each counter takes back all its hits at once under its algorithm's
//! refund rule; an `IfUnchanged` one only while it is still in the state the consuming call
//! left (sent here), so a refund never hands out hits nobody paid for.

use redis::{Cmd, Value};

use super::apply::{numbers_of, outcomes};
use super::numbers::{integers, n, packed, state_numbers};
use super::{Call, Layout, Op, Reply};
use crate::algorithm::Refund;
use crate::storage::StoreError;

pub fn encode(call: &Call<'_>, command: &mut Cmd) {
    let expected = match call.op {
        Op::GiveBack { expected, .. } => expected,
        Op::Apply { .. } | Op::Lease { .. } | Op::LeaseReturn { .. } => &[],
    };
    let header = [n(call.instant()), n(call.hits.len() as u64)];
    let per_hit =
        call.hits
            .iter()
            .zip(call.earlier())
            .enumerate()
            .flat_map(|(index, (hit, earlier))| {
                let [algorithm, requests, window, tick, parameter] = numbers_of(call, hit);
                // A counter whose refund requires its state, and that state's first two numbers
                // (-1 -1, which no state holds, when the consuming call did not tell it).
                let required = hit.params.algorithm.refund() == Refund::IfUnchanged;
                let state = expected
                    .get(index)
                    .and_then(Option::as_ref)
                    .map(state_numbers)
                    .unwrap_or_default();
                let number = |at: usize| state.get(at).map_or(-1, |&value| n(value));
                [
                    algorithm,
                    requests,
                    window,
                    tick,
                    parameter,
                    n(hit.hits),
                    earlier,
                    i64::from(required),
                    number(0),
                    number(1),
                ]
            });
    command.arg(packed(header.into_iter().chain(per_hit)).as_slice());
}

pub fn decode(call: &Call<'_>, reply: Value) -> Result<Reply, StoreError> {
    let values = integers(reply)?;
    let (outcomes, after) = outcomes(call, Layout::GiveBack, &values)?;
    Ok(Reply {
        committed: true,
        outcomes,
        after,
    })
}
