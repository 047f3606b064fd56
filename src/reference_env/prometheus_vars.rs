//! The reference's Prometheus variables (`USE_PROMETHEUS`), as the metrics listener and the
//! reference's series beside tollgate's own, with its response time in the unit its mapping
//! gives it.

use serde::Deserialize;

use super::reader::{Reader, address};
use super::translation::{EnvError, refuse};

/// A statsd_exporter mapping file, as much of it as says the response time's unit.
#[derive(Deserialize)]
struct Mapper {
    #[serde(default)]
    mappings: Vec<Mapping>,
}

#[derive(Deserialize)]
struct Mapping {
    #[serde(rename = "match")]
    pattern: String,
    scale: Option<f64>,
}

/// The reference's timer of each call, in milliseconds, which its default mapping scales to
/// seconds.
const RESPONSE_TIME: &str = "ratelimit_server.*.response_time";

impl Reader<'_> {
    /// The flags of the Prometheus sink.
    pub(super) fn prometheus(&mut self) -> Result<(), EnvError> {
        if !self.switch("USE_PROMETHEUS")? {
            return Ok(());
        }
        let addr = self.text("PROMETHEUS_ADDR");
        let (host, port) = addr.rsplit_once(':').unwrap_or(("", addr.as_str()));
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        let addr = address(host, port, "PROMETHEUS_ADDR", "PROMETHEUS_ADDR")?;
        self.flag("--metrics-addr", addr, "PROMETHEUS_ADDR");
        let path = self.text("PROMETHEUS_PATH");
        self.flag("--metrics-path", path, "PROMETHEUS_PATH");
        self.out.args.push("--metrics-reference-series".into());
        let (unit, variable) = self.response_time_unit()?;
        self.flag("--metrics-reference-response-time", unit, variable);
        Ok(())
    }

    /// The response time's unit, and the variable that says it: a mapping file's scale of
    /// the response time (none: milliseconds, as Envoy Gateway's mapping leaves them), else
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` (which, as in the reference, only changes
    /// the default mapping).
    fn response_time_unit(&mut self) -> Result<(&'static str, &'static str), EnvError> {
        const MAPPER: &str = "PROMETHEUS_MAPPER_YAML";
        let path = self.text(MAPPER);
        if path.is_empty() {
            let unit = match self.switch("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")? {
                true => "milliseconds",
                false => "seconds",
            };
            return Ok((unit, "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"));
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|error| refuse(MAPPER, format!("cannot read {path}: {error}")))?;
        let mapper: Mapper = serde_saphyr::from_str(&text).map_err(|error| {
            refuse(
                MAPPER,
                format!("{path} is not a statsd_exporter mapping: {error}"),
            )
        })?;
        let scaled = mapper
            .mappings
            .iter()
            .any(|mapping| mapping.pattern == RESPONSE_TIME && mapping.scale == Some(0.001));
        Ok((if scaled { "seconds" } else { "milliseconds" }, MAPPER))
    }
}
