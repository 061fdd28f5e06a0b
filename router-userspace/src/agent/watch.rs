//! The directory watch: inotify (through the `notify` crate) on the config directory, one
//! wake-up per burst of changes.
//!
//! Every event in the directory counts: a fragment written in place, renamed over (editors and
//! `mv`), removed, or a Kubernetes-style `..data` symlink swap. Which files are fragments is
//! decided when the directory is read ([`config::read_dir`](crate::config::read_dir)), not here,
//! and the apply path skips a directory whose fragments are the ones it last read, so an
//! editor's swap or backup file, which is never a fragment, wakes the agent and changes nothing.
//! The debounce ([`DEBOUNCE`]) lets an editor's write-rename-chmod sequence, or an operator
//! copying several fragments, land before the directory is read.
//!
//! Two things a plain inotify watch gets wrong, handled here:
//!
//! - **A fragment still being written.** A writer that pauses longer than the debounce (a `cp`
//!   on a busy disk, `cat > fragment`, a template streamed by a configuration manager) would
//!   have its first half read and applied — a valid prefix that drops services cuts traffic.
//!   A fragment that was modified and not closed since ([`Watch::writing`]) holds the apply
//!   back, for at most [`WRITE_LIMIT`] after its last write.
//! - **The directory replaced.** inotify watches an inode: a directory deleted and created
//!   again, or another one renamed into its place, is not watched, and changes to it would
//!   never be applied. [`Watch::follow`] notices the path naming another directory and watches
//!   that one.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use notify::{
    EventKind, RecommendedWatcher, RecursiveMode, Watcher as _,
    event::{AccessKind, AccessMode, ModifyKind},
};
use tokio::sync::mpsc;

/// How long the directory must stay quiet before it is read and applied.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// How long after its last write a fragment that is still open for writing holds the apply
/// back. A writer that keeps a fragment open without writing longer than this is taken to be
/// done (logged).
pub const WRITE_LIMIT: Duration = Duration::from_secs(5);

/// Why the watch could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("watching the configuration directory {dir}: {source}")]
pub struct WatchError {
    /// The directory.
    pub dir: String,
    /// Cause.
    #[source]
    pub source: notify::Error,
}

/// Fragments modified and not closed since, with the time of their last write.
type Writing = Arc<Mutex<HashMap<PathBuf, Instant>>>;

/// The watch on the config directory (not its subdirectories).
pub struct Watch {
    dir: PathBuf,
    /// Held for its watch, which ends when it is dropped.
    _watcher: RecommendedWatcher,
    /// Device and inode of the directory watched.
    watched: (u64, u64),
    /// Set when the directory watched was removed or moved away: the watch no longer follows
    /// the path. (The device and inode alone do not tell: a directory created again often gets
    /// the inode number just freed.)
    lost: Arc<AtomicBool>,
    tx: mpsc::Sender<()>,
    writing: Writing,
}

/// Device and inode of `dir`.
fn identity(dir: &Path) -> std::io::Result<(u64, u64)> {
    let meta = std::fs::metadata(dir)?;
    Ok((meta.dev(), meta.ino()))
}

impl Watch {
    /// Watches `dir`; each event sends one `()` on the returned channel (coalesced: a full
    /// channel already has a wake-up pending). The watch lasts as long as the returned
    /// [`Watch`].
    pub fn new(dir: &Path) -> Result<(Self, mpsc::Receiver<()>), WatchError> {
        let (tx, rx) = mpsc::channel(1);
        let writing = Writing::default();
        let id = identity(dir).map_err(|e| WatchError {
            dir: dir.display().to_string(),
            source: notify::Error::io(e),
        })?;
        let lost = Arc::new(AtomicBool::new(false));
        let watcher = start(dir, &tx, &writing, &lost)?;
        Ok((
            Self {
                dir: dir.to_owned(),
                _watcher: watcher,
                watched: id,
                lost,
                tx,
                writing,
            },
            rx,
        ))
    }

