//! The history of applied configurations: each applied config kept as a numbered version (time,
//! content hash, the fragments and their merged text, what applied it, the generation it was
//! published as, and an opaque ledger) in `<state_dir>/history.sqlite`.
//!
//! The store is `SQLite` (bundled into the binary through rusqlite), one file:
//!
//! ```text
//! versions(number PK, time, hash, source, generation, ledger)
//! files(version → versions.number, position, name, text → texts.id)   PK (version, position)
//! texts(id PK, sha256 UNIQUE, text)
//! ```
//!
//! Each distinct fragment text is stored once (`texts`, keyed by its SHA-256), so a version
//! that changes one fragment of many costs that fragment, not the whole configuration again;
//! the merged text is rebuilt from the files when read ([`Fragments::merged`]), not stored.
//!
//! `PRAGMA application_id` marks the file as Switchyard's and `PRAGMA user_version` is the
//! schema version ([`SCHEMA_VERSION`]), so a newer schema or someone else's database is refused
//! at open instead of being misread.
//!
//! Journal: `SQLite`'s default rollback journal, not WAL. The agent is the only writer and
//! writes a version per apply (rarely), so WAL's concurrency buys nothing; the rollback journal
//! keeps the store one file at rest (no `-wal`/`-shm` beside it to lose when copying it), and
//! needs no shared-memory file, so a read-only directory or mount fails plainly at open.
//! `synchronous = FULL`: a recorded version survives a power cut once [`History::record`]
//! returns. Each version is written in one transaction, so a crash leaves it whole or absent.
//!
//! Every call does blocking file I/O: a record is three or four fsyncs (measured 0.5–20 ms on
//! the 2-vCPU development VM, depending on the disk's load; WAL would be one fsync), an open
//! runs `quick_check` over the whole file. Call it from a blocking context
//! (`tokio::task::spawn_blocking`), after the maps are written, not on the apply's path.

use std::{
    fs,
    io::{self, ErrorKind},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use rusqlite::{Connection, ErrorCode, OptionalExtension as _, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use crate::config::Fragments;

/// The store's file name inside the state directory.
pub const FILE_NAME: &str = "history.sqlite";

/// The schema version this binary writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;

/// `PRAGMA application_id` of a Switchyard history: `SYHI` in ASCII.
pub const APPLICATION_ID: i64 = 0x5359_4849;

/// How long a call waits for a lock held by another process (another agent on the same state
/// directory) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

const SCHEMA: &str = "
CREATE TABLE versions (
    number     INTEGER PRIMARY KEY,  -- 1, 2, 3, … assigned by record()
    time       INTEGER NOT NULL,     -- Unix seconds
    hash       TEXT NOT NULL,        -- Fragments::hash, 64 hex digits
    source     TEXT NOT NULL,        -- what applied it: start, watch, sighup, ctl apply, rollback of N
    generation INTEGER NOT NULL,     -- the data plane generation it was published as
    ledger     TEXT NOT NULL         -- opaque to the store (JSON from the publisher)
) STRICT;
CREATE TABLE texts (
    id     INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,     -- of the text alone, 64 hex digits
    text   TEXT NOT NULL
) STRICT;
CREATE TABLE files (
    version  INTEGER NOT NULL REFERENCES versions(number),
    position INTEGER NOT NULL,       -- merge order, from 0
    name     TEXT NOT NULL,
    text     INTEGER NOT NULL REFERENCES texts(id),
    PRIMARY KEY (version, position)
) STRICT, WITHOUT ROWID;
";

/// What the write at open is, in an error: where it fails, the file or its directory (where the
/// journal goes) cannot be written.
const WRITE_PROBE: &str = "writing the file and its journal beside it in the same directory";

/// Why the history store cannot be opened or used. Each names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The state directory does not exist and cannot be created (or is not a directory).
    #[error("cannot create the state directory {path}: {source}")]
    CreateDir {
        /// The state directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The store file or its directory cannot be written: permissions, a read-only mount, an
    /// immutable attribute. The history needs to write at every apply.
    #[error(
        "the history {path} is read-only ({detail}); the agent must be able to write it and \
         its directory: check the permissions, the mount and `lsattr`"
    )]
    ReadOnly {
        /// The store file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// The file is not a `SQLite` database, is damaged, or is a database of something else.
    #[error(
        "the history {path} is not a usable history store ({detail}); move it aside and the \
         agent starts a new history"
    )]
    Corrupt {
        /// The store file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The store was written by a newer Switchyard with a schema this binary does not know.
    #[error(
        "the history {path} has schema version {found}, newer than this binary's {supported}; \
         run the newer switchyard, or move the file aside to start a new history"
    )]
    TooNew {
        /// The store file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// [`SCHEMA_VERSION`].
        supported: i64,
    },
    /// The store file is missing and cannot be created, for a reason other than permissions.
    #[error("cannot create the history {path}: {source}")]
    CreateFile {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A number does not fit the store (`SQLite` integers are signed 64-bit).
    #[error("{what} {value} is too large for the history (at most {})", i64::MAX)]
    OutOfRange {
        /// `time` or `generation`.
        what: &'static str,
        /// The value.
        value: u64,
    },
    /// Any other failure of the store (I/O error, disk full, locked by another process).
    #[error("the history {path}: {context}: {source}")]
    Store {
        /// The store file.
        path: PathBuf,
        /// What was being done.
        context: &'static str,
        /// `SQLite`'s error.
        source: rusqlite::Error,
    },
}

