//! Fragmented datagrams reach their flow's backend (DSR and NAT), and NAT replies that the
//! backend fragments reach the client.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{UDP_NAME_PORT, VIP_V4, VIP_V6, backend_v4, backend_v6, vip_v4, vip_v6},
    agent::Agent,
    client::{self, Tally},
    config_text::ConfigText,
    netns::{Netns, Topology},
    privileged,
};

use super::{connected_udp, hosts, only_from};

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
