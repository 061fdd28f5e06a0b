//! Where a running agent can be reached, for `status` and `ctl` (decision 0011).
//!
//! Once its API socket is bound, the agent writes a small JSON [`Record`] — API address, pid,
//! config directory, pin path, network namespace — at `<run dir>/agent-<KEY>.json`, where KEY
//! is derived from the canonical path of its config directory ([`record_path`]). The CLI finds
//! it from `--config-dir` alone, whatever the fragments there hold (a broken fragment, an
//! `agent.api` edited since the agent started). The agent removes its record on every orderly
//! exit; one left by an agent that was killed names a process that is gone (pid and start time
//! checked) and is ignored.

use std::{
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The directory records are kept in: on tmpfs, so none outlives a reboot.
pub const RUN_DIR: &str = "/run/switchyard";

/// What a running agent records about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The address its API socket is bound to (from `agent.api`), in its network namespace.
    pub api: SocketAddr,
    /// Its process id.
    pub pid: u32,
    /// Start time of that process, in clock ticks since boot (`/proc/PID/stat` field 22): a
    /// pid reused by another process does not match. 0 when unknown.
    pub pid_start: u64,
    /// Its config directory, canonical.
    pub config_dir: PathBuf,
    /// Its `agent.pin_path`.
    pub pin_path: PathBuf,
    /// Its network namespace, as `/proc/self/ns/net` reads (`net:[INODE]`); empty when unknown.
    pub netns: String,
}

impl Record {
    /// The record of this process, serving on `api` for `config_dir` with `pin_path`.
    #[must_use]
    pub fn of_this_process(api: SocketAddr, config_dir: &Path, pin_path: &Path) -> Self {
        let pid = std::process::id();
        Self {
            api,
            pid,
            pid_start: process_start(pid).unwrap_or(0),
            config_dir: canonical(config_dir),
            pin_path: pin_path.to_owned(),
            netns: this_netns(),
        }
    }

    /// Whether the process that wrote the record still runs.
    #[must_use]
    pub fn is_alive(&self) -> bool {
        match process_start(self.pid) {
            Some(start) => self.pid_start == 0 || start == self.pid_start,
            None => false,
        }
    }
}

/// `dir` made absolute with symbolic links resolved; as given (made absolute) when it cannot
/// be resolved (it does not exist).
#[must_use]
pub fn canonical(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| {
        std::env::current_dir().map_or_else(|_| dir.to_owned(), |cwd| cwd.join(dir))
    })
}

/// Where the record of the agent serving `config_dir` is kept under `run_dir`:
/// `agent-<first 16 hex digits of SHA-256 of the canonical path>.json`.
#[must_use]
pub fn record_path(run_dir: &Path, config_dir: &Path) -> PathBuf {
    use std::{fmt::Write as _, os::unix::ffi::OsStrExt as _};
    let digest = Sha256::digest(canonical(config_dir).as_os_str().as_bytes());
    let key = digest[..8]
        .iter()
        .fold(String::with_capacity(16), |mut key, b| {
            let _ = write!(key, "{b:02x}");
            key
        });
    run_dir.join(format!("agent-{key}.json"))
}

/// A written record, removed again when dropped (if it is still this process's).
#[derive(Debug)]
pub struct Written {
    path: PathBuf,
    pid: u32,
}

