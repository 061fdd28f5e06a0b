//! The CLI and API of a running agent, as the suites ask them: `ctl`, metrics, the generation.

use std::time::Duration;

use anyhow::{Result, ensure};
use router_tests::agent::{Agent, Exited};

use super::LIVE_LIMIT;

pub fn dir_arg(agent: &Agent) -> String {
    agent.dir().display().to_string()
}

/// `switchyard ctl --config-dir DIR ARGS…`: its stdout, or its stderr as the error.
pub fn ctl(agent: &Agent, args: &[&str]) -> Result<String> {
    let dir = dir_arg(agent);
    let mut full = vec!["ctl", "--config-dir", dir.as_str()];
    full.extend_from_slice(args);
    agent.cli(&full)
}

/// A metric's value from `/metrics` (0 when absent).
pub fn metric(agent: &Agent, name: &str) -> Result<f64> {
    let text = agent.api_get("/metrics")?;
    Ok(text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0))
}

/// Waits until metric `name` reaches `at_least`: a history record completes on its own thread
/// after the maps are live, so its success or failure shows a moment later.
pub fn wait_metric(agent: &Agent, name: &str, at_least: f64) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        let value = metric(agent, name)?;
        if value >= at_least {
            return Ok(());
        }
        ensure!(
            start.elapsed() < LIVE_LIMIT,
            "{name} is {value}, not {at_least}, after {LIVE_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The generation the agent runs.
pub fn generation(agent: &Agent) -> Result<u64> {
    Ok(agent.status()?.generation)
}

/// Waits until the generation passes `after`; returns how long that took.
pub fn live_after(agent: &Agent, after: u64) -> Result<Duration> {
    agent.wait_for(LIVE_LIMIT, |s| s.generation > after && s.rejected.is_none())
}

/// Checks a refused start: non-zero exit, `want` in its output, no panic.
pub fn refused(what: &str, exited: &Exited, want: &str) -> Result<()> {
    println!(
        "{what}: {}; output:\n{}",
        exited.status,
        exited.output.trim_end()
    );
    ensure!(!exited.status.success(), "{what}: exited successfully");
    ensure!(exited.status.code() == Some(1), "{what}: {}", exited.status);
    ensure!(
        exited.output.contains(want),
        "{what}: output lacks {want:?}"
    );
    ensure!(!exited.output.contains("panicked"), "{what}: panicked");
    Ok(())
}
