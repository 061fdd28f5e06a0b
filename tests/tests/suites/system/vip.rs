//! The whole system in network namespaces — virtual IPs are the balancer's: a client's packets
//! to a VIP port no service has are dropped and counted (`vip_no_service`), and nothing comes
//! back (no ICMP redirect, no port unreachable); `ping` to a VIP (IPv4 and IPv6) is answered
//! from the VIP while its services have a usable backend, and not when its `vips:` entry turns
//! echo off or every backend is down.

use std::net::{IpAddr, UdpSocket};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, VIP_V6, vip_v4},
    agent::Agent,
    client::{icmp_messages, icmp_socket, ping},
    config_text::{ConfigText, backends_v4, backends_v6},
    netns::Topology,
    privileged, servers,
};

/// How long a ping waits for its answer, and a check for silence listens.
const WAIT: Duration = Duration::from_millis(500);

/// Services on both VIPs over three backends each, with `check` as the pools' health check,
/// and `vips` appended as the config's `vips:` section.
fn config(check: Option<&str>, vips: &str) -> String {
    let text = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .service("web6", VIP_V6.into(), "tcp", "dsr-l2", "web6")
        .pool("web", &backends_v4(&[100, 100, 100]), check)
        .pool("web6", &backends_v6(3), check)
        .text();
    format!("{text}{vips}")
}

/// The `vip_no_service` packet counter of `/metrics`.
fn vip_no_service(agent: &Agent) -> Result<u64> {
    let metrics = agent.api_get("/metrics")?;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("switchyard_packets_total{reason=\"vip_no_service\"}"))
        .context("no vip_no_service counter in /metrics")?;
    Ok(line.rsplit(' ').next().unwrap_or("0").parse()?)
}

/// Pings both VIPs from the client; returns whether each answered.
fn ping_both(topo: &Topology) -> Result<(bool, bool)> {
    topo.client().run(|| -> Result<(bool, bool)> {
        Ok((
            ping(IpAddr::V4(VIP_V4), WAIT)?,
            ping(IpAddr::V6(VIP_V6), WAIT)?,
        ))
    })?
}

#[test]
fn a_vip_drops_what_no_service_takes_and_answers_ping_while_it_has_backends() -> Result<()> {
    if privileged::require_root_and_bpf("a_vip_drops_what_no_service_takes").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", config(None, ""))])?;

    let (v4, v6) = ping_both(&topo)?;
    ensure!(v4 && v6, "ping to the VIPs answered: IPv4 {v4}, IPv6 {v6}");

    // A port no service has: the datagrams are dropped and counted, and nothing comes back.
    let before = vip_no_service(&agent)?;
    let heard = topo.client().run(|| -> Result<Vec<(IpAddr, Vec<u8>)>> {
        let icmp = icmp_socket(false)?;
        let udp = UdpSocket::bind("0.0.0.0:0")?;
        for _ in 0..5 {
            udp.send_to(b"anyone?", vip_v4(9999))?;
        }
        // A TCP SYN to a closed VIP port gets no RST either.
        let tcp = std::net::TcpStream::connect_timeout(&vip_v4(8081), Duration::from_millis(200));
        ensure!(
            tcp.is_err(),
            "a connection to a VIP port no service has was accepted"
        );
        icmp_messages(&icmp, WAIT)
    })??;
    let from_vip: Vec<_> = heard
        .iter()
        .filter(|(from, _)| matches!(from, IpAddr::V4(a) if a.octets()[..2] == [198, 18]))
        .collect();
    ensure!(
        from_vip.is_empty(),
        "ICMP came back for traffic to a VIP port no service has (type 5 is a redirect): {from_vip:?}"
    );
    let dropped = vip_no_service(&agent)? - before;
    ensure!(
        dropped >= 5,
        "{dropped} packets counted as vip_no_service, 5 datagrams and a SYN sent"
    );

    // Echo turned off for the IPv4 VIP: no answer there; the IPv6 VIP still answers.
    let quiet = format!("vips:\n  - {{ address: \"{VIP_V4}\", echo: false }}\n");
    agent.write_file("10-web.yaml", &config(None, &quiet))?;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(10), |s| s.generation >= 2)?;
    let (v4, v6) = ping_both(&topo)?;
    ensure!(
        !v4 && v6,
        "with echo off on the IPv4 VIP: IPv4 {v4}, IPv6 {v6}"
    );

    // Every backend down (a check on a port nothing listens on): no VIP answers.
    let dead = "{ tcp: { port: 9 }, interval: 200ms, timeout: 100ms, unhealthy_threshold: 1, \
                healthy_threshold: 1 }";
    agent.write_file("10-web.yaml", &config(Some(dead), ""))?;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(10), |s| {
        s.pools
            .iter()
            .all(|p| p.backends.iter().all(|b| !b.healthy))
    })?;
    let (v4, v6) = ping_both(&topo)?;
    ensure!(!v4 && !v6, "with every backend down: IPv4 {v4}, IPv6 {v6}");
    Ok(())
}
