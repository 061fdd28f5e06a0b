//! `forward: ipip`: direct server return to a backend on another subnet, by IP-in-IP
//! encapsulation (IPv4 in IPv4, RFC 2003; IPv6 in IPv6, RFC 2473; decision 0013).
//!
//! The frame keeps its Ethernet header (and VLAN tags); an outer IP header of the inner
//! packet's family is put in front of the inner packet, which is left byte for byte as it
//! came. The outer header: destination the backend, source from the service's range by a hash
//! of the 5-tuple (so a flow keeps one source and flows spread over the range, for receive-side
//! scaling on the backends), TTL / hop limit and TOS / traffic class (DSCP and ECN, RFC 6040's
//! normal mode) copied from the inner header, an IPv6 flow label copied from the inner one,
//! and IPv4's DF set: the outer is never fragmented. A packet that would exceed the egress
//! interface's MTU (`NextHop.mtu`, which the agent reads with the next hop and follows) once
//! encapsulated is not sent: an ICMP
//! fragmentation-needed (RFC 1191) or `ICMPv6` packet-too-big (RFC 4443 §3.2) goes back to the
//! client from the virtual IP instead, quoting the packet, with the MTU left for the inner
//! packet.

use aya_ebpf::{
    helpers::generated::{bpf_csum_diff, bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use router_common::{
    FAMILY_V4, FlowKey, NH_F_RESOLVED, Reason, encap_source, hash::encap_hash, next_hop_index,
};

use crate::{
    forward,
    maps::{BACKENDS, FRAGMENTS, IPIP_TX, NEXT_HOPS, SCRATCH, SERVICE_SLOTS},
    parse::{Packet, frag, ptr_at},
};

/// IPv4 and IPv6 header lengths (the outer header, and the ICMP error's).
const V4_HDR: usize = 20;
const V6_HDR: usize = 40;
/// IP protocol numbers of the ICMP errors.
const PROTO_ICMP: u16 = 1;
const PROTO_ICMPV6: u16 = 58;
/// IPv4 "don't fragment".
const DF: u16 = 0x4000;
/// TTL / hop limit of the ICMP errors the program sends.
const ICMP_TTL: u16 = 64;
/// ICMP header length.
const ICMP_HDR: usize = 8;
/// Bytes of the packet an ICMP error quotes: as many as keep the error within 576 bytes
/// (IPv4, RFC 1812 §4.3.2.3) or 1280 (IPv6, RFC 4443 §2.4 (c)).
const QUOTE_V4: usize = 576 - V4_HDR - ICMP_HDR;
const QUOTE_V6: usize = 1280 - V6_HDR - ICMP_HDR;
/// Bytes the Ethernet addresses take; what follows them up to the IP header (the `EtherType`,
/// VLAN tags) moves with the IP header.
const MACS: usize = 12;
/// The `EtherType` and up to two VLAN tags, in 16-bit words.
const MAX_L2_WORDS: usize = 5;
/// Checksum chunk (`bpf_csum_diff` takes at most 512 bytes).
const CHUNK: usize = 256;
// The ICMP errors' checksummed bytes: whole chunks, then the tails `icmp_v4`/`icmp_v6` name.
const _: () = assert!((ICMP_HDR + QUOTE_V4) % CHUNK == 44);
const _: () = assert!((ICMP_HDR + QUOTE_V6) % CHUNK == 216);

/// Folds a 32-bit one's-complement sum into 16 bits.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "after two folds the sum fits in 16 bits"
)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// A header written in place: 16-bit words of the frame, checked once by [`Words::at`]. The
/// headers are built in the frame itself, word by word, not on the stack: the entry's
/// 512-byte stack has no room for them.
struct Words(*mut u16);

impl Words {
    /// The `N` words at byte `off` of the frame.
    #[inline(always)]
    fn at<const N: usize>(ctx: &XdpContext, off: usize) -> Result<Self, Reason> {
        let p: *mut [u16; N] = ptr_at(ctx, off).ok_or(Reason::MalformedDrop)?;
        Ok(Self(p.cast()))
    }

    /// Stores `v` (memory order) as word `i`, which must be below the `N` checked.
    /// Volatile: one store per word, never merged into a byte-wise `memcpy` call.
    #[inline(always)]
    fn set(&self, i: usize, v: u16) {
        // SAFETY: `i` < N, checked by `at` (every caller passes a constant index).
        unsafe { core::ptr::write_volatile(self.0.add(i), v) };
    }

    /// Word `i` (memory order).
    #[inline(always)]
    fn get(&self, i: usize) -> u16 {
        // SAFETY: as for `set`.
        unsafe { core::ptr::read_volatile(self.0.add(i)) }
    }

    /// Writes the first `n` words of address `a` from word `i` on.
    #[inline(always)]
    fn addr(&self, i: usize, a: &[u8; 16], n: usize) {
        let mut k = 0;
        while k < n && k < 8 {
            self.set(i + k, u16::from_ne_bytes([a[2 * k], a[2 * k + 1]]));
            k += 1;
        }
    }

    /// The one's-complement sum of words `from..to`.
    #[inline(always)]
    fn sum(&self, from: usize, to: usize) -> u32 {
        let mut sum = 0u32;
        let mut i = from;
        while i < to {
            sum += u32::from(self.get(i));
            i += 1;
        }
        sum
    }
}

/// Moves what lies between the MAC addresses and the IP header at `l3` (the `EtherType` and any
/// VLAN tags) from `shift` bytes further on to its place, after the frame grew by `shift`
/// bytes at its head. The MACs are not moved: the caller writes them.
#[inline(always)]
fn pull_l2(ctx: &XdpContext, l3: usize, shift: usize) -> Result<(), Reason> {
    let mut off = MACS;
    for _ in 0..MAX_L2_WORDS {
        if off >= l3 {
            break;
        }
        let from: *const u16 = ptr_at(ctx, off + shift).ok_or(Reason::MalformedDrop)?;
        let to: *mut u16 = ptr_at(ctx, off).ok_or(Reason::MalformedDrop)?;
        unsafe { *to = *from };
        off += 2;
    }
    Ok(())
}

/// Grows the frame by `by` bytes at its head.
#[inline(always)]
#[expect(
    clippy::cast_possible_wrap,
    clippy::cast_possible_truncation,
    reason = "`by` is a header length (at most 48)"
)]
fn grow_head(ctx: &XdpContext, by: usize) -> Result<(), Reason> {
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(by as i32)) } != 0 {
        return Err(Reason::MalformedDrop);
    }
    Ok(())
}

