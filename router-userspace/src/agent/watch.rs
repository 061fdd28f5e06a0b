//! The directory watch: inotify (through the `notify` crate) on the config directory, one
//! wake-up per burst of changes.
//!
//! Every event in the directory counts: a fragment written in place, renamed over (editors and
//! `mv`), removed, or a Kubernetes-style `..data` symlink swap. Which files are fragments is
//! decided when the directory is read ([`config::read_dir`](crate::config::read_dir)), not here,
//! and the apply path skips fragments whose content hash is the running version's, so an
//! editor's swap or backup file, which is never a fragment, wakes the agent and changes nothing.
//! The debounce ([`DEBOUNCE`]) lets an editor's write-rename-chmod sequence, or an operator
//! copying several fragments, land before the directory is read.

use std::{path::Path, time::Duration};

use notify::{RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

/// How long the directory must stay quiet before it is read and applied.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

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

/// Watches `dir` (not its subdirectories); each event sends one `()` on the returned channel
/// (coalesced: a full channel already has a wake-up pending). The watch lasts as long as the
/// returned watcher.
pub fn watch(dir: &Path) -> Result<(RecommendedWatcher, mpsc::Receiver<()>), WatchError> {
    let (tx, rx) = mpsc::channel(1);
    let err = |source| WatchError {
        dir: dir.display().to_string(),
        source,
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            // Access events (a reader opening a fragment, the agent itself reading the
            // directory) change nothing.
            Ok(e) if e.kind.is_access() => {}
            Ok(_) => {
                let _ = tx.try_send(());
            }
            Err(e) => log::warn!("config directory watch: {e}"),
        }
    })
    .map_err(err)?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(err)?;
    Ok((watcher, rx))
}
