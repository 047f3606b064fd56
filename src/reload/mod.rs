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
//!
//! A storm of changes never puts a rule set in force that was not written whole
//! (`burst.rs`): a file written in place is not read while it is open for writing (inotify
//! says when it is closed), its writer stalling up to 2 s between writes; a change that
//! leaves fewer domains than are in force (files deleted to be written again), or a domain
//! with fewer descriptors (a file truncated by one open and written by the next), is taken
//! only once the directory has stayed so for `REMOVAL_GRACE`; the directory itself removed keeps
//! the rules in force, and made again is watched anew; and changes that keep coming are
//! loaded every 250 ms whenever no file is being written, so the rules in force never fall
//! far behind the files.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

mod burst;

use burst::{Burst, EVENT_LAG, SETTLE};

use crate::config;
use crate::metrics::{self, Metrics};
use crate::rules::RuleSet;

/// How long a change that removes domains must stay before it is taken.
const REMOVAL_GRACE: Duration = Duration::from_secs(2);

/// How often the watched directory is checked for having been removed or replaced.
const ROOT_CHECK: Duration = Duration::from_millis(250);

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
            self.reload_if_changed(|| true).await;
        }
    }

    /// Watches the directory for as long as it exists; watches it anew when it is removed
    /// and made again (a watch follows the directory it was set on, not its path).
    async fn watch(mut self) {
        let mut burst = Burst::new(self.dir.clone());
        loop {
            let root = identity(&self.dir);
            let (events, mut changed) = mpsc::unbounded_channel::<notify::Event>();
            let watcher =
                notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                    if let Ok(event) = event {
                        let _ = events.send(event);
                    }
                })
                .and_then(|mut watcher| {
                    watcher.watch(&self.dir, RecursiveMode::Recursive)?;
                    Ok(watcher)
                });
            let _watcher = match watcher {
                Ok(watcher) => watcher,
                // Gone for now (removed to be made again, maybe as it was being watched): look
                // again in a moment.
                Err(_) if root.is_none() || identity(&self.dir).is_none() => {
                    tokio::time::sleep(ROOT_CHECK / 5).await;
                    continue;
                }
                Err(error) => {
                    tracing::error!(dir = %self.dir.display(), %error, "cannot watch the config directory; use --config-poll");
                    return;
                }
            };
            self.reload_if_changed(|| burst.whole(&mut changed)).await;
            // What was written as the watch began may have come without its events: look
            // once more when it has settled.
            burst.changed = true;
            burst.root_replaced = false;
            loop {
                match tokio::time::timeout(ROOT_CHECK, changed.recv()).await {
                    Ok(None) => return,
                    Ok(Some(event)) => burst.note(&event),
                    Err(_) => {}
                }
                if burst.root_replaced || identity(&self.dir) != root {
                    break;
                }
                if burst.changed {
                    burst.settle(&mut changed).await;
                    self.reload_if_changed(|| burst.whole(&mut changed)).await;
                }
            }
        }
    }

    /// Loads the config if the files changed since the last attempt. The files are
    /// fingerprinted before and after the load; if they changed in between (a write still in
    /// progress), the load is not taken, and the change's events bring the next attempt once
    /// the files settle, so a half-written file never stays in force.
    async fn reload_if_changed(&mut self, mut whole: impl FnMut() -> bool) {
        // A directory removed (to be made again, or for good) is no rule set: the rules in
        // force stay, and the watch takes the directory up again when it is back.
        if identity(&self.dir).is_none() {
            tracing::warn!(dir = %self.dir.display(), "the config directory is gone; the rules in force stay");
            return;
        }
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
        // Unchanged; or changed while it was read, or (fewer domains or descriptors than in
        // force) not for long enough: the events of the change (or the next poll) bring the next attempt,
        // once the files are whole again.
        if before == self.last_seen && after == self.last_seen || before != after {
            return;
        }
        if let Ok(rules) = &loaded
            && shrinks(&self.rules.load(), rules)
            && self.last_seen != 0
            && !self.stays(before, REMOVAL_GRACE).await
        {
            return;
        }
        // A write that began as the files were read: its events are on their way from the
        // watcher's thread.
        tokio::time::sleep(EVENT_LAG).await;
        if !whole() {
            return;
        }
        // The first check only catches up with a change made since the initial load: it
        // swaps the rules in, but a success is not counted as a reload.
        let first = self.last_seen == 0;
        self.last_seen = before;
        self.apply(loaded, first);
    }

    /// Whether the files keep the fingerprint `seen` for `grace` (looked at every
    /// `SETTLE / 2`, so that a file written again after a gap is taken up soon).
    async fn stays(&self, seen: u64, grace: Duration) -> bool {
        let until = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < until {
            tokio::time::sleep(SETTLE / 2).await;
            let (dir, dotfiles) = (self.dir.clone(), self.load.dotfiles);
            let now = tokio::task::spawn_blocking(move || fingerprint(&dir, dotfiles)).await;
            if now.ok() != Some(seen) {
                return false;
            }
        }
        true
    }

    fn apply(&self, loaded: Result<RuleSet, config::ConfigErrors>, catching_up: bool) {
        match loaded {
            Ok(rules) => {
                let (before, after) = (names(&self.rules.load()), names(&rules));
                let removed = removed(&self.rules.load(), &rules);
                self.rules.store(Arc::new(rules));
                self.status.set(None);
                // A domain that goes away lifts every limit in it: name it, whatever the level.
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

/// The names of a rule set's domains.
fn names(rules: &RuleSet) -> std::collections::BTreeSet<String> {
    rules.domains().iter().map(|d| d.name.clone()).collect()
}

/// The domains in `now` that `next` would remove.
fn removed(now: &RuleSet, next: &RuleSet) -> Vec<String> {
    names(now).difference(&names(next)).cloned().collect()
}

/// Whether `next` would lift limits in force: remove a domain, or leave one with fewer
/// descriptors (a file truncated to be written again by a second open).
fn shrinks(now: &RuleSet, next: &RuleSet) -> bool {
    !removed(now, next).is_empty()
        || now.domains().iter().any(|domain| {
            next.domain(&domain.name)
                .is_some_and(|kept| kept.root.len() < domain.root.len())
        })
}

/// What identifies a directory apart from its path (a directory made again at the same path
/// is another); `None` when there is none there.
fn identity(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(dir)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
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
