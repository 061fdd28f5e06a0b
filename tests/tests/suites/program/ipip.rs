//! `forward: ipip`: the outer header the program puts in front of a packet (IPv4 in IPv4 and
//! IPv6 in IPv6: version, TOS / traffic class and TTL / hop limit from the inner header, the
//! IPv4 checksum recomputed here, protocol 4 / 41, destination the backend, source in the
//! service's range, DF set, lengths), the inner packet left byte for byte; the outer source
//! stable per flow and spread across flows; later fragments and ICMP errors quoting a flow
//! encapsulated to the flow's backend with its source; a packet too big for the egress MTU
//! once encapsulated turned into an ICMP fragmentation-needed / `ICMPv6` packet-too-big from
//! the VIP to the client; and the backends' decapsulator (`switchyard decap`), which gives the
//! inner packet back byte for byte and passes anything else untouched.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, Result, ensure};
use aya::{
    Ebpf,
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use router_common::Reason;
use router_tests::{
    addrs::{
        CLIENT_MAC, LB_CLIENT_SIDE_MAC, backend_mac, backend_v4, backend_v6, lb_backend_side_mac,
    },
    lab::Lab,
    packets::{self, fix_v4_checksum},
    privileged,
};
use switchyard::{
    config::{Forward, Protocol, SourceRange},
    dataplane::object,
};

use super::fixture::{XDP_PASS, XDP_REDIRECT, XDP_TX};
use super::{BACKENDS, c4, c6, fixture_config, svc, v4, v6};

/// The services' outer source ranges.
const RANGE_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 250, 0);
const RANGE_V4_LEN: u8 = 24;
const RANGE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x250, 0, 0, 0, 0, 0);
const RANGE_V6_LEN: u8 = 64;

const ETH: usize = 14;

/// The fixture config plus ipip services: TCP 7080 and UDP 7053 on the IPv4 VIP, TCP 7080 and
/// UDP 7053 on the IPv6 VIP, over the `web` / `web6` pools.
fn ipip_lab(tag: &str) -> Option<Lab> {
    if privileged::require_root_and_bpf(tag).is_err() {
        return None;
    }
    let mut cfg = fixture_config();
    let r4 = Forward::Ipip(SourceRange {
        network: RANGE_V4.into(),
        prefix: RANGE_V4_LEN,
    });
    let r6 = Forward::Ipip(SourceRange {
        network: RANGE_V6.into(),
        prefix: RANGE_V6_LEN,
    });
    cfg.services.extend([
        svc("ipip-tcp4", v4(), 7080, Protocol::Tcp, r4, "web"),
        svc("ipip-udp4", v4(), 7053, Protocol::Udp, r4, "web"),
        svc("ipip-tcp6", v6(), 7080, Protocol::Tcp, r6, "web6"),
        svc("ipip-udp6", v6(), 7053, Protocol::Udp, r6, "web6"),
    ]);
    Some(Lab::new(tag, BACKENDS, &cfg).expect("lab"))
}

/// Runs `frame` from the client; the action, the output and the reasons counted.
fn run(lab: &Lab, frame: &[u8]) -> Result<(u32, Vec<u8>, Vec<Reason>)> {
    let before: Vec<u64> = Reason::ALL.iter().map(|r| lab.reason(*r)).collect();
    let r = lab.run(frame)?;
    let moved = Reason::ALL
        .iter()
        .zip(before)
        .filter(|(r, b)| lab.reason(**r) != *b)
        .map(|(r, _)| *r)
        .collect();
    Ok((r.action, r.out, moved))
}

/// The one's-complement checksum of `data` (as the RFC 1071 reference computes it).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[expect(clippy::cast_possible_truncation, reason = "folded into 16 bits")]
    let s = !(sum as u16);
    s
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

/// The backend (1-based) whose MAC the frame is addressed to, checking the lb side's source MAC.
fn backend_of(out: &[u8]) -> Result<usize> {
    let b = (1..=BACKENDS)
        .find(|i| out[..6] == backend_mac(*i))
        .with_context(|| format!("destination MAC {:02x?} is no backend's", &out[..6]))?;
    ensure!(out[6..12] == lb_backend_side_mac(b), "source MAC");
    Ok(b)
}

