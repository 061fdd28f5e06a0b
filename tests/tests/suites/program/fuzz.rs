//! Hostile frames through the real program (`BPF_PROG_TEST_RUN`, real maps and routes): a
//! deterministic fuzz run over mutations of valid frames, checked against an independent oracle.
//! The frames it found are fixed rows of the suites of the behaviours they broke (`malformed`,
//! `icmp`, `fragments`).
//!
//! Invariants, for every frame:
//! - the verdict is DROP, PASS, TX or REDIRECT, never ABORTED;
//! - exactly one reason counter moves, by one;
//! - a passed frame is byte-identical to the input;
//! - a forwarded frame is well formed (complete IP header, lengths that fit the frame, a
//!   complete L4 header unless it is a later fragment) and is one of: a packet for a configured
//!   service with a live pool; a later fragment of a datagram whose first fragment was forwarded;
//!   an ICMP PMTU error addressed to the virtual IP it quotes; the reply of a tracked NAT flow;
//! - a forwarded frame keeps its length, goes to a neighbour's MAC from the lb's MAC on that
//!   link, changes only what its forwarding mode rewrites (nothing past the MACs for DSR; one
//!   address and the checksums for NAT), and its IPv4 header checksum and (for a complete
//!   datagram) L4 checksum still verify when they did on input;
//! - an echo reply (`echo_reply`, `XDP_TX`) answers an ICMP/`ICMPv6` echo request to a virtual
//!   IP: same length, addresses and MACs turned around, the reply's type, and checksums that
//!   verify when the request's did;
//! - a reset (`backend_reset`, `XDP_TX`) answers a TCP segment without RST to a service whose
//!   pool resets the flows of its down backend (`rst`, `rst6`: flows tracked before backend 1
//!   went down): addresses, ports and MACs turned around, the frame cut to a plain IP header
//!   and a 20-byte TCP header with RST set (and neither SYN nor FIN), every checksum valid.
//!
//! Privileged: skips loudly without root and BPF; fails under `CI=true`.
#![expect(
    clippy::cast_possible_truncation,
    reason = "a fuzzer's frame fields: random bits and test-frame lengths cut to the field's \
              width on purpose"
)]

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context as _, Result, bail, ensure};
use router_common::Reason;
use router_tests::{
    addrs::{
        self, CLIENT_MAC, CLIENT_V4, CLIENT_V6, LB_CLIENT_IF, LB_CLIENT_SIDE_MAC, VIP_V4, VIP_V6,
        backend_mac, backend_v4, backend_v6, lb_backend_if, lb_backend_side_mac,
    },
    lab::{Lab, pool},
    packets::{self, fix_v4_checksum, hex},
    privileged,
};
use switchyard::config::{
    Agent, Config, Conntrack, Forward, HashMode, Protocol, Service, Target, WhenAllDown,
};

const XDP_ABORTED: u32 = 0;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

const BACKENDS: usize = 3;
const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

/// Frames per fuzz run (`SWITCHYARD_FUZZ_ROUNDS` overrides).
const ROUNDS: usize = 4000;
/// The run's seed (`SWITCHYARD_FUZZ_SEED` overrides, to explore; keep the default fixed).
const SEED: u64 = 0x5717_c4a1_dead_beef;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// The configuration and what the oracle knows of it.

fn svc(name: &str, vip: IpAddr, port: u16, protocol: Protocol, nat: bool, to: &str) -> Service {
    Service {
        name: name.into(),
        vip,
        port,
        protocol,
        forward: if nat { Forward::Nat } else { Forward::DsrL2 },
        hash: HashMode::FiveTuple,
        to: Target::Pool(to.into()),
    }
}

fn config() -> Config {
    let v4: Vec<IpAddr> = (1..=BACKENDS).map(|i| backend_v4(i).into()).collect();
    let v6: Vec<IpAddr> = (1..=BACKENDS).map(|i| backend_v6(i).into()).collect();
    let (vip4, vip6) = (IpAddr::V4(VIP_V4), IpAddr::V6(VIP_V6));
    Config {
        agent: Agent {
            pin_path: "/sys/fs/bpf/x".into(),
            ..Agent::default()
        },
        fleet: None,
        conntrack: Conntrack::default(),
        announce: None,
        hooks: Vec::new(),
        vips: vec![],
        services: vec![
            svc("web", vip4, 80, Protocol::Tcp, false, "web"),
            svc("dns", vip4, 53, Protocol::Udp, true, "web"),
            svc("api", vip4, 8080, Protocol::Tcp, true, "web"),
            svc("web6", vip6, 80, Protocol::Tcp, false, "web6"),
            svc("dns6", vip6, 53, Protocol::Udp, true, "web6"),
            svc("closed", vip4, 81, Protocol::Tcp, false, "drop"),
            svc("open", vip4, 82, Protocol::Tcp, false, "pass"),
            svc("rst", vip4, RST_PORT, Protocol::Tcp, false, "rst"),
            svc("rst6", vip6, RST_PORT, Protocol::Tcp, false, "rst6"),
        ],
        pools: vec![
            pool("web", v4.clone(), WhenAllDown::Drop),
            pool("web6", v6.clone(), WhenAllDown::Drop),
            pool("drop", vec![backend_v4(2).into()], WhenAllDown::Drop),
            pool("pass", vec![backend_v4(3).into()], WhenAllDown::Pass),
            resetting(pool("rst", v4[..2].to_vec(), WhenAllDown::Drop)),
            resetting(pool("rst6", v6[..2].to_vec(), WhenAllDown::Drop)),
        ],
        state: vec![],
        decisions: vec![],
        classes: Vec::new(),
        rules: std::sync::Arc::default(),
    }
}

/// The port of the services whose pool resets the flows of a down backend.
const RST_PORT: u16 = 83;
/// Client ports of the flows tracked on `rst` and `rst6` before backend 1 went down.
const RST_FLOWS: std::ops::Range<u16> = 51000..51040;

