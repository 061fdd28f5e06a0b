//! What becomes of tracked flows when their backend's health check fails, by the pool's
//! `on_backend_down`: `keep` (they stay; new flows avoid it), `migrate` (re-selected), `reset`
//! (a TCP flow's next segment is answered with an RST from the virtual IP, and the flow is
//! closing; a UDP flow is re-selected). IPv4 and IPv6, TCP and UDP. The RSTs are read back
//! field by field: addresses, ports, TTL, sequence and acknowledgment numbers by RFC 9293
//! §3.10.7.1, flags, header lengths, checksums, and the frame cut to its headers.

use std::net::IpAddr;

use anyhow::{Context as _, Result, bail, ensure};
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use router_common::Reason;
use router_tests::{
    addrs::{backend_mac, backend_v4, backend_v6},
    lab::Lab,
    packets::{self, FROM_CLIENT, PAYLOAD, TO_LB, Tcp, inspect},
};
use switchyard::config::FlowPolicy;

use super::fixture::{XDP_DROP, XDP_TX};
use super::{BACKENDS, c4, c6, fixture_config, lab, v4, v6};

/// The lab with `web` and `web6` under `policy`.
fn lab_with(tag: &str, policy: FlowPolicy) -> Option<Lab> {
    let mut lab = lab(tag)?;
    let mut cfg = fixture_config();
    for p in &mut cfg.pools {
        if p.name == "web" || p.name == "web6" {
            p.on_backend_down = policy;
        }
    }
    lab.apply(&cfg).expect("apply");
    Some(lab)
}

/// Which backend (1-based) a forwarded frame went to.
fn backend_of(out: &[u8]) -> Result<usize> {
    let mac = out.get(..6).context("runt")?;
    (1..=BACKENDS)
        .find(|i| backend_mac(*i) == mac)
        .with_context(|| format!("destination MAC {mac:02x?} is no backend's"))
}

/// Runs `frame`; returns its action, output and the one reason it was counted under.
fn run(lab: &Lab, frame: &[u8]) -> Result<(u32, Vec<u8>, Reason)> {
    let before: Vec<u64> = Reason::ALL.iter().map(|r| lab.reason(*r)).collect();
    let r = lab.run(frame)?;
    let moved: Vec<Reason> = Reason::ALL
        .iter()
        .zip(&before)
        .filter(|(r, b)| lab.reason(**r) != **b)
        .map(|(r, _)| *r)
        .collect();
    match moved.as_slice() {
        [one] => Ok((r.action, r.out, *one)),
        _ => bail!("counted {moved:?}, not one reason"),
    }
}

/// A family's client, VIP and `web` backend address.
#[derive(Clone, Copy)]
struct Family {
    client: IpAddr,
    vip: IpAddr,
    v6: bool,
}

fn fam4() -> Family {
    Family {
        client: c4(),
        vip: v4(),
        v6: false,
    }
}

fn fam6() -> Family {
    Family {
        client: c6(),
        vip: v6(),
        v6: true,
    }
}

/// A frame of flow `port` of `proto` ("tcp": an ACK with data; "udp").
fn frame(f: Family, proto: &str, port: u16) -> Vec<u8> {
    let dport = if proto == "tcp" { 80 } else { 53 };
    if proto == "tcp" {
        packets::tcp(f.client, port, f.vip, dport)
    } else {
        packets::udp(f.client, port, f.vip, dport)
    }
}

/// Tracks flows from ports 46000 on until at least two reached backend 1 and two another;
/// returns each flow's port and backend.
fn track(lab: &Lab, f: Family, proto: &str) -> Result<Vec<(u16, usize)>> {
    let mut flows = Vec::new();
    for port in 46000..46100u16 {
        let (action, out, reason) = run(lab, &frame(f, proto, port))?;
        ensure!(action != XDP_DROP, "flow {port} dropped ({reason:?})");
        ensure!(reason == Reason::NewFlow, "flow {port}: {reason:?}");
        let b = backend_of(&out)?;
        // Its second packet is a conntrack hit: the flow is tracked.
        let (_, out, reason) = run(lab, &frame(f, proto, port))?;
        ensure!(reason == Reason::ConntrackHit && backend_of(&out)? == b);
        flows.push((port, b));
        let on1 = flows.iter().filter(|(_, b)| *b == 1).count();
        if on1 >= 2 && flows.len() - on1 >= 2 {
            return Ok(flows);
        }
    }
    bail!("no two flows reached backend 1")
}

