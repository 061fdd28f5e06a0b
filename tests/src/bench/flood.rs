//! An in-kernel flood generator for the forwarding benchmark (UDP) and the SYN-flood test
//! ([`Flood::syn`]).
//!
//! A socket sender tops out near a million packets per second per CPU (a syscall, an skb and
//! the UDP/IP output path per packet), which is less than an XDP forwarder can take: it would
//! measure the sender. This one is the kernel's own packet generator (the mechanism of
//! xdp-tools' `xdp-trafficgen`): `BPF_PROG_TEST_RUN` with `BPF_F_TEST_XDP_LIVE_FRAMES`
//! (Linux 5.18) runs a tiny XDP program on frames from a page pool and really transmits the
//! ones it returns `XDP_TX` for, out of the interface named as the ingress in `xdp_md`.
//!
//! The program (raw instructions, loaded with [`xdp_pass::load_raw`]) writes the whole
//! Ethernet + IPv4 + UDP header from a template into every frame — pages come back from the
//! receivers with their rewrites (MACs, a translated address, a lower TTL) and are reused without
//! being re-initialised — then sets a random UDP source port in 1024..=17407 (16,384 flows)
//! with `bpf_get_prandom_u32` and returns `XDP_TX`. The UDP checksum is 0 ("none", allowed
//! over IPv4), so the port needs no checksum update.
//!
//! On a veth the frames land in the peer's receive ring, which exists only while the peer runs
//! NAPI (an XDP program attached, or GRO on); frames that find the ring full are dropped and
//! not counted as received.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd as _, OwnedFd};

use anyhow::{Context as _, Result};

use crate::xdp_pass::{self, insn};

/// Bytes in a generated frame: the Ethernet minimum without the FCS (a 64-byte frame on a
/// wire).
pub const FRAME_LEN: usize = 60;
/// Ethernet, IPv4 and UDP headers: what the program rewrites in every frame.
const HEADERS: usize = 14 + 20 + 8;
/// Offset of the UDP source port.
const SPORT: i16 = 14 + 20;
/// Source ports are 1024 + (random & `PORT_MASK`).
const PORT_MASK: i32 = 0x3fff;
const FIRST_PORT: i32 = 1024;

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;
/// Frames per batch in live-frames mode (the kernel allows up to 256; 64 is its default).
const BATCH: u32 = 64;

const XDP_DROP: i32 = 1;
const XDP_TX: i32 = 3;

/// A UDP-over-IPv4 frame from `src` (MAC `src_mac`) to `dst:dport` via the next hop
/// `dst_mac`, with an 18-byte zero payload, TTL 64 and no UDP checksum. The source port is a
/// placeholder: the generator sets it per frame.
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the IPv4 length of a 60-byte frame and the first source port, 1024, as u16 fields"
)]
pub fn udp_v4_frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    dport: u16,
) -> [u8; FRAME_LEN] {
    let mut f = [0u8; FRAME_LEN];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (FRAME_LEN - 14) as u16;
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&(FIRST_PORT as u16).to_be_bytes());
    udp[2..4].copy_from_slice(&dport.to_be_bytes());
    udp[4..6].copy_from_slice(&(ip_len - 20).to_be_bytes());
    f
}

/// The Internet checksum of an IPv4 header whose checksum field is zero.
#[expect(
    clippy::cast_possible_truncation,
    reason = "the sum is folded into 16 bits first"
)]
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Ethernet, IPv4 and TCP headers of a SYN frame ([`syn_v4_frame`]).
const SYN_HEADERS: usize = 14 + 20 + 20;
/// Offset of the low 16 bits of the IPv4 source address.
const SRC_LOW: i16 = 14 + 12 + 2;

