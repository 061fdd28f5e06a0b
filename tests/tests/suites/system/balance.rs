//! The whole system in network namespaces — balancing: the real `switchyard attach` in the lb
//! namespace, real TCP/UDP servers in three backend namespaces, real clients in the client
//! namespace. Each test builds its own topology and agent, so they run in parallel.
//!
//! Health checks and table rebuilds are in `system::health`; bad input, reloads and the
//! agent's lifecycle in the `agent` suites. Every test prints what it measured (read it
//! with `--nocapture`).

use std::fmt::Write as _;
use std::net::SocketAddr;

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, VIP_V6, backend_name, vip_v4, vip_v6},
    agent::Agent,
    client::{self, Tally},
    config_text::{ConfigText, FAST_HTTP_CHECK, backends_v4, backends_v6},
    netns::Topology,
    privileged,
    servers::{self, BackendServers},
};

/// Allowed distance between a backend's measured share of new flows and its weight share,
/// in percentage points: the bound the weighted Maglev tables are held to.
const SHARE_TOLERANCE_PP: f64 = 5.0;

/// A topology with three backends and their servers.
fn three_backends() -> Result<(Topology, Vec<BackendServers>)> {
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    Ok((topo, servers))
}

/// Prints each backend's share of `tally` next to its expected share, then checks every
/// backend is within [`SHARE_TOLERANCE_PP`] of it. `weights[i]` is backend `i + 1`'s weight.
#[expect(
    clippy::cast_precision_loss,
    reason = "flow counts, far below 2^52, as percentages"
)]
fn check_shares(what: &str, tally: &Tally, weights: &[u32]) -> Result<()> {
    let total = client::total(tally);
    let n = total as f64;
    let sum: u32 = weights.iter().sum();
    let mut worst: f64 = 0.0;
    let mut line = format!("{what}: {total} flows:");
    for (i, &w) in weights.iter().enumerate() {
        let name = backend_name(i + 1);
        let got = tally.get(&name).copied().unwrap_or(0) as f64 * 100.0 / n;
        let want = f64::from(w) * 100.0 / f64::from(sum);
        worst = worst.max((got - want).abs());
        let _ = write!(line, " {name} {got:.1} % (weight share {want:.1} %)");
    }
    println!("{line}; largest deviation {worst:.1} pp (bound {SHARE_TOLERANCE_PP} pp)");
    ensure!(
        tally.len() <= weights.len(),
        "{what}: unknown backends answered: {tally:?}"
    );
    ensure!(
        worst <= SHARE_TOLERANCE_PP,
        "{what}: a share is {worst:.1} pp from its weight share: {tally:?}"
    );
    Ok(())
}

/// Connections per distribution test. With 1,000, the kernel's source-port choice (sequential
/// with small random steps, per destination) makes the split vary about twice as much as
/// independent flows would (seen: up to 6.6 pp against ±5), while the hash and the table are
/// within 0.2 pp of their shares for independent flows. 3,000 keeps the ±5 pp bound meaningful
/// without flaking.
const CONNECTIONS: usize = 3_000;

/// [`CONNECTIONS`] TCP connections to the IPv4 VIP, each echoing a 1 KiB payload (checked byte
/// for byte by `tcp_tally`), spread over three backends with `weights`.
fn thousand_connections_follow(weights: [u32; 3]) -> Result<()> {
    let (topo, servers) = three_backends()?;
    let cfg = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&weights), None);
    let _agent = Agent::start(&topo, &[("10-web.yaml", cfg.text())])?;
    let tally = client::tcp_tally(topo.client(), vip_v4(80), CONNECTIONS)?;
    ensure!(
        client::total(&tally) == CONNECTIONS,
        "not every connection completed: {tally:?}"
    );
    // What the backends saw agrees with what the client was told.
    for s in &servers {
        let told = tally.get(s.name()).copied().unwrap_or(0) as u64;
        ensure!(
            s.tcp_connections() == told,
            "{} accepted {} connections, the client counted {told}",
            s.name(),
            s.tcp_connections()
        );
    }
    check_shares(&format!("weights {weights:?}"), &tally, &weights)
}

