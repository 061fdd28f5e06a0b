//! The whole system in network namespaces — flow state in connection tracking: a TCP 5-tuple
//! reused after its client reset the connection is a new flow, chosen from the current table
//! like a fresh one; a UDP flow paused past its idle timeout is chosen from the current table
//! again, while one within it stays. Time for the UDP timeout is the program's clock moved
//! forward through its pinned `CLOCK` map, not waited for.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use aya::maps::{Array, Map, MapData};
use router_tests::{
    addrs::{VIP_V4, vip_v4},
    agent::Agent,
    client::{Tally, TcpSession, udp_flow_socket},
    config_text::{ConfigText, backends_v4},
    netns::Topology,
    privileged, servers,
};

/// Connections (and UDP flows) per round: with three backends, each gets about a third.
const FLOWS: u16 = 40;

/// A topology of three backends with their servers, and an agent balancing `protocol` on the
/// IPv4 VIP over backends 1 and 2 only.
fn two_of_three(protocol: &str) -> Result<(Topology, Vec<servers::BackendServers>, Agent)> {
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", config(protocol, 2))])?;
    Ok((topo, servers, agent))
}

/// The config: service `web` for `protocol` over the first `n` backends.
fn config(protocol: &str, n: usize) -> String {
    ConfigText::new()
        .service("web", VIP_V4.into(), protocol, "dsr-l2", "web")
        .pool("web", &backends_v4(&vec![100; n]), None)
        .text()
}

