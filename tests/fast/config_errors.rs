//! One test per config error message, each on a fixture directory under
//! tests/fixtures/config_errors/: the message names the file, the line and the path.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

fn errors_of(case: &str) -> String {
    let dir = Path::new("tests/fixtures/config_errors").join(case);
    match tollgate::config::load_dir(&dir) {
        Ok(_) => panic!("{case}: expected an error"),
        Err(errors) => errors.to_string(),
    }
}

macro_rules! config_error {
    ($($case:ident => $expected:expr;)*) => {$(
        #[test]
        fn $case() {
            let expected = format!(
                "tests/fixtures/config_errors/{}/{}",
                stringify!($case),
                $expected
            );
            assert_eq!(errors_of(stringify!($case)), expected);
        }
    )*};
}

config_error! {
    unknown_key => "api.yaml:4: descriptors[0].ratelimit: unknown field `ratelimit`, expected one of key, value, rate_limit, rate_limits, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold, metadata, descriptors";
    unknown_rate_limit_key => "api.yaml:6: descriptors[0].rate_limit.requestsperunit: unknown field `requestsperunit`, expected one of unit, requests_per_unit, unlimited, name, replaces, algorithm, unit_multiplier, burst, min_interval, anchor, lease, charges, refunds";
    yaml_syntax => "api.yaml:4: descriptors[0]: invalid indentation in multiline quoted scalar";
    missing_domain => "api.yaml:1: domain: missing; every file names its domain";
    empty_domain => "api.yaml:1: domain: must not be empty";
    duplicate_domain => "b.yaml:1: domain \"api\": duplicate domain, already defined in tests/fixtures/config_errors/duplicate_domain/a.yaml";
    empty_key => "api.yaml:5: domain \"api\" > descriptors[0] (key \"user\") > descriptors[0] (key \"\") > key: must not be empty";
    duplicate_descriptor => "api.yaml:6: domain \"api\" > descriptors[1] (key \"user\"): duplicate descriptor: another one at this level has the same key and value (api.user_alice)";
    bad_unit => "api.yaml:6: domain \"api\" > descriptors[1] (key \"user\") > rate_limit.unit: expected one of second|minute|hour|day|week|month|year, got \"fortnight\"";
    missing_unit => "api.yaml:5: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.unit: missing; expected one of second|minute|hour|day|week|month|year";
    missing_requests_per_unit => "api.yaml:5: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.requests_per_unit: missing; write 0 to deny every request";
    unlimited_with_unit => "api.yaml:6: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.unit: must not be set when unlimited is true";
    empty_replaces => "api.yaml:8: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.replaces[0].name: must not be empty";
    replaces_itself => "api.yaml:9: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.replaces[0].name: a limit cannot replace itself (\"per_user\")";
    share_threshold_without_wildcard => "api.yaml:5: domain \"api\" > descriptors[0] (key \"files\") > share_threshold: only applies to a wildcard value (one containing '*')";
    metadata_not_a_map => "api.yaml:4: domain \"api\" > descriptors[0] (key \"user\") > metadata: expected a map";
    negative_requests_per_unit => "api.yaml:4: descriptors[0].rate_limit.requests_per_unit: expected a whole number from 0 to 4294967295";
    wrong_type => "api.yaml:4: descriptors[0].shadow_mode: expected true or false";
    multiple_documents => "api.yaml:3: more than one YAML document; a config file holds exactly one domain";
    second_document => "api.yaml:5: more than one YAML document; a config file holds exactly one domain";
    null_key => "api.yaml:3: descriptors[0].key: expected a value, got nothing";
    not_a_map => "api.yaml:4: descriptors[0].rate_limit: expected a map (`name: value` lines, or `{name: value}`), got a single value or a list";
    not_a_list => "api.yaml:2: descriptors: expected a list (`- ` items, or `[…]`), got a single value or a map";
    one_bad_file_rejects_all => "bad.yaml:4: domain \"bad\" > descriptors[0] (key \"user\") > rate_limit.requests_per_unit: missing; write 0 to deny every request";
    unknown_algorithm => "api.yaml:7: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.algorithm: expected one of fixed_window|sliding_window|sliding_log|token_bucket|gcra|concurrency, got \"leaky_bucket\"";
    parameter_of_another_algorithm => "api.yaml:7: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.burst: only applies to token_bucket and gcra, not fixed_window";
    min_interval_on_gcra => "api.yaml:8: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.min_interval: only applies to sliding_log, not gcra";
    bad_min_interval => "api.yaml:8: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.min_interval: expected a duration such as 3s or 500ms, got \"soon\"";
    sliding_log_over_cap => "api.yaml:5: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.requests_per_unit: sliding_log keeps one timestamp per admitted hit, so its limit is capped at 10000 (got 50000); use sliding_window or gcra for larger limits";
    zero_unit_multiplier => "api.yaml:6: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.unit_multiplier: must be at least 1";
    burst_too_large_to_count_exactly => "api.yaml:5: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.burst: burst × window in seconds must be at most 2^52 for gcra to count exactly; use a shorter unit with a proportional limit";
    zero_burst => "api.yaml:8: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.burst: must be at least 1 (write requests_per_unit: 0 to deny every request)";
    lease_on_a_sliding_window => "api.yaml:8: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.lease: only a fixed_window limit aligned on the epoch, a token_bucket or a gcra limit can be leased, not sliding_window";
    lease_on_a_bucket_too_small_to_split => "api.yaml:9: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.lease: a token_bucket limit can be leased only with a burst of at least 2 that takes at least 40 ms to refill (a slice lives half of that)";
    bad_lease => "api.yaml:7: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.lease: expected one of auto|off, got \"always\"";
    unlimited_with_lease => "api.yaml:6: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.lease: must not be set when unlimited is true";
    bad_anchor => "api.yaml:7: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.anchor: expected one of epoch|first_hit, got \"midnight\"";
    unlimited_with_algorithm => "api.yaml:6: domain \"api\" > descriptors[0] (key \"user\") > rate_limit.algorithm: must not be set when unlimited is true";
    rate_limit_and_rate_limits => "api.yaml:6: domain \"api\" > descriptors[0] (key \"user\") > rate_limits: use either rate_limit or rate_limits, not both";
    empty_rate_limits => "api.yaml:4: domain \"api\" > descriptors[0] (key \"user\") > rate_limits: must not be empty";
    same_window_twice => "api.yaml:6: domain \"api\" > descriptors[0] (key \"user\") > rate_limits[1]: same algorithm (fixed_window) and window (60 s) as another limit of this descriptor (5/minute); they would share one counter";
    unlimited_in_rate_limits => "api.yaml:6: domain \"api\" > descriptors[0] (key \"user\") > rate_limits[1].unlimited: cannot be one of several limits";
    unclosed_brace => "api.yaml:4: descriptors[0].rate_limit.requests_per_unit: the \"{\" on this line is never closed: end it with \"}\" (the YAML parser found: expected a whole number from 0 to 4294967295)";
    unclosed_bracket => "api.yaml:1: domain: the \"[\" on this line is never closed: end it with \"]\" (the YAML parser found: expected a single value (text), got a list or a map)";
    list_for_a_string => "api.yaml:1: domain: expected a single value (text), got a list or a map";
    bad_charges => "api.yaml:7: domain \"api\" > descriptors[0] (key \"tenant\") > rate_limit.charges: expected one of admission|usage|reserve, got \"after\"";
    bad_refunds => "api.yaml:7: domain \"api\" > descriptors[0] (key \"tenant\") > rate_limit.refunds: expected one of allow|refuse, got \"never\"";
    reserve_without_a_name => "api.yaml:7: domain \"api\" > descriptors[0] (key \"tenant\") > rate_limit.charges: charges: reserve needs a name: the answer reports what it reserved under it (dynamic metadata reserved.<name>), which the end of the stream gives back";
    concurrency_without_a_name => "api.yaml:7: domain \"api\" > descriptors[0] (key \"tenant\") > rate_limit.algorithm: a concurrency limit needs a name: the answer reports what it reserved under it (dynamic metadata reserved.<name>), which the end of the stream gives back";
    concurrency_charged_as_usage => "api.yaml:9: domain \"api\" > descriptors[0] (key \"tenant\") > rate_limit.charges: a concurrency limit's takes are reservations: leave charges out, or write reserve";
    concurrency_over_cap => "api.yaml:5: domain \"api\" > descriptors[0] (key \"tenant\") > rate_limit.requests_per_unit: concurrency keeps one entry per take in flight, so its limit is capped at 10000 (got 20000)";
    unlimited_with_charges => "api.yaml:6: domain \"api\" > descriptors[0] (key \"tenant\") > rate_limit.charges: must not be set when unlimited is true";
    replaces_a_sibling => "api.yaml:6: domain \"api\" > descriptors[0] (key \"user\") > rate_limits[1].replaces: \"burst\" names a limit of this same descriptor, which would disable it";
}

