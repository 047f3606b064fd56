//! The memory store's counters: a sharded map bounded by `max_keys`, with nothing in it about
//! what a request means (that is `storage::rule`, applied by `memory/mod.rs`).
//!
//! Each shard is a `std::sync::Mutex` around a map. A std mutex, not tokio's, because it is
//! never held across an `.await`: a decision is synchronous inside.
//!
//! Counters are held by a 128-bit keyed digest of their key, not the key itself: a key is
//! 60 bytes or more, and with the digest a counter costs about 75 bytes at a million
//! (docs/performance.md). The digest is SipHash under keys drawn at random per process, so
//! clients cannot aim for a collision, and an accidental one among a billion counters has a
//! probability below 10^-20.
//!
//! Bounded memory: each shard holds at most `max_keys / SHARDS` (rounded up) counters. A full
//! shard first forgets the counters whose windows have ended (their state says nothing any
//! more); when every counter it holds is still live, what happens to a new one is `WhenFull`'s:
//! by default a *spare* counter is forgotten to make room (one whose last write left at least
//! half its limit admissible: forgetting it lets its key be admitted at most half its limit
//! more in that window), chosen by CLOCK among the spare ones so that a key used once goes
//! before one that keeps coming back, and only when none is spare is the new one refused
//! (`refusals`), so
//! that a flood of new keys, each spare, takes room from itself and not from everyone, and a
//! counter near or over its limit is never dropped; or the least recently used is evicted
//! (`evictions`) by CLOCK,
//! an approximation of LRU: a use only marks a counter, and a hand sweeping the shard's
//! entries unmarks marked counters and evicts the first unmarked one. The shard is an `IndexMap`, its entries one contiguous array: no
//! allocation per counter and no list links to update per use (an LRU list costs two cache
//! misses per decision at a million counters), and the background sweep of expired counters
//! reads memory in order instead of chasing pointers under the shard's lock.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use indexmap::IndexMap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::algorithm::State;
use crate::clock::Micros;
use crate::storage::StoreError;
use crate::storage::keys::CounterKey;

/// Enough shards that two cores rarely contend, few enough that a sweep stays cheap.
pub const SHARDS: usize = 64;

/// Most counters a shard reserves room for up front (4M in all). Reserving takes address
/// space only: pages become resident as counters fill them. Within it a shard never grows
/// under its lock (copying every counter while requests wait), and no outgrown array is left
/// for the allocator to hold on to.
const MAX_RESERVED_PER_SHARD: usize = 1 << 16;

/// A counter's identity in the map: two independent keyed 64-bit hashes of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Digest(u64, u64);

impl Hash for Digest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already a keyed hash: the map uses it as is (see `PassThrough`).
        state.write_u64(self.1);
    }
}

/// The map's hasher for `Digest`, which is already uniformly distributed and unpredictable.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `Digest` is hashed here, through `write_u64`; any other input still spreads.
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// What a full memory store does with a new counter: flag `--memory-when-full`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WhenFull {
    /// Forget a spare counter for it (one that admits at least half its limit still), else
    /// refuse it: the request fails as the store failing (`--on-store-error` decides). No
    /// counter near or over its limit is ever dropped.
    #[default]
    Refuse,
    /// Evict the least recently used counter, live or not: new keys are always counted, and a
    /// flood of them resets live counters.
    EvictLeastRecent,
}

/// One shard: its counters, the CLOCK hand (an index into them) for eviction, the latest
/// instant it was used at, and an instant before which none of its counters expires.
pub struct Shard {
    counters: IndexMap<Digest, Slot, BuildHasherDefault<PassThrough>>,
    hand: usize,
    latest: Micros,
    /// No counter expires before this (a lower bound: a counter's expiry only moves later):
    /// until then a full shard has nothing to forget, and says so without a scan.
    earliest: Micros,
}

impl Default for Shard {
    fn default() -> Self {
        Self {
            counters: IndexMap::default(),
            hand: 0,
            latest: 0,
            earliest: Micros::MAX,
        }
    }
}

struct Slot {
    state: State,
    /// When the state may be forgotten, in µs, with `USED` (a bit no instant reaches before
    /// the year 30000) marking a use since the CLOCK hand last passed the counter:
    /// a separate flag would cost 8 bytes per counter in padding.
    stamp: Micros,
}

