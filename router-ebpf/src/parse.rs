//! Header parsing: Ethernet (up to two VLAN tags), IPv4 (options, fragments), IPv6 (a bounded
//! extension-header walk, fragments), TCP and UDP ports, and the inner flow of ICMP
//! "fragmentation needed" (RFC 1191) and `ICMPv6` "packet too big" (RFC 8201) errors.
//!
//! Every read goes through [`ptr_at`], which checks the access against `data_end`; every offset
//! is bounded by construction (a 4-bit IHL, a constant number of VLAN tags and extension
//! headers), which is what the verifier needs to accept variable offsets.
//!
//! The IP length fields are checked too: the datagram must fit in the frame, and every header
//! the parser trusts (extension headers, the L4 header, an ICMP quote) must end inside the
//! datagram; bytes past it are Ethernet padding. Anything else is `MalformedPass`.

use core::mem::size_of;

use aya_ebpf::programs::XdpContext;
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    vlan::VlanHdr,
};
use router_common::{FAMILY_V4, FAMILY_V6, FlowKey, PROTO_TCP, PROTO_UDP, Reason};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// 802.1ad outer tag plus 802.1Q inner tag.
const MAX_VLAN_TAGS: usize = 2;
/// Extension headers walked before giving up (RFC 8200 §4.1 recommends an order in which each
/// appears at most once; six covers hop-by-hop, destination ×2, routing, fragment, AH).
const MAX_IPV6_EXT: usize = 6;

/// IP protocol numbers of ICMP and `ICMPv6`.
pub(crate) const PROTO_ICMP: u8 = 1;
pub(crate) const PROTO_ICMPV6: u8 = 58;
const IPV6_HOPOPTS: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_AH: u8 = 51;
const IPV6_DSTOPTS: u8 = 60;

/// Deepest header offset the parser reads at, in bytes from the start of the frame.
pub const MAX_OFFSET: usize = 2047;

/// ICMP destination unreachable / fragmentation needed (RFC 792, RFC 1191).
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
/// `ICMPv6` packet too big (RFC 4443 §3.2, RFC 8201).
const ICMPV6_PKT_TOOBIG: u8 = 2;
/// ICMP and `ICMPv6` headers are 8 bytes before the quoted packet.
const ICMP_HDR_LEN: usize = 8;
/// Bytes of the original datagram's data an ICMP error quotes at least (RFC 792): the ports.
const ICMP_QUOTED_DATA: usize = 8;

/// A checked pointer to a `T` at byte `off` of the packet, or `None` if it would cross
/// `data_end`.
///
/// `T` must be at least two bytes: LLVM turns `p + 1 > end` into `p >= end`, and the verifier
/// derives no readable range from that form when `p` has a variable offset (kernel
/// `find_good_pkt_pointers`, seen on 6.18).
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, off: usize) -> Option<*mut T> {
    // Offsets past MAX_OFFSET are refused: it bounds every offset for the verifier, including
    // ones re-read from map memory. Headers never reach that deep in a sane packet.
    if off > MAX_OFFSET {
        return None;
    }
    let start = ctx.data();
    let end = ctx.data_end();
    let p = start + off;
    if p + size_of::<T>() > end {
        return None;
    }
    Some(p as *mut T)
}

/// Where a packet sits in a fragmented datagram. (Plain integers rather than an enum with
/// payloads: LLVM may store an uninitialised payload from any register, including a packet
/// pointer, which the verifier rejects as a partial pointer spill.)
pub mod frag {
    /// Not fragmented.
    pub const NONE: u32 = 0;
    /// The first fragment (offset 0, more fragments): carries the L4 header.
    pub const FIRST: u32 = 1;
    /// A later fragment: no L4 header.
    pub const LATER: u32 = 2;
}

