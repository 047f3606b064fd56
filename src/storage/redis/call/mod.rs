//! The Redis call protocol: every layout tollgate sends, named by `Layout` and chosen by one
//! function, `Layout::of` (`dispatch.rs`). Each layout has a file here with its arguments
//! and its reply's decoding side by side, and a function of the same name in the Lua library
//! (`lua/<layout>.lua`), called by name; nothing tells layouts apart by counting arguments.
//! How a call travels (FCALL, the library's load, scripts where functions cannot run) is
//! `transport.rs`.
//!
//! Three kinds of reply: the layouts that answer what their counters held (`CountOne`,
//! `Count`, `DecideOne`) are decoded by the request rule (`storage::rule`), which works out
//! every outcome, as the memory store does; `Apply` and `GiveBack` answer the outcomes Redis
//! worked out; the lease layouts (`Lease`, `LeaseReturn`) decide no hit and answer budget
//! taken or given back (`storage::lease`). docs/performance.md has what each layout costs
//! Redis.

mod apply;
mod count;
mod count_one;
mod decide_one;
mod dispatch;
mod give_back;
pub mod lease;
pub mod lease_return;
pub mod numbers;

use crate::algorithm::{Algorithm, Outcome, Params, State};
use crate::clock::Micros;
use crate::storage::{Hit, StoreError};
use numbers::{is_counter, window_number};

/// How a call's hits go over the wire and come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// One charged hit on a fixed window aligned on the epoch, the common call: INCRBY, and
    /// the count found comes back.
    CountOne,
    /// Hits on fixed windows aligned on the epoch only: each counted by INCRBY when all fit,
    /// else every counter read (MGET) and each changed one counted; the counts found come
    /// back.
    Count,
    /// One charged hit of another algorithm (a sliding log only up to `numbers::LONGEST_LOG`):
    /// the state found comes back.
    DecideOne,
    /// Any hits, decided and answered in Redis.
    Apply,
    /// Gives back what a committed call consumed, when its request was vetoed elsewhere.
    GiveBack,
    /// Takes part of a busy counter's budget for this replica (`Op::Lease`): a fixed
    /// window's, a token bucket's or a GCRA limit's.
    Lease,
    /// Gives back what a fixed window's lease granted and its holder did not use
    /// (`Op::LeaseReturn`); a bucket's goes back by `GiveBack`.
    LeaseReturn,
}

impl Layout {
    pub const ALL: [Layout; 7] = [
        Layout::CountOne,
        Layout::Count,
        Layout::DecideOne,
        Layout::Apply,
        Layout::GiveBack,
        Layout::Lease,
        Layout::LeaseReturn,
    ];

    /// The layout's name, which its function in the library carries.
    pub fn name(self) -> &'static str {
        match self {
            Layout::CountOne => "count_one",
            Layout::Count => "count",
            Layout::DecideOne => "decide_one",
            Layout::Apply => "apply",
            Layout::GiveBack => "give_back",
            Layout::Lease => "lease",
            Layout::LeaseReturn => "lease_return",
        }
    }

    /// The Lua function a call of this layout runs: with declared keys, or across the slots
    /// of one node (no declared key: the keys follow the arguments). `None`: the layout has
    /// no such form.
    pub fn entry(self, cross_slot: bool) -> Option<&'static str> {
        match (self, cross_slot) {
            (Layout::CountOne, false) => Some("count_one"),
            (Layout::Count, false) => Some("count_declared"),
            (Layout::Count, true) => Some("count_cross_slot"),
            (Layout::DecideOne, false) => Some("decide_one"),
            (Layout::Apply, false) => Some("apply"),
            (Layout::Apply, true) => Some("apply_cross_slot"),
            (Layout::GiveBack, false) => Some("give_back"),
            (Layout::Lease, false) => Some("lease"),
            (Layout::LeaseReturn, false) => Some("lease_return"),
            (
                Layout::CountOne
                | Layout::DecideOne
                | Layout::GiveBack
                | Layout::Lease
                | Layout::LeaseReturn,
                true,
            ) => None,
        }
    }

    /// Whether the layout decides hits: the lease layouts hand out and take back budget.
    pub fn decides(self) -> bool {
        !matches!(self, Layout::Lease | Layout::LeaseReturn)
    }

    /// Whether the call also declares its counter's lease tally, after the counter.
    pub fn declares_tally(self) -> bool {
        matches!(self, Layout::Lease | Layout::LeaseReturn)
    }
}

