//! `cargo xtask doctor`: every prerequisite of building, testing and running Switchyard,
//! checked and printed with ✓/✗ and the fix for what is missing.

use std::{
    ffi::CString,
    mem,
    process::{Command, ExitCode, Stdio},
};

/// Oldest kernel the project supports: XDP through `bpf_link` (5.9) and `BPF_PROG_TEST_RUN`
/// with an `xdp_md` context, which the program fixtures use (5.15). Developed on 6.18.
const MIN_KERNEL: (u32, u32) = (5, 15);
/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const BPFFS: &str = "/sys/fs/bpf";
const SETUP: &str = "cargo xtask setup";

/// One check's verdict.
struct Check {
    name: &'static str,
    /// A missing optional prerequisite is reported but does not fail `doctor`.
    required: bool,
    /// What was found, or what is wrong and how to fix it.
    outcome: Result<String, Missing>,
}

struct Missing {
    problem: String,
    fix: String,
}

fn missing(problem: impl Into<String>, fix: impl Into<String>) -> Missing {
    Missing {
        problem: problem.into(),
        fix: fix.into(),
    }
}

/// Commands checked: name, the argument that prints its version, whether it is required, and
/// how to install it.
const TOOLS: [(&str, &str, bool, &str); 16] = [
    ("bpf-linker", "--version", true, SETUP),
    (
        "bpftool",
        "--version",
        false,
        "cargo xtask setup (apt-get install bpftool); only needed to inspect maps",
    ),
    (
        "ip",
        "-V",
        true,
        "cargo xtask setup (apt-get install iproute2)",
    ),
    (
        "nsenter",
        "--version",
        true,
        "cargo xtask setup (apt-get install util-linux)",
    ),
    (
        "ethtool",
        "--version",
        true,
        "cargo xtask setup (apt-get install ethtool)",
    ),
    (
        "nft",
        "--version",
        true,
        "cargo xtask setup (apt-get install nftables)",
    ),
    (
        "bird",
        "--version",
        true,
        "cargo xtask setup (apt-get install bird2)",
    ),
    ("sysctl", "-V", true, "apt-get install procps"),
    (
        "etcd",
        "--version",
        true,
        "cargo xtask setup (apt-get install etcd-server); the fleet tests start their own",
    ),
    (
        "etcdctl",
        "version",
        true,
        "cargo xtask setup (apt-get install etcd-client)",
    ),
    (
        "openssl",
        "version",
        true,
        "cargo xtask setup (apt-get install openssl); the etcd TLS test makes its certificates",
    ),
    (
        "dnsmasq",
        "--version",
        true,
        "cargo xtask setup (apt-get install dnsmasq-base); the DNS probe tests start their own",
    ),
    (
        "protoc",
        "--version",
        true,
        "cargo xtask setup (apt-get install protobuf-compiler); etcd-client's build needs it",
    ),
    (
        "cargo-deb",
        "--version",
        true,
        "cargo xtask setup (cargo install cargo-deb); builds the Debian package",
    ),
    (
        "systemd-analyze",
        "--version",
        true,
        "cargo xtask setup (apt-get install systemd); verifies the package's unit",
    ),
    (
        "tmux",
        "-V",
        true,
        "cargo xtask setup (apt-get install tmux); the `switchyard top` test runs it in tmux",
    ),
];

/// Runs every check, prints them, and returns failure if a required one is missing.
pub fn run() -> ExitCode {
    let mut checks = vec![
        Check {
            name: "root",
            required: true,
            outcome: root(),
        },
        Check {
            name: "kernel",
            required: true,
            outcome: kernel(),
        },
        Check {
            name: "bpffs",
            required: true,
            outcome: bpffs(),
        },
        Check {
            name: "nightly toolchain",
            required: true,
            outcome: nightly(),
        },
        Check {
            name: "rust-src (nightly)",
            required: true,
            outcome: rust_src(),
        },
    ];
    let tools = TOOLS;
    for (name, arg, required, fix) in tools {
        checks.push(Check {
            name,
            required,
            outcome: tool(name, arg, fix),
        });
    }
    checks.push(Check {
        name: "bpf(2)",
        required: true,
        outcome: bpf_syscall(),
    });

    println!("Switchyard prerequisites");
    let mut failed = 0;
    for c in &checks {
        match &c.outcome {
            Ok(found) => println!("  ✓ {:<20} {found}", c.name),
            Err(m) => {
                let mark = if c.required { "✗" } else { "!" };
                let note = if c.required { "" } else { " (optional)" };
                println!("  {mark} {:<20} {}{note}", c.name, m.problem);
                println!("    {:<20} fix: {}", "", m.fix);
                if c.required {
                    failed += 1;
                }
            }
        }
    }
    if failed == 0 {
        println!("\nEverything required is present.");
        ExitCode::SUCCESS
    } else {
        println!("\n{failed} required prerequisite(s) missing.");
        ExitCode::FAILURE
    }
}

