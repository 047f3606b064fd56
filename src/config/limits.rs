//! `rate_limit` / `rate_limits` → the limits of a rule: unit and count as the reference, plus
//! tollgate's extensions (algorithm, unit_multiplier, burst, min_interval, anchor), each
//! accepted only where it applies.

use std::time::Duration;

use serde_saphyr::Spanned;

use super::ConfigError;
use super::file::{RawDescriptor, RawRateLimit, RawReplace};
use super::tree::Builder;
use crate::algorithm::{Algorithm, Anchor, sliding_log};
use crate::limit::{Limit, Unit};
use crate::rules::Policy;

const ALGORITHMS: &str = "fixed_window|sliding_window|sliding_log|token_bucket|gcra";

/// The longest window, ten years: far beyond any real limit, far below overflow.
const MAX_WINDOW_SECONDS: u64 = 3_650 * 86_400;

/// The descriptor's policy and `replaces` names, if it has a `rate_limit` or `rate_limits`.
pub(super) fn policy(
    builder: &Builder<'_>,
    raw: &RawDescriptor,
    here: &str,
) -> Result<Option<(Policy, Vec<String>)>, ConfigError> {
    match (&raw.rate_limit, &raw.rate_limits) {
        (None, None) => Ok(None),
        (Some(_), Some(list)) => Err(builder.error(
            list.referenced.line(),
            format!("{here} > rate_limits"),
            "use either rate_limit or rate_limits, not both",
        )),
        (Some(single), None) => {
            let path = format!("{here} > rate_limit");
            let spec = Spec {
                builder,
                raw: &single.value,
                line: single.referenced.line(),
                path: &path,
            };
            let replaces = spec.replaces()?;
            if single.value.unlimited {
                spec.check_unlimited()?;
                return Ok(Some((Policy::Unlimited { name: spec.name() }, replaces)));
            }
            Ok(Some((Policy::Limited(vec![spec.limit()?]), replaces)))
        }
        (None, Some(list)) => several(builder, list, here).map(Some),
    }
}

/// `rate_limits:`: several limits on one counter identity.
fn several(
    builder: &Builder<'_>,
    list: &Spanned<Vec<Spanned<RawRateLimit>>>,
    here: &str,
) -> Result<(Policy, Vec<String>), ConfigError> {
    if list.value.is_empty() {
        return Err(builder.error(
            list.referenced.line(),
            format!("{here} > rate_limits"),
            "must not be empty",
        ));
    }
    let mut limits: Vec<Limit> = Vec::new();
    let mut replaces = Vec::new();
    for (index, item) in list.value.iter().enumerate() {
        let path = format!("{here} > rate_limits[{index}]");
        let spec = Spec {
            builder,
            raw: &item.value,
            line: item.referenced.line(),
            path: &path,
        };
        if item.value.unlimited {
            return Err(spec.error(
                item.referenced.line(),
                "unlimited",
                "cannot be one of several limits",
            ));
        }
        let limit = spec.limit()?;
        if let Some(twin) = limits.iter().find(|other| same_counter(other, &limit)) {
            return Err(spec.error(
                item.referenced.line(),
                "",
                format!(
                    "same algorithm ({}) and window ({} s) as another limit of this descriptor ({}/{}); they would share one counter",
                    limit.algorithm.name(),
                    limit.window_seconds(),
                    twin.requests_per_unit,
                    twin.unit
                ),
            ));
        }
        replaces.extend(
            spec.replaces()?
                .into_iter()
                .map(|name| (index, item.referenced.line(), name)),
        );
        limits.push(limit);
    }
    // A limit replacing a sibling would drop the whole descriptor, itself included.
    for (index, line, name) in &replaces {
        if limits.iter().any(|limit| limit.name.as_ref() == Some(name)) {
            return Err(builder.error(
                *line,
                format!("{here} > rate_limits[{index}].replaces"),
                format!("{name:?} names a limit of this same descriptor, which would disable it"),
            ));
        }
    }
    Ok((
        Policy::Limited(limits),
        replaces.into_iter().map(|(_, _, name)| name).collect(),
    ))
}

/// Two limits of one descriptor would use the same counter key.
fn same_counter(a: &Limit, b: &Limit) -> bool {
    a.algorithm.key_tag() == b.algorithm.key_tag() && a.window_seconds() == b.window_seconds()
}

