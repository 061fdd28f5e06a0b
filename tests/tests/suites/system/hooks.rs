//! The whole system in network namespaces — hooks (`hooks:`): a command hook of the real agent
//! records a switch, a backend's health transition and a rejected config change; a hook that
//! hangs does not hold up switches (their latency is measured with and without it) and is
//! counted as timed out.
//!
//! Every test runs the TCP service `web` on the IPv4 VIP, decided by group `g`: pool `p1` (b1)
//! while the push variable `maint` is false, pool `p2` (b2) while it is true.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4},
    agent::{Agent, temp_dir},
    config_text::{ConfigText, FAST_HTTP_CHECK, Group},
};
use serde_json::Value;

use crate::common::{BROKEN, Lb, ctl, metric};

/// Switches measured with and without the hanging hook.
const SWITCHES: usize = 20;
const _: () = assert!(SWITCHES.is_multiple_of(2), "each round leaves maint false");

/// The fragment under `pin`: the service, pools `p1` and `p2` (health-checked when `checked`),
/// `maint`, group `g`, then `hooks` (a `hooks:` section, or nothing).
fn fragment(pin: &str, checked: bool, hooks: &str) -> String {
    let check = checked.then_some(FAST_HTTP_CHECK);
    let group = Group::new("g")
        .rule("normal", 100, "NOT maint", "p1")
        .rule("maintenance", 90, "maint", "p2")
        .default_pool("p1");
    let text = ConfigText::at_pin_path(pin)
        .deciding_service("web", VIP_V4.into(), "tcp", "dsr-l2", "g")
        .pool("p1", &[(backend_v4(1).into(), 100)], check)
        .pool("p2", &[(backend_v4(2).into(), 100)], check)
        .state("maint", "{ push: { default: false } }")
        .decision(&group)
        .text();
    format!("{text}{hooks}")
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The events the hook wrote to `file`, one JSON document a line.
fn events(file: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("event line {l:?}")))
        .collect()
}

