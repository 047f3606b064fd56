//! The parts' options structs. Each part of the server declares what configures it as one
//! struct whose fields are `tollgate serve`'s flags (a `clap::Args`, flattened into `serve`),
//! so that a flag, its `TOLLGATE_*` variable, its help and its default are written once, in
//! its `#[arg]`. The struct's `Default` is those defaults: what `serve` would get from no flag
//! and no variable (`defaults`).

/// The value of every flag of `T` given neither on a command line nor in the environment: the
/// defaults its `#[arg]`s declare.
pub fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults").no_binary_name(true))
        .mut_args(|arg| arg.env(None));
    let parsed = command
        .try_get_matches_from(std::iter::empty::<&str>())
        .and_then(|matches| T::from_arg_matches(&matches));
    match parsed {
        Ok(options) => options,
        // Every flag of an options struct has a default or is optional: a missing one is a
        // mistake in the declaration, caught by each struct's test.
        Err(error) => panic!("an options struct without a default: {error}"),
    }
}

/// `key=value`, neither empty (tags, node metadata, headers).
pub fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() && !value.is_empty() => {
            Ok((key.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not key=value")),
    }
}

/// An absolute URL path.
pub fn url_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') && !text.contains(char::is_whitespace) {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?} is not a path starting with /"))
    }
}

/// A duration (`50ms`, `1s`, `2m`) above zero: for timeouts, where zero would fail every
/// call.
pub fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be above zero".into()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}
