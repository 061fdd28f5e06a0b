//! The system on hosts configured as an operator configures real ones: the lb namespace keeps
//! the kernel's defaults (IP forwarding off, an empty neighbour table, no sysctls), and the
//! backends have only what the README tells operators to give them (see `router_tests::netns`).
//! Switchyard finds and follows its next hops itself: the first connection is served, a
//! flushed neighbour table and a backend's new MAC address are followed, a backend behind a
//! router is reached through it, and fragmented datagrams stay on their flow's backend.
//!
//! Each test builds its own topology and agent ([`hosts`]). Every test prints what it
//! measured (read it with `--nocapture`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{
        BACKEND_IF, TCP_ECHO_PORT, UDP_NAME_PORT, VIP_V4, VIP_V6, backend_name, backend_v4,
        backend_v6, mac_string, vip_v4, vip_v6,
    },
    agent::Agent,
    client::{self, Tally, TcpSession},
    config_text::ConfigText,
    load::{Load, LoadReport, LoadSpec},
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

/// The first flow of every service is served — right after the agent answers, with no
/// health check to wait for, so the next hops must be there from the start.
fn first_flow_is_served(test: &str, forward: &str) -> Result<()> {
    let pool = [1, 2];
    let Some(hosts) = hosts(test, Topology::builder().backends(2), forward, &pool)? else {
        return Ok(());
    };
    let client = hosts.topo.client();
    for (what, addr) in services() {
        let started = Instant::now();
        let first = if what.starts_with("TCP") {
            first_tcp(client, addr)
        } else {
            first_udp(client, addr)
        }
        .with_context(|| format!("{what}: {}", hosts.agent.log_text()))?;
        println!(
            "{forward} {what}: the first flow was served by {first} in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        only_from(what, &Tally::from([(first, 1)]), 1, &pool)?;
        only_from(what, &tally(&hosts, what, addr, 20)?, 20, &pool)?;
    }
    Ok(())
}

#[test]
fn a_pool_without_health_check_is_served_from_the_first_flow_with_dsr() -> Result<()> {
    first_flow_is_served(
        "a_pool_without_health_check_is_served_from_the_first_flow_with_dsr",
        "dsr-l2",
    )
}

#[test]
fn a_pool_without_health_check_is_served_from_the_first_flow_with_nat() -> Result<()> {
    first_flow_is_served(
        "a_pool_without_health_check_is_served_from_the_first_flow_with_nat",
        "nat",
    )
}

/// A steady load on `addr`: persistent connections exchanging every 50 ms plus short
/// connections back to back.
fn steady_load(ns: &Netns, addr: SocketAddr) -> Result<Load> {
    Load::start(
        ns,
        LoadSpec {
            addr,
            persistent: 4,
            period: Duration::from_millis(50),
            payload: 256,
            new_pause: Duration::from_millis(10),
            connect_timeout: Duration::from_secs(3),
        },
        Duration::from_secs(15),
    )
}

/// Checks a load's report: no failure of any kind, and progress (exchanges on persistent
/// connections and completed short ones) in phase `phase`.
fn check_load(what: &str, report: &LoadReport, phase: usize) -> Result<()> {
    let p = &report.phases[phase];
    println!(
        "{what}: {} exchanges and {} short connections while flushing, slowest exchange \
         {:.1} ms, {} failures; short connections per backend {:?}",
        p.exchanges,
        p.short_ok,
        p.max_exchange_us as f64 / 1e3,
        report.failures.len(),
        report.short_backends
    );
    ensure!(
        report.failures.is_empty(),
        "{what}: {} failures, first {:?}",
        report.failures.len(),
        report.failures.first()
    );
    ensure!(
        p.exchanges > 0 && p.short_ok > 0,
        "{what}: no progress while the neighbour table was flushed: {p:?}"
    );
    Ok(())
}

fn flushing_the_neighbour_table_loses_nothing(test: &str, forward: &str) -> Result<()> {
    const FLUSHES: usize = 20;
    const FLUSH_EVERY: Duration = Duration::from_millis(100);
    const FLUSHING: usize = 1;
    const AFTER: usize = 2;
    let pool = [1, 2];
    let Some(hosts) = hosts(test, Topology::builder().backends(2), forward, &pool)? else {
        return Ok(());
    };
    let client = hosts.topo.client();
    let loads = [
        ("TCP v4", steady_load(client, vip_v4(TCP_ECHO_PORT))?),
        ("TCP v6", steady_load(client, vip_v6(TCP_ECHO_PORT))?),
    ];
    for (_, load) in &loads {
        load.set_phase(FLUSHING);
    }
    for _ in 0..FLUSHES {
        hosts.topo.lb().ip(&["neigh", "flush", "all"])?;
        // Pacing between flushes, not a wait for a condition.
        std::thread::sleep(FLUSH_EVERY);
    }
    for (_, load) in &loads {
        load.set_phase(AFTER);
    }
    // New flows after the last flush, on every service.
    for (what, addr) in services() {
        only_from(what, &tally(&hosts, what, addr, 20)?, 20, &pool)?;
    }
    for (what, load) in loads {
        let report = load.stop();
        check_load(&format!("{forward} {what}"), &report, FLUSHING)?;
        let backends = report.short_backends.len();
        ensure!(
            backends == pool.len(),
            "{what}: short connections reached {backends} backends: {:?}",
            report.short_backends
        );
    }
    Ok(())
}

#[test]
fn flushing_the_neighbour_table_under_traffic_loses_nothing_with_dsr() -> Result<()> {
    flushing_the_neighbour_table_loses_nothing(
        "flushing_the_neighbour_table_under_traffic_loses_nothing_with_dsr",
        "dsr-l2",
    )
}

#[test]
fn flushing_the_neighbour_table_under_traffic_loses_nothing_with_nat() -> Result<()> {
    flushing_the_neighbour_table_loses_nothing(
        "flushing_the_neighbour_table_under_traffic_loses_nothing_with_nat",
        "nat",
    )
}

/// New connections to `addr` from the client, each with a 200 ms connect timeout, until one
/// is served (then returns its backend) or `limit` passes.
fn first_served_within(ns: &Netns, addr: SocketAddr, limit: Duration) -> Result<String> {
    ns.run(|| -> Result<String> {
        let start = Instant::now();
        loop {
            match TcpSession::connect_with_timeout(addr, Duration::from_millis(200)) {
                Ok(s) => return Ok(s.backend().to_owned()),
                Err(e) if start.elapsed() > limit => {
                    return Err(e).context(format!("nothing served {addr} within {limit:?}"));
                }
                Err(_) => {}
            }
        }
    })?
}

/// A backend's new MAC address, announced by the backend (`arp_notify`, `ndisc_notify`), is
/// followed: new connections reach it again soon after the change. The pool holds that one
/// backend only, so every new connection goes to it.
#[test]
fn a_backends_new_mac_address_is_followed() -> Result<()> {
    const BOUND: Duration = Duration::from_secs(5);
    let pool = [1];
    let Some(hosts) = hosts(
        "a_backends_new_mac_address_is_followed",
        Topology::builder().backends(1),
        "dsr-l2",
        &pool,
    )?
    else {
        return Ok(());
    };
    let (client, b1) = (hosts.topo.client(), hosts.topo.backend(1));
    ensure!(first_tcp(client, vip_v4(TCP_ECHO_PORT))? == "b1");
    for (k, (what, addr)) in [
        ("TCP v4", vip_v4(TCP_ECHO_PORT)),
        ("TCP v6", vip_v6(TCP_ECHO_PORT)),
    ]
    .into_iter()
    .enumerate()
    {
        let new_mac = mac_string([0x02, 0x53, 0x59, 0x0f, 0x01, 0x10 + k as u8]);
        let changed = Instant::now();
        b1.ip(&["link", "set", "dev", BACKEND_IF, "address", &new_mac])?;
        let backend = if k == 0 {
            backend_v4(1).to_string()
        } else {
            router_tests::addrs::backend_v6(1).to_string()
        };
        // The agent's next hop (what the map holds) names the new MAC, polled every 20 ms.
        let followed = hosts
            .agent
            .wait_for(BOUND, |s| {
                s.pools.iter().flat_map(|p| p.backends.iter()).any(|b| {
                    b.address == backend
                        && b.next_hop
                            .as_ref()
                            .and_then(|h| h.via.as_deref())
                            .is_some_and(|v| v.starts_with(&new_mac))
                })
            })
            .with_context(|| format!("{what}; agent log:\n{}", hosts.agent.log_text()))?;
        let served = first_served_within(client, addr, BOUND)
            .with_context(|| format!("{what}; agent log:\n{}", hosts.agent.log_text()))?;
        let took = changed.elapsed();
        println!(
            "{what}: backend b1 changed its MAC to {new_mac}; the agent's next hop had it \
             after {:.1} ms (status polled every 20 ms), a new connection was served after \
             {:.1} ms",
            followed.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e3
        );
        ensure!(served == "b1", "{what}: served by {served}");
        let seen = hosts
            .topo
            .lb()
            .ip(&["neigh", "show", &backend_v4(1).to_string()])?;
        ensure!(
            !seen.contains("02:53:59:00:01:01"),
            "the lb's neighbour entry still has the old MAC: {seen}"
        );
    }
    only_from(
        "UDP v4",
        &tally(&hosts, "UDP v4", vip_v4(UDP_NAME_PORT), 10)?,
        10,
        &pool,
    )
}

/// A backend behind a router (lb → router → backend) is served with NAT: the lb's next hop
/// for it is the router, and its replies come back through the router to the lb.
#[test]
fn a_routed_backend_is_served_through_its_router() -> Result<()> {
    let test = "a_routed_backend_is_served_through_its_router";
    let builder = Topology::builder().backends(1).routed_backend();
    // Backend 2 is the routed one (numbered after the one attached directly).
    let pool = [2];
    let Some(hosts) = hosts(test, builder, "nat", &pool)? else {
        return Ok(());
    };
    ensure!(hosts.topo.routed_backend() == Some(2));
    for (what, addr) in services() {
        let tally = tally(&hosts, what, addr, 20)?;
        println!("nat via the router, {what}: {tally:?}");
        only_from(what, &tally, 20, &pool)?;
    }
    let routed = &hosts.servers[1];
    ensure!(
        routed.tcp_connections() == 40 && routed.udp_datagrams() >= 40,
        "the routed backend saw {} connections and {} datagrams",
        routed.tcp_connections(),
        routed.udp_datagrams()
    );
    Ok(())
}

/// With IP forwarding off on the lb (the kernel's default, which the topology keeps), every
/// service is served over both backends.
fn served_with_forwarding_off(test: &str, forward: &str) -> Result<()> {
    let pool = [1, 2];
    let Some(hosts) = hosts(test, Topology::builder().backends(2), forward, &pool)? else {
        return Ok(());
    };
    let lb = hosts.topo.lb();
    ensure!(sysctl(lb, "net.ipv4.ip_forward")? == "0");
    ensure!(sysctl(lb, "net.ipv6.conf.all.forwarding")? == "0");
    for (what, addr) in services() {
        let tally = tally(&hosts, what, addr, 40)?;
        println!("{forward} with forwarding off, {what}: {tally:?}");
        only_from(what, &tally, 40, &pool)?;
        ensure!(
            tally.len() == 2,
            "{what}: one backend got nothing: {tally:?}"
        );
    }
    Ok(())
}

#[test]
fn dsr_is_served_with_forwarding_off() -> Result<()> {
    served_with_forwarding_off("dsr_is_served_with_forwarding_off", "dsr-l2")
}

#[test]
fn nat_is_served_with_forwarding_off() -> Result<()> {
    served_with_forwarding_off("nat_is_served_with_forwarding_off", "nat")
}

/// Source ports (flows) per family in the fragment test.
const FRAGMENT_FLOWS: usize = 100;
/// Datagrams per flow: alternately small and large, small first.
const DATAGRAMS_PER_FLOW: usize = 10;
/// A small datagram's payload: one frame.
const SMALL: usize = 64;
/// A large datagram's payload: above the veths' 1,500-byte MTU, so the client's kernel
/// fragments it.
const LARGE: usize = 3000;

/// For [`FRAGMENT_FLOWS`] flows to `addr`, sends [`DATAGRAMS_PER_FLOW`] datagrams each,
/// alternately small and large, one at a time, and returns every answer per flow (local
/// port → answers in order). A datagram without an answer within 2 s is an error: a large
/// one whose fragments went to different backends is never reassembled, so never answered.
fn fragment_answers(ns: &Netns, addr: SocketAddr) -> Result<BTreeMap<u16, Vec<(usize, String)>>> {
    ns.run(|| -> Result<_> {
        let mut flows = BTreeMap::new();
        // Every flow's socket stays open to the end, so no two flows share a source port (a
        // closed socket's port may be handed out again, and its flow would be counted once).
        let mut open = Vec::with_capacity(FRAGMENT_FLOWS);
        for f in 0..FRAGMENT_FLOWS {
            let sock = connected_udp(addr)?;
            sock.set_read_timeout(Some(Duration::from_secs(2)))?;
            let port = sock.local_addr()?.port();
            let mut answers = Vec::new();
            for d in 0..DATAGRAMS_PER_FLOW {
                let len = if d % 2 == 0 { SMALL } else { LARGE };
                sock.send(&client::payload(f * DATAGRAMS_PER_FLOW + d, len))?;
                let mut buf = [0u8; 256];
                let n = sock.recv(&mut buf).with_context(|| {
                    format!("flow {f} (port {port}): no answer to datagram {d} of {len} bytes")
                })?;
                answers.push((
                    len,
                    String::from_utf8_lossy(&buf[..n]).trim_end().to_owned(),
                ));
            }
            ensure!(
                flows.insert(port, answers).is_none(),
                "two flows on source port {port}"
            );
            open.push(sock);
        }
        Ok(flows)
    })?
}

/// Every large (fragmented) datagram is answered by the backend that answers the small
/// datagrams of the same flow, for 1,000 datagrams per family.
fn fragments_follow_their_flow(test: &str, forward: &str) -> Result<()> {
    let pool = [1, 2];
    let Some(hosts) = hosts(test, Topology::builder().backends(2), forward, &pool)? else {
        return Ok(());
    };
    for (what, addr) in [
        ("UDP v4", vip_v4(UDP_NAME_PORT)),
        ("UDP v6", vip_v6(UDP_NAME_PORT)),
    ] {
        let flows = fragment_answers(hosts.topo.client(), addr)
            .with_context(|| format!("{forward} {what}; agent log:\n{}", hosts.agent.log_text()))?;
        let mut per_backend = Tally::new();
        let mut answers = 0;
        for (port, list) in &flows {
            let small: Vec<&String> = list
                .iter()
                .filter(|(l, _)| *l == SMALL)
                .map(|(_, n)| n)
                .collect();
            let Some(owner) = small.first() else {
                bail!("flow {port}: no small datagram");
            };
            ensure!(
                small.iter().all(|n| n == owner),
                "{what} flow {port}: small datagrams answered by different backends: {list:?}"
            );
            for (len, name) in list {
                answers += 1;
                ensure!(
                    name == *owner,
                    "{what} flow {port}: a {len}-byte datagram was answered by {name}, the \
                     flow's small datagrams by {owner}: {list:?}"
                );
            }
            *per_backend.entry((*owner).clone()).or_default() += 1;
        }
        println!(
            "{forward} {what}: {answers} datagrams ({} of {LARGE} bytes, fragmented) over \
             {} flows, each answered by its flow's backend; flows per backend {per_backend:?}",
            answers / 2,
            flows.len()
        );
        ensure!(answers == FRAGMENT_FLOWS * DATAGRAMS_PER_FLOW);
        // Both backends own flows, so a fragment sent to the other one would show.
        only_from(what, &per_backend, flows.len(), &pool)?;
        ensure!(
            per_backend.len() == 2,
            "{what}: one backend owns every flow: {per_backend:?}"
        );
    }
    Ok(())
}

#[test]
fn fragmented_datagrams_reach_their_flows_backend_with_dsr() -> Result<()> {
    fragments_follow_their_flow(
        "fragmented_datagrams_reach_their_flows_backend_with_dsr",
        "dsr-l2",
    )
}

#[test]
fn fragmented_datagrams_reach_their_flows_backend_with_nat() -> Result<()> {
    fragments_follow_their_flow(
        "fragmented_datagrams_reach_their_flows_backend_with_nat",
        "nat",
    )
}

/// Port of [`nat_fragments_reach_the_client`]'s server on b1: it answers a datagram that
/// starts with `L` with 3,000 bytes of `r`, anything else with the datagram itself.
const BIG_PORT: u16 = 5353;

/// NAT with datagrams larger than the MTU, IPv4 and IPv6, each from a fresh socket (a new
/// flow): a small request whose reply is fragmented by the backend, and a fragmented request
/// (its first fragment is the flow's first packet) whose reply is fragmented too. Every reply
/// must reach the client whole, from the virtual IP: the reply's first fragment is restored
/// like a whole reply and its later fragments follow it.
#[test]
fn nat_fragments_reach_the_client() -> Result<()> {
    let test = "nat_fragments_reach_the_client";
    if privileged::require_root_and_bpf(test).is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let (b4, b6) = (backend_v4(1), backend_v6(1));
    let cfg = ConfigText::new()
        .pool("one4", &[(b4.into(), 100)], None)
        .pool("one6", &[(b6.into(), 100)], None)
        .text()
        + &format!(
            "services:\n  \
             - {{ name: big4, vip: \"{VIP_V4}\", port: {BIG_PORT}, protocol: udp, forward: nat, \
             to: {{ pool: one4 }} }}\n  \
             - {{ name: big6, vip: \"{VIP_V6}\", port: {BIG_PORT}, protocol: udp, forward: nat, \
             to: {{ pool: one6 }} }}\n"
        );
    let sockets = topo.backend(1).run(move || -> Result<Vec<UdpSocket>> {
        Ok(vec![
            UdpSocket::bind((b4, BIG_PORT))?,
            UdpSocket::bind((b6, BIG_PORT))?,
        ])
    })??;
    for sock in sockets {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                let reply = if buf[..n].first() == Some(&b'L') {
                    vec![b'r'; 3000]
                } else {
                    buf[..n].to_vec()
                };
                let _ = sock.send_to(&reply, from);
            }
        });
    }
    let agent = Agent::start(&topo, &[("10-big.yaml", cfg)])?;
    for vip in [IpAddr::V4(VIP_V4), IpAddr::V6(VIP_V6)] {
        let to = SocketAddr::new(vip, BIG_PORT);
        for (what, request, want) in [
            ("small request, control", b"q".repeat(10), b"q".repeat(10)),
            (
                "small request, fragmented reply",
                b"L".repeat(10),
                b"r".repeat(3000),
            ),
            (
                "fragmented request and reply",
                b"s".repeat(3000),
                b"s".repeat(3000),
            ),
        ] {
            let (from, got) = topo
                .client()
                .run(move || -> Result<(SocketAddr, Vec<u8>)> {
                    let any: SocketAddr = if vip.is_ipv4() {
                        "0.0.0.0:0".parse()?
                    } else {
                        "[::]:0".parse()?
                    };
                    let s = UdpSocket::bind(any)?;
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    s.send_to(&request, to)?;
                    let mut buf = vec![0u8; 65_536];
                    let (n, from) = s.recv_from(&mut buf).context("no answer")?;
                    buf.truncate(n);
                    Ok((from, buf))
                })?
                .with_context(|| format!("{vip}, {what}; agent log:\n{}", agent.log_text()))?;
            ensure!(from == to, "{vip}, {what}: answered from {from}");
            ensure!(
                got == want,
                "{vip}, {what}: {} bytes back, not the {} expected",
                got.len(),
                want.len()
            );
            println!("{vip}, {what}: {} bytes back from {from}", got.len());
        }
    }
    Ok(())
}

