//! Forwarding: NAT rewrites, the next hop from `bpf_fib_lookup`, and the exit through `XDP_TX`
//! (same interface) or `XDP_REDIRECT` (another interface in `TX_PORTS`).
//!
//! `bpf_fib_lookup` is GPL-only: the program's licence section is "GPL" (see main.rs). It needs
//! kernel 4.18; `DevMapHash` needs 5.4.

use core::mem::size_of;

use aya_ebpf::{
    EbpfContext as _,
    bindings::{bpf_fib_lookup as FibParams, xdp_action},
    helpers::generated::bpf_fib_lookup,
    programs::XdpContext,
};
use network_types::eth::EthHdr;
use router_common::{FAMILY_V4, PROTO_TCP, PROTO_UDP, Reason};

use crate::{
    csum,
    maps::TX_PORTS,
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
fn words(a: &[u8; 16]) -> [u32; 4] {
    [
        u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
        u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
        u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
        u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
    ]
}

/// Sends the packet towards `next_hop` (a backend, or the client for a NAT reply): sets the
/// Ethernet addresses of the route's next hop, then `XDP_TX` or `XDP_REDIRECT`. Errors:
/// `NoRoute` (no route or no neighbour entry), `NoTxPort`.
#[inline(always)]
pub fn send(ctx: &XdpContext, pkt: &Packet, next_hop: &[u8; 16]) -> Result<u32, Reason> {
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.l4_protocol = pkt.flow.proto;
    p.ifindex = ctx.ingress_ifindex() as u32;
    if pkt.flow.family == FAMILY_V4 {
        p.family = AF_INET;
        p.__bindgen_anon_3.ipv4_src = words(&pkt.flow.src)[0];
        p.__bindgen_anon_4.ipv4_dst = words(next_hop)[0];
    } else {
        p.family = AF_INET6;
        p.__bindgen_anon_3.ipv6_src = words(&pkt.flow.src);
        p.__bindgen_anon_4.ipv6_dst = words(next_hop);
    }
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), &mut p, size_of::<FibParams>() as i32, 0) };
    if rc != BPF_FIB_LKUP_RET_SUCCESS {
        return Err(Reason::NoRoute);
    }
    let eth: *mut EthHdr = ptr_at(ctx, 0).ok_or(Reason::MalformedDrop)?;
    unsafe {
        (*eth).dst_addr = p.dmac;
        (*eth).src_addr = p.smac;
    }
    if p.ifindex == ctx.ingress_ifindex() as u32 {
        return Ok(xdp_action::XDP_TX);
    }
    TX_PORTS
        .redirect(p.ifindex, 0)
        .map_err(|_| Reason::NoTxPort)
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