/// What an encapsulated frame carries.
#[derive(Debug)]
struct Outer {
    backend: usize,
    src: IpAddr,
}

/// Checks an IPv4-in-IPv4 frame made from `input`: every outer field, the checksum recomputed
/// here, the inner packet byte for byte.
fn check_v4(input: &[u8], out: &[u8]) -> Result<Outer> {
    let b = backend_of(out)?;
    ensure!(out.len() == input.len() + 20, "length {}", out.len());
    ensure!(be16(out, 12) == 0x0800, "EtherType");
    let o = &out[ETH..ETH + 20];
    let inner = &input[ETH..];
    ensure!(o[0] == 0x45, "version/IHL {:#x}", o[0]);
    ensure!(o[1] == inner[1], "TOS {:#x}, inner {:#x}", o[1], inner[1]);
    ensure!(
        usize::from(be16(o, 2)) == inner.len() + 20,
        "total length {}",
        be16(o, 2)
    );
    ensure!(
        be16(o, 6) == 0x4000,
        "flags/offset {:#x} (want DF)",
        be16(o, 6)
    );
    ensure!(o[8] == inner[8], "TTL {}, inner {}", o[8], inner[8]);
    ensure!(o[9] == 4, "protocol {}", o[9]);
    ensure!(checksum(o) == 0, "outer header checksum does not verify");
    let dst = Ipv4Addr::new(o[16], o[17], o[18], o[19]);
    ensure!(dst == backend_v4(b), "outer destination {dst}, backend {b}");
    let src = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    ensure!(
        src.octets()[..3] == RANGE_V4.octets()[..3],
        "outer source {src} outside {RANGE_V4}/{RANGE_V4_LEN}"
    );
    ensure!(out[ETH + 20..] == *inner, "the inner packet changed");
    Ok(Outer {
        backend: b,
        src: src.into(),
    })
}

/// Checks an IPv6-in-IPv6 frame made from `input`, as [`check_v4`].
fn check_v6(input: &[u8], out: &[u8]) -> Result<Outer> {
    let b = backend_of(out)?;
    ensure!(out.len() == input.len() + 40, "length {}", out.len());
    ensure!(be16(out, 12) == 0x86dd, "EtherType");
    let o = &out[ETH..ETH + 40];
    let inner = &input[ETH..];
    // Version, traffic class and flow label: the inner header's first four bytes.
    ensure!(o[..4] == inner[..4], "version/class/label {:02x?}", &o[..4]);
    ensure!(
        usize::from(be16(o, 4)) == inner.len(),
        "payload length {}",
        be16(o, 4)
    );
    ensure!(o[6] == 41, "next header {}", o[6]);
    ensure!(o[7] == inner[7], "hop limit {}, inner {}", o[7], inner[7]);
    let addr = |at: usize| -> Result<Ipv6Addr> {
        let a: [u8; 16] = o[at..at + 16].try_into()?;
        Ok(a.into())
    };
    let (src, dst) = (addr(8)?, addr(24)?);
    ensure!(dst == backend_v6(b), "outer destination {dst}, backend {b}");
    ensure!(
        src.segments()[..4] == RANGE_V6.segments()[..4],
        "outer source {src} outside {RANGE_V6}/{RANGE_V6_LEN}"
    );
    ensure!(out[ETH + 40..] == *inner, "the inner packet changed");
    Ok(Outer {
        backend: b,
        src: src.into(),
    })
}

fn check(input: &[u8], out: &[u8]) -> Result<Outer> {
    if be16(input, 12) == 0x0800 {
        check_v4(input, out)
    } else {
        check_v6(input, out)
    }
}

/// `frame` with IPv4 TOS and TTL set (checksum fixed).
fn v4_marked(mut frame: Vec<u8>, tos: u8, ttl: u8) -> Vec<u8> {
    frame[ETH + 1] = tos;
    frame[ETH + 8] = ttl;
    fix_v4_checksum(&mut frame);
    frame
}

