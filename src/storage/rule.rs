//! The request rule, written once: how the hits of one request (or of the part of it one call
//! holds) are decided together.
//!
//! - Hits are decided in order, each on the state the hits before it left: a counter named
//!   twice counts twice.
//! - The request is *vetoed* when an enforced descriptor is over, or, when the hits are the
//!   whole request, when it has quota descriptors and every one is over (`rejects`, which
//!   also gives the limiter its overall code). Shadow hits never veto. A descriptor is over
//!   when any of its hits (one per limit) is denied. A request with no hit a veto would undo
//!   (every charge `Charge::Always`) is never vetoed.
//! - A vetoed request consumes nothing on its `Charge::IfAllowed` charges: their admitted
//!   hits report a check (0 hits) on their counters as the hits a veto keeps left them.
//! - A veto keeps what must count whatever the request's fate:
//!   - refund hits (`Role::Refund`) give their hits back (`algorithm::refund`) and are
//!     answered allowed. They never veto: what the client returns is returned whatever its
//!     other descriptors asked (a refund is usually sent alone, when a stream ends, and a
//!     mixed request must not lose it to an unrelated denial);
//!   - `Charge::Always` charges (usage reported after the fact, `--count-denied`) consume,
//!     admitted or not, and veto as any charge does.
//!
//! The memory store applies `decide` to its map; the Redis layouts that answer the counters
//! they found are decoded by it (their Lua applies the same rule, `lua/rule.lua`, to decide
//! what to write, and the decoder checks the two agree).

use smallvec::SmallVec;

use super::{Hit, PerHit, Role};
use crate::algorithm::{self, Charge, Outcome, State};
use crate::clock::Micros;

/// What a request's hits come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub outcomes: PerHit<Outcome>,
    /// Whether the hits were consumed (not vetoed).
    pub committed: bool,
    /// Per hit: for the last hit of each counter the request changed, the state to store and
    /// when it may be forgotten; `None` for every other hit.
    pub writes: PerHit<Option<(State, Micros)>>,
}

impl Decided {
    /// The state hit `index`'s counter holds after the request: what the request wrote to it,
    /// else what was found.
    pub fn state_after(
        &self,
        hits: &[Hit],
        found: &[Option<&State>],
        index: usize,
    ) -> Option<State> {
        let key = &hits[index].key;
        let last = (index..hits.len())
            .rev()
            .find(|&i| hits[i].key == *key)
            .unwrap_or(index);
        match &self.writes[last] {
            Some((state, _)) => Some(state.clone()),
            None => found[first(hits, index)].cloned(),
        }
    }
}

/// Decides `hits` at `now` on the states their counters were `found` in (per hit; for a
/// counter named more than once, its first hit's), `complete` when they are the whole request.
pub fn decide(hits: &[Hit], found: &[Option<&State>], now: Micros, complete: bool) -> Decided {
    if let [hit] = hits {
        return decide_one(hit, found, now, complete);
    }
    // Per hit: the state it leaves its counter in, its outcome, and when what it wrote may be
    // forgotten (`None`: it wrote nothing).
    let mut left: PerHit<Option<State>> = SmallVec::with_capacity(hits.len());
    let mut outcomes: PerHit<Outcome> = SmallVec::with_capacity(hits.len());
    let mut wrote: PerHit<Option<Micros>> = SmallVec::with_capacity(hits.len());
    for (index, hit) in hits.iter().enumerate() {
        let before = match earlier(hits, index) {
            Some(earlier) => left[earlier].as_ref(),
            None => found[index],
        };
        let transition = transition(hit, before, now);
        outcomes.push(transition.outcome);
        wrote.push(transition.state.as_ref().map(|_| transition.expires_at));
        let state = transition.state.or_else(|| before.cloned());
        left.push(state);
    }
    let vetoed = undone_by_veto(hits) && vetoes(hits, |index| outcomes[index].allowed, complete);
    if vetoed {
        return vetoed_with_refunds(hits, found, now, outcomes);
    }
    Decided {
        outcomes,
        committed: true,
        writes: last_writes(hits, left, &wrote),
    }
}

/// `decide` for the common request of one hit: no counter can be named twice, so what its
/// hit leaves is what is written.
fn decide_one(hit: &Hit, found: &[Option<&State>], now: Micros, complete: bool) -> Decided {
    let hits = std::slice::from_ref(hit);
    let transition = transition(hit, found[0], now);
    let outcomes: PerHit<Outcome> = smallvec::smallvec![transition.outcome];
    if undone_by_veto(hits) && vetoes(hits, |_| transition.outcome.allowed, complete) {
        return vetoed_with_refunds(hits, found, now, outcomes);
    }
    let expires_at = transition.expires_at;
    Decided {
        outcomes,
        committed: true,
        writes: smallvec::smallvec![transition.state.map(|state| (state, expires_at))],
    }
}