const USED: Micros = 1 << 63;
/// In `stamp`, beside `USED`: the last write left at least half the counter's limit
/// admissible (`WhenFull::Refuse` may forget it for a new counter).
const SPARE: Micros = 1 << 62;

impl Slot {
    fn new(state: State, expires_at: Micros, spare: bool) -> Self {
        let spare = if spare { SPARE } else { 0 };
        Self {
            state,
            stamp: (expires_at & !(USED | SPARE)) | spare,
        }
    }

    fn expires_at(&self) -> Micros {
        self.stamp & !(USED | SPARE)
    }

    fn is_spare(&self) -> bool {
        self.stamp & SPARE != 0
    }

    fn mark_used(&mut self) {
        self.stamp |= USED;
    }

    /// Clears the mark; whether it was set.
    fn take_used(&mut self) -> bool {
        let used = self.stamp & USED != 0;
        self.stamp &= !USED;
        used
    }
}

impl Shard {
    /// The instant to decide or sweep at: `now`, or the latest instant this shard was used at
    /// if the clock stepped back since. A counter is then never decided at an instant before
    /// one it was swept at (which would find it gone and count its window again from zero).
    pub fn at(&mut self, now: Micros) -> Micros {
        self.latest = self.latest.max(now);
        self.latest
    }

    /// Marks a counter used (it is about to be decided on).
    pub fn touch(&mut self, digest: Digest) {
        if let Some(slot) = self.counters.get_mut(&digest) {
            slot.mark_used();
        }
    }

    /// Marks a counter used and says where it is held (expired or not), for the one-counter
    /// path that looks it up once: `found_at` reads it, `CounterMap::replace_at` writes it.
    pub fn use_index(&mut self, digest: Digest) -> Option<usize> {
        let (index, _, slot) = self.counters.get_full_mut(&digest)?;
        slot.mark_used();
        Some(index)
    }

    /// The state held at `index` (from `use_index`), unless it has expired by `now`.
    pub fn found_at(&self, index: usize, now: Micros) -> Option<&State> {
        self.counters
            .get_index(index)
            .filter(|(_, slot)| slot.expires_at() > now)
            .map(|(_, slot)| &slot.state)
    }

    /// Whether the shard holds a counter for `digest` (expired or not): storing it then needs
    /// no room.
    pub fn holds(&self, digest: Digest) -> bool {
        self.counters.contains_key(&digest)
    }

    /// Forgets every counter expired by `now`; how many.
    fn forget_expired(&mut self, now: Micros) -> usize {
        let held = self.counters.len();
        self.counters.retain(|_, slot| slot.expires_at() > now);
        self.earliest = self
            .counters
            .values()
            .map(Slot::expires_at)
            .min()
            .unwrap_or(Micros::MAX);
        held - self.counters.len()
    }

    /// A counter's state, unless it has expired by `now`.
    pub fn found(&self, digest: Digest, now: Micros) -> Option<&State> {
        self.counters
            .get(&digest)
            .filter(|slot| slot.expires_at() > now)
            .map(|slot| &slot.state)
    }
}

/// A counter's state as a decision leaves it.
pub struct Written {
    pub state: State,
    /// When it may be forgotten.
    pub expires_at: Micros,
    /// It admits at least half its limit still (see the module docs).
    pub spare: bool,
}

/// The shards, their bound, and what they count.
pub struct CounterMap {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    when_full: WhenFull,
    /// The digest's keys, drawn at random.
    digest_keys: RandomState,
    evictions: AtomicU64,
    /// `tollgate_memory_keys`, `tollgate_memory_evictions` and `tollgate_memory_refusals`.
    pub keys_metric: Gauge,
    pub evictions_metric: Counter,
    pub refusals_metric: Counter,
}

