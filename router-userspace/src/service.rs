//! The agent as a systemd service (`switchyard.service` of the Debian package, decision 0030):
//! readiness notifications over `$NOTIFY_SOCKET` (`sd_notify`), log lines that journald files
//! under their priority, and the interfaces the unit names in `$SWITCHYARD_IFACES`.
//!
//! Outside systemd every notification is a no-op (no `NOTIFY_SOCKET`) and log lines keep their
//! timestamped form.

use std::io::Write as _;

use log::{Level, warn};
use sd_notify::NotifyState;

/// The environment variable `switchyard attach` reads its interfaces from when no `--iface` is
/// given: names separated by spaces or commas (`/etc/default/switchyard`).
pub const IFACES_ENV: &str = "SWITCHYARD_IFACES";

/// Sends `states` to the service manager; a failure is logged, never fatal (the agent runs on
/// without a manager that listens).
fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        warn!("telling the service manager {states:?}: {e}");
    }
}

/// `READY=1` and a `STATUS=` line: the program is attached and the config is in the maps (at
/// start), or a reload is done.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// `RELOADING=1` with the monotonic time (which systemd 253 and later require with it): a
/// reload (SIGHUP) starts; [`ready`] ends it.
pub fn reloading() {
    notify(&[
        NotifyState::Reloading,
        NotifyState::monotonic_usec_now().unwrap_or(NotifyState::Status("reloading")),
    ]);
}

/// `STOPPING=1`: the agent exits (SIGTERM or SIGINT); the program stays attached.
pub fn stopping() {
    notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping; the program stays attached"),
    ]);
}

/// The interfaces named in a `SWITCHYARD_IFACES` value: separated by spaces, tabs or commas,
/// empty names skipped.
#[must_use]
pub fn interfaces_from(value: &str) -> Vec<String> {
    value
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The `sd-daemon(3)` priority prefix of a log line of `level` (`<3>` error … `<7>` debug),
/// which journald strips and files the line under.
#[must_use]
pub fn journal_prefix(level: Level) -> &'static str {
    match level {
        Level::Error => "<3>",
        Level::Warn => "<4>",
        Level::Info => "<6>",
        Level::Debug | Level::Trace => "<7>",
    }
}

/// Whether stderr is the journal's stream: `$JOURNAL_STREAM` (`DEVICE:INODE`, set by systemd)
/// names the file stderr is open on. A child that inherited the variable but writes elsewhere
/// (a redirect) keeps the plain form.
#[must_use]
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    // SAFETY: fstat only writes the struct it is given; an all-zero `stat` is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd 2 and a valid, exclusively borrowed `stat`.
    if unsafe { libc::fstat(2, &raw mut st) } != 0 {
        return false;
    }
    st.st_dev == dev && st.st_ino == ino
}

/// The prefix of a line printed straight to stderr at `level` (the last error of a command):
/// [`journal_prefix`] when stderr is the journal, else nothing.
#[must_use]
pub fn stderr_prefix(level: Level) -> &'static str {
    if stderr_is_journal() {
        journal_prefix(level)
    } else {
        ""
    }
}

/// Starts the logger (`RUST_LOG`, `info` by default): to the journal, each line with its
/// priority prefix and without a timestamp (journald keeps its own); elsewhere with a
/// millisecond timestamp.
pub fn init_logging() {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if stderr_is_journal() {
        builder.format(|buf, record| {
            writeln!(
                buf,
                "{}{}: {}",
                journal_prefix(record.level()),
                record.target(),
                record.args()
            )
        });
    } else {
        builder.format_timestamp_millis();
    }
    builder.init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_are_split_on_spaces_and_commas() {
        assert_eq!(
            interfaces_from(" eth0  eth1,eth2,\teth3 "),
            ["eth0", "eth1", "eth2", "eth3"]
        );
        assert!(interfaces_from("").is_empty());
        assert!(interfaces_from(" , ").is_empty());
    }

    #[test]
    fn each_level_has_its_journal_priority() {
        assert_eq!(journal_prefix(Level::Error), "<3>");
        assert_eq!(journal_prefix(Level::Warn), "<4>");
        assert_eq!(journal_prefix(Level::Info), "<6>");
        assert_eq!(journal_prefix(Level::Debug), "<7>");
    }
}
