//! The whole system in network namespaces — a canary ramp: decision group `web` sends new
//! flows of one TCP `dsr-l2` service to pool `stable` (b1) and ramps a share of them onto pool
//! `canary` (b2), both health-checked. The ramp steps up; then the canary's health check fails
//! (its health server stops), `rollback_when` turns true, and the share goes to zero: `ctl
//! canary status` and the audit trail say `rolled_back`, and new connections all reach b1.
//!
//! The ramp is added by an apply once both backends are known healthy (the first evaluation
//! would otherwise read the canary's health before its first verdict). Assertions are on the
//! ramp's states, not on when they came.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_name, backend_v4, vip_v4},
    agent::Agent,
    client::tcp_tally,
    config_text::{ConfigText, FAST_HTTP_CHECK},
    netns::Topology,
    privileged, servers,
};
use serde_json::Value;
use switchyard::api::status::Status;

/// The config: both pools, the service and the group, with `canary` (a YAML line) if given.
fn config(pin: &str, canary: Option<&str>) -> String {
    format!(
        r#"agent:
  pin_path: {pin}
services:
  - {{ name: web, vip: "{vip}", port: 80, protocol: tcp, forward: dsr-l2, to: {{ decide: web }} }}
pools:
  - name: stable
    backends: [ {{ address: "{b1}" }} ]
    health_check: {check}
  - name: canary
    backends: [ {{ address: "{b2}" }} ]
    health_check: {check}
decisions:
  - name: web
    rules:
      - {{ id: stable, when: "true", then: {{ pool: stable }} }}
{canary}"#,
        vip = VIP_V4,
        b1 = backend_v4(1),
        b2 = backend_v4(2),
        check = FAST_HTTP_CHECK,
        canary = canary.map_or(String::new(), |c| format!("    canary: {c}\n")),
    )
}

/// Five steps two seconds apart: the ramp is still running seconds after its second step,
/// when the canary's health check fails.
const CANARY: &str = "{ pool: canary, steps: [5%, 25%, 50%, 75%, 100%], hold: 2s, \
                      rollback_when: \"pool.canary.healthy_ratio < 0.9\" }";

/// `switchyard ctl --config-dir DIR ARGS…`.
fn ctl(agent: &Agent, args: &[&str]) -> Result<String> {
    let dir = agent.dir().display().to_string();
    let mut all = vec!["ctl", "--config-dir", dir.as_str()];
    all.extend_from_slice(args);
    agent.cli(&all)
}

/// `ctl canary status web --json`.
fn ramp(agent: &Agent) -> Result<Value> {
    let text = ctl(agent, &["canary", "status", "web", "--json"])?;
    serde_json::from_str(&text).with_context(|| format!("canary status {text:?}"))
}

