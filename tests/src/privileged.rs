//! The privilege guard for T1/T2 suites: run when root with working BPF, skip loudly
//! otherwise, and fail instead of skipping under CI (a skip is never green in CI).
//!
//! ```no_run
//! # use router_tests::privileged::require_root_and_bpf;
//! #[test]
//! fn client_reaches_a_backend() {
//!     if require_root_and_bpf("client_reaches_a_backend").is_err() {
//!         return;
//!     }
//!     // … build a Topology …
//! }
//! ```

use std::fmt;
use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::xdp_pass;

/// Tools the namespace harness runs.
pub const REQUIRED_TOOLS: &[&str] = &["ip", "ethtool", "sysctl"];

/// Why a privileged test did not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The test that skipped.
    pub test: String,
    /// What was missing.
    pub reason: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SKIPPED (needs root+BPF): {}: {}",
            self.test, self.reason
        )
    }
}

impl std::error::Error for Skipped {}

/// Whether this is a CI run (`CI=true`, as CI systems and `.ci/run` set it; `1` also counts).
#[must_use]
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Returns `Ok(())` when the process is root, can load an XDP program, and has
/// [`REQUIRED_TOOLS`]. Otherwise prints a `SKIPPED (needs root+BPF): …` line straight to
/// stderr (past the test harness's capture) and returns `Err` so the test can return early.
///
/// # Errors
///
/// [`Skipped`], naming the test and what is missing, when a requirement is not met.
///
/// # Panics
/// Instead of returning `Err` when [`in_ci`]: under CI a skip is a failure.
pub fn require_root_and_bpf(test_name: &str) -> Result<(), Skipped> {
    require(test_name, &[])
}

/// Like [`require_root_and_bpf`], also requiring the commands in `extra_tools` (e.g. `nft`).
///
/// # Errors
///
/// As [`require_root_and_bpf`], for a missing tool too.
///
/// # Panics
/// Instead of returning `Err` when [`in_ci`].
pub fn require(test_name: &str, extra_tools: &[&str]) -> Result<(), Skipped> {
    let Err(reason) = probe(extra_tools) else {
        return Ok(());
    };
    let skipped = Skipped {
        test: test_name.to_owned(),
        reason,
    };
    // Written to the process's stderr, not through eprintln!, so `cargo test` shows it even
    // for a passing test.
    let _ = writeln!(std::io::stderr(), "\n*** {skipped} ***");
    assert!(!in_ci(), "{skipped} — CI=true, so a skip is a failure");
    Err(skipped)
}

fn probe(extra_tools: &[&str]) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(format!("running as uid {euid}, not root"));
    }
    if let Err(e) = xdp_pass::load() {
        return Err(format!("cannot load an XDP program with bpf(2): {e}"));
    }
    for tool in REQUIRED_TOOLS.iter().chain(extra_tools) {
        if !tool_runs(tool) {
            return Err(format!("`{tool}` is not installed or does not run"));
        }
    }
    Ok(())
}

fn tool_runs(tool: &str) -> bool {
    let arg = match tool {
        "ip" | "sysctl" => "-V",
        "etcdctl" | "openssl" => "version",
        _ => "--version",
    };
    Command::new(tool)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_message_names_the_test_and_reason() {
        let s = Skipped {
            test: "t".into(),
            reason: "not root".into(),
        };
        assert_eq!(s.to_string(), "SKIPPED (needs root+BPF): t: not root");
    }
}
