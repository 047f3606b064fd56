//! What a limit is: a number of requests per window of time, counted by an algorithm. Built
//! from the YAML rules (`config`) or from a request's own override (`descriptor`).

use std::fmt;

use crate::algorithm::{Algorithm, Params};
use crate::clock::{MICROS_PER_SECOND, Micros};

/// The unit of a window. Lengths follow envoyproxy/ratelimit: a month is 30 days and a year
/// 365 days, so windows stay fixed-length and epoch-aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// Parses a unit name, ignoring case as the reference does.
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.as_str().eq_ignore_ascii_case(name))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit: `requests_per_unit` per `unit_multiplier` × `unit`, counted by `algorithm`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// Windows of several units (30 seconds, 5 minutes); 1 for the reference's limits.
    pub unit_multiplier: u32,
    /// Reported on the wire as `current_limit.name`, and the target of `replaces`.
    pub name: Option<String>,
    pub algorithm: Algorithm,
    /// Whether its counter's budget may be leased by a replica that sees it busy (`lease`).
    pub lease: Lease,
    /// What a charge on it is: an admission, usage already spent, or a reservation.
    pub charges: Charges,
    /// Whether a client's refund (`is_negative_hits`) gives back on it.
    pub refunds: Refunds,
}

/// A rule's `lease`: whether a replica that sees its counter busy may lease part of its
/// budget and decide from it without a store call per hit (storage/lease.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lease {
    /// As `--lease` says.
    #[default]
    AsConfigured,
    /// Leased while busy (`lease: auto`).
    Auto,
    /// Never leased (`lease: off`).
    Off,
}

impl Lease {
    pub const NAMES: [(&'static str, Lease); 2] = [("auto", Lease::Auto), ("off", Lease::Off)];
}

/// A rule's `refunds`: whether a client's refund (Envoy's `is_negative_hits`) gives back on
/// its counter. Any client of the gRPC port can send one for any key, so an operator who
/// does not use refunds refuses them (docs/budgets.md, "Refunds").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Refunds {
    /// As `--refunds` says.
    #[default]
    AsConfigured,
    /// Given back, never more than the counter holds in its current window.
    Allow,
    /// Answered with the counter as it is, changing nothing, and counted
    /// (`tollgate_refunds_total{outcome="refused"}`).
    Refuse,
}

impl Refunds {
    pub const NAMES: [(&'static str, Refunds); 2] =
        [("allow", Refunds::Allow), ("refuse", Refunds::Refuse)];
}

/// A rule's `charges`: what a charge (hits that are not a refund) on its counter is. Envoy
/// sends the same descriptors when a request arrives and when its stream ends, so only the
/// rule can say whether its hits ask to be admitted or report what was spent
/// (docs/budgets.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Charges {
    /// As `--count-denied` says: usage with it, admissions without.
    #[default]
    AsConfigured,
    /// Admissions: a charge that does not fit is refused and consumes nothing, and a
    /// request's charges are all-or-nothing.
    Admission,
    /// Usage already spent (tokens charged when a response ends): every charge counts in
    /// full, past the limit too, and is answered OVER_LIMIT when it crosses it.
    Usage,
    /// Reservations: admissions whose hits the answer reports under the limit's name
    /// (dynamic metadata `reserved.<name>`), so that the end of the stream gives back exactly
    /// what was reserved, and nothing for a request that was refused.
    Reserve,
}

impl Charges {
    pub const NAMES: [(&'static str, Charges); 3] = [
        ("admission", Charges::Admission),
        ("usage", Charges::Usage),
        ("reserve", Charges::Reserve),
    ];

    /// The config name, when a rule says it.
    pub fn name(self) -> Option<&'static str> {
        Charges::NAMES
            .iter()
            .find(|(_, charges)| *charges == self)
            .map(|(name, _)| *name)
    }
}

impl Limit {
    pub fn new(requests_per_unit: u32, unit: Unit) -> Self {
        Self {
            requests_per_unit,
            unit,
            unit_multiplier: 1,
            name: None,
            algorithm: Algorithm::default(),
            lease: Lease::AsConfigured,
            charges: Charges::AsConfigured,
            refunds: Refunds::AsConfigured,
        }
    }

    /// The name its hits are reported under when it reserves them (`Charges::Reserve`, and
    /// every concurrency limit, whose takes a stream's end gives back).
    pub fn reserved_as(&self) -> Option<&str> {
        let reserves = self.charges == Charges::Reserve || self.algorithm == Algorithm::Concurrency;
        self.name.as_deref().filter(|_| reserves)
    }

    /// The window length in microseconds (the config bounds it well below overflow).
    pub fn window(&self) -> Micros {
        self.window_seconds().saturating_mul(MICROS_PER_SECOND)
    }

    pub fn window_seconds(&self) -> u64 {
        self.unit
            .seconds()
            .saturating_mul(u64::from(self.unit_multiplier))
    }

    /// What the store is asked for this limit.
    pub fn params(&self) -> Params {
        Params {
            algorithm: self.algorithm,
            requests: u64::from(self.requests_per_unit),
            window: self.window(),
        }
    }
}
