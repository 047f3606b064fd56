//! Hot reload of the config directory: watch it (inotify through `notify`, or polling with
//! `--config-poll` on filesystems without events), wait for a burst of changes to settle,
//! load and validate every file, and swap the rules atomically. A config that fails to load
//! leaves the last good one in force; the failure is logged with file and line, counted in
//! `tollgate_config_reloads_total{result="error"}` and shown by `GET /config` until a later
//! load succeeds.
//!
//! Both editing a file in place and a Kubernetes ConfigMap update (a new `..<timestamp>`
//! directory, then the `..data` symlink renamed over) are seen: the watch is recursive and
//! a reload happens only when the content of the files the loader reads has changed.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::config;
use crate::metrics::{self, Metrics};
use crate::rules::RuleSet;

/// How long a burst of file events must be quiet before the config is read.
const SETTLE: Duration = Duration::from_millis(250);

/// The outcome of the latest reload, for `GET /config`.
#[derive(Debug, Default)]
pub struct ReloadStatus {
    last_error: Mutex<Option<String>>,
    /// Where the rules in force came from, when not from files (`xds SERVER, version V`).
    source: Mutex<Option<String>>,
}

impl ReloadStatus {
    /// Where the rules in force came from, if set.
    pub fn source(&self) -> Option<String> {
        self.source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn set_source(&self, source: String) {
        *self.source.lock().unwrap_or_else(PoisonError::into_inner) = Some(source);
    }

    /// The error of the latest reload, if it failed (the previous config is still in force).
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn set(&self, error: Option<String>) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = error;
    }
}

/// The rule files: flags of `tollgate serve`.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Rules")]
pub struct RulesOptions {
    /// Directory of YAML rule files (one domain per file).
    #[arg(long, env = "TOLLGATE_CONFIG", required_unless_present = "config_xds")]
    pub config: Option<PathBuf>,

    /// Poll the config directory this often instead of watching it for file events (for
    /// filesystems without inotify, such as some network mounts).
    #[arg(long = "config-poll", env = "TOLLGATE_CONFIG_POLL", value_parser = crate::clock::positive_duration)]
    pub poll: Option<Duration>,

    #[command(flatten)]
    pub load: config::LoadOptions,

    /// Report not ready (health NOT_SERVING, /readyz 500) while the rules name no domain (the
    /// reference's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
    #[arg(long, env = "TOLLGATE_READY_NEEDS_RULES", value_parser = clap::builder::BoolishValueParser::new())]
    pub ready_needs_rules: bool,

    /// When the rule files do not load at start, keep running, not ready, answering every
    /// call UNKNOWN "no rate limit configuration loaded", until a reload loads them (as the
    /// reference does; on in its environment). Off, serve exits with the errors.
    #[arg(long, env = "TOLLGATE_WAIT_FOR_VALID_CONFIG", value_parser = clap::builder::BoolishValueParser::new())]
    pub wait_for_valid_config: bool,
}

impl RulesOptions {
    /// How the rule files are watched, when there are rule files.
    pub fn reload(&self) -> Option<ReloadOptions> {
        Some(ReloadOptions {
            dir: self.config.clone()?,
            poll: self.poll,
            load: self.load,
        })
    }
}

/// Where to reload from and how to notice changes.
#[derive(Debug, Clone)]
pub struct ReloadOptions {
    pub dir: PathBuf,
    /// Poll this often instead of watching for events.
    pub poll: Option<Duration>,
    /// Which files are read, and how.
    pub load: config::LoadOptions,
}

/// Watches `options.dir` until the returned task is aborted (the watcher stops with it).
pub fn spawn(
    options: ReloadOptions,
    rules: Arc<ArcSwap<RuleSet>>,
    status: Arc<ReloadStatus>,
    metrics: Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Nothing seen yet: the first check loads once more, so a change made between the
        // initial load and the start of the watch is not missed.
        let reloader = Reloader {
            last_seen: 0,
            dir: options.dir,
            load: options.load,
            rules,
            status,
            metrics,
        };
        match options.poll {
            Some(every) => reloader.poll(every).await,
            None => reloader.watch().await,
        }
    })
}

struct Reloader {
    dir: PathBuf,
    load: config::LoadOptions,
    rules: Arc<ArcSwap<RuleSet>>,
    status: Arc<ReloadStatus>,
    metrics: Arc<Metrics>,
    /// The content the rules in force (or the latest failure) were read from.
    last_seen: u64,
}

impl Reloader {
    async fn poll(mut self, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        loop {
            ticks.tick().await;
            self.reload_if_changed().await;
        }
    }

