//! What a stream may report, and why a report is refused: the bounds on a report's buckets,
//! checked before the registry takes it. The service ends a stream that breaks them, with the
//! `Status` its error maps to (`rlqs/service.rs`).

use std::collections::HashMap;

use super::bucket::BucketKey;

/// Most buckets one stream may report, most entries in one bucket, longest key or value.
pub const MAX_BUCKETS_PER_STREAM: usize = 100_000;
pub const MAX_BUCKET_ENTRIES: usize = 64;
pub const MAX_ENTRY_BYTES: usize = 1_024;

/// Why a report is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("a stream may report at most {MAX_BUCKETS_PER_STREAM} buckets")]
    TooManyBuckets,
    #[error("the stream's domain is {domain:?}; a report named {named:?}")]
    OtherDomain { domain: String, named: String },
    #[error("the first report of a stream must name its domain")]
    NoDomain,
    #[error("a bucket_id needs 1 to {MAX_BUCKET_ENTRIES} entries, not {0}")]
    BucketEntries(usize),
    #[error("bucket_id keys and values must not be empty")]
    EmptyEntry,
    #[error("bucket_id keys and values are at most {MAX_ENTRY_BYTES} bytes")]
    LongEntry,
    /// The stream ended (shutdown, or the client went) while its report was read.
    #[error("the stream is closed")]
    Closed,
    /// A message of the stream could not be read (too large, too slow, not RLQS); the
    /// status says why.
    #[error("{message}")]
    Unreadable { code: i32, message: String },
    /// A bound of the whole quota service would be passed (`--rlqs-max-…`).
    #[error("the quota service holds as much as it may: {0}")]
    Full(&'static str),
}

/// What a bucket id holds in memory, as `--rlqs-max-bucket-bytes` counts it.
pub fn bucket_bytes(key: &BucketKey) -> usize {
    key.iter()
        .map(|(k, v)| k.len() + v.len() + ENTRY_OVERHEAD)
        .sum()
}

/// A map entry and its two strings' headers, about.
const ENTRY_OVERHEAD: usize = 64;

/// A bucket's entries, checked: at least one, none empty, at most `MAX_BUCKET_ENTRIES`, each
/// key and value at most `MAX_ENTRY_BYTES`.
pub fn bucket_key(entries: Option<HashMap<String, String>>) -> Result<BucketKey, ReportError> {
    let entries = entries.unwrap_or_default();
    if entries.is_empty() || entries.len() > MAX_BUCKET_ENTRIES {
        return Err(ReportError::BucketEntries(entries.len()));
    }
    if entries.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
        return Err(ReportError::EmptyEntry);
    }
    if entries
        .iter()
        .any(|(k, v)| k.len() > MAX_ENTRY_BYTES || v.len() > MAX_ENTRY_BYTES)
    {
        return Err(ReportError::LongEntry);
    }
    Ok(entries.into_iter().collect())
}
