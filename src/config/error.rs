//! What a config error says: the file, the line and the path to the offending field, then the
//! reason (`api.yaml:6: domain "api" > descriptors[1] (key "user") > rate_limit.unit: …`).

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in the config: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line, when the problem has a place in the file.
    pub line: Option<u64>,
    /// Where in the document, e.g. `domain "api" > descriptors[2] (key "user") > rate_limit.unit`.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found while loading a directory, one per line when displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl ConfigError {
    /// A problem at `line` of `file`.
    pub(super) fn at(file: &Path, line: u64, path: String, reason: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            line: Some(line),
            path,
            reason: reason.into(),
        }
    }
}
