//! The XDP program as a pure function of (maps, packet), through `BPF_PROG_TEST_RUN`: a
//! fixture table of crafted frames with the expected verdict, reason counter and output frame
//! (MACs, addresses and every checksum recomputed here, independently of the program).
//!
//! Privileged: needs root and BPF. Without them these tests say so loudly and return; under
//! `CI=true` that is a failure.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, Result, bail, ensure};
use router_common::Reason;
use router_tests::{
    addrs::{self, CLIENT_V4, CLIENT_V6, VIP_V4, VIP_V6, backend_mac, backend_v4, backend_v6},
    lab::{Lab, Run, pool},
    packets::{self, Seen, inspect},
    privileged,
};
use switchyard::config::{
    Agent, Config, Forward, HashMode, Protocol, Service, SplitShare, Target, WhenAllDown,
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

const BACKENDS: usize = 3;
const OTHER_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 99);

fn svc(
    name: &str,
    vip: IpAddr,
    port: u16,
    protocol: Protocol,
    forward: Forward,
    to: &str,
) -> Service {
    Service {
        name: name.into(),
        vip,
        port,
        protocol,
        forward,
        hash: HashMode::FiveTuple,
        to: Target::Pool(to.into()),
    }
}

/// The services every fixture runs against.
fn fixture_config() -> Config {
    let v4: Vec<IpAddr> = (1..=BACKENDS).map(|i| backend_v4(i).into()).collect();
    let v6: Vec<IpAddr> = (1..=BACKENDS).map(|i| backend_v6(i).into()).collect();
    let vip4 = IpAddr::V4(VIP_V4);
    let vip6 = IpAddr::V6(VIP_V6);
    let mut sticky = svc("sticky", vip4, 443, Protocol::Tcp, Forward::DsrL2, "web");
    sticky.hash = HashMode::SourceIp;
    let mut split = svc("split", vip4, 8443, Protocol::Tcp, Forward::DsrL2, "web");
    split.to = Target::Split(vec![
        SplitShare {
            pool: "web".into(),
            weight: 1,
        },
        SplitShare {
            pool: "solo".into(),
            weight: 1,
        },
    ]);
    Config {
        agent: Agent {
            api: "127.0.0.1:9900".parse().unwrap(),
            pin_path: "/sys/fs/bpf/x".into(),
            state_dir: "/var/lib/switchyard".into(),
        },
        services: vec![
            svc("web", vip4, 80, Protocol::Tcp, Forward::DsrL2, "web"),
            svc("dns", vip4, 53, Protocol::Udp, Forward::Nat, "web"),
            svc("web6", vip6, 80, Protocol::Tcp, Forward::DsrL2, "web6"),
            svc("dns6", vip6, 53, Protocol::Udp, Forward::Nat, "web6"),
            svc("api", vip4, 8080, Protocol::Tcp, Forward::Nat, "web"),
            sticky,
            split,
            svc("closed", vip4, 81, Protocol::Tcp, Forward::DsrL2, "drop"),
            svc("open", vip4, 82, Protocol::Tcp, Forward::DsrL2, "pass"),
        ],
        pools: vec![
            pool("web", v4, WhenAllDown::Drop),
            pool("web6", v6, WhenAllDown::Drop),
            pool("solo", vec![backend_v4(1).into()], WhenAllDown::Drop),
            pool("drop", vec![backend_v4(2).into()], WhenAllDown::Drop),
            pool("pass", vec![backend_v4(3).into()], WhenAllDown::Pass),
        ],
        state: vec![],
        decisions: vec![],
        rules: Default::default(),
    }
}

fn lab(tag: &str) -> Option<Lab> {
    if privileged::require_root_and_bpf(tag).is_err() {
        return None;
    }
    let mut lab = Lab::new(tag, BACKENDS, &fixture_config()).expect("lab");
    lab.set_health("drop", &backend_v4(2).to_string(), false)
        .expect("health");
    lab.set_health("pass", &backend_v4(3).to_string(), false)
        .expect("health");
    Some(lab)
}

/// Which backend (1-based) a forwarded frame was addressed to, by MAC.
fn backend_of(seen: &Seen) -> Result<usize> {
    (1..=BACKENDS)
        .find(|i| backend_mac(*i) == seen.dst_mac)
        .with_context(|| format!("destination MAC {:02x?} is no backend's", seen.dst_mac))
}

