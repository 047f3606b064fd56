//! envoyproxy/ratelimit's stats, read off tollgate's own series: the statsd names its stats
//! store gives them, and the Prometheus series its Prometheus sink turns those names into
//! (through its default statsd_exporter mapping). Both are totals taken from the OpenMetrics
//! text of `/metrics`, so nothing is counted twice.
//!
//! | tollgate series | reference stat |
//! |---|---|
//! | `tollgate_total_hits_total{limit="PATH"}` (and `over_limit`, `near_limit`, `within_limit`, `shadow_mode`, `total_negative_hits`) | `ratelimit.service.rate_limit.PATH.total_hits` (…) |
//! | `tollgate_requests_total` (every code) | `ratelimit_server.ShouldRateLimit.total_requests` |
//! | `tollgate_config_reloads_total{result="success"}`, plus the load at start | `ratelimit.service.config_load_success` |
//! | `tollgate_config_reloads_total{result="error"}` | `ratelimit.service.config_load_error` |
//! | `tollgate_store_errors_total` (every kind) | `ratelimit.service.call.should_rate_limit.redis_error` |

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::counters::{Labels as SeriesLabels, label};

/// The counters kept per limit, by their last name component.
const PER_LIMIT: [&str; 6] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
    "total_negative_hits",
];
const RATE_LIMIT: &str = "ratelimit.service.rate_limit.";
const CONFIG_LOAD_SUCCESS: &str = "ratelimit.service.config_load_success";
const CONFIG_LOAD_ERROR: &str = "ratelimit.service.config_load_error";
const REDIS_ERROR: &str = "ratelimit.service.call.should_rate_limit.redis_error";
const TOTAL_REQUESTS: &str = "ratelimit_server.ShouldRateLimit.total_requests";

/// The Go runtime series the reference's dashboards read (Envoy Gateway's plots
/// `go_memstats_gc_cpu_fraction`): tollgate has no garbage collector, so the fraction of its
/// CPU a collector took is 0, said rather than left out so that the panel shows it.
pub const RUNTIME_SERIES: &str = "# HELP go_memstats_gc_cpu_fraction Fraction of the CPU time used by a garbage collector (tollgate has none).\n# TYPE go_memstats_gc_cpu_fraction gauge\ngo_memstats_gc_cpu_fraction 0\n";

/// Each reference stat's total, by statsd name. The load at start counts as a successful
/// config load, as the reference counts it.
pub fn stat_totals(exposition: &str) -> BTreeMap<String, u64> {
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    totals.insert(CONFIG_LOAD_SUCCESS.into(), 1);
    for line in exposition.lines().filter(|line| !line.starts_with('#')) {
        let Some((name, labels, value)) = sample(line) else {
            continue;
        };
        let Some(stat) = stat_name(name, &labels) else {
            continue;
        };
        // Counters are whole numbers; a float here would be a gauge, which is not mapped.
        *totals.entry(stat).or_default() += value as u64;
    }
    totals
}

/// The unit the reference's `ratelimit_service_response_time_seconds` is observed in: its
/// default mapping scales its timer's milliseconds to seconds; a mapping without that scale
/// (Envoy Gateway's) or `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` keeps milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TimeUnit {
    #[default]
    Seconds,
    Milliseconds,
}

/// The reference's `ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"}`:
/// each call's time, as its statsd_exporter mapping makes the timer a histogram (the client
/// library's default buckets, 5 ms to 10 s, whatever the unit).
pub struct ResponseTime {
    registry: Registry,
    histogram: Histogram,
    unit: TimeUnit,
}

/// The buckets a statsd_exporter mapping without its own gives a histogram (Prometheus's
/// client libraries' defaults).
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl ResponseTime {
    pub fn new(unit: TimeUnit) -> Self {
        let family = Family::<SeriesLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(DEFAULT_BUCKETS)) as fn() -> Histogram,
        );
        let histogram = family
            .get_or_create(&label("grpc_method", "ShouldRateLimit"))
            .clone();
        let mut registry = Registry::default();
        registry.register(
            "ratelimit_service_response_time_seconds",
            "ShouldRateLimit call time, as envoyproxy/ratelimit's Prometheus sink exports it",
            family,
        );
        Self {
            registry,
            histogram,
            unit,
        }
    }

    pub fn observe(&self, took: Duration) {
        let value = match self.unit {
            TimeUnit::Seconds => took.as_secs_f64(),
            TimeUnit::Milliseconds => took.as_secs_f64() * 1000.0,
        };
        self.histogram.observe(value);
    }

    /// Its OpenMetrics family, without the exposition's end.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out.strip_suffix("# EOF\n").unwrap_or(&out).to_owned()
    }
}