/// What the parser found: the flow to balance and where its headers are.
///
/// It lives in the per-CPU `SCRATCH` map, not on the stack, for two reasons: the BPF stack is
/// 512 bytes, and a value read back from map memory is unknown to the verifier. The second is
/// what keeps verification tractable: every parse path (VLAN depth, IPv4 options, each IPv6
/// extension chain) ends in the same verifier state once `l3`/`l4` are re-read and bounded,
/// instead of multiplying the states of everything after it.
#[repr(C)]
pub struct Packet {
    /// Offset of the (outer) IP header.
    pub l3: usize,
    /// Offset of the L4 header, meaningful unless `frag` is [`frag::LATER`].
    pub l4: usize,
    /// The flow to select a backend for. For an ICMP error this is the quoted flow turned
    /// around (client → virtual IP), so it matches that flow's conntrack entry and hash.
    pub flow: FlowKey,
    /// Fragment state of the outer datagram: a [`frag`] constant.
    pub frag: u32,
    /// IP identification of a fragmented datagram (IPv4: 16 bits widened), else 0.
    pub frag_id: u32,
    /// 1 if the packet is an ICMP/ICMPv6 error quoting `flow`, else 0.
    pub icmp: u32,
    /// The flags byte of a TCP packet that carries its header (`router_common::tcp_flags`), else 0.
    pub tcp: u32,
    /// 1 if the packet is an ICMP/`ICMPv6` echo request (whole, not a fragment), else 0. Its
    /// flow holds the addresses and the protocol; the ports are 0.
    pub echo: u32,
    /// An ipip packet's encapsulation, handed from the classification to the entry, which
    /// encapsulates once the classification's stack frame is gone (see `crate::ipip`). Set
    /// only when it is used: [`Packet::reset`] leaves it.
    pub encap: crate::ipip::Encap,
}

impl Packet {
    /// Offset of the IP header, re-read from map memory (see the type's doc).
    #[inline(always)]
    pub fn l3(&self) -> usize {
        unsafe { core::ptr::read_volatile(&raw const self.l3) }
    }

    /// Offset of the L4 header, re-read from map memory (see the type's doc).
    #[inline(always)]
    pub fn l4(&self) -> usize {
        unsafe { core::ptr::read_volatile(&raw const self.l4) }
    }

    /// Whether the packet is an ICMP error quoting `flow`.
    #[inline(always)]
    pub fn is_icmp(&self) -> bool {
        self.icmp != 0
    }

    /// Clears the flow and the fragment and ICMP state (an all-zero `FlowKey`, `frag::NONE`):
    /// six 64-bit stores. Assigning `FlowKey::default()` and the fields became a call to the
    /// BPF target's byte-at-a-time `memset` (52 rounds); volatile stores are not merged into one.
    #[inline(always)]
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "`flow` sits at an 8-aligned offset (asserted below) of the 8-aligned `Packet`, \
                  though `FlowKey` alone is 2-aligned"
    )]
    fn reset(&mut self) {
        const _: () = assert!(core::mem::offset_of!(Packet, flow) % 8 == 0);
        const _: () = assert!(core::mem::offset_of!(Packet, frag) == 16 + size_of::<FlowKey>());
        const _: () = assert!(core::mem::offset_of!(Packet, icmp) == 16 + size_of::<FlowKey>() + 8);
        let w = (&raw mut self.flow).cast::<u64>();
        let mut i = 0;
        // The flow (40 bytes), then `frag` and `frag_id` (8).
        while i < (size_of::<FlowKey>() + 8) / 8 {
            // SAFETY: `flow`, `frag` and `frag_id` are contiguous, 8-aligned and 48 bytes long.
            unsafe { core::ptr::write_volatile(w.add(i), 0) };
            i += 1;
        }
        unsafe {
            core::ptr::write_volatile(&raw mut self.icmp, 0);
            core::ptr::write_volatile(&raw mut self.tcp, 0);
            core::ptr::write_volatile(&raw mut self.echo, 0);
        }
    }

    /// Stores `off` as the L4 offset and returns it re-read: an unknown value to the verifier,
    /// so each round of the extension-header walk starts from one state.
    #[inline(always)]
    fn forget_l4(&mut self, off: usize) -> usize {
        unsafe {
            core::ptr::write_volatile(&raw mut self.l4, off);
            core::ptr::read_volatile(&raw const self.l4)
        }
    }
}

