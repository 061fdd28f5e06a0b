//! The failover story of `cargo xtask demo`: service `web` follows a decision group over two
//! pools (data centres dc1 and dc2). dc1's API fails and new connections reach dc2 within a
//! measured time; it recovers and the failback waits `failback_after`; a maintenance flag
//! moves traffic; an override with a TTL and a reason; the audit trail. `ctl explain` at each
//! step, as an operator would type it.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use router_tests::{
    addrs::{TCP_ECHO_PORT, backend_name, vip_v4},
    agent::Agent,
    client::{self, TcpSession},
    netns::Topology,
    servers::BackendServers,
};
use serde_json::Value;

use crate::cleanup::checkpoint;
use crate::demo::{
    COOLDOWN_S, DC1, DC2, FAILBACK_AFTER_S, GROUP, LOOK, PROBE_FAILURES, PROBE_INTERVAL_MS,
    PROBE_TIMEOUT_MS, STABLE_FOR_MS, deciding, failover_fragment, heading, show, wait_until,
};

/// How long the story waits for any one move of traffic before it gives up.
const MOVE_LIMIT: Duration = Duration::from_secs(15);

/// Runs the story on the running demo: `yaml` is `10-demo.yaml` as first written.
pub fn run(topo: &Topology, servers: &[BackendServers], agent: &Agent, yaml: &str) -> Result<()> {
    let dc1: Vec<String> = DC1.iter().map(|&i| backend_name(i)).collect();
    let dc2: Vec<String> = DC2.iter().map(|&i| backend_name(i)).collect();
    let probed = backend_name(DC1[0]);
    let api = servers
        .iter()
        .find(|s| s.name() == probed)
        .with_context(|| format!("no servers on {probed}"))?;

    heading(11, "Failover between two data centres: a decision group");
    println!(
        "Backends {} form pool dc1, {} pool dc2. A second fragment declares them, the state \
         the rules read and the group that chooses between them:",
        dc1.join(" and "),
        dc2.join(" and ")
    );
    let fragment = failover_fragment();
    println!("{}", fragment.trim_end());
    let before = agent.status()?.generation;
    agent.write_file("20-failover.yaml", &fragment)?;
    wait_until(agent, |s| s.generation > before)?;
    // The group adopts dc1 once dc1's backends pass their first checks (`require`).
    let adopted = wait_for_pool(agent, "dc1")?;
    println!(
        "\nThen service `web` follows the group: in 10-demo.yaml, `to: {{ pool: web }}` becomes \
         `to: {{ decide: {GROUP} }}`."
    );
    let before = agent.status()?.generation;
    agent.write_file("10-demo.yaml", &deciding(yaml))?;
    wait_until(agent, |s| s.generation > before)?;
    look(topo)?;
    show(agent, &["ctl", "explain", GROUP])?;
    checkpoint()?;
    // The adoption started the group's cooldown; the failover below must not wait for it.
    if let Some(rest) = Duration::from_secs(COOLDOWN_S).checked_sub(adopted.elapsed()) {
        std::thread::sleep(rest);
    }

    heading(12, "dc1's API fails");
    let bound = 2 * PROBE_INTERVAL_MS + PROBE_TIMEOUT_MS + STABLE_FOR_MS;
    println!(
        "{probed}'s GET /health now answers 503. The probe dc1_api_healthy checks it every \
         {PROBE_INTERVAL_MS} ms and reads false after {PROBE_FAILURES} failures; the switch \
         follows stable_for ({STABLE_FOR_MS} ms) later. The client opens one connection after \
         another until one reaches dc2."
    );
    let failed = Instant::now();
    api.set_healthy(false);
    let took = first_on(topo, &dc2, failed)?;
    println!(
        "The first new connection reached dc2 {} ms after dc1's API began failing (bound: \
         2 × {PROBE_INTERVAL_MS} ms interval + {PROBE_TIMEOUT_MS} ms timeout + \
         {STABLE_FOR_MS} ms stable_for = {bound} ms).",
        took.as_millis()
    );
    look(topo)?;
    show(agent, &["ctl", "explain", GROUP])?;
    checkpoint()?;

    heading(13, "dc1 recovers: the failback waits failback_after");
    println!(
        "{probed}'s GET /health answers 200 again. The probe reads true after 3 passes; the \
         group then waits failback_after ({FAILBACK_AFTER_S} s) before it moves back, so a \
         flapping dc1 does not pull traffic back and forth."
    );
    let recovered = Instant::now();
    api.set_healthy(true);
    wait_explain(agent, |e| {
        e["text"]
            .as_str()
            .is_some_and(|t| t.contains("failback pending"))
    })?;
    show(agent, &["ctl", "explain", GROUP])?;
    println!("Meanwhile new connections still go to dc2:");
    look(topo)?;
    let back = first_on(topo, &dc1, recovered)?;
    println!(
        "New connections reached dc1 again {:.1} s after the recovery (3 probe passes, then \
         failback_after {FAILBACK_AFTER_S} s).",
        back.as_secs_f64()
    );
    look(topo)?;
    checkpoint()?;
    operator(topo, agent, &dc2)
}

