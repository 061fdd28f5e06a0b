//! Forwarding: NAT rewrites, and the exit through `XDP_TX` (same interface) or `XDP_REDIRECT`
//! (another interface in `TX_PORTS`) towards a next hop the program never looks up itself: a
//! backend's comes from `NEXT_HOPS` (resolved by the agent over netlink), a NAT reply's from
//! its `NAT_REVERSE` entry (the way its request came in).
//!
//! `DevMapHash` needs kernel 5.4.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use router_common::{FAMILY_V4, NH_F_RESOLVED, PROTO_TCP, PROTO_UDP, Reason, next_hop_index};

use crate::{
    csum,
    maps::{NEXT_HOPS, TX_PORTS},
    parse::{Packet, frag, ptr_at},
};

/// Offsets inside the IP headers.
const V4_CHECK: usize = 10;
const V4_SRC: usize = 12;
const V4_DST: usize = 16;
const V6_SRC: usize = 8;
const V6_DST: usize = 24;
/// Offsets of the checksum inside the L4 headers.
const TCP_CHECK: usize = 16;
const UDP_CHECK: usize = 6;

/// The first 12 bytes of an Ethernet header (destination then source MAC) as six 16-bit
/// words: map values and the frame are at least 2-byte aligned there, so the copy is six loads
/// and stores rather than twelve.
pub type Macs = [u16; 6];

/// An address as four 32-bit words (for branch-free comparisons).
#[inline(always)]
pub(crate) fn words(a: &[u8; 16]) -> [u32; 4] {
    [
        u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
        u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
        u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
        u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
    ]
}

/// Reads the 12 MAC bytes of a map value as [`Macs`]. `bytes` must be 2-byte aligned, which
/// the `macs` fields of `NextHop`, `NatEntry` and `FragEntry` are (offsets 8, 24 and 32 of
/// 4-aligned values).
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "callers pass the `macs` field of a map value, which is 2-byte aligned (see above)"
)]
pub fn macs(bytes: &[u8; 12]) -> Macs {
    // SAFETY: 12 readable bytes, 2-byte aligned (see above).
    unsafe { core::ptr::read(bytes.as_ptr().cast::<Macs>()) }
}

/// Sends the frame to backend slot `slot`, whose entry names the live half `half` of its
/// `NEXT_HOPS` pair: that entry gives the egress interface and the MACs. Errors: `NoNextHop`
/// (no resolved entry), `NoTxPort`, `MalformedDrop`.
#[inline(always)]
pub fn to_backend(ctx: &XdpContext, slot: u32, half: u32) -> Result<u32, Reason> {
    let Some(hop) = NEXT_HOPS.get(next_hop_index(slot, half)) else {
        return Err(Reason::NoNextHop);
    };
    if hop.flags & NH_F_RESOLVED == 0 {
        return Err(Reason::NoNextHop);
    }
    emit(ctx, hop.ifindex, macs(&hop.macs))
}

/// Writes `macs` as the frame's Ethernet addresses and sends it out of `egress`: `XDP_TX` when
/// that is the interface it arrived on, else `XDP_REDIRECT` through `TX_PORTS` (`NoTxPort` when
/// the interface is not there).
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "`ingress_ifindex` widens the `u32` field of `xdp_md` to `usize`: the cast gives it back"
)]
pub fn emit(ctx: &XdpContext, egress: u32, macs: Macs) -> Result<u32, Reason> {
    let eth: *mut Macs = ptr_at(ctx, 0).ok_or(Reason::MalformedDrop)?;
    let eth = eth.cast::<u16>();
    // Six volatile 16-bit stores: a plain assignment from map memory to the packet became a
    // call to the BPF target's byte-at-a-time `memmove` (LLVM cannot prove they do not overlap).
    for (i, w) in macs.into_iter().enumerate() {
        // SAFETY: `ptr_at` checked that the 12 bytes are inside the frame; `i` < 6.
        unsafe { core::ptr::write_volatile(eth.add(i), w) };
    }
    if egress == ctx.ingress_ifindex() as u32 {
        return Ok(xdp_action::XDP_TX);
    }
    TX_PORTS.redirect(egress, 0).map_err(|_| Reason::NoTxPort)
}

/// The MACs of the frame being processed, turned around (its source as destination, its
/// destination as source): the Ethernet header of a reply sent back the way it came, as the
/// bytes a map value holds.
#[inline(always)]
pub fn reversed_macs(ctx: &XdpContext) -> Result<[u8; 12], Reason> {
    let eth: *const Macs = ptr_at(ctx, 0).ok_or(Reason::MalformedDrop)?;
    let e = unsafe { *eth };
    let turned: Macs = [e[3], e[4], e[5], e[0], e[1], e[2]];
    // SAFETY: six u16 are twelve bytes, and every bit pattern is a valid `[u8; 12]`.
    Ok(unsafe { core::mem::transmute::<Macs, [u8; 12]>(turned) })
}

/// Rewrites one address of the IP header (`dst` selects destination or source) to `new`, with
/// the IPv4 header checksum and the TCP/UDP checksum (its pseudo-header covers the addresses)
/// updated incrementally. Later fragments carry no L4 header and only get the IP part.
#[inline(always)]
pub fn rewrite_addr(
    ctx: &XdpContext,
    pkt: &Packet,
    dst: bool,
    new: &[u8; 16],
) -> Result<(), Reason> {
    let l4_check = match pkt.flow.proto {
        _ if pkt.is_icmp() || pkt.frag == frag::LATER => None,
        PROTO_TCP => Some((pkt.l4() + TCP_CHECK, false)),
        PROTO_UDP => Some((pkt.l4() + UDP_CHECK, true)),
        _ => None,
    };
    if pkt.flow.family == FAMILY_V4 {
        let at = pkt.l3() + if dst { V4_DST } else { V4_SRC };
        let addr: *mut [u8; 4] = ptr_at(ctx, at).ok_or(Reason::MalformedDrop)?;
        let check: *mut [u8; 2] = ptr_at(ctx, pkt.l3() + V4_CHECK).ok_or(Reason::MalformedDrop)?;
        let old = unsafe { *addr };
        let new4 = [new[0], new[1], new[2], new[3]];
        if let Some((off, udp)) = l4_check {
            update_l4(ctx, off, udp, &old, &new4)?;
        }
        unsafe {
            *check = csum::replace(*check, &old, &new4);
            *addr = new4;
        }
    } else {
        let at = pkt.l3() + if dst { V6_DST } else { V6_SRC };
        let addr: *mut [u8; 16] = ptr_at(ctx, at).ok_or(Reason::MalformedDrop)?;
        let old = unsafe { *addr };
        if let Some((off, udp)) = l4_check {
            update_l4(ctx, off, udp, &old, new)?;
        }
        unsafe { *addr = *new };
    }
    Ok(())
}

#[inline(always)]
fn update_l4<const N: usize>(
    ctx: &XdpContext,
    off: usize,
    udp: bool,
    old: &[u8; N],
    new: &[u8; N],
) -> Result<(), Reason> {
    let check: *mut [u8; 2] = ptr_at(ctx, off).ok_or(Reason::MalformedDrop)?;
    let cur = unsafe { *check };
    // An IPv4 UDP checksum of zero means "none" (RFC 768); leave it so.
    if udp && cur == [0, 0] {
        return Ok(());
    }
    let mut next = csum::replace(cur, old, new);
    // A computed zero is sent as all ones for UDP (RFC 768, RFC 8200 §8.1).
    if udp && next == [0, 0] {
        next = [0xff, 0xff];
    }
    unsafe { *check = next };
    Ok(())
}
