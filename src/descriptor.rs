//! The request vocabulary past the wire: a validated `Request` of `Descriptor`s. Converting
//! from the protobuf types is the only place where request input is checked, so nothing after
//! `service.rs` (or the `/json` endpoint) can see an invalid or oversized request.

use crate::limit::{Limit, Unit};
use crate::pb;

/// Bounds on request input (docs/design.md "Input bounds"): requests over a bound get
/// INVALID_ARGUMENT. Each is a flag of `tollgate serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct InputLimits {
    /// Most descriptors in one request.
    #[arg(long, env = "TOLLGATE_MAX_DESCRIPTORS", default_value_t = InputLimits::DEFAULT.max_descriptors)]
    pub max_descriptors: usize,

    /// Most entries in one descriptor.
    #[arg(long, env = "TOLLGATE_MAX_ENTRIES", default_value_t = InputLimits::DEFAULT.max_entries)]
    pub max_entries: usize,

    /// Longest entry key, in bytes.
    #[arg(long, env = "TOLLGATE_MAX_KEY_BYTES", default_value_t = InputLimits::DEFAULT.max_key_bytes)]
    pub max_key_bytes: usize,

    /// Longest entry value (and domain), in bytes.
    #[arg(long, env = "TOLLGATE_MAX_VALUE_BYTES", default_value_t = InputLimits::DEFAULT.max_value_bytes)]
    pub max_value_bytes: usize,

    /// Largest hits_addend, request- or descriptor-level (at most 10^12, which keeps every
    /// count exact in the Redis scripts' arithmetic).
    #[arg(long, env = "TOLLGATE_MAX_HITS_ADDEND", default_value_t = InputLimits::DEFAULT.max_hits_addend,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000_000))]
    pub max_hits_addend: u64,

    /// Largest gRPC request message, in bytes (larger ones get OUT_OF_RANGE from gRPC).
    #[arg(long, env = "TOLLGATE_MAX_REQUEST_BYTES", default_value_t = InputLimits::DEFAULT.max_request_bytes)]
    pub max_request_bytes: usize,
}

impl InputLimits {
    pub const DEFAULT: InputLimits = InputLimits {
        max_descriptors: 64,
        max_entries: 16,
        max_key_bytes: 256,
        max_value_bytes: 4096,
        max_hits_addend: 1_000_000_000,
        max_request_bytes: 1024 * 1024,
    };
}

impl Default for InputLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One `key=value` pair of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: String,
}

/// One descriptor: its entries, the hits it adds, and an optional per-request limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<Entry>,
    /// Resolved: the descriptor's own `hits_addend` if present (0 = check only), else the
    /// request's, where 0 means 1.
    pub hits: u64,
    pub limit_override: Option<Limit>,
    /// Envoy's `is_negative_hits`: `hits` are given back, not spent.
    pub refund: bool,
}

/// A validated rate-limit request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
}

/// Why a request is invalid; each names the offending field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("domain: must not be empty")]
    EmptyDomain,
    #[error("domain: {len} bytes is over the limit of {max}")]
    DomainTooLong { len: usize, max: usize },
    #[error("descriptors: must not be empty")]
    NoDescriptors,
    #[error("descriptors: {count} descriptors is over the limit of {max}")]
    TooManyDescriptors { count: usize, max: usize },
    #[error("descriptors[{descriptor}].entries: must not be empty")]
    NoEntries { descriptor: usize },
    #[error("descriptors[{descriptor}].entries: {count} entries is over the limit of {max}")]
    TooManyEntries {
        descriptor: usize,
        count: usize,
        max: usize,
    },
    #[error("descriptors[{descriptor}].entries[{entry}].key: must not be empty")]
    EmptyKey { descriptor: usize, entry: usize },
    #[error(
        "descriptors[{descriptor}].entries[{entry}].key: {len} bytes is over the limit of {max}"
    )]
    KeyTooLong {
        descriptor: usize,
        entry: usize,
        len: usize,
        max: usize,
    },
    #[error(
        "descriptors[{descriptor}].entries[{entry}].value: {len} bytes is over the limit of {max}"
    )]
    ValueTooLong {
        descriptor: usize,
        entry: usize,
        len: usize,
        max: usize,
    },
    #[error("{field}: {hits} is over the limit of {max}")]
    HitsTooLarge { field: String, hits: u64, max: u64 },
    #[error(
        "descriptors[{descriptor}].limit.unit: must be one of SECOND|MINUTE|HOUR|DAY|WEEK|MONTH|YEAR, got {unit}"
    )]
    BadOverrideUnit { descriptor: usize, unit: i32 },
}

