//! Configuration: every `*.yaml` fragment of a directory, parsed, merged and validated into one
//! [`Config`].
//!
//! The pipeline is parse → validate → convert:
//! - `load` finds the fragments, parses each with positions (marked-yaml), and deserializes
//!   each item (the agent, the conntrack timeouts, a service, a pool) into the serde shapes of
//!   `spec`, which reject unknown keys; a broken item does not stop the others;
//! - `validate` checks the whole merged configuration (names, references, address families,
//!   limits of the data plane, every rule expression against [`schema`]) and converts it into
//!   the runtime types of [`model`];
//! - [`lint`] then warns about decision groups that are valid but suspicious.
//!
//! [`read_dir`] is the one way a directory is read ([`load_dir`] is `read_dir` then load); its
//! [`Fragments`] (names and texts) give a version's content hash and merged text, and
//! [`diff`] compares two configurations resource by resource.
//!
//! Every problem found is reported, each with its file, line, key path and, where one helps, a
//! hint: see [`ConfigError`]. A [`Config`] is produced only when there is none.
//!
//! The keys are documented for operators in `docs/configuration.md`.

pub mod compiled;
pub mod diff;
pub mod model;
pub mod schema;

mod fragments;
mod lint;
mod load;
mod report;
mod spec;
mod validate;

/// The API token in `agent.api_token_file` (`path`), as the agent and the CLI read it.
///
/// # Errors
///
/// The file cannot be read or holds no usable token (the message says which, and what a token
/// looks like).
pub fn api_token(path: &std::path::Path) -> Result<String, String> {
    validate::read_token(path).map_err(|(message, hint)| match hint {
        Some(h) => format!("{message}; {h}"),
        None => message,
    })
}
mod values;

use std::fmt;

pub use diff::Diff;
pub use fragments::Fragments;
pub use lint::lint;
pub use load::{DirFragments, is_fragment, is_node_local, load_dir, load_files, read_dir};
pub use model::{
    Adaptive, Agent, AgentCheck, Announce, Backend, Backoff, CheckKind, ClientClass, Config,
    Conntrack, DEFAULT_ANNOUNCE_INTERFACE, DEFAULT_ANNOUNCE_PROTOCOL, DEFAULT_ANNOUNCE_TABLE,
    DEFAULT_PIN_PATH, Fleet, FleetTls, FlowPolicy, Forward, HashMode, HealthCheck, Hook, HookEvent,
    HookTarget, MAX_HOST_PORTS, Pool, Protocol, Service, SourceRange, SplitBy, SplitShare, Target,
    Vip, WhenAllDown,
};
pub use model::{DNS_RECORD_TYPES, TlsOptions};

/// One thing wrong with a configuration, located as precisely as the input allows.
///
/// Displayed as `FILE:LINE PATH: MESSAGE; HINT`, for example
/// `10-web.yaml:14 services[0].to.pool: unknown pool "dc3"; did you mean "dc2"?` (the line, the
/// path and the hint are left out where there is none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The fragment's file name (or the directory, for a problem with the directory itself).
    pub file: String,
    /// 1-based line, where known.
    pub line: Option<usize>,
    /// 1-based column, where known.
    pub column: Option<usize>,
    /// Key path inside the file, such as `services[0].to.pool`; empty for the file as a whole.
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it: a suggestion (`did you mean "dc2"?`), the other location of a duplicate,
    /// or when a feature that is not supported yet arrives.
    pub hint: Option<String>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.path.is_empty() {
            write!(f, " {}", self.path)?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "; {hint}")?;
        }
        Ok(())
    }
}

/// A configuration that cannot be used, with every problem found in it (never empty), in file
/// order, then line order.
///
/// Its `Display` lists the problems one per line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", Lines(.problems))]
pub struct ConfigError {
    /// Every problem found.
    pub problems: Vec<Problem>,
}

/// Displays problems one per line.
struct Lines<'a>(&'a [Problem]);

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}