/// A version to record: the fragments that were applied and how. Its content hash and merged
/// text are those of `fragments`, computed by the store, so they cannot disagree with them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewVersion {
    /// The fragments, in merge order.
    pub fragments: Fragments,
    /// What applied it: `start`, `watch`, `sighup`, `ctl apply`, `rollback of 7`.
    pub source: String,
    /// The generation the data plane was bumped to when it went live.
    pub generation: u64,
    /// Opaque to the store (the publisher's slot assignment, as JSON); returned as given.
    pub ledger: String,
    /// When it was applied, Unix seconds (at most `i64::MAX`).
    pub time: u64,
}

/// A recorded version without its texts: a line of `ctl versions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// 1, 2, 3, … in the order recorded.
    pub number: u64,
    /// When it was applied, Unix seconds.
    pub time: u64,
    /// Content hash, 64 hex digits.
    pub hash: String,
    /// What applied it.
    pub source: String,
    /// The data plane generation it was published as.
    pub generation: u64,
    /// The fragments' file names in merge order.
    pub files: Vec<String>,
}

/// A recorded version, whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// Number, time, hash, source, generation and file names.
    #[serde(flatten)]
    pub info: VersionInfo,
    /// `(file name, text)` in merge order (JSON: `[[name, text], …]`).
    pub texts: Vec<(String, String)>,
    /// The merged text ([`Fragments::merged`] of `texts`).
    pub merged: String,
    /// The ledger, as recorded.
    pub ledger: String,
}

impl Version {
    /// The fragments, to load or apply again.
    #[must_use]
    pub fn fragments(&self) -> Fragments {
        Fragments::new(self.texts.clone())
    }
}

/// The open history store. One per agent; not shared between threads without a lock
/// (`Send`, not `Sync`).
#[derive(Debug)]
pub struct History {
    conn: Connection,
    path: PathBuf,
}