/// Adds backend 3 to the pool and waits until new flows reach it (`third` names its server).
fn add_backend_3(topo: &Topology, agent: &Agent, protocol: &str, third: &str) -> Result<()> {
    agent.write_file("10-web.yaml", &config(protocol, 3))?;
    agent.reload()?;
    let vip = vip_v4(router_tests::addrs::UDP_NAME_PORT);
    let start = std::time::Instant::now();
    loop {
        let tally = if protocol == "udp" {
            router_tests::client::udp_tally(topo.client(), vip, 12)?
        } else {
            let vip = vip_v4(router_tests::addrs::TCP_ECHO_PORT);
            router_tests::client::tcp_tally(topo.client(), vip, 12)?
        };
        if tally.contains_key(third) {
            return Ok(());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "no new flow reached {third} after the reload: {tally:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Connects once from each port of `ports` to `vip`, resets each connection, and counts the
/// backends that answered.
fn reset_connections(
    topo: &Topology,
    vip: SocketAddr,
    ports: std::ops::Range<u16>,
) -> Result<Tally> {
    topo.client().run(|| -> Result<Tally> {
        let mut tally = Tally::new();
        for p in ports {
            let s = TcpSession::connect_from(vip, p).with_context(|| format!("port {p}"))?;
            *tally.entry(s.backend().to_owned()).or_default() += 1;
            s.reset()?;
        }
        Ok(tally)
    })?
}

#[test]
fn reused_tuples_after_an_rst_spread_over_a_new_backend_like_fresh_ones() -> Result<()> {
    if privileged::require_root_and_bpf("reused_tuples_after_an_rst").is_err() {
        return Ok(());
    }
    let (topo, servers, agent) = two_of_three("tcp")?;
    let vip = vip_v4(router_tests::addrs::TCP_ECHO_PORT);
    let third = servers[2].name().to_owned();
    let ports = 41_000..41_000 + FLOWS;
    let before = reset_connections(&topo, vip, ports.clone())?;
    ensure!(
        !before.contains_key(&third),
        "{third} is not in the pool yet: {before:?}"
    );
    add_backend_3(&topo, &agent, "tcp", &third)?;
    let reused = reset_connections(&topo, vip, ports)?;
    let fresh = router_tests::client::tcp_tally(topo.client(), vip, usize::from(FLOWS))?;
    let share = |t: &Tally| t.get(&third).copied().unwrap_or(0);
    // A third of 40 is 13; fewer than 5 would mean the reused tuples kept their old backends.
    ensure!(
        share(&reused) >= 5,
        "reused 5-tuples after an RST: {reused:?}; fresh ones: {fresh:?}"
    );
    ensure!(share(&fresh) >= 5, "fresh 5-tuples: {fresh:?}");
    Ok(())
}

/// Moves the running program's clock forward by `by` through its pinned `CLOCK` map.
fn advance_clock(agent: &Agent, by: Duration) -> Result<()> {
    let path = agent.pin_dir().join(router_common::maps::CLOCK);
    let data = MapData::from_pin(&path).with_context(|| format!("{}", path.display()))?;
    let mut clock: Array<MapData, u64> = Array::try_from(Map::Array(data))?;
    let now = clock.get(&router_common::CLOCK_OFFSET, 0)?;
    clock.set(
        router_common::CLOCK_OFFSET,
        now + u64::try_from(by.as_nanos())?,
        0,
    )?;
    Ok(())
}

#[test]
fn a_udp_flow_paused_past_its_timeout_is_chosen_from_the_current_table() -> Result<()> {
    if privileged::require_root_and_bpf("a_udp_flow_paused_past_its_timeout").is_err() {
        return Ok(());
    }
    let (topo, servers, agent) = two_of_three("udp")?;
    let vip = vip_v4(router_tests::addrs::UDP_NAME_PORT);
    let third = servers[2].name().to_owned();
    let flows = topo
        .client()
        .run(|| -> Result<Vec<_>> { (0..FLOWS).map(|_| udp_flow_socket(vip)).collect() })??;
    let ask = |round: &str| -> Result<Vec<String>> {
        topo.client().run(|| -> Result<Vec<String>> {
            flows
                .iter()
                .enumerate()
                .map(|(k, f)| f.ask().with_context(|| format!("{round}: flow {k}")))
                .collect()
        })?
    };
    let first = ask("before")?;
    ensure!(!first.contains(&third), "{third} is not in the pool yet");
    add_backend_3(&topo, &agent, "udp", &third)?;
    // Within the timeout (60 s by default) every flow stays where it is.
    advance_clock(&agent, Duration::from_secs(30))?;
    let within = ask("within the timeout")?;
    ensure!(
        within == first,
        "flows moved within their timeout: {first:?} → {within:?}"
    );
    // Past it, each is a new flow: chosen from the table that has backend 3.
    advance_clock(&agent, Duration::from_secs(62))?;
    let after = ask("after the timeout")?;
    let moved = after.iter().filter(|b| **b == third).count();
    ensure!(
        moved >= 5,
        "{moved} of {FLOWS} flows idle past their timeout reached {third}: {after:?}"
    );
    Ok(())
}

/// Established connections kept through the SYN flood.
const ESTABLISHED: usize = 200;
/// SYNs of the flood, each a new flow: four times what connection tracking holds.
const FLOOD: u32 = 4 * router_common::CONNTRACK_SIZE;

#[test]
fn two_hundred_connections_survive_a_syn_flood_of_four_times_the_conntrack_size() -> Result<()> {
    use router_tests::{
        addrs::{CLIENT_IF, CLIENT_MAC, LB_CLIENT_SIDE_MAC},
        bench::flood::{Flood, syn_v4_frame},
        client::{self, payload},
    };
    use switchyard::dataplane::{attach::ifindex, maps::KernelMaps};
    if privileged::require_root_and_bpf("two_hundred_connections_survive_a_syn_flood").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", config("tcp", 3))])?;
    let vip = vip_v4(router_tests::addrs::TCP_ECHO_PORT);
    let mut sessions = client::tcp_sessions(topo.client(), vip, ESTABLISHED)?;
    let exchange = |sessions: &mut Vec<TcpSession>, round: usize| -> Result<()> {
        topo.client().run(|| -> Result<()> {
            for (k, s) in sessions.iter_mut().enumerate() {
                s.echo(&payload(round * ESTABLISHED + k, 256))
                    .with_context(|| format!("round {round}: connection {k} to {}", s.backend()))?;
            }
            Ok(())
        })?
    };
    exchange(&mut sessions, 0)?;
    let maps = KernelMaps::open_pinned(&agent.pin_dir())?;
    let tracked = maps.conntrack.keys().count();
    // SYNs from 198.19.x.y (random x, y and source port per frame) to the VIP's port.
    let frame = syn_v4_frame(
        CLIENT_MAC,
        LB_CLIENT_SIDE_MAC,
        std::net::Ipv4Addr::new(198, 19, 0, 0),
        VIP_V4,
        router_tests::addrs::TCP_ECHO_PORT,
    );
    let new_flows = || -> Result<u64> {
        let metrics = agent.api_get("/metrics")?;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("switchyard_packets_total{reason=\"new_flow\"}"))
            .context("no new_flow counter")?;
        Ok(line.rsplit(' ').next().unwrap_or("0").parse()?)
    };
    let before = new_flows()?;
    let flood = Flood::syn(frame)?;
    topo.client().run(|| -> Result<()> {
        let out = ifindex(CLIENT_IF)?;
        let mut sent = 0;
        while sent < FLOOD {
            flood.send(out, 65_536).context("SYN flood")?;
            sent += 65_536;
        }
        Ok(())
    })??;
    let balanced = new_flows()? - before;
    ensure!(
        balanced >= u64::from(router_common::CONNTRACK_SIZE),
        "only {balanced} SYNs reached the balancer: the flood would not fill connection tracking"
    );
    let after = maps.conntrack.keys().count();
    ensure!(
        after <= tracked + 16,
        "the SYN flood wrote to connection tracking: {tracked} entries before, {after} after"
    );
    // Every established connection still reaches its backend.
    exchange(&mut sessions, 1)?;
    Ok(())
}