/// Polls the ramp every 50 ms until `pred` holds.
fn wait_ramp(agent: &Agent, limit: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value> {
    let start = Instant::now();
    loop {
        let r = ramp(agent)?;
        if pred(&r) {
            return Ok(r);
        }
        if start.elapsed() > limit {
            bail!(
                "ramp not reached within {limit:?}: {r:#}\nlog:\n{}",
                agent.log_text()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The group's audit trail (`ctl decisions --group web --json`).
fn decisions(agent: &Agent) -> Result<Vec<Value>> {
    let text = ctl(agent, &["decisions", "--group", "web", "--json"])?;
    serde_json::from_str(&text).with_context(|| format!("the audit trail {text:?}"))
}

/// The ramp's share switches in the audit trail: (`canary.state`, `canary.share`, to).
fn canary_switches(records: &[Value]) -> Vec<(String, String, String)> {
    records
        .iter()
        .filter(|r| r["kind"] == "switch" && r["switch"] == "canary")
        .map(|r| {
            let s = |k: &str| r["values"][k].as_str().unwrap_or_default().to_owned();
            (s("canary.state"), s("canary.share"), r["to"].to_string())
        })
        .collect()
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn the_canary_ramp_steps_up_and_rolls_back_when_the_canary_fails() -> Result<()> {
    if privileged::require_root_and_bpf("the_canary_ramp_steps_up_and_rolls_back").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let mut servers = servers::start_all(&topo)?;
    let pin = ConfigText::new().pin_path().to_owned();
    let agent = Agent::start(&topo, &[("10-web.yaml", config(&pin, None))])?;
    let all_healthy = |s: &Status| {
        let all: Vec<_> = s.pools.iter().flat_map(|p| &p.backends).collect();
        all.len() == 2
            && all
                .iter()
                .all(|b| b.healthy && b.probe.as_ref().is_some_and(|p| p.last_ok))
    };
    agent.wait_for(Duration::from_secs(5), all_healthy)?;
    agent.wait_next_hops()?;
    ensure!(
        ctl(&agent, &["canary", "status", "web"]).is_err(),
        "a group without `canary:` has a ramp"
    );

    // The ramp comes with an apply.
    agent.write_file("10-web.yaml", &config(&pin, Some(CANARY)))?;
    agent.reload()?;
    let applied = Instant::now();
    let first = loop {
        match ramp(&agent) {
            Ok(r) => break r,
            Err(e) if applied.elapsed() > Duration::from_secs(5) => {
                bail!("no ramp after the apply: {e}\nlog:\n{}", agent.log_text())
            }
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    };
    ensure!(
        first["state"] == "ramping" && first["pool"] == "canary",
        "the ramp after the apply: {first:#}"
    );

    // It steps up: the second step is a switch of the ramp's own.
    let second = wait_ramp(&agent, Duration::from_secs(8), |r| {
        r["step"].as_u64().unwrap_or(0) >= 2
    })?;
    ensure!(
        second["state"] == "ramping",
        "the ramp was done or stopped already: {second:#}"
    );
    let text = ctl(&agent, &["canary", "status", "web"])?;
    println!("canary status while ramping:\n{text}");
    ensure!(
        text.contains("canary pool canary: ramping") && text.contains("publishes split=stable:"),
        "canary status text:\n{text}"
    );
    let steps = canary_switches(&decisions(&agent)?);
    ensure!(
        steps
            .iter()
            .any(|(state, share, _)| state == "ramping" && share == "25%"),
        "no audited step to 25%: {steps:?}"
    );
    // New connections reach the canary at its share (some of 100 at 25 % or more).
    let during = tcp_tally(topo.client(), vip_v4(80), 100)?;
    println!("100 connections while ramping: {during:?}");
    ensure!(
        during.get(&backend_name(2)).copied().unwrap_or(0) > 0,
        "no connection reached the canary while it ramped: {during:?}"
    );

    // The canary's health check fails: its health server stops (its echo server stays, so a
    // connection sent there would still be seen).
    servers[1].kill_health();
    let rolled = wait_ramp(&agent, Duration::from_secs(5), |r| r["state"] != "ramping")?;
    ensure!(
        rolled["state"] == "rolled_back" && rolled["share"] == 0.0,
        "the ramp after the canary failed: {rolled:#}"
    );
    ensure!(
        rolled["step"].as_u64().unwrap_or(0) < 5,
        "the ramp finished before the canary failed: {rolled:#}"
    );
    let text = ctl(&agent, &["canary", "status", "web"])?;
    println!("canary status after the failure:\n{text}");
    ensure!(
        text.contains("rolled_back") && text.contains("publishes pool=stable"),
        "canary status text:\n{text}"
    );
    let records = decisions(&agent)?;
    let steps = canary_switches(&records);
    let last = steps
        .last()
        .context("no canary switch in the audit trail")?;
    ensure!(
        last.0 == "rolled_back" && last.1 == "0%" && last.2.contains("stable"),
        "the last canary switch: {last:?} of {steps:?}"
    );
    let rollback = records
        .iter()
        .rev()
        .find(|r| r["switch"] == "canary")
        .context("the rollback record")?;
    ensure!(
        rollback["cause"] == "canary"
            && rollback["values"]["pool.canary.healthy_ratio"]
                .as_str()
                .is_some(),
        "the rollback record: {rollback:#}"
    );
    let table = ctl(&agent, &["decisions", "--group", "web"])?;
    println!("audit trail:\n{table}");
    ensure!(table.contains("switch (canary)"), "audit table:\n{table}");

    // New connections all go to the stable pool.
    let after = tcp_tally(topo.client(), vip_v4(80), 100)?;
    ensure!(
        after.get(&backend_name(1)).copied().unwrap_or(0) == 100,
        "new connections after the rollback: {after:?}"
    );
    let metrics = agent.api_get("/metrics")?;
    for line in [
        "switchyard_canary_share{group=\"web\"} 0",
        "switchyard_canary_state{group=\"web\",state=\"rolled_back\"} 1",
    ] {
        ensure!(metrics.contains(line), "metrics lack {line:?}");
    }
    Ok(())
}
