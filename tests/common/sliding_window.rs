//! A sliding window as Redis holds it in its two layouts (`SlidingWindowLayout`): its state as
//! text under its key, and one integer per window under its key with the window's number
//! appended. A decision sees the two added up; these helpers read what Redis holds that way,
//! to compare it with the state the Rust algorithm left.

use tollgate::algorithm::{Params, State};
use tollgate::clock::Micros;
use tollgate::storage::redis::call::numbers::WINDOW_COUNTS;

/// The number of the newest window a decision at `instant` sees, given the state the Rust
/// algorithm holds (which a late hit finds already in the next window).
pub fn newest_window(params: &Params, model: Option<&State>, instant: Micros) -> u64 {
    let at = instant / params.window;
    match model {
        Some(State::SlidingWindow(state)) => {
            at.max(state.window_start * tick(params) / params.window)
        }
        _ => at,
    }
}

/// The counts of window `number` and the one before it in the Rust algorithm's state.
pub fn modelled(params: &Params, model: Option<&State>, number: u64) -> (u64, u64) {
    match model {
        Some(State::SlidingWindow(state)) => counts_in(
            params,
            [state.window_start, state.current, state.previous],
            number,
        ),
        _ => (0, 0),
    }
}

/// The counts of window `number` and the one before it as Redis holds them under `key`, both
/// layouts added up; panics if Redis holds anything of a later window. A window's counter holds
/// its count plus `WINDOW_COUNTS` times the previous window's, copied in when it was created;
/// without one, the previous count is the previous window's counter's own.
pub async fn stored(
    connection: &mut redis::aio::MultiplexedConnection,
    key: &str,
    params: &Params,
    number: u64,
) -> (u64, u64) {
    let (text, later, counter, before): (Option<String>, Option<u64>, Option<u64>, Option<u64>) =
        redis::cmd("MGET")
            .arg(key)
            .arg(format!("{key}:{}", number + 1))
            .arg(format!("{key}:{number}"))
            .arg(format!("{key}:{}", number - 1))
            .query_async(connection)
            .await
            .unwrap();
    assert_eq!(later, None, "{key}: a counter of window {}", number + 1);
    // Marked, the text holds no counts: they moved into the counters.
    let text = text.filter(|text| text != "counters");
    let (stated_current, stated_previous) = text.map_or((0, 0), |text| {
        let numbers: Vec<u64> = text.split(' ').map(|n| n.parse().unwrap()).collect();
        let &[start, current, previous] = numbers.as_slice() else {
            panic!("{key}: a sliding window's state is three numbers, not {text:?}");
        };
        counts_in(params, [start, current, previous], number)
    });
    let (counted_current, counted_previous) = match (counter, before) {
        (Some(counter), _) => {
            assert!(counter < CLOSED, "{key}: window {number}'s counter closed");
            (counter % WINDOW_COUNTS, counter / WINDOW_COUNTS)
        }
        (None, Some(before)) => {
            assert!(
                before < CLOSED,
                "{key}: window {}'s counter closed",
                number - 1
            );
            (0, before % WINDOW_COUNTS)
        }
        (None, None) => (0, 0),
    };
    (
        stated_current + counted_current,
        stated_previous + counted_previous,
    )
}

/// Added to a window's counter once the next window's exists.
const CLOSED: u64 = 1 << 52;

/// A state `[start (ticks), current, previous]` as the counts of window `number` and the one
/// before it; panics if it is of a later window.
fn counts_in(params: &Params, [start, current, previous]: [u64; 3], number: u64) -> (u64, u64) {
    let window = params.window / tick(params);
    let at = number * window;
    assert!(start <= at, "a state of window {start} found after {at}");
    if start == at {
        (current, previous)
    } else if start + window == at {
        (0, current)
    } else {
        (0, 0)
    }
}

fn tick(params: &Params) -> Micros {
    params.tick().unwrap()
}
