//! A burst of file events, and whether the files the loader reads are whole: not being
//! written in place. inotify says when a file written to is closed: until then, and for at
//! most `WRITE_STALL` after its last write, a file is taken to be still written. (A file
//! written in a directory made a moment before, which the watch has not reached yet, is not
//! seen being written: new files in new directories are written whole and swapped in, as a
//! ConfigMap update does.)

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// How long a burst of file events must be quiet before the config is read.
pub const SETTLE: Duration = Duration::from_millis(250);

/// Longest a burst of events that keeps coming delays a load (when no file is being
/// written).
const MOST_SETTLE: Duration = Duration::from_millis(250);

/// How long a file written to, and not seen closed since, is taken to be still written: a
/// writer stalled longer than this between two writes is not waited for.
const WRITE_STALL: Duration = Duration::from_secs(2);

/// How long a file event may take from the kernel to the reload task (through the watcher's
/// thread), looked back on before a load is taken.
pub const EVENT_LAG: Duration = Duration::from_millis(50);

/// What a burst of events has said so far.
pub struct Burst {
    /// The watched directory.
    root: PathBuf,
    /// Whether anything the loader reads may have changed since the last load.
    pub changed: bool,
    /// Whether the directory itself was removed (its watch says so as it ends): a new
    /// directory at the path may reuse its inode, so only this tells the watch to begin anew.
    pub root_replaced: bool,
    /// Regular files written to (created or modified) and not seen closed since: their last
    /// write.
    writing: HashMap<PathBuf, Instant>,
}

impl Burst {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            changed: false,
            root_replaced: false,
            writing: HashMap::new(),
        }
    }

    pub fn note(&mut self, event: &notify::Event) {
        if event.paths.contains(&self.root) && (event.kind.is_remove() || event.kind.is_create()) {
            self.root_replaced = true;
        }

        use notify::EventKind::{Access, Create, Modify, Remove};
        use notify::event::{AccessKind, AccessMode, ModifyKind};
        match event.kind {
            Access(AccessKind::Close(AccessMode::Write)) => {
                for path in &event.paths {
                    self.writing.remove(path);
                }
                self.changed = true;
            }
            // Reads (ours included: inotify reports opens) change nothing.
            Access(_) => {}
            Create(_) | Modify(ModifyKind::Data(_)) => {
                let now = Instant::now();
                let regular = |path: &PathBuf| {
                    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_file())
                };
                for path in event.paths.iter().filter(|path| regular(path)) {
                    self.writing.insert(path.clone(), now);
                }
                self.changed = true;
            }
            Remove(_) => {
                for path in &event.paths {
                    self.writing.remove(path);
                }
                self.changed = true;
            }
            _ => self.changed = true,
        }
    }

    /// Whether a file is being written, as its events say (written to within
    /// `WRITE_STALL`, not closed since).
    fn writing(&self) -> bool {
        self.writing
            .values()
            .any(|last| last.elapsed() < WRITE_STALL)
    }

    /// Waits until the burst is quiet for `SETTLE` (or has gone on for `MOST_SETTLE`) with no
    /// file being written; the burst is then taken in.
    pub async fn settle(&mut self, changed: &mut mpsc::UnboundedReceiver<notify::Event>) {
        let began = Instant::now();
        loop {
            match tokio::time::timeout(SETTLE, changed.recv()).await {
                Ok(Some(event)) => {
                    self.note(&event);
                    if began.elapsed() < MOST_SETTLE || self.writing() {
                        continue;
                    }
                }
                Ok(None) => return,
                Err(_) if self.writing() => continue,
                Err(_) => {}
            }
            if !self.writing() {
                self.changed = false;
                return;
            }
        }
    }

    /// Takes in the events that came since the burst settled; whether no file is being
    /// written now. When one is, the burst counts as changed, so that the load is tried again.
    pub fn whole(&mut self, changed: &mut mpsc::UnboundedReceiver<notify::Event>) -> bool {
        while let Ok(event) = changed.try_recv() {
            self.note(&event);
        }
        let whole = !self.writing();
        self.changed |= !whole;
        whole
    }
}
