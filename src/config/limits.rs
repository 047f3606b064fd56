//! `rate_limit` / `rate_limits` → the limits of a rule: unit and count as the reference, plus
//! tollgate's extensions (algorithm, unit_multiplier, burst, min_interval, anchor; lease,
//! charges and refunds in `settings.rs`), each accepted only where it applies.

use std::path::Path;
use std::time::Duration;

use serde_saphyr::Spanned;

use super::error::ConfigError;
use super::raw::{RawDescriptor, RawRateLimit, RawReplace};
use crate::algorithm::{Algorithm, Anchor, Parameter, Parameters};
use crate::limit::{Charges, Lease, Limit, Refunds, Unit};
use crate::rules::Policy;

mod settings;

/// The longest window, ten years: far beyond any real limit, far below overflow.
const MAX_WINDOW_SECONDS: u64 = 3_650 * 86_400;

/// The descriptor's policy and `replaces` names, if it has a `rate_limit` or `rate_limits`.
pub(super) fn policy(
    file: &Path,
    raw: &RawDescriptor,
    here: &str,
) -> Result<Option<(Policy, Vec<String>)>, ConfigError> {
    match (&raw.rate_limit, &raw.rate_limits) {
        (None, None) => Ok(None),
        (Some(_), Some(list)) => Err(ConfigError::at(
            file,
            list.referenced.line(),
            format!("{here} > rate_limits"),
            "use either rate_limit or rate_limits, not both",
        )),
        (Some(single), None) => {
            let path = format!("{here} > rate_limit");
            let spec = Spec {
                file,
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
        (None, Some(list)) => several(file, list, here).map(Some),
    }
}

/// `rate_limits:`: several limits on one counter identity.
fn several(
    file: &Path,
    list: &Spanned<Vec<Spanned<RawRateLimit>>>,
    here: &str,
) -> Result<(Policy, Vec<String>), ConfigError> {
    if list.value.is_empty() {
        return Err(ConfigError::at(
            file,
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
            file,
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
            return Err(ConfigError::at(
                file,
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
    file: &'a Path,
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
        ConfigError::at(self.file, line, path, reason)
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
            ("lease", raw.lease.as_ref().map(|s| s.referenced.line())),
            ("charges", raw.charges.as_ref().map(|s| s.referenced.line())),
            ("refunds", raw.refunds.as_ref().map(|s| s.referenced.line())),
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
        let mut limit = Limit {
            requests_per_unit,
            unit,
            unit_multiplier,
            name: self.name(),
            algorithm: Algorithm::default(),
            lease: Lease::AsConfigured,
            charges: Charges::AsConfigured,
            refunds: Refunds::AsConfigured,
        };
        limit.algorithm = self.algorithm(&limit)?;
        limit.lease = self.lease(&limit)?;
        limit.charges = self.charges(&limit)?;
        limit.refunds = self.refunds()?;
        Ok(limit)
    }

    /// The algorithm and its parameters, checked by the algorithm itself.
    fn algorithm(&self, limit: &Limit) -> Result<Algorithm, ConfigError> {
        let named = match &self.raw.algorithm {
            None => Algorithm::default(),
            Some(name) => name.value.parse().map_err(|reason: String| {
                self.error(name.referenced.line(), "algorithm", reason)
            })?,
        };
        let given = Parameters {
            anchor: self.anchor()?,
            burst: self.raw.burst.as_ref().map(|burst| u64::from(burst.value)),
            min_interval: self.min_interval()?,
        };
        let params = limit.params();
        named
            .configure(params.requests, params.window, &given)
            .map_err(|error| {
                let line = match error.parameter {
                    Some(parameter) => self.line_of(parameter),
                    None => None,
                };
                self.error(line.unwrap_or(self.line), error.field, error.reason)
            })
    }

    /// Where a parameter is written.
    fn line_of(&self, parameter: Parameter) -> Option<u64> {
        let raw = self.raw;
        match parameter {
            Parameter::Anchor => raw.anchor.as_ref().map(|s| s.referenced.line()),
            Parameter::Burst => raw.burst.as_ref().map(|s| s.referenced.line()),
            Parameter::MinInterval => raw.min_interval.as_ref().map(|s| s.referenced.line()),
        }
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

    fn anchor(&self) -> Result<Option<Anchor>, ConfigError> {
        let Some(anchor) = &self.raw.anchor else {
            return Ok(None);
        };
        match Anchor::ALL.into_iter().find(|a| a.name() == anchor.value) {
            Some(parsed) => Ok(Some(parsed)),
            None => {
                let names: Vec<&str> = Anchor::ALL.into_iter().map(Anchor::name).collect();
                Err(self.error(
                    anchor.referenced.line(),
                    "anchor",
                    format!(
                        "expected one of {}, got {:?}",
                        names.join("|"),
                        anchor.value
                    ),
                ))
            }
        }
    }

    fn min_interval(&self) -> Result<Option<u64>, ConfigError> {
        let Some(text) = &self.raw.min_interval else {
            return Ok(None);
        };
        let parsed: Result<Duration, _> = humantime::parse_duration(&text.value);
        match parsed {
            Ok(duration) if duration <= Duration::from_secs(MAX_WINDOW_SECONDS) => Ok(Some(
                u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
            )),
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
