use std::path::PathBuf;

use super::variables::VARIABLES;
use super::*;
use crate::cli::{Cli, Command};
use clap::Parser as _;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

/// The translation of `pairs`, parsed as `serve` would be.
fn serve(pairs: &[(&str, &str)]) -> crate::cli::ServeArgs {
    let translation = translate(&env(pairs)).unwrap();
    let line = ["tollgate", "serve"]
        .into_iter()
        .map(String::from)
        .chain(translation.args);
    match Cli::try_parse_from(line).unwrap().command {
        Command::Serve(args) => *args,
        _ => unreachable!(),
    }
}

fn refusal(pairs: &[(&str, &str)]) -> String {
    translate(&env(pairs)).unwrap_err().to_string()
}

/// Everything switched on that has a switch, so that every variable is consulted.
const EVERYTHING: &[(&str, &str)] = &[
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/xds/ca.crt"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "127.0.0.1:6379"),
    ("REDIS_PERSECOND", "true"),
    ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
    ("REDIS_PERSECOND_TYPE", "sentinel"),
    ("REDIS_PERSECOND_URL", "fast,127.0.0.1:26379"),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
    ("LIMIT_REQUEST_HEADERS_ENABLED", "true"),
    ("USE_PROMETHEUS", "true"),
    ("TRACING_ENABLED", "true"),
    ("TRACING_EXPORTER_PROTOCOL", "grpc"),
];

#[test]
fn every_variable_is_honoured_and_read_or_ignored_with_a_log_line() {
    // Honoured: the translation consults it (with everything that has a switch on).
    let translation = translate(&env(EVERYTHING)).unwrap();
    let unread: Vec<&str> = VARIABLES
        .iter()
        .filter(|variable| matches!(variable.treatment, Treatment::Honoured(_)))
        .map(|variable| variable.name)
        // Read by the OTLP exporter itself, not by the translation.
        .filter(|name| *name != "OTEL_EXPORTER_OTLP_ENDPOINT")
        .filter(|name| !translation.read.contains(*name))
        .collect();
    assert!(unread.is_empty(), "honoured but never read: {unread:?}");
    // Ignored: set, it is listed to be logged with its reason; unset, it is not.
    for variable in VARIABLES {
        let Treatment::Ignored(why) = variable.treatment else {
            continue;
        };
        let name = if variable.name.ends_with('_') {
            format!("{}TAGS_PATTERN", variable.name)
        } else {
            variable.name.to_owned()
        };
        let set = translate(&env(&[(&name, "x")])).unwrap();
        assert_eq!(set.ignored, [(name.clone(), why)], "{name}");
        assert!(translate(&env(&[])).unwrap().ignored.is_empty());
    }
    // And no variable is listed twice.
    let mut names: Vec<&str> = VARIABLES.iter().map(|variable| variable.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), VARIABLES.len());
}