/// `frame` with IPv6 traffic class 0xb8, flow label 0x12345 and hop limit `hops`.
fn v6_marked(mut frame: Vec<u8>, hops: u8) -> Vec<u8> {
    frame[ETH..ETH + 4].copy_from_slice(&[0x6b, 0x81, 0x23, 0x45]);
    frame[ETH + 7] = hops;
    frame
}

#[test]
fn ipip_puts_an_outer_header_of_the_inner_family_in_front_of_the_packet() -> Result<()> {
    let Some(lab) = ipip_lab("fx-ipip-hdr") else {
        return Ok(());
    };
    let cases = [
        (
            "TCP v4",
            v4_marked(packets::tcp(c4(), 41000, v4(), 7080), 0xb8, 17),
        ),
        (
            "UDP v4",
            v4_marked(packets::udp(c4(), 41001, v4(), 7053), 0x2a, 200),
        ),
        (
            "TCP v6",
            v6_marked(packets::tcp(c6(), 41000, v6(), 7080), 33),
        ),
        (
            "UDP v6",
            v6_marked(packets::udp(c6(), 41001, v6(), 7053), 250),
        ),
    ];
    for (what, frame) in cases {
        let (action, out, reasons) = run(&lab, &frame)?;
        ensure!(action == XDP_REDIRECT, "{what}: action {action}");
        ensure!(reasons == [Reason::NewFlow], "{what}: counted {reasons:?}");
        let outer = check(&frame, &out).with_context(|| what.to_owned())?;
        // The tracked flow's next packet: the same backend and source.
        let (_, again, reasons) = run(&lab, &frame)?;
        ensure!(reasons == [Reason::ConntrackHit], "{what}: {reasons:?}");
        let next = check(&frame, &again)?;
        ensure!(
            next.backend == outer.backend && next.src == outer.src,
            "{what}: {next:?} after {outer:?}"
        );
        println!("{what}: backend {} from {}", outer.backend, outer.src);
    }
    // A dsr-l2 service on the same VIP is not encapsulated.
    let plain = packets::tcp(c4(), 41002, v4(), 80);
    let (_, out, _) = run(&lab, &plain)?;
    ensure!(out.len() == plain.len(), "dsr-l2 was encapsulated");
    Ok(())
}

/// The outer source of the TCP flow `client:port → vip:7080`, computed here from the flow's
/// `encap_hash` the way decision 0013 says: the range's host bits (the low 32 at most) are the
/// hash's.
fn expected_source(client: IpAddr, port: u16, vip: IpAddr) -> IpAddr {
    let key = router_common::FlowKey {
        src: switchyard::publish::addr16(client),
        dst: switchyard::publish::addr16(vip),
        sport: port.to_be(),
        dport: 7080u16.to_be(),
        proto: router_common::PROTO_TCP,
        family: if vip.is_ipv4() { 4 } else { 6 },
        _pad: [0; 2],
    };
    let hash = router_common::hash::encap_hash(router_common::hash::flow_words(&key));
    match vip {
        IpAddr::V4(_) => {
            let base = u32::from(RANGE_V4);
            let mask = u32::MAX >> RANGE_V4_LEN;
            IpAddr::V4(Ipv4Addr::from((base & !mask) | (hash & mask)))
        }
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(u128::from(RANGE_V6) | u128::from(hash))),
    }
}

#[test]
fn the_outer_source_is_stable_per_flow_and_spread_across_flows() -> Result<()> {
    let Some(lab) = ipip_lab("fx-ipip-src") else {
        return Ok(());
    };
    for (what, client, vip) in [("v4", c4(), v4()), ("v6", c6(), v6())] {
        let mut sources: HashMap<u16, IpAddr> = HashMap::new();
        for round in 0..2 {
            for port in 42000..42256u16 {
                let frame = packets::tcp(client, port, vip, 7080);
                let (_, out, _) = run(&lab, &frame)?;
                let src = check(&frame, &out)?.src;
                ensure!(
                    src == expected_source(client, port, vip),
                    "{what} port {port}: source {src} is not the flow hash's"
                );
                if round == 0 {
                    sources.insert(port, src);
                } else {
                    ensure!(sources[&port] == src, "{what} port {port}: source moved");
                }
            }
        }
        let distinct: HashSet<IpAddr> = sources.values().copied().collect();
        println!("{what}: 256 flows from {} sources", distinct.len());
        // 256 flows over 256 (v4) or 2^32 (v6) addresses: about 162 and 256 expected.
        ensure!(
            distinct.len() >= 128,
            "{what}: only {} sources",
            distinct.len()
        );
    }
    Ok(())
}