/// The reference's Prometheus series for the same totals, as OpenMetrics families (type
/// `unknown`, so that their samples keep the reference's names, which have no `_total`).
pub fn prometheus(exposition: &str) -> String {
    let mut families: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for (stat, total) in stat_totals(exposition) {
        let (name, labels) = series(&stat);
        families.entry(name).or_default().push((labels, total));
    }
    let mut out = String::new();
    for (name, samples) in families {
        let _ = writeln!(out, "# TYPE {name} unknown");
        for (labels, total) in samples {
            let _ = writeln!(out, "{name}{labels} {total}");
        }
    }
    out
}

/// The series the reference's default mapping gives a stat: its name and its labels as
/// written in the exposition (`{key="value",…}`, or nothing).
fn series(stat: &str) -> (String, String) {
    let labelled = |name: &str, labels: &[(&str, &str)]| {
        let labels: Vec<String> = labels
            .iter()
            .map(|(key, value)| format!("{key}=\"{}\"", escape_label(value)))
            .collect();
        (name.to_owned(), format!("{{{}}}", labels.join(",")))
    };
    if let Some(rest) = stat.strip_prefix(RATE_LIMIT)
        && let Some((path, counter)) = rest.rsplit_once('.')
    {
        let name = format!("ratelimit_service_rate_limit_{counter}");
        let parts: Vec<&str> = path.split('.').collect();
        match parts.as_slice() {
            // The glob `ratelimit.service.rate_limit.*.*.COUNTER`.
            [domain, key1] => return labelled(&name, &[("domain", domain), ("key1", key1)]),
            // The regex `…rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.COUNTER`: three
            // parts or more, the first three as labels, the rest dropped.
            [domain, key1, key2, ..] => {
                return labelled(&name, &[("domain", domain), ("key1", key1), ("key2", key2)]);
            }
            // One part matches no rule: the name is escaped as it is.
            _ => return (escape_name(stat), String::new()),
        }
    }
    match stat {
        REDIS_ERROR => labelled(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "redis_error")],
        ),
        TOTAL_REQUESTS => labelled(
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")],
        ),
        CONFIG_LOAD_SUCCESS => (
            "ratelimit_service_config_load_success".into(),
            String::new(),
        ),
        CONFIG_LOAD_ERROR => ("ratelimit_service_config_load_error".into(), String::new()),
        other => (escape_name(other), String::new()),
    }
}

