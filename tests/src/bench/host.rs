//! The machine under the benchmarks: CPU pinning and priority, per-CPU and per-thread time
//! from `/proc`, finding a threaded-NAPI kernel thread, interface counters over rtnetlink, and
//! a description of the machine.

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::netns::Netns;

/// Number of online CPUs (of the machine, whatever this thread's affinity).
#[must_use]
pub fn cpu_count() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Restricts task `tid` (a thread id; 0 is the calling thread) to CPU `cpu`. New threads and
/// child processes inherit the restriction.
///
/// # Errors
///
/// When `sched_setaffinity` refuses (no such task, or a CPU it may not use).
pub fn pin(tid: i32, cpu: usize) -> Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &raw const set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("sched_setaffinity({tid}, CPU {cpu})"));
    }
    Ok(())
}

/// Sets the nice value of task `tid` (a thread id; 0 is the calling thread): -20 lets a
/// benchmark thread keep its CPU against ordinary (nice 0) processes of a shared machine.
///
/// # Errors
///
/// When `tid` is negative, or `setpriority` refuses (no such task, or no privilege).
pub fn renice(tid: i32, nice: i32) -> Result<()> {
    let who = if tid == 0 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    } else {
        tid
    };
    // SAFETY: plain setpriority(2); on Linux PRIO_PROCESS with a thread id affects that thread.
    let id = libc::id_t::try_from(who).with_context(|| format!("thread id {who}"))?;
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, id, nice) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("setpriority({who}, {nice})"));
    }
    Ok(())
}

/// Moves this process into a session of its own and gives that session's scheduler group
/// the nice value `nice`.
///
/// With autogroup scheduling (`/proc/sys/kernel/sched_autogroup_enabled`, on by default) CPU
/// time is first shared between sessions, and a thread's nice value only counts within its
/// session: a nice -20 thread still gets half a CPU against a compiler started from another
/// shell. A new session has a new group, whose weight `/proc/self/autogroup` sets; it ends
/// with the process. The process no longer receives the terminal's Ctrl-C: when an
/// interrupted cargo exits, the process's next line of output fails (closed pipe), it panics
/// and its guards clean up.
///
/// # Errors
///
/// When `setsid` fails (the process leads its process group), or `/proc/self/autogroup`
/// exists but cannot be written.
pub fn own_session(nice: i32) -> Result<()> {
    // SAFETY: setsid has no preconditions; it fails only for a process-group leader.
    if unsafe { libc::setsid() } < 0 {
        return Err(std::io::Error::last_os_error()).context("setsid");
    }
    let autogroup = std::path::Path::new("/proc/self/autogroup");
    if autogroup.exists() {
        fs::write(autogroup, nice.to_string()).context("writing /proc/self/autogroup")?;
    }
    Ok(())
}

/// Time a CPU spent, in clock ticks (`USER_HZ`), from `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Everything but idle and iowait (user, nice, system, irq, softirq, steal).
    pub busy: u64,
    /// Time the hypervisor ran something else while this virtual CPU wanted to run.
    pub steal: u64,
    /// Time spent serving softirqs (NAPI polls that run outside a NAPI thread land here).
    pub softirq: u64,
    /// All of it.
    pub total: u64,
}

impl CpuTimes {
    /// The difference `self - earlier`.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(earlier.busy),
            steal: self.steal.saturating_sub(earlier.steal),
            softirq: self.softirq.saturating_sub(earlier.softirq),
            total: self.total.saturating_sub(earlier.total),
        }
    }

    /// `part` as a percentage of the total.
    #[must_use]
    #[expect(
        clippy::cast_precision_loss,
        reason = "clock ticks, far below 2^52, as a percentage"
    )]
    pub fn percent(&self, part: u64) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            100.0 * part as f64 / self.total as f64
        }
    }
}