fn down(lab: &mut Lab, f: Family) -> Result<()> {
    let (pool, addr): (&str, IpAddr) = if f.v6 {
        ("web6", backend_v6(1).into())
    } else {
        ("web", backend_v4(1).into())
    };
    lab.set_health(pool, &addr.to_string(), false)
}

/// Under `keep`, a down backend's tracked flows stay on it; other flows stay where they are;
/// new flows avoid it.
fn keeps(tag: &str, f: Family, proto: &str) -> Result<()> {
    let Some(mut lab) = lab_with(tag, FlowPolicy::Keep) else {
        return Ok(());
    };
    let flows = track(&lab, f, proto)?;
    down(&mut lab, f)?;
    for (port, b) in &flows {
        for _ in 0..3 {
            let (_, out, reason) = run(&lab, &frame(f, proto, *port))?;
            ensure!(reason == Reason::ConntrackHit, "flow {port}: {reason:?}");
            ensure!(backend_of(&out)? == *b, "flow {port} moved off backend {b}");
        }
    }
    for port in 47000..47040u16 {
        let (_, out, reason) = run(&lab, &frame(f, proto, port))?;
        ensure!(reason == Reason::NewFlow, "new flow {port}: {reason:?}");
        ensure!(
            backend_of(&out)? != 1,
            "a new flow reached the down backend"
        );
    }
    Ok(())
}

/// Under `migrate` (and for UDP under `reset`), a down backend's flows are re-selected onto
/// live backends and stay there; other flows stay where they are.
fn migrates(tag: &str, policy: FlowPolicy, f: Family, proto: &str) -> Result<()> {
    let Some(mut lab) = lab_with(tag, policy) else {
        return Ok(());
    };
    let flows = track(&lab, f, proto)?;
    down(&mut lab, f)?;
    for (port, b) in &flows {
        let (_, out, reason) = run(&lab, &frame(f, proto, *port))?;
        let now = backend_of(&out)?;
        if *b == 1 {
            ensure!(reason == Reason::Reselected, "flow {port}: {reason:?}");
            ensure!(now != 1, "flow {port} still reaches the down backend");
            let (_, out, reason) = run(&lab, &frame(f, proto, *port))?;
            ensure!(reason == Reason::ConntrackHit && backend_of(&out)? == now);
        } else {
            ensure!(
                reason == Reason::ConntrackHit && now == *b,
                "flow {port} moved"
            );
        }
    }
    Ok(())
}

#[test]
fn keep_leaves_tcp_flows_on_a_down_backend_v4() -> Result<()> {
    keeps("fx-keep-t4", fam4(), "tcp")
}

#[test]
fn keep_leaves_tcp_flows_on_a_down_backend_v6() -> Result<()> {
    keeps("fx-keep-t6", fam6(), "tcp")
}

#[test]
fn keep_leaves_udp_flows_on_a_down_backend_v4() -> Result<()> {
    keeps("fx-keep-u4", fam4(), "udp")
}

#[test]
fn keep_leaves_udp_flows_on_a_down_backend_v6() -> Result<()> {
    keeps("fx-keep-u6", fam6(), "udp")
}

#[test]
fn migrate_reselects_tcp_flows_of_a_down_backend_v6() -> Result<()> {
    migrates("fx-mig-t6", FlowPolicy::Migrate, fam6(), "tcp")
}

#[test]
fn migrate_reselects_udp_flows_of_a_down_backend_v4() -> Result<()> {
    migrates("fx-mig-u4", FlowPolicy::Migrate, fam4(), "udp")
}

#[test]
fn reset_migrates_udp_flows_v4() -> Result<()> {
    migrates("fx-rst-u4", FlowPolicy::Reset, fam4(), "udp")
}

#[test]
fn reset_migrates_udp_flows_v6() -> Result<()> {
    migrates("fx-rst-u6", FlowPolicy::Reset, fam6(), "udp")
}

/// What an RST must hold.
struct Want {
    seq: u32,
    ack: Option<u32>,
    /// Bytes between the Ethernet and IP headers (VLAN tags) in the request.
    vlan: usize,
}

