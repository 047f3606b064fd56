//! A call's arguments: how its hits are written as lua/counter.lua's and lua/apply.lua's
//! calling conventions (each documented in its file), numbers packed where a call would
//! otherwise send many (`packed`).

use redis::Cmd;

use super::counter::{self, is_counter};
use super::found;
use super::library::Entry;
use super::script::{Call, Mode};
use crate::algorithm::{Charge, Refund};
use crate::clock::Micros;
use crate::storage::{Hit, Role};

impl Call<'_> {
    /// `verb target numkeys key… arg…`, where `verb target` is `FCALL function`, `EVALSHA sha`
    /// or `EVAL script`; redis-rs routes it on a cluster by its first key.
    pub(super) fn command(&self, verb: &str, target: &str, instant: Micros, entry: Entry) -> Cmd {
        // Sized for the whole call up front (8 arguments, then 11 per hit, keys of about 90
        // bytes), so building it does not reallocate as arguments are added.
        let hits = self.hits.len();
        let mut command = Cmd::with_capacity(8 + 11 * hits, 96 + 180 * hits);
        command.arg(verb).arg(target);
        if self.node.is_some() {
            command.arg(0);
        } else {
            command.arg(hits);
            for hit in self.hits {
                self.key_arg(&mut command, hit, instant);
            }
        }
        match entry {
            Entry::Count => self.count_args(&mut command, instant),
            Entry::Apply => self.apply_args(&mut command, instant),
        }
        if self.node.is_some() {
            for hit in self.hits {
                self.key_arg(&mut command, hit, instant);
            }
        }
        command
    }

    fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Apply => "apply",
            Mode::Refund { .. } => "refund",
        }
    }

    /// lua/counter.lua's mode: `distinct` where every hit has its own counter, all declared as
    /// keys of one slot, and denied hits consume nothing; there each hit's count is simply
    /// what was read, and Redis keeps no per-counter bookkeeping.
    fn count_mode_name(&self) -> &'static str {
        let distinct = |(index, hit): (usize, &Hit)| {
            self.hits[..index].iter().all(|other| other.key != hit.key)
        };
        let counted_first = matches!(self.mode, Mode::Apply)
            && self.charge != Charge::Always
            && self.node.is_none()
            && self.hits.len() <= MAX_DISTINCT
            && self.hits.iter().enumerate().all(distinct);
        if counted_first {
            DISTINCT
        } else {
            self.mode_name()
        }
    }

    /// Whether the call goes to lua/counter.lua's `distinct` mode (not one hit alone, which has
    /// its own arguments).
    pub(super) fn sends_distinct(&self) -> bool {
        !matches!((self.hits, self.mode, self.node), ([_], Mode::Apply, None))
            && self.count_mode_name() == DISTINCT
    }

    fn flag(on: bool) -> &'static str {
        if on { "1" } else { "0" }
    }

    /// lua/counter.lua's arguments.
    fn count_args(&self, command: &mut Cmd, instant: Micros) {
        let slack = self.slack_ms(instant);
        let ttl = |hit: &Hit| counter::ttl_ms(&hit.params, instant, slack);
        if let ([hit], Mode::Apply, None) = (self.hits, self.mode, self.node) {
            let denial = match self.charge {
                Charge::Always => "c",
                _ if found::denial_vetoes(hit.role, self.complete) => "v",
                _ => "u",
            };
            command
                .arg(hit.params.requests)
                .arg(hit.hits)
                .arg(ttl(hit))
                .arg(denial);
            return;
        }
        let mode = self.count_mode_name();
        command
            .arg(mode)
            .arg(Self::flag(self.charge == Charge::Always))
            .arg(Self::flag(self.complete))
            .arg(self.hits.len());
        if mode == DISTINCT {
            let numbers = self.hits.iter().flat_map(|hit| {
                [
                    hit.params.requests,
                    hit.hits,
                    ttl(hit),
                    role_code(hit.role),
                    hit.descriptor as u64,
                ]
            });
            command.arg(packed(numbers).as_slice());
            // Every hit's count as text when they share it (the usual case): INCRBY takes it
            // as is, where a number from the packed argument would be formatted per counter.
            match self.hits.split_first() {
                Some((first, rest)) if rest.iter().all(|hit| hit.hits == first.hits) => {
                    command.arg(first.hits)
                }
                _ => command.arg(""),
            };
            return;
        }
        for hit in self.hits {
            command
                .arg(hit.params.requests)
                .arg(hit.hits)
                .arg(ttl(hit))
                .arg(role_tag(hit.role))
                .arg(hit.descriptor);
        }
    }

    /// lua/apply.lua's arguments.
    fn apply_args(&self, command: &mut Cmd, instant: Micros) {
        if let ([hit], Mode::Apply, None) = (self.hits, self.mode, self.node) {
            self.lone_hit_args(command, hit, instant);
            return;
        }
        command
            .arg(self.mode_name())
            .arg(instant)
            .arg(Self::flag(self.charge == Charge::Always))
            .arg(Self::flag(self.complete))
            .arg(self.hits.len())
            .arg(self.slack_ms(instant));
        for (index, hit) in self.hits.iter().enumerate() {
            let params = &hit.params;
            let tick = found::tick(params);
            let tag = if is_counter(params) {
                "fixed_count"
            } else {
                params.algorithm.key_tag()
            };
            command
                .arg(tag)
                .arg(params.requests)
                .arg(params.window)
                .arg(tick)
                .arg(params.algorithm.parameter_in_ticks(tick))
                .arg(hit.hits)
                .arg(role_tag(hit.role))
                .arg(hit.descriptor);
            // A refund of an `IfUnchanged` counter names the state it requires.
            let condition = match (self.mode, params.algorithm.refund()) {
                (Mode::Refund { .. }, Refund::IfUnchanged) => self.expected.get(index).copied(),
                _ => None,
            };
            match condition {
                Some((first, second)) => command.arg(first).arg(second),
                None => command.arg("").arg(""),
            };
        }
    }

    /// One hit alone (never a counter here: those go to lua/counter.lua), its numbers packed:
    /// apply_one's eight, or, for a sliding log whose state would be too long an answer
    /// (`found::takes`), apply_one_answered's ten.
    fn lone_hit_args(&self, command: &mut Cmd, hit: &Hit, instant: Micros) {
        let params = &hit.params;
        let tick = found::tick(params);
        let parameter = params.algorithm.parameter_in_ticks(tick);
        let charge = u64::from(self.charge == Charge::Always);
        let slack = self.slack_ms(instant);
        let numbers = if found::takes(params) {
            packed([
                instant / tick,
                params.requests,
                (params.window / tick).max(1),
                parameter,
                hit.hits,
                charge,
                tick,
                slack,
            ])
        } else {
            packed([
                instant,
                params.requests,
                params.window,
                tick,
                parameter,
                hit.hits,
                charge,
                u64::from(self.complete),
                role_code(hit.role),
                slack,
            ])
        };
        command
            .arg(params.algorithm.key_tag())
            .arg(numbers.as_slice());
    }

    /// A hit's key: the prefix, the counter's key, and for a counter the number of the window
    /// `instant` falls in.
    fn key_arg(&self, command: &mut Cmd, hit: &Hit, instant: Micros) {
        let key = hit.key.as_str();
        match (self.prefix.is_empty(), is_counter(&hit.params)) {
            (true, false) => command.arg(key),
            (false, false) => command.arg([self.prefix, key].concat()),
            (_, true) => {
                let window = counter::window_number(&hit.params, instant);
                command.arg(format!("{}{key}:{window}", self.prefix))
            }
        };
    }
}