/// What [`defer`] and [`hand_over`] record for [`send`], in the per-CPU scratch map.
#[repr(C)]
pub struct Encap {
    /// Backend slot.
    backend: u32,
    /// `NEXT_HOPS` index of the backend's live next hop.
    hop: u32,
    /// The `Reason` the classification gave (`NewFlow`, `ConntrackHit`, …).
    reason: u32,
    /// Service slot.
    service: u32,
    /// The outer source, once [`send`] has chosen it.
    src: [u8; 16],
}

/// Stands for the action of an ipip packet until `switchyard_ipip` has encapsulated it: not
/// an XDP action.
pub const DEFERRED: u32 = 0x100;

/// Records that the packet goes to backend slot `slot`, whose live next hop is half `half`,
/// and answers [`DEFERRED`]: the entry then hands the packet over ([`hand_over`]).
///
/// Why another program: the classification's stack frame is close to the 512 bytes BPF
/// allows, and building the outer header (or an ICMP error) needs room of its own — inlined
/// it exceeds the limit, and a BPF-to-BPF call's frame would add to the classification's. A
/// tail call starts `switchyard_ipip` with a fresh stack.
#[inline(always)]
pub fn defer(pkt: &Packet, slot: u32, half: u32) -> u32 {
    let e = (&raw const pkt.encap).cast_mut();
    // SAFETY: the per-CPU scratch (decision 0002): nothing else touches it while this program
    // runs on this CPU.
    unsafe {
        core::ptr::write_volatile(&raw mut (*e).backend, slot);
        core::ptr::write_volatile(&raw mut (*e).hop, next_hop_index(slot, half));
    }
    DEFERRED
}

/// Records the classification's outcome and tail-calls `switchyard_ipip`, which encapsulates,
/// sends and counts the packet. Returns only when that program is missing (`IPIP_TX` empty).
#[inline(always)]
pub fn hand_over(ctx: &XdpContext, reason: Reason, service: u32, backend: u32) {
    let Some(e) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `defer`.
    unsafe {
        let e = &raw mut (*e).encap;
        core::ptr::write_volatile(&raw mut (*e).reason, reason as u32);
        core::ptr::write_volatile(&raw mut (*e).service, service);
        core::ptr::write_volatile(&raw mut (*e).backend, backend);
        IPIP_TX.tail_call(ctx, 0);
    }
}