impl Request {
    /// Validates a protobuf request against `limits`.
    pub fn from_pb(
        request: pb::RateLimitRequest,
        limits: &InputLimits,
    ) -> Result<Self, RequestError> {
        check_domain(&request.domain, limits)?;
        if request.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        if request.descriptors.len() > limits.max_descriptors {
            return Err(RequestError::TooManyDescriptors {
                count: request.descriptors.len(),
                max: limits.max_descriptors,
            });
        }
        let default_hits = check_hits(
            u64::from(request.hits_addend).max(1),
            || "hits_addend".to_owned(),
            limits,
        )?;
        let descriptors = request
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(index, descriptor)| Descriptor::from_pb(index, descriptor, default_hits, limits))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            domain: request.domain,
            descriptors,
        })
    }
}

impl Descriptor {
    fn from_pb(
        index: usize,
        descriptor: pb::RateLimitDescriptor,
        default_hits: u64,
        limits: &InputLimits,
    ) -> Result<Self, RequestError> {
        if descriptor.entries.is_empty() {
            return Err(RequestError::NoEntries { descriptor: index });
        }
        if descriptor.entries.len() > limits.max_entries {
            return Err(RequestError::TooManyEntries {
                descriptor: index,
                count: descriptor.entries.len(),
                max: limits.max_entries,
            });
        }
        let entries = descriptor
            .entries
            .into_iter()
            .enumerate()
            .map(|(entry, e)| check_entry(index, entry, e, limits))
            .collect::<Result<_, _>>()?;
        let hits = match descriptor.hits_addend {
            Some(own) => check_hits(own, || format!("descriptors[{index}].hits_addend"), limits)?,
            None => default_hits,
        };
        let limit_override = descriptor
            .limit
            .map(|limit| override_limit(index, limit))
            .transpose()?;
        Ok(Self {
            entries,
            hits,
            limit_override,
            refund: descriptor.is_negative_hits,
        })
    }
}

fn check_domain(domain: &str, limits: &InputLimits) -> Result<(), RequestError> {
    if domain.is_empty() {
        return Err(RequestError::EmptyDomain);
    }
    if domain.len() > limits.max_value_bytes {
        return Err(RequestError::DomainTooLong {
            len: domain.len(),
            max: limits.max_value_bytes,
        });
    }
    Ok(())
}

fn check_entry(
    descriptor: usize,
    entry: usize,
    pb::rate_limit_descriptor::Entry { key, value }: pb::rate_limit_descriptor::Entry,
    limits: &InputLimits,
) -> Result<Entry, RequestError> {
    if key.is_empty() {
        return Err(RequestError::EmptyKey { descriptor, entry });
    }
    if key.len() > limits.max_key_bytes {
        return Err(RequestError::KeyTooLong {
            descriptor,
            entry,
            len: key.len(),
            max: limits.max_key_bytes,
        });
    }
    if value.len() > limits.max_value_bytes {
        return Err(RequestError::ValueTooLong {
            descriptor,
            entry,
            len: value.len(),
            max: limits.max_value_bytes,
        });
    }
    Ok(Entry { key, value })
}

fn check_hits(
    hits: u64,
    field: impl FnOnce() -> String,
    limits: &InputLimits,
) -> Result<u64, RequestError> {
    if hits > limits.max_hits_addend {
        return Err(RequestError::HitsTooLarge {
            field: field(),
            hits,
            max: limits.max_hits_addend,
        });
    }
    Ok(hits)
}

