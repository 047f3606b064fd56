//! Value parsers shared by `serve`'s flags: what clap cannot check by type alone.

/// A key prefix without `{` or `}`, which would choose the Redis Cluster slot.
pub fn key_prefix(text: &str) -> Result<String, String> {
    if text.contains(['{', '}']) {
        Err("must not contain `{` or `}` (they would choose the Redis Cluster slot)".into())
    } else {
        Ok(text.to_owned())
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

/// `key=value`, neither empty.
pub fn tag(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() && !value.is_empty() => {
            Ok((key.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not key=value")),
    }
}

pub use crate::clock::positive_duration;
