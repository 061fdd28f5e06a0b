//! Crafted packets for the program fixtures, built with etherparse, and independent checks of
//! what the program wrote (addresses, MACs, checksums recomputed from scratch).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, Result, bail};
use etherparse::{
    IcmpEchoHeader, Icmpv4Type, Icmpv6Type, InternetSlice, Ipv4Header, NetSlice, PacketBuilder,
    SlicedPacket, TransportSlice, VlanId, icmpv4::DestUnreachableHeader,
};

/// MAC of the client side of the lb as the client sees it (destination of client frames).
pub const TO_LB: [u8; 6] = crate::addrs::LB_CLIENT_SIDE_MAC;
/// MAC of the client (source of client frames).
pub const FROM_CLIENT: [u8; 6] = crate::addrs::CLIENT_MAC;
/// A payload to carry.
pub const PAYLOAD: &[u8] = b"switchyard fixture payload, 48 bytes long......";

/// Ethernet + IP + TCP (ACK, with data: a segment of an open connection) from `src:sport` to
/// `dst:dport`.
#[must_use]
pub fn tcp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Vec<u8> {
    tcp_with(src, sport, dst, dport, Tcp::Ack)
}

/// A TCP SYN (no ACK): the segment that opens a connection.
#[must_use]
pub fn syn(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Vec<u8> {
    tcp_with(src, sport, dst, dport, Tcp::Syn)
}

/// Flags of a crafted TCP segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tcp {
    /// SYN: opens a connection.
    Syn,
    /// ACK: a segment of an open connection.
    Ack,
    /// FIN + ACK: the sender is done.
    Fin,
    /// RST: the connection is reset.
    Rst,
}

/// Ethernet + IP + TCP with `flags` from `src:sport` to `dst:dport`.
#[must_use]
pub fn tcp_with(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, flags: Tcp) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(FROM_CLIENT, TO_LB);
    let mut out = Vec::new();
    let step = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .tcp(sport, dport, 1000, 64240),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .tcp(sport, dport, 1000, 64240),
        _ => return Vec::new(),
    };
    let step = match flags {
        Tcp::Syn => step.syn(),
        Tcp::Ack => step.ack(1),
        Tcp::Fin => step.fin().ack(1),
        Tcp::Rst => step.rst(),
    };
    step.write(&mut out, PAYLOAD)
        .map(|()| out)
        .unwrap_or_default()
}

/// Ethernet + IP + UDP from `src:sport` to `dst:dport`.
#[must_use]
pub fn udp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Vec<u8> {
    udp_with(src, sport, dst, dport, PAYLOAD)
}

/// Like [`udp`] with a chosen payload.
#[must_use]
pub fn udp_with(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(FROM_CLIENT, TO_LB);
    let mut out = Vec::new();
    let r = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .udp(sport, dport)
            .write(&mut out, payload),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .udp(sport, dport)
            .write(&mut out, payload),
        _ => return Vec::new(),
    };
    r.map(|()| out).unwrap_or_default()
}