/// Checks that `out` is the RST answering a segment from `f.client:port` to `f.vip:80`.
fn check_rst(f: Family, port: u16, out: &[u8], want: &Want) -> Result<()> {
    ensure!(
        out.get(..12) == Some(&[FROM_CLIENT, TO_LB].concat()[..]),
        "MACs not turned around: {:02x?}",
        out.get(..12)
    );
    let seen = inspect(out)?;
    ensure!(seen.checksums_ok, "a checksum does not verify");
    ensure!(
        seen.src == f.vip && seen.dst == f.client,
        "addresses {seen:?}"
    );
    let p = SlicedPacket::from_ethernet(out)?;
    let ip_len = match &p.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header();
            ensure!(h.ihl() == 5, "IPv4 options");
            ensure!(h.ttl() == 64, "TTL {}", h.ttl());
            ensure!(h.dont_fragment() && !h.more_fragments() && h.fragments_offset().value() == 0);
            ensure!(
                usize::from(h.total_len()) == 40,
                "total length {}",
                h.total_len()
            );
            20
        }
        Some(NetSlice::Ipv6(ip)) => {
            let h = ip.header();
            ensure!(h.hop_limit() == 64, "hop limit {}", h.hop_limit());
            ensure!(h.next_header().0 == 6, "extension headers");
            ensure!(
                h.payload_length() == 20,
                "payload length {}",
                h.payload_length()
            );
            40
        }
        _ => bail!("no IP"),
    };
    let Some(TransportSlice::Tcp(t)) = &p.transport else {
        bail!("no TCP")
    };
    ensure!(
        t.source_port() == 80 && t.destination_port() == port,
        "ports"
    );
    ensure!(t.rst(), "no RST flag");
    ensure!(!t.syn() && !t.fin() && !t.psh() && !t.urg(), "other flags");
    ensure!(t.data_offset() == 5, "TCP options");
    ensure!(t.payload().is_empty(), "payload kept");
    ensure!(
        t.sequence_number() == want.seq,
        "seq {}",
        t.sequence_number()
    );
    match want.ack {
        Some(a) => {
            ensure!(t.ack(), "no ACK flag");
            ensure!(
                t.acknowledgment_number() == a,
                "ack {}",
                t.acknowledgment_number()
            );
        }
        None => ensure!(!t.ack(), "ACK flag on an RST answering an ACK"),
    }
    ensure!(
        out.len() == 14 + want.vlan + ip_len + 20,
        "frame of {} bytes",
        out.len()
    );
    Ok(())
}

/// A TCP segment without ACK: sequence number 5000, with `fin`, carrying `PAYLOAD`.
fn no_ack(f: Family, port: u16, fin: bool) -> Result<Vec<u8>> {
    let eth = PacketBuilder::ethernet2(FROM_CLIENT, TO_LB);
    let step = match (f.client, f.vip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .tcp(port, 80, 5000, 1000),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .tcp(port, 80, 5000, 1000),
        _ => bail!("mixed families"),
    };
    let step = if fin { step.fin() } else { step.psh() };
    let mut out = Vec::new();
    step.write(&mut out, PAYLOAD)?;
    Ok(out)
}

/// Under `reset`: a down backend's tracked TCP flows get an RST from the virtual IP for every
/// segment (RFC 9293 numbers), other flows stay; an RST is not answered; a SYN on a reset
/// flow's 5-tuple opens a new connection on a live backend.
fn resets(tag: &str, f: Family) -> Result<()> {
    let Some(mut lab) = lab_with(tag, FlowPolicy::Reset) else {
        return Ok(());
    };
    let flows = track(&lab, f, "tcp")?;
    down(&mut lab, f)?;
    let on1: Vec<u16> = flows
        .iter()
        .filter(|(_, b)| *b == 1)
        .map(|(p, _)| *p)
        .collect();
    for (port, b) in &flows {
        if *b != 1 {
            let (_, out, reason) = run(&lab, &frame(f, "tcp", *port))?;
            ensure!(
                reason == Reason::ConntrackHit && backend_of(&out)? == *b,
                "flow {port} moved"
            );
        }
    }
    let (a, b) = (on1[0], on1[1]);
    // An ACK segment: <SEQ=SEG.ACK><CTL=RST> (the fixture's segments acknowledge 1).
    for _ in 0..2 {
        let (action, out, reason) = run(&lab, &frame(f, "tcp", a))?;
        ensure!(
            action == XDP_TX && reason == Reason::BackendReset,
            "{action} {reason:?}"
        );
        check_rst(
            f,
            a,
            &out,
            &Want {
                seq: 1,
                ack: None,
                vlan: 0,
            },
        )?;
    }
    // Segments without ACK: <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>, FIN counting one.
    let len = u32::try_from(PAYLOAD.len())?;
    let (action, out, _) = run(&lab, &no_ack(f, b, false)?)?;
    ensure!(action == XDP_TX);
    check_rst(
        f,
        b,
        &out,
        &Want {
            seq: 0,
            ack: Some(5000 + len),
            vlan: 0,
        },
    )?;
    let (action, out, _) = run(&lab, &no_ack(f, b, true)?)?;
    ensure!(action == XDP_TX);
    check_rst(
        f,
        b,
        &out,
        &Want {
            seq: 0,
            ack: Some(5000 + len + 1),
            vlan: 0,
        },
    )?;
    // An RST is never answered.
    let rst = packets::tcp_with(f.client, a, f.vip, 80, Tcp::Rst);
    let (action, _, reason) = run(&lab, &rst)?;
    ensure!(
        action == XDP_DROP && reason == Reason::BackendReset,
        "an RST got {action} {reason:?}"
    );
    // A new connection on the 5-tuple goes to a live backend, and stays there.
    let (_, out, reason) = run(&lab, &packets::syn(f.client, a, f.vip, 80))?;
    ensure!(reason == Reason::NewFlow, "SYN: {reason:?}");
    let now = backend_of(&out)?;
    ensure!(now != 1, "the SYN reached the down backend");
    let (_, out, reason) = run(&lab, &frame(f, "tcp", a))?;
    ensure!(
        reason != Reason::BackendReset && backend_of(&out)? == now,
        "{reason:?}"
    );
    Ok(())
}

