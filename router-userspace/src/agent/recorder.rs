//! The history store's own thread. Recording a version (`SQLite`, `synchronous = FULL`: an fsync
//! or two) and reading versions for `ctl versions`, `diff` and `rollback` happen there, never on
//! the event loop: a decision never waits behind a record.
//!
//! Jobs run one at a time in the order they were sent, so versions are recorded in the order
//! they were applied.

use std::{sync::mpsc, thread};

use tokio::sync::oneshot;

use crate::{
    config::{self, Diff},
    history::{History, NewVersion, Version, VersionInfo},
    publish::Ledger,
};

enum Job {
    Record(NewVersion, Ledger, oneshot::Sender<Result<u64, String>>),
    List(oneshot::Sender<Result<Vec<VersionInfo>, String>>),
    Get(u64, oneshot::Sender<Result<Option<Version>, String>>),
    Diff(u64, u64, oneshot::Sender<Result<Vec<String>, String>>),
    Drain(mpsc::Sender<()>),
}

/// A handle on the history thread; cheap to clone. The thread ends when every handle is gone.
#[derive(Clone, Debug)]
pub struct Recorder {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Job::Record(..) => "Record",
            Job::List(_) => "List",
            Job::Get(..) => "Get",
            Job::Diff(..) => "Diff",
            Job::Drain(_) => "Drain",
        })
    }
}

const GONE: &str = "the history store's thread has stopped";

impl Recorder {
    /// Starts the thread that owns `history`.
    ///
    /// # Errors
    ///
    /// The thread could not be spawned.
    pub fn spawn(mut history: History) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("history".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Record(mut v, ledger, done) => {
                            let recorded = serde_json::to_string(&ledger)
                                .map_err(|e| format!("serializing the slot ledger: {e}"))
                                .and_then(|l| {
                                    v.ledger = l;
                                    history.record(v).map_err(|e| e.to_string())
                                });
                            let _ = done.send(recorded);
                        }
                        Job::List(done) => {
                            let _ = done.send(history.list().map_err(|e| e.to_string()));
                        }
                        Job::Get(n, done) => {
                            let _ = done.send(history.get(n).map_err(|e| e.to_string()));
                        }
                        Job::Diff(a, b, done) => {
                            let _ = done.send(diff(&history, a, b));
                        }
                        Job::Drain(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })?;
        Ok(Self { jobs })
    }

    /// Records `version` with `ledger` (serialized on the history thread); the receiver gets
    /// the version number or why it was not recorded.
    #[must_use = "the receiver says whether the version was recorded"]
    pub fn record(
        &self,
        version: NewVersion,
        ledger: Ledger,
    ) -> oneshot::Receiver<Result<u64, String>> {
        let (done, rx) = oneshot::channel();
        if let Err(mpsc::SendError(Job::Record(_, _, done))) =
            self.jobs.send(Job::Record(version, ledger, done))
        {
            let _ = done.send(Err(GONE.into()));
        }
        rx
    }

    /// Waits, at most `limit`, until every job sent before has run: an orderly exit records the
    /// versions it applied. Returns whether they all ran.
    #[must_use]
    pub fn drain(&self, limit: std::time::Duration) -> bool {
        let (done, rx) = mpsc::channel();
        if self.jobs.send(Job::Drain(done)).is_err() {
            return true;
        }
        rx.recv_timeout(limit).is_ok()
    }

    async fn ask<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, String>>) -> Job,
    ) -> Result<T, String> {
        let (done, rx) = oneshot::channel();
        self.jobs.send(job(done)).map_err(|_| GONE.to_owned())?;
        rx.await.map_err(|_| GONE.to_owned())?
    }

    /// Every recorded version.
    ///
    /// # Errors
    ///
    /// What the store reported.
    pub async fn list(&self) -> Result<Vec<VersionInfo>, String> {
        self.ask(Job::List).await
    }

    /// Version `n`.
    ///
    /// # Errors
    ///
    /// What the store reported.
    pub async fn get(&self, n: u64) -> Result<Option<Version>, String> {
        self.ask(|done| Job::Get(n, done)).await
    }

    /// The resource-level changes from version `a` to version `b`, one line each.
    ///
    /// # Errors
    ///
    /// A version that is missing, or whose fragments no longer load.
    pub async fn diff(&self, a: u64, b: u64) -> Result<Vec<String>, String> {
        self.ask(|done| Job::Diff(a, b, done)).await
    }
}

fn diff(history: &History, a: u64, b: u64) -> Result<Vec<String>, String> {
    let config_of = |n: u64| -> Result<config::Config, String> {
        let v = history
            .get(n)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no version {n}"))?;
        v.fragments()
            .load()
            .map_err(|e| format!("version {n}: {e}"))
    };
    let (x, y) = (config_of(a)?, config_of(b)?);
    Ok(Diff::between(&x, &y)
        .changes
        .iter()
        .map(ToString::to_string)
        .collect())
}
