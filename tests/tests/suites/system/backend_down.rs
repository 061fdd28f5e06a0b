//! The whole system in network namespaces — established connections on a backend whose health
//! check fails, by the pool's `on_backend_down`: under `reset` the next segment a client sends
//! is answered by the balancer with an RST at once (the client sees the connection reset
//! within a second of that send); under `keep` it still reaches the old backend, which echoes
//! it. Connections on the other backends carry on in both. And connections on the pool a
//! decision group fails back away from, by its `on_failback`: reset at their next segment, or
//! kept; either way `status` counts the open flows left on that pool and the audit record of
//! the failback names the policy.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client::TcpSession,
    config_text::{ConfigText, FAST_HTTP_CHECK, Group, backends_v4},
    netns::Topology,
    privileged,
    servers::{self, BackendServers},
};

/// Connections opened before the failure: with three backends, each gets some.
const SESSIONS: usize = 24;

/// How soon after its send a client must see the reset.
const RESET_WITHIN: Duration = Duration::from_secs(1);

/// Three backends with [`FAST_HTTP_CHECK`] under `policy`, and `SESSIONS` established
/// connections (each echoed once); returns once every backend was probed healthy.
fn setup(policy: &str) -> Result<(Topology, Vec<BackendServers>, Agent, Vec<TcpSession>)> {
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let cfg = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&[100, 100, 100]), Some(FAST_HTTP_CHECK))
        .on_backend_down(policy);
    let agent = Agent::start(&topo, &[("10-web.yaml", cfg.text())])?;
    agent.wait_for(Duration::from_secs(5), |s| {
        let all: Vec<_> = s.pools.iter().flat_map(|p| &p.backends).collect();
        all.len() == 3 && all.iter().all(|b| b.healthy)
    })?;
    let sessions = topo.client().run(|| -> Result<Vec<TcpSession>> {
        let mut out = Vec::new();
        for i in 0..SESSIONS {
            let mut s = TcpSession::connect(vip_v4(80))?;
            s.echo(format!("hello {i}").as_bytes())?;
            out.push(s);
        }
        Ok(out)
    })??;
    Ok((topo, servers, agent, sessions))
}

/// Fails the health check of the backend (1-based index) that holds the most sessions, waits
/// for the agent to mark it down, and returns its index and name.
fn fail_busiest(
    servers: &[BackendServers],
    agent: &Agent,
    sessions: &[TcpSession],
) -> Result<(usize, String)> {
    let (i, s) = servers
        .iter()
        .enumerate()
        .max_by_key(|(_, s)| sessions.iter().filter(|x| x.backend() == s.name()).count())
        .context("no servers")?;
    let name = s.name().to_owned();
    ensure!(
        sessions.iter().any(|x| x.backend() == name),
        "no session reached any backend"
    );
    s.set_healthy(false);
    let addr = backend_v4(i + 1).to_string();
    agent.wait_for(Duration::from_secs(3), |st| {
        Agent::healthy(st, "web", &addr) == Some(false)
    })?;
    Ok((i + 1, name))
}

/// `switchyard_packets_total{reason="backend_reset"}` from the agent's metrics.
fn reset_count(agent: &Agent) -> Result<usize> {
    let text = agent.api_get("/metrics")?;
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("switchyard_packets_total{") && l.contains("reason=\"backend_reset\"")
        })
        .context("no backend_reset in the metrics")?;
    let n = line.rsplit(' ').next().context("no value")?;
    Ok(n.split('.').next().unwrap_or(n).parse()?)
}