#[test]
fn a_missing_directory_is_an_error_naming_it() {
    let errors = tollgate::config::load_dir(Path::new("tests/fixtures/no_such_dir")).unwrap_err();
    assert_eq!(errors.0.len(), 1);
    assert!(
        errors
            .to_string()
            .starts_with("tests/fixtures/no_such_dir: cannot read: "),
        "{errors}"
    );
}

#[test]
fn dot_entries_such_as_configmap_data_dirs_are_skipped_and_symlinks_followed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("..2026_11_21_00_00_00.1");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("api.yaml"), "domain: api\n").unwrap();
    std::os::unix::fs::symlink(&data, dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("..data/api.yaml"),
        dir.path().join("api.yaml"),
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not yaml").unwrap();
    let rules = tollgate::config::load_dir(dir.path()).unwrap();
    let names: Vec<&str> = rules.domains().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["api"]);
}

#[test]
fn a_bare_descriptors_key_is_an_empty_list_at_the_top_and_nested() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("empty.yaml"),
        "domain: empty\ndescriptors:\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("nested.yaml"),
        "domain: nested\ndescriptors:\n  - key: a\n    descriptors:\n",
    )
    .unwrap();
    let rules = tollgate::config::load_dir(dir.path()).unwrap();
    let names: Vec<&str> = rules.domains().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["empty", "nested"]);

    // The reference's own "duplicate domain" fixture: the intended error, not a YAML one.
    std::fs::write(
        dir.path().join("again.yaml"),
        "domain: empty\ndescriptors:\n",
    )
    .unwrap();
    let errors = tollgate::config::load_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        errors.contains("domain \"empty\": duplicate domain, already defined in"),
        "{errors}"
    );
}