/// A TCP SYN over IPv4 from `src` (MAC `src_mac`; the generator replaces its low 16 bits and
/// the source port with random ones per frame, so every frame is a new flow) to `dst:dport`
/// via `dst_mac`. The IPv4 header checksum is left as computed for `src`, so it is wrong for
/// the frames sent (a receiving host drops them; the balancer does not check it) and the TCP
/// checksum is 0.
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the first source port, 1024, as a u16 field"
)]
pub fn syn_v4_frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    dport: u16,
) -> [u8; FRAME_LEN] {
    let mut f = udp_v4_frame(src_mac, dst_mac, src, dst, dport);
    let ip = &mut f[14..34];
    ip[9] = 6;
    ip[10] = 0;
    ip[11] = 0;
    let sum = ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let tcp = &mut f[34..54];
    tcp.fill(0);
    tcp[0..2].copy_from_slice(&(FIRST_PORT as u16).to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02;
    tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    f
}

/// The generator program for a frame whose first [`HEADERS`] bytes are `headers`.
fn program(headers: &[u8]) -> Vec<u64> {
    program_for(headers, false)
}

/// The generator program for a frame whose first `headers.len()` bytes are `headers`: with
/// `random_source`, the low 16 bits of the IPv4 source address are random too (the high half
/// of the random word), so frames are distinct flows by address and port.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "offsets into a header of at most 54 bytes and a program of 30 instructions, as the \
              instructions' i16 offset and i32 immediate"
)]
fn program_for(headers: &[u8], random_source: bool) -> Vec<u64> {
    // Registers: r1 ctx, r6 data, r7 data_end (r6-r9 survive helper calls).
    let mut p = vec![
        insn(0x61, 0x16, 0, 0),                    // r6 = *(u32 *)(r1 + 0)   data
        insn(0x61, 0x17, 4, 0),                    // r7 = *(u32 *)(r1 + 4)   data_end
        insn(0xbf, 0x62, 0, 0),                    // r2 = r6
        insn(0x07, 0x02, 0, headers.len() as i32), // r2 += headers
        0,                                         // if r2 > r7 goto short (patched below)
    ];
    let check = p.len() - 1;
    let mut words = headers.chunks_exact(4);
    for (k, w) in words.by_ref().enumerate() {
        let imm = i32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
        p.push(insn(0x62, 0x06, (4 * k) as i16, imm)); // *(u32 *)(r6 + 4k) = imm
    }
    let rest = words.remainder();
    if rest.len() == 2 {
        let imm = i32::from(u16::from_ne_bytes([rest[0], rest[1]]));
        p.push(insn(0x6a, 0x06, (headers.len() - 2) as i16, imm)); // *(u16 *)(r6 + len - 2) = imm
    }
    p.push(insn(0x85, 0x00, 0, 7)); // call bpf_get_prandom_u32
    if random_source {
        p.extend([
            insn(0xbf, 0x01, 0, 0),       // r1 = r0
            insn(0x77, 0x01, 0, 16),      // r1 >>= 16
            insn(0x6b, 0x16, SRC_LOW, 0), // *(u16 *)(r6 + SRC_LOW) = r1
        ]);
    }
    p.extend([
        insn(0x57, 0x00, 0, PORT_MASK),  // r0 &= PORT_MASK
        insn(0x07, 0x00, 0, FIRST_PORT), // r0 += FIRST_PORT
        insn(0xdc, 0x00, 0, 16),         // r0 = be16 r0
        insn(0x6b, 0x06, SPORT, 0),      // *(u16 *)(r6 + SPORT) = r0
        insn(0xb7, 0x00, 0, XDP_TX),     // r0 = XDP_TX
        insn(0x95, 0x00, 0, 0),          // exit
    ]);
    let short = p.len();
    p.extend([
        insn(0xb7, 0x00, 0, XDP_DROP), // short: r0 = XDP_DROP
        insn(0x95, 0x00, 0, 0),        // exit
    ]);
    // BPF_JMP | BPF_JGT | BPF_X, dst r2, src r7; the offset counts from the next instruction.
    p[check] = insn(0x2d, 0x72, (short - check - 1) as i16, 0);
    p
}