    /// Follows the path: when it now names another directory than the one watched (deleted
    /// and created again, or another renamed into its place), watches that one instead. Returns
    /// whether it did; the caller then reads the directory, since no event announced what the
    /// new one holds. A missing directory changes nothing here (its removal was an event).
    #[expect(
        clippy::used_underscore_binding,
        reason = "`_watcher` is held for its watch alone and never read; replacing it is its use"
    )]
    pub fn follow(&mut self) -> bool {
        let Ok(id) = identity(&self.dir) else {
            return false;
        };
        if id == self.watched && !self.lost.load(Ordering::Relaxed) {
            return false;
        }
        // A new flag for the new watcher: a late event of the old one must not mark it lost.
        let lost = Arc::new(AtomicBool::new(false));
        match start(&self.dir, &self.tx, &self.writing, &lost) {
            Ok(watcher) => {
                log::info!(
                    "the configuration directory {} was replaced; watching the new one",
                    self.dir.display()
                );
                self._watcher = watcher;
                self.watched = id;
                self.lost = lost;
                if let Ok(mut w) = self.writing.lock() {
                    w.clear();
                }
                true
            }
            Err(e) => {
                log::warn!("{e}; retrying");
                false
            }
        }
    }

    /// A fragment still being written (modified and not closed since, its last write less than
    /// [`WRITE_LIMIT`] ago): the apply waits for it.
    pub fn writing(&self) -> Option<PathBuf> {
        let mut w = self.writing.lock().ok()?;
        w.retain(|path, last| {
            let open = last.elapsed() < WRITE_LIMIT;
            if !open {
                log::warn!(
                    "{} was written {:?} ago and is still open for writing; reading it as it is",
                    path.display(),
                    last.elapsed()
                );
            }
            open
        });
        w.keys().next().cloned()
    }
}

/// A watcher on `dir` that wakes `tx`, keeps `writing` up to date and sets `lost` when `dir`
/// itself is removed or moved away.
fn start(
    dir: &Path,
    tx: &mpsc::Sender<()>,
    writing: &Writing,
    lost: &Arc<AtomicBool>,
) -> Result<RecommendedWatcher, WatchError> {
    let err = |source| WatchError {
        dir: dir.display().to_string(),
        source,
    };
    let (tx, writing, lost, own) = (tx.clone(), writing.clone(), lost.clone(), dir.to_owned());
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            Ok(e) => {
                track(&e, &writing);
                // `IN_DELETE_SELF` / `IN_MOVE_SELF`: events about the directory itself.
                if matches!(
                    e.kind,
                    EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
                ) && e.paths.iter().any(|p| p == &own)
                {
                    lost.store(true, Ordering::Relaxed);
                }
                // Access events (a reader opening a fragment, the agent itself reading the
                // directory) change nothing; the end of a write does.
                if !e.kind.is_access()
                    || e.kind == EventKind::Access(AccessKind::Close(AccessMode::Write))
                {
                    let _ = tx.try_send(());
                }
            }
            Err(e) => log::warn!("config directory watch: {e}"),
        }
    })
    .map_err(err)?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(err)?;
    Ok(watcher)
}

/// Notes which fragments `event` leaves open for writing: written (`IN_MODIFY`, which a
/// truncation also gives) until closed after writing (`IN_CLOSE_WRITE`), removed or renamed.
/// Only fragments count: the agent keeps its own files open (the history store and audit log,
/// should the state directory be this one), and an editor its swap file.
fn track(event: &notify::Event, writing: &Writing) {
    let fragments = event.paths.iter().filter(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(crate::config::is_fragment)
    });
    let Ok(mut w) = writing.lock() else { return };
    match event.kind {
        EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any) => {
            for p in fragments {
                w.insert(p.clone(), Instant::now());
            }
        }
        EventKind::Access(AccessKind::Close(AccessMode::Write))
        | EventKind::Remove(_)
        | EventKind::Modify(ModifyKind::Name(_)) => {
            for p in fragments {
                w.remove(p);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("switchyard-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Waits up to 2 s for `cond`.
    fn eventually(mut cond: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn a_fragment_is_being_written_until_it_is_closed() {
        let dir = temp_dir("writing");
        let (watch, _rx) = Watch::new(&dir).unwrap();
        let mut f = std::fs::File::create(dir.join("10-web.yaml")).unwrap();
        f.write_all(b"agent:\n").unwrap();
        let path = dir.join("10-web.yaml");
        assert!(eventually(|| watch.writing().as_ref() == Some(&path)));
        drop(f);
        assert!(eventually(|| watch.writing().is_none()));
        // Files that are not fragments never hold the apply back.
        let mut f = std::fs::File::create(dir.join("history.sqlite")).unwrap();
        f.write_all(b"x").unwrap();
        let mut g = std::fs::File::create(dir.join(".10-web.yaml.swp")).unwrap();
        g.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(watch.writing(), None);
        drop(watch);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_replaced_directory_is_followed() {
        let dir = temp_dir("follow");
        let (mut watch, mut rx) = Watch::new(&dir).unwrap();
        assert!(!watch.follow(), "nothing replaced yet");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!watch.follow(), "a missing directory is not followed");
        std::fs::create_dir(&dir).unwrap();
        // Whether or not the new directory got the old one's inode number.
        assert!(eventually(|| watch.follow()));
        assert!(!watch.follow());
        while rx.try_recv().is_ok() {}
        std::fs::write(dir.join("10-web.yaml"), "agent: {}\n").unwrap();
        assert!(
            eventually(|| rx.try_recv().is_ok()),
            "the new directory is watched"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
