//! Switchyard's privileged suites, one test binary, organised by behaviour:
//!
//! - [`program`] — the XDP program as a pure function of (maps, frames), through
//!   `BPF_PROG_TEST_RUN`: fixture tables of frames in sequence and the verdict, reason and
//!   output each must get; the fuzz run and its oracle; the verifier and the object's maps
//! - [`agent`] — the real `switchyard` binary in the lb namespace: start, watch, reload,
//!   versions, history, restart, links, upgrade, API and CLI, overrides, next hops
//! - [`system`] — the whole system with real servers and clients: balance, health, failover,
//!   hitless operation, hosts configured as real ones
//! - [`harness`] — the namespace harness itself, without Switchyard
//! - [`common`] — what several suites share
//!
//! Privileged tests skip loudly without root and BPF, and fail instead under `CI=true`. The
//! agent and system suites run the built `target/<profile>/switchyard`: `cargo build -p
//! router-userspace` first.

mod agent;
mod common;
mod harness;
mod program;
mod system;
