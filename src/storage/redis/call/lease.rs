//! `Layout::Lease` (lua/lease.lua): takes part of a busy counter's budget for one replica (a
//! lease), which then decides from it without a call per hit (`storage::lease`). A fixed
//! window's grant is counted as hits are, so that the counter never hands out more than its
//! limit in all: what a replica holds is already counted. A bucket's (token bucket, GCRA) is
//! taken by its algorithm's lease (`algorithm::leased`): hits the bucket admits at every
//! instant of the slice's life. Beside the counter, the lease tally (a hash): a fixed
//! window's (holder → what it was granted and has not returned) bounds what a holder can give
//! back of a window (`LeaseReturn`) by what it took since the counter was last emptied, so a
//! return never takes away hits that others counted after a reset, a flush or a failover. The
//! holder says what it believes the tally holds for it: less than that means the counter was
//! reset, flushed or rolled back since, and the holder's earlier slices are stale
//! (`Grant::intact`). A bucket's (holder → its last slice's end) counts the holders whose
//! slices still live; its slices need no such check, each ending with its life.

use redis::{Cmd, Value};

use super::apply::numbers_of;
use super::numbers::{counter_ttl_ms, is_counter, n, packed, state_from_numbers};
use super::{Call, Layout, Op};
use crate::storage::{Grant, StoreError};

pub fn encode(call: &Call<'_>, command: &mut Cmd) {
    let (
        Some(hit),
        Op::Lease {
            at,
            holder,
            held,
            life,
        },
    ) = (call.hits.first(), call.op)
    else {
        return;
    };
    // A fixed window's counter lives to its window's end and the grace; a bucket's until it
    // is full, which the call works out, then the grace.
    let ttl_ms = if is_counter(&hit.params) {
        counter_ttl_ms(&hit.params, at, call.grace_ms)
    } else {
        call.grace_ms
    };
    let [algorithm, requests, window, tick, parameter] = numbers_of(call, hit);
    let numbers = [
        algorithm,
        requests,
        window,
        tick,
        parameter,
        n(hit.hits),
        n(at),
        n(life),
        n(ttl_ms),
        n(held),
    ];
    command.arg(packed(numbers).as_slice()).arg(holder);
}

pub fn decode(call: &Call<'_>, reply: Value) -> Result<Grant, StoreError> {
    let malformed = || call.malformed(Layout::Lease, &reply);
    let Value::Array(values) = &reply else {
        return Err(malformed());
    };
    let mut numbers = Vec::with_capacity(values.len());
    for value in values {
        match value {
            Value::Int(number) => numbers.push(*number),
            _ => return Err(malformed()),
        }
    }
    let &[
        granted,
        unleased,
        holders,
        intact,
        first,
        second,
        reset_after,
    ] = numbers.as_slice()
    else {
        return Err(malformed());
    };
    let count = |number: i64| u64::try_from(number).map_err(|_| malformed());
    // A fixed window answers its limit less its count, which a usage charge can leave below 0.
    let overrun = unleased < 0;
    let unleased = unleased.max(0);
    // A fixed window answers no state (-1 -1); a bucket whose lease took nothing neither.
    let after = match (call.hits.first(), count(first), count(second)) {
        (Some(hit), Ok(first), Ok(second)) if !is_counter(&hit.params) => {
            Some(state_from_numbers(hit.params.algorithm, &[first, second]).ok_or_else(malformed)?)
        }
        _ => None,
    };
    Ok(Grant {
        granted: count(granted)?,
        unleased: count(unleased)?,
        overrun,
        holders: count(holders)?,
        intact: intact == 1,
        after,
        reset_after: count(reset_after)?,
    })
}
