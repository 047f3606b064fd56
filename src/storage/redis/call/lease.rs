//! `Layout::Lease` (lua/lease.lua): takes part of a busy fixed window's budget for one
//! replica (a lease), which then decides from it without a call per hit (`storage::lease`).
//! Redis counts what it grants in the counter, as if hit, so that the counter never hands
//! out more than its limit in all: what a replica holds is already counted. Beside the
//! counter, the lease tally (a hash: holder → what it was granted and has not returned)
//! bounds what a holder can give back (`LeaseReturn`) by what it took since the counter was
//! last emptied, so a return never takes away hits that others counted after a reset, a flush
//! or a failover. The holder says what it believes the tally holds for it: less than that
//! means the counter was reset, flushed or rolled back since, and the holder's earlier slices
//! of the window are stale (`Grant::intact`).

use redis::{Cmd, Value};

use super::numbers::counter_ttl_ms;
use super::{Call, Layout, Op};
use crate::storage::{Grant, StoreError};

pub fn encode(call: &Call<'_>, command: &mut Cmd) {
    let (Some(hit), Op::Lease { holder, held, .. }) = (call.hits.first(), call.op) else {
        return;
    };
    command
        .arg(hit.params.requests)
        .arg(hit.hits)
        .arg(counter_ttl_ms(&hit.params, call.instant(), call.grace_ms))
        .arg(holder)
        .arg(held);
}

pub fn decode(call: &Call<'_>, reply: Value) -> Result<Grant, StoreError> {
    let malformed = || call.malformed(Layout::Lease, &reply);
    let Value::Array(numbers) = &reply else {
        return Err(malformed());
    };
    let number = |at: usize| match numbers.get(at) {
        Some(Value::Int(value)) => u64::try_from(*value).map_err(|_| malformed()),
        _ => Err(malformed()),
    };
    if numbers.len() != 4 {
        return Err(malformed());
    }
    Ok(Grant {
        granted: number(0)?,
        count: number(1)?,
        holders: number(2)?,
        intact: number(3)? == 1,
    })
}
