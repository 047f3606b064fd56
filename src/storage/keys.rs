//! Counter keys: the only place that builds one. A key names one counter identity (domain,
//! entries, algorithm, window) and is:
//! - injective: every component is length-prefixed, so `(a, b:c)` and `(a:b, c)`, or
//!   `(a_b, c)` and `(a, b_c)`, never share a counter (the reference joins with `_` and does);
//! - versioned: `tollgate:v1:` lets a future layout coexist with this one in a shared Redis;
//! - bounded: an identity longer than `MAX_INLINE_IDENTITY` bytes is replaced by its SHA-256
//!   digest (marked `#`, which no inline identity starts with);
//! - slot-safe: the Redis Cluster hash tag `{…}` is a hash of the identity computed by
//!   tollgate, so client bytes such as `{` or `}` can never choose a slot. Every limit of one
//!   identity shares the tag, hence the slot.
//!
//! Layout: `tollgate:v1:{TAG}:ALG:WINDOWs:IDENTITY` with
//! `IDENTITY = d<len>:<domain> (k<len>:<key> (v|s)<len>:<value>)*`, where `s` marks a shared
//! (`share_threshold`) bucket whose value is the config pattern rather than the client's value.

use sha2::{Digest, Sha256};

use crate::algorithm::Params;
use crate::clock::MICROS_PER_SECOND;

/// `tollgate:v1:{TAG}:`: the same length in every key.
const PREFIX_WITH_TAG: usize = "tollgate:v1:{".len() + 16 + "}:".len();

/// Identities longer than this are stored by digest, keeping keys short for Redis.
pub const MAX_INLINE_IDENTITY: usize = 512;

/// A counter's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey(String);

impl CounterKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key past its prefix and tag (algorithm, window and identity), which names the
    /// counter alone: the tag is a hash of the identity. What a store that hashes keys itself
    /// needs to hash.
    pub fn naming_part(&self) -> &str {
        self.0.get(PREFIX_WITH_TAG..).unwrap_or(&self.0)
    }
}