#[test]
fn fragments_and_icmp_errors_follow_the_flow_encapsulated() -> Result<()> {
    let Some(lab) = ipip_lab("fx-ipip-frag") else {
        return Ok(());
    };
    let payload = [9u8; 300];
    for id in 1..=6u16 {
        let full = packets::udp_with(c4(), 43000 + id, v4(), 7053, &payload);
        let (first, later) = packets::fragment_v4(&full, 128, id)?;
        let (_, out, reasons) = run(&lab, &first)?;
        ensure!(reasons == [Reason::Fragment], "v4 first {id}: {reasons:?}");
        let a = check(&first, &out)?;
        let (_, out, reasons) = run(&lab, &later)?;
        ensure!(reasons == [Reason::Fragment], "v4 later {id}: {reasons:?}");
        let b = check(&later, &out)?;
        ensure!(
            a.backend == b.backend && a.src == b.src,
            "v4 datagram {id}: {a:?} then {b:?}"
        );
        let id = u32::from(id);
        let full = packets::udp_with(c6(), 43100 + u16::try_from(id)?, v6(), 7053, &payload);
        let (first, later) = packets::fragment_v6(&full, 128, id)?;
        let (_, out, reasons) = run(&lab, &first)?;
        ensure!(reasons == [Reason::Fragment], "v6 first {id}: {reasons:?}");
        let a = check(&first, &out)?;
        let (_, out, reasons) = run(&lab, &later)?;
        ensure!(reasons == [Reason::Fragment], "v6 later {id}: {reasons:?}");
        let b = check(&later, &out)?;
        ensure!(
            a.backend == b.backend && a.src == b.src,
            "v6 datagram {id}: {a:?} then {b:?}"
        );
    }
    // A path-MTU error quoting a tracked flow goes to its backend, from its source.
    let router4 = Ipv4Addr::new(198, 18, 0, 77);
    let flow = packets::tcp(c4(), 43500, v4(), 7080);
    let (_, out, _) = run(&lab, &flow)?;
    let tracked = check(&flow, &out)?;
    let IpAddr::V4(client) = c4() else {
        unreachable!()
    };
    let IpAddr::V4(vip) = v4() else {
        unreachable!()
    };
    let err = packets::icmp_frag_needed(router4, vip, 7080, client, 43500)?;
    let (_, out, reasons) = run(&lab, &err)?;
    ensure!(reasons == [Reason::IcmpForwarded], "ICMP: {reasons:?}");
    let e = check(&err, &out)?;
    ensure!(
        e.backend == tracked.backend && e.src == tracked.src,
        "ICMP error {e:?}, flow {tracked:?}"
    );
    let router6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x77);
    let flow = packets::tcp(c6(), 43500, v6(), 7080);
    let (_, out, _) = run(&lab, &flow)?;
    let tracked = check(&flow, &out)?;
    let IpAddr::V6(client) = c6() else {
        unreachable!()
    };
    let IpAddr::V6(vip) = v6() else {
        unreachable!()
    };
    let err = packets::icmpv6_too_big(router6, vip, 7080, client, 43500)?;
    let (_, out, reasons) = run(&lab, &err)?;
    ensure!(reasons == [Reason::IcmpForwarded], "ICMPv6: {reasons:?}");
    let e = check(&err, &out)?;
    ensure!(
        e.backend == tracked.backend && e.src == tracked.src,
        "ICMPv6 error {e:?}, flow {tracked:?}"
    );
    Ok(())
}

/// The ICMP checksum of an `ICMPv6` message `msg` from `src` to `dst` (RFC 8200 §8.1).
fn icmpv6_checksum(src: &[u8], dst: &[u8], msg: &[u8]) -> u16 {
    let mut data = Vec::new();
    data.extend_from_slice(src);
    data.extend_from_slice(dst);
    data.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(0).to_be_bytes());
    data.extend_from_slice(&[0, 0, 0, 58]);
    data.extend_from_slice(msg);
    checksum(&data)
}