fn root() -> Result<String, Missing> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        Ok("uid 0".into())
    } else {
        Err(missing(
            format!("running as uid {euid}"),
            "run as root: sudo -E cargo xtask …",
        ))
    }
}

fn kernel() -> Result<String, Missing> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .map_err(|e| {
            missing(
                format!("cannot read the kernel version: {e}"),
                "is /proc mounted?",
            )
        })?;
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let (maj, min) = MIN_KERNEL;
    if version >= MIN_KERNEL {
        Ok(format!("{release} (needs ≥ {maj}.{min})"))
    } else {
        Err(missing(
            format!("{release} is older than {maj}.{min}"),
            format!("boot a kernel ≥ {maj}.{min} (XDP links, BPF_PROG_TEST_RUN with xdp_md)"),
        ))
    }
}

fn bpffs() -> Result<String, Missing> {
    let fix = format!("mount -t bpf bpf {BPFFS}   (or: {SETUP})");
    let path = CString::new(BPFFS).map_err(|_| missing("bad path", fix.clone()))?;
    // SAFETY: `path` is a valid C string and `st` a properly sized, writable out-parameter.
    let mut st: libc::statfs = unsafe { mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &raw mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(missing(format!("{BPFFS}: {e}"), fix));
    }
    if st.f_type as i64 == BPF_FS_MAGIC {
        Ok(format!("mounted at {BPFFS}"))
    } else {
        Err(missing(format!("{BPFFS} is not a BPF filesystem"), fix))
    }
}

/// Stdout of `program args…` if it runs and exits 0.
fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nightly() -> Result<String, Missing> {
    let Some(list) = output("rustup", &["toolchain", "list"]) else {
        return Err(missing(
            "rustup not found",
            "install rustup: https://rustup.rs",
        ));
    };
    list.lines()
        .find(|l| l.starts_with("nightly"))
        .map(|l| l.split_whitespace().next().unwrap_or(l).to_owned())
        .ok_or_else(|| missing("not installed", SETUP))
}

fn rust_src() -> Result<String, Missing> {
    let installed = output(
        "rustup",
        &["component", "list", "--toolchain", "nightly", "--installed"],
    )
    .unwrap_or_default();
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        Ok("installed (build-std for the BPF target)".into())
    } else {
        Err(missing("not installed", SETUP))
    }
}

fn tool(name: &str, arg: &str, fix: &str) -> Result<String, Missing> {
    // Some tools print their version on stderr; a zero exit is what counts.
    match Command::new(name).arg(arg).stdin(Stdio::null()).output() {
        Ok(out) if out.status.success() => {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            let first = String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned();
            Ok(first)
        }
        Ok(out) => Err(missing(
            format!("`{name} {arg}` failed ({})", out.status),
            fix,
        )),
        Err(_) => Err(missing("not found", fix)),
    }
}

/// The head of `union bpf_attr` for `BPF_PROG_LOAD` (`linux/bpf.h`), zero-padded: the kernel
/// accepts a longer attribute whose tail is zero.
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
    tail: [u8; 88],
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TYPE_XDP: u32 = 6;

/// Loads the smallest XDP program (`r0 = XDP_PASS; exit`) with bpf(2) and closes it again.
#[expect(
    clippy::cast_possible_truncation,
    reason = "the instruction count is 2, and bpf(2)'s descriptor is an int that syscall(2) \
              widens to a long"
)]
fn bpf_syscall() -> Result<String, Missing> {
    const XDP_PASS: i32 = 2;
    // struct bpf_insn: code, dst/src registers, 16-bit offset, 32-bit immediate.
    let mut mov = [0xb7, 0, 0, 0, 0, 0, 0, 0]; // BPF_ALU64 | BPF_MOV | BPF_K, r0
    mov[4..].copy_from_slice(&XDP_PASS.to_ne_bytes());
    let exit = [0x95u8, 0, 0, 0, 0, 0, 0, 0]; // BPF_JMP | BPF_EXIT
    let insns = [mov, exit];
    let license = c"GPL";
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
        tail: [0; 88],
    };
    // SAFETY: bpf(2) reads `attr` (size given) and the instruction and license buffers it
    // points to, all of which outlive the call; it returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &raw const attr,
            mem::size_of::<ProgLoadAttr>(),
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let fix = match e.raw_os_error() {
            Some(libc::EPERM) => "run as root (CAP_BPF, CAP_NET_ADMIN)",
            Some(libc::ENOSYS) => "boot a kernel built with CONFIG_BPF_SYSCALL",
            _ => "check `dmesg` and kernel.unprivileged_bpf_disabled",
        };
        return Err(missing(format!("BPF_PROG_LOAD failed: {e}"), fix));
    }
    // SAFETY: `fd` is the descriptor bpf(2) just returned to us.
    unsafe { libc::close(fd as libc::c_int) };
    Ok("loaded and closed a 2-instruction XDP program".into())
}