/// lua/counter.lua's mode for hits on distinct counters, whose arguments are packed.
const DISTINCT: &str = "distinct";

/// The most hits lua/counter.lua takes in its `distinct` mode (its MAX_DISTINCT): their packed
/// numbers are unpacked at once, within Lua's stack.
const MAX_DISTINCT: usize = 1_000;

/// Numbers packed into one argument as the Lua code reads them (lua/prelude.lua): each a
/// little-endian signed 64-bit integer. Every number tollgate sends is below 2^52 (the bound
/// of src/algorithm's exactness) save a time to live past 140,000 years, which is held there:
/// Lua's numbers are exact only below 2^53.
fn packed(numbers: impl IntoIterator<Item = u64>) -> Vec<u8> {
    const EXACT: u64 = 1 << 52;
    numbers
        .into_iter()
        .flat_map(|number| (number.min(EXACT) as i64).to_le_bytes())
        .collect()
}

/// A role as packed numbers carry it (lua/prelude.lua's ROLE_TAGS).
fn role_code(role: Role) -> u64 {
    match role {
        Role::Enforced => 0,
        Role::Quota => 1,
        Role::Shadow => 2,
    }
}

fn role_tag(role: Role) -> &'static str {
    match role {
        Role::Enforced => "e",
        Role::Quota => "q",
        Role::Shadow => "s",
    }
}
