//! The whole system in network namespaces — an operator's drain
//! (`switchyard ctl backend drain POOL ADDRESS [--timeout T]`): 100 established connections,
//! spread over three backends, keep exchanging data while one backend is drained; no new
//! connection reaches it; `status` counts its tracked flows from connection tracking; `undrain`
//! gives it new connections again; a drain with a timeout evicts it (its entry goes down, so
//! its remaining tracked flows are re-selected) once the timeout passes.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use router_common::{BACKEND_DRAINING, BACKEND_EVICTED, BACKEND_UP};
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

/// Three backends with their servers, and an agent balancing TCP on the IPv4 VIP over them
/// with `check` as the pool's health check.
fn web(check: Option<&str>) -> Result<(Topology, Vec<servers::BackendServers>, Agent)> {
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let cfg = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&[100, 100, 100]), check);
    let agent = Agent::start(&topo, &[("10-web.yaml", cfg.text())])?;
    Ok((topo, servers, agent))
}

/// `switchyard ctl --config-dir DIR ARGS…` against `agent`.
fn ctl(agent: &Agent, args: &[&str]) -> Result<String> {
    let dir = agent.dir().display().to_string();
    let mut all = vec!["ctl", "--config-dir", dir.as_str()];
    all.extend_from_slice(args);
    agent.cli(&all)
}

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
    let (topo, servers, agent) = web(None)?;
    let dir = agent.dir().display().to_string();
    let ctl = |args: &[&str]| ctl(&agent, args);
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
    ensure!(entry_state(&agent, slot)? == BACKEND_EVICTED);
    ensure!(agent.api_get("/metrics")?.contains(&gauge(2)));
    let text = agent.cli(&["status", "--config-dir", &dir])?;
    ensure!(
        text.contains("timeout passed") && text.contains("EVICTED"),
        "status text:\n{text}"
    );

    // Refused with a reason, nothing changed.
    let pool = ctl(&["backend", "drain", "nopool", &address]);
    ensure!(
        pool.as_ref()
            .is_err_and(|e| e.to_string().contains("unknown pool \"nopool\"")),
        "{pool:?}"
    );
    let unknown = ctl(&["backend", "drain", "web", "198.18.1.99"]);
    ensure!(
        unknown
            .as_ref()
            .is_err_and(|e| e.to_string().contains("has no backend 198.18.1.99")),
        "{unknown:?}"
    );
    // A timeout past what the clock holds is refused before anything is written, and the
    // agent goes on.
    let huge = ctl(&[
        "backend",
        "drain",
        "web",
        &backend_v4(1).to_string(),
        "--timeout",
        "300000000000y",
    ]);
    ensure!(
        huge.as_ref()
            .is_err_and(|e| e.to_string().contains("too long")),
        "{huge:?}"
    );
    ensure!(
        agent.status()?.pools[0]
            .backends
            .iter()
            .all(|b| b.address == address || b.drain.is_none())
    );
    let undrain_timeout = ctl(&["backend", "undrain", "web", &address]);
    ensure!(undrain_timeout.is_ok(), "{undrain_timeout:?}");
    ensure!(entry_state(&agent, slot)? == BACKEND_UP);
    Ok(())
}

/// A restart ends a drain: a backend of a checked pool, drained or evicted, is usable as soon
/// as the restarted agent answers, not after its health check passes again (an evicted entry
/// is not a failed check).
#[test]
fn a_restart_ends_a_drain_evicted_or_not() -> Result<()> {
    if privileged::require_root_and_bpf("a_restart_ends_a_drain").is_err() {
        return Ok(());
    }
    // Slow to bring a backend back up (3 × 1 s): a backend taken for down would show.
    let check = "{ http: { port: 8080, path: /health }, interval: 1s, timeout: 200ms, \
                 unhealthy_threshold: 2, healthy_threshold: 3 }";
    let (_topo, _servers, mut agent) = web(Some(check))?;
    let address = backend_v4(DRAINED).to_string();
    agent.wait_for(Duration::from_secs(10), |s| {
        Agent::healthy(s, "web", &address) == Some(true)
    })?;
    for timeout in [None, Some("0s")] {
        let mut args = vec!["backend", "drain", "web", &address];
        args.extend(timeout.iter().flat_map(|t| ["--timeout", t]));
        ctl(&agent, &args)?;
        if timeout.is_some() {
            agent.wait_for(Duration::from_secs(5), |s| {
                drain_of(s).is_some_and(|d| d.evicted)
            })?;
        }
        agent.restart()?;
        let s = agent.status()?;
        ensure!(
            drain_of(&s).is_none() && Agent::healthy(&s, "web", &address) == Some(true),
            "after a restart (drain timeout {timeout:?}) the backend is not usable at once: {:?}",
            s.pools[0].backends
        );
    }
    Ok(())
}