/// CPU `cpu`'s times.
///
/// # Errors
///
/// When `/proc/stat` cannot be read or has no line for `cpu`.
pub fn cpu_times(cpu: usize) -> Result<CpuTimes> {
    let stat = fs::read_to_string("/proc/stat")?;
    let name = format!("cpu{cpu}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))
        .with_context(|| format!("no {name} in /proc/stat"))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice (guest time is also
    // counted in user)
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let total: u64 = (0..8).map(get).sum();
    Ok(CpuTimes {
        busy: total - get(3) - get(4),
        steal: get(7),
        softirq: get(6),
        total,
    })
}

/// Time task `tid` has spent on a CPU, in nanoseconds (`/proc/TID/schedstat`, the
/// scheduler's own clock, not sampled by ticks). Without `CONFIG_IRQ_TIME_ACCOUNTING`, as
/// here, it includes the softirqs that ran inside the task (at `local_bh_enable`).
///
/// # Errors
///
/// When the task's `schedstat` cannot be read (no such task) or does not start with a number.
pub fn task_runtime_ns(tid: i32) -> Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{tid}/schedstat"))?;
    Ok(stat
        .split_whitespace()
        .next()
        .context("empty schedstat")?
        .parse()?)
}

/// The command name of task `tid`.
#[must_use]
pub fn comm(tid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// Threads whose command name starts with `prefix` (kernel threads included).
///
/// # Errors
///
/// When `/proc` cannot be listed.
pub fn tasks_named(prefix: &str) -> Result<BTreeSet<i32>> {
    let mut out = BTreeSet::new();
    for entry in fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if comm(pid).is_some_and(|c| c.starts_with(prefix)) {
            out.insert(pid);
        }
    }
    Ok(out)
}

/// Switches interface `ifname` in `ns` to threaded NAPI and returns the id of its (single) NAPI
/// kernel thread, `napi/<ifname>-<id>`, so it can be pinned to a CPU.
///
/// The thread is found as the one that appears when threaded mode is switched on: its name is
/// cut to 15 characters, too short to tell the same interface name in two namespaces apart.
/// The interface must already run NAPI (for a veth: XDP attached or GRO on) with one queue.
///
/// # Errors
///
/// When `/proc` cannot be listed, threaded mode cannot be switched on, or not exactly one
/// new NAPI thread appears.
pub fn threaded_napi(ns: &Netns, ifname: &str) -> Result<i32> {
    let before = tasks_named("napi/")?;
    ns.exec(&[
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{ifname}/threaded"),
    ])?;
    let new: Vec<i32> = tasks_named("napi/")?.difference(&before).copied().collect();
    match new.as_slice() {
        [tid] => Ok(*tid),
        other => bail!(
            "expected one new NAPI thread for {ifname} in {}, found {other:?}",
            ns.name()
        ),
    }
}

/// Packet counters of one interface (`struct rtnl_link_stats64`, what `ip -s link` shows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Received packets. On a veth running NAPI: every frame taken off its receive ring,
    /// whatever the XDP program then did with it.
    pub rx_packets: u64,
    /// Transmitted packets. On a veth: the frames its peer took off its ring.
    pub tx_packets: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Transmitted packets dropped. On a veth: also the frames refused because the peer's
    /// receive ring was full.
    pub tx_dropped: u64,
}

/// Reads an interface's counters over rtnetlink, in-process: reading them must not need a
/// CPU that the benchmark keeps busy (an `ip -s link` process can wait for one for a long
/// time, which skews a measurement window).
#[derive(Debug)]
pub struct LinkCounters {
    sock: OwnedFd,
    ifindex: i32,
}

const RTM_GETLINK: u16 = 18;
const RTM_NEWLINK: u16 = 16;
const IFLA_STATS64: u16 = 23;

