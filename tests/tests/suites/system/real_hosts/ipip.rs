//! `forward: ipip` end to end: two backends on other subnets behind a router (lb → router →
//! backend), each with the VIPs on `lo` and the decapsulator attached by `switchyard decap`
//! (no tunnel device, no ipip module), serve TCP and UDP over IPv4 and IPv6: the lb
//! encapsulates, the router routes the outer packet on its destination, the backend strips it
//! and answers the client directly (through the router's return link; the lb, with the
//! kernel's defaults, forwards nothing). New flows split by weight, and a backend whose server
//! stops loses its flows to the other once its health check fails.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{BACKEND_IF, VIP_V4, VIP_V6, backend_name, backend_v4, backend_v6},
    agent::{self, Agent},
    client::{self, Tally},
    config_text::{ConfigText, FAST_HTTP_CHECK},
    netns::{Netns, Topology},
    privileged, servers, xdp_pass,
};

use super::{services, sysctl};

/// The routed backends (b2, b3; b1 is attached directly and serves nothing here) and their
/// weights.
const POOL: [(usize, u32); 2] = [(2, 100), (3, 300)];
/// Flows per service.
const FLOWS: usize = 1000;

/// `switchyard decap` attached to a backend's interface, detached again on drop.
struct Decap {
    ns: Netns,
    pin_path: String,
}

impl Decap {
    fn run(ns: &Netns, pin_path: &str, extra: &[&str]) -> Result<String> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", ns.path().display()))
            .arg(agent::binary()?)
            .args(["decap", "--iface", BACKEND_IF, "--pin-path", pin_path])
            .args(extra)
            .stdin(Stdio::null())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "switchyard decap in {}: {}{}",
                ns.name(),
                text,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(text)
    }

    /// Replaces the topology's `XDP_PASS` program on the backend's link with the decapsulator
    /// (the frames the router forwards need no XDP program there; the decapsulator is the only
    /// one the interface can have).
    fn attach(ns: &Netns) -> Result<Self> {
        xdp_pass::detach(ns, BACKEND_IF)?;
        let pin_path = agent::unique_pin_path();
        let said = Self::run(ns, &pin_path, &[])?;
        ensure!(
            said.contains("decapsulator attached"),
            "decap said {said:?}"
        );
        Ok(Self {
            ns: ns.clone(),
            pin_path,
        })
    }
}

impl Drop for Decap {
    fn drop(&mut self) {
        let _ = Self::run(&self.ns, &self.pin_path, &["--detach"]);
        let _ = std::fs::remove_dir_all(&self.pin_path);
    }
}

/// `n` flows to `addr` (TCP connections or UDP queries), counted per backend.
fn tally(client: &Netns, what: &str, addr: SocketAddr, n: usize) -> Result<Tally> {
    if what.starts_with("TCP") {
        client::tcp_tally(client, addr, n)
    } else {
        client::udp_tally(client, addr, n)
    }
}

/// A UDP flow (one socket) to `addr` that the backend named `want` answers.
fn udp_flow_to(client: &Netns, addr: SocketAddr, want: &str) -> Result<UdpSocket> {
    client.run(|| -> Result<UdpSocket> {
        for _ in 0..200 {
            let any: SocketAddr = if addr.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            }
            .parse()?;
            let sock = UdpSocket::bind(any)?;
            sock.connect(addr)?;
            sock.set_read_timeout(Some(Duration::from_secs(1)))?;
            if ask(&sock)? == want {
                return Ok(sock);
            }
        }
        bail!("no UDP flow to {addr} reached {want}")
    })?
}