#[test]
fn thousand_tcp_connections_spread_evenly_over_three_equal_backends() -> Result<()> {
    if privileged::require_root_and_bpf("thousand_tcp_connections_spread_evenly").is_err() {
        return Ok(());
    }
    thousand_connections_follow([100, 100, 100])
}

#[test]
fn thousand_tcp_connections_follow_weights_1_2_1() -> Result<()> {
    if privileged::require_root_and_bpf("thousand_tcp_connections_follow_weights_1_2_1").is_err() {
        return Ok(());
    }
    thousand_connections_follow([1, 2, 1])
}

/// Sends `flows` flows of `datagrams` datagrams each (one socket per flow) from the client to
/// `addr`; checks that every datagram of a flow is answered by one backend, and returns how
/// many flows each backend answered.
fn udp_flows(topo: &Topology, addr: SocketAddr, flows: usize, datagrams: usize) -> Result<Tally> {
    let answers = topo.client().run(|| {
        (0..flows)
            .map(|_| client::udp_flow(addr, datagrams))
            .collect::<Result<Vec<_>>>()
    })??;
    let mut per_flow = Tally::new();
    for (k, flow) in answers.iter().enumerate() {
        ensure!(flow.len() == datagrams, "flow {k}: {} answers", flow.len());
        ensure!(
            flow.iter().all(|b| *b == flow[0]),
            "flow {k} to {addr} moved between backends: {flow:?}"
        );
        *per_flow.entry(flow[0].clone()).or_default() += 1;
    }
    println!(
        "UDP {addr}: {flows} flows × {datagrams} datagrams, each flow on one backend; flows per backend {per_flow:?}"
    );
    Ok(per_flow)
}

/// Checks that new UDP flows (one datagram from a fresh source port each) reach every backend,
/// each at least `min_pct` % of them: a spread, not a weight-share measurement.
#[expect(
    clippy::cast_precision_loss,
    reason = "flow counts, far below 2^52, as percentages"
)]
fn check_spread(what: &str, tally: &Tally, backends: usize, min_pct: f64) -> Result<()> {
    let total = client::total(tally);
    let n = total as f64;
    println!("{what}: {total} new flows: {tally:?}");
    for i in 1..=backends {
        let got = tally.get(&backend_name(i)).copied().unwrap_or(0) as f64 * 100.0 / n;
        ensure!(
            got >= min_pct,
            "{what}: {} got {got:.1} % < {min_pct} %: {tally:?}",
            backend_name(i)
        );
    }
    Ok(())
}

#[test]
fn udp_datagrams_of_one_flow_stay_on_one_backend_and_source_ports_spread() -> Result<()> {
    if privileged::require_root_and_bpf("udp_datagrams_of_one_flow_stay_on_one_backend").is_err() {
        return Ok(());
    }
    let (topo, _servers) = three_backends()?;
    let cfg = ConfigText::new()
        .service("dns", VIP_V4.into(), "udp", "dsr-l2", "dns")
        .pool("dns", &backends_v4(&[100, 100, 100]), None);
    let _agent = Agent::start(&topo, &[("10-dns.yaml", cfg.text())])?;
    let per_flow = udp_flows(&topo, vip_v4(80), 30, 40)?;
    ensure!(
        per_flow.len() >= 2,
        "30 flows all landed on one backend: {per_flow:?}"
    );
    // 300 flows, p = 1/3 each: 20 % is about 5 standard deviations below the mean.
    let tally = client::udp_tally(topo.client(), vip_v4(80), 300)?;
    check_spread("UDP v4", &tally, 3, 20.0)
}

