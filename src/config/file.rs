//! One config file: parsed by `raw`, then turned by `tree` and `limits` into the compiled rules
//! of one domain, checking everything serde cannot. Every error carries the file, the line and
//! the path to the offending field.

use std::path::Path;

use super::error::ConfigError;
use super::raw::deserialize;
use super::tree::Builder;
use crate::rules::DomainRules;

/// Parses and validates the text of one config file.
pub fn parse(file: &Path, text: &str) -> Result<DomainRules, ConfigError> {
    let raw = deserialize(file, text)?;
    let domain = match raw.domain {
        Some(domain) if !domain.value.is_empty() => domain.value,
        Some(domain) => {
            let line = domain.referenced.line();
            return Err(ConfigError::at(
                file,
                line,
                "domain".into(),
                "must not be empty",
            ));
        }
        None => {
            let reason = "missing; every file names its domain";
            return Err(ConfigError::at(file, 1, "domain".into(), reason));
        }
    };
    let builder = Builder::new(file);
    let root = builder.level(&raw.descriptors, &format!("domain {domain:?}"), &domain)?;
    Ok(DomainRules { name: domain, root })
}