fn resetting(mut p: switchyard::config::Pool) -> switchyard::config::Pool {
    p.on_backend_down = switchyard::config::FlowPolicy::Reset;
    p
}

fn lab(tag: &str) -> Option<Lab> {
    if privileged::require_root_and_bpf(tag).is_err() {
        return None;
    }
    let mut lab = Lab::new(tag, BACKENDS, &config()).expect("lab");
    lab.set_health("drop", &backend_v4(2).to_string(), false)
        .expect("health");
    lab.set_health("pass", &backend_v4(3).to_string(), false)
        .expect("health");
    // Flows of `rst` and `rst6` tracked on both backends, then backend 1 down: its flows are
    // answered with resets.
    for port in RST_FLOWS {
        for (c, v) in [(c4(), vip4()), (c6(), vip6())] {
            for _ in 0..2 {
                lab.run(&packets::tcp(c, port, v, RST_PORT)).expect("track");
            }
        }
    }
    lab.set_health("rst", &backend_v4(1).to_string(), false)
        .expect("health");
    lab.set_health("rst6", &backend_v6(1).to_string(), false)
        .expect("health");
    Some(lab)
}

/// A service as the oracle sees it: its key, mode, and the backends (1-based) new flows may
/// reach (none for the pools whose only backend is down).
struct Svc {
    vip: IpAddr,
    port: u16,
    proto: u8,
    nat: bool,
    live: Vec<usize>,
}

fn services() -> Vec<Svc> {
    let all = vec![1, 2, 3];
    let (v4, v6) = (IpAddr::V4(VIP_V4), IpAddr::V6(VIP_V6));
    let s = |vip, port, proto, nat, live: &Vec<usize>| Svc {
        vip,
        port,
        proto,
        nat,
        live: live.clone(),
    };
    vec![
        s(v4, 80, TCP, false, &all),
        s(v4, 53, UDP, true, &all),
        s(v4, 8080, TCP, true, &all),
        s(v6, 80, TCP, false, &all),
        s(v6, 53, UDP, true, &all),
        s(v4, 81, TCP, false, &Vec::new()),
        s(v4, 82, TCP, false, &Vec::new()),
        s(v4, RST_PORT, TCP, false, &vec![2]),
        s(v6, RST_PORT, TCP, false, &vec![2]),
    ]
}

fn backend_addr(i: usize, v6: bool) -> IpAddr {
    if v6 {
        backend_v6(i).into()
    } else {
        backend_v4(i).into()
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle's own parser: independent of the program's, stricter about lengths.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frag {
    None,
    First(u32),
    Later(u32),
}

/// The flow an ICMP PMTU error quotes, as it left the virtual IP.
#[derive(Clone, Copy, Debug)]
struct Quote {
    src: IpAddr,
    proto: u8,
    sport: u16,
}

#[derive(Clone, Debug)]
struct View {
    l3: usize,
    v6: bool,
    src: IpAddr,
    dst: IpAddr,
    /// Upper-layer protocol (for a later IPv6 fragment: the fragment header's next header).
    proto: u8,
    frag: Frag,
    l4: usize,
    /// End of the IP datagram inside the frame (the rest is Ethernet padding).
    end: usize,
    /// An IPv6 routing header is present (the pseudo-header's destination is not `dst`).
    routed: bool,
    ports: Option<(u16, u16)>,
    quote: Option<Quote>,
}

enum Parse {
    NotIp,
    Malformed(&'static str),
    Ip(View),
}

fn be16(f: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*f.get(at)?, *f.get(at + 1)?]))
}

fn be32(f: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(f.get(at..at + 4)?.try_into().ok()?))
}

fn v4_at(f: &[u8], at: usize) -> IpAddr {
    let b: [u8; 4] = f[at..at + 4].try_into().unwrap();
    IpAddr::V4(Ipv4Addr::from(b))
}

fn v6_at(f: &[u8], at: usize) -> IpAddr {
    let b: [u8; 16] = f[at..at + 16].try_into().unwrap();
    IpAddr::V6(Ipv6Addr::from(b))
}

/// Offset of the IP header and the `EtherType`, after at most two VLAN tags.
fn l3_of(f: &[u8]) -> Option<(usize, u16)> {
    let mut ty = be16(f, 12)?;
    let mut off = 14;
    for _ in 0..2 {
        if ty != 0x8100 && ty != 0x88a8 {
            break;
        }
        ty = be16(f, off + 2)?;
        off += 4;
    }
    Some((off, ty))
}

fn parse(f: &[u8]) -> Parse {
    use Parse::*;
    let Some((l3, ty)) = l3_of(f) else {
        return Malformed("ethernet or vlan header cut");
    };
    match ty {
        0x0800 => parse_v4(f, l3),
        0x86dd => parse_v6(f, l3),
        _ => NotIp,
    }
}

fn parse_v4(f: &[u8], l3: usize) -> Parse {
    use Parse::*;
    if f.len() < l3 + 20 {
        return Malformed("ipv4 header cut");
    }
    let ihl = usize::from(f[l3] & 0x0f) * 4;
    if f[l3] >> 4 != 4 || ihl < 20 {
        return Malformed("ipv4 version or ihl");
    }
    let total = usize::from(be16(f, l3 + 2).unwrap_or(0));
    if f.len() < l3 + ihl || total < ihl || f.len() < l3 + total {
        return Malformed("ipv4 lengths");
    }
    let end = l3 + total;
    let flags = be16(f, l3 + 6).unwrap_or(0);
    let id = u32::from(be16(f, l3 + 4).unwrap_or(0));
    let frag = match (flags & 0x1fff, flags & 0x2000 != 0) {
        (0, false) => Frag::None,
        (0, true) => Frag::First(id),
        _ => Frag::Later(id),
    };
    let view = View {
        l3,
        v6: false,
        src: v4_at(f, l3 + 12),
        dst: v4_at(f, l3 + 16),
        proto: f[l3 + 9],
        frag,
        l4: l3 + ihl,
        end,
        routed: false,
        ports: None,
        quote: None,
    };
    upper(f, view)
}

