//! `cargo xtask verifier`: load the embedded XDP program with private maps (nothing attached,
//! nothing pinned) and print what the kernel reports about it.

use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use switchyard::dataplane::{load, object};

/// Loads, prints, and unloads (dropping the object closes every descriptor).
pub fn run() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("loading a BPF program needs root (CAP_BPF); run it with sudo");
    }
    let bytes = object::bytes()?;
    let start = Instant::now();
    let ebpf = load::load(None).context("loading the XDP program")?;
    let took = start.elapsed();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "router-ebpf, as embedded in switchyard: object file {} bytes (ELF, with BTF and debug \
         info), loaded and verified in {} ms, kernel {}",
        thousands(bytes.len() as u64),
        took.as_millis(),
        kernel.trim()
    );
    // The kernel's `bpf_prog_info` of each program, as the few numbers printed.
    macro_rules! stats {
        ($info:expr) => {{
            let info = $info.context("BPF_OBJ_GET_INFO_BY_FD")?;
            Stats {
                verified: info.verified_instruction_count(),
                translated: info.size_translated(),
                jitted: info.size_jitted(),
                maps: info.map_ids().ok().flatten().map(|m| m.len()),
            }
        }};
    }
    report(
        object::PROGRAM,
        "the data plane",
        &stats!(load::program(&ebpf)?.info()),
    );
    let ipip = ebpf
        .program(object::IPIP_PROGRAM)
        .with_context(|| format!("the object has no program {}", object::IPIP_PROGRAM))?;
    report(
        object::IPIP_PROGRAM,
        "ipip encapsulation, tail-called from it",
        &stats!(ipip.info()),
    );
    Ok(())
}

/// What the kernel reports about one loaded program.
struct Stats {
    /// Instructions the verifier walked (kernel ≥ 5.16).
    verified: Option<u32>,
    /// Bytes after verification.
    translated: Option<u32>,
    /// Bytes of JIT-compiled code (0: not reported).
    jitted: u32,
    /// Maps it uses.
    maps: Option<usize>,
}

/// Prints what the kernel reports about one loaded program.
fn report(name: &str, what: &str, info: &Stats) {
    println!("\nXDP program `{name}` ({what})");
    match info.verified {
        Some(n) => println!(
            "  verified instructions  {}  (instructions the verifier walked, over all paths)",
            thousands(n.into())
        ),
        None => println!("  verified instructions  not reported (needs kernel ≥ 5.16)"),
    }
    match info.translated {
        // struct bpf_insn is 8 bytes.
        Some(n) => println!(
            "  translated size        {} bytes = {} BPF instructions after verification",
            thousands(n.into()),
            thousands(u64::from(n) / 8)
        ),
        None => println!("  translated size        not reported"),
    }
    match info.jitted {
        0 => println!("  JIT-compiled size      not reported (is net.core.bpf_jit_enable 0?)"),
        n => println!("  JIT-compiled size      {} bytes", thousands(n.into())),
    }
    if let Some(maps) = info.maps {
        println!("  maps                   {maps}");
    }
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