/// The value part of an entry in a counter identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryValue<'a> {
    /// A counter per client value.
    Actual(&'a str),
    /// One counter shared by every value matching this config pattern (`share_threshold`).
    Shared(&'a str),
}

/// Builds the key of one counter, in one allocation when the identity is inline: the prefix
/// is written with a placeholder tag, the identity after it, and the tag (a hash of the
/// identity) is written over the placeholder last. The key is built as bytes, so that the tag
/// is a copy in place rather than a string splice.
pub fn counter_key<'a>(
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, EntryValue<'a>)>,
    params: &Params,
) -> CounterKey {
    const TAG_DIGITS: usize = 16;
    let mut key = Vec::with_capacity(112);
    key.extend_from_slice(b"tollgate:v1:{");
    let tag_at = key.len();
    key.extend_from_slice(&[b'0'; TAG_DIGITS]);
    key.extend_from_slice(b"}:");
    key.extend_from_slice(params.algorithm.key_tag().as_bytes());
    match params.tick() {
        Some(1) => {}
        tick => {
            key.push(b'@');
            push_decimal(&mut key, tick.unwrap_or(0));
            key.extend_from_slice(b"us");
        }
    }
    key.push(b':');
    push_decimal(&mut key, params.window / MICROS_PER_SECOND);
    key.extend_from_slice(b"s:");
    let identity_at = key.len();
    push_part(&mut key, b'd', domain);
    for (entry_key, value) in entries {
        push_part(&mut key, b'k', entry_key);
        match value {
            EntryValue::Actual(value) => push_part(&mut key, b'v', value),
            EntryValue::Shared(pattern) => push_part(&mut key, b's', pattern),
        }
    }
    let tag = hex16(fnv1a64(&key[identity_at..]));
    key[tag_at..tag_at + TAG_DIGITS].copy_from_slice(&tag);
    if key.len() - identity_at > MAX_INLINE_IDENTITY {
        let digest = Sha256::digest(&key[identity_at..]);
        key.truncate(identity_at);
        key.push(b'#');
        for byte in digest {
            key.extend_from_slice(&hex2(byte));
        }
    }
    // Every byte pushed is ASCII or comes whole from a `&str`, so the key is UTF-8 and the
    // lossy fallback is never taken.
    CounterKey(
        String::from_utf8(key)
            .unwrap_or_else(|bad| String::from_utf8_lossy(bad.as_bytes()).into_owned()),
    )
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `value` as 16 lowercase hex digits, without allocating.
fn hex16(value: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (index, digit) in out.iter_mut().enumerate() {
        *digit = HEX_DIGITS[((value >> (60 - 4 * index)) & 0xf) as usize];
    }
    out
}

/// `byte` as 2 lowercase hex digits.
fn hex2(byte: u8) -> [u8; 2] {
    [
        HEX_DIGITS[usize::from(byte >> 4)],
        HEX_DIGITS[usize::from(byte & 0xf)],
    ]
}

fn push_part(out: &mut Vec<u8>, marker: u8, part: &str) {
    out.push(marker);
    push_decimal(out, part.len() as u64);
    out.push(b':');
    out.extend_from_slice(part.as_bytes());
}

/// `value` in decimal: what `write!(out, "{value}")` writes, without the formatting machinery
/// (a large share of a key's cost: docs/performance.md). Most numbers in a key (lengths,
/// windows) are one digit.
fn push_decimal(out: &mut Vec<u8>, mut value: u64) {
    if value < 10 {
        out.push(b'0' + value as u8);
        return;
    }
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    while value > 0 {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
    }
    out.extend_from_slice(&digits[start..]);
}

/// FNV-1a, 64 bits: stable across versions and machines (unlike std's `DefaultHasher`), so
/// every replica picks the same tag for the same identity.
fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::clock::Micros;

    const MINUTE: Micros = 60 * MICROS_PER_SECOND;

    fn key(domain: &str, entries: &[(&str, &str)]) -> String {
        counter_key(
            domain,
            entries.iter().map(|(k, v)| (*k, EntryValue::Actual(v))),
            &params(Algorithm::default()),
        )
        .0
    }

    fn params(algorithm: Algorithm) -> Params {
        Params {
            algorithm,
            requests: 10,
            window: MINUTE,
        }
    }

    #[test]
    fn decimals_are_written_as_format_writes_them() {
        for value in [0, 7, 10, 99, 1_000, 86_400, u64::MAX] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, value);
            assert_eq!(out, format!("x{value}").into_bytes());
        }
    }

    #[test]
    fn a_coarser_tick_is_part_of_the_key() {
        let day = Params {
            algorithm: Algorithm::TokenBucket { burst: 1_000_000 },
            requests: 1_000_000,
            window: 86_400 * MICROS_PER_SECOND,
        };
        let key = counter_key("api", [("user", EntryValue::Actual("a"))], &day);
        assert_eq!(
            key.as_str(),
            "tollgate:v1:{109b2ef74e6221fa}:tb@1000us:86400s:d3:apik4:userv1:a"
        );
    }

    #[test]
    fn layout_is_pinned() {
        assert_eq!(
            key("api", &[("user", "alice")]),
            "tollgate:v1:{195d56cf205ee7dd}:fw:60s:d3:apik4:userv5:alice"
        );
    }

    #[test]
    fn separators_in_client_bytes_cannot_merge_counters() {
        assert_ne!(key("d", &[("a", "b:c")]), key("d", &[("a:b", "c")]));
        assert_ne!(key("d", &[("a_b", "c")]), key("d", &[("a", "b_c")]));
        assert_ne!(
            key("d", &[("a", "bk1:c")]),
            key("d", &[("a", "b"), ("c", "")])
        );
        assert_ne!(key("d_a", &[("b", "c")]), key("d", &[("a_b", "c")]));
    }

    #[test]
    fn shared_buckets_differ_from_a_client_value_equal_to_the_pattern() {
        let shared = counter_key(
            "d",
            [("f", EntryValue::Shared("x*"))],
            &params(Algorithm::default()),
        );
        let actual = counter_key(
            "d",
            [("f", EntryValue::Actual("x*"))],
            &params(Algorithm::default()),
        );
        assert_ne!(shared, actual);
    }

    #[test]
    fn braces_in_values_cannot_pick_the_hash_tag() {
        let k = key("d", &[("user", "{slot}")]);
        let open = k.find('{').unwrap();
        let close = k.find('}').unwrap();
        assert_eq!(
            close - open,
            17,
            "the first {{…}} is tollgate's 16-hex-digit tag: {k}"
        );
    }

    #[test]
    fn long_identities_are_bounded_by_digest_and_stay_distinct() {
        let a = key("d", &[("user", &"x".repeat(65_536))]);
        let b = key("d", &[("user", &format!("{}y", "x".repeat(65_535)))]);
        assert_ne!(a, b);
        assert!(a.len() < 120, "{}", a.len());
        assert!(a.contains(":60s:#"));
    }
}