/// What a call does with its hits.
#[derive(Debug, Clone, Copy)]
pub enum Op<'a> {
    /// Decides them at this instant (Redis's clock as tracked, or a test's).
    Apply { now: Micros },
    /// Gives back each hit's `hits`, consumed at `at` by a call that left each counter in the
    /// state `expected` names (per hit), which an `IfUnchanged` algorithm requires it to still
    /// be in.
    GiveBack {
        at: Micros,
        expected: &'a [Option<State>],
    },
    /// Takes up to the one hit's `hits` of its counter's budget at `at` for `holder` (a
    /// replica's name), which believes the counter's tally holds `held` for it, for a slice
    /// used until `at + life` at the latest.
    Lease {
        at: Micros,
        holder: &'a str,
        held: u64,
        life: Micros,
    },
    /// Gives back up to the one hit's `hits` that `holder` leased in the window of `at`.
    LeaseReturn { at: Micros, holder: &'a str },
}

/// How a sliding window's hits are written to Redis (`--redis-sliding-window-layout`). Each
/// layout is read first by the replicas writing it, the other when it holds counts
/// (lua/window_counters.lua), so replicas writing either share a counter exactly: the layout
/// can be switched one replica at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SlidingWindowLayout {
    /// Its state as text under its key (`start current previous`), rewritten by SET with its
    /// expiry on each hit: what every build before the counters layout reads and writes, so
    /// the default while they may run.
    #[default]
    Text,
    /// One integer per window under its key with the window's number appended (the window's
    /// count and the previous window's, packed), counted by INCRBY, as a fixed window's; for
    /// limits under `numbers::WINDOW_COUNTS`.
    Counters,
}

/// How a lone hit (`Layout::DecideOne`) writes a token bucket, a GCRA limit or a sliding log
/// to Redis (`--redis-state-layout`). Every path reads both, so replicas writing either share
/// a counter exactly: the layout can be switched one replica at a time once none runs a build
/// that reads only text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StateLayout {
    /// Its numbers as text (`level updated`, `tat remainder`, `at hits at hits …`), kept until
    /// its limit is fully available again, then the grace: what every build before the packed
    /// layout reads and writes, so the default while they may run.
    #[default]
    Text,
    /// Its numbers packed after a tag byte (`numbers::packed_numbers`), nothing for Redis to
    /// parse or format, with an expiry tollgate works out (`decide_one::packed_expiry_ms`): a
    /// bucket's, the longest it can take to fill, then the grace; a log's, its text's. Other
    /// layouts than `DecideOne` still write text.
    Packed,
}

/// One call: `hits` (all in one slot, or with `node` on one node), and what to do with them.
pub struct Call<'a> {
    pub op: Op<'a>,
    pub hits: &'a [Hit],
    /// `Some(host, port)`: the hits span several slots of the cluster node at that address,
    /// and go to it by the layout's cross-slot function, declaring no key (Redis requires
    /// declared keys to share a slot). With no declared key Redis never redirects the call (no
    /// MOVED, no ASK, so no ASKING that would make a migrating slot's missing counters look
    /// local): a counter not on the node fails the read of it, before any write.
    pub node: Option<(&'a str, u16)>,
    /// Whether the hits are the whole request (see `storage::rule`).
    pub complete: bool,
    /// Put before every key (`--store-key-prefix`); it holds no `{`, so slots are unchanged.
    pub prefix: &'a str,
    /// How long past the moment its state stops mattering a counter is kept, in ms
    /// (`clock::grace`): a hit decided at an instant of a window that reaches Redis late must
    /// find that window's counter, never start it again.
    pub grace_ms: u64,
    /// How the call writes sliding windows (`--redis-sliding-window-layout`).
    pub sliding_window: SlidingWindowLayout,
    /// How a lone hit writes a bucket or a sliding log (`--redis-state-layout`).
    pub state_layout: StateLayout,
}

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Whether the hits were consumed (not vetoed within the call).
    pub committed: bool,
    pub outcomes: Vec<Outcome>,
    /// Per hit, the state its counter holds after the call, where the reply tells it (a
    /// later refund of an `IfUnchanged` algorithm requires it).
    pub after: Vec<Option<State>>,
}