    async fn watch(mut self) {
        let (events, mut changed) = mpsc::unbounded_channel::<()>();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Reads (ours included: inotify reports opens) change nothing.
            if event.is_ok_and(|event| !matches!(event.kind, notify::EventKind::Access(_))) {
                let _ = events.send(());
            }
        })
        .and_then(|mut watcher| {
            watcher.watch(&self.dir, RecursiveMode::Recursive)?;
            Ok(watcher)
        });
        let _watcher = match watcher {
            Ok(watcher) => watcher,
            Err(error) => {
                tracing::error!(dir = %self.dir.display(), %error, "cannot watch the config directory; use --config-poll");
                return;
            }
        };
        self.reload_if_changed().await;
        while changed.recv().await.is_some() {
            // Let the burst settle (an editor's save or a ConfigMap swap is several events).
            loop {
                tokio::time::sleep(SETTLE).await;
                let mut more = false;
                while changed.try_recv().is_ok() {
                    more = true;
                }
                if !more {
                    break;
                }
            }
            self.reload_if_changed().await;
        }
    }

    /// Loads the config if the files changed since the last attempt. The files are
    /// fingerprinted before and after the load; if they changed in between (a write still in
    /// progress), the load is retried once they settle, so a half-written file never stays in
    /// force.
    async fn reload_if_changed(&mut self) {
        loop {
            let (dir, load) = (self.dir.clone(), self.load);
            let attempt = tokio::task::spawn_blocking(move || {
                let before = fingerprint(&dir, load.dotfiles);
                let loaded = config::load(&dir, load);
                (before, loaded, fingerprint(&dir, load.dotfiles))
            })
            .await;
            let (before, loaded, after) = match attempt {
                Ok(attempt) => attempt,
                Err(error) => {
                    tracing::error!(%error, "config reload task failed");
                    return;
                }
            };
            if before == self.last_seen && after == self.last_seen {
                return;
            }
            if before != after {
                tokio::time::sleep(SETTLE).await;
                continue;
            }
            // The first check only catches up with a change made since the initial load: it
            // swaps the rules in, but a success is not counted as a reload.
            let first = self.last_seen == 0;
            self.last_seen = before;
            self.apply(loaded, first);
            return;
        }
    }

    fn apply(&self, loaded: Result<RuleSet, config::ConfigErrors>, catching_up: bool) {
        match loaded {
            Ok(rules) => {
                let names = |rules: &RuleSet| -> std::collections::BTreeSet<String> {
                    rules.domains().iter().map(|d| d.name.clone()).collect()
                };
                let (before, after) = (names(&self.rules.load()), names(&rules));
                self.rules.store(Arc::new(rules));
                self.status.set(None);
                // A domain that goes away lifts every limit in it: name it, whatever the level.
                let removed: Vec<&String> = before.difference(&after).collect();
                if !removed.is_empty() {
                    tracing::warn!(dir = %self.dir.display(), removed = ?removed, "domains removed by the reload: their requests are now unlimited");
                }
                if !catching_up {
                    let added: Vec<&String> = after.difference(&before).collect();
                    tracing::info!(dir = %self.dir.display(), domains = after.len(), added = ?added, "config reloaded");
                    self.count("success");
                }
            }
            Err(errors) => {
                let text = errors.to_string();
                tracing::error!(dir = %self.dir.display(), errors = %text, "config reload failed; the previous config stays in force");
                self.status.set(Some(text));
                self.count("error");
            }
        }
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .config
            .reloads
            .get_or_create(&metrics::label("result", result))
            .inc();
        self.metrics.config.loaded(result == "success");
    }
}

/// A hash of the names and contents of the entries the loader would look at (following
/// symlinks, skipping dot-entries as it does), so that unrelated events reload nothing.
fn fingerprint(dir: &Path, dotfiles: bool) -> u64 {
    let mut hasher = DefaultHasher::new();
    hash_dir(dir, &mut hasher, dotfiles);
    hasher.finish()
}

fn hash_dir(dir: &Path, hasher: &mut DefaultHasher, dotfiles: bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .is_some_and(|name| dotfiles || !name.to_string_lossy().starts_with('.'))
        })
        .collect();
    paths.sort();
    for path in paths {
        path.hash(hasher);
        if path.is_dir() {
            hash_dir(&path, hasher, dotfiles);
        } else {
            // An unreadable entry (a dangling link, no permission) counts too: the loader
            // fails on it, and removing it must be seen as a change.
            match std::fs::read(&path) {
                Ok(content) => content.hash(hasher),
                Err(error) => error.kind().hash(hasher),
            }
        }
    }
}
