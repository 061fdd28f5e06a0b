//! The whole system in network namespaces — established connections on a backend whose health
//! check fails, by the pool's `on_backend_down`: under `reset` the next segment a client sends
//! is answered by the balancer with an RST at once (the client sees the connection reset
//! within a second of that send); under `keep` it still reaches the old backend, which echoes
//! it. Connections on the other backends carry on in both.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client::TcpSession,
    config_text::{ConfigText, FAST_HTTP_CHECK, backends_v4},
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
