//! What this replica holds of one counter: a slice of its budget (`Slice`), the
//! counter's recent demand (`Demand`), both under the counter's key (`Followed`); which
//! counters are busy enough to follow (`Spotter`); and the request answered from slices
//! (`take`).

use std::hash::{Hash, Hasher};

use indexmap::IndexMap;

use crate::algorithm::{Outcome, State, leased};
use crate::clock::{MICROS_PER_SECOND, Micros};
use crate::storage::keys::CounterKey;
use crate::storage::{Hit, PerHit, Role};

/// The counters followed, by key: an index found once a request reaches each again. Hashed
/// by foldhash, seeded at random per process: a key is hashed on every answer from a slice,
/// and only counters busy on this replica are followed, at most `MAX_FOLLOWED` of them.
pub(super) type Followers = IndexMap<CounterKey, Followed, foldhash::fast::RandomState>;

/// Counters followed at once; past it, no new one is (the spotter keeps cold counters out,
/// so only a fleet of busy ones reaches it).
pub(super) const MAX_FOLLOWED: usize = 65_536;

/// A counter this replica follows: its recent demand, and its slice if it holds one.
pub(super) struct Followed {
    /// A hit of the counter, to lease and return with: its limit as the rules say now.
    pub(super) hit: Hit,
    pub(super) demand: Demand,
    pub(super) slice: Option<Slice>,
    /// The lease or return in flight, by its number (`Book::call`): one call at a time per
    /// counter, so that a return never lands after a later lease of the same holder (after
    /// a reset it would take that lease's budget back). Only the call it names clears it.
    pub(super) call: Option<u64>,
    /// What nobody holds (the limit less the count), as the store last said, with the
    /// window it was in.
    pub(super) unleased: Option<(u64, u64)>,
    /// The replicas holding slices of the counter, as the last grant said.
    pub(super) holders: u64,
    /// What this replica believes the counter's lease tally holds for it, with the window:
    /// granted, less what it asked to give back. A lease checks it (`Grant::intact`).
    pub(super) tally: (u64, u64),
    pub(super) last_used: Micros,
    /// The number of the last call made (`Book::calls`) when the store last denied a hit
    /// of the counter: a lease asked before it goes back as it lands, as the slice held
    /// then did (`Leased::learn`).
    pub(super) denied: u64,
    /// What a slice taken out while a call was in flight held unused: given back once that
    /// call ends (one call at a time per counter), so that the store's count holds no budget
    /// nobody holds (a fixed window's; a bucket's slice is dropped, its life bounding it).
    pub(super) parked: Option<(Hit, Micros, Option<State>)>,
}

/// A return to send: the hit to give back (`hits` unused), the instant of its lease, the
/// state a bucket's return requires, the call's number.
pub(super) type Return = (Hit, Micros, Option<State>, u64);

/// Budget this replica holds: of one window of a fixed window, or of a bucket (whose
/// "window" is always 0: `window_of`).
#[derive(Debug, Clone)]
pub(super) struct Slice {
    pub(super) window: u64,
    /// The instant of its last grant: a fixed window's returns are counted in its window, a
    /// bucket's go back as taken then.
    pub(super) at: Micros,
    pub(super) left: u64,
    /// What was taken out of it in its window, less what clients gave back into it: the
    /// most a refund may put back (a fixed window's).
    pub(super) spent: u64,
    /// Used until then: a fixed window's until its window's end at the latest, renewed by
    /// each grant that finds the slice still counted; a bucket's until its last grant's life
    /// ends, never later (`algorithm::leased`).
    pub(super) until: Micros,
    /// A bucket's hits of `left` granted by an earlier lease, whose life ends sooner: what
    /// of them is unused by then is dropped.
    pub(super) expiring: Option<(u64, Micros)>,
    /// A bucket's last grant: the state it left and the hits it granted. A return gives back
    /// at most those, and only while the bucket is still in that state.
    pub(super) last: Option<(State, u64)>,
    /// When the counter's full limit is available again, as the last grant said.
    pub(super) full_at: Micros,
}

impl Slice {
    /// Whether hits at `now` may come out of it: its window, within its life.
    pub(super) fn usable(&self, hit: &Hit, now: Micros) -> bool {
        self.window == window_of(hit, now).0 && now < self.until
    }

    /// Drops what an earlier grant's life no longer covers at `now`.
    pub(super) fn settle(&mut self, now: Micros) {
        if let Some((expiring, by)) = self.expiring
            && now >= by
        {
            self.left = self.left.saturating_sub(expiring);
            self.expiring = None;
        }
    }

    /// Takes `hits` out, the earlier grant's first.
    pub(super) fn spend(&mut self, hits: u64) {
        self.left = self.left.saturating_sub(hits);
        self.spent = self.spent.saturating_add(hits);
        if let Some((expiring, _)) = &mut self.expiring {
            *expiring = expiring.saturating_sub(hits);
        }
    }

