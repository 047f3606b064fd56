//! What a translation yields, and why one fails: the vocabulary `mod.rs` and `reader.rs` share.

use std::collections::BTreeSet;

/// A reference variable tollgate cannot honour as set.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {reason}")]
pub struct EnvError {
    pub variable: String,
    pub reason: String,
}

pub fn refuse(variable: &str, reason: impl Into<String>) -> EnvError {
    EnvError {
        variable: variable.to_owned(),
        reason: reason.into(),
    }
}

/// `serve`'s arguments for a reference environment.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// The arguments, after `serve`.
    pub args: Vec<String>,
    /// Which variable each flag came from, for error messages.
    pub sources: Vec<(String, String)>,
    /// Set variables tollgate ignores, with why (to log once).
    pub ignored: Vec<(String, &'static str)>,
    /// Every variable the translation consulted.
    pub read: BTreeSet<String>,
    /// Arguments `/bin/ratelimit` was started with: the reference reads none, so neither does
    /// tollgate (to log once).
    pub ignored_args: Vec<String>,
}

impl Translation {
    /// The arguments for a log line, without secrets: a URL's user information and password
    /// parameters, and the values of xDS headers (tokens), are replaced by `<redacted>`.
    pub fn shown(&self) -> String {
        let mut shown = Vec::with_capacity(self.args.len());
        let mut previous = "";
        for arg in &self.args {
            shown.push(match previous {
                "--store" | "--store-per-second" | "--config-xds" => {
                    crate::options::redact_url(arg)
                }
                "--xds-header" => match arg.split_once('=') {
                    Some((name, _)) => format!("{name}=<redacted>"),
                    None => "<redacted>".into(),
                },
                _ => arg.clone(),
            });
            previous = arg;
        }
        shown.join(" ")
    }

    /// The variable a flag came from.
    pub fn source_of(&self, flag: &str) -> Option<&str> {
        self.sources
            .iter()
            .find(|(from, _)| from == flag)
            .map(|(_, variable)| variable.as_str())
    }
}