/// One `rate_limit` mapping and where it is.
struct Spec<'a> {
    builder: &'a Builder<'a>,
    raw: &'a RawRateLimit,
    line: u64,
    path: &'a str,
}

impl Spec<'_> {
    fn error(&self, line: u64, field: &str, reason: impl Into<String>) -> ConfigError {
        let path = if field.is_empty() {
            self.path.to_owned()
        } else {
            format!("{}.{field}", self.path)
        };
        self.builder.error(line, path, reason)
    }

    fn name(&self) -> Option<String> {
        self.raw.name.clone().filter(|name| !name.is_empty())
    }

    /// An unlimited rule takes no unit and no extension parameter.
    fn check_unlimited(&self) -> Result<(), ConfigError> {
        let raw = self.raw;
        let fields = [
            ("unit", raw.unit.as_ref().map(|s| s.referenced.line())),
            (
                "algorithm",
                raw.algorithm.as_ref().map(|s| s.referenced.line()),
            ),
            (
                "unit_multiplier",
                raw.unit_multiplier.as_ref().map(|s| s.referenced.line()),
            ),
            ("burst", raw.burst.as_ref().map(|s| s.referenced.line())),
            (
                "min_interval",
                raw.min_interval.as_ref().map(|s| s.referenced.line()),
            ),
            ("anchor", raw.anchor.as_ref().map(|s| s.referenced.line())),
        ];
        match fields
            .into_iter()
            .find_map(|(field, line)| line.map(|line| (field, line)))
        {
            Some((field, line)) => {
                Err(self.error(line, field, "must not be set when unlimited is true"))
            }
            None => Ok(()),
        }
    }

    fn limit(&self) -> Result<Limit, ConfigError> {
        let unit = self.unit()?;
        let Some(requests_per_unit) = self.raw.requests_per_unit else {
            return Err(self.error(
                self.line,
                "requests_per_unit",
                "missing; write 0 to deny every request",
            ));
        };
        let unit_multiplier = self.unit_multiplier(unit)?;
        let algorithm = self.algorithm(requests_per_unit)?;
        let limit = Limit {
            requests_per_unit,
            unit,
            unit_multiplier,
            name: self.name(),
            algorithm,
        };
        if limit.params().tick().is_none() {
            let factor = match algorithm {
                Algorithm::SlidingWindow => "requests_per_unit",
                _ => "burst",
            };
            return Err(self.error(
                self.line,
                factor,
                format!(
                    "{factor} × window in seconds must be at most 2^52 for {} to count exactly; use a shorter unit with a proportional limit",
                    algorithm.name()
                ),
            ));
        }
        Ok(limit)
    }

    fn unit(&self) -> Result<Unit, ConfigError> {
        let expected = Unit::ALL.map(Unit::as_str).join("|");
        match &self.raw.unit {
            None => Err(self.error(
                self.line,
                "unit",
                format!("missing; expected one of {expected}"),
            )),
            Some(unit) => Unit::parse(&unit.value).ok_or_else(|| {
                self.error(
                    unit.referenced.line(),
                    "unit",
                    format!("expected one of {expected}, got {:?}", unit.value),
                )
            }),
        }
    }

    fn unit_multiplier(&self, unit: Unit) -> Result<u32, ConfigError> {
        let Some(multiplier) = &self.raw.unit_multiplier else {
            return Ok(1);
        };
        let line = multiplier.referenced.line();
        if multiplier.value == 0 {
            return Err(self.error(line, "unit_multiplier", "must be at least 1"));
        }
        if unit.seconds() * u64::from(multiplier.value) > MAX_WINDOW_SECONDS {
            return Err(self.error(
                line,
                "unit_multiplier",
                "the window (unit × unit_multiplier) must be at most 3650 days",
            ));
        }
        Ok(multiplier.value)
    }

    fn algorithm(&self, requests_per_unit: u32) -> Result<Algorithm, ConfigError> {
        let name = self.raw.algorithm.as_ref();
        let algorithm = match name.map(|n| n.value.as_str()).unwrap_or("fixed_window") {
            "fixed_window" => Algorithm::FixedWindow {
                anchor: self.anchor()?,
            },
            "sliding_window" => Algorithm::SlidingWindow,
            "sliding_log" => {
                if u64::from(requests_per_unit) > sliding_log::MAX_LIMIT {
                    return Err(self.error(
                        self.line,
                        "requests_per_unit",
                        format!(
                            "sliding_log keeps one timestamp per admitted hit, so its limit is capped at {} (got {requests_per_unit}); use sliding_window or gcra for larger limits",
                            sliding_log::MAX_LIMIT
                        ),
                    ));
                }
                Algorithm::SlidingLog {
                    min_interval: self.min_interval()?,
                }
            }
            "token_bucket" => Algorithm::TokenBucket {
                burst: self.burst(requests_per_unit)?,
            },
            "gcra" => Algorithm::Gcra {
                burst: self.burst(requests_per_unit)?,
            },
            other => {
                let line = name.map_or(self.line, |n| n.referenced.line());
                return Err(self.error(
                    line,
                    "algorithm",
                    format!("expected one of {ALGORITHMS}, got {other:?}"),
                ));
            }
        };
        self.reject_foreign_parameters(algorithm)?;
        Ok(algorithm)
    }

    /// A parameter of another algorithm is a mistake worth reporting, not ignoring.
    fn reject_foreign_parameters(&self, algorithm: Algorithm) -> Result<(), ConfigError> {
        let raw = self.raw;
        let applies = |field: &str| match field {
            "burst" => matches!(
                algorithm,
                Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. }
            ),
            "min_interval" => matches!(algorithm, Algorithm::SlidingLog { .. }),
            _ => matches!(algorithm, Algorithm::FixedWindow { .. }),
        };
        let present = [
            (
                "burst",
                raw.burst.as_ref().map(|s| s.referenced.line()),
                "token_bucket and gcra",
            ),
            (
                "min_interval",
                raw.min_interval.as_ref().map(|s| s.referenced.line()),
                "sliding_log",
            ),
            (
                "anchor",
                raw.anchor.as_ref().map(|s| s.referenced.line()),
                "fixed_window",
            ),
        ];
        for (field, line, owners) in present {
            if let Some(line) = line
                && !applies(field)
            {
                return Err(self.error(
                    line,
                    field,
                    format!("only applies to {owners}, not {}", algorithm.name()),
                ));
            }
        }
        Ok(())
    }

    fn anchor(&self) -> Result<Anchor, ConfigError> {
        match &self.raw.anchor {
            None => Ok(Anchor::Epoch),
            Some(anchor) => match anchor.value.as_str() {
                "epoch" => Ok(Anchor::Epoch),
                "first_hit" => Ok(Anchor::FirstHit),
                other => Err(self.error(
                    anchor.referenced.line(),
                    "anchor",
                    format!("expected one of epoch|first_hit, got {other:?}"),
                )),
            },
        }
    }

    /// `burst` defaults to `requests_per_unit`.
    fn burst(&self, requests_per_unit: u32) -> Result<u64, ConfigError> {
        match &self.raw.burst {
            None => Ok(u64::from(requests_per_unit)),
            Some(burst) if burst.value == 0 => Err(self.error(
                burst.referenced.line(),
                "burst",
                "must be at least 1 (write requests_per_unit: 0 to deny every request)",
            )),
            Some(burst) => Ok(u64::from(burst.value)),
        }
    }

    fn min_interval(&self) -> Result<u64, ConfigError> {
        let Some(text) = &self.raw.min_interval else {
            return Ok(0);
        };
        let parsed: Result<Duration, _> = humantime::parse_duration(&text.value);
        match parsed {
            Ok(duration) if duration <= Duration::from_secs(MAX_WINDOW_SECONDS) => {
                Ok(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX))
            }
            _ => Err(self.error(
                text.referenced.line(),
                "min_interval",
                format!(
                    "expected a duration such as 3s or 500ms, got {:?}",
                    text.value
                ),
            )),
        }
    }

    fn replaces(&self) -> Result<Vec<String>, ConfigError> {
        let own_name = self.name();
        self.raw
            .replaces
            .iter()
            .enumerate()
            .map(|(index, replace): (usize, &Spanned<RawReplace>)| {
                let field = format!("replaces[{index}].name");
                let name = &replace.value.name;
                if name.is_empty() {
                    Err(self.error(replace.referenced.line(), &field, "must not be empty"))
                } else if Some(name) == own_name.as_ref() {
                    Err(self.error(
                        replace.referenced.line(),
                        &field,
                        format!("a limit cannot replace itself ({name:?})"),
                    ))
                } else {
                    Ok(name.clone())
                }
            })
            .collect()
    }
}