/// Which backend (1-based) a frame is addressed to, read from its first six bytes.
fn backend_by_mac(frame: &[u8]) -> Result<usize> {
    let mac = frame.get(..6).context("runt")?;
    (1..=BACKENDS)
        .find(|i| backend_mac(*i) == mac)
        .context("no backend's MAC")
}

/// Expected outcome of one fixture.
#[derive(Debug)]
enum Expect {
    /// `XDP_PASS` with the frame untouched.
    Pass(Reason),
    /// `XDP_DROP`.
    Drop(Reason),
    /// Forwarded (DSR) to a backend's MAC, IP header untouched.
    Dsr(Reason),
    /// Forwarded with the destination rewritten to the backend's address (NAT).
    Nat(Reason),
}

struct Fixture {
    name: &'static str,
    frame: Vec<u8>,
    expect: Expect,
}

/// Runs one fixture and returns the backend it reached, if any.
fn check(lab: &Lab, f: &Fixture) -> Result<Option<usize>> {
    let reason = match f.expect {
        Expect::Pass(r) | Expect::Drop(r) | Expect::Dsr(r) | Expect::Nat(r) => r,
    };
    let before = lab.reason(reason);
    let run: Run = lab.run(&f.frame)?;
    let counted = lab.reason(reason) - before;
    if counted != 1 {
        let (action, reasons) = lab.explain(&f.frame)?;
        bail!(
            "{}: reason {reason:?} counted {counted} times; a rerun gives {action} {reasons:?}",
            f.name
        );
    }
    match f.expect {
        Expect::Pass(_) => {
            ensure!(
                run.action == XDP_PASS,
                "{}: action {} (want PASS)",
                f.name,
                run.action
            );
            ensure!(
                run.out == f.frame,
                "{}: a passed frame was modified",
                f.name
            );
            Ok(None)
        }
        Expect::Drop(_) => {
            ensure!(
                run.action == XDP_DROP,
                "{}: action {} (want DROP)",
                f.name,
                run.action
            );
            Ok(None)
        }
        Expect::Dsr(_) | Expect::Nat(_) => {
            ensure!(
                run.action == XDP_REDIRECT || run.action == XDP_TX,
                "{}: action {} (want TX or REDIRECT)",
                f.name,
                run.action
            );
            let before = inspect(&f.frame)?;
            let seen = inspect(&run.out)?;
            let b = backend_of(&seen)?;
            ensure!(
                seen.src_mac == addrs::lb_backend_side_mac(b),
                "{}: source MAC",
                f.name
            );
            ensure!(
                seen.checksums_ok,
                "{}: a checksum does not verify: {seen:?}",
                f.name
            );
            ensure!(seen.src == before.src, "{}: source address changed", f.name);
            let want_dst = match (&f.expect, before.dst) {
                (Expect::Nat(_), IpAddr::V4(_)) => IpAddr::V4(backend_v4(b)),
                (Expect::Nat(_), IpAddr::V6(_)) => IpAddr::V6(backend_v6(b)),
                _ => before.dst,
            };
            ensure!(
                seen.dst == want_dst,
                "{}: destination {} (want {want_dst})",
                f.name,
                seen.dst
            );
            Ok(Some(b))
        }
    }
}