fn parse_v6(f: &[u8], l3: usize) -> Parse {
    use Parse::*;
    if f.len() < l3 + 40 {
        return Malformed("ipv6 header cut");
    }
    if f[l3] >> 4 != 6 {
        return Malformed("ipv6 version");
    }
    let end = l3 + 40 + usize::from(be16(f, l3 + 4).unwrap_or(0));
    if f.len() < end {
        return Malformed("ipv6 payload length");
    }
    let mut next = f[l3 + 6];
    let mut off = l3 + 40;
    let mut frag = Frag::None;
    let mut routed = false;
    for _ in 0..64 {
        let len = match next {
            0 | 43 | 60 => (usize::from(*f.get(off + 1).unwrap_or(&0)) + 1) * 8,
            51 => (usize::from(*f.get(off + 1).unwrap_or(&0)) + 2) * 4,
            44 => 8,
            _ => break,
        };
        if off + len.max(2) > end {
            return Malformed("ipv6 extension header cut");
        }
        routed |= next == 43;
        if next == 44 {
            let flags = be16(f, off + 2).unwrap_or(0);
            let id = be32(f, off + 4).unwrap_or(0);
            frag = match (flags >> 3, flags & 1) {
                (0, 0) => Frag::None,
                (0, _) => Frag::First(id),
                _ => Frag::Later(id),
            };
        }
        next = f[off];
        off += len;
        if matches!(frag, Frag::Later(_)) {
            break;
        }
    }
    let view = View {
        l3,
        v6: true,
        src: v6_at(f, l3 + 8),
        dst: v6_at(f, l3 + 24),
        proto: next,
        frag,
        l4: off,
        end,
        routed,
        ports: None,
        quote: None,
    };
    upper(f, view)
}

/// The L4 part: ports of TCP/UDP (a complete header is required), the quote of a PMTU error.
fn upper(f: &[u8], mut v: View) -> Parse {
    use Parse::*;
    if matches!(v.frag, Frag::Later(_)) {
        return Ip(v);
    }
    match v.proto {
        TCP | UDP => {
            let need = if v.proto == TCP { 20 } else { 8 };
            if v.l4 + need > v.end {
                return Malformed("l4 header cut");
            }
            v.ports = Some((be16(f, v.l4).unwrap(), be16(f, v.l4 + 2).unwrap()));
        }
        ICMP | ICMPV6 if v.frag == Frag::None && v.proto == if v.v6 { ICMPV6 } else { ICMP } => {
            if v.l4 + 8 > v.end {
                return Malformed("icmp header cut");
            }
            let pmtu = if v.v6 {
                f[v.l4] == 2
            } else {
                f[v.l4] == 3 && f[v.l4 + 1] == 4
            };
            if pmtu {
                v.quote = quote(f, v.l4 + 8, v.end, v.v6);
            }
        }
        _ => {}
    }
    Ip(v)
}

fn quote(f: &[u8], at: usize, end: usize, v6: bool) -> Option<Quote> {
    let (src, proto, l4) = if v6 {
        if at + 40 > end || f[at] >> 4 != 6 {
            return None;
        }
        (v6_at(f, at + 8), f[at + 6], at + 40)
    } else {
        let ihl = usize::from(*f.get(at)? & 0x0f) * 4;
        if at + 20 > end || f[at] >> 4 != 4 || ihl < 20 {
            return None;
        }
        (v4_at(f, at + 12), f[at + 9], at + ihl)
    };
    if (proto != TCP && proto != UDP) || l4 + 4 > end {
        return None;
    }
    Some(Quote {
        src,
        proto,
        sport: be16(f, l4)?,
    })
}

// ---------------------------------------------------------------------------------------------
// Checksums, computed from scratch.