/// A TCP SYN over IPv4 inside one (802.1Q) or two (802.1ad + 802.1Q) VLAN tags.
#[must_use]
pub fn tcp_vlan(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, tags: usize) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(FROM_CLIENT, TO_LB);
    let (Ok(outer), Ok(inner)) = (VlanId::try_new(100), VlanId::try_new(200)) else {
        return Vec::new();
    };
    let ip = match tags {
        1 => eth.single_vlan(inner).ipv4(src.octets(), dst.octets(), 64),
        _ => eth
            .double_vlan(outer, inner)
            .ipv4(src.octets(), dst.octets(), 64),
    };
    let mut out = Vec::new();
    match ip
        .tcp(sport, dport, 1000, 64240)
        .syn()
        .write(&mut out, PAYLOAD)
    {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

/// Rewrites the IPv4 header of an Ethernet frame (at byte 14) with `edit`, keeping the rest.
fn edit_ipv4(frame: &[u8], edit: impl FnOnce(&mut Ipv4Header) -> Result<()>) -> Result<Vec<u8>> {
    let (mut ip, rest) = Ipv4Header::from_slice(frame.get(14..).context("short frame")?)?;
    edit(&mut ip)?;
    ip.header_checksum = ip.calc_header_checksum();
    let mut out = frame.get(..14).context("short frame")?.to_vec();
    ip.write(&mut out)?;
    out.extend_from_slice(rest);
    Ok(out)
}

/// A TCP SYN over IPv4 with 4 bytes of options (NOP, NOP, NOP, EOL) in the IP header.
///
/// # Errors
///
/// When etherparse refuses the options or cannot rewrite the header.
pub fn tcp_v4_with_options(
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    dport: u16,
) -> Result<Vec<u8>> {
    let frame = tcp(src.into(), sport, dst.into(), dport);
    edit_ipv4(&frame, |ip| {
        ip.options = [1u8, 1, 1, 0][..]
            .try_into()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        ip.total_len += 4;
        Ok(())
    })
}

/// Splits a UDP-over-IPv4 frame into two fragments at 8-byte boundary `at` of the IP payload
/// (so the first carries the UDP header): `(first, later)`.
///
/// # Errors
///
/// When `frame` has no IPv4 header after Ethernet, `at` is beyond its payload, or a fragment
/// is longer than IPv4 allows.
pub fn fragment_v4(frame: &[u8], at: usize, id: u16) -> Result<(Vec<u8>, Vec<u8>)> {
    let (ip, payload) = Ipv4Header::from_slice(frame.get(14..).context("short frame")?)?;
    let (a, b) = (
        payload.get(..at).context("cut")?,
        payload.get(at..).context("cut")?,
    );
    let make = |part: &[u8], offset: usize, more: bool| -> Result<Vec<u8>> {
        let mut h = ip.clone();
        h.identification = id;
        h.more_fragments = more;
        h.fragment_offset = u16::try_from(offset / 8)?
            .try_into()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        h.total_len = u16::try_from(h.header_len() + part.len())?;
        h.header_checksum = h.calc_header_checksum();
        let mut out = frame.get(..14).context("short")?.to_vec();
        h.write(&mut out)?;
        out.extend_from_slice(part);
        Ok(out)
    };
    Ok((make(a, 0, true)?, make(b, at, false)?))
}

const V6_NEXT: usize = 14 + 6;
const V6_PAYLOAD_LEN: usize = 14 + 4;
const V6_END: usize = 14 + 40;

/// Inserts IPv6 extension headers (each `[next, len, ...]`, already sized) after the fixed
/// header of an IPv6 frame; fixes the next-header chain and the payload length.
fn insert_v6_ext(frame: &[u8], exts: &[Vec<u8>]) -> Result<Vec<u8>> {
    let mut out = frame.get(..V6_END).context("short frame")?.to_vec();
    let mut next = *frame.get(V6_NEXT).context("short")?;
    let mut chain = Vec::new();
    for e in exts.iter().rev() {
        let mut e = e.clone();
        std::mem::swap(&mut e[0], &mut next);
        chain.insert(0, e);
    }
    out[V6_NEXT] = next;
    let added: usize = chain.iter().map(Vec::len).sum();
    let len = u16::from_be_bytes([out[V6_PAYLOAD_LEN], out[V6_PAYLOAD_LEN + 1]]) as usize + added;
    out[V6_PAYLOAD_LEN..V6_PAYLOAD_LEN + 2].copy_from_slice(&u16::try_from(len)?.to_be_bytes());
    for e in chain {
        out.extend_from_slice(&e);
    }
    out.extend_from_slice(frame.get(V6_END..).context("short")?);
    Ok(out)
}

/// An 8-byte hop-by-hop (0) or destination-options (60) header with `PadN` padding; the first
/// byte names its own type until [`insert_v6_ext`] links it.
#[must_use]
pub fn v6_opts(kind: u8) -> Vec<u8> {
    vec![kind, 0, 1, 4, 0, 0, 0, 0]
}

/// A TCP SYN over IPv6 with hop-by-hop and destination-options extension headers.
///
/// # Errors
///
/// When [`tcp`] could not build the segment (it then returns an empty frame).
pub fn tcp_v6_with_ext(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Result<Vec<u8>> {
    insert_v6_ext(
        &tcp(src.into(), sport, dst.into(), dport),
        &[v6_opts(0), v6_opts(60)],
    )
}

/// Splits a UDP-over-IPv6 frame into two fragments (RFC 8200 §4.5) at 8-byte boundary `at`.
///
/// # Errors
///
/// When `frame` is shorter than Ethernet and the IPv6 header, `at` is beyond its payload, or a
/// fragment is longer than IPv6 allows.
pub fn fragment_v6(frame: &[u8], at: usize, id: u32) -> Result<(Vec<u8>, Vec<u8>)> {
    let head = frame.get(..V6_END).context("short")?;
    let payload = frame.get(V6_END..).context("short")?;
    let (a, b) = (
        payload.get(..at).context("cut")?,
        payload.get(at..).context("cut")?,
    );
    let make = |part: &[u8], offset: usize, more: bool| -> Result<Vec<u8>> {
        let mut only_head = head.to_vec();
        let len = u16::try_from(part.len())?;
        only_head[V6_PAYLOAD_LEN..V6_PAYLOAD_LEN + 2].copy_from_slice(&len.to_be_bytes());
        only_head.extend_from_slice(part);
        let off = u16::try_from(offset / 8)? << 3 | u16::from(more);
        let mut frag = vec![44, 0];
        frag.extend_from_slice(&off.to_be_bytes());
        frag.extend_from_slice(&id.to_be_bytes());
        insert_v6_ext(&only_head, &[frag])
    };
    Ok((make(a, 0, true)?, make(b, at, false)?))
}

/// An ICMP "fragmentation needed" (RFC 1191) from `router` to the virtual IP, quoting the
/// IPv4 header and first 8 bytes of a TCP segment `vip:vport → client:cport`.
///
/// # Errors
///
/// When the quoted segment could not be built, or etherparse cannot write the frame.
pub fn icmp_frag_needed(
    router: Ipv4Addr,
    vip: Ipv4Addr,
    vport: u16,
    client: Ipv4Addr,
    cport: u16,
) -> Result<Vec<u8>> {
    let quoted = tcp(vip.into(), vport, client.into(), cport);
    let quote = quoted.get(14..14 + 20 + 8).context("short quote")?;
    let mut out = Vec::new();
    PacketBuilder::ethernet2(FROM_CLIENT, TO_LB)
        .ipv4(router.octets(), vip.octets(), 64)
        .icmpv4(Icmpv4Type::DestinationUnreachable(
            DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
        ))
        .write(&mut out, quote)?;
    Ok(out)
}

/// An `ICMPv6` "packet too big" (RFC 8201) from `router` to the virtual IP, quoting a TCP
/// segment `vip:vport → client:cport`.
///
/// # Errors
///
/// When the quoted segment could not be built, or etherparse cannot write the frame.
pub fn icmpv6_too_big(
    router: Ipv6Addr,
    vip: Ipv6Addr,
    vport: u16,
    client: Ipv6Addr,
    cport: u16,
) -> Result<Vec<u8>> {
    let quoted = tcp(vip.into(), vport, client.into(), cport);
    let quote = quoted.get(14..14 + 40 + 8).context("short quote")?;
    let mut out = Vec::new();
    PacketBuilder::ethernet2(FROM_CLIENT, TO_LB)
        .ipv6(router.octets(), vip.octets(), 64)
        .icmpv6(Icmpv6Type::PacketTooBig { mtu: 1280 })
        .write(&mut out, quote)?;
    Ok(out)
}

/// An ICMP echo request to `dst` (not a service flow).
///
/// # Errors
///
/// When etherparse cannot write the frame.
pub fn ping(src: Ipv4Addr, dst: Ipv4Addr) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(FROM_CLIENT, TO_LB)
        .ipv4(src.octets(), dst.octets(), 64)
        .icmpv4(Icmpv4Type::EchoRequest(IcmpEchoHeader { id: 1, seq: 1 }))
        .write(&mut out, b"ping")?;
    Ok(out)
}

/// An `ICMPv6` echo request to `dst`.
///
/// # Errors
///
/// When etherparse cannot write the frame.
pub fn ping6(src: Ipv6Addr, dst: Ipv6Addr) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(FROM_CLIENT, TO_LB)
        .ipv6(src.octets(), dst.octets(), 64)
        .icmpv6(Icmpv6Type::EchoRequest(IcmpEchoHeader { id: 1, seq: 1 }))
        .write(&mut out, b"ping")?;
    Ok(out)
}

