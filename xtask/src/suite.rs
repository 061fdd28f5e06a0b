//! `cargo xtask test`: the workspace's tests as CI runs them, with a summary per test binary.
//!
//! `cargo test --workspace --exclude router-ebpf --features xtask/lab`: `--workspace` means
//! every member, not the default members, and router-ebpf builds only for the BPF target (on
//! the host its `#![no_main]` binary has no `main` to link); it has no tests of its own, the
//! program fixtures test it. `xtask/lab` adds the demo's tests (its config must stay valid as
//! the config language grows).
//!
//! The child gets `CI=true`: the privileged suites then fail instead of skipping when they
//! cannot run (`router_tests::privileged`), so a machine without root or BPF cannot pass.
//! Its output is passed through as it arrives; the lines that name a test binary (stderr) and
//! its result (stdout) are collected for the summary and paired in order: the two pipes are
//! read by separate threads, so only the order within each is reliable, and each binary
//! prints exactly one result line (cargo stops after a binary that fails or crashes).

use std::{
    io::{BufRead as _, BufReader, Read, Write as _},
    process::{ExitCode, Stdio},
    sync::{Arc, Mutex, PoisonError},
    thread,
};

use anyhow::{Context as _, Result};

use crate::workspace::Workspace;

/// A line worth keeping for the summary.
enum Event {
    /// `Running unittests src/lib.rs (target/debug/deps/…)` or `Doc-tests NAME`.
    Binary(String),
    /// `test result: ok. 3 passed; 0 failed; …`.
    Result(String),
    /// `*** SKIPPED (needs root+BPF): … ***` (a failure under CI anyway).
    Skipped(String),
}

/// Runs the suite; exits as `cargo test` did.
pub fn run(ws: &Workspace, extra: &[String]) -> Result<ExitCode> {
    println!(
        "xtask: CI=true cargo test --no-fail-fast --workspace --exclude router-ebpf --features xtask/lab {}",
        extra.join(" ")
    );
    let mut child = ws
        .cargo()
        .args([
            "test",
            "--no-fail-fast",
            "--workspace",
            "--exclude",
            "router-ebpf",
        ])
        .args(["--features", "xtask/lab"])
        .args(ws.profile_args())
        .args(extra)
        .env("CI", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run cargo test")?;
    let events = Arc::new(Mutex::new(Vec::new()));
    let stdout = child.stdout.take().context("no stdout")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let out = forward(stdout, false, events.clone())?;
    let err = forward(stderr, true, events.clone())?;
    let status = child.wait().context("waiting for cargo test")?;
    let _ = out.join();
    let _ = err.join();
    let events = std::mem::take(&mut *events.lock().unwrap_or_else(PoisonError::into_inner));
    print_summary(&events);
    if status.success() {
        Ok(ExitCode::SUCCESS)
    } else {
        println!("cargo test failed ({status})");
        Ok(ExitCode::FAILURE)
    }
}

/// Copies `pipe` line by line to this process's stdout or stderr, keeping summary lines.
fn forward(
    pipe: impl Read + Send + 'static,
    to_stderr: bool,
    events: Arc<Mutex<Vec<Event>>>,
) -> Result<thread::JoinHandle<()>> {
    let handle = thread::Builder::new().spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                let _ = writeln!(std::io::stderr(), "{line}");
            } else {
                let _ = writeln!(std::io::stdout(), "{line}");
            }
            let t = line.trim();
            let event = if let Some(rest) = t.strip_prefix("Running ") {
                Some(Event::Binary(short_binary(rest)))
            } else if let Some(rest) = t.strip_prefix("Doc-tests ") {
                Some(Event::Binary(format!("doc-tests {rest}")))
            } else if t.starts_with("test result:") {
                Some(Event::Result(t.to_owned()))
            } else if t.contains("SKIPPED (needs root+BPF)") {
                Some(Event::Skipped(t.trim_matches('*').trim().to_owned()))
            } else {
                None
            };
            if let Some(e) = event {
                events
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(e);
            }
        }
    })?;
    Ok(handle)
}

/// `unittests src/lib.rs (target/debug/deps/rules-0123abcd)` → `rules: unittests src/lib.rs`;
/// `tests/system.rs (target/debug/deps/system-0123abcd)` → `system: tests/system.rs`.
fn short_binary(running: &str) -> String {
    let Some((what, path)) = running.rsplit_once(" (") else {
        return running.to_owned();
    };
    let file = path
        .trim_end_matches(')')
        .rsplit('/')
        .next()
        .unwrap_or(path);
    let name = file.rsplit_once('-').map_or(file, |(n, _)| n);
    format!("{name}: {what}")
}

/// Counts from a `test result:` line: (passed, failed, ignored).
fn counts(result: &str) -> (u64, u64, u64) {
    let mut c = (0, 0, 0);
    for part in result.split([';', '.']) {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => c.0 += n,
            "failed" => c.1 += n,
            "ignored" => c.2 += n,
            _ => {}
        }
    }
    c
}

fn print_summary(events: &[Event]) {
    println!("\n== test summary ==");
    let mut binaries = events.iter().filter_map(|e| match e {
        Event::Binary(name) => Some(name.as_str()),
        _ => None,
    });
    let (mut passed, mut failed, mut ignored, mut suites) = (0, 0, 0, 0);
    for e in events {
        if let Event::Result(line) = e {
            let (p, f, i) = counts(line);
            passed += p;
            failed += f;
            ignored += i;
            suites += 1;
            let verdict = if f == 0 && line.contains(" ok.") {
                "ok"
            } else {
                "FAILED"
            };
            println!(
                "  {verdict:<6} {:<58} {p:>4} passed {f:>3} failed {i:>3} ignored",
                binaries.next().unwrap_or("?")
            );
        }
    }
    if let Some(crashed) = binaries.next() {
        println!("  CRASH  {crashed:<58} (no result line)");
    }
    for e in events {
        if let Event::Skipped(line) = e {
            println!("  SKIP   {line}");
        }
    }
    println!(
        "  total: {passed} passed, {failed} failed, {ignored} ignored in {suites} test binaries"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_names_are_shortened() {
        assert_eq!(
            short_binary("unittests src/lib.rs (target/debug/deps/rules-0123abcd)"),
            "rules: unittests src/lib.rs"
        );
        assert_eq!(
            short_binary("tests/system.rs (target/debug/deps/system-77aa)"),
            "system: tests/system.rs"
        );
    }

    #[test]
    fn result_lines_are_counted() {
        let line = "test result: ok. 12 passed; 1 failed; 3 ignored; 0 measured; 0 filtered out; \
                    finished in 0.05s";
        assert_eq!(counts(line), (12, 1, 3));
    }
}