#[test]
fn the_defaults_are_the_reference_defaults() {
    let args = serve(&[]);
    assert_eq!(args.listen.http_addr.to_string(), "0.0.0.0:8080");
    assert_eq!(args.listen.grpc_addr.to_string(), "0.0.0.0:8081");
    assert_eq!(
        args.rules.config,
        Some(PathBuf::from("/srv/runtime_data/current/config"))
    );
    assert!(args.rules.load.every_file && args.rules.load.dotfiles);
    assert_eq!(args.rules.poll, Some(std::time::Duration::from_secs(1)));
    assert_eq!(args.store.url, "unix:///var/run/nutcracker/ratelimit.sock");
    assert_eq!(
        (args.store.connect_timeout, args.store.timeout),
        (
            std::time::Duration::from_secs(10),
            std::time::Duration::from_millis(50)
        ),
        "REDIS_TIMEOUT is a dial timeout; calls keep tollgate's own bound"
    );
    assert!(args.store.reconnect_on_readonly);
    assert!(
        args.service.ready_without_store,
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=false: Redis is healthy once and for all"
    );
    assert!(
        !serve(&[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")])
            .service
            .ready_without_store
    );
    assert!(
        args.modes.count_denied,
        "the reference counts denied hits by default"
    );
    assert_eq!(
        args.store.deny_cache_size, 100_000,
        "LOCAL_CACHE_SIZE_IN_BYTES unset: tollgate's deny cache"
    );
    let sized = |bytes| {
        serve(&[("LOCAL_CACHE_SIZE_IN_BYTES", bytes)])
            .store
            .deny_cache_size
    };
    assert_eq!((sized("0"), sized("1280")), (0, 10), "set: honoured");
    assert_eq!(args.statsd.address.as_deref(), Some("localhost:8125"));
    assert_eq!(args.metrics.near_limit_ratio, 0.8);
    assert!(args.tls.tls_cert.is_none() && args.metrics.metrics_addr.is_none());
    let cli = Cli::try_parse_from(
        ["tollgate", "serve"]
            .into_iter()
            .map(String::from)
            .chain(translate(&env(&[])).unwrap().args),
    )
    .unwrap();
    assert_eq!(cli.log_level, "warn");
    assert_eq!(cli.trace().traces, crate::telemetry::Traces::Off);
}

#[test]
fn listeners_logging_and_tls() {
    let args = serve(&[
        ("HOST", "127.0.0.1"),
        ("PORT", "9080"),
        ("GRPC_HOST", "::1"),
        ("GRPC_PORT", "9081"),
        ("GRPC_SERVER_USE_TLS", "1"),
        ("GRPC_SERVER_TLS_CERT", "/c.pem"),
        ("GRPC_SERVER_TLS_KEY", "/k.pem"),
        ("GRPC_CLIENT_TLS_CACERT", "/ca.pem"),
        ("GRPC_CLIENT_TLS_SAN", "envoy.edge.svc"),
    ]);
    assert_eq!(args.listen.http_addr.to_string(), "127.0.0.1:9080");
    assert_eq!(args.listen.grpc_addr.to_string(), "[::1]:9081");
    assert_eq!(args.tls.tls_cert, Some(PathBuf::from("/c.pem")));
    assert_eq!(args.tls.tls_key, Some(PathBuf::from("/k.pem")));
    assert_eq!(args.tls.tls_client_ca, Some(PathBuf::from("/ca.pem")));
    assert_eq!(args.tls.tls_client_san.as_deref(), Some("envoy.edge.svc"));
    let translation = translate(&env(&[("LOG_LEVEL", "debug"), ("LOG_FORMAT", "json")])).unwrap();
    assert!(
        translation
            .args
            .windows(2)
            .any(|w| w == ["--log-level", "debug"])
    );
    assert!(
        translation
            .args
            .windows(2)
            .any(|w| w == ["--log-format", "json"])
    );
    assert_eq!(
        refusal(&[("GRPC_SERVER_USE_TLS", "true")]),
        "GRPC_SERVER_TLS_CERT: required when GRPC_SERVER_USE_TLS is true"
    );
    assert_eq!(
        serve(&[("GRPC_UDS", "/run/rl.sock")]).listen.grpc_uds,
        Some(PathBuf::from("/run/rl.sock"))
    );
    assert!(refusal(&[("PORT", "http")]).starts_with("PORT: \"http\" is not a port"));
    assert!(refusal(&[("LOG_LEVEL", "loud")]).starts_with("LOG_LEVEL: "));
}

#[test]
fn config_directory_and_loading() {
    let args = serve(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_APPDIRECTORY", "config"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("MERGE_DOMAIN_CONFIG", "true"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
    ]);
    assert_eq!(
        args.rules.config,
        Some(PathBuf::from("/data/ratelimit/config"))
    );
    assert!(args.rules.load.every_file && !args.rules.load.dotfiles);
    assert_eq!(args.rules.poll, None, "watched, not polled");
    assert!(args.rules.load.merge_domains && args.rules.ready_needs_rules);
    assert!(refusal(&[("CONFIG_TYPE", "CONSUL")]).starts_with("CONFIG_TYPE: \"CONSUL\""));
}

/// Envoy Gateway's environment for its rate-limit service.
#[test]
fn the_xds_config_source_as_envoy_gateway_sets_it() {
    let args = serve(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,junk"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-token:abc"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "2s"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ]);
    assert_eq!(args.rules.config, None, "no rule files");
    assert_eq!(args.xds.config_xds.as_deref(), Some("envoy-gateway:18001"));
    assert_eq!(args.xds.xds_node_id, "envoy-ratelimit");
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(args.xds.xds_node_metadata, [pair("zone", "a")]);
    assert_eq!(args.xds.xds_headers, [pair("x-token", "abc")]);
    assert_eq!(args.xds.xds_tls_ca, Some(PathBuf::from("/certs/ca.crt")));
    assert_eq!(args.xds.xds_tls_cert, Some(PathBuf::from("/certs/tls.crt")));
    assert_eq!(
        args.xds.xds_tls_server_name.as_deref(),
        Some("envoy-gateway")
    );
    assert_eq!(
        args.xds.xds_backoff_initial,
        std::time::Duration::from_secs(2)
    );
    assert_eq!(args.xds.xds_backoff_max, std::time::Duration::from_secs(60));
    assert!(args.xds.serve_before_config);
    let untrusted = refusal(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ]);
    assert!(
        untrusted.starts_with("CONFIG_GRPC_XDS_SERVER_TLS_CACERT: required"),
        "{untrusted}"
    );
}