/// The `Reason` [`hand_over`] recorded (those a forwarded packet carries).
#[inline(always)]
fn recorded(code: u32) -> Reason {
    match code {
        c if c == Reason::ConntrackHit as u32 => Reason::ConntrackHit,
        c if c == Reason::Reselected as u32 => Reason::Reselected,
        c if c == Reason::FallbackPool as u32 => Reason::FallbackPool,
        c if c == Reason::SecondChance as u32 => Reason::SecondChance,
        c if c == Reason::Fragment as u32 => Reason::Fragment,
        c if c == Reason::IcmpForwarded as u32 => Reason::IcmpForwarded,
        _ => Reason::NewFlow,
    }
}

/// `switchyard_ipip`'s work: encapsulates and sends the packet the classification handed over.
/// The next hop is the live half of the backend slot's `NEXT_HOPS` pair, as for `dsr-l2`.
/// `Ok((action, reason, service, backend))` when it leaves; `Err((reason, service))` when not:
/// `NoNextHop`, `NoTxPort`, `MalformedDrop`, `BadState`, `TooBig` (an ICMP error was sent back
/// instead: the frame is that error, to leave by `XDP_TX`), `TooBigDrop` (the packet does
/// not fit and gets no error).
#[inline(always)]
pub fn send(ctx: &XdpContext) -> Result<(u32, Reason, u32, u32), (Reason, u32)> {
    let Some(pkt) = SCRATCH.get_ptr_mut(0) else {
        return Err((Reason::BadState, u32::MAX));
    };
    // SAFETY: the per-CPU scratch, as the classification left it.
    let pkt = unsafe { &mut *pkt };
    let service = pkt.encap.service;
    let backend = pkt.encap.backend;
    let reason = recorded(pkt.encap.reason);
    match encapsulate(ctx, pkt) {
        Ok(action) => Ok((action, reason, service, backend)),
        Err(r) => Err((r, service)),
    }
}

/// Chooses the outer source into `pkt.encap.src`: from the service's range by the flow hash;
/// a later fragment takes the one its first fragment got (kept in its `FRAGMENTS` entry), so
/// every fragment of a datagram leaves with one source.
#[inline(always)]
fn choose_source(pkt: &mut Packet) -> Result<(), Reason> {
    if pkt.frag == frag::LATER {
        let entry = FRAGMENTS
            .get_ptr(crate::frag_key(pkt))
            .ok_or(Reason::BadState)?;
        pkt.encap.src = unsafe { (*entry).vip };
        return Ok(());
    }
    // The slot the classification chose the service by (a tracked flow's, or its `SERVICES`
    // entry's): an array read, not another hash lookup.
    let svc = &SERVICE_SLOTS
        .get(pkt.encap.service)
        .ok_or(Reason::BadState)?
        .service;
    let src = encap_source(
        svc.encap_src,
        svc.encap_mask,
        encap_hash(crate::select::key_words(&pkt.flow)),
        pkt.flow.family != FAMILY_V4,
    );
    pkt.encap.src = src;
    if pkt.frag == frag::FIRST
        && let Some(entry) = FRAGMENTS.get_ptr_mut(crate::frag_key(pkt))
    {
        unsafe { (*entry).vip = src };
    }
    Ok(())
}