#[test]
fn reset_answers_tcp_flows_of_a_down_backend_with_an_rst_v4() -> Result<()> {
    resets("fx-rst-t4", fam4())
}

#[test]
fn reset_answers_tcp_flows_of_a_down_backend_with_an_rst_v6() -> Result<()> {
    resets("fx-rst-t6", fam6())
}

/// Odd segments of a reset flow: IPv4 options and Ethernet padding give a well-formed RST cut
/// to its headers; a data offset below 5 or past the datagram gives none (dropped).
#[test]
fn a_reset_is_well_formed_or_not_sent() -> Result<()> {
    let Some(mut lab) = lab_with("fx-rst-odd", FlowPolicy::Reset) else {
        return Ok(());
    };
    let f = fam4();
    let flows = track(&lab, f, "tcp")?;
    down(&mut lab, f)?;
    let port = flows
        .iter()
        .find(|(_, b)| *b == 1)
        .context("a flow on 1")?
        .0;
    let IpAddr::V4(client) = f.client else {
        bail!("v4")
    };
    let IpAddr::V4(vip) = f.vip else { bail!("v4") };
    // IPv4 options: the RST has a plain 20-byte header.
    let opts = packets::tcp_v4_with_options(client, port, vip, 80)?;
    let (action, out, reason) = run(&lab, &opts)?;
    ensure!(
        action == XDP_TX && reason == Reason::BackendReset,
        "options: {action} {reason:?}"
    );
    check_rst(
        f,
        port,
        &out,
        &Want {
            seq: 1,
            ack: None,
            vlan: 0,
        },
    )?;
    // Ethernet padding after the datagram is not data.
    let mut padded = frame(f, "tcp", port);
    padded.extend_from_slice(&[0xee; 30]);
    let (action, out, _) = run(&lab, &padded)?;
    ensure!(action == XDP_TX);
    check_rst(
        f,
        port,
        &out,
        &Want {
            seq: 1,
            ack: None,
            vlan: 0,
        },
    )?;
    // Data offsets that do not fit: below 5 words, or past the datagram (a 60-byte header in
    // a segment of 30 bytes). Byte 12 of the TCP header is at 14 + 20 + 12.
    let mut short = frame(f, "tcp", port);
    short.truncate(14 + 20 + 30);
    let short = packets::set_u16(short, 14 + 2, 50);
    for (doff, base) in [
        (0x00u8, frame(f, "tcp", port)),
        (0x40, frame(f, "tcp", port)),
        (0xf0, short),
    ] {
        let mut bad = packets::set_byte(base, 14 + 20 + 12, doff);
        packets::fix_v4_checksum(&mut bad);
        let (action, _, reason) = run(&lab, &bad)?;
        ensure!(
            action == XDP_DROP && reason == Reason::MalformedDrop,
            "data offset {doff:#x}: {action} {reason:?}"
        );
    }
    Ok(())
}

