//! `Layout::LeaseReturn` (lua/lease_return.lua): gives back what a lease granted and its
//! holder did not use, while the lease's window is current (a key cooled down, a lease past
//! its time, a replica shutting down). What goes back is bounded by what the counter's lease
//! tally says the holder still holds, and by the count: a counter reset, flushed or rolled
//! back by a failover since the lease takes back nothing that others counted after it.

use redis::{Cmd, Value};

use super::{Call, Layout, Op};
use crate::storage::StoreError;

pub fn encode(call: &Call<'_>, command: &mut Cmd) {
    let (Some(hit), Op::LeaseReturn { holder, .. }) = (call.hits.first(), call.op) else {
        return;
    };
    command.arg(hit.hits).arg(holder);
}

/// The hits given back.
pub fn decode(call: &Call<'_>, reply: Value) -> Result<u64, StoreError> {
    match reply {
        Value::Int(back) => {
            u64::try_from(back).map_err(|_| call.malformed(Layout::LeaseReturn, &reply))
        }
        other => Err(call.malformed(Layout::LeaseReturn, &other)),
    }
}