/// Parses Ethernet, VLAN tags, IP and L4 ports into `pkt`.
///
/// `Err(Reason::NotIp)` for non-IP frames, `Err(Reason::NoService)` for IP packets that can carry
/// no service flow (other protocols, ICMP other than the two PMTU errors), and
/// `Err(Reason::MalformedPass)` for truncated or inconsistent headers.
#[inline(always)]
pub fn parse(ctx: &XdpContext, pkt: &mut Packet) -> Result<(), Reason> {
    pkt.reset();
    let eth: *const EthHdr = ptr_at(ctx, 0).ok_or(Reason::MalformedPass)?;
    let mut ether_type = u16::from_be(unsafe { (*eth).ether_type });
    let mut off = EthHdr::LEN;
    for _ in 0..MAX_VLAN_TAGS {
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            break;
        }
        let vlan: *const VlanHdr = ptr_at(ctx, off).ok_or(Reason::MalformedPass)?;
        ether_type = u16::from_be(unsafe { (*vlan).ether_type });
        off += VlanHdr::LEN;
    }
    match ether_type {
        ETH_P_IP => parse_ipv4(ctx, off, pkt),
        ETH_P_IPV6 => parse_ipv6(ctx, off, pkt),
        _ => Err(Reason::NotIp),
    }
}

/// Writes the whole flow key `f` with five 64-bit stores: the addresses as native-order words
/// ([`v4_addr`], [`v6_addr`]), then ports, protocol and family in the last word (padding zero).
/// Assigning the `[u8; 16]` fields instead became a call to the BPF target's byte-at-a-time
/// `memmove` or `memset`. The stores are as wide as the loads that read the key back (the filter
/// and flow-cache hashes read 64-bit words): a load that spans two narrower stores still in
/// flight cannot be forwarded from them and stalls.
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the flow is 8-aligned: `FlowKey` sits 8-aligned in `Packet` (see `Packet::reset`)"
)]
fn set_flow(
    f: &mut FlowKey,
    src: [u64; 2],
    dst: [u64; 2],
    sport: u16,
    dport: u16,
    proto: u8,
    family: u8,
) {
    const _: () = assert!(core::mem::offset_of!(FlowKey, dst) == 16);
    const _: () = assert!(core::mem::offset_of!(FlowKey, sport) == 32);
    const _: () = assert!(size_of::<FlowKey>() == 40);
    let (s, d) = (sport.to_ne_bytes(), dport.to_ne_bytes());
    let tail = u64::from_ne_bytes([s[0], s[1], d[0], d[1], proto, family, 0, 0]);
    let w = core::ptr::from_mut(f).cast::<u64>();
    // SAFETY: the key's 40 bytes, 8-aligned (see above).
    unsafe {
        core::ptr::write_volatile(w, src[0]);
        core::ptr::write_volatile(w.add(1), src[1]);
        core::ptr::write_volatile(w.add(2), dst[0]);
        core::ptr::write_volatile(w.add(3), dst[1]);
        core::ptr::write_volatile(w.add(4), tail);
    }
}

/// A load of `$ty` from packet memory at `$p`, written out as one BPF instruction.
///
/// Packet memory has no alignment LLVM can rely on, so a plain read of a `[u8; 4]` becomes four
/// byte loads, three shifts and three ors. The kernel permits misaligned packet loads wherever
/// the architecture has efficient unaligned access (x86-64, arm64: no `BPF_F_STRICT_ALIGNMENT`);
/// the instruction is written out so LLVM can neither split it nor assume an alignment.
macro_rules! packet_load {
    ($p:expr, $ty:ty, $width:literal) => {{
        let v: $ty;
        // SAFETY (callers): `$p` points into the packet and the bytes loaded were checked
        // against `data_end`; the load neither writes nor touches the stack.
        core::arch::asm!(
            concat!("{v} = *(", $width, " *)({p} + 0)"),
            v = lateout(reg) v,
            p = in(reg) $p,
            options(pure, readonly, nostack, preserves_flags),
        );
        v
    }};
}

