//! Forwarding: NAT rewrites, the next hop from `bpf_fib_lookup`, and the exit through `XDP_TX`
//! (same interface) or `XDP_REDIRECT` (another interface in `TX_PORTS`).
//!
//! `bpf_fib_lookup` is GPL-only: the program's licence section is "GPL" (see main.rs). It needs
//! kernel 4.18; `DevMapHash` needs 5.4.

use core::mem::size_of;

use aya_ebpf::{
    EbpfContext as _,
    bindings::{bpf_fib_lookup as FibParams, xdp_action},
    helpers::{bpf_ktime_get_ns, generated::bpf_fib_lookup},
    programs::XdpContext,
};
use router_common::{FAMILY_V4, NO_BACKEND, PROTO_TCP, PROTO_UDP, Reason};

use crate::{
    csum,
    maps::{NEXTHOP, TX_PORTS},
    parse::{Packet, frag, ptr_at},
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;

/// Offsets inside the IP headers.
const V4_CHECK: usize = 10;
const V4_SRC: usize = 12;
const V4_DST: usize = 16;
const V6_SRC: usize = 8;
const V6_DST: usize = 24;
/// Offsets of the checksum inside the L4 headers.
const TCP_CHECK: usize = 16;
const UDP_CHECK: usize = 6;

#[inline(always)]
pub(crate) fn words(a: &[u8; 16]) -> [u32; 4] {
    [
        u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
        u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
        u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
        u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
    ]
}

/// How long a cached next hop ([`NextHop`]) is used before `bpf_fib_lookup` is asked again:
/// route and neighbour changes reach forwarded packets within this time.
pub const NEXTHOP_TTL_NS: u64 = 1_000_000_000;

/// A backend's next hop as `bpf_fib_lookup` last gave it, cached per CPU and backend slot in
/// `NEXTHOP` (see maps.rs). Valid while `expires_ns` is ahead of `bpf_ktime_get_ns()` and the
/// packet is forwarded for the same backend address and family from the same ingress
/// interface (the lookup's inputs, except the source address: see docs/performance.md).
#[repr(C)]
pub struct NextHop {
    /// The backend address the lookup was for, as four words.
    pub addr: [u32; 4],
    /// `bpf_ktime_get_ns()` after which the entry is stale; 0 for an empty entry.
    pub expires_ns: u64,
    /// Interface the looked-up packet arrived on.
    pub ingress: u32,
    /// Interface the route leaves by.
    pub egress: u32,
    /// Address family of the lookup (`FAMILY_V4` / `FAMILY_V6`), widened.
    pub family: u32,
    /// Destination then source MAC: the first 12 bytes of the Ethernet header, as six words.
    pub macs: [u16; 6],
}

/// Looks up the next hop towards `next_hop` with `bpf_fib_lookup`: `(egress ifindex, MACs)`,
/// or `NoRoute` (no route or no neighbour entry).
#[inline(always)]
fn fib_lookup(
    ctx: &XdpContext,
    pkt: &Packet,
    next_hop: &[u32; 4],
    ingress: u32,
) -> Result<(u32, [u16; 6]), Reason> {
    // Zeroed as eight 64-bit stores. `mem::zeroed()` (or `[0u64; 8]`) becomes a call to the
    // BPF target's byte-at-a-time `memset`, 64 rounds of its loop; volatile stores are not
    // merged back into one.
    let mut raw = core::mem::MaybeUninit::<[u64; size_of::<FibParams>() / 8]>::uninit();
    let words64 = raw.as_mut_ptr() as *mut u64;
    let mut i = 0;
    while i < size_of::<FibParams>() / 8 {
        // SAFETY: `i` stays inside `raw`.
        unsafe { core::ptr::write_volatile(words64.add(i), 0) };
        i += 1;
    }
    // SAFETY: `raw` is as large as `FibParams`, more strictly aligned, and all zero, which is a
    // valid `FibParams`.
    let p = unsafe { &mut *(raw.as_mut_ptr() as *mut FibParams) };
    p.l4_protocol = pkt.flow.proto;
    p.ifindex = ingress;
    let src = words(&pkt.flow.src);
    if pkt.flow.family == FAMILY_V4 {
        p.family = AF_INET;
        p.__bindgen_anon_3.ipv4_src = src[0];
        p.__bindgen_anon_4.ipv4_dst = next_hop[0];
    } else {
        p.family = AF_INET6;
        p.__bindgen_anon_3.ipv6_src = src;
        p.__bindgen_anon_4.ipv6_dst = *next_hop;
    }
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), p, size_of::<FibParams>() as i32, 0) };
    if rc != BPF_FIB_LKUP_RET_SUCCESS {
        return Err(Reason::NoRoute);
    }
    let (d, s) = (p.dmac, p.smac);
    let macs = [
        u16::from_ne_bytes([d[0], d[1]]),
        u16::from_ne_bytes([d[2], d[3]]),
        u16::from_ne_bytes([d[4], d[5]]),
        u16::from_ne_bytes([s[0], s[1]]),
        u16::from_ne_bytes([s[2], s[3]]),
        u16::from_ne_bytes([s[4], s[5]]),
    ];
    Ok((p.ifindex, macs))
}