/// `union bpf_attr` for `BPF_PROG_TEST_RUN`, up to `batch_size` (and padding to 8 bytes).
#[repr(C)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// The loaded generator and the frame it sends.
#[derive(Debug)]
pub struct Flood {
    prog: OwnedFd,
    frame: [u8; FRAME_LEN],
}

impl Flood {
    /// Loads the generator program for `frame` (see [`udp_v4_frame`]).
    ///
    /// # Errors
    ///
    /// When the kernel refuses the program.
    pub fn new(frame: [u8; FRAME_LEN]) -> Result<Self> {
        let prog = xdp_pass::load_raw("sy_bench_flood", &program(&frame[..HEADERS]))
            .context("loading the flood generator")?;
        Ok(Self { prog, frame })
    }

    /// Loads the generator for a SYN flood of `frame` ([`syn_v4_frame`]): a random source port
    /// and low half of the source address per frame, about 2^30 distinct flows.
    ///
    /// # Errors
    ///
    /// When the kernel refuses the program.
    pub fn syn(frame: [u8; FRAME_LEN]) -> Result<Self> {
        let prog = xdp_pass::load_raw("sy_syn_flood", &program_for(&frame[..SYN_HEADERS], true))
            .context("loading the SYN flood generator")?;
        Ok(Self { prog, frame })
    }

    /// Transmits `count` frames out of interface `ifindex` of the calling thread's namespace
    /// (fewer arrive if the receiver's ring overflows). Blocks until they are sent.
    ///
    /// # Errors
    ///
    /// When `BPF_PROG_TEST_RUN` fails (a kernel without live-frames mode, no such interface).
    #[expect(
        clippy::cast_sign_loss,
        clippy::cast_possible_truncation,
        reason = "`union bpf_attr`'s u32 fields: an open descriptor (non-negative), a 60-byte \
                  frame and its 24-byte `xdp_md`"
    )]
    pub fn send(&self, ifindex: u32, count: u32) -> io::Result<()> {
        let md: Vec<u8> = super::testrun::xdp_md(ifindex, FRAME_LEN);
        let attr = TestRunAttr {
            prog_fd: self.prog.as_raw_fd() as u32,
            retval: 0,
            data_size_in: FRAME_LEN as u32,
            data_size_out: 0,
            data_in: self.frame.as_ptr() as u64,
            data_out: 0,
            repeat: count,
            duration: 0,
            ctx_size_in: md.len() as u32,
            ctx_size_out: 0,
            ctx_in: md.as_ptr() as u64,
            ctx_out: 0,
            flags: BPF_F_TEST_XDP_LIVE_FRAMES,
            cpu: 0,
            batch_size: BATCH,
            _pad: 0,
        };
        // SAFETY: `attr` is a valid prefix of `union bpf_attr` of the size passed; the frame
        // and context buffers it points to outlive the call, and the kernel only reads them
        // (no output buffers in live-frames mode).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_TEST_RUN,
                &raw const attr,
                size_of::<TestRunAttr>(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_has_a_valid_ipv4_header() {
        let f = udp_v4_frame(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 10),
            80,
        );
        // A header with its checksum sums to 0xffff, so its checksum computes as zero.
        assert_eq!(ipv4_checksum(&f[14..34]), 0);
        assert_eq!(&f[36..38], &80u16.to_be_bytes());
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 26);
    }

    #[test]
    fn program_writes_every_header_byte_and_jumps_to_the_drop_exit() {
        let p = program(&[0u8; HEADERS]);
        // 5 setup instructions, 10 word stores, 1 half-word store, 7 for the port and exit,
        // 2 for the short-frame exit.
        assert_eq!(p.len(), 5 + 10 + 1 + 7 + 2);
        let jump = p[4].to_ne_bytes();
        assert_eq!(jump[0], 0x2d);
        let off = usize::try_from(i16::from_ne_bytes([jump[2], jump[3]])).expect("a forward jump");
        assert_eq!(4 + 1 + off, p.len() - 2);
    }
}