fn sum(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

fn csum(data: &[u8]) -> u16 {
    !fold(sum(data, 0))
}

fn ipv4_header_ok(f: &[u8], v: &View) -> bool {
    v.v6 || fold(sum(&f[v.l3..v.l4], 0)) == 0xffff
}

/// Whether the TCP/UDP checksum of a complete datagram verifies (`None`: nothing to check).
fn l4_ok(f: &[u8], v: &View) -> Option<bool> {
    if v.frag != Frag::None || v.routed || (v.proto != TCP && v.proto != UDP) {
        return None;
    }
    let seg = &f[v.l4..v.end];
    let check_at = if v.proto == TCP { 16 } else { 6 };
    if !v.v6 && v.proto == UDP && be16(seg, check_at) == Some(0) {
        return Some(true);
    }
    let mut pseudo = Vec::new();
    if v.v6 {
        pseudo.extend_from_slice(&f[v.l3 + 8..v.l3 + 40]);
        pseudo.extend_from_slice(&(seg.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, v.proto]);
    } else {
        pseudo.extend_from_slice(&f[v.l3 + 12..v.l3 + 20]);
        pseudo.extend_from_slice(&[0, v.proto]);
        pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    }
    Some(fold(sum(seg, sum(&pseudo, 0))) == 0xffff)
}

// ---------------------------------------------------------------------------------------------
// What the run has seen forwarded, so later fragments and NAT replies can be judged.

#[derive(Default)]
struct Memory {
    /// `(src, dst, id)` of forwarded first fragments → `(backend, nat)` choices.
    first_frags: HashMap<(IpAddr, IpAddr, u32), Vec<(usize, bool)>>,
    /// Reply tuples `(backend, vport, client, cport, proto)` of forwarded NAT requests → VIP
    /// and the reply's MACs (the last request's source and destination, turned around)
    /// (ordered: the run picks from them and must be the same every time).
    nat_flows: BTreeMap<ReplyTuple, (IpAddr, [u8; 12])>,
    /// `(src, dst, id)` of forwarded first fragments of NAT replies → their VIP and MACs.
    reply_frags: HashMap<(IpAddr, IpAddr, u32), (IpAddr, [u8; 12])>,
}

/// A NAT reply's `(backend, vport, client, cport, proto)`.
type ReplyTuple = (IpAddr, u16, IpAddr, u16, u8);

/// Which neighbour a MAC is: `Some(0)` the client, `Some(i)` backend `i`.
fn neighbour(mac: &[u8]) -> Option<usize> {
    if mac == CLIENT_MAC {
        return Some(0);
    }
    (1..=BACKENDS).find(|i| backend_mac(*i) == mac)
}

fn lb_mac_towards(n: usize) -> [u8; 6] {
    if n == 0 {
        LB_CLIENT_SIDE_MAC
    } else {
        lb_backend_side_mac(n)
    }
}

/// Byte ranges a rewrite may touch besides the MACs.
fn allowed_diff(input: &[u8], out: &[u8], ranges: &[std::ops::Range<usize>]) -> Result<(), String> {
    for (i, (a, b)) in input.iter().zip(out).enumerate().skip(12) {
        if a != b && !ranges.iter().any(|r| r.contains(&i)) {
            return Err(format!("byte {i} changed ({a:#04x} → {b:#04x})"));
        }
    }
    Ok(())
}

fn addr_range(v: &View, dst: bool) -> std::ops::Range<usize> {
    match (v.v6, dst) {
        (false, false) => v.l3 + 12..v.l3 + 16,
        (false, true) => v.l3 + 16..v.l3 + 20,
        (true, false) => v.l3 + 8..v.l3 + 24,
        (true, true) => v.l3 + 24..v.l3 + 40,
    }
}

fn checksum_ranges(v: &View) -> Vec<std::ops::Range<usize>> {
    let mut r = Vec::new();
    if !v.v6 {
        r.push(v.l3 + 10..v.l3 + 12);
    }
    if !matches!(v.frag, Frag::Later(_)) {
        match v.proto {
            TCP => r.push(v.l4 + 16..v.l4 + 18),
            UDP => r.push(v.l4 + 6..v.l4 + 8),
            _ => {}
        }
    }
    r
}

/// How the oracle expects a forwarded frame to have been handled.
enum Class {
    /// For a service: DSR or NAT to one of `live`.
    Service { nat: bool, live: Vec<usize> },
    /// A later fragment: to one of the recorded choices.
    Fragment(Vec<(usize, bool)>),
    /// An ICMP error steered like its quoted flow (DSR only).
    Icmp { live: Vec<usize> },
    /// A NAT reply: source restored to the VIP, sent back the way its request came (these
    /// MACs).
    NatReply(IpAddr, [u8; 12]),
}

/// How the program may forward `v`, or `None` when it must not.
fn classify(v: &View, svcs: &[Svc], mem: &Memory) -> Option<Class> {
    if let Frag::Later(id) = v.frag {
        if let Some((vip, macs)) = mem.reply_frags.get(&(v.src, v.dst, id)) {
            return Some(Class::NatReply(*vip, *macs));
        }
        return mem
            .first_frags
            .get(&(v.src, v.dst, id))
            .map(|c| Class::Fragment(c.clone()));
    }
    if let Some(q) = v.quote {
        let s = svcs
            .iter()
            .find(|s| s.vip == q.src && s.port == q.sport && s.proto == q.proto)?;
        // Only an error addressed to the virtual IP it quotes belongs to the service.
        if s.nat || v.dst != q.src {
            return None;
        }
        return Some(Class::Icmp {
            live: s.live.clone(),
        });
    }
    let (sport, dport) = v.ports?;
    if let Some(s) = svcs
        .iter()
        .find(|s| s.vip == v.dst && s.port == dport && s.proto == v.proto)
    {
        return Some(Class::Service {
            nat: s.nat,
            live: s.live.clone(),
        });
    }
    // A NAT reply, whole or its first fragment (which carries the ports).
    let key = (v.src, sport, v.dst, dport, v.proto);
    mem.nat_flows
        .get(&key)
        .map(|(vip, macs)| Class::NatReply(*vip, *macs))
}

/// Checks an echo reply against the request it answers.
fn judge_echo(input: &[u8], action: u32, out: &[u8], svcs: &[Svc]) -> Result<(), String> {
    if action != XDP_TX {
        return Err(format!("an echo reply sent with verdict {action}"));
    }
    let i = packets::inspect(input).map_err(|e| format!("answered an unparsable frame: {e}"))?;
    let (request, reply) = if i.src.is_ipv4() { (8, 0) } else { (128, 129) };
    if i.icmp_type != Some(request) {
        return Err(format!(
            "answered ICMP type {:?}, no echo request",
            i.icmp_type
        ));
    }
    if !svcs.iter().any(|s| s.vip == i.dst) {
        return Err(format!(
            "answered an echo request to {}, no virtual IP",
            i.dst
        ));
    }
    let o = packets::inspect(out).map_err(|e| format!("an echo reply that does not parse: {e}"))?;
    if out.len() != input.len()
        || (o.src, o.dst, o.src_mac, o.dst_mac) != (i.dst, i.src, i.dst_mac, i.src_mac)
        || o.icmp_type != Some(reply)
        || (i.checksums_ok && !o.checksums_ok)
    {
        return Err(format!("a wrong echo reply: {i:?} → {o:?}"));
    }
    Ok(())
}

/// A reset: the RST answering a TCP segment (without RST) to `rst` or `rst6`.
fn judge_reset(input: &[u8], action: u32, out: &[u8]) -> Result<(), String> {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    if action != XDP_TX {
        return Err(format!("a reset sent with verdict {action}"));
    }
    // The oracle's own parse: etherparse refuses some extension chains the program walks.
    let Parse::Ip(v) = parse(input) else {
        return Err("reset a frame that is no IP datagram".into());
    };
    let flags = input.get(v.l4 + 13).copied().unwrap_or(0);
    let Some((sport, vip_port)) = v.ports.filter(|_| v.proto == TCP && v.quote.is_none()) else {
        return Err("reset a frame without a TCP header".into());
    };
    if vip_port != RST_PORT || flags & 0x04 != 0 {
        return Err(format!(
            "reset a segment to port {vip_port} (flags {flags:#x})"
        ));
    }
    let o = packets::inspect(out).map_err(|e| format!("a reset that does not parse: {e}"))?;
    if (o.src, o.dst) != (v.dst, v.src)
        || o.src_mac[..] != input[..6]
        || o.dst_mac[..] != input[6..12]
        || !o.checksums_ok
    {
        return Err(format!("a wrong reset: {o:?}"));
    }
    let ip = if v.v6 { 40 } else { 20 };
    if out.len() != v.l3 + ip + 20 {
        return Err(format!(
            "a reset of {} bytes, not {}",
            out.len(),
            v.l3 + ip + 20
        ));
    }
    let p = SlicedPacket::from_ethernet(out).map_err(|e| format!("{e}"))?;
    let ok_ip = match &p.net {
        Some(NetSlice::Ipv4(h)) => h.header().ihl() == 5 && h.header().ttl() == 64,
        Some(NetSlice::Ipv6(h)) => {
            h.header().hop_limit() == 64 && h.header().next_header().0 == TCP
        }
        _ => false,
    };
    let Some(TransportSlice::Tcp(r)) = &p.transport else {
        return Err("a reset without TCP".into());
    };
    if !ok_ip
        || !r.rst()
        || r.syn()
        || r.fin()
        || r.data_offset() != 5
        || r.source_port() != RST_PORT
        || r.destination_port() != sport
    {
        return Err(format!("a reset with wrong headers: {}", hex(out)));
    }
    Ok(())
}

/// Checks one run against every invariant; records what it forwarded.
#[expect(
    clippy::too_many_lines,
    reason = "the invariants of the module documentation in turn, for every verdict"
)]
fn judge(
    input: &[u8],
    action: u32,
    out: &[u8],
    reasons: &[Reason],
    svcs: &[Svc],
    mem: &mut Memory,
) -> Result<(), String> {
    if ![XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT].contains(&action) {
        return Err(format!(
            "verdict {action}{}",
            if action == XDP_ABORTED {
                " (ABORTED)"
            } else {
                ""
            }
        ));
    }
    if reasons.len() != 1 {
        return Err(format!("counted under {reasons:?}, not one reason"));
    }
    let reason = reasons[0];
    // A frame whose headers are cut short or inconsistent is counted as malformed (an ICMP
    // header in the padding is exempt: an ICMP type the program ignores is `no_service` before
    // anything is read past it).
    if let Parse::Malformed(why) = parse(input)
        && why != "icmp header cut"
        && reason != Reason::MalformedPass
        && reason != Reason::MalformedDrop
    {
        return Err(format!("a malformed frame ({why}) counted as {reason:?}"));
    }
    if action == XDP_PASS {
        if out != input {
            return Err(format!("PASS ({reason:?}) but the frame was modified"));
        }
        return Ok(());
    }
    if action == XDP_DROP {
        return Ok(());
    }
    if reason == Reason::EchoReply {
        return judge_echo(input, action, out, svcs);
    }
    if reason == Reason::BackendReset {
        return judge_reset(input, action, out);
    }
    // Forwarded.
    let v = match parse(input) {
        Parse::Ip(v) => v,
        Parse::NotIp => return Err(format!("forwarded ({reason:?}) a frame that is not IP")),
        Parse::Malformed(why) => {
            return Err(format!("forwarded ({reason:?}) a malformed frame: {why}"));
        }
    };
    let class = classify(&v, svcs, mem)
        .ok_or_else(|| format!("forwarded ({reason:?}) a frame for nothing configured"))?;
    if out.len() != input.len() {
        return Err(format!("length {} → {}", input.len(), out.len()));
    }
    // A NAT reply goes back the way its request came; everything else to a neighbour, from
    // the lb's MAC on that link.
    let n = if let Class::NatReply(_, macs) = &class {
        if out[..12] != macs[..] {
            return Err(format!(
                "NAT reply MACs {:02x?}, not its request's turned around {macs:02x?}",
                &out[..12]
            ));
        }
        0
    } else {
        let n = neighbour(&out[..6]).ok_or("destination MAC is no neighbour's")?;
        if out[6..12] != lb_mac_towards(n) {
            return Err("source MAC is not the lb's on that link".into());
        }
        n
    };
    let backend_choice = |live: &[usize]| -> Result<usize, String> {
        if live.contains(&n) {
            Ok(n)
        } else {
            Err(format!("sent to neighbour {n}, not one of {live:?}"))
        }
    };
    let untouched = || allowed_diff(input, out, &[]);
    let rewritten = |dst: bool, to: IpAddr| -> Result<(), String> {
        let mut ranges = checksum_ranges(&v);
        let r = addr_range(&v, dst);
        let want: Vec<u8> = match to {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        if out.get(r.clone()) != Some(&want[..]) {
            return Err(format!("address not rewritten to {to}"));
        }
        ranges.push(r);
        allowed_diff(input, out, &ranges)?;
        let after = match parse(out) {
            Parse::Ip(a) => a,
            Parse::NotIp | Parse::Malformed(_) => {
                return Err("the rewrite broke the frame".into());
            }
        };
        if ipv4_header_ok(input, &v) && !ipv4_header_ok(out, &after) {
            return Err("IPv4 header checksum broken by the rewrite".into());
        }
        if l4_ok(input, &v) == Some(true) && l4_ok(out, &after) != Some(true) {
            return Err("L4 checksum broken by the rewrite".into());
        }
        Ok(())
    };
    match class {
        Class::Service { nat, live } => {
            let b = backend_choice(&live)?;
            if nat {
                let to = backend_addr(b, v.v6);
                rewritten(true, to)?;
                // Whole datagrams and first fragments record the way back of their replies.
                if let (Frag::None | Frag::First(_), Some((sport, dport))) = (v.frag, v.ports) {
                    let mut macs = [0u8; 12];
                    macs[..6].copy_from_slice(&input[6..12]);
                    macs[6..].copy_from_slice(&input[..6]);
                    mem.nat_flows
                        .insert((to, dport, v.src, sport, v.proto), (v.dst, macs));
                }
            } else {
                untouched()?;
            }
            if let Frag::First(id) = v.frag {
                mem.first_frags
                    .entry((v.src, v.dst, id))
                    .or_default()
                    .push((b, nat));
            }
        }
        Class::Fragment(choices) => {
            let ok = choices.iter().any(|&(b, nat)| {
                b == n
                    && if nat {
                        rewritten(true, backend_addr(b, v.v6)).is_ok()
                    } else {
                        untouched().is_ok()
                    }
            });
            if !ok {
                return Err(format!(
                    "later fragment went to {n} rewritten unlike its first ({choices:?})"
                ));
            }
        }
        Class::Icmp { live } => {
            backend_choice(&live)?;
            untouched()?;
        }
        Class::NatReply(vip, macs) => {
            rewritten(false, vip)?;
            if let Frag::First(id) = v.frag {
                mem.reply_frags.insert((v.src, v.dst, id), (vip, macs));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Frames: seeds and mutations.

/// xorshift64*: small, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// A frame and the lb interface it arrives on.
#[derive(Clone)]
struct Input {
    frame: Vec<u8>,
    iface: String,
}

fn client(frame: Vec<u8>) -> Input {
    Input {
        frame,
        iface: LB_CLIENT_IF.to_owned(),
    }
}

fn c4() -> IpAddr {
    CLIENT_V4.into()
}
fn c6() -> IpAddr {
    CLIENT_V6.into()
}
fn vip4() -> IpAddr {
    VIP_V4.into()
}
fn vip6() -> IpAddr {
    VIP_V6.into()
}

/// A valid frame (or a pair of fragments) to start from.
fn seed(rng: &mut Rng, mem: &Memory) -> Result<Vec<Input>> {
    let port = 1024 + rng.below(60000) as u16;
    let payload: Vec<u8> = (0..rng.below(200) + 16).map(|_| rng.byte()).collect();
    let v4_ports = [80u16, 53, 8080, 81, 82, 443];
    let tracked = if rng.chance(80) {
        RST_FLOWS.start + rng.below(RST_FLOWS.len()) as u16
    } else {
        port
    };
    #[expect(
        clippy::match_same_arms,
        reason = "UDP over IPv4 is drawn twice as often as the other kinds: for 1 and for 15"
    )]
    let frames = match rng.below(18) {
        0 => vec![packets::tcp(c4(), port, vip4(), rng.pick(&v4_ports))],
        1 => vec![packets::udp_with(c4(), port, vip4(), 53, &payload)],
        2 => vec![packets::tcp(c6(), port, vip6(), 80)],
        3 => vec![packets::udp_with(c6(), port, vip6(), 53, &payload)],
        4 => vec![packets::tcp_vlan(
            CLIENT_V4,
            port,
            VIP_V4,
            80,
            1 + rng.below(2),
        )],
        5 => vec![packets::tcp_v4_with_options(CLIENT_V4, port, VIP_V4, 8080)?],
        6 => vec![packets::tcp_v6_with_ext(CLIENT_V6, port, VIP_V6, 80)?],
        7 => {
            let full = packets::udp_with(c4(), port, vip4(), 53, &[7u8; 200]);
            let (a, b) = packets::fragment_v4(&full, 64, rng.next() as u16)?;
            vec![a, b]
        }
        8 => {
            let full = packets::tcp(c4(), port, vip4(), 80);
            let (a, b) = packets::fragment_v4(&full, 24, rng.next() as u16)?;
            vec![a, b]
        }
        9 => {
            let full = packets::udp_with(c6(), port, vip6(), 53, &[7u8; 200]);
            let (a, b) = packets::fragment_v6(&full, 64, rng.next() as u32)?;
            vec![a, b]
        }
        10 => {
            // A flow, then the PMTU error quoting its reply.
            let router = Ipv4Addr::new(198, 18, 0, 77);
            vec![
                packets::tcp(c4(), port, vip4(), 80),
                packets::icmp_frag_needed(router, VIP_V4, 80, CLIENT_V4, port)?,
            ]
        }
        11 => {
            let router = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x77);
            vec![
                packets::tcp(c6(), port, vip6(), 80),
                packets::icmpv6_too_big(router, VIP_V6, 80, CLIENT_V6, port)?,
            ]
        }
        12 => return Ok(vec![nat_reply(rng, mem)?]),
        13 => vec![packets::arp(), packets::ping(CLIENT_V4, VIP_V4)?],
        14 => vec![packets::tcp(
            c4(),
            port,
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 99)),
            80,
        )],
        16 => vec![packets::tcp(c4(), tracked, vip4(), RST_PORT)],
        17 => vec![packets::tcp(c6(), tracked, vip6(), RST_PORT)],
        _ => vec![packets::udp_with(c4(), port, vip4(), 53, &payload)],
    };
    Ok(frames.into_iter().map(client).collect())
}

