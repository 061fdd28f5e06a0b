//! The half of xtask that needs the built XDP program: `demo` and `verifier`.
//!
//! Run it through `cargo xtask demo` / `cargo xtask verifier`, which set up the toolchain and
//! build the `switchyard` binary first, then build this (feature `lab`) and hand over to it.

mod cleanup;
mod demo;
mod story;
mod verifier;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Switchyard's demo and verifier statistics (run them as `cargo xtask demo` and
/// `cargo xtask verifier`, which build what they need first).
#[derive(Parser)]
#[command(name = "xtask-lab")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The whole system in network namespaces, then everything removed again.
    Demo {
        /// Wait for Enter before cleaning up, to inspect the running system.
        #[arg(long)]
        pause: bool,
    },
    /// Load the XDP program (not attached, no pins) and print the verifier's statistics.
    Verifier,
}

fn main() -> ExitCode {
    let result: Result<()> = match Args::parse().cmd {
        Cmd::Demo { pause } => demo::run(pause),
        Cmd::Verifier => verifier::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
