//! The process's own metrics under the names every Prometheus client library uses
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`), read from /proc at each scrape. On a
//! system without /proc the collector reports nothing rather than zeros.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Linux reports CPU time and start time in clock ticks of 1/100 s (USER_HZ on every ABI).
const TICKS_PER_SECOND: f64 = 100.0;
const PAGE_BYTES: u64 = 4096;

#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What one scrape reads.
#[derive(Debug, Default, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    open_fds: u64,
    max_fds: Option<u64>,
    start_time_seconds: Option<f64>,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(sample) = sample() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(sample.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size, in bytes",
                Some(sample.resident_bytes as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size, in bytes",
                Some(sample.virtual_bytes as f64),
            ),
            (
                "process_open_fds",
                "Open file descriptors",
                Some(sample.open_fds as f64),
            ),
            (
                "process_max_fds",
                "Limit on open file descriptors",
                sample.max_fds.map(|max| max as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                sample.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let gauge = ConstGauge::new(value);
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
        }
        Ok(())
    }
}

fn sample() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut sample = parse(&stat, &statm)?;
    sample.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |fds| fds.count() as u64);
    sample.max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| max_open_files(&limits));
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| boot_time(&text));
    sample.start_time_seconds = boot
        .zip(start_ticks(&stat))
        .map(|(boot, ticks)| boot as f64 + ticks as f64 / TICKS_PER_SECOND);
    Some(sample)
}

/// utime and stime from /proc/self/stat, and the virtual and resident pages from
/// /proc/self/statm.
fn parse(stat: &str, statm: &str) -> Option<Sample> {
    // Fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index)?.parse::<u64>().ok();
    // Counted from the state field (the 3rd of the line): utime is the 14th, stime the 15th.
    let cpu_ticks = ticks(11)? + ticks(12)?;
    let mut pages = statm.split_whitespace();
    let virtual_pages: u64 = pages.next()?.parse().ok()?;
    let resident_pages: u64 = pages.next()?.parse().ok()?;
    Some(Sample {
        cpu_seconds: cpu_ticks as f64 / TICKS_PER_SECOND,
        resident_bytes: resident_pages * PAGE_BYTES,
        virtual_bytes: virtual_pages * PAGE_BYTES,
        ..Sample::default()
    })
}

/// The process's start, in ticks after boot (the 22nd field of /proc/self/stat).
fn start_ticks(stat: &str) -> Option<u64> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// `btime` of /proc/stat: the boot time, in seconds since the epoch.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft limit of `Max open files` in /proc/self/limits.
fn max_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_by_field() {
        let stat = "4242 (tollgate (x)) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 75 0 0 20 0 5 0 123456 1000 20 0";
        let sample = parse(stat, "5000 300 200 1 0 400 0").unwrap();
        assert_eq!(sample.cpu_seconds, 3.25);
        assert_eq!(sample.resident_bytes, 300 * 4096);
        assert_eq!(sample.virtual_bytes, 5000 * 4096);
        assert_eq!(start_ticks(stat), Some(123_456));
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1795000000\n"),
            Some(1_795_000_000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
    }
}
