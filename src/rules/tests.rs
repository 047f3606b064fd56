//! The reference's matching table (envoyproxy/ratelimit `test/config`), row by row.

use std::path::Path;

use super::matcher::find;
use super::{DomainRules, Policy};
use crate::config::file::parse;
use crate::descriptor::Entry;
use crate::limit::Unit;

const BASIC: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 1, name: key4_rate_limit}
  - key: key5
    value: value5
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
"#;

const WILDCARD: &str = r#"
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 22}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 23}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 24}
  - key: catch
    value: exact
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: catch
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: catch
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: ordered
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: ordered
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

fn rules(yaml: &str) -> DomainRules {
    parse(Path::new("test.yaml"), yaml).unwrap()
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs
        .iter()
        .map(|(key, value)| Entry {
            key: (*key).into(),
            value: (*value).into(),
        })
        .collect()
}

/// What matched: `None`, `Some("unlimited")` or `Some("<n>/<unit>")`, plus the stats path.
fn lookup(domain: &DomainRules, pairs: &[(&str, &str)]) -> Option<(String, String)> {
    let found = find(domain, &entries(pairs))?;
    let limit = match &found.rule.policy {
        Policy::Limited(limits) => format!("{}/{}", limits[0].requests_per_unit, limits[0].unit),
        Policy::Unlimited { .. } => "unlimited".into(),
    };
    Some((limit, found.rule.path.clone()))
}

fn expect(domain: &DomainRules, pairs: &[(&str, &str)], expected: Option<(&str, &str)>) {
    let got = lookup(domain, pairs);
    let expected = expected.map(|(limit, path)| (limit.to_owned(), path.to_owned()));
    assert_eq!(got, expected, "descriptor {pairs:?}");
}

#[test]
fn the_reference_basic_matching_table() {
    let d = rules(BASIC);
    expect(&d, &[("key1", "something")], None);
    expect(&d, &[("key1", "value1")], None);
    expect(
        &d,
        &[("key1", "value1"), ("subkey1", "something")],
        Some(("5/second", "test-domain.key1_value1.subkey1")),
    );
    expect(
        &d,
        &[("key1", "value1"), ("subkey1", "subvalue1")],
        Some(("10/second", "test-domain.key1_value1.subkey1_subvalue1")),
    );
    expect(
        &d,
        &[("key2", "something")],
        Some(("20/minute", "test-domain.key2")),
    );
    expect(
        &d,
        &[("key2", "value2")],
        Some(("30/minute", "test-domain.key2_value2")),
    );
    expect(&d, &[("key2", "value3")], None);
    expect(&d, &[("key2", "value2"), ("subkey", "subvalue")], None);
    expect(&d, &[("key5", "value5"), ("subkey5", "subvalue")], None);
    expect(&d, &[("key3", "foo")], Some(("1/hour", "test-domain.key3")));
    expect(&d, &[("key4", "foo")], Some(("1/day", "test-domain.key4")));
    expect(
        &d,
        &[("key6", "foo")],
        Some(("unlimited", "test-domain.key6")),
    );
    expect(
        &d,
        &[("key7", "any")],
        Some(("70/minute", "test-domain.key7")),
    );
}

#[test]
fn a_limit_name_is_kept() {
    let d = rules(BASIC);
    let found = find(&d, &entries(&[("key4", "foo")])).unwrap();
    assert!(found.rule.is_named("key4_rate_limit"));
    let Policy::Limited(limit) = &found.rule.policy else {
        panic!("limited")
    };
    assert_eq!(limit[0].unit, Unit::Day);
}

#[test]
fn the_reference_wildcard_expectations() {
    let d = rules(WILDCARD);
    expect(
        &d,
        &[("wild", "foo1")],
        Some(("20/minute", "test-domain.wild_foo*")),
    );
    expect(
        &d,
        &[("wild", "foo2")],
        Some(("20/minute", "test-domain.wild_foo*")),
    );
    expect(
        &d,
        &[("wild", "foo")],
        Some(("20/minute", "test-domain.wild_foo*")),
    );
    expect(&d, &[("wild", "bar")], None);
    expect(&d, &[("noWild", "foo1")], None);
    for value in ["barab", "bar123b", "barb"] {
        expect(
            &d,
            &[("midWild", value)],
            Some(("22/minute", "test-domain.midWild_bar*b")),
        );
    }
    for value in ["bara", "xbarb"] {
        expect(&d, &[("midWild", value)], None);
    }
    for value in ["foo123bar456baz", "foobarbaz"] {
        expect(
            &d,
            &[("multiWild", value)],
            Some(("23/minute", "test-domain.multiWild_foo*bar*baz")),
        );
    }
    for value in ["foo123baz", "bar456baz"] {
        expect(&d, &[("multiWild", value)], None);
    }
    expect(
        &d,
        &[("nestedWild", "val1"), ("wild", "goo2")],
        Some(("24/minute", "test-domain.nestedWild_val1.wild_goo*")),
    );
}

#[test]
fn exact_beats_wildcard_beats_key_only_and_wildcards_go_in_config_order() {
    let d = rules(WILDCARD);
    expect(
        &d,
        &[("catch", "exact")],
        Some(("1/minute", "test-domain.catch_exact")),
    );
    expect(
        &d,
        &[("catch", "other")],
        Some(("2/minute", "test-domain.catch_*")),
    );
    expect(
        &d,
        &[("catch", "")],
        Some(("2/minute", "test-domain.catch_*")),
    );
    expect(
        &d,
        &[("ordered", "abc")],
        Some(("4/minute", "test-domain.ordered_a*")),
    );
}

#[test]
fn matching_does_not_backtrack_to_the_key_only_sibling() {
    let d = rules(
        r#"
domain: d
descriptors:
  - key: remote_address
    value: 1.2.3.4
    descriptors:
      - key: path
        value: /a
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: remote_address
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 2}
"#,
    );
    expect(&d, &[("remote_address", "1.2.3.4"), ("path", "/b")], None);
    expect(
        &d,
        &[("remote_address", "5.6.7.8"), ("path", "/b")],
        Some(("2/second", "d.remote_address.path")),
    );
}

#[test]
fn keys_with_underscores_match_on_the_pair_not_a_joined_string() {
    let d = rules(
        r#"
domain: d
descriptors:
  - key: a
    value: b_c
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: x
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 2}
"#,
    );
    expect(&d, &[("a", "b_c")], Some(("1/second", "d.a_b_c")));
    // The reference joins `key_value`, so it would match these two; tollgate does not.
    expect(&d, &[("a_b", "c")], None);
    expect(&d, &[("x_y", "z")], None);
}

#[test]
fn two_rules_whose_stats_paths_coincide_get_distinct_labels() {
    let d = rules(
        r#"
domain: d
descriptors:
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: b
    rate_limit: {unit: second, requests_per_unit: 2}
"#,
    );
    expect(&d, &[("a_b", "anything")], Some(("1/second", "d.a_b")));
    expect(&d, &[("a", "b")], Some(("2/second", "d.a_b~2")));
}

#[test]
fn pattern_pieces_do_not_overlap() {
    let pattern = super::Pattern::new("ab*ba");
    assert!(!pattern.matches("aba"));
    assert!(pattern.matches("abba"));
    assert!(super::Pattern::new("*").matches(""));
    assert!(super::Pattern::new("x*ab*b").matches("xabb"));
    assert!(!super::Pattern::new("x*ab*b").matches("xab"));
}