/// A flow key of the churn test, from 198.18.`tag`.x: unique per `(i, tag)` for `i < 2^16`.
fn churn_key(i: u32, tag: u8) -> router_common::FlowKey {
    let port = u16::try_from(i & 0xffff).unwrap_or(0);
    let [hi, _] = port.to_be_bytes();
    let mut src = [0_u8; 16];
    src[..4].copy_from_slice(&[198, 18, tag, hi]);
    let mut dst = [0_u8; 16];
    dst[..4].copy_from_slice(&VIP_V4.octets());
    router_common::FlowKey {
        src,
        dst,
        sport: port.to_be(),
        dport: 80_u16.to_be(),
        proto: 6,
        family: router_common::FAMILY_V4,
        _pad: [0; 2],
    }
}

/// `status` counts a drained backend's tracked flows by walking `CONNTRACK`; a full table
/// taking new flows evicts the key the walk stands on, and the kernel restarts the walk at the
/// first bucket. The count never exceeds the flows that exist. New flows are inserted from
/// userspace, by the kernel's update path the program's inserts take.
#[test]
#[expect(
    clippy::cast_possible_truncation,
    reason = "flow indexes below 2^16 as ports and address bytes"
)]
fn a_drains_flow_count_never_counts_a_flow_twice_while_the_table_churns() -> Result<()> {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use aya::maps::{HashMap, Map, MapData};
    use router_common::{CONNTRACK_SIZE, FlowEntry, FlowKey, maps};

    /// The drained backend's flows.
    const MINE: u32 = 16_384;
    if privileged::require_root_and_bpf("a_drains_flow_count_never_counts_twice").is_err() {
        return Ok(());
    }
    let (_topo, _servers, agent) = web(None)?;
    let address = backend_v4(DRAINED).to_string();
    ctl(&agent, &["backend", "drain", "web", &address])?;
    let slot = drain_of(&agent.status()?).context("no drain")?.slot;
    let pin = agent.pin_dir().join(maps::CONNTRACK);
    let open = || -> Result<HashMap<MapData, FlowKey, FlowEntry>> {
        Ok(HashMap::try_from(Map::LruHashMap(MapData::from_pin(
            &pin,
        )?))?)
    };
    let mut table = open()?;
    // Open flows, seen now: `status` counts only those.
    let other = FlowEntry {
        backend: slot + 1,
        seen: switchyard::dataplane::clock::pinned_now(&agent.pin_dir())?,
        state: router_common::FLOW_TCP_OPEN,
        ..FlowEntry::default()
    };
    let mine = FlowEntry {
        backend: slot,
        ..other
    };
    // A full table: other flows first (the oldest), then the drained backend's.
    for i in 0..CONNTRACK_SIZE - MINE {
        table.insert(churn_key(i & 0xffff, 3 + (i >> 16) as u8), other, 0)?;
    }
    for i in 0..MINE {
        table.insert(churn_key(i, 1), mine, 0)?;
    }
    // New flows keep arriving for other backends; the drained backend's stay recent, as
    // active connections do, so the LRU evicts only the others.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        let mut table = open()?;
        std::thread::spawn(move || {
            let mut i = 0_u32;
            let mut refreshed = std::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..800 {
                    let _ = table.insert(
                        churn_key(i & 0xffff, 40 + ((i >> 16) & 0x3f) as u8),
                        other,
                        0,
                    );
                    i = i.wrapping_add(1);
                }
                if refreshed.elapsed() > Duration::from_millis(700) {
                    for j in 0..MINE {
                        let _ = table.insert(churn_key(j, 1), mine, 0);
                    }
                    refreshed = std::time::Instant::now();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let start = std::time::Instant::now();
    let mut counts = Vec::new();
    while start.elapsed() < Duration::from_secs(10) {
        counts.push(drain_of(&agent.status()?).and_then(|d| d.open_flows));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = churn.join();
    let most = counts.iter().flatten().max().copied().unwrap_or(0);
    ensure!(
        most <= u64::from(MINE),
        "status counted {most} tracked flows on the drained backend; {MINE} exist: {counts:?}"
    );
    ensure!(most > 0, "nothing counted: {counts:?}");
    Ok(())
}
