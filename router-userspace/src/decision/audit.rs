//! The audit file: one JSON line per record, appended; read back on start so the trail
//! survives an agent restart. Failures are logged, never fatal.

use std::{
    fs::{File, OpenOptions},
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
};

use rules::engine::AuditRecord;

/// `<state_dir>/audit.jsonl`.
#[derive(Debug)]
pub struct AuditFile {
    path: PathBuf,
    file: Option<File>,
}

impl AuditFile {
    /// Opens (creating the directory and the file) `dir/audit.jsonl` for appending.
    #[must_use]
    pub fn open(dir: &Path) -> Self {
        let path = dir.join("audit.jsonl");
        let file = std::fs::create_dir_all(dir)
            .and_then(|()| OpenOptions::new().create(true).append(true).open(&path));
        let file = match file {
            Ok(f) => Some(f),
            Err(e) => {
                log::error!(
                    "audit log {}: {e}; audit records stay in memory only",
                    path.display()
                );
                None
            }
        };
        Self { path, file }
    }

    /// Its path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record.
    pub fn append(&mut self, record: &AuditRecord) {
        let Some(f) = &mut self.file else { return };
        let line = match record.to_json_line() {
            Ok(l) => l,
            Err(e) => return log::error!("audit record: {e}"),
        };
        if let Err(e) = writeln!(f, "{line}") {
            log::error!("audit log {}: {e}", self.path.display());
        }
    }

    /// The last `n` readable records of the file.
    pub fn read_tail(&self, n: usize) -> Vec<AuditRecord> {
        let Ok(f) = File::open(&self.path) else {
            return Vec::new();
        };
        let mut all: Vec<AuditRecord> = BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| AuditRecord::from_json_line(&l).ok())
            .collect();
        let skip = all.len().saturating_sub(n);
        all.drain(..skip);
        all
    }
}

/// The audit trail: the in-memory ring `ctl decisions` reads, and the file it is appended to.
#[derive(Debug)]
pub struct Audit {
    /// The ring.
    pub log: rules::engine::AuditLog,
    file: Option<AuditFile>,
}

impl Audit {
    /// A ring of `capacity` records; with `file`, seeded with the records a previous run left
    /// there, and appended to from now on.
    #[must_use]
    pub fn new(capacity: usize, file: Option<AuditFile>) -> Self {
        let mut log = rules::engine::AuditLog::new(capacity);
        if let Some(f) = &file {
            for r in f.read_tail(capacity) {
                log.push(r);
            }
        }
        Self { log, file }
    }

    /// Keeps `record`, stamped with the wall-clock time.
    pub fn push(&mut self, mut record: AuditRecord) {
        record.at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let seq = self.log.push(record);
        if let (Some(f), Some(r)) = (&mut self.file, self.log.get(seq)) {
            f.append(r);
        }
    }
}