/// An IPv4 address of a checked header, in the flow's layout (first four bytes, then zeros), as
/// native-order 64-bit words.
#[inline(always)]
fn v4_addr(a: &[u8; 4]) -> [u64; 2] {
    // SAFETY: `a` lies in a header `ptr_at` checked.
    let w: u32 = unsafe { packet_load!(a.as_ptr(), u32, "u32") };
    [u64::from(w), 0]
}

/// An IPv6 address of a checked header as native-order 64-bit words.
#[inline(always)]
fn v6_addr(a: &[u8; 16]) -> [u64; 2] {
    let p = a.as_ptr();
    // SAFETY: `a` lies in a header `ptr_at` checked; both words are inside its 16 bytes.
    unsafe {
        [
            packet_load!(p, u64, "u64"),
            packet_load!(p.add(8), u64, "u64"),
        ]
    }
}

/// A 16-bit big-endian field of a checked header.
#[inline(always)]
fn be16(f: &[u8; 2]) -> u16 {
    // SAFETY: `f` lies in a header `ptr_at` checked.
    u16::from_be(unsafe { packet_load!(f.as_ptr(), u16, "u16") })
}

/// Smallest TCP header.
const TCP_HDR_LEN: usize = 20;
/// UDP header.
const UDP_HDR_LEN: usize = 8;

/// Length of the frame, from the Ethernet header.
#[inline(always)]
fn frame_len(ctx: &XdpContext) -> usize {
    ctx.data_end() - ctx.data()
}

/// Bytes of an L4 header of `proto` that must lie inside the datagram before it is trusted.
#[inline(always)]
fn l4_len(proto: u8) -> usize {
    if proto == PROTO_TCP {
        TCP_HDR_LEN
    } else {
        UDP_HDR_LEN
    }
}

/// Reads the source and destination ports at `off` (TCP and UDP both start with them), and for
/// a whole TCP header (`need` is [`TCP_HDR_LEN`]) its flags byte (byte 13; else 0), after
/// checking that `need` bytes from `off` lie inside the datagram, which ends at `end`. (The
/// frame may be longer: Ethernet padding is not part of the datagram.)
#[inline(always)]
fn ports(ctx: &XdpContext, off: usize, need: usize, end: usize) -> Result<(u16, u16, u32), Reason> {
    let p: *const [u16; 2] = ptr_at(ctx, off).ok_or(Reason::MalformedPass)?;
    let flags = if need == TCP_HDR_LEN {
        let f: *const [u8; 2] = ptr_at(ctx, off + 12).ok_or(Reason::MalformedPass)?;
        // SAFETY: `ptr_at` checked both bytes.
        u32::from(unsafe { (*f)[1] })
    } else {
        0
    };
    // Checked after the reads, not before: `end` fits in the frame, so LLVM would otherwise
    // drop `ptr_at`'s bounds checks as implied, and the verifier cannot follow that reasoning
    // (6.18: "invalid access to packet").
    if off + need > end {
        return Err(Reason::MalformedPass);
    }
    // SAFETY: `ptr_at` checked the four bytes.
    let w: u32 = unsafe { packet_load!(p.cast::<u8>(), u32, "u32") };
    let b = w.to_ne_bytes();
    Ok((
        u16::from_ne_bytes([b[0], b[1]]),
        u16::from_ne_bytes([b[2], b[3]]),
        flags,
    ))
}

