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
    let prog = load::program(&ebpf)?;
    let info = prog.info().context("BPF_OBJ_GET_INFO_BY_FD")?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();

    println!(
        "XDP program `{}` (router-ebpf, as embedded in switchyard)",
        object::PROGRAM
    );
    println!(
        "  object file            {} bytes (ELF, with BTF and debug info)",
        thousands(bytes.len() as u64)
    );
    match info.verified_instruction_count() {
        Some(n) => println!(
            "  verified instructions  {}  (instructions the verifier walked, over all paths)",
            thousands(n.into())
        ),
        None => println!("  verified instructions  not reported (needs kernel ≥ 5.16)"),
    }
    match info.size_translated() {
        // struct bpf_insn is 8 bytes.
        Some(n) => println!(
            "  translated size        {} bytes = {} BPF instructions after verification",
            thousands(n.into()),
            thousands(u64::from(n) / 8)
        ),
        None => println!("  translated size        not reported"),
    }
    match info.size_jitted() {
        0 => println!("  JIT-compiled size      not reported (is net.core.bpf_jit_enable 0?)"),
        n => println!("  JIT-compiled size      {} bytes", thousands(n.into())),
    }
    if let Ok(Some(maps)) = info.map_ids() {
        println!("  maps                   {}", maps.len());
    }
    println!("  load + verify time     {} ms", took.as_millis());
    println!("  kernel                 {}", kernel.trim());
    Ok(())
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
