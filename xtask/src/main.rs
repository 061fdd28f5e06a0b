//! Switchyard's helpers, run as `cargo xtask COMMAND` (see `cargo xtask --help`).
//!
//! `setup`, `doctor` and `test` need nothing but this crate, so they build on a fresh machine
//! before the eBPF toolchain exists. `demo` and `verifier` need the built XDP program: they
//! set up and build first, then hand over to the `xtask-lab` binary (feature `lab`), which
//! links the namespace harness (`router-tests`) and the switchyard library.

mod doctor;
mod package;
mod suite;
mod workspace;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::workspace::Workspace;

/// Switchyard's developer helpers. Most commands need root (they load BPF programs and create
/// network namespaces).
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    after_help = "New here? `cargo xtask doctor`, then `cargo xtask demo`. \
                  `cargo xtask help COMMAND` says more about each."
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the build and test toolchain; idempotent (root)
    ///
    /// Runs xtask/setup.sh, which installs only what is missing: apt packages (bpftool,
    /// clang, nftables, ethtool, iproute2, util-linux), the nightly toolchain with rust-src,
    /// rustfmt and clippy, and bpf-linker (built with cargo install: a few minutes); and
    /// mounts bpffs at /sys/fs/bpf if nothing is mounted there.
    Setup,
    /// Check every prerequisite and print the fix for what is missing
    ///
    /// Checks root, the kernel version, bpffs at /sys/fs/bpf, the nightly toolchain with
    /// rust-src, bpf-linker, bpftool (optional), ip, nsenter, ethtool, nft, sysctl, and that
    /// bpf(2) can load an XDP program. Prints ✓ or ✗ and a fix for each; exits 1 if anything
    /// required is missing.
    Doctor,
    /// Run the whole system in network namespaces and narrate it (root)
    ///
    /// Sets up, builds switchyard, then builds a client, a load-balancer and 3 backend
    /// namespaces, runs the real `switchyard attach` in the balancer with a config written as
    /// an operator would, sends TCP, UDP and IPv6 traffic and shows which backend served it,
    /// fails a backend and shows how long the agent took to notice and where traffic went,
    /// changes the config by editing a file (applied by the directory watch) and rolls it
    /// back, prints status and metrics, and removes everything again: namespaces, pins, files.
    /// Ctrl-C also removes everything. The first run installs the toolchain (a few minutes).
    Demo {
        /// Before cleaning up, print how to inspect the running system from another shell
        /// (status, ctl, maps, bpftool) and wait for Enter
        #[arg(long)]
        pause: bool,
    },
    /// Run the whole test suite as CI does (root)
    ///
    /// Sets up, builds the `switchyard` binary (the namespace tests run it), then runs
    /// `cargo test --workspace --exclude router-ebpf --features xtask/lab` (router-ebpf builds
    /// only for the BPF target; `lab` adds the demo's tests) with CI=true: a privileged test
    /// that cannot run (no root, no BPF, a missing tool) fails instead of skipping. Ends with a
    /// summary per test binary. Then builds and checks the Debian package (`package --check`).
    Test {
        /// Extra arguments for `cargo test`, after `--` (e.g. `-- --test suites`)
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
    /// Build the Debian package (target/debian/switchyard_*.deb)
    ///
    /// Sets up (cargo-deb is installed by setup), builds the release binary, generates the
    /// shell completions and manual pages from it, and runs `cargo deb --no-build` with the
    /// assets of [package.metadata.deb] in router-userspace/Cargo.toml.
    Package {
        /// Then install it into an empty root with dpkg and check every path the README names,
        /// the conffiles, that the installed binary accepts the installed example config, and
        /// `systemd-analyze verify` on the unit
        #[arg(long)]
        check: bool,
    },
    /// Print the XDP program's verifier statistics (root)
    ///
    /// Builds and loads the XDP program into the kernel with private maps (not attached,
    /// nothing pinned) and prints the instructions the verifier processed and the translated
    /// and JIT-compiled sizes (from `BPF_OBJ_GET_INFO_BY_FD`), then unloads it.
    Verifier,
}

fn run(args: Args) -> Result<ExitCode> {
    let ws = Workspace::locate();
    match args.cmd {
        Cmd::Setup => ws.setup().map(|()| ExitCode::SUCCESS),
        Cmd::Doctor => Ok(doctor::run()),
        Cmd::Demo { pause } => {
            ws.setup()?;
            ws.build_switchyard()?;
            if pause {
                ws.hand_over_to_lab(&["demo", "--pause"])
            } else {
                ws.hand_over_to_lab(&["demo"])
            }
        }
        Cmd::Test { cargo_test_args } => {
            ws.setup()?;
            ws.build_switchyard()?;
            let tests = suite::run(&ws, &cargo_test_args)?;
            // The package is CI's too: it must build, install and verify on every run.
            package::run_package(&ws, true)?;
            Ok(tests)
        }
        Cmd::Package { check } => {
            ws.setup()?;
            package::run_package(&ws, check).map(|_| ExitCode::SUCCESS)
        }
        Cmd::Verifier => ws.hand_over_to_lab(&["verifier"]),
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
