//! The rules' metrics: loads and reloads, when and whether the last one succeeded, and where
//! the rules in force came from.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::counters::Labels;

#[derive(Default)]
pub struct ConfigMetrics {
    /// `tollgate_config_reloads_total{result}`.
    pub reloads: Family<Labels, Counter>,
    /// When the rules in force (or a failed attempt to replace them) were last loaded.
    load_time: Gauge<f64, AtomicU64>,
    load_success: Gauge,
    /// `tollgate_config_source_info{source, version}`: 1 for the rules in force.
    source: Family<Labels, Gauge>,
}

impl ConfigMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "config_reloads",
            "Config reloads by result (success, error)",
            self.reloads.clone(),
        );
        registry.register(
            "config_last_load_timestamp_seconds",
            "When the config was last loaded or a reload last failed, since the Unix epoch",
            self.load_time.clone(),
        );
        registry.register(
            "config_last_load_success",
            "1 if the last config load or reload succeeded, 0 if it failed",
            self.load_success.clone(),
        );
        registry.register(
            "config_source_info",
            "Where the rules in force came from (files, xds) and their version, as labels",
            self.source.clone(),
        );
    }

    /// Labels the rules in force with their source and version (only these labels remain).
    pub fn source(&self, source: &str, version: &str) {
        self.source.clear();
        let labels = vec![
            ("source", source.to_owned()),
            ("version", version.to_owned()),
        ];
        self.source.get_or_create(&labels).set(1);
    }

    /// Records a config load (at start or a reload) and whether it succeeded.
    pub fn loaded(&self, success: bool) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        self.load_time.set(now);
        self.load_success.set(i64::from(success));
    }
}
