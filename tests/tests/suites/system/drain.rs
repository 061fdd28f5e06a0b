//! The whole system in network namespaces — an operator's drain
//! (`switchyard ctl backend drain POOL ADDRESS [--timeout T]`): 100 established connections,
//! spread over three backends, keep exchanging data while one backend is drained; no new
//! connection reaches it; `status` counts its tracked flows from connection tracking; `undrain`
//! gives it new connections again; a drain with a timeout evicts it (its entry goes down, so
//! its remaining tracked flows are re-selected) once the timeout passes.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use router_common::{BACKEND_DOWN, BACKEND_DRAINING, BACKEND_UP};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client::{self, payload},
    config_text::{ConfigText, backends_v4},
    netns::Topology,
    privileged, servers,
};
use switchyard::{
    api::status::{DrainStatus, Status},
    dataplane::maps::KernelMaps,
};

/// Established connections kept open through the drain.
const ESTABLISHED: usize = 100;
/// New connections made while the backend is drained, and after.
const NEW: usize = 150;
/// The drained backend (1-based).
const DRAINED: usize = 2;

/// The drain of the drained backend in `s`.
fn drain_of(s: &Status) -> Option<DrainStatus> {
    let address = backend_v4(DRAINED).to_string();
    s.pools
        .iter()
        .flat_map(|p| &p.backends)
        .find(|b| b.address == address)
        .and_then(|b| b.drain.clone())
}

/// The state the program reads for backend slot `slot`.
fn entry_state(agent: &Agent, slot: u32) -> Result<u32> {
    let maps = KernelMaps::open_pinned(&agent.pin_dir())?;
    Ok(maps.backend(slot)?.state)
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn a_drained_backend_keeps_its_connections_and_gets_no_new_ones() -> Result<()> {
    if privileged::require_root_and_bpf("a_drained_backend_keeps_its_connections").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let cfg = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&[100, 100, 100]), None);
    let agent = Agent::start(&topo, &[("10-web.yaml", cfg.text())])?;
    let dir = agent.dir().display().to_string();
    let ctl = |args: &[&str]| {
        let mut all = vec!["ctl", "--config-dir", dir.as_str()];
        all.extend_from_slice(args);
        agent.cli(&all)
    };
    let drained = servers[DRAINED - 1].name().to_owned();
    let address = backend_v4(DRAINED).to_string();
    let vip = vip_v4(80);

    let mut sessions = client::tcp_sessions(topo.client(), vip, ESTABLISHED)?;
    let on_drained = sessions.iter().filter(|s| s.backend() == drained).count();
    ensure!(
        on_drained > 0,
        "no established connection reached {drained}: nothing to keep"
    );
    let exchange = |sessions: &mut Vec<client::TcpSession>, round: usize| -> Result<()> {
        topo.client().run(|| -> Result<()> {
            for (k, s) in sessions.iter_mut().enumerate() {
                s.echo(&payload(round * ESTABLISHED + k, 512))
                    .with_context(|| format!("round {round}: connection {k} to {}", s.backend()))?;
            }
            Ok(())
        })?
    };
    exchange(&mut sessions, 0)?;

    let said = ctl(&["backend", "drain", "web", &address])?;
    ensure!(said.contains("draining"), "drain said {said:?}");
    let status = agent.status()?;
    let drain = drain_of(&status).context("status shows no drain")?;
    ensure!(!drain.evicted && drain.until.is_none(), "{drain:?}");
    ensure!(
        drain.open_flows == Some(on_drained as u64),
        "status counts {:?} tracked flows on {drained}; {on_drained} established connections \
         reached it",
        drain.open_flows
    );
    ensure!(
        !Agent::healthy(&status, "web", &address).unwrap_or(true),
        "a drained backend takes no new flows: status must not call it healthy"
    );
    ensure!(entry_state(&agent, drain.slot)? == BACKEND_DRAINING);
    let gauge = |value: u32| {
        format!("switchyard_backend_drained{{pool=\"web\",backend=\"{address}\"}} {value}")
    };
    let metrics = agent.api_get("/metrics")?;
    ensure!(
        metrics.contains(&gauge(1)),
        "no {} in:\n{metrics}",
        gauge(1)
    );
    let text = agent.cli(&["status", "--config-dir", &dir])?;
    ensure!(
        text.contains("drained by the operator")
            && text.contains(&format!("{on_drained} tracked flows")),
        "status text:\n{text}"
    );

    let tally = client::tcp_tally(topo.client(), vip, NEW)?;
    ensure!(
        !tally.contains_key(&drained),
        "new connections reached the drained {drained}: {tally:?}"
    );
    ensure!(client::total(&tally) == NEW, "{tally:?}");
    // Every established connection, the drained backend's included, still exchanges data.
    exchange(&mut sessions, 1)?;

    let said = ctl(&["backend", "undrain", "web", &address])?;
    ensure!(said.contains("drain ended"), "undrain said {said:?}");
    ensure!(drain_of(&agent.status()?).is_none());
    let tally = client::tcp_tally(topo.client(), vip, NEW)?;
    ensure!(
        tally.get(&drained).copied().unwrap_or(0) > NEW / 6,
        "after undrain, {drained} should take about a third of {NEW} new connections: {tally:?}"
    );
    exchange(&mut sessions, 2)?;
    let slot = drain.slot;
    ensure!(entry_state(&agent, slot)? == BACKEND_UP);

    // A drain with a timeout: draining first, evicted (its entry down) once it passes.
    ctl(&["backend", "drain", "web", &address, "--timeout", "1s"])?;
    let drain = drain_of(&agent.status()?).context("status shows no drain")?;
    ensure!(drain.until.is_some() && !drain.evicted, "{drain:?}");
    ensure!(entry_state(&agent, slot)? == BACKEND_DRAINING);
    agent.wait_for(Duration::from_secs(5), |s| {
        drain_of(s).is_some_and(|d| d.evicted)
    })?;
    ensure!(entry_state(&agent, slot)? == BACKEND_DOWN);
    ensure!(agent.api_get("/metrics")?.contains(&gauge(2)));
    let text = agent.cli(&["status", "--config-dir", &dir])?;
    ensure!(text.contains("timeout passed"), "status text:\n{text}");

    // Refused with a reason, nothing changed.
    let unknown = ctl(&["backend", "drain", "web", "198.18.1.99"]);
    ensure!(
        unknown
            .as_ref()
            .is_err_and(|e| e.to_string().contains("has no backend 198.18.1.99")),
        "{unknown:?}"
    );
    let undrain_timeout = ctl(&["backend", "undrain", "web", &address]);
    ensure!(undrain_timeout.is_ok(), "{undrain_timeout:?}");
    ensure!(entry_state(&agent, slot)? == BACKEND_UP);
    Ok(())
}