impl Call<'_> {
    /// The instant the call decides at: a refund's is its consuming call's, so that a
    /// counter's window is the one that call counted in.
    pub fn instant(&self) -> Micros {
        match self.op {
            Op::Apply { now } => now,
            Op::GiveBack { at, .. } | Op::Lease { at, .. } | Op::LeaseReturn { at, .. } => at,
        }
    }

    /// The code the Lua library knows the counters of `params` by in this call: a sliding
    /// window's says which layout its hits are written in (counters only for limits whose
    /// counts they can hold).
    pub fn code(&self, params: &Params) -> i64 {
        let counters = self.sliding_window == SlidingWindowLayout::Counters
            && params.requests < numbers::WINDOW_COUNTS;
        match params.algorithm {
            Algorithm::SlidingWindow if counters => numbers::SLIDING_WINDOW_COUNTERS,
            algorithm => numbers::code(algorithm),
        }
    }

    /// The counter a sliding window's hit written as counters declares after the hits' keys
    /// (lua/window_counters.lua): its key with the number of the window of the call's instant
    /// appended. `None` for a hit not written so.
    pub fn window_counter(&self, hit: &Hit) -> Option<String> {
        if self.code(&hit.params) != numbers::SLIDING_WINDOW_COUNTERS {
            return None;
        }
        Some(self.window_key(hit, window_number(&hit.params, self.instant())))
    }

    /// A sliding window's counters of the windows before, of and after the call's instant,
    /// whichever layout its replicas write (empty for other algorithms): what a reset deletes
    /// beside its key.
    pub fn window_counters_around(&self, hit: &Hit) -> Vec<String> {
        if hit.params.algorithm != Algorithm::SlidingWindow {
            return Vec::new();
        }
        let number = window_number(&hit.params, self.instant());
        [number.saturating_sub(1), number, number + 1]
            .map(|number| self.window_key(hit, number))
            .to_vec()
    }

    /// A hit's key in Redis: the prefix, the counter's key, and for a counter of one integer
    /// per window the number of the window the call's instant falls in.
    pub fn key(&self, hit: &Hit) -> String {
        if is_counter(&hit.params) {
            self.window_key(hit, window_number(&hit.params, self.instant()))
        } else {
            [self.prefix, hit.key.as_str()].concat()
        }
    }

    /// The key of one window's integer (a fixed window's count, a sliding window's counts):
    /// the prefix, the counter's key and the window's number.
    fn window_key(&self, hit: &Hit, number: u64) -> String {
        format!("{}{}:{number}", self.prefix, hit.key.as_str())
    }

    /// The lease tally of a hit's counter (`lease.rs`): its key in Redis with `:leases`
    /// appended. No counter has this key: a fixed window's ends in its window's number, and a
    /// bucket's tag is a hash of its identity, which the suffix would not match.
    pub fn tally_key(&self, hit: &Hit) -> String {
        let mut key = self.key(hit);
        key.push_str(":leases");
        key
    }

    /// For each hit, the number (1-based) of the hit before it on the same counter, 0 if none:
    /// how every layout tells a counter named twice, by position.
    pub fn earlier(&self) -> impl Iterator<Item = i64> + '_ {
        self.hits.iter().enumerate().map(|(index, hit)| {
            self.hits[..index]
                .iter()
                .rposition(|other| other.key == hit.key)
                .map_or(0, |before| numbers::n(before as u64 + 1))
        })
    }

    /// A reply that does not have the layout's form.
    pub(super) fn malformed(&self, layout: Layout, reply: &impl std::fmt::Debug) -> StoreError {
        let shown: String = format!("{reply:?}").chars().take(200).collect();
        StoreError::MalformedReply(format!(
            "{} call of {} hits answered {shown}",
            layout.name(),
            self.hits.len()
        ))
    }
}

#[cfg(test)]
mod tests;
