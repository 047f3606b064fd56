//! Fixed windows aligned on the epoch (the reference's only algorithm, and tollgate's default),
//! stored as one integer per window: the counter's key with the window's number appended,
//! counted by INCRBY (lua/counter.lua). That costs Redis about what the cheapest atomic counter
//! does, where the general layout (a string of numbers read, decided on and written back)
//! costs several times more. The window is chosen here, from the instant of the call, and the
//! outcomes are worked out here from the counts the script returns, by the Rust algorithm
//! itself.

use crate::algorithm::{self, Algorithm, Anchor, Charge, Params, State, fixed_window};
use crate::clock::Micros;
use crate::storage::{Hit, StoreError};

/// Whether a hit's counter has this layout.
pub fn is_counter(params: &Params) -> bool {
    params.algorithm
        == Algorithm::FixedWindow {
            anchor: Anchor::Epoch,
        }
}

/// The number of the window `instant` falls in, appended to the key.
pub fn window_number(params: &Params, instant: Micros) -> u64 {
    instant / params.window.max(1)
}

fn window_start(params: &Params, instant: Micros) -> Micros {
    window_number(params, instant) * params.window.max(1)
}

/// How long a counter created at `instant` lives: to the end of its window, in whole ms, plus
/// `slack_ms`, the grace that lets a hit of the window arriving late still find it
/// (`clock::grace`; longer with an explicit clock, which does not run with Redis's).
pub fn ttl_ms(params: &Params, instant: Micros, slack_ms: u64) -> u64 {
    let end = window_start(params, instant) + params.window.max(1);
    (end - instant).div_ceil(1000).max(1) + slack_ms
}

/// Turns what the count script answered (`{committed, count per hit}`: before each hit for an
/// apply, after the refund for a refund; for one hit, possibly `count * 2 + committed`) into
/// the general reply (lua/apply.lua): the instant, committed, then 6 numbers per hit.
pub fn general_reply(
    hits: &[Hit],
    raw: &[i64],
    instant: Micros,
    refund: bool,
    charge: Charge,
) -> Result<Vec<i64>, StoreError> {
    let malformed = || StoreError::MalformedReply(format!("counter script answered {raw:?}"));
    let (committed, counts) = match raw {
        &[packed] if hits.len() == 1 => (packed & 1, vec![packed >> 1]),
        [committed, counts @ ..] if counts.len() == hits.len() => (*committed, counts.to_vec()),
        _ => return Err(malformed()),
    };
    let counts = counts
        .into_iter()
        .map(|count| u64::try_from(count).map_err(|_| malformed()))
        .collect::<Result<Vec<u64>, StoreError>>()?;
    let state = |hit: &Hit, count: u64| {
        State::FixedWindow(fixed_window::State {
            window_start: window_start(&hit.params, instant),
            count,
        })
    };
    let mut reply = Vec::with_capacity(2 + 6 * hits.len());
    reply.extend([i64::try_from(instant).map_err(|_| malformed())?, committed]);
    // The count each counter holds after the call, as the hits leave it (a counter named twice
    // counts twice); the count before the call where the call was vetoed.
    let mut last: Vec<(&str, u64)> = Vec::new();
    let mut outcomes = Vec::with_capacity(hits.len());
    for (hit, &count) in hits.iter().zip(&counts) {
        let key = hit.key.as_str();
        let amount = if refund { 0 } else { hit.hits };
        let decided = algorithm::decide(
            &hit.params,
            Some(&state(hit, count)),
            instant,
            amount,
            charge,
        );
        let mut outcome = decided.outcome;
        let stored = last.iter().find(|(k, _)| *k == key).map(|&(_, c)| c);
        if committed == 0 && outcome.allowed {
            // Vetoed: an admitted hit reports a check on its counter as the call found it.
            let found = stored.unwrap_or(count);
            outcome = algorithm::decide(&hit.params, Some(&state(hit, found)), instant, 0, charge)
                .outcome;
        }
        let after = match decided.state {
            Some(State::FixedWindow(next)) if committed == 1 && !refund => next.count,
            _ => count,
        };
        match last.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) if committed == 1 => entry.1 = after,
            Some(_) => {}
            None => last.push((key, after)),
        }
        outcomes.push(outcome);
    }
    for (hit, outcome) in hits.iter().zip(&outcomes) {
        let held = last
            .iter()
            .find(|(k, _)| *k == hit.key.as_str())
            .map_or(0, |&(_, c)| c);
        reply.extend([
            i64::from(outcome.allowed),
            i64::try_from(outcome.remaining).unwrap_or(i64::MAX),
            i64::try_from(outcome.reset_after).unwrap_or(i64::MAX),
            i64::try_from(outcome.retry_after).unwrap_or(i64::MAX),
            i64::try_from(held).unwrap_or(i64::MAX),
            -1,
        ]);
    }
    Ok(reply)
}