fn domain_names(rules: &tollgate::rules::RuleSet) -> Vec<String> {
    rules.domains().iter().map(|d| d.name.clone()).collect()
}

#[test]
fn every_file_and_dot_files_are_read_when_asked_as_the_reference_reads_them() {
    use tollgate::config::LoadOptions;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api.yaml"), "domain: api\n").unwrap();
    std::fs::write(dir.path().join("ratelimit-config"), "domain: bare\n").unwrap();
    std::fs::create_dir(dir.path().join("nested")).unwrap();
    std::fs::write(dir.path().join("nested/more.conf"), "domain: more\n").unwrap();
    std::fs::write(dir.path().join(".hidden"), "domain: hidden\n").unwrap();
    let load = |options| domain_names(&tollgate::config::load(dir.path(), options).unwrap());
    assert_eq!(load(LoadOptions::default()), ["api"]);
    let every_file = LoadOptions {
        every_file: true,
        ..LoadOptions::default()
    };
    assert_eq!(load(every_file), ["api", "bare", "more"]);
    let with_dotfiles = LoadOptions {
        dotfiles: true,
        ..every_file
    };
    assert_eq!(load(with_dotfiles), ["api", "bare", "hidden", "more"]);
    assert_eq!(
        tollgate::config::skipped_files(dir.path(), LoadOptions::default()),
        [
            dir.path().join("nested/more.conf"),
            dir.path().join("ratelimit-config")
        ]
    );
    assert!(tollgate::config::skipped_files(dir.path(), every_file).is_empty());
}

#[test]
fn files_of_one_domain_merge_when_asked_and_a_repeated_descriptor_is_still_an_error() {
    use tollgate::config::LoadOptions;
    let dir = tempfile::tempdir().unwrap();
    let limit = "rate_limit: {unit: minute, requests_per_unit: 1}";
    std::fs::write(
        dir.path().join("a.yaml"),
        format!("domain: api\ndescriptors:\n  - key: user\n    {limit}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.yaml"),
        format!("domain: api\ndescriptors:\n  - key: path\n    value: /x\n    {limit}\n"),
    )
    .unwrap();
    let merging = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let rules = tollgate::config::load(dir.path(), merging).unwrap();
    assert_eq!(domain_names(&rules), ["api"]);
    assert_eq!(rules.domains()[0].root.nodes().len(), 2);
    let refused = tollgate::config::load_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("duplicate domain, already defined in"),
        "{refused}"
    );

    std::fs::write(
        dir.path().join("c.yaml"),
        format!("domain: api\ndescriptors:\n  - key: user\n    {limit}\n"),
    )
    .unwrap();
    let repeated = tollgate::config::load(dir.path(), merging)
        .unwrap_err()
        .to_string();
    assert!(
        repeated.contains("c.yaml:1: domain \"api\": descriptor user is also in"),
        "{repeated}"
    );
}

#[test]
fn empty_documents_around_the_domain_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (
            "trailing.yaml",
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n---\n",
        ),
        ("leading.yaml", "---\n# generated\ndomain: b\n...\n"),
        ("both.yaml", "--- # first\n---\ndomain: c\n---\n\n"),
    ];
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let rules = tollgate::config::load_dir(dir.path()).unwrap();
    let mut domains: Vec<&str> = rules.domains().iter().map(|d| d.name.as_str()).collect();
    domains.sort_unstable();
    assert_eq!(domains, ["a", "b", "c"]);
    // Line numbers still point into the file as written.
    std::fs::write(
        dir.path().join("both.yaml"),
        "---\n---\ndomain: c\nbogus: 1\n---\n",
    )
    .unwrap();
    let error = tollgate::config::load_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        error.ends_with(
            "both.yaml:4: bogus: unknown field `bogus`, expected one of domain, descriptors"
        ),
        "{error}"
    );
}