impl Written {
    /// Where the record is.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        // Another agent for the same directory may have replaced it since (this one's API
        // stopped answering and it was started again): leave that one's record alone.
        let ours = std::fs::read(&self.path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
            .is_some_and(|r| r.pid == self.pid);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes `record` under `run_dir` (created, mode 0755, if missing), replacing whatever record
/// the same config directory had: written to a temporary file and renamed, so a reader sees
/// the old record or the new one, never part of one.
///
/// # Errors
///
/// The I/O error when the directory cannot be created, the record cannot be serialized, the
/// temporary file cannot be created or written, or it cannot be renamed over the record (the
/// temporary file is removed then).
pub fn write(run_dir: &Path, record: &Record) -> std::io::Result<Written> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(run_dir)?;
    let path = record_path(run_dir, &record.config_dir);
    let tmp = path.with_extension(format!("tmp{}", record.pid));
    let text = serde_json::to_string(record).map_err(std::io::Error::other)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    drop(file);
    if let Err(e) = std::fs::rename(&tmp, &path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(Written {
        path,
        pid: record.pid,
    })
}

/// The record of the agent serving `config_dir`, when one is kept under `run_dir` and the
/// process that wrote it still runs; `None` otherwise (no record, an unreadable one, or a
/// stale one).
#[must_use]
pub fn find(run_dir: &Path, config_dir: &Path) -> Option<Record> {
    let path = record_path(run_dir, config_dir);
    let record: Record = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (record.config_dir == canonical(config_dir) && record.is_alive()).then_some(record)
}

/// Removes the record of `config_dir` under `run_dir`, if any (for a harness that killed its
/// agent). Best effort.
pub fn remove(run_dir: &Path, config_dir: &Path) {
    let _ = std::fs::remove_file(record_path(run_dir, config_dir));
}

/// This process's network namespace, `net:[INODE]`; empty when it cannot be read.
#[must_use]
pub fn this_netns() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// Start time of process `pid` in clock ticks since boot, from `/proc/PID/stat`; `None` when
/// there is no such process.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so fields are counted
    // from the last `)`; starttime is field 22, the 20th after it.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(config_dir: &Path) -> Record {
        Record::of_this_process(
            "127.0.0.1:9911".parse().unwrap(),
            config_dir,
            Path::new("/sys/fs/bpf/switchyard"),
        )
    }

    #[test]
    fn a_written_record_is_found_from_the_config_dir_and_removed_on_drop() {
        let run = tempfile::tempdir().unwrap();
        let config = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let written = write(run.path(), &record(config.path())).unwrap();
        let found = find(run.path(), config.path()).unwrap();
        assert_eq!(found.api.port(), 9911);
        assert_eq!(found.pid, std::process::id());
        assert!(found.pid_start > 0);
        assert_eq!(found.netns, this_netns());
        // The same directory by another spelling finds it; another directory does not.
        let dotted = config.path().join(".");
        assert_eq!(find(run.path(), &dotted), Some(found));
        assert_eq!(find(run.path(), other.path()), None);
        let path = written.path().to_owned();
        drop(written);
        assert!(!path.exists());
        assert_eq!(find(run.path(), config.path()), None);
    }

    #[test]
    fn a_record_of_a_process_that_is_gone_is_ignored() {
        let run = tempfile::tempdir().unwrap();
        let config = tempfile::tempdir().unwrap();
        let mut stale = record(config.path());
        // Same pid, another start time: the pid was reused.
        stale.pid_start += 1;
        let _written = write(run.path(), &stale).unwrap();
        assert_eq!(find(run.path(), config.path()), None);
        // A pid no process has (above the kernel's maximum, 2^22).
        stale.pid = 1 << 23;
        let _written = write(run.path(), &stale).unwrap();
        assert_eq!(find(run.path(), config.path()), None);
    }

    #[test]
    fn dropping_a_record_another_agent_replaced_leaves_it() {
        let run = tempfile::tempdir().unwrap();
        let config = tempfile::tempdir().unwrap();
        let first = write(run.path(), &record(config.path())).unwrap();
        let mut next = record(config.path());
        next.pid = 1;
        let _second = write(run.path(), &next).unwrap();
        let path = first.path().to_owned();
        drop(first);
        assert!(path.exists(), "the other agent's record was removed");
    }

    #[test]
    fn process_start_reads_field_22() {
        let start = process_start(std::process::id()).unwrap();
        assert!(start > 0);
        assert_eq!(process_start(1 << 23), None);
    }
}