    /// Puts back `hits` a client returned, of those taken out in its window (never more).
    pub(super) fn put_back(&mut self, hits: u64) {
        let back = hits.min(self.spent);
        self.left = self.left.saturating_add(back);
        self.spent -= back;
    }

    /// What goes back to the store, with the state a bucket's return requires: a fixed
    /// window's unused budget, while its window is current (a slice of an ended window ends
    /// with its counter); a bucket's, at most its last grant's hits.
    pub(super) fn unused_of_current(
        &self,
        hit: &Hit,
        now: Micros,
    ) -> Option<(Hit, Micros, Option<State>)> {
        let current = self.window == window_of(hit, now).0;
        let (unused, after) = match &self.last {
            Some((state, granted)) => (self.left.min(*granted), Some(state.clone())),
            None => (self.left, None),
        };
        (current && unused > 0).then(|| {
            (
                Hit {
                    hits: unused,
                    ..hit.clone()
                },
                self.at,
                after,
            )
        })
    }
}

impl Followed {
    fn new(hit: &Hit, now: Micros) -> Self {
        Followed {
            hit: Hit {
                descriptor: 0,
                hits: 0,
                role: Role::Enforced,
                ..hit.clone()
            },
            demand: Demand::default(),
            slice: None,
            call: None,
            unleased: None,
            holders: 0,
            tally: (0, 0),
            last_used: now,
            denied: 0,
            parked: None,
        }
    }

    /// Ends the call numbered `call`, if it is the one in flight.
    pub(super) fn ended(&mut self, call: u64) {
        if self.call == Some(call) {
            self.call = None;
        }
    }

    /// What a reset leaves: no slice, nothing held, nothing known of the budget; the demand,
    /// and the call in flight, stay.
    pub(super) fn forget(&mut self) {
        self.slice = None;
        self.tally = (0, 0);
        self.unleased = None;
    }

    /// What this replica believes the tally holds for it in `window`.
    pub(super) fn held_in(&self, window: u64) -> u64 {
        match self.tally {
            (of, held) if of == window => held,
            _ => 0,
        }
    }

    /// Takes the slice out to give back what it holds unused, numbered as the counter's call
    /// (`calls`: the book's count of calls), if its window is current at `now`; with a call
    /// in flight, a fixed window's is parked until it ends (`next_parked`), a bucket's
    /// dropped.
    pub(super) fn return_slice(&mut self, now: Micros, calls: &mut u64) -> Option<Return> {
        let (unused, at, after) = self.give_back_slice(now)?;
        if self.call.is_none() {
            *calls += 1;
            self.call = Some(*calls);
            return Some((unused, at, after, *calls));
        }
        if after.is_none() {
            // Two slices of one window parked: one return of both.
            self.parked = match self.parked.take() {
                Some((earlier, earlier_at, None))
                    if window_of(&earlier, earlier_at).0 == window_of(&unused, at).0 =>
                {
                    let hits = earlier.hits.saturating_add(unused.hits);
                    Some((Hit { hits, ..unused }, at, None))
                }
                _ => Some((unused, at, None)),
            };
        }
        None
    }

    /// The return parked while a call was in flight, numbered as the counter's next call, if
    /// none is in flight now.
    pub(super) fn next_parked(&mut self, calls: &mut u64) -> Option<Return> {
        if self.call.is_some() {
            return None;
        }
        let (unused, at, after) = self.parked.take()?;
        *calls += 1;
        self.call = Some(*calls);
        Some((unused, at, after, *calls))
    }

