//! TCP resets for tracked flows whose backend resets them (`BACKEND_F_RESET`:
//! `on_backend_down: reset`, `on_failback: reset`): the segment being processed becomes, in
//! place, an RST from the virtual IP back to the client (RFC 9293 §3.10.7.1, a segment for a
//! connection that does not exist here any more), sent back with `XDP_TX`.
//!
//! - A segment with ACK is answered `<SEQ=SEG.ACK><CTL=RST>`; one without,
//!   `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>`, where `SEG.LEN` counts the data and one for
//!   each of SYN and FIN.
//! - The reply is a fresh 20-byte IPv4 header (no options, DF, TTL 64) or 40-byte IPv6 header
//!   (hop limit 64, no extension headers) and a 20-byte TCP header (no options, window 0),
//!   addresses and ports swapped, checksums computed whole; the frame is cut to those headers
//!   (`bpf_xdp_adjust_tail`): the payload is dropped. VLAN tags stay as they came.
//! - An RST is never answered (RFC 9293: an RST must not be sent in response to an RST), nor
//!   is a fragment or an ICMP error quoting the flow: those are dropped. A segment whose data
//!   offset is below 5 or whose header ends past its datagram is dropped (`malformed_drop`):
//!   no RST is built from fields that are not there.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_tail, programs::XdpContext};
use router_common::{FAMILY_V4, Reason, tcp_flags};

use crate::{
    forward,
    parse::{Packet, frag, ptr_at},
};

/// TTL / hop limit of a reset the program sends.
const RESET_TTL: u8 = 64;
/// Bytes of the IP header a reset carries.
const V4_HDR: usize = 20;
const V6_HDR: usize = 40;
/// 16-bit words of the headers a reset carries (IP and TCP).
const V4_WORDS: usize = (V4_HDR + TCP_MIN) >> 1;
const V6_WORDS: usize = (V6_HDR + TCP_MIN) >> 1;
/// The smallest TCP header, which the parser checked lies inside the datagram.
const TCP_MIN: usize = 20;
/// IP protocol number of TCP.
const TCP: u8 = 6;

/// The one's-complement sum of the big-endian 16-bit words of the first `n` bytes of `a` (`n`
/// even, at most 16), not folded.
#[inline(always)]
fn sum(a: &[u8; 16], n: usize) -> u32 {
    let mut s = 0u32;
    let mut i = 0;
    while i + 1 < n && i + 1 < 16 {
        s += match (a.get(i), a.get(i + 1)) {
            (Some(hi), Some(lo)) => (u32::from(*hi) << 8) | u32::from(*lo),
            _ => 0,
        };
        i += 2;
    }
    s
}

/// The Internet checksum (RFC 1071) of a sum of 16-bit words.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "after two folds the sum fits in 16 bits: the cast drops only zero bits"
)]
fn finish(mut s: u32) -> u16 {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// The reply's TCP sequence number, acknowledgment number and flags for a segment with
/// sequence number `seq`, acknowledgment number `ack`, flags `flags` and `len` bytes of data
/// (RFC 9293 §3.10.7.1).
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the data length of a segment is below 2^16; sequence arithmetic wraps"
)]
fn reply_numbers(seq: u32, ack: u32, flags: u8, len: usize) -> (u32, u32, u8) {
    let f = u32::from(flags);
    if f & tcp_flags::ACK != 0 {
        return (ack, 0, tcp_flags::RST as u8);
    }
    let mut n = seq.wrapping_add(len as u32);
    if f & tcp_flags::SYN != 0 {
        n = n.wrapping_add(1);
    }
    if f & tcp_flags::FIN != 0 {
        n = n.wrapping_add(1);
    }
    (0, n, (tcp_flags::RST | tcp_flags::ACK) as u8)
}