/// The operator's steps: the maintenance flag, an override with a TTL and a reason, then the
/// audit trail.
fn operator(topo: &Topology, agent: &Agent, dc2: &[String]) -> Result<()> {
    heading(14, "Maintenance: an operator's flag moves traffic");
    let asked = Instant::now();
    show(agent, &["ctl", "state", "set", "maintenance_mode=true"])?;
    let took = first_on(topo, dc2, asked)?;
    println!(
        "New connections reached dc2 {} ms after the command: a failover waits for the \
         group's cooldown, {COOLDOWN_S} s after its previous switch (the failback above).",
        took.as_millis()
    );
    show(agent, &["ctl", "explain", GROUP])?;
    checkpoint()?;

    heading(15, "An override, with a TTL and a reason");
    let ttl = 3;
    let set = Instant::now();
    show(
        agent,
        &[
            "ctl",
            "override",
            "set",
            GROUP,
            "--to",
            "pool=dc1",
            "--ttl",
            &format!("{ttl}s"),
            "--reason",
            "smoke-test dc1 during maintenance",
        ],
    )?;
    look(topo)?;
    show(agent, &["ctl", "explain", GROUP])?;
    let expired = first_on(topo, dc2, set)?;
    println!(
        "The override expired {:.1} s after it was set (TTL {ttl} s); the rules decide again: \
         maintenance_mode is still true, so dc2.",
        expired.as_secs_f64()
    );
    look(topo)?;
    checkpoint()?;

    heading(16, "The audit trail");
    println!(
        "Every switch, with its cause, the values the winning rule read and the microseconds \
         from the event to the completed map write (`--json` prints the API's records):"
    );
    show(agent, &["ctl", "decisions", "--group", GROUP])?;
    checkpoint()?;
    Ok(())
}

/// Opens [`LOOK`] new connections to the web service and prints where they went, by pool.
fn look(topo: &Topology) -> Result<()> {
    let t = client::tcp_tally(topo.client(), vip_v4(TCP_ECHO_PORT), LOOK)?;
    let pool = |members: [usize; 2]| {
        members
            .iter()
            .map(|&i| {
                let name = backend_name(i);
                format!("{name} {}", t.get(&name).copied().unwrap_or(0))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "  {LOOK} new connections to {}: dc1 ({}), dc2 ({})",
        vip_v4(TCP_ECHO_PORT),
        pool(DC1),
        pool(DC2)
    );
    Ok(())
}

/// Opens connections from the client, one after another, until one is served by a backend of
/// `pool`; returns how long after `since` that connection was opened.
fn first_on(topo: &Topology, pool: &[String], since: Instant) -> Result<Duration> {
    let vip = vip_v4(TCP_ECHO_PORT);
    topo.client().run(|| -> Result<Duration> {
        loop {
            checkpoint()?;
            let opened = Instant::now();
            // A connection refused or reset while the tables change is tried again.
            if let Ok(s) = TcpSession::connect(vip) {
                let on = pool.iter().any(|b| b == s.backend());
                let _ = s.finish();
                if on {
                    return Ok(opened.saturating_duration_since(since));
                }
            }
            if since.elapsed() > MOVE_LIMIT {
                bail!(
                    "no new connection reached {} within {MOVE_LIMIT:?}",
                    pool.join(", ")
                );
            }
        }
    })?
}

/// Polls the group's explanation (`GET /explain/{GROUP}`) until `pred` holds.
fn wait_explain(agent: &Agent, pred: impl Fn(&Value) -> bool) -> Result<Value> {
    let start = Instant::now();
    loop {
        checkpoint()?;
        if let Ok(text) = agent.api_get(&format!("/explain/{GROUP}"))
            && let Ok(e) = serde_json::from_str::<Value>(&text)
            && pred(&e)
        {
            return Ok(e);
        }
        if start.elapsed() > MOVE_LIMIT {
            bail!(
                "the group did not get there in {MOVE_LIMIT:?}; its log:\n{}",
                agent.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the group publishes `pool`; returns when that was seen.
fn wait_for_pool(agent: &Agent, pool: &str) -> Result<Instant> {
    wait_explain(agent, |e| {
        e["explanation"]["active"]["action"]["pool"].as_str() == Some(pool)
    })?;
    Ok(Instant::now())
}
