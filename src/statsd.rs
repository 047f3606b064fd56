//! statsd, for dashboards built on envoyproxy/ratelimit's stat names (`--statsd HOST:PORT`).
//! Nothing is counted twice: every `--statsd-flush-interval` the counters behind `/metrics`
//! are read, and what each gained since the previous flush is sent as a statsd counter
//! (`name:N|c`) under the reference's name (`metrics/reference.rs`); a counter that gained
//! nothing is not sent, as the reference's stats store skips it.
//!
//! Over TCP (the reference's plain statsd sink) or UDP (its DogStatsD sink); tags
//! (`--statsd-tag`) written as the reference writes them: into the name as `.__key=value`
//! (lyft/gostats, its plain statsd) or after the value as `|#key:value` (DogStatsD).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use crate::metrics::{Metrics, reference};

/// Where and how stats go: flags of `tollgate serve`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Metrics")]
pub struct StatsdOptions {
    /// Also send the metrics to this statsd server (`host:port`) under the reference's stat
    /// names (`ratelimit.service.rate_limit.…`; docs/migrating.md).
    #[arg(long = "statsd", env = "TOLLGATE_STATSD")]
    pub address: Option<String>,

    /// How often the counters' increase is sent to --statsd.
    #[arg(long = "statsd-flush-interval", env = "TOLLGATE_STATSD_FLUSH_INTERVAL", default_value = "10s", value_parser = crate::clock::positive_duration)]
    pub every: Duration,

    /// A tag on every stat sent to --statsd, as `key=value`; repeat for more (in the
    /// environment, separate them with `,`).
    #[arg(long = "statsd-tag", env = "TOLLGATE_STATSD_TAGS", value_delimiter = ',', value_parser = crate::options::key_value)]
    pub tags: Vec<(String, String)>,

    /// The transport to --statsd.
    #[arg(long = "statsd-protocol", env = "TOLLGATE_STATSD_PROTOCOL", value_enum, default_value_t = Protocol::Udp)]
    pub protocol: Protocol,

    /// How tags are written.
    #[arg(long = "statsd-tag-style", env = "TOLLGATE_STATSD_TAG_STYLE", value_enum, default_value_t = TagStyle::Dogstatsd)]
    pub tag_style: TagStyle,
}

impl Default for StatsdOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// Datagrams: nothing fails when nobody listens.
    Udp,
    /// One connection, made again when it breaks (the reference's plain statsd sink).
    Tcp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TagStyle {
    /// `name:N|c|#key:value,…` (DogStatsD; statsd_exporter and Datadog read it).
    Dogstatsd,
    /// `name.__key=value…:N|c`, the tags in the name sorted by key (lyft/gostats, the
    /// reference's plain statsd).
    Name,
}

#[derive(Debug, thiserror::Error)]
#[error("--statsd {address}: {reason}")]
pub struct StatsdError {
    address: String,
    reason: String,
}

/// The longest wait to connect or to write one flush over TCP: a listener that stalls must
/// not hold the flushes back.
const TCP_WAIT: Duration = Duration::from_secs(1);

/// Datagrams stay under a typical MTU, so that none is fragmented.
const MAX_DATAGRAM: usize = 1432;

/// Starts flushing `metrics` to statsd, if an address is given; stops when the task is aborted.
pub async fn spawn(
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
    let mut transport = match options.protocol {
        Protocol::Udp => {
            let target = tokio::net::lookup_host(address.as_str())
                .await
                .map_err(|e| error(e.to_string()))?
                .next()
                .ok_or_else(|| error("the name resolves to no address".into()))?;
            let local = if target.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            };
            let socket = UdpSocket::bind(local)
                .await
                .map_err(|e| error(e.to_string()))?;
            socket
                .connect(target)
                .await
                .map_err(|e| error(e.to_string()))?;
            Transport::Udp(socket)
        }
        Protocol::Tcp => Transport::Tcp {
            address: address.clone(),
            stream: None,
        },
    };
    tracing::info!(statsd = %address, protocol = ?options.protocol, every = ?options.every, "sending stats");
    Ok(Some(tokio::spawn(async move {
        let mut sent = Sent::default();
        let mut ticks = tokio::time::interval(options.every);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let payload = sent.lines(&metrics.render(), &options);
            if !payload.is_empty() {
                transport.send(&payload).await;
            }
        }
    })))
}

enum Transport {
    Udp(UdpSocket),
    Tcp {
        address: String,
        stream: Option<TcpStream>,
    },
}

