//! The benchmark baseline: the least an XDP load balancer must do for a frame. It parses
//! Ethernet and the IPv4 or IPv6 header (bounds and version checked), swaps the MAC addresses
//! and returns `XDP_TX`; anything else gets `XDP_PASS`. No maps, no helpers, no lookups.
//!
//! A second program, `lookup`, is the baseline plus one hash-map lookup: the frame's
//! destination address, protocol and family as a `ServiceKey` (ports zero) looked up in an
//! empty hash map, then `XDP_PASS`. It is the yardstick of "one lookup": what a balancer that
//! looks every packet up in its service map (Katran's VIP map) pays for traffic that is not for
//! a service. It comes after `baseline` in the object, which stays the object's first program
//! (the Katran harness runs the first one).
//!
//! A third program, `reset`, is the reset wrapper of the repeated `ipip` rows (the method of
//! the Katran harness in `../shared/bench/katran/`): `BPF_PROG_TEST_RUN` with `repeat` runs a
//! program on one buffer without restoring it, and an encapsulation grows the frame on every
//! run. The wrapper strips the outer IPv4 header a previous run pushed (protocol 4), writes
//! back the bench frames' Ethernet header, and tail-calls the program in `RESET_TARGET[0]`.
//! It does the same work whatever the frame (the head adjustment always runs), so its cost is
//! `(reset → baseline) − baseline`, measured beside it.
//!
//! It is measured next to Switchyard's program under `BPF_PROG_TEST_RUN`
//! (`cargo bench -p router-tests --bench xdp`, docs/performance.md): the ratio of the two says
//! what classification, connection tracking, Maglev selection, the FIB lookup and counting
//! cost on top of touching the packet at all. Not part of the data plane; the agent never loads
//! it.
#![no_std]
#![no_main]
// The `#[xdp]` macro generates the exported entry symbol without a doc comment.
#![allow(missing_docs)]
#![expect(
    clippy::inline_always,
    reason = "measured like the data plane, as one BPF function: its helpers are inlined into the \
              entry"
)]

use core::mem::size_of;

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::{HashMap, ProgramArray},
    helpers::generated::bpf_xdp_adjust_head,
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;

/// A pointer to a `T` at byte `off` of the frame, or `None` if it would cross `data_end`.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, off: usize) -> Option<*mut T> {
    let p = ctx.data() + off;
    if p + size_of::<T>() > ctx.data_end() {
        return None;
    }
    Some(p as *mut T)
}

/// Reflects an IP frame back out of its interface with the MAC addresses swapped.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the `#[xdp]` macro calls the entry with an owned `XdpContext`"
)]
pub fn baseline(ctx: XdpContext) -> u32 {
    reflect(&ctx).unwrap_or(xdp_action::XDP_PASS)
}

/// Service keys, never written: every lookup misses, as for traffic that is for no service.
/// A key is a `ServiceKey` as five native-order words (address, then port, protocol, family).
#[btf_map]
static KEYS: HashMap<[u32; 5], u32, 2048> = HashMap::new();

/// The baseline's parse, then one lookup of the destination in an empty hash map.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the `#[xdp]` macro calls the entry with an owned `XdpContext`"
)]
pub fn lookup(ctx: XdpContext) -> u32 {
    let Some(key) = destination(&ctx) else {
        return xdp_action::XDP_PASS;
    };
    match unsafe { KEYS.get(key) } {
        Some(_) => xdp_action::XDP_TX,
        None => xdp_action::XDP_PASS,
    }
}

/// An IPv6 address as four native-order words (no indexing: nothing to panic).
#[inline(always)]
fn words(a: &[u8; 16]) -> [u32; 4] {
    // SAFETY: 16 bytes are four `[u8; 4]`, and every bit pattern is valid for both.
    let q: [[u8; 4]; 4] = unsafe { core::mem::transmute(*a) };
    q.map(u32::from_ne_bytes)
}