fn override_limit(
    descriptor: usize,
    limit: pb::rate_limit_descriptor::RateLimitOverride,
) -> Result<Limit, RequestError> {
    use pb::envoy::r#type::v3::RateLimitUnit as PbUnit;
    let unit = match PbUnit::try_from(limit.unit) {
        Ok(PbUnit::Second) => Unit::Second,
        Ok(PbUnit::Minute) => Unit::Minute,
        Ok(PbUnit::Hour) => Unit::Hour,
        Ok(PbUnit::Day) => Unit::Day,
        Ok(PbUnit::Week) => Unit::Week,
        Ok(PbUnit::Month) => Unit::Month,
        Ok(PbUnit::Year) => Unit::Year,
        Ok(PbUnit::Unknown) | Err(_) => {
            return Err(RequestError::BadOverrideUnit {
                descriptor,
                unit: limit.unit,
            });
        }
    };
    Ok(Limit::new(limit.requests_per_unit, unit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::rate_limit_descriptor::{Entry as PbEntry, RateLimitOverride};

    fn entry(key: &str, value: &str) -> PbEntry {
        PbEntry {
            key: key.into(),
            value: value.into(),
        }
    }

    fn request(
        hits_addend: u32,
        descriptors: Vec<pb::RateLimitDescriptor>,
    ) -> pb::RateLimitRequest {
        pb::RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend,
        }
    }

    fn descriptor(hits_addend: Option<u64>) -> pb::RateLimitDescriptor {
        pb::RateLimitDescriptor {
            entries: vec![entry("k", "v")],
            limit: None,
            hits_addend,
            is_negative_hits: false,
        }
    }

    #[test]
    fn descriptor_hits_addend_wins_even_when_zero_and_request_zero_means_one() {
        let parsed = Request::from_pb(
            request(
                0,
                vec![descriptor(None), descriptor(Some(0)), descriptor(Some(7))],
            ),
            &InputLimits::default(),
        )
        .unwrap();
        let hits: Vec<u64> = parsed.descriptors.iter().map(|d| d.hits).collect();
        assert_eq!(hits, [1, 0, 7]);
        let parsed =
            Request::from_pb(request(5, vec![descriptor(None)]), &InputLimits::default()).unwrap();
        assert_eq!(parsed.descriptors[0].hits, 5);
    }

    #[test]
    fn invalid_requests_name_the_field() {
        let limits = InputLimits::default();
        let mut empty_domain = request(0, vec![descriptor(None)]);
        empty_domain.domain.clear();
        assert_eq!(
            Request::from_pb(empty_domain, &limits)
                .unwrap_err()
                .to_string(),
            "domain: must not be empty"
        );
        assert_eq!(
            Request::from_pb(request(0, vec![]), &limits)
                .unwrap_err()
                .to_string(),
            "descriptors: must not be empty"
        );
        let mut empty_key = descriptor(None);
        empty_key.entries.push(entry("", "x"));
        assert_eq!(
            Request::from_pb(request(0, vec![descriptor(None), empty_key]), &limits)
                .unwrap_err()
                .to_string(),
            "descriptors[1].entries[1].key: must not be empty"
        );
        let mut no_entries = descriptor(None);
        no_entries.entries.clear();
        assert_eq!(
            Request::from_pb(request(0, vec![no_entries]), &limits).unwrap_err(),
            RequestError::NoEntries { descriptor: 0 }
        );
    }

    #[test]
    fn override_with_unknown_unit_is_rejected() {
        let mut bad = descriptor(None);
        bad.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 0,
        });
        assert_eq!(
            Request::from_pb(request(0, vec![bad]), &InputLimits::default())
                .unwrap_err()
                .to_string(),
            "descriptors[0].limit.unit: must be one of SECOND|MINUTE|HOUR|DAY|WEEK|MONTH|YEAR, got 0"
        );
        let mut good = descriptor(None);
        good.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 4,
        });
        let parsed = Request::from_pb(request(0, vec![good]), &InputLimits::default()).unwrap();
        assert_eq!(
            parsed.descriptors[0].limit_override,
            Some(Limit::new(5, Unit::Day))
        );
    }

    #[test]
    fn override_in_weeks_is_a_week_long_limit() {
        let mut weekly = descriptor(None);
        weekly.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 7,
        });
        let parsed = Request::from_pb(request(0, vec![weekly]), &InputLimits::default()).unwrap();
        let limit = parsed.descriptors[0].limit_override.clone().unwrap();
        assert_eq!((limit.unit, limit.window_seconds()), (Unit::Week, 604_800));
    }
}
