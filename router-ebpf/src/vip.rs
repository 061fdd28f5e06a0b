//! Traffic to a virtual IP that no service takes. A virtual IP is the balancer's address: such
//! a packet is dropped (`vip_no_service`), never handed to the host to route back onto the
//! segment. The exceptions, from the address's `VIPS` entry: an echo request is answered from
//! the address while one of its services has a usable backend (`echo_reply`, as Katran answers
//! its VIPs' pings); ICMP and `ICMPv6` messages of other types (errors, neighbour discovery)
//! are the host's; and the ports the operator passes to the host (`host_port`).
//!
//! An echo request is answered only when its header is plain and it came to a unicast MAC
//! (`answerable`), and a fragmented ICMP message to a virtual IP is dropped.
//!
//! An address is found by its bit in `SERVICE_FILTER` (salt `FILTER_VIP`) before `VIPS` is
//! looked up, so traffic for no virtual IP pays one more filter probe and no hash-map lookup.

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_ktime_get_coarse_ns, programs::XdpContext,
};
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};
use router_common::{
    CLOCK_OFFSET, FAMILY_V4, FILTER_VIP, FlowKey, RATE_WINDOW_TICKS, Reason, TICK_SHIFT,
    VIP_F_ECHO, VIP_F_LIVE, VIP_HOST_PORTS, VipKey, hash::filter_bit_words, host_port,
};

use crate::{
    csum, forward,
    maps::{CLOCK, VIPS},
    parse::{PROTO_ICMP, PROTO_ICMPV6, Packet, frag, ptr_at},
    select::{addr_pair, filter_has},
};

/// ICMP echo reply (RFC 792) and `ICMPv6` echo reply (RFC 4443 §4.2).
const ICMP_ECHO_REPLY: u8 = 0;
const ICMPV6_ECHO_REPLY: u8 = 129;
/// TTL / hop limit of an echo reply the program sends.
const REPLY_TTL: u8 = 64;

/// Whether a new flow to the virtual IP `flow` is addressed to is past the address's limit
/// (`Vip::new_flows` per `RATE_WINDOW_TICKS`), counting it. The window and the count live in
/// the address's `VIPS` value: a window that ended starts again now (two CPUs may both restart
/// it and lose a few counts), and the count is one atomic add shared by every CPU. The window
/// runs on the kernel's coarse clock (plus `CLOCK`'s test offset), not the agent's (decision
/// 0025): a limited address keeps taking new flows while no agent runs. Only for services with `SVC_F_VIP_LIMIT`.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "windows are compared as wrapping differences of a u32 of ticks"
)]
pub fn over_limit(flow: &FlowKey) -> bool {
    let key = VipKey {
        addr: flow.dst,
        family: flow.family,
        _pad: [0; 3],
    };
    let Some(v) = VIPS.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: a map value; the program's fields are written in place, each with one aligned
    // store or atomic add, so a reader sees a whole old or new value of each.
    unsafe {
        let limit = core::ptr::read_volatile(&raw const (*v).new_flows);
        if limit == 0 {
            return false;
        }
        let offset = CLOCK.get(CLOCK_OFFSET).copied().unwrap_or(0);
        let now = (bpf_ktime_get_coarse_ns().wrapping_add(offset) >> TICK_SHIFT) as u32;
        if now.wrapping_sub(core::ptr::read_volatile(&raw const (*v).window)) >= RATE_WINDOW_TICKS {
            core::ptr::write_volatile(&raw mut (*v).window, now);
            core::ptr::write_volatile(&raw mut (*v).count, 0);
        }
        let count = &raw mut (*v).count;
        core::arch::asm!(
            "lock *(u64 *)({p} + 0) += {one}",
            p = in(reg) count,
            one = in(reg) 1u64,
            options(nostack, preserves_flags),
        );
        core::ptr::read_volatile(count) > u64::from(limit)
    }
}

/// The verdict for a packet no service takes (`pkt.flow` holds its addresses, protocol and,
/// for TCP and UDP, ports): `XDP_PASS` / `no_service` unless its destination is a virtual IP.
#[inline(always)]
pub fn unserved(ctx: &XdpContext, pkt: &Packet) -> (u32, Reason) {
    let pass = (xdp_action::XDP_PASS, Reason::NoService);
    let f = &pkt.flow;
    if pkt.is_icmp() || f.family == 0 {
        return pass;
    }
    if !filter_has(filter_bit_words(
        addr_pair(&f.dst),
        0,
        0,
        f.family,
        FILTER_VIP,
    )) {
        return pass;
    }
    let key = VipKey {
        addr: f.dst,
        family: f.family,
        _pad: [0; 3],
    };
    // SAFETY: the value is copied out at once.
    let Some(vip) = (unsafe { VIPS.get(key) }).copied() else {
        return pass;
    };
    if pkt.echo != 0 {
        if vip.flags & (VIP_F_ECHO | VIP_F_LIVE) != VIP_F_ECHO | VIP_F_LIVE || !answerable(ctx, pkt)
        {
            return (xdp_action::XDP_DROP, Reason::VipNoService);
        }
        return match echo_reply(ctx, pkt) {
            Ok(()) => (xdp_action::XDP_TX, Reason::EchoReply),
            Err(r) => (xdp_action::XDP_DROP, r),
        };
    }
    // A fragmented ICMP message to a VIP is a large echo request (errors are small): it is
    // not answered, and not the host's either.
    if (f.proto == PROTO_ICMP || f.proto == PROTO_ICMPV6) && pkt.frag == frag::NONE {
        return pass;
    }
    let want = host_port(f.dport, f.proto);
    let mut i = 0;
    while i < VIP_HOST_PORTS {
        if vip
            .host_ports
            .get(i)
            .is_some_and(|p| *p == want && want & 0xffff != 0)
        {
            return (xdp_action::XDP_PASS, Reason::HostPort);
        }
        i += 1;
    }
    (xdp_action::XDP_DROP, Reason::VipNoService)
}