#[inline(always)]
fn encapsulate(ctx: &XdpContext, pkt: &mut Packet) -> Result<u32, Reason> {
    choose_source(pkt)?;
    let pkt = &*pkt;
    let src = &pkt.encap.src;
    let dst = &BACKENDS
        .get(pkt.encap.backend)
        .ok_or(Reason::BadState)?
        .addr;
    let hop = pkt.encap.hop;
    let Some(hop) = NEXT_HOPS.get_ptr(hop) else {
        return Err(Reason::NoNextHop);
    };
    // SAFETY: a map value; the agent rewrites only the slot's other half (decision 0009).
    let hop = unsafe { &*hop };
    if hop.flags & NH_F_RESOLVED == 0 {
        return Err(Reason::NoNextHop);
    }
    let l3 = pkt.l3();
    let v4 = pkt.flow.family == FAMILY_V4;
    // The inner header's first eight bytes: IPv4 version/IHL and TOS, total length, …, TTL
    // (the ninth byte); IPv6 version/traffic class/flow label, payload length, next header and
    // hop limit.
    let inner = Words::at::<5>(ctx, l3)?;
    let (len, hdr) = if v4 {
        (usize::from(u16::from_be(inner.get(1))), V4_HDR)
    } else {
        (usize::from(u16::from_be(inner.get(2))) + V6_HDR, V6_HDR)
    };
    let first = inner.get(0);
    let second = inner.get(1);
    // IPv4: the TTL (the ninth byte); IPv6: the hop limit (the eighth).
    let ttl = if v4 {
        inner.get(4).to_ne_bytes()[0]
    } else {
        inner.get(3).to_ne_bytes()[1]
    };
    // The egress MTU as the agent last read it (`NextHop.mtu`): no helper call per packet.
    let mtu = hop.mtu;
    if len + hdr > mtu as usize {
        // An ICMP error gets no error (RFC 1122 §3.2.2).
        if pkt.is_icmp() {
            return Err(Reason::TooBigDrop);
        }
        let outer: u32 = if v4 { 20 } else { 40 };
        return Err(too_big(ctx, pkt, l3, len, mtu.saturating_sub(outer)));
    }
    grow_head(ctx, hdr)?;
    pull_l2(ctx, l3, hdr)?;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the parser checked the datagram against the frame: its length fits 16 bits \
                  with the outer header (an Ethernet frame is far shorter)"
    )]
    let total = (len + hdr) as u16;
    if v4 {
        let h = Words::at::<10>(ctx, l3)?;
        // Version 4, IHL 5, the inner TOS (the second byte in memory order).
        h.set(0, u16::from_ne_bytes([0x45, first.to_ne_bytes()[1]]));
        h.set(1, total.to_be());
        h.set(2, 0);
        h.set(3, DF.to_be());
        h.set(4, u16::from_ne_bytes([ttl, 4]));
        h.set(5, 0);
        h.addr(6, src, 2);
        h.addr(8, dst, 2);
        h.set(5, !fold(h.sum(0, 10)));
    } else {
        let h = Words::at::<20>(ctx, l3)?;
        // Version, traffic class and flow label copied from the inner header.
        h.set(0, first);
        h.set(1, second);
        h.set(2, (total - 40).to_be());
        h.set(3, u16::from_ne_bytes([41, ttl]));
        h.addr(4, src, 8);
        h.addr(12, dst, 8);
    }
    forward::emit(ctx, hop.ifindex, forward::macs(&hop.macs))
}

/// Adds the one's-complement sum of `chunks` chunks of [`CHUNK`] bytes and then `TAIL` bytes
/// at `off` to `sum` (`bpf_csum_diff`, which reads packet memory the verifier checked).
#[inline(always)]
fn sum_packet<const TAIL: usize>(
    ctx: &XdpContext,
    off: usize,
    chunks: usize,
    mut sum: u32,
) -> Result<u32, Reason> {
    let mut at = off;
    for _ in 0..chunks {
        let p: *mut [u8; CHUNK] = ptr_at(ctx, at).ok_or(Reason::MalformedDrop)?;
        #[expect(clippy::cast_possible_truncation, reason = "CHUNK is 256")]
        let s = unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, p.cast(), CHUNK as u32, sum) };
        sum = u32::try_from(s).map_err(|_| Reason::MalformedDrop)?;
        at += CHUNK;
    }
    let p: *mut [u8; TAIL] = ptr_at(ctx, at).ok_or(Reason::MalformedDrop)?;
    #[expect(clippy::cast_possible_truncation, reason = "TAIL is below 256")]
    let s = unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, p.cast(), TAIL as u32, sum) };
    u32::try_from(s).map_err(|_| Reason::MalformedDrop)
}