#[test]
fn behaviour_switches() {
    let args = serve(&[
        ("CACHE_KEY_PREFIX", "team-a:"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        ("NEAR_LIMIT_RATIO", "0.9"),
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ("SHADOW_MODE", "true"),
        ("QUOTA_MODE", "true"),
        ("RESPONSE_DYNAMIC_METADATA", "true"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_RESET_HEADER", "X-Reset"),
    ]);
    assert_eq!(args.store.key_prefix, "team-a:");
    assert_eq!(args.store.deny_cache_size, 8_192);
    assert_eq!(args.metrics.near_limit_ratio, 0.9);
    assert!(
        !args.modes.count_denied,
        "true: a rejected request consumes nothing"
    );
    assert!(args.modes.global_shadow && args.modes.global_quota && args.service.dynamic_metadata);
    assert_eq!(
        args.service.response_headers,
        crate::headers::HeaderMode::Legacy
    );
    assert_eq!(
        args.service.legacy_header_names,
        ["RateLimit-Limit", "RateLimit-Remaining", "X-Reset"]
    );
    assert_eq!(
        refusal(&[("BACKEND_TYPE", "memcache")]),
        "BACKEND_TYPE: memcache is not supported: tollgate keeps counters in Redis (or in memory)"
    );
    assert!(refusal(&[("SHADOW_MODE", "yes please")]).starts_with("SHADOW_MODE: "));
}

#[test]
fn redis_of_every_kind() {
    let store = |pairs: &[(&str, &str)]| serve(pairs).store.url;
    assert_eq!(
        store(&[("REDIS_URL", "/run/redis.sock"), ("REDIS_AUTH", "app:p@ss")]),
        "unix:///run/redis.sock?user=app&pass=p%40ss"
    );
    let tcp = [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")];
    assert_eq!(store(&tcp), "redis://redis:6379");
    let mut auth = tcp.to_vec();
    auth.extend([("REDIS_AUTH", "secret"), ("REDIS_TLS", "true")]);
    assert_eq!(store(&auth), "rediss://:secret@redis:6379");
    assert_eq!(
        store(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "Sentinel"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_SENTINEL_AUTH", "watch"),
        ]),
        "redis-sentinel://s1:26379,s2:26379/mymaster?sentinel_pass=watch"
    );
    assert_eq!(
        store(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "n1:7000,n2:7001"),
        ]),
        "redis-cluster://n1:7000,n2:7001"
    );
    let split = serve(&[
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_URL", "fast:6379"),
        ("REDIS_TIMEOUT", "250ms"),
    ]);
    assert_eq!(
        split.store.per_second_url.as_deref(),
        Some("redis://fast:6379")
    );
    assert_eq!(
        split.store.connect_timeout,
        std::time::Duration::from_millis(250)
    );
    let explicit = |value| serve(&[("REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR", value)]);
    assert!(!explicit("false").store.reconnect_on_readonly);
    assert!(explicit("true").store.reconnect_on_readonly);
    assert!(matches!(
        split.store.spec(),
        Ok(crate::storage::options::StoreSpec::RedisPerSecond(..))
    ));
    assert!(refusal(&[("REDIS_TYPE", "ring")]).starts_with("REDIS_TYPE: \"ring\""));
    let tls = serve(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis:6380"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", "/ca.pem"),
        ("REDIS_TLS_CLIENT_CERT", "/client.pem"),
        ("REDIS_TLS_CLIENT_KEY", "/client.key"),
    ]);
    assert_eq!(tls.store.url, "rediss://redis:6380");
    assert_eq!(tls.store.redis_tls_ca, Some(PathBuf::from("/ca.pem")));
    assert_eq!(tls.store.redis_tls_cert, Some(PathBuf::from("/client.pem")));
    assert_eq!(tls.store.redis_tls_key, Some(PathBuf::from("/client.key")));
    assert!(
        refusal(&[("REDIS_TYPE", "cluster")]).starts_with("REDIS_SOCKET_TYPE: unix works with")
    );
}