#[inline(always)]
fn parse_ipv4(ctx: &XdpContext, l3: usize, pkt: &mut Packet) -> Result<(), Reason> {
    let ip: *const Ipv4Hdr = ptr_at(ctx, l3).ok_or(Reason::MalformedPass)?;
    let ip = unsafe { &*ip };
    let ihl = ((ip.vihl & 0x0f) as usize) * 4;
    if ip.vihl >> 4 != 4 || ihl < Ipv4Hdr::LEN {
        return Err(Reason::MalformedPass);
    }
    // The datagram must hold its header and fit in the frame; what follows it is padding.
    let total = be16(&ip.tot_len) as usize;
    let end = l3 + total;
    if total < ihl || end > frame_len(ctx) {
        return Err(Reason::MalformedPass);
    }
    let l4 = l3 + ihl;
    let frags = be16(&ip.frags);
    let more = frags & 0x2000 != 0;
    let offset = frags & 0x1fff;
    let frag = if offset != 0 {
        frag::LATER
    } else if more {
        frag::FIRST
    } else {
        frag::NONE
    };
    pkt.frag_id = if frag == frag::NONE {
        0
    } else {
        u32::from(be16(&ip.id))
    };
    pkt.l3 = l3;
    pkt.l4 = l4;
    pkt.frag = frag;
    match ip.proto {
        PROTO_TCP | PROTO_UDP => {
            // A first fragment carries the ports: the service is looked up with them (the
            // datagram is then balanced on addresses and the service port).
            let (sport, dport, tcp) = if frag == frag::LATER {
                (0, 0, 0)
            } else {
                ports(ctx, l4, l4_len(ip.proto), end)?
            };
            pkt.tcp = tcp;
            set_flow(
                &mut pkt.flow,
                v4_addr(&ip.src_addr),
                v4_addr(&ip.dst_addr),
                sport,
                dport,
                ip.proto,
                FAMILY_V4,
            );
            Ok(())
        }
        PROTO_ICMP if frag == frag::NONE => {
            let (src, dst) = (v4_addr(&ip.src_addr), v4_addr(&ip.dst_addr));
            if icmp_kind(ctx, l4, end)? == ICMP_ECHO_REQUEST {
                return unserved(pkt, src, dst, PROTO_ICMP, FAMILY_V4, true);
            }
            pkt.icmp = 1;
            match icmpv4_inner(ctx, l4, end, ip.dst_addr, &mut pkt.flow) {
                Err(Reason::NoService) => unserved(pkt, src, dst, PROTO_ICMP, FAMILY_V4, false),
                r => r,
            }
        }
        proto => unserved(
            pkt,
            v4_addr(&ip.src_addr),
            v4_addr(&ip.dst_addr),
            proto,
            FAMILY_V4,
            false,
        ),
    }
}

/// ICMP echo request (RFC 792).
const ICMP_ECHO_REQUEST: u8 = 8;
/// `ICMPv6` echo request (RFC 4443 §4.1).
const ICMPV6_ECHO_REQUEST: u8 = 128;

/// The type of the ICMP or `ICMPv6` message at `l4`, whose 8-byte header must lie inside the
/// datagram ending at `end`.
#[inline(always)]
fn icmp_kind(ctx: &XdpContext, l4: usize, end: usize) -> Result<u8, Reason> {
    let p: *const [u8; 2] = ptr_at(ctx, l4).ok_or(Reason::MalformedPass)?;
    // SAFETY: `ptr_at` checked both bytes.
    let kind = unsafe { (*p)[0] };
    // Checked after the read, as in `ports`.
    if l4 + ICMP_HDR_LEN > end {
        return Err(Reason::MalformedPass);
    }
    Ok(kind)
}

/// Records a packet that is no service's flow: its addresses, `proto` and `family` (ports 0),
/// and whether it is an echo request, for the virtual-IP check (`crate::vip`). Always
/// `Err(NoService)`.
#[inline(always)]
fn unserved(
    pkt: &mut Packet,
    src: [u64; 2],
    dst: [u64; 2],
    proto: u8,
    family: u8,
    echo: bool,
) -> Result<(), Reason> {
    set_flow(&mut pkt.flow, src, dst, 0, 0, proto, family);
    pkt.icmp = 0;
    pkt.echo = u32::from(echo);
    Err(Reason::NoService)
}