/// Whether the echo request being processed can be answered by turning it around: a plain
/// header (no IPv4 options to update, RFC 1122 §3.2.2.6; no IPv6 extension headers, such as a
/// routing header whose final destination is another address) and a unicast destination MAC
/// (a reply must not come from a broadcast or multicast address).
#[inline(always)]
fn answerable(ctx: &XdpContext, pkt: &Packet) -> bool {
    let plain = if pkt.flow.family == FAMILY_V4 {
        Ipv4Hdr::LEN
    } else {
        Ipv6Hdr::LEN
    };
    let Some(eth) = ptr_at::<[u8; 2]>(ctx, 0) else {
        return false;
    };
    // SAFETY: `ptr_at` checked both bytes.
    let unicast = unsafe { (*eth)[0] } & 1 == 0;
    unicast && pkt.l4().wrapping_sub(pkt.l3()) == plain
}

/// Turns the echo request being processed into its reply, in place: MACs and addresses
/// swapped, a fresh TTL / hop limit, the type an echo reply's, and the checksums updated
/// incrementally (swapping the addresses changes neither the IPv4 header's sum nor the
/// `ICMPv6` pseudo-header's). The frame then leaves by `XDP_TX`, back out of the interface it
/// came in on.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "`ingress_ifindex` widens the `u32` field of `xdp_md` to `usize`: the cast gives it back"
)]
fn echo_reply(ctx: &XdpContext, pkt: &Packet) -> Result<(), Reason> {
    let macs = forward::reversed_macs(ctx)?;
    let (l3, l4) = (pkt.l3(), pkt.l4());
    let icmp: *mut [u8; 4] = ptr_at(ctx, l4).ok_or(Reason::MalformedDrop)?;
    if pkt.flow.family == FAMILY_V4 {
        let ip: *mut [u8; 20] = ptr_at(ctx, l3).ok_or(Reason::MalformedDrop)?;
        // SAFETY: `ptr_at` checked the 20-byte header and the 4 ICMP bytes; every index and
        // offset is a constant inside them.
        unsafe {
            let h = &mut *ip;
            let (ttl, proto) = (h[8], h[9]);
            let check = csum::replace([h[10], h[11]], &[ttl, proto], &[REPLY_TTL, proto]);
            h[8] = REPLY_TTL;
            h[10] = check[0];
            h[11] = check[1];
            swap::<4>(ip.cast::<u8>(), 12, 16);
            set_type(icmp, ICMP_ECHO_REPLY);
        }
    } else {
        let ip: *mut [u8; 40] = ptr_at(ctx, l3).ok_or(Reason::MalformedDrop)?;
        // SAFETY: `ptr_at` checked the 40-byte header and the 4 ICMP bytes; every index and
        // offset is a constant inside them.
        unsafe {
            (*ip)[7] = REPLY_TTL;
            swap::<16>(ip.cast::<u8>(), 8, 24);
            set_type(icmp, ICMPV6_ECHO_REPLY);
        }
    }
    forward::emit(ctx, ctx.ingress_ifindex() as u32, forward::macs(&macs)).map(|_| ())
}

/// Swaps the `N` bytes at offset `first` of `header` with the `N` at offset `second` (an
/// address pair), as two whole-array copies: no index, so no bounds check.
///
/// # Safety
///
/// `header + first` and `header + second` start `N` writable bytes each that do not overlap.
#[inline(always)]
unsafe fn swap<const N: usize>(header: *mut u8, first: usize, second: usize) {
    // SAFETY: the caller's.
    unsafe {
        let one = header.add(first).cast::<[u8; N]>();
        let other = header.add(second).cast::<[u8; N]>();
        let (was_one, was_other) = (*one, *other);
        *one = was_other;
        *other = was_one;
    }
}

/// Sets the type of the ICMP header at `icmp` to `kind`, its checksum updated (the type and
/// code are one 16-bit word of the sum).
///
/// # Safety
///
/// `icmp` points at four writable bytes of the packet.
#[inline(always)]
unsafe fn set_type(icmp: *mut [u8; 4], kind: u8) {
    // SAFETY: the caller's.
    unsafe {
        let m = *icmp;
        let check = csum::replace([m[2], m[3]], &[m[0], m[1]], &[kind, m[1]]);
        *icmp = [kind, m[1], check[0], check[1]];
    }
}