#[test]
fn stats_and_tracing() {
    let args = serve(&[
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", "9125"),
        ("STATS_FLUSH_INTERVAL", "2s"),
        ("EXTRA_TAGS", "cluster:east,team:edge"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":9191"),
        ("PROMETHEUS_PATH", "/stats/prometheus"),
    ]);
    assert_eq!(args.statsd.address.as_deref(), Some("127.0.0.1:9125"));
    assert_eq!(args.statsd.every, std::time::Duration::from_secs(2));
    assert_eq!(
        args.statsd.tags,
        [
            ("cluster".to_owned(), "east".to_owned()),
            ("team".to_owned(), "edge".to_owned())
        ]
    );
    assert_eq!(
        args.metrics.metrics_addr.map(|a| a.to_string()).as_deref(),
        Some("0.0.0.0:9191")
    );
    assert_eq!(args.metrics.metrics_path, "/stats/prometheus");
    assert!(args.metrics.reference_series);
    // gostats' TCP sink with tags in the name; DogStatsD over UDP with `|#` tags.
    assert_eq!(args.statsd.protocol, crate::statsd::Protocol::Tcp);
    assert_eq!(args.statsd.tag_style, crate::statsd::TagStyle::Name);
    let udp = serve(&[("STATSD_PROTOCOL", "UDP")]);
    assert_eq!(udp.statsd.protocol, crate::statsd::Protocol::Udp);
    let dog = serve(&[("USE_STATSD", "false"), ("USE_DOG_STATSD", "true")]);
    assert_eq!(dog.statsd.protocol, crate::statsd::Protocol::Udp);
    assert_eq!(dog.statsd.tag_style, crate::statsd::TagStyle::Dogstatsd);
    assert!(!serve(&[]).metrics.reference_series);
    assert_eq!(serve(&[("DISABLE_STATS", "true")]).statsd.address, None);
    assert_eq!(serve(&[("USE_STATSD", "false")]).statsd.address, None);

    let traced = translate(&env(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("TRACING_SERVICE_NAME", "edge-rl"),
        ("TRACING_SAMPLING_RATE", "0.25"),
    ]))
    .unwrap();
    let cli = Cli::try_parse_from(
        ["tollgate", "serve"]
            .into_iter()
            .map(String::from)
            .chain(traced.args),
    )
    .unwrap();
    assert_eq!(cli.trace().traces, crate::telemetry::Traces::On);
    assert_eq!(cli.trace().trace_service_name.as_deref(), Some("edge-rl"));
    assert_eq!(cli.trace().trace_sampling_ratio, Some(0.25));
    assert!(
        refusal(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "zipkin")
        ])
        .starts_with("TRACING_EXPORTER_PROTOCOL: \"zipkin\"")
    );
}