/// The lb's link to a backend loses carrier for a second under traffic (a switch port
/// renegotiating): the backend takes no new flows meanwhile, but its established connections
/// are not moved elsewhere (where they would be reset): TCP retransmits through the blip, as
/// through IPVS or a router.
#[test]
fn a_carrier_blip_resets_no_established_connection() -> Result<()> {
    let test = "a_carrier_blip_resets_no_established_connection";
    let Some(hosts) = hosts(test, Topology::builder().backends(2), "dsr-l2", &[1, 2])? else {
        return Ok(());
    };
    let vip = vip_v4(TCP_ECHO_PORT);
    let mut on_b1 = hosts
        .topo
        .client()
        .run(move || -> Result<Vec<TcpSession>> {
            let mut v = Vec::new();
            for _ in 0..24 {
                let mut s = TcpSession::connect(vip)?;
                s.echo(b"hello")?;
                if s.backend() == "b1" {
                    v.push(s);
                }
            }
            Ok(v)
        })??;
    ensure!(!on_b1.is_empty(), "no connection landed on b1");
    let n = on_b1.len();
    let link = router_tests::addrs::lb_backend_if(1);
    hosts.topo.lb().ip(&["link", "set", &link, "down"])?;
    // Traffic during the blip: each connection sends, and its retransmissions cross the blip.
    let talk = hosts.topo.client().spawn(move || -> Vec<String> {
        on_b1
            .iter_mut()
            .filter_map(|s| s.echo(b"during the blip").err().map(|e| format!("{e:#}")))
            .collect()
    })?;
    // The agent sees the carrier go: b1 takes no new flows.
    hosts.agent.wait_for(Duration::from_secs(5), |s| {
        s.pools
            .iter()
            .flat_map(|p| p.backends.iter())
            .any(|b| b.address == backend_v4(1).to_string() && !b.healthy)
    })?;
    for _ in 0..10 {
        let served = hosts
            .topo
            .client()
            .run(move || TcpSession::connect(vip).map(|s| s.backend().to_owned()))??;
        ensure!(
            served == "b2",
            "a new connection during the blip went to {served}"
        );
    }
    hosts.topo.lb().ip(&["link", "set", &link, "up"])?;
    let failures = talk
        .join()
        .map_err(|_| anyhow::anyhow!("the talking thread panicked"))?;
    let reasons: Vec<String> = hosts
        .agent
        .api_get("/metrics")?
        .lines()
        .filter(|l| l.starts_with("switchyard_packets_total"))
        .map(str::to_owned)
        .collect();
    ensure!(
        failures.is_empty(),
        "{} of {n} connections on b1 broke across the blip: {failures:?}\n{reasons:#?}\nagent log:\n{}",
        failures.len(),
        hosts.agent.log_text()
    );
    println!("{n} connections on b1 crossed a carrier blip; new flows went to b2 meanwhile");
    Ok(())
}