/// An ARP request (who-has 198.18.0.254).
#[must_use]
pub fn arp() -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&FROM_CLIENT);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&FROM_CLIENT);
    f.extend_from_slice(&[198, 18, 0, 1, 0, 0, 0, 0, 0, 0, 198, 18, 0, 254]);
    f
}

/// What a forwarded frame looks like, read back independently.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen {
    /// Ethernet destination.
    pub dst_mac: [u8; 6],
    /// Ethernet source.
    pub src_mac: [u8; 6],
    /// IP source.
    pub src: IpAddr,
    /// IP destination.
    pub dst: IpAddr,
    /// Whether every checksum present (IPv4 header, TCP, UDP, ICMP, `ICMPv6`) verifies.
    pub checksums_ok: bool,
    /// The ICMP or `ICMPv6` type, for such a message.
    pub icmp_type: Option<u8>,
}

/// Parses a frame and verifies its checksums from scratch.
///
/// # Errors
///
/// When `frame` does not parse, or is not Ethernet II carrying IPv4 or IPv6.
pub fn inspect(frame: &[u8]) -> Result<Seen> {
    let p = SlicedPacket::from_ethernet(frame)?;
    let Some(etherparse::LinkSlice::Ethernet2(eth)) = &p.link else {
        bail!("not Ethernet II")
    };
    let (dst_mac, src_mac) = (eth.destination(), eth.source());
    let (src, dst, mut ok) = match &p.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header().to_header();
            (
                IpAddr::V4(h.source.into()),
                IpAddr::V4(h.destination.into()),
                h.header_checksum == h.calc_header_checksum(),
            )
        }
        Some(NetSlice::Ipv6(ip)) => {
            let h = ip.header();
            (
                IpAddr::V6(h.source_addr()),
                IpAddr::V6(h.destination_addr()),
                true,
            )
        }
        _ => bail!("no IP header"),
    };
    // L4 checksums cover the whole datagram: only complete (unfragmented) ones are checked.
    let fragmented = match &p.net {
        Some(InternetSlice::Ipv4(ip)) => ip.is_payload_fragmented(),
        Some(InternetSlice::Ipv6(ip)) => ip.is_payload_fragmented(),
        _ => false,
    };
    if !fragmented {
        ok &= match (&p.net, &p.transport) {
            (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(t))) => {
                t.calc_checksum_ipv4(ip.header().source(), ip.header().destination())
                    .ok()
                    == Some(t.checksum())
            }
            (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Tcp(t))) => {
                t.calc_checksum_ipv6(ip.header().source(), ip.header().destination())
                    .ok()
                    == Some(t.checksum())
            }
            (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Udp(u))) => {
                u.checksum() == 0
                    || u.to_header()
                        .calc_checksum_ipv4(&ip.header().to_header(), u.payload())
                        .ok()
                        == Some(u.checksum())
            }
            (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Udp(u))) => {
                u.to_header()
                    .calc_checksum_ipv6(&ip.header().to_header(), u.payload())
                    .ok()
                    == Some(u.checksum())
            }
            (_, Some(TransportSlice::Icmpv4(m))) => {
                etherparse::Icmpv4Header::with_checksum(m.icmp_type(), m.payload()).checksum
                    == m.checksum()
            }
            (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Icmpv6(m))) => {
                etherparse::Icmpv6Header::with_checksum(
                    m.icmp_type(),
                    ip.header().source(),
                    ip.header().destination(),
                    m.payload(),
                )
                .is_ok_and(|h| h.checksum == m.checksum())
            }
            _ => true,
        };
    }
    let icmp_type = match &p.transport {
        Some(TransportSlice::Icmpv4(m)) => Some(m.type_u8()),
        Some(TransportSlice::Icmpv6(m)) => Some(m.type_u8()),
        _ => None,
    };
    Ok(Seen {
        dst_mac,
        src_mac,
        src,
        dst,
        checksums_ok: ok,
        icmp_type,
    })
}