impl History {
    /// Opens `<state_dir>/history.sqlite`, creating the directory (mode 0700; an existing one
    /// is left as it is), the file (mode 0600) and the schema as needed, and checks that the
    /// store is sound (`PRAGMA quick_check`, which reads the whole file: milliseconds for a
    /// store of a few megabytes) and writable.
    ///
    /// # Errors
    ///
    /// - [`HistoryError::CreateDir`]: the directory cannot be created;
    /// - [`HistoryError::ReadOnly`]: the file or the directory cannot be written;
    /// - [`HistoryError::CreateFile`]: the file is missing and cannot be created for another
    ///   reason than permissions;
    /// - [`HistoryError::Corrupt`]: not a `SQLite` database, damaged, or another program's;
    /// - [`HistoryError::TooNew`]: written by a newer Switchyard;
    /// - [`HistoryError::Store`]: any other failure (I/O, locked for more than 2 s).
    pub fn open(state_dir: &Path) -> Result<History, HistoryError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|source| HistoryError::CreateDir {
                path: state_dir.to_owned(),
                source,
            })?;
        let path = state_dir.join(FILE_NAME);
        create_file(&path)?;
        let conn = Connection::open(&path).map_err(|source| HistoryError::Store {
            path: path.clone(),
            context: "open",
            source,
        })?;
        let mut history = History { conn, path };
        history.prepare()?;
        Ok(history)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks the file and creates or checks the schema; see [`History::open`].
    fn prepare(&mut self) -> Result<(), HistoryError> {
        let History { conn, path } = self;
        let path: &Path = path;
        let err = |context: &'static str| move |e| classify(path, context, e);
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(err("set the busy timeout"))?;
        // Garbage fails here with "file is not a database"; a damaged store lists its damage.
        let problems: Vec<String> = {
            let mut stmt = conn
                .prepare("PRAGMA quick_check")
                .map_err(err("check the file"))?;
            let rows = stmt
                .query_map([], |row| row.get::<_, String>(0))
                .map_err(err("check the file"))?;
            rows.collect::<Result<_, _>>()
                .map_err(err("check the file"))?
        };
        if problems != ["ok"] {
            return Err(HistoryError::Corrupt {
                path: path.to_owned(),
                detail: format!("quick_check: {}", problems.join("; ")),
            });
        }
        // SQLite falls back to opening read-only when it cannot open the file for writing
        // (permissions, a read-only mount, `chattr +i`).
        if conn.is_readonly("main").map_err(err("open"))? {
            return Err(HistoryError::ReadOnly {
                path: path.to_owned(),
                detail: "the file cannot be opened for writing".to_owned(),
            });
        }
        conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = FULL;")
            .map_err(err("configure"))?;
        // A write in a transaction proves the file and its directory writable now, not at the
        // first apply: the rollback journal is created beside the file at the first write.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err("begin"))?;
        let app: i64 = tx
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(err("read the application id"))?;
        let version: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err("read the schema version"))?;
        let tables: i64 = tx
            .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
            .map_err(err("read the schema"))?;
        match (app, version) {
            (0, 0) if tables == 0 => {
                let create = format!(
                    "{SCHEMA}PRAGMA application_id = {APPLICATION_ID};\
                     PRAGMA user_version = {SCHEMA_VERSION};"
                );
                tx.execute_batch(&create).map_err(err(WRITE_PROBE))?;
            }
            (APPLICATION_ID, v) if v > SCHEMA_VERSION => {
                return Err(HistoryError::TooNew {
                    path: path.to_owned(),
                    found: v,
                    supported: SCHEMA_VERSION,
                });
            }
            (APPLICATION_ID, SCHEMA_VERSION) => {
                // Rewrites the same value: a real page write, so a read-only directory (no
                // journal) fails here.
                tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION};"))
                    .map_err(err(WRITE_PROBE))?;
            }
            (app, version) => {
                return Err(HistoryError::Corrupt {
                    path: path.to_owned(),
                    detail: format!(
                        "a SQLite database of another program: application_id {app:#x}, \
                         user_version {version}, {tables} schema objects"
                    ),
                });
            }
        }
        tx.commit().map_err(err(WRITE_PROBE))?;
        Ok(())
    }

    /// Records `v` as the next version, in one transaction; returns its number (1 for the
    /// first, then one more than the last).
    ///
    /// # Errors
    ///
    /// [`HistoryError::OutOfRange`] when `time` or `generation` exceeds `i64::MAX` (nothing is
    /// written); [`HistoryError::ReadOnly`] or [`HistoryError::Store`] when the write fails
    /// (nothing is kept of it).
    #[expect(
        clippy::needless_pass_by_value,
        reason = "the version is handed over to be recorded: callers build it for this call"
    )]
    #[expect(
        clippy::cast_possible_wrap,
        reason = "a fragment's position in a list held in memory is far below i64::MAX"
    )]
    pub fn record(&mut self, v: NewVersion) -> Result<u64, HistoryError> {
        let time = to_i64("time", v.time)?;
        let generation = to_i64("generation", v.generation)?;
        let History { conn, path } = self;
        let path: &Path = path;
        let err = |context: &'static str| move |e| classify(path, context, e);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err("begin"))?;
        let number: i64 = tx
            .query_row(
                "SELECT coalesce(max(number), 0) + 1 FROM versions",
                [],
                |r| r.get(0),
            )
            .map_err(err("number the version"))?;
        tx.execute(
            "INSERT INTO versions (number, time, hash, source, generation, ledger) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                number,
                time,
                v.fragments.hash(),
                v.source,
                generation,
                v.ledger
            ],
        )
        .map_err(err("record the version"))?;
        {
            let mut add_text = tx
                .prepare(
                    "INSERT INTO texts (sha256, text) VALUES (?1, ?2) \
                     ON CONFLICT (sha256) DO NOTHING",
                )
                .map_err(err("record the texts"))?;
            let mut text_id = tx
                .prepare("SELECT id FROM texts WHERE sha256 = ?1")
                .map_err(err("record the texts"))?;
            let mut add_file = tx
                .prepare(
                    "INSERT INTO files (version, position, name, text) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(err("record the files"))?;
            for (position, (name, text)) in v.fragments.files().iter().enumerate() {
                let key = sha256_hex(text);
                add_text
                    .execute(params![key, text])
                    .map_err(err("record the texts"))?;
                let id: i64 = text_id
                    .query_row([&key], |r| r.get(0))
                    .map_err(err("record the texts"))?;
                add_file
                    .execute(params![number, position as i64, name, id])
                    .map_err(err("record the files"))?;
            }
        }
        tx.commit().map_err(err("commit"))?;
        // `number` came from max + 1 over non-negative numbers: never negative.
        Ok(number.unsigned_abs())
    }

    /// Every version, oldest first.
    ///
    /// # Errors
    ///
    /// [`HistoryError::Store`] (or [`HistoryError::Corrupt`]) when the store cannot be read.
    pub fn list(&self) -> Result<Vec<VersionInfo>, HistoryError> {
        let err = |context: &'static str| move |e| classify(&self.path, context, e);
        let mut versions: Vec<VersionInfo> = {
            let mut stmt = self
                .conn
                .prepare(
                    "SELECT number, time, hash, source, generation FROM versions ORDER BY number",
                )
                .map_err(err("list the versions"))?;
            let rows = stmt
                .query_map([], info_of)
                .map_err(err("list the versions"))?;
            rows.collect::<Result<_, _>>()
                .map_err(err("list the versions"))?
        };
        let mut stmt = self
            .conn
            .prepare("SELECT version, name FROM files ORDER BY version, position")
            .map_err(err("list the files"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, u64>(0)?, r.get::<_, String>(1)?)))
            .map_err(err("list the files"))?;
        // Both are in version order: walk them together.
        let mut at = 0;
        for row in rows {
            let (version, name) = row.map_err(err("list the files"))?;
            while at < versions.len() && versions[at].number < version {
                at += 1;
            }
            if let Some(v) = versions.get_mut(at).filter(|v| v.number == version) {
                v.files.push(name);
            }
        }
        Ok(versions)
    }

    /// Version `number`, whole; `None` if there is no such version.
    ///
    /// # Errors
    ///
    /// [`HistoryError::Store`] (or [`HistoryError::Corrupt`]) when the store cannot be read.
    pub fn get(&self, number: u64) -> Result<Option<Version>, HistoryError> {
        let Ok(number) = i64::try_from(number) else {
            return Ok(None);
        };
        let err = |context: &'static str| move |e| classify(&self.path, context, e);
        let row = self
            .conn
            .query_row(
                "SELECT number, time, hash, source, generation, ledger \
                 FROM versions WHERE number = ?1",
                [number],
                |r| Ok((info_of(r)?, r.get::<_, String>(5)?)),
            )
            .optional()
            .map_err(err("read the version"))?;
        let Some((mut info, ledger)) = row else {
            return Ok(None);
        };
        let mut stmt = self
            .conn
            .prepare(
                "SELECT files.name, texts.text FROM files JOIN texts ON texts.id = files.text \
                 WHERE files.version = ?1 ORDER BY files.position",
            )
            .map_err(err("read the files"))?;
        let texts: Vec<(String, String)> = stmt
            .query_map([number], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(err("read the files"))?
            .collect::<Result<_, _>>()
            .map_err(err("read the files"))?;
        info.files = texts.iter().map(|(name, _)| name.clone()).collect();
        let fragments = Fragments::new(texts);
        Ok(Some(Version {
            info,
            merged: fragments.merged(),
            texts: fragments.into_files(),
            ledger,
        }))
    }

    /// The last version recorded, whole; `None` while the history is empty.
    ///
    /// # Errors
    ///
    /// [`HistoryError::Store`] (or [`HistoryError::Corrupt`]) when the store cannot be read.
    pub fn latest(&self) -> Result<Option<Version>, HistoryError> {
        let last: Option<u64> = self
            .conn
            .query_row("SELECT max(number) FROM versions", [], |r| r.get(0))
            .map_err(|e| classify(&self.path, "read the last version", e))?;
        match last {
            Some(number) => self.get(number),
            None => Ok(None),
        }
    }
}