impl LinkCounters {
    /// A reader for interface `ifname` of `ns` (the socket belongs to that namespace).
    ///
    /// # Errors
    ///
    /// When `ifname` holds a NUL, `ns` cannot be entered, it has no such interface, or the
    /// netlink socket cannot be opened.
    pub fn open(ns: &Netns, ifname: &str) -> Result<Self> {
        let name = std::ffi::CString::new(ifname)?;
        ns.run(move || -> Result<Self> {
            // SAFETY: `name` is a valid NUL-terminated string.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if ifindex == 0 {
                bail!(
                    "no interface {ifname:?}: {}",
                    std::io::Error::last_os_error()
                );
            }
            // SAFETY: plain socket(2); the result is checked and owned at once.
            let raw = unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                )
            };
            if raw < 0 {
                return Err(std::io::Error::last_os_error()).context("netlink socket");
            }
            // SAFETY: `raw` is a new descriptor nothing else owns.
            let sock = unsafe { OwnedFd::from_raw_fd(raw) };
            Ok(Self {
                sock,
                ifindex: i32::try_from(ifindex)?,
            })
        })?
    }

    /// The counters now.
    ///
    /// # Errors
    ///
    /// When the request cannot be sent, no reply arrives, or the reply holds no
    /// `IFLA_STATS64`.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "netlink's constants (a flag, address families) and a struct size, in the \
                  narrower fields of its messages"
    )]
    #[expect(
        clippy::cast_sign_loss,
        reason = "the length recv returned, checked non-negative first"
    )]
    pub fn read(&self) -> Result<LinkStats> {
        // struct nlmsghdr + struct ifinfomsg { family, pad, type, index, flags, change }
        let mut msg = Vec::with_capacity(32);
        msg.extend_from_slice(&32u32.to_ne_bytes());
        msg.extend_from_slice(&RTM_GETLINK.to_ne_bytes());
        msg.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
        msg.extend_from_slice(&1u32.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
        msg.extend_from_slice(&self.ifindex.to_ne_bytes());
        msg.extend_from_slice(&[0; 8]);
        // SAFETY: an all-zero sockaddr_nl is valid; it addresses the kernel.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `msg` and `kernel` are valid for the lengths passed.
        let sent = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&raw const kernel).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(std::io::Error::last_os_error()).context("netlink sendto");
        }
        let mut buf = vec![0u8; 64 * 1024];
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("netlink recv");
        }
        parse_stats64(&buf[..n as usize])
    }
}

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn ne_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The `IFLA_STATS64` attribute of an `RTM_NEWLINK` message.
fn parse_stats64(b: &[u8]) -> Result<LinkStats> {
    let kind = ne_u16(b, 4).context("short netlink reply")?;
    if kind != RTM_NEWLINK {
        bail!("netlink reply of type {kind}, not RTM_NEWLINK");
    }
    // Attributes follow the 16-byte header and the 16-byte ifinfomsg, 4-byte aligned.
    let mut at = 32;
    while let (Some(len), Some(kind)) = (ne_u16(b, at), ne_u16(b, at + 2)) {
        let len = usize::from(len);
        if len < 4 {
            break;
        }
        if kind & 0x3fff == IFLA_STATS64 {
            let v = |i: usize| ne_u64(b, at + 4 + 8 * i).context("short IFLA_STATS64");
            // rx_packets, tx_packets, rx_bytes, tx_bytes, rx_errors, tx_errors, rx_dropped,
            // tx_dropped, …
            return Ok(LinkStats {
                rx_packets: v(0)?,
                tx_packets: v(1)?,
                rx_dropped: v(6)?,
                tx_dropped: v(7)?,
            });
        }
        at += (len + 3) & !3;
    }
    bail!("no IFLA_STATS64 in the netlink reply")
}

/// The machine: CPU count and model, kernel, time (UTC).
#[must_use]
pub fn machine() -> String {
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{} CPUs ({model}), Linux {kernel}, {date}", cpu_count())
}

/// `/proc/loadavg`'s 1-, 5- and 15-minute load averages: how busy the (shared) machine was.
#[must_use]
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
