//! `Layout::CountOne` (lua/count_one.lua): one charged hit on a fixed window aligned on the
//! epoch, the reference's only algorithm and tollgate's default, alone in its call. INCRBY
//! (undone when over), and the count found comes back, from which the request rule works out
//! the outcome. Its four arguments go as text: INCRBY takes the hits as they are, and packing
//! saves nothing on so few numbers.

use redis::{Cmd, Value};

use super::numbers::{counter_ttl_ms, window_start};
use super::{Call, Layout, Reply};
use crate::algorithm::{Charge, State, fixed_window};
use crate::storage::{StoreError, rule};

pub fn encode(call: &Call<'_>, command: &mut Cmd) {
    let Some(hit) = call.hits.first() else {
        return;
    };
    command
        .arg(hit.params.requests)
        .arg(hit.hits)
        .arg(counter_ttl_ms(&hit.params, call.instant(), call.grace_ms))
        .arg(if hit.charge == Charge::Always {
            "1"
        } else {
            "0"
        });
}

pub fn decode(call: &Call<'_>, reply: Value) -> Result<Reply, StoreError> {
    let (Value::Int(count), [hit]) = (&reply, call.hits) else {
        return Err(call.malformed(Layout::CountOne, &reply));
    };
    let count = u64::try_from(*count).map_err(|_| call.malformed(Layout::CountOne, &reply))?;
    let now = call.instant();
    let found = (count > 0).then(|| {
        State::FixedWindow(fixed_window::State {
            window_start: window_start(&hit.params, now),
            count,
        })
    });
    let decided = rule::decide(call.hits, &[found.as_ref()], now, call.complete);
    let after = decided.state_after(call.hits, &[found.as_ref()], 0);
    Ok(Reply {
        committed: decided.committed,
        outcomes: decided.outcomes.into_vec(),
        after: vec![after],
    })
}
