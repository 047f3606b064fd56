//! What each hit's charge is: whether it consumes when denied or vetoed (usage, counted in
//! full whatever happens) or only when the request is admitted (an admission), from its
//! limit's `charges`, `--count-denied`, and whether its request settles a stream.

use super::{RateLimiter, RefundPolicy};
use crate::algorithm::{Algorithm, Charge};
use crate::limit::{Charges, Limit, Refunds};
use crate::storage::{Hit, Role};

impl RateLimiter {
    /// Whether a hit on `limit` consumes when denied or vetoed: as its rule's `charges` says,
    /// else as `--count-denied`. A refund gives back, and a concurrency take that is refused
    /// holds nothing, whatever either says.
    pub(super) fn charge_of(&self, limit: &Limit, role: Role) -> Charge {
        if role == Role::Refund || limit.algorithm == Algorithm::Concurrency {
            return Charge::IfAllowed;
        }
        match limit.charges {
            Charges::Usage => Charge::Always,
            Charges::Admission | Charges::Reserve => Charge::IfAllowed,
            Charges::AsConfigured if self.modes.count_denied => Charge::Always,
            Charges::AsConfigured => Charge::IfAllowed,
        }
    }

    /// The hits a hit on `limit` carries: `asked`, but none for a refund its rule (or
    /// `--refunds`) refuses, which then only reads the counter and changes nothing. Each
    /// refund is counted, given or refused.
    pub(super) fn hits_of(&self, limit: &Limit, role: Role, asked: u64) -> u64 {
        if role != Role::Refund {
            return asked;
        }
        let given = match limit.refunds {
            Refunds::Allow => true,
            Refunds::Refuse => false,
            Refunds::AsConfigured => self.modes.refunds == RefundPolicy::Allow,
        };
        self.metrics.service.count_refund(given);
        if given { asked } else { 0 }
    }

    /// A request that gives back on a counter and charges it too settles a stream: the refund
    /// returns what the request reserved, and the charge reports what the stream spent, which
    /// counts in full, as usage, past the limit too. Envoy sends both in one call when the
    /// stream ends (docs/budgets.md, "reserve and settle"). A concurrency take is never usage.
    pub(super) fn settle(hits: &mut [Hit]) {
        if !hits.iter().any(|hit| hit.role == Role::Refund) {
            return;
        }
        for index in 0..hits.len() {
            let hit = &hits[index];
            let settles = hit.role != Role::Refund
                && hit.params.algorithm != Algorithm::Concurrency
                && hits
                    .iter()
                    .any(|other| other.role == Role::Refund && other.key == hit.key);
            if settles {
                hits[index].charge = Charge::Always;
            }
        }
    }
}
