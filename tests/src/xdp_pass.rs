//! A two-instruction XDP program that passes every frame, for the receiving ends of veths.
//!
//! Why: a frame that an XDP program sends into a veth with `XDP_TX` or `XDP_REDIRECT` is
//! queued on the peer's NAPI ring, and a veth end runs NAPI only while it has an XDP program
//! attached (or GRO on); otherwise `veth_xdp_xmit` drops the frame. So every host veth that can
//! receive frames forwarded by the lb's program carries this one, in native (driver) mode —
//! generic-mode XDP would not enable NAPI.
//!
//! How, robustly: no eBPF crate, no clang, no bpffs. The program is `mov64 r0, XDP_PASS; exit`
//! assembled here and loaded with bpf(2) `BPF_PROG_LOAD`; it is attached with one rtnetlink
//! `RTM_SETLINK` message carrying `IFLA_XDP { FD, FLAGS = XDP_FLAGS_DRV_MODE }`, sent from a
//! thread inside the target namespace. A netlink attachment belongs to the interface, not to
//! a file descriptor, so it lives exactly as long as the veth, which dies with its namespace.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

use anyhow::{Context as _, Result, bail};

use crate::netns::Netns;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TYPE_XDP: u32 = 6;
const XDP_PASS: i32 = 2;

const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const NLA_F_NESTED: u16 = 1 << 15;
/// Native mode only: fail rather than fall back to generic XDP, which would not help.
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NLMSGERR_ATTR_MSG: u16 = 1;

/// One eBPF instruction as `struct bpf_insn` lays it out; `dst_src` is the register byte
/// (destination in the low nibble on little-endian hosts).
#[must_use]
pub fn insn(code: u8, dst_src: u8, off: i16, imm: i32) -> u64 {
    let mut b = [0u8; 8];
    b[0] = code;
    b[1] = dst_src;
    b[2..4].copy_from_slice(&off.to_ne_bytes());
    b[4..8].copy_from_slice(&imm.to_ne_bytes());
    u64::from_ne_bytes(b)
}

/// The program: `r0 = XDP_PASS; exit`.
fn program() -> [u64; 2] {
    [
        insn(0xb7, 0, 0, XDP_PASS), // BPF_ALU64 | BPF_MOV | BPF_K, dst r0
        insn(0x95, 0, 0, 0),        // BPF_JMP | BPF_EXIT
    ]
}

/// The leading fields of `union bpf_attr` for `BPF_PROG_LOAD`; the kernel treats the fields
/// it knows beyond these as zero.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// Loads the `XDP_PASS` program (named `sy_xdp_pass`) and returns its file descriptor.
/// Works in any namespace; also serves as the "BPF works here" probe.
///
/// # Errors
///
/// As [`load_raw`]: without root or BPF, bpf(2) refuses.
pub fn load() -> io::Result<OwnedFd> {
    load_raw("sy_xdp_pass", &program())
}

/// Loads an XDP program given as raw instructions (see [`insn`]), GPL-licensed so it may call
/// any helper. For tiny test fixtures; `name` is truncated to 15 bytes.
///
/// # Errors
///
/// When bpf(2) refuses: no privilege, no BPF, or the verifier rejects the program.
#[expect(
    clippy::cast_possible_truncation,
    reason = "a fixture's few instructions as the u32 count, and the descriptor bpf(2) \
              returned, an int, through its long result"
)]
pub fn load_raw(name: &str, insns: &[u64]) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut prog_name = [0u8; 16];
    let len = name.len().min(15);
    prog_name[..len].copy_from_slice(&name.as_bytes()[..len]);
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name,
        prog_ifindex: 0,
        expected_attach_type: 0,
    };
    // SAFETY: `attr` is a valid, fully initialized prefix of `union bpf_attr` of the size
    // passed, and the instruction and license buffers it points to outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &raw const attr,
            size_of::<ProgLoadAttr>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success bpf(2) returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Attaches `prog` in native mode to interface `ifname` inside namespace `ns`.
///
/// # Errors
///
/// When `ns` cannot be entered, it has no such interface, or the kernel refuses the
/// attachment (the error carries its message, e.g. a peer MTU too large for XDP).
pub fn attach(ns: &Netns, ifname: &str, prog: &OwnedFd) -> Result<()> {
    set_xdp(ns, ifname, prog.as_raw_fd())
        .with_context(|| format!("cannot attach XDP_PASS to {ifname} in {}", ns.name()))
}

/// Detaches whatever XDP program interface `ifname` inside `ns` has.
///
/// # Errors
///
/// When `ns` cannot be entered, it has no such interface, or the kernel refuses.
pub fn detach(ns: &Netns, ifname: &str) -> Result<()> {
    set_xdp(ns, ifname, -1)
        .with_context(|| format!("cannot detach XDP from {ifname} in {}", ns.name()))
}

