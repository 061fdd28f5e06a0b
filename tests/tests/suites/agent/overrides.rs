//! Decision groups under operator control: an override with a TTL, a pushed state value and a
//! renamed pool of a group survive reloads; absurdly long durations do not kill the agent.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client::{self},
    config_text::{ConfigText, Group},
    netns::Topology,
};

use crate::common::{LIVE_LIMIT, Lb, consistent, ctl};

/// One fragment: the TCP service `web` on the IPv4 VIP, decided by group `g` (see [`group`]),
/// over pool `p1` (b1, weight `extra_weight`) and pool `p2` (b2), with the push variable
/// `maint`.
fn decided_by(pin: &str, p1: &str, p2: &str, extra_weight: u32, group: &Group) -> String {
    ConfigText::at_pin_path(pin)
        .deciding_service("web", VIP_V4.into(), "tcp", "dsr-l2", "g")
        .pool(p1, &[(backend_v4(1).into(), extra_weight)], None)
        .pool(p2, &[(backend_v4(2).into(), 100)], None)
        .state("maint", "{ push: { default: false } }")
        .decision(group)
        .text()
}

/// Group `g`: new flows go to `p1` while `maint` is false (rule `normal`), to `p2` while it is
/// true (rule `maintenance`); to `p1` by default.
fn group(p1: &str, p2: &str) -> Group {
    Group::new("g")
        .rule("normal", 100, "NOT maint", p1)
        .rule("maintenance", 90, "maint", p2)
        .default_pool(p1)
}

/// [`decided_by`] with [`group`].
fn decided(pin: &str, p1: &str, p2: &str, extra_weight: u32) -> String {
    decided_by(pin, p1, p2, extra_weight, &group(p1, p2))
}

/// Every switch in the audit trail of group `g`: (from, to, cause).
fn switches(agent: &Agent) -> Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(&agent.api_get("/decisions?group=g")?)?;
    Ok(v.as_array()
        .context("decisions")?
        .iter()
        .filter(|r| r["kind"] == "switch")
        .map(|r| format!("{} → {} ({})", r["from"], r["to"], r["cause"]))
        .collect())
}

fn override_of(agent: &Agent) -> Result<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(&agent.api_get("/explain/g")?)?;
    Ok(v["explanation"]["override"].clone())
}

/// Which backends `n` new connections reach.
fn reached(topo: &Topology, n: usize) -> Result<Vec<String>> {
    Ok(client::tcp_tally(topo.client(), vip_v4(80), n)?
        .into_keys()
        .collect())
}

/// An override with a TTL survives an unrelated config change and still ends when its TTL
/// (counted from when it was set) runs out; a pushed value survives a reload; a pool of a
/// decision group renamed while connections are open on it moves none of them.
#[test]
fn overrides_pushed_state_and_a_renamed_group_pool_survive_reloads() -> Result<()> {
    let Some(lb) = Lb::start("overrides_pushed_state", 2, |pin| {
        decided(pin, "dc1", "dc2", 100)
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        agent,
    } = lb;
    let b1 = router_tests::addrs::backend_name(1);
    let b2 = router_tests::addrs::backend_name(2);
    ensure!(reached(&topo, 5)? == [b1.as_str()]);

    let set = Instant::now();
    ctl(
        &agent,
        &[
            "override", "set", "g", "--to", "pool=dc2", "--reason", "attack", "--ttl", "4s",
        ],
    )?;
    ensure!(reached(&topo, 5)? == [b2.as_str()]);
    ensure!(
        !override_of(&agent)?.is_null(),
        "no override in {}",
        agent.api_get("/explain/g")?
    );
    // An unrelated change (dc1's weight) one second later.
    std::thread::sleep(Duration::from_secs(1));
    let switches = switches(&agent)?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &decided(&pin, "dc1", "dc2", 90))?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
    // Not even for a moment may the apply publish the rules' choice under the override.
    let after = self::switches(&agent)?;
    ensure!(
        after == switches,
        "the apply switched the overridden group: {:?}",
        &after[switches.len().min(after.len())..]
    );
    ensure!(
        !override_of(&agent)?.is_null(),
        "the override ended at the reload: {}\n{}",
        agent.api_get("/explain/g")?,
        agent.log_text()
    );
    ensure!(
        reached(&topo, 5)? == [b2.as_str()],
        "the reload undid the override"
    );
    // It ends 4 s after it was set, not 4 s after the reload.
    while set.elapsed() < Duration::from_millis(4600) {
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        override_of(&agent)?.is_null(),
        "the override outlived its TTL: {}",
        override_of(&agent)?
    );
    ensure!(reached(&topo, 5)? == [b1.as_str()]);

    // A pushed value survives a reload.
    ctl(&agent, &["state", "set", "maint=true"])?;
    ensure!(reached(&topo, 5)? == [b2.as_str()]);
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &decided(&pin, "dc1", "dc2", 80))?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
    let state = ctl(&agent, &["state", "get"])?;
    ensure!(
        state
            .lines()
            .any(|l| l.starts_with("maint ") && l.trim_end().ends_with("true")),
        "{state}"
    );
    ensure!(reached(&topo, 5)? == [b2.as_str()]);

    // Rename the pool the group now uses, with connections open on it.
    let mut sessions = client::tcp_sessions(topo.client(), vip_v4(80), 10)?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &decided(&pin, "dc1", "standby", 80))?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g && s.rejected.is_none())?;
    for (k, s) in sessions.iter_mut().enumerate() {
        ensure!(s.backend() == b2);
        s.echo(&client::payload(k, 64))
            .with_context(|| format!("session {k} after the rename"))?;
    }
    ensure!(
        reached(&topo, 5)? == [b2.as_str()],
        "the rename moved new flows"
    );
    consistent(&agent)
}

/// Durations far in the future — an override TTL of 300 billion years, a `stable_for` as long
/// — are valid input (saturating engine time) and must not kill the agent when its event loop
/// turns the next deadline into an instant.
#[test]
fn absurd_durations_do_not_kill_the_agent() -> Result<()> {
    let Some(lb) = Lb::start("absurd_durations", 2, |pin| {
        let slow = group("dc1", "dc2")
            .switch("{ stable_for: 300000000000y, cooldown: 0s, failback_after: 0s }");
        decided_by(pin, "dc1", "dc2", 100, &slow)
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        agent,
        ..
    } = lb;
    let b2 = router_tests::addrs::backend_name(2);
    ctl(
        &agent,
        &[
            "override",
            "set",
            "g",
            "--to",
            "pool=dc2",
            "--reason",
            "long",
            "--ttl",
            "300000000000y",
        ],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    agent
        .status()
        .with_context(|| format!("the agent died after the override:\n{}", agent.log_text()))?;
    // Cleared, the group waits `stable_for` before it leaves the override's pool; a state
    // change then starts another such wait.
    ctl(&agent, &["override", "clear", "g"])?;
    ctl(&agent, &["state", "set", "maint=true"])?;
    ctl(&agent, &["state", "set", "maint=false"])?;
    std::thread::sleep(Duration::from_millis(300));
    agent
        .status()
        .with_context(|| format!("the agent died:\n{}", agent.log_text()))?;
    ensure!(
        reached(&topo, 5)? == [b2.as_str()],
        "stable_for was not waited for"
    );
    Ok(())
}