/// Per hit: for the last hit of each counter some hit changed, the state `left` by it and the
/// expiry of the last hit that changed it (`wrote`); `None` for every other hit.
fn last_writes(
    hits: &[Hit],
    mut left: PerHit<Option<State>>,
    wrote: &[Option<Micros>],
) -> PerHit<Option<(State, Micros)>> {
    let mut writes: PerHit<Option<(State, Micros)>> = hits.iter().map(|_| None).collect();
    for index in 0..hits.len() {
        let key = &hits[index].key;
        let is_last = !hits[index + 1..].iter().any(|later| later.key == *key);
        let last_write = (0..=index)
            .rev()
            .filter(|&i| hits[i].key == *key)
            .find_map(|i| wrote[i]);
        if let (true, Some(expires_at), Some(state)) = (is_last, last_write, left[index].take()) {
            writes[index] = Some((state, expires_at));
        }
    }
    writes
}

/// What one hit does to the state its counter is in.
fn transition(hit: &Hit, before: Option<&State>, now: Micros) -> algorithm::Transition {
    match hit.role {
        Role::Refund => algorithm::given_back::refund(&hit.params, before, now, hit.hits),
        Role::Enforced | Role::Quota | Role::Shadow => {
            algorithm::decide(&hit.params, before, now, hit.hits, hit.charge)
        }
    }
}

/// Whether a hit stands whatever the request's fate: a refund, or a charge that counts
/// admitted or not.
fn kept_by_veto(hit: &Hit) -> bool {
    hit.role == Role::Refund || hit.charge == Charge::Always
}

/// Whether a veto would undo any of `hits`: a request whose every hit a veto keeps is never
/// vetoed (it consumes as decided, as `--count-denied` requests always did).
pub fn undone_by_veto(hits: &[Hit]) -> bool {
    !hits.iter().all(kept_by_veto)
}

/// A vetoed request: nothing is consumed but what a veto keeps (`kept_by_veto`), decided
/// again on the chain of those alone. Every other charge reports a check on its counter as
/// the kept hits before it left it; a hit denied at first keeps its denial, which the veto
/// (and the overall code) went by; each counter a kept hit changed is written.
fn vetoed_with_refunds(
    hits: &[Hit],
    found: &[Option<&State>],
    now: Micros,
    mut outcomes: PerHit<Outcome>,
) -> Decided {
    let mut left: PerHit<Option<State>> = SmallVec::with_capacity(hits.len());
    let mut kept: PerHit<Option<Micros>> = SmallVec::with_capacity(hits.len());
    for (index, hit) in hits.iter().enumerate() {
        let before = match earlier(hits, index) {
            Some(earlier) => left[earlier].as_ref(),
            None => found[index],
        };
        let (state, expires_at) = match kept_by_veto(hit) {
            true => {
                let kept = transition(hit, before, now);
                if outcomes[index].allowed {
                    outcomes[index] = kept.outcome;
                }
                let expires_at = kept.state.as_ref().map(|_| kept.expires_at);
                (kept.state.or_else(|| before.cloned()), expires_at)
            }
            false => {
                if outcomes[index].allowed {
                    outcomes[index] =
                        algorithm::decide(&hit.params, before, now, 0, Charge::IfAllowed).outcome;
                }
                (before.cloned(), None)
            }
        };
        left.push(state);
        kept.push(expires_at);
    }
    Decided {
        outcomes,
        committed: false,
        writes: last_writes(hits, left, &kept),
    }
}

/// The hit before `index` on the same counter, if any.
fn earlier(hits: &[Hit], index: usize) -> Option<usize> {
    (0..index)
        .rev()
        .find(|&before| hits[before].key == hits[index].key)
}

/// The first hit on hit `index`'s counter.
fn first(hits: &[Hit], index: usize) -> usize {
    (0..index)
        .find(|&before| hits[before].key == hits[index].key)
        .unwrap_or(index)
}

/// Whether a request is rejected, given each limited descriptor's role and whether it is
/// over: an enforced descriptor over, or every quota descriptor over (there being one). Both
/// the stores' veto and the limiter's overall code use this one rule, so what is consumed and
/// what is answered always agree.
pub fn rejects(descriptors: impl IntoIterator<Item = (Role, bool)>) -> bool {
    rejects_part(descriptors, true)
}

/// `rejects` for the hits of one call, `complete` when they are the whole request: a call
/// holding part of it knows only that an enforced denial vetoes (whether every quota
/// descriptor is over needs every call).
fn rejects_part(descriptors: impl IntoIterator<Item = (Role, bool)>, complete: bool) -> bool {
    let mut quota = 0;
    let mut quota_over = 0;
    for (role, over) in descriptors {
        match role {
            Role::Enforced if over => return true,
            Role::Quota => {
                quota += 1;
                quota_over += usize::from(over);
            }
            Role::Enforced | Role::Shadow | Role::Refund => {}
        }
    }
    complete && quota > 0 && quota_over == quota
}

/// Whether hits are vetoed, given which were allowed (a descriptor's hits are adjacent; it
/// is over when any of them is denied); `complete` as in `rejects_part`.
pub fn vetoes(hits: &[Hit], allowed: impl Fn(usize) -> bool, complete: bool) -> bool {
    let descriptors = hits.chunk_by(|a, b| a.descriptor == b.descriptor);
    let mut first = 0;
    rejects_part(
        descriptors.map(|group| {
            let over = (first..first + group.len()).any(|index| !allowed(index));
            first += group.len();
            (group[0].role, over)
        }),
        complete,
    )
}

#[cfg(test)]
mod tests;
