//! statsd, for dashboards built on envoyproxy/ratelimit's stat names (`--statsd HOST:PORT`).
//! Nothing is counted twice: every `--statsd-flush-interval` the counters behind `/metrics`
//! are read, and what each gained since the previous flush is sent over UDP as a statsd
//! counter under the reference's name:
//!
//! | tollgate metric | statsd counter |
//! |---|---|
//! | `tollgate_total_hits_total{limit="PATH"}` (and `over_limit`, `near_limit`, `within_limit`, `shadow_mode`) | `ratelimit.service.rate_limit.PATH.total_hits` (…) |
//! | `tollgate_requests_total` (every code) | `ratelimit_server.ShouldRateLimit.total_requests` |
//! | `tollgate_config_reloads_total{result="success"}`, plus the load at start | `ratelimit.service.config_load_success` |
//! | `tollgate_config_reloads_total{result="error"}` | `ratelimit.service.config_load_error` |
//! | `tollgate_store_errors_total` (every kind) | `ratelimit.service.call.should_rate_limit.redis_error` |
//!
//! `--statsd-tag KEY=VALUE` adds tags in the DogStatsD form (`|#key:value`), which
//! statsd_exporter and Datadog read.

use std::collections::HashMap;
use std::net::UdpSocket;
use std::sync::Arc;
use std::time::Duration;

use cadence::{BufferedUdpMetricSink, Counted, StatsdClient};

use crate::metrics::Metrics;

/// Where and how often stats go: flags of `tollgate serve`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Metrics")]
pub struct StatsdOptions {
    /// Also send the metrics to this statsd server (`host:port`, UDP) under the reference's
    /// stat names (`ratelimit.service.rate_limit.…`; docs/migrating.md).
    #[arg(long = "statsd", env = "TOLLGATE_STATSD")]
    pub address: Option<String>,

    /// How often the counters' increase is sent to --statsd.
    #[arg(long = "statsd-flush-interval", env = "TOLLGATE_STATSD_FLUSH_INTERVAL", default_value = "10s", value_parser = crate::clock::positive_duration)]
    pub every: Duration,

    /// A tag on every stat sent to --statsd, as `key=value` (DogStatsD form); repeat for
    /// more (in the environment, separate them with `,`).
    #[arg(long = "statsd-tag", env = "TOLLGATE_STATSD_TAGS", value_delimiter = ',', value_parser = crate::options::key_value)]
    pub tags: Vec<(String, String)>,
}

impl Default for StatsdOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("--statsd {address}: {reason}")]
pub struct StatsdError {
    address: String,
    reason: String,
}

/// Starts flushing `metrics` to statsd, if an address is given; stops when the task is aborted.
pub fn spawn(
    metrics: Arc<Metrics>,
    options: StatsdOptions,
) -> Result<Option<tokio::task::JoinHandle<()>>, StatsdError> {
    let Some(address) = options.address.clone() else {
        return Ok(None);
    };
    let error = |reason: String| StatsdError {
        address: address.clone(),
        reason,
    };
    let socket = UdpSocket::bind(("0.0.0.0", 0)).map_err(|e| error(e.to_string()))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| error(e.to_string()))?;
    let sink =
        BufferedUdpMetricSink::from(address.as_str(), socket).map_err(|e| error(e.to_string()))?;
    let mut builder = StatsdClient::builder("", sink).with_error_handler(|error| {
        tracing::debug!(%error, "statsd send failed");
    });
    for (key, value) in &options.tags {
        builder = builder.with_tag(key.as_str(), value.as_str());
    }
    let client = builder.build();
    tracing::info!(statsd = %address, every = ?options.every, "sending stats");
    Ok(Some(tokio::spawn(async move {
        let mut sent = Sent::default();
        let mut ticks = tokio::time::interval(options.every);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            sent.flush(&client, &metrics.render());
        }
    })))
}

/// The totals sent so far, by statsd name.
#[derive(Default)]
struct Sent {
    totals: HashMap<String, u64>,
}

const CONFIG_LOAD_SUCCESS: &str = "ratelimit.service.config_load_success";

impl Sent {
    /// Sends what each counter gained since the last flush.
    fn flush(&mut self, client: &StatsdClient, exposition: &str) {
        let mut totals = stat_totals(exposition);
        // The load at start is a successful config load too, as the reference counts it.
        *totals.entry(CONFIG_LOAD_SUCCESS.into()).or_default() += 1;
        for (name, total) in totals {
            let before = self.totals.insert(name.clone(), total).unwrap_or(0);
            let gained = total.saturating_sub(before);
            if gained > 0 {
                let _ = client.count(&name, gained);
            }
        }
        let _ = client.flush();
    }
}

/// Each statsd counter's total, from the OpenMetrics text of `/metrics`.
fn stat_totals(exposition: &str) -> HashMap<String, u64> {
    let mut totals: HashMap<String, u64> = HashMap::new();
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

/// The reference's name for one tollgate series, if it has one.
fn stat_name(metric: &str, labels: &Labels) -> Option<String> {
    let label = |name: &str| {
        labels
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    const PER_LIMIT: [&str; 5] = [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ];
    let counter = metric.strip_prefix("tollgate_")?.strip_suffix("_total")?;
    if PER_LIMIT.contains(&counter) {
        let path = sanitize(label("limit")?);
        return Some(format!("ratelimit.service.rate_limit.{path}.{counter}"));
    }
    Some(match (counter, label("result")) {
        ("requests", _) => "ratelimit_server.ShouldRateLimit.total_requests".into(),
        ("config_reloads", Some("success")) => CONFIG_LOAD_SUCCESS.into(),
        ("config_reloads", Some("error")) => "ratelimit.service.config_load_error".into(),
        ("store_errors", _) => "ratelimit.service.call.should_rate_limit.redis_error".into(),
        _ => return None,
    })
}

/// A statsd name holds no `:`, `|`, `@` or `#` (they delimit the line); as the reference,
/// they become `_`.
fn sanitize(path: &str) -> String {
    path.chars()
        .map(|c| {
            if matches!(c, ':' | '|' | '@' | '#' | '\n') {
                '_'
            } else {
                c
            }
        })
        .collect()
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
        let expected: HashMap<String, u64> = [
            ("ratelimit.service.rate_limit.d.user_a\"b.total_hits", 7),
            ("ratelimit.service.rate_limit.d.k_v_x.over_limit", 2),
            ("ratelimit_server.ShouldRateLimit.total_requests", 6),
            ("ratelimit.service.config_load_error", 1),
        ]
        .into_iter()
        .map(|(name, total)| (name.to_owned(), total))
        .collect();
        assert_eq!(totals, expected);
    }
}