/// The columns `number, time, hash, source, generation` of a `versions` row; no file names.
fn info_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<VersionInfo> {
    Ok(VersionInfo {
        number: r.get(0)?,
        time: r.get(1)?,
        hash: r.get(2)?,
        source: r.get(3)?,
        generation: r.get(4)?,
        files: Vec::new(),
    })
}

/// SHA-256 of `text`, 64 lowercase hex digits: the key of a stored text.
fn sha256_hex(text: &str) -> String {
    use sha2::{Digest as _, Sha256};
    use std::fmt::Write as _;
    Sha256::digest(text.as_bytes())
        .iter()
        .fold(String::with_capacity(64), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

fn to_i64(what: &'static str, value: u64) -> Result<i64, HistoryError> {
    i64::try_from(value).map_err(|_| HistoryError::OutOfRange { what, value })
}

/// Creates the store file with mode 0600 if it is missing (`SQLite` would make it 0644: the
/// history holds the whole configuration). An empty file is an empty database.
fn create_file(path: &Path) -> Result<(), HistoryError> {
    let created = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
            ) || e.raw_os_error() == Some(libc::EPERM) =>
        {
            Err(HistoryError::ReadOnly {
                path: path.to_owned(),
                detail: format!("cannot create the file: {e}"),
            })
        }
        Err(source) => Err(HistoryError::CreateFile {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Sorts a `SQLite` error into the variants an operator can act on.
fn classify(path: &Path, context: &'static str, e: rusqlite::Error) -> HistoryError {
    let code = match &e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.code),
        _ => None,
    };
    match code {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => HistoryError::Corrupt {
            path: path.to_owned(),
            detail: e.to_string(),
        },
        // CANTOPEN after the file was opened is the journal: the directory is not writable.
        Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
            HistoryError::ReadOnly {
                path: path.to_owned(),
                detail: format!("{context}: {e}"),
            }
        }
        _ => HistoryError::Store {
            path: path.to_owned(),
            context,
            source: e,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write as _,
        os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    };

    use super::*;

    fn nv(f: &Fragments, source: &str, generation: u64, ledger: &str, time: u64) -> NewVersion {
        NewVersion {
            fragments: f.clone(),
            source: source.to_owned(),
            generation,
            ledger: ledger.to_owned(),
            time,
        }
    }

    fn version(n: u32, source: &str) -> NewVersion {
        let fragments = Fragments::new(vec![
            ("10-web.yaml".to_owned(), format!("# web {n}\n")),
            ("20-pools.yaml".to_owned(), format!("# pools {n}\n")),
        ]);
        nv(
            &fragments,
            source,
            u64::from(n) * 10,
            &format!("{{\"slots\":{n}}}"),
            1_700_000_000 + u64::from(n),
        )
    }

    fn euid() -> u32 {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    }

    /// Whether a test that needs root may run: as root, yes; otherwise it prints why it skips
    /// and returns false, or fails under `CI=true` (a skip is never green in CI).
    fn root_or_skip(test: &str) -> bool {
        if euid() == 0 {
            return true;
        }
        let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
        assert!(!ci, "{test} needs root; CI=true, so a skip is a failure");
        let _ = writeln!(io::stderr(), "\n*** SKIPPED (needs root): {test} ***");
        false
    }

    /// Runs `f` on a thread whose file system identity is `nobody`, so permission bits apply
    /// even when the tests run as root (a thread's fsuid is its own; changing it from 0 drops
    /// the thread's capabilities that bypass permissions). Not root: runs `f` as we are.
    fn as_unprivileged<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            if euid() == 0 {
                // SAFETY: changes only this thread's file system uid; no memory is involved.
                unsafe { libc::setfsuid(65_534) };
                // SAFETY: as above; setfsuid returns the previous value, so a second call
                // reads the current one back.
                let now = unsafe { libc::setfsuid(65_534) };
                assert_eq!(now, 65_534, "setfsuid did not take");
            }
            f()
        })
        .join()
        .expect("the unprivileged thread panicked")
    }

    /// The agent keeps the store behind a lock and returns its errors through anyhow.
    const _: fn() = || {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync + 'static>() {}
        send::<History>();
        send_sync::<HistoryError>();
    };

    #[test]
    fn versions_are_numbered_kept_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("nested/state");
        let mut h = History::open(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(
            fs::metadata(dir.join(FILE_NAME)).unwrap().mode() & 0o777,
            0o600
        );
        assert_eq!(h.list().unwrap(), []);
        assert_eq!(h.latest().unwrap(), None);
        assert_eq!(h.get(1).unwrap(), None);

        assert_eq!(h.record(version(1, "start")).unwrap(), 1);
        assert_eq!(h.record(version(2, "watch")).unwrap(), 2);
        assert_eq!(h.record(version(3, "rollback of 1")).unwrap(), 3);

        let list = h.list().unwrap();
        let numbers: Vec<u64> = list.iter().map(|v| v.number).collect();
        assert_eq!(numbers, [1, 2, 3]);
        assert_eq!(
            list[1],
            VersionInfo {
                number: 2,
                time: 1_700_000_002,
                hash: version(2, "").fragments.hash(),
                source: "watch".to_owned(),
                generation: 20,
                files: vec!["10-web.yaml".to_owned(), "20-pools.yaml".to_owned()],
            }
        );
        let two = h.get(2).unwrap().unwrap();
        let expected = version(2, "watch");
        assert_eq!(two.info, list[1]);
        assert_eq!(two.texts, expected.fragments.files());
        assert_eq!(two.merged, expected.fragments.merged());
        assert_eq!(two.ledger, "{\"slots\":2}");
        assert_eq!(two.fragments().hash(), two.info.hash);
        let json = serde_json::to_string(&two).unwrap();
        assert_eq!(serde_json::from_str::<Version>(&json).unwrap(), two);
        assert_eq!(h.get(4).unwrap(), None);
        assert_eq!(h.get(u64::MAX).unwrap(), None);
        assert_eq!(h.latest().unwrap().unwrap().info.number, 3);

        // Kept across a reopen; numbering goes on.
        drop(h);
        let mut h = History::open(&dir).unwrap();
        assert_eq!(h.list().unwrap(), list);
        assert_eq!(h.record(version(4, "ctl apply")).unwrap(), 4);
        assert_eq!(h.latest().unwrap().unwrap().info.source, "ctl apply");
    }

    #[test]
    fn an_empty_fragment_set_and_odd_texts_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let mut h = History::open(tmp.path()).unwrap();
        let empty = nv(&Fragments::default(), "start", 1, "", 0);
        assert_eq!(h.record(empty.clone()).unwrap(), 1);
        let files = vec![
            (
                "b.yaml".to_owned(),
                "é\u{0}\r\n'\"; DROP TABLE versions;".to_owned(),
            ),
            ("a.yaml".to_owned(), String::new()),
        ];
        let odd = nv(&Fragments::new(files.clone()), "watch", 2, "{}", 5);
        assert_eq!(h.record(odd).unwrap(), 2);
        let one = h.get(1).unwrap().unwrap();
        assert_eq!((one.texts.len(), one.merged.as_str()), (0, ""));
        assert_eq!(one.info.files, Vec::<String>::new());
        // Merge order is kept as given, not sorted.
        assert_eq!(h.get(2).unwrap().unwrap().texts, files);
    }

    #[test]
    fn each_distinct_text_is_stored_once() {
        let tmp = tempfile::tempdir().unwrap();
        let mut h = History::open(tmp.path()).unwrap();
        let big = "# pools\n".repeat(10_000);
        let mut files = vec![
            ("10-web.yaml".to_owned(), "# web 1\n".to_owned()),
            ("20-pools.yaml".to_owned(), big.clone()),
        ];
        for n in 1..=20 {
            files[0].1 = format!("# web {n}\n");
            h.record(nv(&Fragments::new(files.clone()), "watch", n, "{}", n))
                .unwrap();
        }
        // The same text under two names, and twice in one version.
        let twice = vec![
            ("a.yaml".to_owned(), big.clone()),
            ("b.yaml".to_owned(), big),
        ];
        h.record(nv(&Fragments::new(twice.clone()), "watch", 21, "{}", 21))
            .unwrap();
        let texts: i64 = h
            .conn
            .query_row("SELECT count(*) FROM texts", [], |r| r.get(0))
            .unwrap();
        assert_eq!(texts, 21);
        assert_eq!(h.get(7).unwrap().unwrap().texts, {
            files[0].1 = "# web 7\n".to_owned();
            files
        });
        assert_eq!(h.latest().unwrap().unwrap().texts, twice);
    }

    #[test]
    fn a_number_too_large_writes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let mut h = History::open(tmp.path()).unwrap();
        h.record(version(1, "start")).unwrap();
        let mut v = version(2, "watch");
        v.generation = u64::MAX;
        let e = h.record(v).unwrap_err();
        assert!(
            matches!(
                e,
                HistoryError::OutOfRange {
                    what: "generation",
                    ..
                }
            ),
            "{e}"
        );
        let mut v = version(2, "watch");
        v.time = 1 << 63;
        assert!(matches!(
            h.record(v),
            Err(HistoryError::OutOfRange { what: "time", .. })
        ));
        assert_eq!(h.list().unwrap().len(), 1);
        assert_eq!(h.record(version(2, "watch")).unwrap(), 2);
    }

    #[test]
    fn a_write_that_fails_part_way_leaves_no_half_version() {
        let tmp = tempfile::tempdir().unwrap();
        let mut h = History::open(tmp.path()).unwrap();
        h.record(version(1, "start")).unwrap();
        // Make the second file's row fail, after the version row and the first file went in.
        Connection::open(tmp.path().join(FILE_NAME))
            .unwrap()
            .execute_batch(
                "CREATE TRIGGER boom BEFORE INSERT ON files WHEN NEW.name = 'boom.yaml' \
                 BEGIN SELECT RAISE(ABORT, 'boom'); END;",
            )
            .unwrap();
        let files = vec![
            ("10-web.yaml".to_owned(), "a: 1\n".to_owned()),
            ("boom.yaml".to_owned(), "b: 2\n".to_owned()),
        ];
        let e = h
            .record(nv(&Fragments::new(files), "watch", 2, "{}", 2))
            .unwrap_err();
        assert!(matches!(e, HistoryError::Store { .. }), "{e:?}");
        assert_eq!(h.list().unwrap().len(), 1);
        let orphans: i64 = h
            .conn
            .query_row("SELECT count(*) FROM files WHERE version <> 1", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(orphans, 0);
        assert_eq!(h.record(version(2, "watch")).unwrap(), 2);
    }

    #[test]
    fn a_state_dir_that_cannot_be_created_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        fs::write(&file, "x").unwrap();
        let e = History::open(&file.join("state")).unwrap_err();
        assert!(matches!(e, HistoryError::CreateDir { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "cannot create the state directory {}: ",
                file.join("state").display()
            )),
            "{text}"
        );
    }

    #[test]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the garbage bytes are the low bytes of a multiplicative hash"
    )]
    fn garbage_in_the_file_is_corrupt() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(FILE_NAME);
        let garbage: Vec<u8> = (0..8192u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        fs::write(&path, &garbage).unwrap();
        let e = History::open(tmp.path()).unwrap_err();
        assert!(matches!(e, HistoryError::Corrupt { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("file is not a database"), "{text}");
        assert!(text.contains("move it aside"), "{text}");
        // Left as it was: the operator may want to look at it.
        assert_eq!(fs::read(&path).unwrap(), garbage);
    }

    #[test]
    fn a_damaged_store_is_corrupt() {
        let tmp = tempfile::tempdir().unwrap();
        let mut h = History::open(tmp.path()).unwrap();
        // Enough text to fill many pages, so the damage below lands inside a table's pages.
        let big = Fragments::new(vec![("10-web.yaml".to_owned(), "# x\n".repeat(20_000))]);
        h.record(nv(&big, "start", 1, "{}", 1)).unwrap();
        drop(h);
        let path = tmp.path().join(FILE_NAME);
        let mut bytes = fs::read(&path).unwrap();
        assert!(bytes.len() > 16 * 4096, "{}", bytes.len());
        // Overwrite pages 2 to 4 (the schema's root pages and the first data pages).
        for b in &mut bytes[4096..4 * 4096] {
            *b = 0xA5;
        }
        fs::write(&path, &bytes).unwrap();
        let e = History::open(tmp.path()).unwrap_err();
        assert!(matches!(e, HistoryError::Corrupt { .. }), "{e:?}");
    }

    #[test]
    fn another_programs_database_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(FILE_NAME);
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE versions (x); INSERT INTO versions VALUES (1);")
            .unwrap();
        let e = History::open(tmp.path()).unwrap_err();
        assert!(matches!(e, HistoryError::Corrupt { .. }), "{e:?}");
        assert!(e.to_string().contains("another program"), "{e}");
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut h = History::open(tmp.path()).unwrap();
        h.record(version(1, "start")).unwrap();
        drop(h);
        Connection::open(tmp.path().join(FILE_NAME))
            .unwrap()
            .execute_batch("PRAGMA user_version = 2;")
            .unwrap();
        let e = History::open(tmp.path()).unwrap_err();
        assert!(
            matches!(
                e,
                HistoryError::TooNew {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("newer than this binary"), "{e}");
    }

    /// A temporary state directory that an unprivileged thread can enter.
    fn open_tempdir() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        tmp
    }

    #[test]
    fn a_read_only_file_is_refused_at_open() {
        let tmp = open_tempdir();
        let dir = tmp.path().join("state");
        History::open(&dir)
            .unwrap()
            .record(version(1, "start"))
            .unwrap();
        // The directory is writable by anyone; only the file is read-only.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let file = dir.join(FILE_NAME);
        fs::set_permissions(&file, fs::Permissions::from_mode(0o444)).unwrap();
        let before = fs::read(&file).unwrap();
        let e = as_unprivileged(move || History::open(&dir).map(|_| ()));
        let e = e.unwrap_err();
        assert!(matches!(e, HistoryError::ReadOnly { .. }), "{e:?}");
        assert!(e.to_string().contains("read-only"), "{e}");
        assert_eq!(fs::read(&file).unwrap(), before);
    }

    #[test]
    fn a_read_only_directory_is_refused_at_open() {
        let tmp = open_tempdir();
        let dir = tmp.path().join("state");
        History::open(&dir)
            .unwrap()
            .record(version(1, "start"))
            .unwrap();
        // The file is writable by anyone, but no journal can be created beside it.
        let file = dir.join(FILE_NAME);
        fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o555)).unwrap();
        let d = dir.clone();
        let e = as_unprivileged(move || History::open(&d).map(|_| ())).unwrap_err();
        assert!(matches!(e, HistoryError::ReadOnly { .. }), "{e:?}");
        // And with no store yet, the file cannot be created.
        fs::remove_file(&file).unwrap();
        let d = dir.clone();
        let e = as_unprivileged(move || History::open(&d).map(|_| ())).unwrap_err();
        assert!(matches!(e, HistoryError::ReadOnly { .. }), "{e:?}");
        assert!(e.to_string().contains("cannot create the file"), "{e}");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    }

    /// A read-only mount, as root ignores permission bits but not `ro`: a tmpfs mounted in a
    /// mount namespace private to one thread (gone with the thread, so nothing is left behind
    /// even if the test fails), filled, then remounted read-only.
    #[test]
    fn a_read_only_mount_is_refused_at_open() {
        if !root_or_skip("a_read_only_mount_is_refused_at_open") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let result = std::thread::spawn(move || -> Result<HistoryError, String> {
            use std::ffi::CString;
            let c = |s: &str| CString::new(s).unwrap();
            let target = c(dir.to_str().unwrap());
            let check = |what: &str, rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(format!("{what}: {}", io::Error::last_os_error()))
                }
            };
            // SAFETY: unshare with CLONE_NEWNS only changes this thread's mount namespace
            // (CLONE_FS is implied, unsharing this thread's root and cwd, which it never
            // shares back).
            check("unshare", unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
            let none = c("none");
            let tmpfs = c("tmpfs");
            // SAFETY: valid C strings; null data is allowed.
            check("make / private", unsafe {
                libc::mount(
                    none.as_ptr(),
                    c("/").as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            })?;
            // SAFETY: as above.
            check("mount tmpfs", unsafe {
                libc::mount(
                    tmpfs.as_ptr(),
                    target.as_ptr(),
                    tmpfs.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            })?;
            let state = dir.join("state");
            History::open(&state)
                .and_then(|mut h| h.record(version(1, "start")))
                .map_err(|e| e.to_string())?;
            // SAFETY: as above.
            check("remount read-only", unsafe {
                libc::mount(
                    none.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_RDONLY,
                    std::ptr::null(),
                )
            })?;
            let Err(e) = History::open(&state) else {
                return Err("opened on a read-only mount".to_owned());
            };
            // A state directory that does not exist yet cannot be created there either.
            match History::open(&dir.join("other")) {
                Err(HistoryError::CreateDir { .. }) => {}
                other => return Err(format!("new state dir on a read-only mount: {other:?}")),
            }
            Ok(e)
        })
        .join()
        .expect("the mount thread panicked");
        let e = result.unwrap_or_else(|why| panic!("{why}"));
        assert!(matches!(e, HistoryError::ReadOnly { .. }), "{e:?}");
        // The mount was the thread's own: the directory here is still the empty temp dir.
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