    /// Takes the slice out to give back what it holds unused (a return of `hits` at `at`,
    /// with the state a bucket's requires), if its window is current at `now`. A fixed
    /// window's return comes off the tally; a bucket's leaves it, as the store does.
    pub(super) fn give_back_slice(&mut self, now: Micros) -> Option<(Hit, Micros, Option<State>)> {
        let mut slice = self.slice.take()?;
        slice.settle(now);
        let (unused, at, after) = slice.unused_of_current(&self.hit, now)?;
        if self.tally.0 == slice.window && after.is_none() {
            self.tally.1 = self.tally.1.saturating_sub(unused.hits);
        }
        Some((unused, at, after))
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

/// Which counters are busy, without a map entry per counter seen: a fixed table of slots,
/// each counting one counter's hits in the current second, a counter's slot picked by its
/// key's hash. Another counter landing in a taken slot wears the count down before it takes
/// the slot over, so a busy counter keeps its slot among cold ones (a Misra-Gries count).
pub(super) struct Spotter {
    slots: Vec<Spot>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Spot {
    key: u64,
    second: u64,
    count: u64,
}

const SPOTS: usize = 4_096;

impl Default for Spotter {
    fn default() -> Self {
        Self {
            slots: vec![Spot::default(); SPOTS],
        }
    }
}

impl Spotter {
    /// Counts `hits` on `key` at `now`; the hits it counted within this second, once they
    /// reach `rate`.
    pub(super) fn busy(
        &mut self,
        key: &CounterKey,
        now: Micros,
        hits: u64,
        rate: u64,
    ) -> Option<u64> {
        let mut hasher = fnv::FnvHasher::default();
        key.hash(&mut hasher);
        let digest = hasher.finish();
        let second = now / MICROS_PER_SECOND;
        let spot = self.slots.get_mut(digest as usize % SPOTS)?;
        if spot.second != second {
            *spot = Spot {
                key: digest,
                second,
                count: 0,
            };
        }
        if spot.key != digest {
            if spot.count > hits {
                spot.count -= hits;
                return None;
            }
            spot.key = digest;
            spot.count = 0;
        }
        spot.count = spot.count.saturating_add(hits);
        (spot.count >= rate).then_some(spot.count)
    }
}

/// The window of `hit`'s counter that `now` falls in, and when it ends; a bucket has one
/// window, 0, that never ends.
pub(super) fn window_of(hit: &Hit, now: Micros) -> (u64, Micros) {
    if leased::is_bucket(&hit.params) {
        return (0, Micros::MAX);
    }
    let length = hit.params.window.max(1);
    let window = now / length;
    (window, window.saturating_add(1).saturating_mul(length))
}

/// The index of the counter `hit` is followed under, if it is or, busy now (`busy`: the hits
/// seen this second, the current ones included, once busy), there is room to follow it. The
/// current hits are left for the caller to add to its demand.
pub(super) fn follow(
    counters: &mut Followers,
    hit: &Hit,
    now: Micros,
    busy: impl FnOnce() -> Option<u64>,
) -> Option<usize> {
    if let Some(index) = counters.get_index_of(&hit.key) {
        return Some(index);
    }
    if counters.len() >= MAX_FOLLOWED {
        return None;
    }
    let seen = busy()?;
    let mut followed = Followed::new(hit, now);
    followed
        .demand
        .add(now, seen.saturating_sub(hit.hits.max(1)));
    Some(counters.insert_full(hit.key.clone(), followed).0)
}

/// What a request asks of one counter's slice: its charges summed (`None`: it only gives
/// back), and its refunds summed.
#[derive(Clone, Copy)]
struct Asked {
    index: usize,
    charged: Option<u64>,
    returned: u64,
    now: Micros,
}

/// Takes every hit from its counter's slice, if each slice holds what the request asks of
/// it (a counter named twice asks the sum) and its refunds were spent from it; else leaves
/// every slice as it was. Refunds go back in first, so a stream's settlement (the estimate
/// back, the tokens spent charged) is answered from the slice when the two fit. `nows`: each
/// hit's instant, by its store's clock; `found`: each hit's counter in `counters`.
pub(super) fn take(
    counters: &mut Followers,
    hits: &[Hit],
    nows: &[Option<Micros>],
    found: &[Option<usize>],
) -> Option<PerHit<Outcome>> {
    // Sorted by counter, so that a counter named twice is one entry whatever the request's
    // size.
    let mut asked: smallvec::SmallVec<[Asked; 2]> = hits
        .iter()
        .zip(nows)
        .zip(found)
        .map(|((hit, now), index)| {
            let refund = hit.role == Role::Refund;
            Some(Asked {
                index: (*index)?,
                charged: (!refund).then_some(hit.hits),
                returned: if refund { hit.hits } else { 0 },
                now: (*now)?,
            })
        })
        .collect::<Option<_>>()?;
    asked.sort_unstable_by_key(|asked| asked.index);
    asked.dedup_by(|later, first| {
        let same = later.index == first.index;
        if same {
            first.charged = match (first.charged, later.charged) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, b) => a.or(b),
            };
            first.returned = first.returned.saturating_add(later.returned);
        }
        same
    });
    for asked in &asked {
        let slice = counters.get_index_mut(asked.index)?.1.slice.as_mut()?;
        slice.settle(asked.now);
        // A check (no hits) needs one hit of room, as the store's own decision does.
        let room = slice.left.saturating_add(asked.returned);
        let fits = asked.charged.is_none_or(|charged| room >= charged.max(1));
        if asked.returned > slice.spent || !fits {
            return None;
        }
    }
    for ((hit, index), _) in hits.iter().zip(found).zip(nows) {
        if hit.role == Role::Refund {
            counters
                .get_index_mut((*index)?)?
                .1
                .slice
                .as_mut()?
                .put_back(hit.hits);
        }
    }
    let mut outcomes = PerHit::with_capacity(hits.len());
    for ((hit, now), index) in hits.iter().zip(nows).zip(found) {
        let (now, followed) = ((*now)?, counters.get_index_mut((*index)?)?.1);
        let slice = followed.slice.as_mut()?;
        if hit.role != Role::Refund {
            slice.spend(hit.hits);
        }
        let unleased = match followed.unleased {
            Some((window, unleased)) if window == slice.window => unleased,
            _ => 0,
        };
        outcomes.push(Outcome {
            allowed: true,
            remaining: slice.left.saturating_add(unleased),
            reset_after: slice.full_at.saturating_sub(now),
            retry_after: 0,
        });
    }
    Some(outcomes)
}