/// Polls `file` every 50 ms until its events satisfy `pred` (up to `limit`).
fn wait_events(
    agent: &Agent,
    file: &Path,
    limit: Duration,
    what: &str,
    pred: impl Fn(&[Value]) -> bool,
) -> Result<Vec<Value>> {
    let start = Instant::now();
    loop {
        let got = events(file)?;
        if pred(&got) {
            return Ok(got);
        }
        if start.elapsed() > limit {
            bail!(
                "no {what} within {limit:?}; events: {got:#?}\nlog:\n{}",
                agent.log_text()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_command_hook_gets_switches_health_transitions_and_rejected_configs() -> Result<()> {
    let dir = TempDir(temp_dir("hook-events")?);
    let file = dir.0.join("events.jsonl");
    // One event a line: the JSON on standard input, then a newline.
    let hooks = format!(
        "hooks:\n  - name: record\n    command: [/bin/sh, -c, 'cat >> {f}; echo >> {f}']\n",
        f = file.display()
    );
    let Some(lb) = Lb::start("hooks_record", 2, |pin| fragment(pin, true, &hooks))? else {
        return Ok(());
    };
    lb.agent.wait_for(Duration::from_secs(10), |s| {
        s.pools.iter().flat_map(|p| &p.backends).all(|b| b.healthy)
    })?;

    // A switch: the operator's state set.
    ctl(&lb.agent, &["state", "set", "maint=true"])?;
    let got = wait_events(&lb.agent, &file, Duration::from_secs(5), "switch", |e| {
        e.iter()
            .any(|v| v["kind"] == "switch" && v["to"] == "pool=p2")
    })?;
    let switch = got
        .iter()
        .find(|v| v["kind"] == "switch" && v["to"] == "pool=p2")
        .context("switch")?;
    println!("switch event: {switch}");
    ensure!(switch["group"] == "g", "{switch}");
    ensure!(switch["from"] == "pool=p1", "{switch}");
    ensure!(
        switch["by"] == "rule" && switch["rule"] == "maintenance",
        "{switch}"
    );
    ensure!(switch["cause"] == "state set maint=true", "{switch}");
    ensure!(switch["time"].as_u64().is_some_and(|t| t > 0), "{switch}");

    // A health transition: b1's health endpoint fails.
    lb.servers[0].set_healthy(false);
    let b1 = backend_v4(1).to_string();
    let is_down =
        |v: &Value| v["kind"] == "health" && v["backend"] == b1.as_str() && v["to"] == "down";
    let got = wait_events(
        &lb.agent,
        &file,
        Duration::from_secs(5),
        "health event",
        |e| e.iter().any(is_down),
    )?;
    let health = got.iter().find(|v| is_down(v)).context("health")?;
    println!("health event: {health}");
    ensure!(health["pool"] == "p1" && health["from"] == "up", "{health}");
    ensure!(health["detail"].as_str().is_some(), "{health}");

    // A rejected change of the directory, read by the watch.
    std::fs::write(lb.agent.dir().join("20-broken.yaml"), BROKEN)?;
    let got = wait_events(&lb.agent, &file, Duration::from_secs(5), "rejection", |e| {
        e.iter().any(|v| v["kind"] == "config_rejected")
    })?;
    let rejected = got
        .iter()
        .find(|v| v["kind"] == "config_rejected")
        .context("rejection")?;
    println!("config_rejected event: {rejected}");
    ensure!(rejected["source"] == "watch", "{rejected}");
    let errors: Vec<&str> = rejected["errors"]
        .as_array()
        .context("errors")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ensure!(
        errors.len() == 2 && errors.iter().all(|e| e.starts_with("20-broken.yaml:")),
        "{errors:?}"
    );

    // Counted: every run succeeded.
    let status = lb.agent.status()?;
    let hook = status.hooks.first().context("no hook in status")?;
    println!("status: {hook:?}");
    ensure!(hook.name == "record" && hook.ok >= 3, "{hook:?}");
    ensure!(
        hook.failed == 0 && hook.timeout == 0 && hook.dropped == 0,
        "{hook:?}"
    );
    let ok = metric(
        &lb.agent,
        "switchyard_hook_runs_total{hook=\"record\",result=\"ok\"}",
    )?;
    ensure!(ok >= 3.0, "hook_runs ok = {ok}");
    Ok(())
}

/// Every switch of group `g` the operator's `state set` caused: its event-to-map-write latency,
/// µs, in order.
fn state_set_latencies(agent: &Agent) -> Result<Vec<u64>> {
    let records: Value = serde_json::from_str(&agent.api_get("/decisions?group=g")?)?;
    records
        .as_array()
        .context("decisions")?
        .iter()
        .filter(|r| {
            r["kind"] == "switch"
                && r["cause"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("state set"))
        })
        .map(|r| r["latency_us"].as_u64().context("a switch without latency"))
        .collect()
}

/// [`SWITCHES`] switches of `g`, `maint` flipped each time from false: each switch's latency
/// from the agent's audit trail (the API taking `state set` → the decision word written) and
/// each `ctl state set`'s round trip as the operator sees it (the CLI started → its answer,
/// which the agent sends once the switch is written and the hooks offered it), µs.
fn flip(agent: &Agent) -> Result<(Vec<u64>, Vec<u64>)> {
    let before = state_set_latencies(agent)?.len();
    // An even number of flips from false: `maint` is false again after each round.
    let mut value = false;
    let mut round_trips = Vec::new();
    for _ in 0..SWITCHES {
        value = !value;
        let start = Instant::now();
        ctl(agent, &["state", "set", &format!("maint={value}")])?;
        round_trips.push(u64::try_from(start.elapsed().as_micros())?);
    }
    let all = state_set_latencies(agent)?;
    ensure!(
        all.len() == before + SWITCHES,
        "{} switches for {SWITCHES} flips",
        all.len() - before
    );
    Ok((all[before..].to_vec(), round_trips))
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

#[test]
fn a_hanging_hook_does_not_delay_switches() -> Result<()> {
    let Some(lb) = Lb::start("hooks_hanging", 2, |pin| fragment(pin, false, ""))? else {
        return Ok(());
    };
    // The group's first decision, at start.
    lb.agent.wait_for(Duration::from_secs(10), |s| {
        s.pools.iter().flat_map(|p| &p.backends).all(|b| b.healthy)
    })?;
    let (without, without_rt) = flip(&lb.agent)?;

    // The same agent with a hook that never returns on every switch.
    let hooks = "hooks:\n  - { name: hang, command: [sleep, \"3600\"], events: [switch], \
                 timeout: 300ms }\n";
    lb.agent
        .write_file("10-web.yaml", &fragment(&lb.pin, false, hooks))?;
    lb.agent.reload()?;
    lb.agent
        .wait_for(Duration::from_secs(5), |s| s.hooks.len() == 1)?;
    let (with, with_rt) = flip(&lb.agent)?;

    // The hook ran (and was killed) while the switches went on.
    let start = Instant::now();
    let hook = loop {
        let status = lb.agent.status()?;
        let hook = status.hooks.first().context("no hook")?.clone();
        if hook.timeout >= 1 || start.elapsed() > Duration::from_secs(5) {
            break hook;
        }
        thread::sleep(Duration::from_millis(50));
    };
    println!(
        "HOOKS switches={SWITCHES} switch_latency_median_us without={} with={} \
         state_set_round_trip_median_us without={} with={}",
        median(without.clone()),
        median(with.clone()),
        median(without_rt),
        median(with_rt),
    );
    println!("switch latencies, µs: without {without:?}; with {with:?}; hook: {hook:?}");
    ensure!(hook.timeout >= 1 && hook.ok == 0, "{hook:?}");
    ensure!(
        hook.last_failure.as_deref() == Some("timed out after 300ms"),
        "{hook:?}"
    );
    let timeouts = metric(
        &lb.agent,
        "switchyard_hook_runs_total{hook=\"hang\",result=\"timeout\"}",
    )?;
    ensure!(timeouts >= 1.0, "hook_runs timeout = {timeouts}");
    Ok(())
}