fn set_xdp(ns: &Netns, ifname: &str, fd: RawFd) -> Result<()> {
    let name = std::ffi::CString::new(ifname)?;
    ns.run(move || -> Result<()> {
        // SAFETY: `name` is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            bail!("no interface {ifname:?}: {}", io::Error::last_os_error());
        }
        netlink_set_xdp(i32::try_from(ifindex)?, fd, XDP_FLAGS_DRV_MODE)
    })?
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "an attribute of a few bytes, as netlink's u16 length"
)]
fn push_attr(msg: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    msg.extend_from_slice(&(4 + payload.len() as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(payload);
}

/// Sends `RTM_SETLINK { ifindex, IFLA_XDP { FD, FLAGS } }` on a route socket of the calling
/// thread's namespace and waits for the acknowledgement.
#[expect(
    clippy::cast_possible_truncation,
    reason = "netlink's constants (flags, address families), struct sizes and a message of \
              some 50 bytes, in the narrower fields of its messages"
)]
#[expect(
    clippy::cast_sign_loss,
    reason = "the length recv returned, checked non-negative first"
)]
fn netlink_set_xdp(ifindex: i32, prog_fd: RawFd, flags: u32) -> Result<()> {
    // SAFETY: plain socket(2) call; the result is checked and owned right away.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error()).context("netlink socket");
    }
    // SAFETY: `raw` is a new descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    for opt in [NETLINK_EXT_ACK, NETLINK_CAP_ACK] {
        let one: libc::c_int = 1;
        // SAFETY: valid socket and option buffer of the given size. Best effort: without
        // these options the error code alone is reported.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_NETLINK,
                opt,
                (&raw const one).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    let mut msg = Vec::with_capacity(64);
    msg.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, set below
    msg.extend_from_slice(&libc::RTM_SETLINK.to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // nlmsg_seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
    // struct ifinfomsg: family, pad, type, index, flags, change
    msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    msg.extend_from_slice(&ifindex.to_ne_bytes());
    msg.extend_from_slice(&[0; 8]);
    let mut nested = Vec::with_capacity(16);
    push_attr(&mut nested, IFLA_XDP_FD, &prog_fd.to_ne_bytes());
    push_attr(&mut nested, IFLA_XDP_FLAGS, &flags.to_ne_bytes());
    push_attr(&mut msg, IFLA_XDP | NLA_F_NESTED, &nested);
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_ne_bytes());

    // SAFETY: an all-zero sockaddr_nl is valid; it addresses the kernel (pid 0).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `msg` and `kernel` are valid for the lengths passed.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&raw const kernel).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error()).context("netlink sendto");
    }

    let mut buf = [0u8; 8192];
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error()).context("netlink recv");
    }
    parse_ack(&buf[..n as usize])
}

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Reads an `NLMSG_ERROR` acknowledgement: error 0 is success; otherwise the errno and, with
/// extended acks, the kernel's message (e.g. "Peer MTU is too large to set XDP").
fn parse_ack(b: &[u8]) -> Result<()> {
    let (Some(len), Some(kind)) = (ne_u32(b, 0), ne_u16(b, 4)) else {
        bail!("short netlink reply ({} bytes)", b.len());
    };
    if i32::from(kind) != libc::NLMSG_ERROR {
        bail!("unexpected netlink reply type {kind}");
    }
    let errno = ne_u32(b, 16)
        .context("truncated netlink error")?
        .cast_signed();
    if errno == 0 {
        return Ok(());
    }
    let err = io::Error::from_raw_os_error(-errno);
    // With NETLINK_CAP_ACK the error carries only the request's header; attributes follow.
    let mut at = 16 + 4 + 16;
    let end = (len as usize).min(b.len());
    while let (Some(alen), Some(akind)) = (ne_u16(b, at), ne_u16(b, at + 2)) {
        let alen = usize::from(alen);
        if alen < 4 || at + alen > end {
            break;
        }
        if akind == NLMSGERR_ATTR_MSG {
            let text = String::from_utf8_lossy(&b[at + 4..at + alen]);
            bail!("{err}: {}", text.trim_end_matches('\0'));
        }
        at += (alen + 3) & !3;
    }
    Err(err.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_endian = "little")]
    fn program_is_mov_r0_pass_then_exit() {
        let bytes: Vec<u8> = program().iter().flat_map(|i| i.to_ne_bytes()).collect();
        assert_eq!(
            bytes,
            [0xb7, 0, 0, 0, 2, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "`NLMSG_ERROR` (2) as the u16 message type"
    )]
    fn a_zero_error_ack_is_success() {
        let mut ack = vec![0u8; 36];
        ack[..4].copy_from_slice(&36u32.to_ne_bytes());
        ack[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        assert!(parse_ack(&ack).is_ok());
        ack[16..20].copy_from_slice(&(-libc::EINVAL).to_ne_bytes());
        assert!(parse_ack(&ack).is_err());
    }
}
