//! A counter's stored state, whatever its algorithm: one variant per algorithm, each the
//! state of its pure functions. How a state is written as numbers, and read back, is the
//! Redis store's (`storage/redis/call/numbers.rs`).

use super::{fixed_window, gcra, sliding_log, sliding_window, token_bucket};

/// Stored state of one counter, whatever its algorithm. Kept to 32 bytes (the memory store
/// holds a million of them): the sliding log's queue is boxed, being a heap buffer anyway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    FixedWindow(fixed_window::State),
    SlidingWindow(sliding_window::State),
    SlidingLog(Box<sliding_log::State>),
    TokenBucket(token_bucket::State),
    Gcra(gcra::State),
}