#[test]
fn a_packet_too_big_once_encapsulated_gets_an_icmp_error_from_the_vip() -> Result<()> {
    let Some(lab) = ipip_lab("fx-ipip-big") else {
        return Ok(());
    };
    // Full-size datagrams (1,500 bytes of IP on a 1,500-byte MTU): 20 or 40 bytes too many.
    let big4 = packets::udp_with(c4(), 44000, v4(), 7053, &[5u8; 1472]);
    let (action, out, reasons) = run(&lab, &big4)?;
    ensure!(action == XDP_TX, "v4: action {action}");
    ensure!(reasons == [Reason::TooBig], "v4: counted {reasons:?}");
    ensure!(
        out[..6] == CLIENT_MAC && out[6..12] == LB_CLIENT_SIDE_MAC,
        "v4 MACs"
    );
    ensure!(out.len() == ETH + 576, "v4 error of {} bytes", out.len());
    let ip = &out[ETH..ETH + 20];
    ensure!(ip[0] == 0x45 && ip[9] == 1, "v4: not ICMP");
    ensure!(usize::from(be16(ip, 2)) == 576, "total length");
    ensure!(checksum(ip) == 0, "v4 header checksum");
    ensure!(
        ip[12..16] == v4_octets(v4()) && ip[16..20] == v4_octets(c4()),
        "addresses"
    );
    let icmp = &out[ETH + 20..];
    ensure!(
        icmp[0] == 3 && icmp[1] == 4,
        "type {} code {}",
        icmp[0],
        icmp[1]
    );
    ensure!(be16(icmp, 6) == 1480, "next-hop MTU {}", be16(icmp, 6));
    ensure!(checksum(icmp) == 0, "ICMP checksum");
    ensure!(
        icmp[8..] == big4[ETH..ETH + 548],
        "the quote is not the packet's start"
    );

    let big6 = packets::udp_with(c6(), 44000, v6(), 7053, &[6u8; 1452]);
    let (action, out, reasons) = run(&lab, &big6)?;
    ensure!(action == XDP_TX, "v6: action {action}");
    ensure!(reasons == [Reason::TooBig], "v6: counted {reasons:?}");
    ensure!(
        out[..6] == CLIENT_MAC && out[6..12] == LB_CLIENT_SIDE_MAC,
        "v6 MACs"
    );
    ensure!(out.len() == ETH + 1280, "v6 error of {} bytes", out.len());
    let ip = &out[ETH..ETH + 40];
    ensure!(ip[0] >> 4 == 6 && ip[6] == 58, "v6: not ICMPv6");
    ensure!(usize::from(be16(ip, 4)) == 1240, "payload length");
    let (src, dst) = (&ip[8..24], &ip[24..40]);
    ensure!(
        src == v6_octets(v6()) && dst == v6_octets(c6()),
        "addresses"
    );
    let msg = &out[ETH + 40..];
    ensure!(
        msg[0] == 2 && msg[1] == 0,
        "type {} code {}",
        msg[0],
        msg[1]
    );
    let mtu = u32::from_be_bytes(msg[4..8].try_into()?);
    ensure!(mtu == 1460, "MTU {mtu}");
    ensure!(icmpv6_checksum(src, dst, msg) == 0, "ICMPv6 checksum");
    ensure!(
        msg[8..] == big6[ETH..ETH + 1232],
        "the quote is not the packet's start"
    );

    // One byte less each fits: encapsulated, 1,500 bytes of outer IP.
    let fits4 = packets::udp_with(c4(), 44001, v4(), 7053, &[5u8; 1452]);
    let (_, out, _) = run(&lab, &fits4)?;
    check(&fits4, &out)?;
    let fits6 = packets::udp_with(c6(), 44001, v6(), 7053, &[6u8; 1412]);
    let (_, out, _) = run(&lab, &fits6)?;
    check(&fits6, &out)?;
    Ok(())
}