/// A reply from a backend to a tracked NAT flow (or, with no flow yet, to a made-up one).
fn nat_reply(rng: &mut Rng, mem: &Memory) -> Result<Input> {
    let flows: Vec<_> = mem.nat_flows.keys().copied().collect();
    let (src, sport, dst, dport, proto) = if flows.is_empty() {
        (backend_addr(1, false), 53, c4(), 5000, UDP)
    } else {
        flows[rng.below(flows.len())]
    };
    let b = (1..=BACKENDS)
        .find(|i| backend_addr(*i, src.is_ipv6()) == src)
        .unwrap_or(1);
    let mut frame = if proto == TCP {
        packets::tcp(src, sport, dst, dport)
    } else {
        packets::udp(src, sport, dst, dport)
    };
    ensure!(!frame.is_empty(), "no reply frame for {src} → {dst}");
    frame[..6].copy_from_slice(&lb_backend_side_mac(b));
    frame[6..12].copy_from_slice(&backend_mac(b));
    Ok(Input {
        frame,
        iface: lb_backend_if(b),
    })
}

const INTERESTING: [u8; 12] = [0, 1, 2, 4, 0x0f, 0x40, 0x45, 0x4f, 0x60, 0x7f, 0x80, 0xff];

/// One hostile change to `f`.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per kind of mutation, each a few lines"
)]
fn mutate(rng: &mut Rng, f: &mut Vec<u8>) {
    let (l3, _) = l3_of(f).unwrap_or((14, 0));
    let v6 = f.get(l3).is_some_and(|b| b >> 4 == 6);
    let header_end = (l3 + if v6 { 40 } else { 20 } + 40).min(f.len());
    match rng.below(12) {
        // Truncate anywhere (the kernel needs 14 bytes for a test run).
        0 => {
            let len = 14 + rng.below(f.len().saturating_sub(14));
            f.truncate(len);
        }
        // Flip bits in the headers.
        1 => {
            for _ in 0..=rng.below(4) {
                let at = rng.below(header_end);
                f[at] ^= 1 << rng.below(8);
            }
        }
        // An interesting value in a header byte.
        2 => {
            let at = 12 + rng.below(header_end.saturating_sub(12));
            f[at] = rng.pick(&INTERESTING);
        }
        // Absurd IP lengths.
        3 => {
            let len = rng.pick(&[0u16, 1, 8, 19, 20, 27, 40, 0x7fff, 0xffff]);
            let len = if rng.chance(50) {
                len
            } else {
                (f.len() as u16)
                    .wrapping_sub(l3 as u16)
                    .wrapping_add(rng.below(9) as u16)
                    .wrapping_sub(4)
            };
            if f.len() >= l3 + 6 {
                let at = if v6 { l3 + 4 } else { l3 + 2 };
                f[at..at + 2].copy_from_slice(&len.to_be_bytes());
            }
        }
        // Any IHL.
        4 => {
            if !v6 && f.len() > l3 {
                f[l3] = 0x40 | rng.below(16) as u8;
            }
        }
        // Fragment fields.
        5 => {
            if !v6 && f.len() >= l3 + 8 {
                let flags = rng.next() as u16 & 0x3fff;
                let flags = if rng.chance(50) {
                    flags & 0x2000
                } else {
                    flags
                };
                f[l3 + 6..l3 + 8].copy_from_slice(&flags.to_be_bytes());
            } else if v6 && f.len() >= l3 + 40 {
                let off = (rng.next() as u16) & 0xfff9 | (rng.below(2) as u16);
                let mut h = vec![f[l3 + 6], 0];
                h.extend_from_slice(&off.to_be_bytes());
                h.extend_from_slice(&(rng.next() as u32).to_be_bytes());
                f[l3 + 6] = 44;
                f.splice(l3 + 40..l3 + 40, h);
                bump_v6_len(f, l3, 8);
            }
        }
        // A VLAN stack of any depth.
        6 => {
            let depth = rng.below(6);
            for _ in 0..depth {
                let tpid: u16 = rng.pick(&[0x8100, 0x88a8]);
                let mut tag = tpid.to_be_bytes().to_vec();
                tag.extend_from_slice(&[0, rng.byte()]);
                f.splice(12..12, tag);
            }
        }
        // IPv6 extension chains: long, looping, oversized, truncated.
        7 => {
            if v6 && f.len() >= l3 + 40 {
                let count = 1 + rng.below(10);
                let looping = rng.chance(30);
                let mut chain = Vec::new();
                let mut first = f[l3 + 6];
                let kinds = [0u8, 43, 60, 51, 60, 0];
                let mut ks: Vec<u8> = (0..count).map(|_| rng.pick(&kinds)).collect();
                if looping {
                    ks = vec![60; count];
                }
                // Each header's next field names the following one; the last names the
                // original upper layer.
                for (i, k) in ks.iter().enumerate() {
                    let next = ks.get(i + 1).copied().unwrap_or(first);
                    let len_field = if rng.chance(20) { rng.byte() } else { 0 };
                    let size = if *k == 51 {
                        (usize::from(len_field) + 2) * 4
                    } else {
                        (usize::from(len_field) + 1) * 8
                    };
                    let mut h = vec![next, len_field];
                    h.resize(size, 1);
                    chain.extend_from_slice(&h);
                }
                first = ks[0];
                f[l3 + 6] = first;
                let added = chain.len();
                f.splice(l3 + 40..l3 + 40, chain);
                bump_v6_len(f, l3, added);
                if rng.chance(30) {
                    let cut = l3 + 40 + rng.below(added + 8);
                    f.truncate(cut.max(14));
                }
            }
        }
        // Wrap the frame, as it is, into a PMTU error, addressed to its source or elsewhere.
        8 => {
            let inner = f.get(l3..).unwrap_or(&[]).to_vec();
            let quote_len = rng.below(inner.len() + 1).max(inner.len().min(28));
            let inner = &inner[..quote_len.min(inner.len())];
            let to = match (v6, rng.below(3)) {
                (false, 0) => vip4(),
                (true, 0) => vip6(),
                (false, 1) => IpAddr::V4(LB_V4),
                (true, 1) => IpAddr::V6(LB_V6),
                (_, _) => parse_src(inner).unwrap_or(vip4()),
            };
            *f = icmp_error(to, inner, v6);
        }
        // Garbage after the Ethernet header.
        9 => {
            let n = rng.below(120);
            f.truncate(l3);
            f.extend((0..n).map(|_| rng.byte()));
            if rng.chance(50) && f.len() > l3 {
                f[l3] = if v6 { 0x60 } else { 0x45 };
            }
        }
        // Spoof: swap or flip the addresses and ports.
        10 => {
            if let Parse::Ip(v) = parse(f) {
                let (s, d) = (addr_range(&v, false), addr_range(&v, true));
                if rng.chance(50) {
                    let src = f[s.clone()].to_vec();
                    let dst = f[d.clone()].to_vec();
                    f[s].copy_from_slice(&dst);
                    f[d].copy_from_slice(&src);
                } else {
                    let at = rng.below(s.len());
                    f[s.start + at] ^= 1;
                }
                if v.ports.is_some() && rng.chance(50) {
                    f.swap(v.l4, v.l4 + 2);
                    f.swap(v.l4 + 1, v.l4 + 3);
                }
            }
        }
        // Ethernet padding or trailing junk.
        _ => {
            let n = rng.below(64);
            f.extend((0..n).map(|_| if rng.chance(50) { 0 } else { 0xa5 }));
        }
    }
}