#[test]
fn under_reset_an_established_connection_is_reset_at_its_next_segment() -> Result<()> {
    if privileged::require_root_and_bpf("backend_down_reset").is_err() {
        return Ok(());
    }
    let (topo, servers, agent, mut sessions) = setup("reset")?;
    let (_, name) = fail_busiest(&servers, &agent, &sessions)?;
    let reset = topo.client().run(|| -> Result<usize> {
        let mut reset = 0;
        for (i, s) in sessions.iter_mut().enumerate() {
            let (r, took) = s.echo_or_error(format!("again {i}").as_bytes())?;
            if s.backend() == name {
                ensure!(
                    r == Err(std::io::ErrorKind::ConnectionReset),
                    "a connection on {name} got {r:?} after {took:?}, not a reset"
                );
                ensure!(
                    took < RESET_WITHIN,
                    "the reset came {took:?} after the send"
                );
                println!("reset seen {took:?} after the send");
                reset += 1;
            } else {
                ensure!(r.is_ok(), "a connection on {} failed: {r:?}", s.backend());
            }
        }
        ensure!(reset > 0, "no connection was on {name}");
        Ok(reset)
    })??;
    // The balancer sent those resets (under `migrate` the new backend would: no count).
    let mut counted = 0;
    for _ in 0..30 {
        counted = reset_count(&agent)?;
        if counted >= reset {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        counted >= reset,
        "backend_reset counted {counted}, not {reset}"
    );
    // New connections avoid the down backend.
    let tally = router_tests::client::tcp_tally(topo.client(), vip_v4(80), 20)?;
    ensure!(
        !tally.contains_key(&name),
        "{name} took new connections: {tally:?}"
    );
    Ok(())
}

#[test]
fn under_keep_an_established_connection_stays_on_its_backend() -> Result<()> {
    if privileged::require_root_and_bpf("backend_down_keep").is_err() {
        return Ok(());
    }
    let (topo, servers, agent, mut sessions) = setup("keep")?;
    let (i, name) = fail_busiest(&servers, &agent, &sessions)?;
    let before = servers[i - 1].tcp_connections();
    topo.client().run(|| -> Result<()> {
        for (k, s) in sessions.iter_mut().enumerate() {
            // An echo is the old backend's answer: another backend would reset the segment.
            let (r, took) = s.echo_or_error(format!("again {k}").as_bytes())?;
            ensure!(
                r.is_ok(),
                "a connection on {} got {r:?} after {took:?}",
                s.backend()
            );
        }
        Ok(())
    })??;
    ensure!(
        servers[i - 1].tcp_connections() == before,
        "{name} accepted a connection while down"
    );
    let tally = router_tests::client::tcp_tally(topo.client(), vip_v4(80), 20)?;
    ensure!(
        !tally.contains_key(&name),
        "{name} took new connections: {tally:?}"
    );
    for s in sessions {
        s.finish()?;
    }
    Ok(())
}

/// Four backends (`dc1` = b1, b2; `dc2` = b3, b4; no health checks) and group `wf`: `dc1`
/// while the push variable `primary` holds, else `dc2`, switching at once, with
/// `on_failback: policy`. Fails over to `dc2`, opens `SESSIONS` connections there, then fails
/// back to `dc1`; returns the sessions with the agent and the servers of `dc2`.
fn failed_back(policy: &str) -> Result<(Topology, Vec<BackendServers>, Agent, Vec<TcpSession>)> {
    let topo = Topology::builder().backends(4).build()?;
    let servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", failback_config(policy))])?;
    agent.wait_for(Duration::from_secs(5), |s| {
        s.pools
            .iter()
            .flat_map(|p| &p.backends)
            .filter(|b| b.healthy)
            .count()
            == 4
    })?;
    let dc2: Vec<String> = servers[2..].iter().map(|s| s.name().to_owned()).collect();
    let ctl = |arg: &str| {
        let dir = agent.dir().display().to_string();
        agent.cli(&["ctl", "--config-dir", &dir, "state", "set", arg])
    };
    ctl("primary=false")?;
    let sessions = wait_until(|| {
        let s = topo.client().run(|| TcpSession::connect(vip_v4(80)))??;
        Ok(dc2.contains(&s.backend().to_owned()))
    })
    .and_then(|()| {
        topo.client().run(|| -> Result<Vec<TcpSession>> {
            let mut out = Vec::new();
            for i in 0..SESSIONS {
                let mut s = TcpSession::connect(vip_v4(80))?;
                s.echo(format!("hello {i}").as_bytes())?;
                out.push(s);
            }
            Ok(out)
        })?
    })?;
    ensure!(
        sessions
            .iter()
            .all(|s| dc2.contains(&s.backend().to_owned())),
        "a session did not reach dc2"
    );
    // The clients' last segments (delayed ACKs of the echoes) leave before the failback: the
    // next segment of each connection is then the test's own.
    std::thread::sleep(Duration::from_millis(300));
    ctl("primary=true")?;
    wait_until(|| Ok(left_of(&agent)?.is_some()))?;
    Ok((topo, servers, agent, sessions))
}

/// The config of [`failed_back`], with `on_failback: policy`.
fn failback_config(policy: &str) -> String {
    let all = backends_v4(&[100, 100, 100, 100]);
    ConfigText::new()
        .deciding_service("web", VIP_V4.into(), "tcp", "dsr-l2", "wf")
        .pool("dc1", &all[..2], None)
        .pool("dc2", &all[2..], None)
        .state("primary", "{ push: { default: true } }")
        .decision(
            &Group::new("wf")
                .rule("dc1-primary", 100, "primary", "dc1")
                .rule("dc2-standby", 90, "NOT primary", "dc2")
                .switch("{ stable_for: 0s, cooldown: 0s, failback_after: 0s }")
                .on_failback(policy),
        )
        .text()
}

/// Polls `done` every 50 ms for up to 5 s.
fn wait_until(mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if done()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("not within 5 s")
}

/// What `status` says of pool `dc2` having been left: group, policy, open flows.
fn left_of(agent: &Agent) -> Result<Option<(String, String, Option<u64>)>> {
    let s = agent.status()?;
    Ok(s.pools
        .iter()
        .find(|p| p.name == "dc2")
        .and_then(|p| p.left.as_ref())
        .map(|l| (l.group.clone(), l.policy.clone(), l.open_flows)))
}

/// The audit record of the failback (the last switch of `wf`), as JSON.
fn failback_record(agent: &Agent) -> Result<serde_json::Value> {
    let dir = agent.dir().display().to_string();
    let text = agent.cli(&[
        "ctl",
        "--config-dir",
        &dir,
        "decisions",
        "--group",
        "wf",
        "--json",
    ])?;
    let records: Vec<serde_json::Value> = serde_json::from_str(&text)?;
    records
        .into_iter()
        .rev()
        .find(|r| r["kind"] == "switch")
        .context("no switch recorded")
}

#[test]
fn on_failback_reset_resets_the_connections_left_on_the_standby_pool() -> Result<()> {
    if privileged::require_root_and_bpf("failback_reset").is_err() {
        return Ok(());
    }
    let (topo, _servers, agent, mut sessions) = failed_back("reset")?;
    let record = failback_record(&agent)?;
    ensure!(record["switch"] == "failback", "last switch: {record}");
    let flows = record["flows"].as_str().unwrap_or_default();
    ensure!(
        flows.starts_with("on_failback reset"),
        "audit says {flows:?}"
    );
    let left = left_of(&agent)?.context("dc2 not shown as left")?;
    ensure!(left.0 == "wf" && left.1 == "reset", "status: {left:?}");
    ensure!(
        left.2 == Some(SESSIONS as u64),
        "status counts {:?} open flows on dc2, not {SESSIONS}",
        left.2
    );
    topo.client().run(|| -> Result<()> {
        for (i, s) in sessions.iter_mut().enumerate() {
            let (r, took) = s.echo_or_error(format!("again {i}").as_bytes())?;
            ensure!(
                r == Err(std::io::ErrorKind::ConnectionReset),
                "a connection on {} got {r:?} after {took:?}, not a reset",
                s.backend()
            );
            ensure!(
                took < RESET_WITHIN,
                "the reset came {took:?} after the send"
            );
        }
        Ok(())
    })??;
    // Reset flows are closing: none is open any more.
    let left = left_of(&agent)?.context("dc2 not shown as left")?;
    ensure!(
        left.2 == Some(0),
        "status counts {:?} open flows after the resets",
        left.2
    );
    ensure!(
        reset_count(&agent)? >= SESSIONS,
        "the balancer did not send the resets"
    );
    Ok(())
}

#[test]
fn on_failback_keep_leaves_connections_on_the_standby_pool_and_says_so() -> Result<()> {
    if privileged::require_root_and_bpf("failback_keep").is_err() {
        return Ok(());
    }
    let (topo, servers, agent, mut sessions) = failed_back("keep")?;
    let record = failback_record(&agent)?;
    ensure!(record["switch"] == "failback", "last switch: {record}");
    let flows = record["flows"].as_str().unwrap_or_default();
    ensure!(
        flows.starts_with("on_failback keep"),
        "audit says {flows:?}"
    );
    let left = left_of(&agent)?.context("dc2 not shown as left")?;
    ensure!(left.0 == "wf" && left.1 == "keep", "status: {left:?}");
    ensure!(
        left.2 == Some(SESSIONS as u64),
        "status counts {:?} open flows",
        left.2
    );
    let metrics = agent.api_get("/metrics")?;
    ensure!(
        metrics
            .lines()
            .any(|l| l.starts_with("switchyard_failback_open_flows{")
                && l.contains("pool=\"dc2\"")
                && l.ends_with(&format!(" {SESSIONS}"))),
        "no failback_open_flows gauge for dc2"
    );
    topo.client().run(|| -> Result<()> {
        for (i, s) in sessions.iter_mut().enumerate() {
            let (r, took) = s.echo_or_error(format!("again {i}").as_bytes())?;
            ensure!(
                r.is_ok(),
                "a connection on {} got {r:?} after {took:?}",
                s.backend()
            );
        }
        Ok(())
    })??;
    // New connections go to dc1.
    let tally = router_tests::client::tcp_tally(topo.client(), vip_v4(80), 12)?;
    let dc1: Vec<String> = servers[..2].iter().map(|s| s.name().to_owned()).collect();
    ensure!(
        tally.keys().all(|k| dc1.contains(k)),
        "new connections: {tally:?}"
    );
    for s in sessions {
        s.finish()?;
    }
    Ok(())
}

#[test]
fn a_failback_mark_comes_off_when_an_apply_makes_the_group_keep() -> Result<()> {
    if privileged::require_root_and_bpf("failback_mark_after_apply").is_err() {
        return Ok(());
    }
    let (topo, _servers, agent, mut sessions) = failed_back("reset")?;
    // Before any of them sends again, the group's on_failback becomes keep: the pool it left
    // is unmarked, and its connections carry on.
    agent.write_file("10-web.yaml", &failback_config("keep"))?;
    agent.reload()?;
    wait_until(|| Ok(left_of(&agent)?.is_some_and(|l| l.1 == "keep")))?;
    topo.client().run(|| -> Result<()> {
        for (i, s) in sessions.iter_mut().enumerate() {
            s.echo(format!("after the apply {i}").as_bytes())
                .with_context(|| format!("session {i}"))?;
        }
        Ok(())
    })??;
    ensure!(reset_count(&agent)? == 0, "connections were reset");
    Ok(())
}
