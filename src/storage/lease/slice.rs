//! What this replica holds of one counter: a slice of a window's budget (`Slice`), the
//! counter's recent demand (`Demand`), both under the counter's key (`Followed`); and the
//! request answered from slices (`take`).

use std::collections::HashMap;

use crate::algorithm::Outcome;
use crate::clock::{MICROS_PER_SECOND, Micros};
use crate::storage::keys::CounterKey;
use crate::storage::{Hit, Role};

/// Counters whose demand is followed at once; past it, new ones are decided per request.
pub(super) const MAX_FOLLOWED: usize = 65_536;

/// A counter this replica follows: its recent demand, and its slice if it holds one.
pub(super) struct Followed {
    /// A hit of the counter, to lease and return with.
    pub(super) hit: Hit,
    pub(super) demand: Demand,
    pub(super) slice: Option<Slice>,
    /// A lease call in flight.
    pub(super) leasing: bool,
    /// What the last grant said, with the window it was in: what nobody holds (the limit
    /// less the count).
    pub(super) unleased: Option<(u64, u64)>,
    /// The replicas holding slices of the counter, as the last grant said.
    pub(super) holders: u64,
    pub(super) last_used: Micros,
}

/// Budget of one window this replica holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slice {
    pub(super) window: u64,
    /// An instant of its window: returns are counted in that window.
    pub(super) at: Micros,
    pub(super) left: u64,
    /// Used until then (its window's end at the latest).
    pub(super) until: Micros,
}

impl Slice {
    /// Whether hits at `now` may come out of it: its window, within its life.
    pub(super) fn usable(&self, hit: &Hit, now: Micros) -> bool {
        self.window == window_of(hit, now).0 && now < self.until
    }

    /// What goes back to the store: the unused budget, while its window is current (a slice
    /// of an ended window ends with its counter).
    pub(super) fn unused_of_current(&self, hit: &Hit, now: Micros) -> Option<(Hit, Micros)> {
        let current = self.window == window_of(hit, now).0;
        (current && self.left > 0).then(|| {
            (
                Hit {
                    hits: self.left,
                    ..hit.clone()
                },
                self.at,
            )
        })
    }
}

/// Hits on one counter in the current second and the one before, by the store's instants.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Demand {
    second: u64,
    this: u64,
    last: u64,
}

impl Demand {
    pub(super) fn add(&mut self, now: Micros, hits: u64) {
        let second = now / MICROS_PER_SECOND;
        if second != self.second {
            self.last = if second == self.second + 1 {
                self.this
            } else {
                0
            };
            self.this = 0;
            self.second = second;
        }
        self.this = self.this.saturating_add(hits);
    }

    /// Hits a second: the last whole second's, or this one's if already more.
    pub(super) fn rate(&self) -> u64 {
        self.last.max(self.this)
    }
}

/// The window of `hit`'s counter that `now` falls in, and when it ends.
pub(super) fn window_of(hit: &Hit, now: Micros) -> (u64, Micros) {
    let length = hit.params.window.max(1);
    let window = now / length;
    (window, (window + 1) * length)
}

/// The counter `hit` is followed under, followed from now if there is room.
pub(super) fn follow<'a>(
    counters: &'a mut HashMap<CounterKey, Followed>,
    hit: &Hit,
    now: Micros,
) -> Option<&'a mut Followed> {
    if !counters.contains_key(&hit.key) && counters.len() >= MAX_FOLLOWED {
        return None;
    }
    Some(counters.entry(hit.key.clone()).or_insert_with(|| Followed {
        hit: Hit {
            descriptor: 0,
            hits: 0,
            role: Role::Enforced,
            ..hit.clone()
        },
        demand: Demand::default(),
        slice: None,
        leasing: false,
        unleased: None,
        holders: 0,
        last_used: now,
    }))
}

/// Takes every hit from its counter's slice, if each slice holds what the request asks of
/// it (a counter named twice asks the sum); else leaves every slice as it was.
pub(super) fn take(
    counters: &mut HashMap<CounterKey, Followed>,
    hits: &[Hit],
    now: Micros,
) -> Option<Vec<Outcome>> {
    let mut asked: HashMap<&CounterKey, u64> = HashMap::with_capacity(hits.len());
    for hit in hits {
        let sum = asked.entry(&hit.key).or_default();
        *sum = sum.saturating_add(hit.hits);
    }
    for (key, sum) in &asked {
        let left = counters.get(*key)?.slice.as_ref()?.left;
        // A check (no hits) needs one hit of room, as the store's own decision does.
        if left < (*sum).max(1) {
            return None;
        }
    }
    let mut outcomes = Vec::with_capacity(hits.len());
    for hit in hits {
        let followed = counters.get_mut(&hit.key)?;
        let slice = followed.slice.as_mut()?;
        slice.left -= hit.hits;
        let unleased = match followed.unleased {
            Some((window, unleased)) if window == slice.window => unleased,
            _ => 0,
        };
        let (_, end) = window_of(hit, now);
        outcomes.push(Outcome {
            allowed: true,
            remaining: slice.left.saturating_add(unleased),
            reset_after: end - now,
            retry_after: 0,
        });
    }
    Some(outcomes)
}