#[test]
fn started_as_ratelimit_or_with_env_reference_and_typed_flags_win() {
    let vars = || env(&[("PORT", "9999")]).into_iter();
    let args = |line: &[&str]| line.iter().map(OsString::from).collect::<Vec<_>>();
    let (line, translation) = command_line(&args(&["/bin/ratelimit"]), vars())
        .unwrap()
        .unwrap();
    assert_eq!(line[..2], args(&["tollgate", "serve"])[..]);
    assert!(translation.ignored_args.is_empty());
    let (with_args, translation) = command_line(
        &args(&[
            "/bin/ratelimit",
            "-config",
            "x",
            "--http-addr",
            "127.0.0.1:1",
        ]),
        vars(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(with_args, line, "the reference reads no arguments");
    assert_eq!(
        translation.ignored_args,
        ["-config", "x", "--http-addr", "127.0.0.1:1"]
    );
    let (line, _) = command_line(
        &args(&[
            "tollgate",
            "serve",
            "--env",
            "reference",
            "--http-addr",
            "127.0.0.1:1",
        ]),
        vars(),
    )
    .unwrap()
    .unwrap();
    assert!(!line.contains(&OsString::from("--env")));
    let Command::Serve(serve) = Cli::try_parse_from(line).unwrap().command else {
        unreachable!()
    };
    assert_eq!(
        serve.listen.http_addr.to_string(),
        "127.0.0.1:1",
        "the typed flag wins"
    );
    assert!(
        command_line(&args(&["tollgate", "serve", "--config", "x"]), vars())
            .unwrap()
            .is_none()
    );
    assert!(
        command_line(&args(&["tollgate", "check", "x"]), vars())
            .unwrap()
            .is_none()
    );
}

/// The row docs/migrating.md has for a variable.
fn doc_row(variable: &variables::Variable) -> String {
    let name = if variable.name.ends_with('_') {
        format!("{}*", variable.name)
    } else {
        variable.name.to_owned()
    };
    let default = if variable.default.is_empty() {
        "empty".to_owned()
    } else {
        format!("`{}`", variable.default)
    };
    let treatment = match variable.treatment {
        Treatment::Honoured(flags) => format!("honoured: {flags}"),
        Treatment::Ignored(why) => format!("ignored: {why}"),
    };
    format!("| `{name}` | {default} | {treatment} |")
}

#[test]
fn the_migration_guide_lists_every_variable_as_the_code_does() {
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/migrating.md")).unwrap();
    let documented: Vec<&str> = guide
        .lines()
        .skip_while(|line| !line.starts_with("| variable | reference default | tollgate |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .collect();
    let expected: Vec<String> = VARIABLES.iter().map(doc_row).collect();
    let differing: Vec<(&str, &str)> = documented
        .iter()
        .zip(&expected)
        .filter(|(doc, code)| *doc != code)
        .map(|(doc, code)| (*doc, code.as_str()))
        .collect();
    assert!(
        differing.is_empty(),
        "docs/migrating.md rows (doc, code): {differing:#?}"
    );
    assert_eq!(
        documented.len(),
        expected.len(),
        "docs/migrating.md's variable count"
    );
}

#[test]
fn the_logged_flags_leave_out_passwords_and_header_values() {
    let translation = translate(&env(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis:6379"),
        ("REDIS_AUTH", "app:hunter2"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_URL", "/run/fast.sock"),
        ("REDIS_PERSECOND_AUTH", "s3cret"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "authorization:Bearer t0ken",
        ),
    ]))
    .unwrap();
    let shown = translation.shown();
    for secret in ["hunter2", "s3cret", "t0ken", "app:"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(
        shown.contains("--store redis://<redacted>@redis:6379"),
        "{shown}"
    );
    assert!(
        shown.contains("unix:///run/fast.sock?pass=<redacted>"),
        "{shown}"
    );
    assert!(
        shown.contains("--xds-header authorization=<redacted>"),
        "{shown}"
    );
}

#[test]
fn connections_age_and_upstream_headers_as_the_reference_sets_them() {
    let hours = |h: u64| std::time::Duration::from_secs(h * 3_600);
    let defaults = serve(&[]);
    assert_eq!(
        (
            defaults.connections.max_age,
            defaults.connections.max_age_grace
        ),
        (hours(24), hours(1))
    );
    assert!(!defaults.service.upstream_limit_headers);
    let set = serve(&[
        ("GRPC_MAX_CONNECTION_AGE", "5m"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "30s"),
        ("LIMIT_REQUEST_HEADERS_ENABLED", "true"),
        ("LIMIT_REQUEST_REMAINING_HEADER", "X-Left"),
    ]);
    assert_eq!(
        (set.connections.max_age, set.connections.max_age_grace),
        (
            std::time::Duration::from_secs(300),
            std::time::Duration::from_secs(30)
        )
    );
    assert!(set.service.upstream_limit_headers);
    assert_eq!(
        set.service.upstream_limit_header_names,
        ["RateLimit-Limit", "X-Left", "RateLimit-Reset"]
    );
}

#[test]
fn the_response_time_unit_follows_the_mapping_file_as_the_reference_reads_it() {
    use crate::metrics::reference::TimeUnit;
    let unit = |pairs: &[(&str, &str)]| {
        let mut all = vec![("USE_PROMETHEUS", "true")];
        all.extend_from_slice(pairs);
        serve(&all).metrics.reference_response_time
    };
    assert_eq!(unit(&[]), TimeUnit::Seconds);
    assert_eq!(
        unit(&[("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true")]),
        TimeUnit::Milliseconds
    );
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, scale: &str| {
        let path = dir.path().join(name);
        let text = format!(
            "mappings:\n  - match: \"ratelimit.service.config_load_success\"\n    name: \"ratelimit_service_config_load_success\"\n    match_metric_type: counter\n  - match: \"ratelimit_server.*.response_time\"\n    name: \"ratelimit_service_response_time_seconds\"\n    timer_type: histogram\n{scale}    labels:\n      grpc_method: \"$1\"\n"
        );
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    // A mapping without the scale (as Envoy Gateway mounts it) keeps milliseconds, whatever
    // PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS says; with it, seconds.
    let unscaled = write("unscaled.yaml", "");
    let scaled = write("scaled.yaml", "    scale: 0.001\n");
    assert_eq!(
        unit(&[("PROMETHEUS_MAPPER_YAML", &unscaled)]),
        TimeUnit::Milliseconds
    );
    assert_eq!(
        unit(&[
            ("PROMETHEUS_MAPPER_YAML", &scaled),
            ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true")
        ]),
        TimeUnit::Seconds
    );
    let missing = dir.path().join("missing.yaml").display().to_string();
    let error = translate(&env(&[
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_MAPPER_YAML", &missing),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("PROMETHEUS_MAPPER_YAML: cannot read"),
        "{error}"
    );
}