/// Turns the frame (a packet of `len` bytes at `l3` that does not fit an egress MTU leaving
/// `mtu` bytes for it) into an ICMP fragmentation-needed / `ICMPv6` packet-too-big from the
/// packet's destination (the virtual IP) to its source, quoting its first [`QUOTE_V4`] /
/// [`QUOTE_V6`] bytes, addressed back to the MAC it came from, to leave by `XDP_TX`. Returns
/// `TooBig` when the error is ready, `TooBigDrop` when none could be built (a packet shorter
/// than the quote: an egress MTU below 568 / 1280 bytes), or `MalformedDrop` when it failed
/// half-way.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "lengths of one frame, well inside 16 bits"
)]
fn too_big(ctx: &XdpContext, pkt: &Packet, l3: usize, len: usize, mtu: u32) -> Reason {
    let v4 = pkt.flow.family == FAMILY_V4;
    let (hdr, quote) = if v4 {
        (V4_HDR, QUOTE_V4)
    } else {
        (V6_HDR, QUOTE_V6)
    };
    let frame = ctx.data_end() - ctx.data();
    if len < quote || frame < l3 + quote {
        return Reason::TooBigDrop;
    }
    let grow = hdr + ICMP_HDR;
    let built = (|| -> Result<(), Reason> {
        grow_head(ctx, grow)?;
        // Back to where it came from: the old source MAC becomes the destination, and the old
        // destination (this interface's) the source.
        let old = Words::at::<6>(ctx, grow)?;
        let eth = Words::at::<6>(ctx, 0)?;
        for i in 0..3 {
            eth.set(i, old.get(i + 3));
            eth.set(i + 3, old.get(i));
        }
        pull_l2(ctx, l3, grow)?;
        // Keep the Ethernet header, the new headers and the quote; the rest goes.
        let excess = (frame - l3 - quote) as i32;
        if excess > 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, -excess) } != 0 {
            return Err(Reason::MalformedDrop);
        }
        let error_len = (ICMP_HDR + quote) as u16;
        if v4 {
            icmp_v4(ctx, &pkt.flow, l3, error_len, mtu)
        } else {
            icmp_v6(ctx, &pkt.flow, l3, error_len, mtu)
        }
    })();
    match built {
        Ok(()) => Reason::TooBig,
        Err(r) => r,
    }
}

/// Writes the IPv4 and ICMP headers of a fragmentation-needed error for `flow` at `l3`; the
/// quote follows them.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "an MTU of an Ethernet interface fits 16 bits"
)]
fn icmp_v4(
    ctx: &XdpContext,
    flow: &FlowKey,
    l3: usize,
    error_len: u16,
    mtu: u32,
) -> Result<(), Reason> {
    let ip = Words::at::<10>(ctx, l3)?;
    ip.set(0, 0x4500u16.to_be());
    ip.set(1, (error_len + 20).to_be());
    ip.set(2, 0);
    ip.set(3, 0);
    ip.set(4, ((ICMP_TTL << 8) | PROTO_ICMP).to_be());
    ip.set(5, 0);
    ip.addr(6, &flow.dst, 2);
    ip.addr(8, &flow.src, 2);
    ip.set(5, !fold(ip.sum(0, 10)));
    // Type 3 (destination unreachable), code 4 (fragmentation needed), checksum, unused, the
    // next-hop MTU (RFC 1191).
    let at = l3 + V4_HDR;
    let icmp = Words::at::<4>(ctx, at)?;
    icmp.set(0, 0x0304u16.to_be());
    icmp.set(1, 0);
    icmp.set(2, 0);
    icmp.set(3, (mtu as u16).to_be());
    let sum = sum_packet::<44>(ctx, at, (ICMP_HDR + QUOTE_V4) / CHUNK, 0)?;
    let icmp = Words::at::<4>(ctx, at)?;
    icmp.set(1, !fold(sum));
    Ok(())
}

/// Writes the IPv6 and `ICMPv6` headers of a packet-too-big error for `flow` at `l3`; the
/// quote follows them.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the two halves of the 32-bit MTU"
)]
fn icmp_v6(
    ctx: &XdpContext,
    flow: &FlowKey,
    l3: usize,
    error_len: u16,
    mtu: u32,
) -> Result<(), Reason> {
    let ip = Words::at::<20>(ctx, l3)?;
    ip.set(0, 0x6000u16.to_be());
    ip.set(1, 0);
    ip.set(2, error_len.to_be());
    ip.set(3, ((PROTO_ICMPV6 << 8) | ICMP_TTL).to_be());
    ip.addr(4, &flow.dst, 8);
    ip.addr(12, &flow.src, 8);
    // The pseudo-header (RFC 8200 §8.1): addresses, upper-layer length, next header.
    let pseudo = ip.sum(4, 20) + u32::from(error_len.to_be()) + u32::from(PROTO_ICMPV6.to_be());
    // Type 2 (packet too big), code 0, checksum, the MTU (RFC 4443 §3.2).
    let at = l3 + V6_HDR;
    let icmp = Words::at::<4>(ctx, at)?;
    icmp.set(0, 0x0200u16.to_be());
    icmp.set(1, 0);
    icmp.set(2, ((mtu >> 16) as u16).to_be());
    icmp.set(3, (mtu as u16).to_be());
    let sum = sum_packet::<216>(ctx, at, (ICMP_HDR + QUOTE_V6) / CHUNK, pseudo)?;
    let icmp = Words::at::<4>(ctx, at)?;
    icmp.set(1, !fold(sum));
    Ok(())
}