/// The next hop towards backend slot `slot` at `addr`: from `NEXTHOP` if this CPU looked it up
/// less than [`NEXTHOP_TTL_NS`] ago for the same address, family and ingress interface, else
/// from [`fib_lookup`], whose success is cached. A failure is not cached: the next packet asks
/// again, and gets the same drop reason as before the cache existed.
#[inline(always)]
fn backend_next_hop(
    ctx: &XdpContext,
    pkt: &Packet,
    slot: u32,
    addr: &[u32; 4],
    ingress: u32,
) -> Result<(u32, [u16; 6]), Reason> {
    let Some(entry) = NEXTHOP.get_ptr_mut(slot) else {
        return fib_lookup(ctx, pkt, addr, ingress);
    };
    // Per-CPU slot: no other writer while this program runs on this CPU.
    let entry = unsafe { &mut *entry };
    let now = unsafe { bpf_ktime_get_ns() };
    let family = pkt.flow.family as u32;
    let same = (entry.addr[0] ^ addr[0])
        | (entry.addr[1] ^ addr[1])
        | (entry.addr[2] ^ addr[2])
        | (entry.addr[3] ^ addr[3])
        | (entry.family ^ family)
        | (entry.ingress ^ ingress);
    if same == 0 && now < entry.expires_ns {
        return Ok((entry.egress, entry.macs));
    }
    let (egress, macs) = fib_lookup(ctx, pkt, addr, ingress)?;
    entry.addr = *addr;
    entry.family = family;
    entry.ingress = ingress;
    entry.egress = egress;
    entry.macs = macs;
    entry.expires_ns = now.wrapping_add(NEXTHOP_TTL_NS);
    Ok((egress, macs))
}

/// Sends the packet towards `next_hop` (a backend, or the client for a NAT reply): sets the
/// Ethernet addresses of the route's next hop, then `XDP_TX` or `XDP_REDIRECT`. `slot` is the
/// backend slot of `next_hop`, whose next hop is cached in `NEXTHOP`, or `NO_BACKEND` (a NAT
/// reply: its next hop, the client, is looked up every time). Errors: `NoRoute` (no route or
/// no neighbour entry), `NoTxPort`.
#[inline(always)]
pub fn send(ctx: &XdpContext, pkt: &Packet, next_hop: &[u8; 16], slot: u32) -> Result<u32, Reason> {
    let ingress = ctx.ingress_ifindex() as u32;
    let addr = words(next_hop);
    let (egress, macs) = if slot == NO_BACKEND {
        fib_lookup(ctx, pkt, &addr, ingress)?
    } else {
        backend_next_hop(ctx, pkt, slot, &addr, ingress)?
    };
    let eth: *mut [u16; 6] = ptr_at(ctx, 0).ok_or(Reason::MalformedDrop)?;
    unsafe { *eth = macs };
    if egress == ingress {
        return Ok(xdp_action::XDP_TX);
    }
    TX_PORTS.redirect(egress, 0).map_err(|_| Reason::NoTxPort)
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
