//! `Layout::Count` (lua/count.lua): hits on fixed windows aligned on the epoch only, any
//! number (one request's descriptors, a counter possibly named twice, all of one charge). Redis
//! counts each counter by INCRBY when the hits count the same and all fit, and otherwise
//! reads every counter, applies the request rule and counts each changed counter once; the
//! counts it found come back, with whether it committed, and the outcomes are worked out here
//! by the same rule, which must agree.

use redis::{Cmd, Value};

use super::numbers::{counter_ttl_ms, n, packed, role_code, window_start};
use super::{Call, Layout, Reply};
use crate::algorithm::{Charge, State, fixed_window};
use crate::storage::{StoreError, rule};

pub fn encode(call: &Call<'_>, command: &mut Cmd) {
    let now = call.instant();
    // Where a counter is named twice, each hit says which hit before it named it and whether
    // a later one does; the usual call, of distinct counters, goes without (less to unpack).
    let repeats = call.earlier().any(|earlier| earlier > 0);
    let header = [
        i64::from(call.hits.iter().all(|hit| hit.charge == Charge::Always)),
        i64::from(call.complete),
        i64::from(repeats),
        n(call.hits.len() as u64),
    ];
    let per_hit =
        call.hits
            .iter()
            .zip(call.earlier())
            .enumerate()
            .flat_map(|(index, (hit, earlier))| {
                let continued = call.hits[index + 1..]
                    .iter()
                    .any(|later| later.key == hit.key);
                let numbers = [
                    n(hit.params.requests),
                    n(hit.hits),
                    n(counter_ttl_ms(&hit.params, now, call.grace_ms)),
                    role_code(hit.role),
                    n(hit.descriptor as u64),
                    earlier,
                    i64::from(continued),
                ];
                numbers.into_iter().take(if repeats { 7 } else { 5 })
            });
    command.arg(packed(header.into_iter().chain(per_hit)).as_slice());
    // Every hit's count as text when they share it (the usual case): INCRBY takes it as is,
    // where a number from the packed argument would be formatted per counter.
    match call.hits.split_first() {
        Some((first, rest)) if rest.iter().all(|hit| hit.hits == first.hits) => {
            command.arg(first.hits)
        }
        _ => command.arg(""),
    };
}

pub fn decode(call: &Call<'_>, reply: Value) -> Result<Reply, StoreError> {
    let malformed = |reply: &Value| call.malformed(Layout::Count, reply);
    let Value::Array(values) = &reply else {
        return Err(malformed(&reply));
    };
    let count = |value: &Value| match value {
        Value::Int(count) => u64::try_from(*count).ok(),
        _ => None,
    };
    let (Some((committed, counts)), true) =
        (values.split_last(), values.len() == call.hits.len() + 1)
    else {
        return Err(malformed(&reply));
    };
    let now = call.instant();
    let found: Vec<Option<State>> = call
        .hits
        .iter()
        .zip(counts)
        .map(|(hit, value)| {
            let count = count(value).ok_or_else(|| malformed(&reply))?;
            Ok((count > 0).then(|| {
                State::FixedWindow(fixed_window::State {
                    window_start: window_start(&hit.params, now),
                    count,
                })
            }))
        })
        .collect::<Result<_, StoreError>>()?;
    let found: Vec<Option<&State>> = found.iter().map(Option::as_ref).collect();
    let decided = rule::decide(call.hits, &found, now, call.complete);
    if count(committed) != Some(u64::from(decided.committed)) {
        return Err(StoreError::MalformedReply(format!(
            "count call committed {committed:?}, where the request rule says {}",
            decided.committed
        )));
    }
    let after = (0..call.hits.len())
        .map(|index| decided.state_after(call.hits, &found, index))
        .collect();
    Ok(Reply {
        committed: decided.committed,
        outcomes: decided.outcomes.into_vec(),
        after,
    })
}