/// statsd_exporter's name for a stat no rule maps: every character outside `[a-zA-Z0-9_]`
/// becomes `_`, and a leading digit gets a `_` before it.
fn escape_name(stat: &str) -> String {
    let mut name: String = stat
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The reference's name for one tollgate series, if it has one.
fn stat_name(metric: &str, labels: &Labels) -> Option<String> {
    let label = |name: &str| {
        labels
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let counter = metric.strip_prefix("tollgate_")?.strip_suffix("_total")?;
    if PER_LIMIT.contains(&counter) {
        let path = sanitize(label("limit")?);
        return Some(format!("{RATE_LIMIT}{path}.{counter}"));
    }
    Some(match (counter, label("result")) {
        ("requests", _) => TOTAL_REQUESTS.into(),
        ("config_reloads", Some("success")) => CONFIG_LOAD_SUCCESS.into(),
        ("config_reloads", Some("error")) => CONFIG_LOAD_ERROR.into(),
        ("store_errors", _) => REDIS_ERROR.into(),
        _ => return None,
    })
}

/// A stat name as the reference makes it (its `SanitizeStatName`): `:` and `|` become `_`,
/// and so do the dots of an IPv4 address (a client address, a CIDR), so that its parts are
/// not read as parts of the path. `@`, `#` and line breaks become `_` too: a statsd line
/// cannot hold them.
fn sanitize(path: &str) -> String {
    let replaced: String = path
        .chars()
        .map(|c| {
            if matches!(c, ':' | '|' | '@' | '#' | '\n') {
                '_'
            } else {
                c
            }
        })
        .collect();
    let mut bytes = replaced.into_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match dotted_quad(&bytes[at..]) {
            Some(length) => {
                for byte in &mut bytes[at..at + length] {
                    if *byte == b'.' {
                        *byte = b'_';
                    }
                }
                at += length;
            }
            None => at += 1,
        }
    }
    // Only ASCII dots were replaced by ASCII underscores.
    String::from_utf8(bytes).unwrap_or_default()
}

/// The length of the IPv4-like address at the start of `text`, as the reference's regular
/// expression `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` matches it (each group as long as it
/// can be, then shorter).
fn dotted_quad(text: &[u8]) -> Option<usize> {
    fn groups(text: &[u8], left: usize) -> Option<usize> {
        for digits in (1..=3).rev() {
            if text.len() < digits || !text[..digits].iter().all(u8::is_ascii_digit) {
                continue;
            }
            if left == 1 {
                return Some(digits);
            }
            if text.get(digits) == Some(&b'.')
                && let Some(rest) = groups(&text[digits + 1..], left - 1)
            {
                return Some(digits + 1 + rest);
            }
        }
        None
    }
    groups(text, 4)
}

/// A series' labels, unescaped.
type Labels = Vec<(String, String)>;

/// `name{key="value",…} number`: the name, the labels and the value.
fn sample(line: &str) -> Option<(&str, Labels, f64)> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series, Vec::new(), value));
    };
    let mut labels = Vec::new();
    let mut chars = rest.chars();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let key = key.trim_start_matches(',').to_owned();
        if key.is_empty() || key == "}" || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((key, value));
    }
    Some((name, labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_limit_counters_take_the_reference_names_and_labels_are_unescaped() {
        let text = "# TYPE tollgate_total_hits counter\n\
            tollgate_total_hits_total{domain=\"d\",limit=\"d.user_a\\\"b\"} 7\n\
            tollgate_over_limit_total{domain=\"d\",limit=\"d.k:v|x\"} 2\n\
            tollgate_requests_total{code=\"OK\"} 5\n\
            tollgate_requests_total{code=\"UNAVAILABLE\"} 1\n\
            tollgate_config_reloads_total{result=\"error\"} 1\n\
            tollgate_store_up 1\n";
        let totals = stat_totals(text);
        let expected: BTreeMap<String, u64> = [
            ("ratelimit.service.rate_limit.d.user_a\"b.total_hits", 7),
            ("ratelimit.service.rate_limit.d.k_v_x.over_limit", 2),
            ("ratelimit_server.ShouldRateLimit.total_requests", 6),
            ("ratelimit.service.config_load_error", 1),
            ("ratelimit.service.config_load_success", 1),
        ]
        .into_iter()
        .map(|(name, total)| (name.to_owned(), total))
        .collect();
        assert_eq!(totals, expected);
    }

    #[test]
    fn prometheus_series_follow_the_reference_default_mapping() {
        let series = |stat: &str| {
            let (name, labels) = super::series(stat);
            format!("{name}{labels}")
        };
        assert_eq!(
            series("ratelimit.service.rate_limit.edge.user_alice.near_limit"),
            "ratelimit_service_rate_limit_near_limit{domain=\"edge\",key1=\"user_alice\"}"
        );
        // The reference's own sink test: three parts or more, the first three.
        assert_eq!(
            series("ratelimit.service.rate_limit.domain1.key1_val1.over_limit"),
            "ratelimit_service_rate_limit_over_limit{domain=\"domain1\",key1=\"key1_val1\"}"
        );
        assert_eq!(
            series("ratelimit.service.rate_limit.domain1.key1_val1.key2_val2.over_limit"),
            "ratelimit_service_rate_limit_over_limit{domain=\"domain1\",key1=\"key1_val1\",key2=\"key2_val2\"}"
        );
        assert_eq!(
            series("ratelimit.service.rate_limit.domain1.key3_val3.key4_val4.key5_val5.over_limit"),
            "ratelimit_service_rate_limit_over_limit{domain=\"domain1\",key1=\"key3_val3\",key2=\"key4_val4\"}"
        );
        assert_eq!(
            series("ratelimit.service.rate_limit.mongo_cps.database_users.total_hits"),
            "ratelimit_service_rate_limit_total_hits{domain=\"mongo_cps\",key1=\"database_users\"}"
        );
        assert_eq!(
            series("ratelimit.service.call.should_rate_limit.redis_error"),
            "ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"}"
        );
        assert_eq!(
            series("ratelimit_server.ShouldRateLimit.total_requests"),
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}"
        );
        assert_eq!(
            series("ratelimit.service.config_load_success"),
            "ratelimit_service_config_load_success"
        );
    }

    #[test]
    fn addresses_in_a_path_are_sanitized_as_the_reference_does() {
        assert_eq!(
            sanitize("first-listener.first-route_first-route.masked_remote_address_192.168.0.0/16"),
            "first-listener.first-route_first-route.masked_remote_address_192_168_0_0/16"
        );
        assert_eq!(
            sanitize("gw.route.masked_remote_address_2001:db8::/32"),
            "gw.route.masked_remote_address_2001_db8__/32"
        );
        assert_eq!(
            sanitize("d.remote_address_10.1.2.3"),
            "d.remote_address_10_1_2_3"
        );
        // The reference's expression, leftmost and each group as long as it can be: the
        // first address from 234, then no other whole one.
        assert_eq!(sanitize("d.v_1234.5.6.7.8.9"), "d.v_1234_5_6_7.8.9");
        assert_eq!(sanitize("d.v_1.2.3"), "d.v_1.2.3");
        assert_eq!(sanitize("d.k:v|x"), "d.k_v_x");
        // Envoy Gateway's CIDR rule: its series as its dashboard and e2e queries read it.
        let path =
            sanitize("first-listener.first-route_first-route.masked_remote_address_0.0.0.0/0");
        let (name, labels) = super::series(&format!("{RATE_LIMIT}{path}.total_hits"));
        assert_eq!(
            format!("{name}{labels}"),
            "ratelimit_service_rate_limit_total_hits{domain=\"first-listener\",key1=\"first-route_first-route\",key2=\"masked_remote_address_0_0_0_0/0\"}"
        );
    }
}
