//! `Layout::Apply` (lua/apply.lua): any hits of any algorithms, decided and answered in Redis,
//! atomically, by the request rule's Lua twin; the general call, for what the other layouts
//! do not carry (algorithms mixed in one request, a long sliding log, a request across the
//! slots of a cluster node).

use redis::{Cmd, Value};

use super::numbers::{integers, n, packed, role_and_charge, role_code, state_from_numbers, tick};
use super::{Call, Layout, Reply};
use crate::algorithm::{Charge, Outcome, State};
use crate::storage::{Hit, Role, StoreError};

pub fn encode(call: &Call<'_>, command: &mut Cmd) {
    // When every charge counts whether admitted or not (`--count-denied`), the call says it
    // once; otherwise each such charge says it in its role. A call either build could send
    // is then written as the builds before this one wrote it.
    let charges = || call.hits.iter().filter(|hit| hit.role != Role::Refund);
    let always = charges().next().is_some() && charges().all(|hit| hit.charge == Charge::Always);
    let header = [
        n(call.instant()),
        i64::from(always),
        i64::from(call.complete),
        n(call.grace_ms),
        n(call.hits.len() as u64),
    ];
    let per_hit = call
        .hits
        .iter()
        .zip(call.earlier())
        .flat_map(|(hit, earlier)| {
            let [algorithm, requests, window, tick, parameter] = numbers_of(call, hit);
            [
                algorithm,
                requests,
                window,
                tick,
                parameter,
                n(hit.hits),
                if always {
                    role_code(hit.role)
                } else {
                    role_and_charge(hit)
                },
                n(hit.descriptor as u64),
                earlier,
            ]
        });
    command.arg(packed(header.into_iter().chain(per_hit)).as_slice());
}

/// What the Lua port needs of a hit's limit: its algorithm's code, requests, window (µs), tick
/// (µs) and parameter (in ticks).
pub fn numbers_of(call: &Call<'_>, hit: &Hit) -> [i64; 5] {
    let params = &hit.params;
    let tick = tick(params);
    [
        call.code(params),
        n(params.requests),
        n(params.window),
        n(tick),
        n(params.algorithm.parameter_in_ticks(tick)),
    ]
}

pub fn decode(call: &Call<'_>, reply: Value) -> Result<Reply, StoreError> {
    let values = integers(reply)?;
    let Some((&committed, per_hit)) = values.split_first() else {
        return Err(call.malformed(Layout::Apply, &values));
    };
    let (outcomes, after) = outcomes(call, Layout::Apply, per_hit)?;
    Ok(Reply {
        committed: committed == 1,
        outcomes,
        after,
    })
}

/// Numbers per hit in Apply's and GiveBack's answers.
const PER_HIT: usize = 6;

/// Per hit: allowed (1|0), remaining, reset_after µs, retry_after µs, and the first two
/// numbers of the counter's state after the call (-1: none).
pub fn outcomes(
    call: &Call<'_>,
    layout: Layout,
    values: &[i64],
) -> Result<(Vec<Outcome>, Vec<Option<State>>), StoreError> {
    if values.len() != call.hits.len() * PER_HIT {
        return Err(call.malformed(layout, &values));
    }
    let non_negative =
        |value: i64| u64::try_from(value).map_err(|_| call.malformed(layout, &values));
    let mut outcomes = Vec::with_capacity(call.hits.len());
    let mut after = Vec::with_capacity(call.hits.len());
    for (hit, numbers) in call.hits.iter().zip(values.chunks_exact(PER_HIT)) {
        outcomes.push(Outcome {
            allowed: numbers[0] == 1,
            remaining: non_negative(numbers[1])?,
            reset_after: non_negative(numbers[2])?,
            retry_after: non_negative(numbers[3])?,
        });
        // Two numbers are a whole state only for the algorithms whose refund requires one.
        let state = match (u64::try_from(numbers[4]), u64::try_from(numbers[5])) {
            (Ok(first), Ok(second)) => state_from_numbers(hit.params.algorithm, &[first, second]),
            _ => None,
        };
        after.push(state);
    }
    Ok((outcomes, after))
}
