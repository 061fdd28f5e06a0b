//! The backend-side decapsulator of `forward: ipip` (`switchyard decap --iface IF`, decision
//! 0013): strips the outer header of IPv4-in-IPv4 (protocol 4, RFC 2003) and IPv6-in-IPv6
//! (next header 41, RFC 2473) packets and returns `XDP_PASS`, so the inner packet reaches the
//! virtual IP on the backend's loopback without the kernel's `ipip` / `ip6_tunnel` modules or
//! a tunnel device.
//!
//! Every IP-in-IP packet of the outer's own family that arrives on the interface is
//! decapsulated, whatever its outer destination: the interface is a backend's, where
//! encapsulated traffic is the balancer's. Anything else — other protocols, an outer IPv4
//! header with options or fragmented, an outer IPv6 header with extension headers, an inner
//! header of another version, lengths that do not add up, a truncated frame — is passed
//! untouched. No maps, no state.
#![no_std]
#![no_main]
// The `#[xdp]` macro generates the exported entry symbol without a doc comment.
#![allow(missing_docs)]
#![expect(
    clippy::inline_always,
    reason = "one BPF function: its helpers are inlined into the entry"
)]

use core::mem::size_of;

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_adjust_head, macros::xdp,
    programs::XdpContext,
};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const VLAN_HLEN: usize = 4;
const MAX_VLAN_TAGS: usize = 2;
/// Longest Ethernet header with its VLAN tags, in 16-bit words.
const MAX_L2_WORDS: usize = 11;
const _: () = assert!(MAX_L2_WORDS * 2 == ETH_HLEN + MAX_VLAN_TAGS * VLAN_HLEN);
const V4_HDR: usize = 20;
const V6_HDR: usize = 40;
const PROTO_IPIP: u8 = 4;
const PROTO_IPV6: u8 = 41;

/// A pointer to a `T` (at least two bytes) at byte `off` of the frame, or `None` if it would
/// cross `data_end`.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, off: usize) -> Option<*mut T> {
    let p = ctx.data() + off;
    if p + size_of::<T>() > ctx.data_end() {
        return None;
    }
    Some(p as *mut T)
}

/// Decapsulates an IP-in-IP frame; passes every frame.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the `#[xdp]` macro calls the entry with an owned `XdpContext`"
)]
pub fn decap(ctx: XdpContext) -> u32 {
    let _ = strip(&ctx);
    xdp_action::XDP_PASS
}

/// The offset of the IP header and its `EtherType`, after up to two VLAN tags.
#[inline(always)]
fn l3(ctx: &XdpContext) -> Option<(usize, u16)> {
    let mut off = ETH_HLEN - 2;
    for _ in 0..=MAX_VLAN_TAGS {
        let t: *const u16 = ptr_at(ctx, off)?;
        let ether_type = u16::from_be(unsafe { *t });
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            return Some((off + 2, ether_type));
        }
        off += VLAN_HLEN;
    }
    // A third tag: not ours.
    None
}

/// The outer header's length if the frame is IP-in-IP of one family with consistent lengths.
#[inline(always)]
fn outer_len(ctx: &XdpContext, l3: usize, ether_type: u16) -> Option<usize> {
    let frame = ctx.data_end() - ctx.data();
    match ether_type {
        ETH_P_IP => {
            let o: *const [u8; V4_HDR] = ptr_at(ctx, l3)?;
            let o = unsafe { &*o };
            // Version 4 without options, protocol 4, neither fragment nor more fragments.
            let total = usize::from(u16::from_be_bytes([o[2], o[3]]));
            let frags = u16::from_be_bytes([o[6], o[7]]) & 0x3fff;
            if o[0] != 0x45 || o[9] != PROTO_IPIP || frags != 0 || l3 + total > frame {
                return None;
            }
            let i: *const [u8; V4_HDR] = ptr_at(ctx, l3 + V4_HDR)?;
            let i = unsafe { &*i };
            let inner = usize::from(u16::from_be_bytes([i[2], i[3]]));
            let ihl = usize::from(i[0] & 0x0f) * 4;
            (i[0] >> 4 == 4 && ihl >= V4_HDR && inner >= ihl && inner + V4_HDR == total)
                .then_some(V4_HDR)
        }
        ETH_P_IPV6 => {
            let o: *const [u8; V6_HDR] = ptr_at(ctx, l3)?;
            let o = unsafe { &*o };
            let payload = usize::from(u16::from_be_bytes([o[4], o[5]]));
            if o[0] >> 4 != 6 || o[6] != PROTO_IPV6 || l3 + V6_HDR + payload > frame {
                return None;
            }
            let i: *const [u8; V6_HDR] = ptr_at(ctx, l3 + V6_HDR)?;
            let i = unsafe { &*i };
            let inner = usize::from(u16::from_be_bytes([i[4], i[5]]));
            (i[0] >> 4 == 6 && inner + V6_HDR == payload).then_some(V6_HDR)
        }
        _ => None,
    }
}

/// Removes the outer IP header: the Ethernet header (and VLAN tags) moves forward over it,
/// then the frame's head moves past it. `None` (frame untouched) when the frame is not
/// IP-in-IP or does not add up.
#[inline(always)]
#[expect(
    clippy::cast_possible_wrap,
    clippy::cast_possible_truncation,
    reason = "the outer header length is 20 or 40"
)]
fn strip(ctx: &XdpContext) -> Option<()> {
    let (l3, ether_type) = l3(ctx)?;
    let outer = outer_len(ctx, l3, ether_type)?;
    // Read the whole L2 header first, then write it `outer` bytes further on, last word
    // first: source and destination overlap when the header is longer than the outer one.
    let mut l2 = [0u16; MAX_L2_WORDS];
    let words = l3 / 2;
    for (k, w) in l2.iter_mut().enumerate() {
        if k >= words {
            break;
        }
        let p: *const u16 = ptr_at(ctx, 2 * k)?;
        *w = unsafe { *p };
    }
    let mut k = MAX_L2_WORDS;
    while k > 0 {
        k -= 1;
        if k < words
            && let Some(w) = l2.get(k)
        {
            let p: *mut u16 = ptr_at(ctx, outer + 2 * k)?;
            unsafe { *p = *w };
        }
    }
    // The outer header's bytes now hold the L2 header: drop the first `outer` bytes.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, outer as i32) } != 0 {
        return None;
    }
    Some(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable: nothing here can panic (indexes are bounded by the loops).
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
