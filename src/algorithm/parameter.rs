//! The parameters a rule may give an algorithm, before `Algorithm::configure` checks them
//! against the algorithm it names, and what it says when they do not fit.

use super::fixed_window::Anchor;
use crate::clock::Micros;

/// A parameter that some algorithms take, as a rule names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parameter {
    Anchor,
    Burst,
    MinInterval,
}

impl Parameter {
    pub const ALL: [Parameter; 3] = [Parameter::Burst, Parameter::MinInterval, Parameter::Anchor];

    pub fn name(self) -> &'static str {
        match self {
            Parameter::Anchor => "anchor",
            Parameter::Burst => "burst",
            Parameter::MinInterval => "min_interval",
        }
    }
}

/// The parameters a rule gave, before they are checked against its algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Parameters {
    pub anchor: Option<Anchor>,
    pub burst: Option<u64>,
    pub min_interval: Option<Micros>,
}

impl Parameters {
    pub fn is_given(&self, parameter: Parameter) -> bool {
        match parameter {
            Parameter::Anchor => self.anchor.is_some(),
            Parameter::Burst => self.burst.is_some(),
            Parameter::MinInterval => self.min_interval.is_some(),
        }
    }
}

/// Why an algorithm cannot count a limit as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ParameterError {
    /// The given parameter at fault; `None` when it is the limit as a whole.
    pub parameter: Option<Parameter>,
    /// The field the error names (`burst`, `requests_per_unit`, …).
    pub field: &'static str,
    pub reason: String,
}

impl Parameters {
    /// `burst`, which defaults to `requests_per_unit`.
    pub fn burst_or(&self, requests: u64) -> Result<u64, ParameterError> {
        match self.burst {
            None => Ok(requests),
            Some(0) => Err(ParameterError {
                parameter: Some(Parameter::Burst),
                field: "burst",
                reason: "must be at least 1 (write requests_per_unit: 0 to deny every request)"
                    .into(),
            }),
            Some(burst) => Ok(burst),
        }
    }
}