/// The flow quoted by an ICMP fragmentation-needed error, turned around.
#[inline(always)]
fn icmpv4_inner(
    ctx: &XdpContext,
    l4: usize,
    end: usize,
    to: [u8; 4],
    f: &mut FlowKey,
) -> Result<(), Reason> {
    let icmp: *const [u8; ICMP_HDR_LEN] = ptr_at(ctx, l4).ok_or(Reason::MalformedPass)?;
    let (kind, code) = unsafe { ((*icmp)[0], (*icmp)[1]) };
    if kind != ICMP_DEST_UNREACH || code != ICMP_FRAG_NEEDED {
        return Err(Reason::NoService);
    }
    let inner_l3 = l4 + ICMP_HDR_LEN;
    let ip: *const Ipv4Hdr = ptr_at(ctx, inner_l3).ok_or(Reason::MalformedPass)?;
    let ip = unsafe { &*ip };
    let ihl = ((ip.vihl & 0x0f) as usize) * 4;
    if ip.vihl >> 4 != 4 || ihl < Ipv4Hdr::LEN {
        return Err(Reason::MalformedPass);
    }
    // Only an error addressed to the address it quotes as the source (the virtual IP) belongs
    // to the service; one for another host (say, the balancer's own address) is not stolen.
    if ip.proto != PROTO_TCP && ip.proto != PROTO_UDP || ip.src_addr != to {
        return Err(Reason::NoService);
    }
    // The quote holds the original header and at least 64 bits of its data (RFC 792).
    let (sport, dport, _) = ports(ctx, inner_l3 + ihl, ICMP_QUOTED_DATA, end)?;
    // The quoted packet left the virtual IP towards the client: reverse it.
    set_flow(
        f,
        v4_addr(&ip.dst_addr),
        v4_addr(&ip.src_addr),
        dport,
        sport,
        ip.proto,
        FAMILY_V4,
    );
    Ok(())
}

#[inline(always)]
fn parse_ipv6(ctx: &XdpContext, l3: usize, pkt: &mut Packet) -> Result<(), Reason> {
    let ip: *const Ipv6Hdr = ptr_at(ctx, l3).ok_or(Reason::MalformedPass)?;
    let ip = unsafe { &*ip };
    if ip.vcf[0] >> 4 != 6 {
        return Err(Reason::MalformedPass);
    }
    // The payload must fit in the frame (a jumbogram cannot be an Ethernet frame).
    let end = l3 + Ipv6Hdr::LEN + be16(&ip.payload_len) as usize;
    if end > frame_len(ctx) {
        return Err(Reason::MalformedPass);
    }
    let mut next = ip.next_hdr;
    let mut off = l3 + Ipv6Hdr::LEN;
    let mut frag = frag::NONE;
    for _ in 0..MAX_IPV6_EXT {
        match next {
            IPV6_HOPOPTS | IPV6_ROUTING | IPV6_DSTOPTS => {
                let h: *const [u8; 2] = ptr_at(ctx, off).ok_or(Reason::MalformedPass)?;
                let [nh, len] = unsafe { *h };
                next = nh;
                off += (len as usize + 1) * 8;
            }
            IPV6_AH => {
                let h: *const [u8; 2] = ptr_at(ctx, off).ok_or(Reason::MalformedPass)?;
                let [nh, len] = unsafe { *h };
                next = nh;
                off += (len as usize + 2) * 4;
            }
            IPV6_FRAGMENT => {
                let h: *const [u8; 8] = ptr_at(ctx, off).ok_or(Reason::MalformedPass)?;
                let h = unsafe { *h };
                next = h[0];
                let offset_flags = u16::from_be_bytes([h[2], h[3]]);
                frag = if offset_flags >> 3 != 0 {
                    frag::LATER
                } else if offset_flags & 1 != 0 {
                    frag::FIRST
                } else {
                    // An atomic fragment (RFC 6946): a whole datagram.
                    frag::NONE
                };
                pkt.frag_id = if frag == frag::NONE {
                    0
                } else {
                    u32::from_be_bytes([h[4], h[5], h[6], h[7]])
                };
                off += 8;
            }
            _ => break,
        }
        if off > end {
            return Err(Reason::MalformedPass);
        }
        if frag == frag::LATER {
            // What follows a later fragment's header is fragment data, not headers
            // (RFC 8200 §4.5).
            break;
        }
        off = pkt.forget_l4(off);
    }
    pkt.l3 = l3;
    pkt.l4 = off;
    pkt.frag = frag;
    match next {
        // A later fragment follows its first whatever header opens the fragmentable part:
        // IPv6 fragments are identified by addresses and identification alone.
        _ if frag == frag::LATER || next == PROTO_TCP || next == PROTO_UDP => {
            // A first fragment carries the ports: the service is looked up with them (the
            // datagram is then balanced on addresses and the service port).
            let (sport, dport, tcp) = if frag == frag::LATER {
                (0, 0, 0)
            } else {
                ports(ctx, off, l4_len(next), end)?
            };
            pkt.tcp = tcp;
            set_flow(
                &mut pkt.flow,
                v6_addr(&ip.src_addr),
                v6_addr(&ip.dst_addr),
                sport,
                dport,
                next,
                FAMILY_V6,
            );
            Ok(())
        }
        PROTO_ICMPV6 if frag == frag::NONE => {
            let (src, dst) = (v6_addr(&ip.src_addr), v6_addr(&ip.dst_addr));
            if icmp_kind(ctx, off, end)? == ICMPV6_ECHO_REQUEST {
                return unserved(pkt, src, dst, PROTO_ICMPV6, FAMILY_V6, true);
            }
            pkt.icmp = 1;
            match icmpv6_inner(ctx, off, end, &ip.dst_addr, &mut pkt.flow) {
                Err(Reason::NoService) => unserved(pkt, src, dst, PROTO_ICMPV6, FAMILY_V6, false),
                r => r,
            }
        }
        // Still an extension header after MAX_IPV6_EXT: too long a chain to follow.
        IPV6_HOPOPTS | IPV6_ROUTING | IPV6_DSTOPTS | IPV6_AH | IPV6_FRAGMENT => {
            Err(Reason::MalformedPass)
        }
        proto => unserved(
            pkt,
            v6_addr(&ip.src_addr),
            v6_addr(&ip.dst_addr),
            proto,
            FAMILY_V6,
            false,
        ),
    }
}