impl CounterMap {
    pub fn new(max_keys: usize, when_full: WhenFull) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS).max(1);
        // Eviction comes before insertion, so a shard never holds more than its bound.
        let reserved = per_shard.min(MAX_RESERVED_PER_SHARD);
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        counters: IndexMap::with_capacity_and_hasher(reserved, Default::default()),
                        ..Shard::default()
                    })
                })
                .collect(),
            per_shard,
            when_full,
            digest_keys: RandomState::new(),
            evictions: AtomicU64::new(0),
            keys_metric: Gauge::default(),
            evictions_metric: Counter::default(),
            refusals_metric: Counter::default(),
        }
    }

    /// Both halves come from one pass over the key: the second is the keyed hash (SipHash) of
    /// the key followed by one more byte. Two keys then share a digest only if their 256-bit
    /// hash states coincide or both halves collide by chance, about 2^-128 either way.
    pub fn digest(&self, key: &CounterKey) -> Digest {
        let mut hasher = self.digest_keys.build_hasher();
        key.naming_part().hash(&mut hasher);
        let first = hasher.finish();
        hasher.write_u8(1);
        Digest(first, hasher.finish())
    }

    pub fn shard_of(digest: Digest) -> usize {
        // Truncating is fine: only the low bits pick the shard.
        (digest.0 as usize) % SHARDS
    }

    /// Locks a shard. Its map is consistent after any panic (slots are replaced whole), so a
    /// poisoned lock is safe to keep using.
    pub fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of counters held.
    pub fn len(&self) -> usize {
        (0..SHARDS)
            .map(|shard| self.lock(shard).counters.len())
            .sum()
    }

    /// The most counters the map holds.
    pub fn max_keys(&self) -> usize {
        self.per_shard * SHARDS
    }

    /// The error of a request refused a new counter: every counter held is live.
    pub fn full(&self) -> StoreError {
        StoreError::Full {
            max_keys: self.max_keys(),
        }
    }

    /// Counters evicted to stay within `max_keys`.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Removes every counter expired by `now` (or by a later instant its shard was used at).
    pub fn sweep(&self, now: Micros) {
        for shard in 0..SHARDS {
            let mut shard = self.lock(shard);
            let now = shard.at(now);
            let swept = shard.forget_expired(now);
            self.keys_metric
                .dec_by(i64::try_from(swept).unwrap_or(i64::MAX));
        }
    }

    /// Forgets a counter.
    pub fn remove(&self, digest: Digest) {
        let mut shard = self.lock(Self::shard_of(digest));
        if shard.counters.swap_remove(&digest).is_some() {
            self.keys_metric.dec();
        }
    }

    /// Whether `new` more counters fit in `shard` at `now`: after forgetting its expired
    /// counters if it is full, and, when every one is live, as `WhenFull` says (a refusal is
    /// counted).
    pub fn has_room(&self, shard: &mut Shard, now: Micros, new: usize) -> bool {
        let fits = |shard: &Shard| shard.counters.len() + new <= self.per_shard;
        if fits(shard) {
            return true;
        }
        if now >= shard.earliest {
            let swept = shard.forget_expired(now);
            self.keys_metric
                .dec_by(i64::try_from(swept).unwrap_or(i64::MAX));
            if fits(shard) {
                return true;
            }
        }
        match self.when_full {
            WhenFull::EvictLeastRecent => true,
            WhenFull::Refuse => {
                while !fits(shard) {
                    if !self.forget_spare(shard) {
                        self.refusals_metric.inc();
                        return false;
                    }
                }
                true
            }
        }
    }

    /// Forgets one spare counter of a full shard by CLOCK among the spare ones: from the
    /// hand on, a spare counter used since the hand last passed is unmarked and passed, the
    /// first unused one is forgotten; whether one was. A flood's counters are used once, so
    /// they go before a client's that keeps coming back, and the search is short while the
    /// flood lasts; with none spare it reads the shard twice.
    fn forget_spare(&self, shard: &mut Shard) -> bool {
        let held = shard.counters.len();
        for _ in 0..2 * held {
            if shard.hand >= held {
                shard.hand = 0;
            }
            let index = shard.hand;
            shard.hand += 1;
            let Some((_, slot)) = shard.counters.get_index_mut(index) else {
                return false;
            };
            if !slot.is_spare() || slot.take_used() {
                continue;
            }
            shard.counters.swap_remove_index(index);
            shard.hand = index;
            self.evictions.fetch_add(1, Ordering::Relaxed);
            self.evictions_metric.inc();
            self.keys_metric.dec();
            return true;
        }
        false
    }

    /// Puts a counter's state into its (locked) shard, evicting one first when the shard is
    /// full (`has_room` said whether it may). A counter held already stays marked used; a new
    /// one is not, yet (see below).
    pub fn store(&self, shard: &mut Shard, digest: Digest, written: Written) {
        if let Some(index) = shard.counters.get_index_of(&digest) {
            return self.replace_at(shard, index, written);
        }
        let slot = Slot::new(written.state, written.expires_at, written.spare);
        shard.earliest = shard.earliest.min(slot.expires_at());
        let hole = self.evict_one(shard);
        let (added, _) = shard.counters.insert_full(digest, slot);
        self.keys_metric.inc();
        // Into the evicted counter's place, just behind the hand, as CLOCK has it: the new
        // counter waits a full turn before the hand looks at it.
        if let Some(hole) = hole.filter(|&hole| hole < added) {
            shard.counters.swap_indices(hole, added);
        }
    }

    /// `store` for a counter held at `index` (from `use_index`, the shard unchanged since).
    pub fn replace_at(&self, shard: &mut Shard, index: usize, written: Written) {
        let mut slot = Slot::new(written.state, written.expires_at, written.spare);
        shard.earliest = shard.earliest.min(slot.expires_at());
        slot.mark_used();
        if let Some((_, held)) = shard.counters.get_index_mut(index) {
            *held = slot;
        }
    }

    /// Makes room for one counter in a full shard by CLOCK: from the hand on, a marked
    /// counter is unmarked and passed, the first unmarked one is evicted. Each step unmarks or
    /// evicts, so it ends within two turns. Returns the evicted counter's index (which now
    /// holds the shard's former last counter); the hand is just past it.
    fn evict_one(&self, shard: &mut Shard) -> Option<usize> {
        if shard.counters.len() < self.per_shard {
            return None;
        }
        loop {
            if shard.hand >= shard.counters.len() {
                shard.hand = 0;
            }
            let hand = shard.hand;
            shard.hand += 1;
            let used = shard
                .counters
                .get_index_mut(hand)
                .map(|(_, slot)| slot.take_used())?;
            if !used {
                shard.counters.swap_remove_index(hand);
                self.evictions.fetch_add(1, Ordering::Relaxed);
                self.evictions_metric.inc();
                self.keys_metric.dec();
                return Some(hand);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::fixed_window;

    #[test]
    fn eviction_takes_the_oldest_unused_counter_never_the_one_just_added() {
        let map = CounterMap::new(4 * SHARDS, WhenFull::EvictLeastRecent);
        let mut shard = Shard::default();
        let state = || Written {
            state: State::FixedWindow(fixed_window::State::default()),
            expires_at: 60,
            spare: true,
        };
        let digest = |n: u64| Digest(n, n);
        for n in 0..4 {
            map.store(&mut shard, digest(n), state());
        }
        // A full shard: each new counter takes the place of the oldest unused one, behind the
        // hand, so the counters added since wait their turn.
        for n in 4..7 {
            map.store(&mut shard, digest(n), state());
        }
        let mut held: Vec<u64> = shard.counters.keys().map(|digest| digest.0).collect();
        held.sort_unstable();
        assert_eq!(held, [3, 4, 5, 6]);
        // A use protects a counter the hand reaches: 3 is next in line, unless used.
        shard.touch(digest(3));
        map.store(&mut shard, digest(7), state());
        assert!(shard.counters.contains_key(&digest(3)));
        assert_eq!(shard.counters.len(), 4);
        assert_eq!(map.evictions(), 4);
    }

    #[test]
    fn a_full_shard_that_refuses_forgets_a_spare_counter_and_never_one_near_its_limit() {
        let map = CounterMap::new(4 * SHARDS, WhenFull::Refuse);
        let mut shard = Shard::default();
        let written = |spare| Written {
            state: State::FixedWindow(fixed_window::State::default()),
            expires_at: 60,
            spare,
        };
        let digest = |n: u64| Digest(n, n);
        // Two near their limits, two spare.
        for n in 0..4 {
            map.store(&mut shard, digest(n), written(n % 2 == 1));
        }
        // Two new counters: the two spare ones make room; a third finds none.
        for n in 4..6 {
            assert!(map.has_room(&mut shard, 0, 1));
            map.store(&mut shard, digest(n), written(false));
        }
        assert!(!map.has_room(&mut shard, 0, 1));
        let mut held: Vec<u64> = shard.counters.keys().map(|digest| digest.0).collect();
        held.sort_unstable();
        assert_eq!(held, [0, 2, 4, 5]);
        assert_eq!(map.evictions(), 2);
        assert_eq!(map.refusals_metric.get(), 1);
        // Past their expiry, every counter makes room, spare or not.
        assert!(map.has_room(&mut shard, 60, 4));
    }
}