#[test]
fn ipv6_tcp_and_udp_are_balanced_over_the_v6_pool() -> Result<()> {
    if privileged::require_root_and_bpf("ipv6_tcp_and_udp_are_balanced_over_the_v6_pool").is_err() {
        return Ok(());
    }
    let (topo, _servers) = three_backends()?;
    let cfg = ConfigText::new()
        .service("web6", VIP_V6.into(), "tcp", "dsr-l2", "web6")
        .service("dns6", VIP_V6.into(), "udp", "dsr-l2", "web6")
        .pool("web6", &backends_v6(3), Some(FAST_HTTP_CHECK));
    let agent = Agent::start(&topo, &[("10-web6.yaml", cfg.text())])?;
    // The health checks run over IPv6 too: wait until every backend was probed successfully.
    let took = agent.wait_for(std::time::Duration::from_secs(5), |s| {
        s.pools.iter().flat_map(|p| &p.backends).count() == 3
            && s.pools
                .iter()
                .flat_map(|p| &p.backends)
                .all(|b| b.healthy && b.probe.as_ref().is_some_and(|p| p.last_ok))
    })?;
    println!("IPv6 health checks: all three backends probed healthy after {took:?}");
    // As many as the IPv4 tests: 600 connections flaked against the ±5 pp bound (6.3 pp seen
    // once in a full run; the kernel's sequential source ports make small samples lumpy).
    let tally = client::tcp_tally(topo.client(), vip_v6(80), CONNECTIONS)?;
    ensure!(
        client::total(&tally) == CONNECTIONS,
        "v6 connections failed: {tally:?}"
    );
    check_shares("TCP v6", &tally, &[100, 100, 100])?;
    udp_flows(&topo, vip_v6(80), 10, 20)?;
    let udp = client::udp_tally(topo.client(), vip_v6(80), 150)?;
    // 150 flows, p = 1/3: 15 % is about 4.7 standard deviations below the mean.
    check_spread("UDP v6", &udp, 3, 15.0)
}

#[test]
fn nat_mode_carries_tcp_and_udp_end_to_end() -> Result<()> {
    if privileged::require_root_and_bpf("nat_mode_carries_tcp_and_udp_end_to_end").is_err() {
        return Ok(());
    }
    let (topo, _servers) = three_backends()?;
    // Take the VIPs off the backends' loopbacks (the servers are already bound): a packet
    // still addressed to the VIP would now be dropped, so every answer proves the program
    // rewrote the destination to the backend and the reply's source back to the VIP.
    for b in topo.backends() {
        b.ip(&["addr", "del", &format!("{VIP_V4}/32"), "dev", "lo"])?;
        b.ip(&["addr", "del", &format!("{VIP_V6}/128"), "dev", "lo"])?;
    }
    let cfg = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "nat", "web")
        .service("dns", VIP_V4.into(), "udp", "nat", "web")
        .service("web6", VIP_V6.into(), "tcp", "nat", "web6")
        .service("dns6", VIP_V6.into(), "udp", "nat", "web6")
        .pool("web", &backends_v4(&[100, 100, 100]), None)
        .pool("web6", &backends_v6(3), None);
    let _agent = Agent::start(&topo, &[("10-nat.yaml", cfg.text())])?;
    let tcp = client::tcp_tally(topo.client(), vip_v4(80), 300).context("NAT TCP v4")?;
    ensure!(client::total(&tcp) == 300, "NAT TCP v4: {tcp:?}");
    check_spread("NAT TCP v4 (echo verified)", &tcp, 3, 20.0)?;
    let tcp6 = client::tcp_tally(topo.client(), vip_v6(80), 150).context("NAT TCP v6")?;
    ensure!(client::total(&tcp6) == 150, "NAT TCP v6: {tcp6:?}");
    check_spread("NAT TCP v6 (echo verified)", &tcp6, 3, 15.0)?;
    udp_flows(&topo, vip_v4(80), 10, 20).context("NAT UDP v4 flows")?;
    let udp = client::udp_tally(topo.client(), vip_v4(80), 150).context("NAT UDP v4")?;
    check_spread("NAT UDP v4", &udp, 3, 15.0)?;
    udp_flows(&topo, vip_v6(80), 10, 20).context("NAT UDP v6 flows")?;
    let udp6 = client::udp_tally(topo.client(), vip_v6(80), 150).context("NAT UDP v6")?;
    check_spread("NAT UDP v6", &udp6, 3, 15.0)
}