/// The flow quoted by an `ICMPv6` packet-too-big error, turned around. The quoted header's
/// extension headers are not walked: the quote must start with TCP or UDP.
#[inline(always)]
fn icmpv6_inner(
    ctx: &XdpContext,
    l4: usize,
    end: usize,
    to: &[u8; 16],
    f: &mut FlowKey,
) -> Result<(), Reason> {
    let icmp: *const [u8; ICMP_HDR_LEN] = ptr_at(ctx, l4).ok_or(Reason::MalformedPass)?;
    if unsafe { (*icmp)[0] } != ICMPV6_PKT_TOOBIG {
        return Err(Reason::NoService);
    }
    let inner_l3 = l4 + ICMP_HDR_LEN;
    let ip: *const Ipv6Hdr = ptr_at(ctx, inner_l3).ok_or(Reason::MalformedPass)?;
    let ip = unsafe { &*ip };
    if ip.vcf[0] >> 4 != 6 {
        return Err(Reason::MalformedPass);
    }
    // As for IPv4: the error must be addressed to the quoted source, the virtual IP.
    if ip.next_hdr != PROTO_TCP && ip.next_hdr != PROTO_UDP || !same_addr(&ip.src_addr, to) {
        return Err(Reason::NoService);
    }
    let (sport, dport, _) = ports(ctx, inner_l3 + Ipv6Hdr::LEN, ICMP_QUOTED_DATA, end)?;
    set_flow(
        f,
        v6_addr(&ip.dst_addr),
        v6_addr(&ip.src_addr),
        dport,
        sport,
        ip.next_hdr,
        FAMILY_V6,
    );
    Ok(())
}

/// Whether two IPv6 addresses are equal (word by word: `==` on arrays may become a `bcmp` call,
/// which BPF has not).
#[inline(always)]
fn same_addr(a: &[u8; 16], b: &[u8; 16]) -> bool {
    let [a0, a1, a2, a3] = crate::forward::words(a);
    let [b0, b1, b2, b3] = crate::forward::words(b);
    (a0 ^ b0) | (a1 ^ b1) | (a2 ^ b2) | (a3 ^ b3) == 0
}
