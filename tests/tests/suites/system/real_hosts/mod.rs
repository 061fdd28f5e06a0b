//! The system on hosts configured as an operator configures real ones: the lb namespace keeps
//! the kernel's defaults (IP forwarding off, an empty neighbour table, no sysctls), and the
//! backends have only what the README tells operators to give them (see `router_tests::netns`).
//! Switchyard finds and follows its next hops itself: the first connection is served, a
//! flushed neighbour table and a backend's new MAC address are followed, a backend behind a
//! router is reached through it, and fragmented datagrams stay on their flow's backend.
//!
//! Each test builds its own topology and agent ([`hosts`]). Every test prints what it
//! measured (read it with `--nocapture`).

mod first_flow;
mod fragments;
mod ipip;
mod neighbours;
mod routing;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{
        TCP_ECHO_PORT, UDP_NAME_PORT, VIP_V4, VIP_V6, backend_name, backend_v4, backend_v6, vip_v4,
        vip_v6,
    },
    agent::Agent,
    client::{self, Tally, TcpSession},
    config_text::ConfigText,
    netns::{Netns, Topology, TopologyBuilder},
    privileged,
    servers::{self, BackendServers},
};

/// A running system: the agent, the backends' servers and the namespaces, dropped in this
/// order (the agent stops before its namespace goes).
struct Hosts {
    agent: Agent,
    servers: Vec<BackendServers>,
    topo: Topology,
}

/// The one setup of this file: builds `topo`, starts every backend's servers and an agent
/// whose config has TCP and UDP services on both VIPs forwarding with `forward`, every new
/// flow going to a pool of backends `pool` (their IPv4 or IPv6 addresses, weight 100 each)
/// with no health check. `None` when the test must be skipped (no root or BPF).
fn hosts(
    test: &str,
    topo: TopologyBuilder,
    forward: &str,
    pool: &[usize],
) -> Result<Option<Hosts>> {
    if privileged::require_root_and_bpf(test).is_err() {
        return Ok(None);
    }
    let topo = topo.build()?;
    let servers = servers::start_all(&topo)?;
    let v4: Vec<(IpAddr, u32)> = pool.iter().map(|&i| (backend_v4(i).into(), 100)).collect();
    let v6: Vec<(IpAddr, u32)> = pool.iter().map(|&i| (backend_v6(i).into(), 100)).collect();
    let cfg = ConfigText::new()
        .service("tcp4", VIP_V4.into(), "tcp", forward, "v4")
        .service("udp4", VIP_V4.into(), "udp", forward, "v4")
        .service("tcp6", VIP_V6.into(), "tcp", forward, "v6")
        .service("udp6", VIP_V6.into(), "udp", forward, "v6")
        .pool("v4", &v4, None)
        .pool("v6", &v6, None);
    let agent = Agent::start(&topo, &[("10-hosts.yaml", cfg.text())])?;
    Ok(Some(Hosts {
        agent,
        servers,
        topo,
    }))
}

/// The VIP addresses of the four services, with what each is.
fn services() -> [(&'static str, SocketAddr); 4] {
    [
        ("TCP v4", vip_v4(TCP_ECHO_PORT)),
        ("UDP v4", vip_v4(UDP_NAME_PORT)),
        ("TCP v6", vip_v6(TCP_ECHO_PORT)),
        ("UDP v6", vip_v6(UDP_NAME_PORT)),
    ]
}

/// `n` flows to the service `what` at `addr` from the client: TCP connections (each echoes
/// 1 KiB) or single UDP queries, counted per backend.
fn tally(hosts: &Hosts, what: &str, addr: SocketAddr, n: usize) -> Result<Tally> {
    let client = hosts.topo.client();
    let tally = if what.starts_with("TCP") {
        client::tcp_tally(client, addr, n)
    } else {
        client::udp_tally(client, addr, n)
    };
    tally.with_context(|| format!("{what}; agent log:\n{}", hosts.agent.log_text()))
}

/// Checks that `tally` has `n` answers, all from backends of `pool`.
fn only_from(what: &str, tally: &Tally, n: usize, pool: &[usize]) -> Result<()> {
    let names: Vec<String> = pool.iter().map(|&i| backend_name(i)).collect();
    ensure!(
        client::total(tally) == n && tally.keys().all(|k| names.contains(k)),
        "{what}: {n} flows expected from {names:?}, got {tally:?}"
    );
    Ok(())
}

/// One TCP connection to `addr` that must succeed on its first SYN (a connect timeout below
/// the kernel's initial retransmission timeout of 1 s), returning the backend's name.
fn first_tcp(ns: &Netns, addr: SocketAddr) -> Result<String> {
    ns.run(|| -> Result<String> {
        let mut s = TcpSession::connect_with_timeout(addr, Duration::from_millis(900))?;
        s.echo(b"first")?;
        let name = s.backend().to_owned();
        s.finish()?;
        Ok(name)
    })?
}

/// One UDP datagram to `addr`, sent once, which must be answered within 900 ms; returns the
/// backend's name.
fn first_udp(ns: &Netns, addr: SocketAddr) -> Result<String> {
    ns.run(|| -> Result<String> {
        let sock = connected_udp(addr)?;
        sock.set_read_timeout(Some(Duration::from_millis(900)))?;
        sock.send(b"first?\n")?;
        let mut buf = [0u8; 256];
        let n = sock
            .recv(&mut buf)
            .with_context(|| format!("no answer to the first datagram to {addr}"))?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim_end().to_owned())
    })?
}

/// A UDP socket on an ephemeral port (a new flow), connected to `addr`, in the calling
/// thread's namespace.
fn connected_udp(addr: SocketAddr) -> Result<UdpSocket> {
    let any: IpAddr = if addr.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let sock = UdpSocket::bind((any, 0))?;
    sock.connect(addr)?;
    Ok(sock)
}

/// `sysctl -n key` in `ns`.
fn sysctl(ns: &Netns, key: &str) -> Result<String> {
    Ok(ns.exec(&["sysctl", "-n", key])?.trim().to_owned())
}