/// One question on a UDP flow; the answering backend's name.
fn ask(sock: &UdpSocket) -> Result<String> {
    let mut buf = [0u8; 256];
    for _ in 0..3 {
        sock.send(b"who?\n")?;
        if let Ok(n) = sock.recv(&mut buf) {
            return Ok(String::from_utf8_lossy(&buf[..n]).trim_end().to_owned());
        }
    }
    bail!("no answer")
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn ipip_serves_routed_backends_that_decapsulate_themselves() -> Result<()> {
    let test = "ipip_serves_routed_backends_that_decapsulate_themselves";
    if privileged::require_root_and_bpf(test).is_err() {
        return Ok(());
    }
    let topo = Topology::builder()
        .backends(1)
        .routed_backends(2)
        .router_return_link()
        .build()?;
    ensure!(
        topo.routed_backends() == (2..4),
        "{:?}",
        topo.routed_backends()
    );
    let mut servers = servers::start_all(&topo)?;
    // The backends have no tunnel device, and the kernel no ipip module to give them one.
    for (i, _) in POOL {
        let links = topo.backend(i).ip(&["-o", "link", "show"])?;
        ensure!(
            !links.contains("tunl0") && !links.contains("ip6tnl0"),
            "b{i} has a tunnel device: {links}"
        );
    }
    println!(
        "ipip module loaded: {}",
        std::path::Path::new("/sys/module/ipip").exists()
    );
    let decaps: Vec<Decap> = POOL
        .iter()
        .map(|(i, _)| Decap::attach(topo.backend(*i)))
        .collect::<Result<_>>()?;
    // Running it again changes nothing.
    let again = Decap::run(topo.backend(2), &decaps[0].pin_path, &[])?;
    ensure!(again.contains("already attached"), "{again:?}");
    ensure!(!again.contains("was asked for"), "{again:?}");
    // Asking for another mode keeps the one it runs in, and says how to change it.
    let other = Decap::run(topo.backend(2), &decaps[0].pin_path, &["--mode", "generic"])?;
    ensure!(
        other.contains("already attached (native mode)")
            && other.contains("--mode generic was asked for; it keeps running in native mode"),
        "{other:?}"
    );

    let v4: Vec<(IpAddr, u32)> = POOL
        .iter()
        .map(|&(i, w)| (backend_v4(i).into(), w))
        .collect();
    let v6: Vec<(IpAddr, u32)> = POOL
        .iter()
        .map(|&(i, w)| (backend_v6(i).into(), w))
        .collect();
    let (r4, r6) = ("198.18.250.0/24", "2001:db8:250::/64");
    let cfg = ConfigText::new()
        .ipip_service("tcp4", VIP_V4.into(), "tcp", r4, "v4")
        .ipip_service("udp4", VIP_V4.into(), "udp", r4, "v4")
        .ipip_service("tcp6", VIP_V6.into(), "tcp", r6, "v6")
        .ipip_service("udp6", VIP_V6.into(), "udp", r6, "v6")
        .pool("v4", &v4, Some(FAST_HTTP_CHECK))
        .on_backend_down("migrate")
        .pool("v6", &v6, Some(FAST_HTTP_CHECK))
        .on_backend_down("migrate");
    let agent = Agent::start(&topo, &[("10-ipip.yaml", cfg.text())])?;
    let lb = topo.lb();
    ensure!(sysctl(lb, "net.ipv4.ip_forward")? == "0");
    ensure!(sysctl(lb, "net.ipv6.conf.all.forwarding")? == "0");
    agent
        .wait_for(Duration::from_secs(20), |s| {
            POOL.iter().all(|&(i, _)| {
                Agent::healthy(s, "v4", &backend_v4(i).to_string()) == Some(true)
                    && Agent::healthy(s, "v6", &backend_v6(i).to_string()) == Some(true)
            })
        })
        .with_context(|| format!("backends never healthy; agent log:\n{}", agent.log_text()))?;

    // The split follows the weights: 1 : 3.
    let total_weight: u32 = POOL.iter().map(|(_, w)| w).sum();
    for (what, addr) in services() {
        let t = tally(topo.client(), what, addr, FLOWS)
            .with_context(|| format!("{what}; agent log:\n{}", agent.log_text()))?;
        println!("ipip {what}: {t:?}");
        ensure!(client::total(&t) == FLOWS, "{what}: {t:?}");
        for (i, w) in POOL {
            let got = t.get(&backend_name(i)).copied().unwrap_or(0);
            #[expect(clippy::cast_precision_loss, reason = "counts of a thousand")]
            let (share, want) = (
                got as f64 / FLOWS as f64,
                f64::from(w) / f64::from(total_weight),
            );
            ensure!(
                (share - want).abs() < 0.07,
                "{what}: b{i} got {got} of {FLOWS} ({share:.3}), weight share {want:.3}"
            );
        }
    }

    // Failover: b3's server stops; its health check fails and its flows go to b2
    // (`on_backend_down: migrate`).
    let failing = 3;
    let flows: Vec<(&str, UdpSocket)> = services()
        .into_iter()
        .filter(|(what, _)| what.starts_with("UDP"))
        .map(|(what, addr)| Ok((what, udp_flow_to(topo.client(), addr, "b3")?)))
        .collect::<Result<_>>()?;
    let pos = servers
        .iter()
        .position(|s| s.name() == backend_name(failing))
        .context("no b3 servers")?;
    servers.remove(pos).stop();
    let took = agent
        .wait_for(Duration::from_secs(10), |s| {
            Agent::healthy(s, "v4", &backend_v4(failing).to_string()) == Some(false)
                && Agent::healthy(s, "v6", &backend_v6(failing).to_string()) == Some(false)
        })
        .context("b3 never marked down")?;
    println!("b3 marked down after {took:?}");
    for (what, sock) in &flows {
        let now = topo.client().run(|| ask(sock))??;
        ensure!(
            now == "b2",
            "{what}: the flow that was on b3 is answered by {now}"
        );
    }
    for (what, addr) in services() {
        let t = tally(topo.client(), what, addr, 200)?;
        println!("ipip {what} after b3 failed: {t:?}");
        ensure!(
            t.len() == 1 && t.get("b2") == Some(&200),
            "{what}: after b3 failed {t:?}"
        );
    }

    // --detach removes the decapsulator: nothing runs on the interface any more.
    drop(decaps);
    for (i, _) in POOL {
        ensure!(
            topo.backend(i).xdp_program(BACKEND_IF)?.is_none(),
            "b{i} still runs an XDP program after --detach"
        );
    }
    drop(agent);
    Ok(())
}

#[test]
fn a_decapsulator_pinned_for_another_namespace_is_neither_replaced_nor_detached() -> Result<()> {
    let test = "a_decapsulator_pinned_for_another_namespace_is_neither_replaced_nor_detached";
    if privileged::require_root_and_bpf(test).is_err() {
        return Ok(());
    }
    // Two backends, each with an interface of the same name in its own namespace, and one
    // pin path on the shared bpffs: the second namespace's command must not touch the first's.
    let topo = Topology::builder().backends(2).build()?;
    let (b1, b2) = (topo.backend(1), topo.backend(2));
    xdp_pass::detach(b1, BACKEND_IF)?;
    xdp_pass::detach(b2, BACKEND_IF)?;
    let first = Decap::attach(b1)?;
    let refused = Decap::run(b2, &first.pin_path, &[]).expect_err("b2 took b1's pinned link");
    ensure!(
        format!("{refused:#}").contains("another network namespace"),
        "{refused:#}"
    );
    let refused =
        Decap::run(b2, &first.pin_path, &["--detach"]).expect_err("b2 detached b1's link");
    ensure!(
        format!("{refused:#}").contains("changed nothing"),
        "{refused:#}"
    );
    let again = Decap::run(b1, &first.pin_path, &[])?;
    ensure!(
        again.contains("already attached"),
        "b1's decapsulator is gone: {again:?}"
    );
    let link = b1.ip(&["-d", "link", "show", BACKEND_IF])?;
    ensure!(link.contains("xdp"), "no XDP program on b1: {link}");
    let pin_path = first.pin_path.clone();
    drop(first);
    let link = b1.ip(&["-d", "link", "show", BACKEND_IF])?;
    ensure!(!link.contains("prog/xdp"), "b1 still has a program: {link}");
    let dir = std::path::Path::new(&pin_path).join("decap");
    ensure!(
        !dir.exists(),
        "{} is left after the last detach",
        dir.display()
    );
    // An interface that does not exist, after one that does: nothing is attached.
    Decap::run(b1, &pin_path, &["--iface", "nosuch0"]).expect_err("nosuch0 was accepted");
    let link = b1.ip(&["-d", "link", "show", BACKEND_IF])?;
    ensure!(
        !link.contains("prog/xdp"),
        "a refused command attached {BACKEND_IF}: {link}"
    );
    let _ = std::fs::remove_dir_all(&pin_path);
    Ok(())
}