/// Under `keep`, a fragmented datagram of a flow kept on a down backend reaches it whole: the
/// later fragment follows the first.
#[test]
fn keep_sends_every_fragment_of_a_kept_flow_to_its_backend() -> Result<()> {
    let Some(mut lab) = lab_with("fx-keep-frag", FlowPolicy::Keep) else {
        return Ok(());
    };
    let f = fam4();
    let flows = track(&lab, f, "udp")?;
    down(&mut lab, f)?;
    let port = flows
        .iter()
        .find(|(_, b)| *b == 1)
        .context("a flow on 1")?
        .0;
    let full = packets::udp_with(f.client, port, f.vip, 53, &[7u8; 200]);
    let (first, later) = packets::fragment_v4(&full, 64, 4242)?;
    for (what, frag) in [("first", first), ("later", later)] {
        let (action, out, reason) = run(&lab, &frag)?;
        ensure!(
            action != XDP_DROP && reason == Reason::Fragment,
            "{what} fragment: {action} {reason:?}"
        );
        ensure!(
            backend_of(&out)? == 1,
            "{what} fragment left the kept backend"
        );
    }
    Ok(())
}

/// Under `keep`, a connection whose SYN reached a backend that then went down is not kept
/// there: its SYN retransmitted, and a SYN reusing an open connection's 5-tuple, are balanced
/// to a backend that takes flows, and the connection's ACK follows the new choice. The keep
/// flag is for established flows only.
#[test]
fn keep_never_opens_a_connection_on_a_down_backend() -> Result<()> {
    let Some(mut lab) = lab_with("fx-bd-keep-syn", FlowPolicy::Keep) else {
        return Ok(());
    };
    let f = fam4();
    let syn = |port: u16| packets::tcp_with(f.client, port, f.vip, 80, packets::Tcp::Syn);
    let ack = |port: u16| packets::tcp_with(f.client, port, f.vip, 80, packets::Tcp::Ack);
    // A SYN recorded on backend 1, and an open connection on backend 1.
    let mut recorded = None;
    let mut open = None;
    for port in 48_500..48_700u16 {
        let (_, out, _) = run(&lab, &syn(port))?;
        if backend_of(&out)? != 1 {
            continue;
        }
        if recorded.is_none() {
            recorded = Some(port);
        } else {
            let (_, out, reason) = run(&lab, &ack(port))?;
            ensure!(reason == Reason::ConntrackHit && backend_of(&out)? == 1);
            open = Some(port);
            break;
        }
    }
    let (recorded, open) = (
        recorded.context("no SYN reached backend 1")?,
        open.context("no second SYN reached backend 1")?,
    );
    down(&mut lab, f)?;
    for (what, port) in [
        ("retransmitted SYN", recorded),
        ("SYN on an open 5-tuple", open),
    ] {
        let (action, out, reason) = run(&lab, &syn(port))?;
        ensure!(action != XDP_DROP, "{what}: dropped ({reason:?})");
        let b = backend_of(&out)?;
        ensure!(b != 1, "{what} went to the down backend 1 ({reason:?})");
        let (_, out, reason) = run(&lab, &ack(port))?;
        ensure!(
            backend_of(&out)? == b,
            "{what}: its ACK went to {} ({reason:?}), its SYN to {b}",
            backend_of(&out)?
        );
    }
    Ok(())
}

/// A segment of a reset flow sent to a broadcast MAC gets no RST (its source MAC would be the
/// broadcast address): it is dropped.
#[test]
fn reset_never_answers_a_segment_sent_to_a_broadcast_mac() -> Result<()> {
    let Some(mut lab) = lab_with("fx-bd-bcast", FlowPolicy::Reset) else {
        return Ok(());
    };
    let f = fam4();
    let flows = track(&lab, f, "tcp")?;
    let (port, _) = *flows
        .iter()
        .find(|(_, b)| *b == 1)
        .context("no flow on backend 1")?;
    down(&mut lab, f)?;
    let mut seg = frame(f, "tcp", port);
    seg[..6].copy_from_slice(&[0xff; 6]);
    let (action, _, reason) = run(&lab, &seg)?;
    ensure!(
        action == XDP_DROP && reason == Reason::BackendReset,
        "action {action}, {reason:?}"
    );
    // The same segment to the balancer's own MAC is answered.
    let (action, _, reason) = run(&lab, &frame(f, "tcp", port))?;
    ensure!(
        action == XDP_TX && reason == Reason::BackendReset,
        "action {action}, {reason:?}"
    );
    Ok(())
}