/// `frame` with the byte at `at` set to `value` (unchanged if it is shorter).
#[must_use]
pub fn set_byte(mut frame: Vec<u8>, at: usize, value: u8) -> Vec<u8> {
    if let Some(b) = frame.get_mut(at) {
        *b = value;
    }
    frame
}

/// A UDP-over-IPv4 frame (IPv4 header without options) with its UDP checksum zeroed ("no
/// checksum", RFC 768).
#[must_use]
pub fn zero_udp_checksum(frame: Vec<u8>) -> Vec<u8> {
    set_byte(set_byte(frame, 14 + 20 + 6, 0), 14 + 20 + 7, 0)
}

/// `frame` with the big-endian 16-bit field at `at` set to `value` and, for IPv4, its header
/// checksum recomputed ([`fix_v4_checksum`]).
#[must_use]
pub fn set_u16(mut frame: Vec<u8>, at: usize, value: u16) -> Vec<u8> {
    frame[at..at + 2].copy_from_slice(&value.to_be_bytes());
    fix_v4_checksum(&mut frame);
    frame
}

/// Recomputes the IPv4 header checksum of an Ethernet frame (after at most two VLAN tags), if
/// there is a whole IPv4 header to compute it over; leaves any other frame alone.
pub fn fix_v4_checksum(f: &mut [u8]) {
    let be16 = |f: &[u8], at: usize| Some(u16::from_be_bytes([*f.get(at)?, *f.get(at + 1)?]));
    let Some(mut ty) = be16(f, 12) else { return };
    let mut l3 = 14;
    for _ in 0..2 {
        if ty != 0x8100 && ty != 0x88a8 {
            break;
        }
        let Some(inner) = be16(f, l3 + 2) else { return };
        ty = inner;
        l3 += 4;
    }
    if ty != 0x0800 {
        return;
    }
    let Some(&vihl) = f.get(l3) else { return };
    let ihl = usize::from(vihl & 0x0f) * 4;
    if ihl < 20 || f.len() < l3 + ihl {
        return;
    }
    f[l3 + 10] = 0;
    f[l3 + 11] = 0;
    let mut acc: u32 = f[l3..l3 + ihl]
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the sum is folded into 16 bits first"
    )]
    let c = !(acc as u16);
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

/// `f` as lowercase hex, two digits a byte.
#[must_use]
pub fn hex(f: &[u8]) -> String {
    f.iter()
        .fold(String::with_capacity(2 * f.len()), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The bytes of the hex string `s` (two digits a byte), as [`hex`] writes them.
///
/// # Panics
/// On a character that is not a hex digit.
#[must_use]
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("a hex digit"))
        .collect()
}