const LB_V4: Ipv4Addr = addrs::LB_CLIENT_SIDE_V4;
const LB_V6: Ipv6Addr = addrs::LB_CLIENT_SIDE_V6;

fn parse_src(ip: &[u8]) -> Option<IpAddr> {
    match ip.first()? >> 4 {
        4 if ip.len() >= 20 => Some(v4_at(ip, 12)),
        6 if ip.len() >= 40 => Some(v6_at(ip, 8)),
        _ => None,
    }
}

fn bump_v6_len(f: &mut [u8], l3: usize, added: usize) {
    if let Some(len) = be16(f, l3 + 4) {
        let len = len.wrapping_add(added as u16);
        f[l3 + 4..l3 + 6].copy_from_slice(&len.to_be_bytes());
    }
}

/// An ICMP "fragmentation needed" or `ICMPv6` "packet too big" to `to`, quoting `quote`.
fn icmp_error(to: IpAddr, quote: &[u8], v6: bool) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&addrs::LB_CLIENT_SIDE_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    let mut icmp = if v6 {
        vec![2, 0, 0, 0, 0, 0, 0x05, 0x00]
    } else {
        vec![3, 4, 0, 0, 0, 0, 0x05, 0x78]
    };
    icmp.extend_from_slice(quote);
    match to {
        IpAddr::V6(dst) if v6 => {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
            f.extend_from_slice(&[ICMPV6, 64]);
            f.extend_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x77).octets());
            f.extend_from_slice(&dst.octets());
        }
        IpAddr::V4(dst) if !v6 => {
            let c = csum(&icmp);
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            f.extend_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
            f.extend_from_slice(&[0, 1, 0, 0, 64, ICMP, 0, 0, 198, 18, 0, 77]);
            f.extend_from_slice(&dst.octets());
            fix_v4_checksum(&mut f);
        }
        _ => return packets::arp(),
    }
    f.extend_from_slice(&icmp);
    f
}

