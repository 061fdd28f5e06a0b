//! Builds the XDP programs of `router-ebpf` (every binary: `router`, the data plane,
//! `baseline`, the benchmark baseline, and `decap`, the backends' IP-in-IP decapsulator) for `bpfel-unknown-none` with the nightly toolchain and
//! bpf-linker, with the crate's `programs` feature that enables them. aya-build copies each
//! binary to `OUT_DIR/<bin name>` (`OUT_DIR/router`, `OUT_DIR/baseline`, `OUT_DIR/decap`) for
//! `include_bytes_aligned!`.
//!
//! `AYA_BUILD_SKIP=1` leaves zero-byte stubs instead, so `cargo check`, clippy and the pure
//! tests build on machines without the eBPF toolchain; the loader refuses the stub with a clear
//! message (`dataplane::object`). CI never sets it.
use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?);
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        for bin in ["router", "baseline", "decap"] {
            let stub = out_dir.join(bin);
            fs::write(&stub, []).with_context(|| format!("writing {}", stub.display()))?;
        }
    }
    let manifest_dir = env::var("CARGO_MANIFEST_DIR")?;
    let root_dir = PathBuf::from(manifest_dir).join("../router-ebpf");
    let root_dir = root_dir.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    aya_build::build_ebpf(
        [Package {
            name: "router-ebpf",
            root_dir,
            features: &["programs"],
            ..Default::default()
        }],
        Toolchain::default(),
    )
}