impl Transport {
    /// Sends `payload` (whole lines); what cannot be sent is dropped, as the reference drops
    /// it, and the next flush tries again with a new connection.
    async fn send(&mut self, payload: &str) {
        match self {
            Transport::Udp(socket) => {
                for datagram in datagrams(payload) {
                    if let Err(error) = socket.send(datagram.as_bytes()).await {
                        tracing::debug!(%error, "statsd send failed");
                    }
                }
            }
            Transport::Tcp { address, stream } => {
                if stream.is_none() {
                    match tokio::time::timeout(TCP_WAIT, TcpStream::connect(address.as_str())).await
                    {
                        Ok(Ok(connected)) => *stream = Some(connected),
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "statsd connect failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!("statsd connect timed out");
                            return;
                        }
                    }
                }
                let Some(connection) = stream.as_mut() else {
                    return;
                };
                let written =
                    tokio::time::timeout(TCP_WAIT, connection.write_all(payload.as_bytes())).await;
                if !matches!(written, Ok(Ok(()))) {
                    tracing::debug!("statsd write failed: the connection is made again");
                    *stream = None;
                }
            }
        }
    }
}

/// `payload` cut at line ends into datagrams of at most MAX_DATAGRAM bytes (a longer line
/// goes alone).
fn datagrams(payload: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut end = 0;
    for line in payload.split_inclusive('\n') {
        if end > start && end - start + line.len() > MAX_DATAGRAM {
            out.push(&payload[start..end]);
            start = end;
        }
        end += line.len();
    }
    if end > start {
        out.push(&payload[start..end]);
    }
    out
}

/// The totals sent so far, by statsd name.
#[derive(Default)]
struct Sent {
    totals: HashMap<String, u64>,
}

impl Sent {
    /// One line per counter that gained since the last flush, with what it gained.
    fn lines(&mut self, exposition: &str, options: &StatsdOptions) -> String {
        let mut out = String::new();
        for (name, total) in reference::stat_totals(exposition) {
            let before = self.totals.insert(name.clone(), total).unwrap_or(0);
            let gained = total.saturating_sub(before);
            if gained > 0 {
                out.push_str(&line(&name, gained, &options.tags, options.tag_style));
            }
        }
        out
    }
}

/// One counter line, tags as `style` writes them.
fn line(name: &str, value: u64, tags: &[(String, String)], style: TagStyle) -> String {
    match style {
        TagStyle::Dogstatsd if !tags.is_empty() => {
            let tags: Vec<String> = tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            format!("{name}:{value}|c|#{}\n", tags.join(","))
        }
        TagStyle::Dogstatsd => format!("{name}:{value}|c\n"),
        TagStyle::Name => {
            let mut sorted: Vec<&(String, String)> = tags.iter().collect();
            sorted.sort();
            let mut full = name.to_owned();
            for (key, value) in sorted {
                full.push_str(&format!(".__{key}={}", tag_value(value)));
            }
            format!("{full}:{value}|c\n")
        }
    }
}

/// A tag value in a name: `.`, `:` and `|` would cut the name, so they become `_`, as
/// gostats writes them.
fn tag_value(value: &str) -> String {
    value.replace(['.', ':', '|'], "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_written_as_each_style_writes_them() {
        let tags = vec![
            ("zone".to_owned(), "eu.west:1".to_owned()),
            ("app".to_owned(), "edge".to_owned()),
        ];
        assert_eq!(
            line("ratelimit.a.total_hits", 3, &tags, TagStyle::Name),
            "ratelimit.a.total_hits.__app=edge.__zone=eu_west_1:3|c\n"
        );
        assert_eq!(
            line("ratelimit.a.total_hits", 3, &tags, TagStyle::Dogstatsd),
            "ratelimit.a.total_hits:3|c|#zone:eu.west:1,app:edge\n"
        );
        assert_eq!(
            line("ratelimit.a.total_hits", 3, &[], TagStyle::Name),
            "ratelimit.a.total_hits:3|c\n"
        );
    }

    #[test]
    fn only_what_gained_is_sent_and_datagrams_end_at_line_ends() {
        let options = StatsdOptions {
            tag_style: TagStyle::Name,
            ..StatsdOptions::default()
        };
        let mut sent = Sent::default();
        let first = "tollgate_requests_total{code=\"OK\"} 5\n";
        assert_eq!(
            sent.lines(first, &options),
            "ratelimit.service.config_load_success:1|c\nratelimit_server.ShouldRateLimit.total_requests:5|c\n"
        );
        assert_eq!(sent.lines(first, &options), "");
        let second = "tollgate_requests_total{code=\"OK\"} 7\n";
        assert_eq!(
            sent.lines(second, &options),
            "ratelimit_server.ShouldRateLimit.total_requests:2|c\n"
        );
        let long: String = (0..100).map(|i| format!("stat.{i:04}:1|c\n")).collect();
        let parts = datagrams(&long);
        assert!(
            parts
                .iter()
                .all(|part| part.len() <= MAX_DATAGRAM && part.ends_with('\n'))
        );
        assert_eq!(parts.concat(), long);
    }
}