/// Stores the 16-bit word `w` (host order) at word `k` of `p`, in network order.
///
/// # Safety
///
/// `p + 2k` starts two writable bytes of the packet.
#[inline(always)]
unsafe fn put(p: *mut u16, k: usize, w: u16) {
    // SAFETY: the caller's.
    unsafe { core::ptr::write_volatile(p.add(k), w.to_be()) };
}

/// Stores the first `len` bytes (`len` even, at most 16) of address `addr` from word `at` of
/// `words`.
///
/// # Safety
///
/// `words + 2·at` starts `len` writable bytes of the packet.
#[inline(always)]
unsafe fn put_addr(words: *mut u16, at: usize, addr: &[u8; 16], len: usize) {
    let mut i = 0;
    while i + 1 < len && i + 1 < 16 {
        if let (Some(hi), Some(lo)) = (addr.get(i), addr.get(i + 1)) {
            // SAFETY: the caller's; `i / 2` < `len / 2`.
            unsafe { put(words, at + i / 2, u16::from_be_bytes([*hi, *lo])) };
        }
        i += 2;
    }
}

/// Turns the TCP segment being processed into the RST that answers it and returns the XDP
/// action (`XDP_TX`). `Err(BackendReset)`: the segment is not answered (an RST, a fragment, an
/// ICMP error) and is dropped; `Err(MalformedDrop)`: its header is inconsistent, or the frame
/// could not be cut.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "`ingress_ifindex` widens a `u32`; frame lengths are below 2^16, so their \
              difference fits an `i32`"
)]
pub fn answer(ctx: &XdpContext, pkt: &Packet) -> Result<u32, Reason> {
    if pkt.is_icmp() || pkt.frag != frag::NONE || pkt.tcp & tcp_flags::RST != 0 {
        return Err(Reason::BackendReset);
    }
    // Read first: once a check of a later offset has passed, LLVM drops this one as implied,
    // and the verifier cannot follow that (6.18: "invalid access to packet").
    let macs = forward::reversed_macs(ctx)?;
    // A segment sent to a group or broadcast MAC gets no answer: the reply's source MAC (the
    // segment's destination) must be a unicast one.
    if macs[6] & 1 != 0 {
        return Err(Reason::BackendReset);
    }
    let v4 = pkt.flow.family == FAMILY_V4;
    let (l3, l4) = (pkt.l3(), pkt.l4());
    // The datagram's end, from its own length field (what follows is Ethernet padding).
    let ip: *const [u8; 8] = ptr_at(ctx, l3).ok_or(Reason::MalformedDrop)?;
    // SAFETY: `ptr_at` checked the 8 bytes.
    let end = unsafe {
        if v4 {
            l3 + usize::from(u16::from_be_bytes([(*ip)[2], (*ip)[3]]))
        } else {
            l3 + 40 + usize::from(u16::from_be_bytes([(*ip)[4], (*ip)[5]]))
        }
    };
    let tcp: *const [u8; TCP_MIN] = ptr_at(ctx, l4).ok_or(Reason::MalformedDrop)?;
    // SAFETY: `ptr_at` checked the 20 bytes; every index is a constant inside them.
    let (seq, ack, flags, header) = unsafe {
        let t = &*tcp;
        (
            u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
            u32::from_be_bytes([t[8], t[9], t[10], t[11]]),
            t[13],
            usize::from(t[12] >> 4) * 4,
        )
    };
    if header < TCP_MIN || l4 + header > end {
        return Err(Reason::MalformedDrop);
    }
    let (rseq, rack, rflags) = reply_numbers(seq, ack, flags, end - l4 - header);
    let (sport, dport) = (u16::from_be(pkt.flow.dport), u16::from_be(pkt.flow.sport));
    let (n, ip_len) = if v4 { (4, V4_HDR) } else { (16, V6_HDR) };
    // The addresses (each pair sums the same in either order), then the pseudo-header's
    // protocol and TCP length (RFC 9293 §3.1, RFC 8200 §8.1), then the segment.
    let addrs = sum(&pkt.flow.src, n) + sum(&pkt.flow.dst, n);
    let tcp_sum = addrs
        + u32::from(TCP)
        + TCP_MIN as u32
        + u32::from(sport)
        + u32::from(dport)
        + (rseq >> 16)
        + (rseq & 0xffff)
        + (rack >> 16)
        + (rack & 0xffff)
        + (0x5000 | u32::from(rflags));
    let frame = ctx.data_end() - ctx.data();
    let keep = l3 + ip_len + TCP_MIN;
    // `keep` ≤ `frame`: the parser found the whole TCP header past an IP header at least as
    // long as the one written here.
    let cut = keep as i32 - frame as i32;
    // SAFETY: the helper takes the context it was given; a negative delta shrinks the frame.
    if cut < 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, cut) } != 0 {
        return Err(Reason::MalformedDrop);
    }
    // The MACs before the headers, for the same reason as above.
    let action = forward::emit(ctx, ctx.ingress_ifindex() as u32, forward::macs(&macs))?;
    let (src, dst) = (&pkt.flow.dst, &pkt.flow.src);
    if v4 {
        let out: *mut [u16; V4_WORDS] = ptr_at(ctx, l3).ok_or(Reason::MalformedDrop)?;
        let p = out.cast::<u16>();
        let ttl_proto = (u16::from(RESET_TTL) << 8) | u16::from(TCP);
        let check =
            finish(0x4500 + (V4_HDR + TCP_MIN) as u32 + 0x4000 + u32::from(ttl_proto) + addrs);
        // SAFETY: `ptr_at` checked the 40 bytes at `l3` (2-aligned: Ethernet and VLAN headers
        // are 14 and 4 bytes); every word index is a constant below 20.
        unsafe {
            put(p, 0, 0x4500);
            put(p, 1, (V4_HDR + TCP_MIN) as u16);
            put(p, 2, 0);
            put(p, 3, 0x4000);
            put(p, 4, ttl_proto);
            put(p, 5, check);
            put_addr(p, 6, src, 4);
            put_addr(p, 8, dst, 4);
            segment(
                p.add(V4_HDR / 2),
                sport,
                dport,
                rseq,
                rack,
                rflags,
                finish(tcp_sum),
            );
        }
    } else {
        let out: *mut [u16; V6_WORDS] = ptr_at(ctx, l3).ok_or(Reason::MalformedDrop)?;
        let p = out.cast::<u16>();
        // SAFETY: `ptr_at` checked the 60 bytes at `l3` (2-aligned, as above); every word
        // index is a constant below 30.
        unsafe {
            put(p, 0, 0x6000);
            put(p, 1, 0);
            put(p, 2, TCP_MIN as u16);
            put(p, 3, (u16::from(TCP) << 8) | u16::from(RESET_TTL));
            put_addr(p, 4, src, 16);
            put_addr(p, 12, dst, 16);
            segment(
                p.add(V6_HDR / 2),
                sport,
                dport,
                rseq,
                rack,
                rflags,
                finish(tcp_sum),
            );
        }
    }
    Ok(action)
}

/// Writes the reset's 20-byte TCP header at `p`: no options, window 0, checksum `check`.
///
/// # Safety
///
/// `p` starts 20 writable, 2-aligned bytes of the packet.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the halves of a 32-bit number"
)]
unsafe fn segment(p: *mut u16, sport: u16, dport: u16, seq: u32, ack: u32, flags: u8, check: u16) {
    // SAFETY: the caller's; word indexes are constants below 10.
    unsafe {
        put(p, 0, sport);
        put(p, 1, dport);
        put(p, 2, (seq >> 16) as u16);
        put(p, 3, seq as u16);
        put(p, 4, (ack >> 16) as u16);
        put(p, 5, ack as u16);
        put(p, 6, 0x5000 | u16::from(flags));
        put(p, 7, 0);
        put(p, 8, check);
        put(p, 9, 0);
    }
}