fn run_table(lab: &Lab, table: &[Fixture]) -> Result<()> {
    let mut failures = Vec::new();
    for f in table {
        if let Err(e) = check(lab, f) {
            failures.push(format!("{e:#}"));
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} of {} fixtures failed:\n{}",
            failures.len(),
            table.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

fn c4() -> IpAddr {
    CLIENT_V4.into()
}
fn c6() -> IpAddr {
    CLIENT_V6.into()
}
fn v4() -> IpAddr {
    VIP_V4.into()
}
fn v6() -> IpAddr {
    VIP_V6.into()
}

#[test]
fn fixture_table_gives_each_packet_its_documented_verdict() -> Result<()> {
    let Some(lab) = lab("fx-table") else {
        return Ok(());
    };
    let tcp4 = packets::tcp(c4(), 40000, v4(), 80);
    let table = vec![
        Fixture {
            name: "tcp v4 to a dsr VIP",
            frame: tcp4.clone(),
            expect: Expect::Dsr(Reason::NewFlow),
        },
        Fixture {
            name: "tcp v6 to a dsr VIP",
            frame: packets::tcp(c6(), 40000, v6(), 80),
            expect: Expect::Dsr(Reason::NewFlow),
        },
        Fixture {
            name: "udp v4 to a nat VIP",
            frame: packets::udp(c4(), 5353, v4(), 53),
            expect: Expect::Nat(Reason::NewFlow),
        },
        Fixture {
            name: "udp v6 to a nat VIP",
            frame: packets::udp(c6(), 5353, v6(), 53),
            expect: Expect::Nat(Reason::NewFlow),
        },
        Fixture {
            name: "tcp v4 to a nat VIP",
            frame: packets::tcp(c4(), 40001, v4(), 8080),
            expect: Expect::Nat(Reason::NewFlow),
        },
        Fixture {
            name: "udp v4 nat without checksum",
            frame: zero_udp_checksum(packets::udp(c4(), 5354, v4(), 53)),
            expect: Expect::Nat(Reason::NewFlow),
        },
        Fixture {
            name: "802.1Q tagged",
            frame: packets::tcp_vlan(CLIENT_V4, 40002, VIP_V4, 80, 1),
            expect: Expect::Dsr(Reason::NewFlow),
        },
        Fixture {
            name: "802.1ad + 802.1Q tagged",
            frame: packets::tcp_vlan(CLIENT_V4, 40003, VIP_V4, 80, 2),
            expect: Expect::Dsr(Reason::NewFlow),
        },
        Fixture {
            name: "ipv4 with options",
            frame: packets::tcp_v4_with_options(CLIENT_V4, 40004, VIP_V4, 80)?,
            expect: Expect::Dsr(Reason::NewFlow),
        },
        Fixture {
            name: "ipv6 with extension headers",
            frame: packets::tcp_v6_with_ext(CLIENT_V6, 40005, VIP_V6, 80)?,
            expect: Expect::Dsr(Reason::NewFlow),
        },
        Fixture {
            name: "not a VIP",
            frame: packets::tcp(c4(), 40000, OTHER_V4.into(), 80),
            expect: Expect::Pass(Reason::NoService),
        },
        Fixture {
            name: "VIP, other port",
            frame: packets::tcp(c4(), 40000, v4(), 8081),
            expect: Expect::Pass(Reason::NoService),
        },
        Fixture {
            name: "VIP, other protocol",
            frame: packets::udp(c4(), 40000, v4(), 80),
            expect: Expect::Pass(Reason::NoService),
        },
        Fixture {
            name: "ping to the VIP",
            frame: packets::ping(CLIENT_V4, VIP_V4)?,
            expect: Expect::Pass(Reason::NoService),
        },
        Fixture {
            name: "ARP",
            frame: packets::arp(),
            expect: Expect::Pass(Reason::NotIp),
        },
        Fixture {
            name: "runt: Ethernet header only",
            frame: tcp4[..14].to_vec(),
            expect: Expect::Pass(Reason::MalformedPass),
        },
        Fixture {
            name: "truncated IPv4 header",
            frame: tcp4[..14 + 12].to_vec(),
            expect: Expect::Pass(Reason::MalformedPass),
        },
        Fixture {
            name: "truncated before the ports",
            frame: tcp4[..14 + 20 + 2].to_vec(),
            expect: Expect::Pass(Reason::MalformedPass),
        },
        Fixture {
            name: "IPv4 IHL below 5",
            frame: set_byte(tcp4.clone(), 14, 0x44),
            expect: Expect::Pass(Reason::MalformedPass),
        },
        Fixture {
            name: "IPv4 IHL past the end",
            frame: set_byte(tcp4[..14 + 20 + 4].to_vec(), 14, 0x4f),
            expect: Expect::Pass(Reason::MalformedPass),
        },
        Fixture {
            name: "IP version 4 in an IPv6 frame",
            frame: set_byte(packets::tcp(c6(), 1, v6(), 80), 14, 0x45),
            expect: Expect::Pass(Reason::MalformedPass),
        },
        Fixture {
            name: "VLAN tag cut short",
            frame: packets::tcp_vlan(CLIENT_V4, 40006, VIP_V4, 80, 2)[..16].to_vec(),
            expect: Expect::Pass(Reason::MalformedPass),
        },
        Fixture {
            name: "pool down, when_all_down drop",
            frame: packets::tcp(c4(), 40000, v4(), 81),
            expect: Expect::Drop(Reason::NoBackend),
        },
        Fixture {
            name: "pool down, when_all_down pass",
            frame: packets::tcp(c4(), 40000, v4(), 82),
            expect: Expect::Pass(Reason::AllDownPass),
        },
    ];
    run_table(&lab, &table)
}

fn set_byte(mut frame: Vec<u8>, at: usize, value: u8) -> Vec<u8> {
    if let Some(b) = frame.get_mut(at) {
        *b = value;
    }
    frame
}

fn zero_udp_checksum(frame: Vec<u8>) -> Vec<u8> {
    set_byte(set_byte(frame, 14 + 20 + 6, 0), 14 + 20 + 7, 0)
}

fn forwarded(lab: &Lab, frame: &[u8]) -> Result<usize> {
    let run = lab.run(frame)?;
    ensure!(
        run.action == XDP_REDIRECT || run.action == XDP_TX,
        "not forwarded: {}",
        run.action
    );
    backend_of(&inspect(&run.out)?)
}

#[test]
fn a_flow_stays_on_its_backend_through_conntrack() -> Result<()> {
    let Some(lab) = lab("fx-ct") else {
        return Ok(());
    };
    let frame = packets::tcp(c4(), 41000, v4(), 80);
    let first = forwarded(&lab, &frame)?;
    let hits = lab.reason(Reason::ConntrackHit);
    for _ in 0..5 {
        ensure!(forwarded(&lab, &frame)? == first, "flow moved");
    }
    ensure!(
        lab.reason(Reason::ConntrackHit) - hits == 5,
        "conntrack hits not counted"
    );
    Ok(())
}

#[test]
fn headers_in_the_way_do_not_change_the_backend() -> Result<()> {
    let Some(mut lab) = lab("fx-hdrs") else {
        return Ok(());
    };
    // Different client ports, so none of these is a conntrack hit on another.
    for port in 42000..42010u16 {
        let plain = forwarded(&lab, &packets::tcp(c4(), port, v4(), 80))?;
        lab_flush_conntrack(&mut lab);
        let opts = forwarded(
            &lab,
            &packets::tcp_v4_with_options(CLIENT_V4, port, VIP_V4, 80)?,
        )?;
        lab_flush_conntrack(&mut lab);
        let vlan = forwarded(&lab, &packets::tcp_vlan(CLIENT_V4, port, VIP_V4, 80, 2))?;
        ensure!(
            plain == opts && plain == vlan,
            "port {port}: {plain} {opts} {vlan}"
        );
        lab_flush_conntrack(&mut lab);
        let plain6 = forwarded(&lab, &packets::tcp(c6(), port, v6(), 80))?;
        lab_flush_conntrack(&mut lab);
        let ext6 = forwarded(
            &lab,
            &packets::tcp_v6_with_ext(CLIENT_V6, port, VIP_V6, 80)?,
        )?;
        ensure!(
            plain6 == ext6,
            "port {port}: v6 {plain6} with ext headers {ext6}"
        );
        lab_flush_conntrack(&mut lab);
    }
    Ok(())
}

/// Empties conntrack so the next packet is a fresh Maglev selection.
fn lab_flush_conntrack(lab: &mut Lab) {
    lab.flush_conntrack();
}

#[test]
fn all_fragments_of_a_datagram_reach_one_backend() -> Result<()> {
    let Some(lab) = lab("fx-frag") else {
        return Ok(());
    };
    let payload = [7u8; 200];
    for id in 1..=8u16 {
        let full = packets::udp_with(c4(), 6000 + id, v4(), 53, &payload);
        let (first, later) = packets::fragment_v4(&full, 64, id)?;
        let run = lab.run(&first)?;
        let a = backend_of(&inspect(&run.out)?)?;
        let run = lab.run(&later)?;
        ensure!(
            run.action == XDP_REDIRECT,
            "later fragment: action {}",
            run.action
        );
        let seen = inspect(&run.out)?;
        ensure!(backend_of(&seen)? == a, "fragments split over backends");
        ensure!(
            seen.dst == IpAddr::V4(backend_v4(a)),
            "later fragment not NAT-rewritten"
        );
        ensure!(seen.checksums_ok, "later fragment IP checksum");
    }
    for id in 1..=4u32 {
        let full = packets::udp_with(c6(), 7000 + id as u16, v6(), 53, &payload);
        let (first, later) = packets::fragment_v6(&full, 64, id)?;
        // Read the MAC directly: etherparse 0.16 misparses a later IPv6 fragment as UDP.
        let a = backend_by_mac(&lab.run(&first)?.out)?;
        let b = backend_by_mac(&lab.run(&later)?.out)?;
        ensure!(a == b, "v6 fragments split over backends");
    }
    // A later fragment whose first was never seen is passed, untouched.
    let full = packets::udp_with(c4(), 6999, v4(), 53, &payload);
    let (_, orphan) = packets::fragment_v4(&full, 64, 999)?;
    let f = Fixture {
        name: "orphan fragment",
        frame: orphan,
        expect: Expect::Pass(Reason::FragmentUnknown),
    };
    check(&lab, &f)?;
    ensure!(
        lab.reason(Reason::Fragment) >= 8 + 8 + 8,
        "fragments not counted"
    );
    Ok(())
}

/// A fragmented datagram belongs to its flow: its first fragment (which carries the ports) goes
/// to the backend of the flow's whole datagrams, and so do its later fragments, in both
/// orders of arrival (the flow's small datagrams first, or its fragmented one first).
#[test]
fn a_fragmented_datagram_reaches_the_backend_of_its_flow() -> Result<()> {
    let Some(mut lab) = lab("fx-fragflow") else {
        return Ok(());
    };
    let big = [9u8; 400];
    let small = [1u8; 8];
    for (family, client, vip) in [("v4", c4(), v4()), ("v6", c6(), v6())] {
        let mut backends = std::collections::BTreeSet::new();
        for port in 0..40u16 {
            let sport = 30000 + port;
            let whole = packets::udp_with(client, sport, vip, 53, &small);
            let full = packets::udp_with(client, sport, vip, 53, &big);
            let id = u32::from(port) + 100;
            let (first, later) = if family == "v4" {
                packets::fragment_v4(&full, 64, id as u16)?
            } else {
                packets::fragment_v6(&full, 64, id)?
            };
            // Even ports: the whole datagram first; odd ports: the fragments first.
            let order: [&[u8]; 3] = if port % 2 == 0 {
                [&whole, &first, &later]
            } else {
                [&first, &later, &whole]
            };
            let got: Vec<usize> = order
                .iter()
                .map(|f| backend_by_mac(&lab.run(f)?.out))
                .collect::<Result<_>>()?;
            ensure!(
                got.iter().all(|b| *b == got[0]),
                "{family} port {sport}: whole datagram and fragments on backends {got:?}"
            );
            backends.insert(got[0]);
            lab_flush_conntrack(&mut lab);
        }
        ensure!(
            backends.len() > 1,
            "{family}: 40 flows all on backend {backends:?}: the port is not in the hash"
        );
    }
    Ok(())
}

#[test]
fn icmp_too_big_errors_reach_the_backend_of_the_flow_they_quote() -> Result<()> {
    let Some(lab) = lab("fx-icmp") else {
        return Ok(());
    };
    let router4 = Ipv4Addr::new(198, 18, 0, 77);
    let router6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x77);
    for port in 43000..43010u16 {
        let owner = forwarded(&lab, &packets::tcp(c4(), port, v4(), 80))?;
        let icmp = packets::icmp_frag_needed(router4, VIP_V4, 80, CLIENT_V4, port)?;
        let f = Fixture {
            name: "icmp frag needed",
            frame: icmp.clone(),
            expect: Expect::Dsr(Reason::IcmpForwarded),
        };
        ensure!(
            check(&lab, &f)? == Some(owner),
            "port {port}: ICMP went elsewhere"
        );
        let owner6 = forwarded(&lab, &packets::tcp(c6(), port, v6(), 80))?;
        let icmp6 = packets::icmpv6_too_big(router6, VIP_V6, 80, CLIENT_V6, port)?;
        let f = Fixture {
            name: "icmpv6 packet too big",
            frame: icmp6,
            expect: Expect::Dsr(Reason::IcmpForwarded),
        };
        ensure!(
            check(&lab, &f)? == Some(owner6),
            "port {port}: ICMPv6 went elsewhere"
        );
    }
    Ok(())
}

#[test]
fn a_down_backend_loses_its_flows_to_a_fresh_selection() -> Result<()> {
    let Some(mut lab) = lab("fx-down") else {
        return Ok(());
    };
    let flows: Vec<Vec<u8>> = (44000..44030u16)
        .map(|p| packets::tcp(c4(), p, v4(), 80))
        .collect();
    let before: Vec<usize> = flows
        .iter()
        .map(|f| forwarded(&lab, f))
        .collect::<Result<_>>()?;
    lab.set_health("web", &backend_v4(1).to_string(), false)?;
    let reselected = lab.reason(Reason::Reselected);
    for (f, b) in flows.iter().zip(&before) {
        let now = forwarded(&lab, f)?;
        ensure!(now != 1, "a flow still reaches the down backend");
        ensure!(
            *b == 1 || now == *b,
            "a flow on a healthy backend moved ({b} → {now})"
        );
    }
    let moved = before.iter().filter(|b| **b == 1).count() as u64;
    ensure!(moved > 0, "no flow was on backend 1 to begin with");
    ensure!(
        lab.reason(Reason::Reselected) - reselected == moved,
        "reselections not counted"
    );
    Ok(())
}

#[test]
fn source_ip_hashing_keeps_a_client_on_one_backend() -> Result<()> {
    let Some(lab) = lab("fx-src") else {
        return Ok(());
    };
    let first = forwarded(&lab, &packets::tcp(c4(), 45000, v4(), 443))?;
    for port in 45001..45020u16 {
        ensure!(
            forwarded(&lab, &packets::tcp(c4(), port, v4(), 443))? == first,
            "client moved"
        );
    }
    Ok(())
}

#[test]
fn a_nat_reply_gets_the_virtual_ip_back() -> Result<()> {
    let Some(lab) = lab("fx-natrep") else {
        return Ok(());
    };
    let request = packets::udp(c4(), 5400, v4(), 53);
    let b = forwarded(&lab, &request)?;
    // The backend answers the client from its own address.
    let mut reply = packets::udp(backend_v4(b).into(), 53, c4(), 5400);
    reply[..6].copy_from_slice(&addrs::lb_backend_side_mac(b));
    reply[6..12].copy_from_slice(&backend_mac(b));
    let before = lab.reason(Reason::NatReply);
    let run = lab.run_on(&addrs::lb_backend_if(b), &reply)?;
    ensure!(run.action == XDP_REDIRECT, "reply action {}", run.action);
    let seen = inspect(&run.out)?;
    ensure!(seen.src == v4(), "reply source {} (want the VIP)", seen.src);
    ensure!(seen.dst == c4(), "reply destination");
    ensure!(seen.dst_mac == addrs::CLIENT_MAC, "reply MAC");
    ensure!(seen.checksums_ok, "reply checksums");
    ensure!(
        lab.reason(Reason::NatReply) - before == 1,
        "NatReply not counted"
    );
    // An unrelated packet from the backend is left alone.
    let stray = packets::udp(backend_v4(b).into(), 53, c4(), 5401);
    let run = lab.run_on(&addrs::lb_backend_if(b), &stray)?;
    ensure!(
        run.action == XDP_PASS && run.out == stray,
        "stray packet touched"
    );
    Ok(())
}

#[test]
fn a_split_sends_flows_to_both_pools() -> Result<()> {
    let Some(lab) = lab("fx-split") else {
        return Ok(());
    };
    let mut counts = [0usize; BACKENDS + 1];
    for port in 46000..46400u16 {
        counts[forwarded(&lab, &packets::tcp(c4(), port, v4(), 8443))?] += 1;
    }
    // Half the flows go to "solo" (backend 1 only); the other half spread over "web" (1, 2, 3):
    // backend 1 gets about 1/2 + 1/6 = 2/3 of 400.
    ensure!(
        (230..=300).contains(&counts[1]),
        "backend 1 got {} of 400: {counts:?}",
        counts[1]
    );
    ensure!(
        counts[2] > 40 && counts[3] > 40,
        "web's other backends starved: {counts:?}"
    );
    Ok(())
}

/// `NEXT_HOPS` fixtures: a resolved next hop gives the frame its MACs (hit); a changed one is
/// used from the next packet on, tracked flows included (changed); an unresolved backend takes
/// no new flows, and a packet that still reaches a slot without a resolved next hop is dropped
/// with `no_next_hop` (miss).
#[test]
fn next_hops_come_from_the_map_the_agent_writes() -> Result<()> {
    use router_tests::lab::next_hop;
    use switchyard::dataplane::Dataplane as _;

    const NEW_MAC: [u8; 6] = [0x02, 0x5e, 0x00, 0x00, 0x00, 0x42];

    let Some(mut lab) = lab("fx-nexthop") else {
        return Ok(());
    };
    // Hit: the backend's MAC, the lb side's, out of the backend's veth.
    let frame = packets::tcp(c4(), 47000, v4(), 80);
    let run = lab.run(&frame)?;
    ensure!(run.action == XDP_REDIRECT, "action {}", run.action);
    let seen = inspect(&run.out)?;
    let b = backend_of(&seen)?;
    ensure!(
        seen.dst_mac == backend_mac(b),
        "destination MAC {:02x?}",
        seen.dst_mac
    );
    ensure!(
        seen.src_mac == addrs::lb_backend_side_mac(b),
        "source MAC {:02x?}",
        seen.src_mac
    );

    // Changed: the tracked flow's next packet carries the new MAC at once.
    let ifindex = lab.ifindex(&addrs::lb_backend_if(b))?;
    let mut moved = next_hop(ifindex, b);
    moved.macs[..6].copy_from_slice(&NEW_MAC);
    lab.set_next_hops(&[(backend_v4(b).into(), Some(moved))])?;
    let seen = inspect(&lab.run(&frame)?.out)?;
    ensure!(
        seen.dst_mac == NEW_MAC,
        "the changed next hop was not used: {:02x?}",
        seen.dst_mac
    );

    // Miss: unresolved, the backend leaves the table; its tracked flow stays on the last next
    // hop (a carrier blip resets no connection) and new flows never reach it.
    lab.set_next_hops(&[(backend_v4(b).into(), None)])?;
    let (action, reasons) = lab.explain(&frame)?;
    ensure!(
        action == XDP_REDIRECT && reasons.contains(&Reason::ConntrackHit),
        "the tracked flow of an unresolved backend: action {action}, {reasons:?}"
    );
    ensure!(
        inspect(&lab.run(&frame)?.out)?.dst_mac == NEW_MAC,
        "the tracked flow left the last next hop"
    );
    for port in 47100..47300u16 {
        let got = forwarded(&lab, &packets::tcp(c4(), port, v4(), 80))?;
        ensure!(got != b, "port {port} reached the unresolved backend {b}");
    }
    // A slot whose live next hop is unresolved (its entry written by hand, as a program that
    // runs before the agent's first resolution sees it) drops with its own reason.
    let slot = lab
        .publisher
        .pools()
        .values()
        .flat_map(|p| p.backends.iter())
        .find(|x| x.address == IpAddr::from(backend_v4(b)))
        .map(|x| x.slot)
        .context("no slot for the backend")?;
    let mut entry = lab.maps.backend(slot)?;
    entry.state = router_common::BACKEND_UP;
    lab.maps.set_backend(slot, entry)?;
    lab.maps.set_next_hop(
        router_common::next_hop_index(slot, entry.hop),
        router_common::NextHop::default(),
    )?;
    let flow = packets::tcp(c4(), 47001, v4(), 80);
    lab.maps.conntrack.insert(
        router_common::FlowKey {
            src: switchyard::publish::addr16(c4()),
            dst: switchyard::publish::addr16(v4()),
            sport: 47001u16.to_be(),
            dport: 80u16.to_be(),
            proto: router_common::PROTO_TCP,
            family: router_common::FAMILY_V4,
            _pad: [0; 2],
        },
        router_common::FlowEntry {
            backend: slot,
            service: 0,
        },
        0,
    )?;
    let (action, reasons) = lab.explain(&flow)?;
    ensure!(
        action == XDP_DROP && reasons == [Reason::NoNextHop],
        "a slot without a next hop: action {action}, {reasons:?}"
    );
    Ok(())
}