/// The destination address (IPv4 in the first word), protocol and family of an IP frame, in a
/// `ServiceKey`'s layout with the port zero.
#[inline(always)]
fn destination(ctx: &XdpContext) -> Option<[u32; 5]> {
    let eth: *const EthHdr = ptr_at(ctx, 0)?;
    match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let ip: *const Ipv4Hdr = ptr_at(ctx, EthHdr::LEN)?;
            let ip = unsafe { &*ip };
            if ip.vihl >> 4 != 4 {
                return None;
            }
            let tail = (u32::from(ip.proto) << 16) | (4 << 24);
            Some([u32::from_ne_bytes(ip.dst_addr), 0, 0, 0, tail])
        }
        ETH_P_IPV6 => {
            let ip: *const Ipv6Hdr = ptr_at(ctx, EthHdr::LEN)?;
            let ip = unsafe { &*ip };
            if ip.vcf[0] >> 4 != 6 {
                return None;
            }
            let [w0, w1, w2, w3] = words(&ip.dst_addr);
            let tail = (u32::from(ip.next_hdr) << 16) | (6 << 24);
            Some([w0, w1, w2, w3, tail])
        }
        _ => None,
    }
}

#[inline(always)]
fn reflect(ctx: &XdpContext) -> Option<u32> {
    let eth: *mut EthHdr = ptr_at(ctx, 0)?;
    let is_ip = match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => {
            let ip: *const Ipv4Hdr = ptr_at(ctx, EthHdr::LEN)?;
            let vihl = unsafe { (*ip).vihl };
            vihl >> 4 == 4
        }
        ETH_P_IPV6 => {
            let ip: *const Ipv6Hdr = ptr_at(ctx, EthHdr::LEN)?;
            let vcf = unsafe { (*ip).vcf[0] };
            vcf >> 4 == 6
        }
        _ => false,
    };
    if !is_ip {
        return None;
    }
    // Bounds checked above; nothing else touches the frame while the program runs.
    unsafe {
        let e = &mut *eth;
        core::mem::swap(&mut e.dst_addr, &mut e.src_addr);
    }
    Some(xdp_action::XDP_TX)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable: nothing here can panic (no indexing, unwrap or division).
    loop {}
}

// The same licence as the data plane (no GPL-only helper is called here).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

/// The program the reset wrapper tail-calls, at index 0 (set by the bench).
#[btf_map]
static RESET_TARGET: ProgramArray<1> = ProgramArray::new();

/// The Ethernet header of the bench's client frames (`router_tests::addrs`): to the lb's
/// client-side MAC, from the client's, IPv4.
const FRAME_ETH: [u8; 14] = [
    0x02, 0x53, 0x59, 0x00, 0x00, 0xfe, 0x02, 0x53, 0x59, 0x00, 0x00, 0x01, 0x08, 0x00,
];

/// IP protocol number of IPv4-in-IPv4 (RFC 2003).
const PROTO_IPIP: u8 = 4;

#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the `#[xdp]` macro calls the entry with an owned `XdpContext`"
)]
pub fn reset(ctx: XdpContext) -> u32 {
    let Some(delta) = outer_ipip(&ctx) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: the context is the program's own; the helper checks the new head.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, delta) } != 0 {
        return xdp_action::XDP_ABORTED;
    }
    let Some(eth) = ptr_at::<[u8; 14]>(&ctx, 0) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: `ptr_at` checked the 14 bytes against the frame's end.
    unsafe { core::ptr::write_volatile(eth, FRAME_ETH) };
    // SAFETY: index 0 of a program array; returns only if the slot is empty.
    unsafe { RESET_TARGET.tail_call(&ctx, 0) };
    xdp_action::XDP_ABORTED
}

/// How far the frame's head moves to drop an outer IPv4-in-IPv4 header: 20 bytes, or 0 for a
/// frame without one; `None` for a frame too short to tell.
#[inline(always)]
fn outer_ipip(ctx: &XdpContext) -> Option<i32> {
    let eth: *const EthHdr = ptr_at(ctx, 0)?;
    let ip: *const Ipv4Hdr = ptr_at(ctx, EthHdr::LEN)?;
    // SAFETY: both checked against the frame's end.
    let (ether_type, proto) = unsafe { (u16::from_be((*eth).ether_type), (*ip).proto) };
    Some(if ether_type == ETH_P_IP && proto == PROTO_IPIP {
        20
    } else {
        0
    })
}