fn v4_octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(_) => Vec::new(),
    }
}

fn v6_octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V6(a) => a.octets().to_vec(),
        IpAddr::V4(_) => Vec::new(),
    }
}

/// The decapsulator, loaded, and a way to run it on a frame.
struct Decap {
    ebpf: Ebpf,
}

impl Decap {
    fn load() -> Result<Self> {
        let mut ebpf = Ebpf::load(object::decap()?)?;
        let prog: &mut Xdp = ebpf
            .program_mut(object::DECAP_PROGRAM)
            .context("no decap program")?
            .try_into()?;
        prog.load()?;
        Ok(Self { ebpf })
    }

    fn run(&self, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
        let prog: &Xdp = self
            .ebpf
            .program(object::DECAP_PROGRAM)
            .context("no decap program")?
            .try_into()?;
        let mut out = vec![0u8; frame.len() + 256];
        let r = prog.test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        })?;
        out.truncate(r.data_size_out as usize);
        Ok((r.return_value, out))
    }
}

#[test]
fn the_decapsulator_gives_back_the_inner_packet_and_passes_anything_else() -> Result<()> {
    let Some(lab) = ipip_lab("fx-ipip-decap") else {
        return Ok(());
    };
    let decap = Decap::load()?;
    let inputs = [
        packets::tcp(c4(), 45000, v4(), 7080),
        packets::udp(c4(), 45001, v4(), 7053),
        packets::tcp(c6(), 45000, v6(), 7080),
        packets::udp(c6(), 45001, v6(), 7053),
    ];
    let mut encapsulated = Vec::new();
    for input in &inputs {
        let (_, out, _) = run(&lab, input)?;
        check(input, &out)?;
        let (action, inner) = decap.run(&out)?;
        ensure!(action == XDP_PASS, "decap action {action}");
        ensure!(inner[..12] == out[..12], "the MACs changed");
        ensure!(
            inner[12..] == input[12..],
            "the inner packet is not the original"
        );
        encapsulated.push(out);
    }
    // Untouched, and passed: plain packets, and IP-in-IP that does not add up.
    let v4ipip = encapsulated[0].clone();
    let v6ipip = encapsulated[2].clone();
    let mut untouched: Vec<(&str, Vec<u8>)> = vec![
        ("plain TCP v4", inputs[0].clone()),
        ("plain UDP v6", inputs[3].clone()),
        ("ARP", packets::arp()),
        ("truncated outer v4", v4ipip[..ETH + 18].to_vec()),
        ("truncated inner v4", v4ipip[..ETH + 20 + 10].to_vec()),
        ("cut short v4", v4ipip[..v4ipip.len() - 1].to_vec()),
        ("truncated outer v6", v6ipip[..ETH + 30].to_vec()),
        ("cut short v6", v6ipip[..v6ipip.len() - 1].to_vec()),
    ];
    let mut bad = |what: &'static str, base: &[u8], at: usize, value: u8, fix: bool| {
        let mut f = base.to_vec();
        f[at] = value;
        if fix {
            fix_v4_checksum(&mut f);
        }
        untouched.push((what, f));
    };
    bad("outer v4 with options", &v4ipip, ETH, 0x46, true);
    bad("outer v4 fragment", &v4ipip, ETH + 6, 0x20, true);
    bad("outer v4 of another protocol", &v4ipip, ETH + 9, 41, true);
    bad(
        "inner of another version (v4)",
        &v4ipip,
        ETH + 20,
        0x65,
        false,
    );
    bad("outer v4 total length off", &v4ipip, ETH + 3, 0xff, true);
    bad(
        "outer v6 of another next header",
        &v6ipip,
        ETH + 6,
        4,
        false,
    );
    bad(
        "inner of another version (v6)",
        &v6ipip,
        ETH + 40,
        0x45,
        false,
    );
    bad("outer v6 payload length off", &v6ipip, ETH + 5, 0x01, false);
    for (what, frame) in untouched {
        let (action, out) = decap.run(&frame)?;
        ensure!(action == XDP_PASS, "{what}: action {action}");
        ensure!(out == frame, "{what}: modified");
    }
    Ok(())
}
