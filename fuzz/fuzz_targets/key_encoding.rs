//! Counter keys are injective: two different identities (domain, entries) never get the same
//! key. Checked directly on pairs, and by decoding every inline key back to its identity.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate::algorithm::{Algorithm, Params};
use tollgate::storage::keys::{EntryValue, MAX_INLINE_IDENTITY, counter_key};

#[derive(Arbitrary, Debug, PartialEq)]
struct Identity {
    domain: String,
    /// (key, shared bucket?, value)
    entries: Vec<(String, bool, String)>,
}

fn key(identity: &Identity) -> String {
    let params = Params {
        algorithm: Algorithm::default(),
        requests: 10,
        window: 60_000_000,
    };
    counter_key(
        &identity.domain,
        identity.entries.iter().map(|(key, shared, value)| {
            let value = if *shared {
                EntryValue::Shared(value)
            } else {
                EntryValue::Actual(value)
            };
            (key.as_str(), value)
        }),
        &params,
    )
    .as_str()
    .to_owned()
}

/// Reads `<marker><len>:<bytes>` from `rest`.
fn part<'a>(rest: &mut &'a str, marker: char) -> Option<&'a str> {
    let body = rest.strip_prefix(marker)?;
    let (len, body) = body.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let value = body.get(..len)?;
    *rest = &body[len..];
    Some(value)
}

/// The identity of an inline key, parsed back; `None` for a digest key.
fn decode(key: &str) -> Option<Identity> {
    // tollgate:v1:{tag}:fw:60s:<identity>
    let mut fields = key.splitn(6, ':');
    let identity = fields.nth(5)?;
    if identity.starts_with('#') {
        return None;
    }
    let mut rest = identity;
    let domain = part(&mut rest, 'd').expect("a domain part").to_owned();
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let k = part(&mut rest, 'k').expect("a key part").to_owned();
        let (shared, v) = match part(&mut rest, 'v') {
            Some(v) => (false, v),
            None => (true, part(&mut rest, 's').expect("a value part")),
        };
        entries.push((k, shared, v.to_owned()));
    }
    Some(Identity { domain, entries })
}

fuzz_target!(|pair: (Identity, Identity)| {
    let (a, b) = pair;
    let (key_a, key_b) = (key(&a), key(&b));
    if a != b {
        assert_ne!(key_a, key_b, "{a:?} and {b:?} share a counter");
    }
    match decode(&key_a) {
        Some(decoded) => assert_eq!(decoded, a),
        None => assert!(key_a.len() < 200, "a digest key stays short"),
    }
    let _ = MAX_INLINE_IDENTITY;
});