// ---------------------------------------------------------------------------------------------
// Running.

/// Runs one frame and judges it; the error names the frame in hex. Returns the reasons it was
/// counted under.
fn run_one(lab: &Lab, input: &Input, svcs: &[Svc], mem: &mut Memory) -> Result<Vec<Reason>> {
    let before: Vec<u64> = Reason::ALL.iter().map(|r| lab.reason(*r)).collect();
    let run = lab
        .run_on(&input.iface, &input.frame)
        .with_context(|| format!("test run of {}", hex(&input.frame)))?;
    let moved: Vec<Reason> = Reason::ALL
        .iter()
        .zip(&before)
        .flat_map(|(r, b)| {
            let d = lab.reason(*r) - b;
            std::iter::repeat_n(*r, d as usize)
        })
        .collect();
    judge(&input.frame, run.action, &run.out, &moved, svcs, mem).map_err(|e| {
        anyhow::anyhow!(
            "{e}\n  on {}: action {}, reasons {moved:?}\n  in  {}\n  out {}",
            input.iface,
            run.action,
            hex(&input.frame),
            hex(&run.out)
        )
    })?;
    Ok(moved)
}

#[test]
fn hostile_frames_never_break_the_invariants() -> Result<()> {
    let Some(lab) = lab("fz-run") else {
        return Ok(());
    };
    let svcs = services();
    let mut mem = Memory::default();
    let rounds = env_or("SWITCHYARD_FUZZ_ROUNDS", ROUNDS);
    let mut rng = Rng(env_or("SWITCHYARD_FUZZ_SEED", SEED).max(1));
    let mut failures: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    let mut counted: BTreeMap<&str, usize> = BTreeMap::new();
    let mut frames = 0;
    while frames < rounds {
        let inputs = seed(&mut rng, &mem)?;
        let mutate_which = rng.below(inputs.len() + 1);
        for (i, mut input) in inputs.into_iter().enumerate() {
            if i == mutate_which || rng.chance(20) {
                for _ in 0..=rng.below(3) {
                    mutate(&mut rng, &mut input.frame);
                }
                if rng.chance(50) {
                    fix_v4_checksum(&mut input.frame);
                }
            }
            if input.frame.len() < 14 || !seen.insert(input.frame.clone()) {
                continue;
            }
            frames += 1;
            match run_one(&lab, &input, &svcs, &mut mem) {
                Ok(reasons) => {
                    for r in reasons {
                        *counted.entry(r.name()).or_default() += 1;
                    }
                }
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
    }
    eprintln!("{frames} frames: {counted:?}");
    // Every path must have been taken, or the seeds and mutations have rotted.
    let paths = [
        Reason::NotIp,
        Reason::NoService,
        Reason::MalformedPass,
        Reason::NewFlow,
        Reason::ConntrackHit,
        Reason::Fragment,
        Reason::FragmentUnknown,
        Reason::IcmpForwarded,
        Reason::NatReply,
        Reason::NoBackend,
        Reason::AllDownPass,
        Reason::BackendReset,
    ];
    let missed: Vec<&str> = paths
        .iter()
        .map(|r| r.name())
        .filter(|n| !counted.contains_key(n))
        .collect();
    ensure!(missed.is_empty(), "the run never took {missed:?}");
    if !failures.is_empty() {
        let mut kinds: HashMap<&str, usize> = HashMap::new();
        for f in &failures {
            *kinds.entry(f.lines().next().unwrap_or("")).or_default() += 1;
        }
        let shown: Vec<&String> = failures.iter().take(15).collect();
        bail!(
            "{} of {frames} frames broke an invariant ({kinds:#?}); first {}:\n{}",
            failures.len(),
            shown.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}
