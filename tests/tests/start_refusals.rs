//! Bad input at start: a config directory that does not exist or cannot be read, a
//! history store that is corrupt or read-only. Each is a clear error and a non-zero exit before
//! anything changes — never a panic, never a detached program: an agent restarted onto a broken
//! store leaves the program the previous agent attached forwarding with its pinned maps.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, VIP_V4, vip_v4},
    agent::{Agent, Exited},
    client,
    config_text::{ConfigText, backends_v4},
    netns::Topology,
    privileged, servers,
};

const EXIT_LIMIT: Duration = Duration::from_secs(20);

fn web(n: usize) -> ConfigText {
    ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&vec![100; n]), None)
}

/// Checks a refused start: non-zero exit, `want` in its output, no panic.
fn refused(what: &str, exited: &Exited, want: &str) -> Result<()> {
    println!(
        "{what}: {}; output:\n{}",
        exited.status,
        exited.output.trim_end()
    );
    ensure!(!exited.status.success(), "{what}: exited successfully");
    ensure!(exited.status.code() == Some(1), "{what}: {}", exited.status);
    ensure!(
        exited.output.contains(want),
        "{what}: output lacks {want:?}"
    );
    ensure!(!exited.output.contains("panicked"), "{what}: panicked");
    Ok(())
}

#[test]
fn a_config_directory_that_is_missing_or_not_a_directory_is_a_clear_error() -> Result<()> {
    if privileged::require_root_and_bpf("a_config_directory_that_is_missing").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let bin = router_tests::agent::binary()?;
    let file = router_tests::agent::temp_dir("not-a-dir")?.join("file");
    std::fs::write(&file, "agent: {}\n")?;
    for (what, dir) in [
        (
            "missing",
            Path::new("/nonexistent/switchyard-test").to_owned(),
        ),
        ("a regular file", file.clone()),
    ] {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", topo.lb().path().display()))
            .arg("timeout")
            .arg("20")
            .arg(&bin)
            .args(["attach", "--iface", LB_CLIENT_IF, "--config-dir"])
            .arg(&dir)
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        println!("{what}: {}: {err}", out.status);
        ensure!(out.status.code() == Some(1), "{what}: {}", out.status);
        ensure!(
            err.contains("cannot read the configuration directory")
                && err.contains(&*dir.to_string_lossy()),
            "{what}: {err}"
        );
        ensure!(!err.contains("panicked"), "{what}: {err}");
        let prog = topo.lb().xdp_program(LB_CLIENT_IF)?;
        ensure!(prog.is_none(), "{what}: a program was attached: {prog:?}");
    }
    let _ = std::fs::remove_dir_all(file.parent().unwrap_or(&file));
    Ok(())
}

/// Starts an agent, checks it balances, stops it (the program stays), breaks its history store
/// with `break_store`, and starts it again: the start must be refused with `want`, and the
/// program must still be attached and balancing with the first agent's maps.
fn restart_onto_a_broken_store(
    what: &str,
    want: &str,
    break_store: impl FnOnce(&Path) -> Result<Option<ReadOnly>>,
) -> Result<()> {
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(2).text())])?;
    let tcp = client::tcp_tally(topo.client(), vip_v4(80), 40)?;
    ensure!(client::total(&tcp) == 40, "{tcp:?}");
    agent.stop()?;
    let before = topo.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(before.is_some(), "no program after the first agent stopped");
    // Declared after `agent`, so dropped (unmounted) before the agent removes its state dir.
    let _undo = break_store(&agent.state_dir())?;
    let exited = agent.relaunch_expecting_exit(EXIT_LIMIT)?;
    refused(what, &exited, want)?;
    let after = topo.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(after == before, "{what}: program {before:?} → {after:?}");
    let tcp = client::tcp_tally(topo.client(), vip_v4(80), 40)?;
    println!("{what}: still balancing: {tcp:?}");
    ensure!(
        client::total(&tcp) == 40 && tcp.len() == 2,
        "{what}: {tcp:?}"
    );
    Ok(())
}

#[test]
fn a_corrupt_history_store_refuses_the_start_and_leaves_the_program_forwarding() -> Result<()> {
    if privileged::require_root_and_bpf("a_corrupt_history_store").is_err() {
        return Ok(());
    }
    restart_onto_a_broken_store("corrupt store", "history.sqlite", |state| {
        std::fs::write(state.join("history.sqlite"), vec![0x5a; 8192])?;
        Ok(None)
    })
}

/// A read-only bind mount of a directory onto itself, undone on drop.
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn mount(dir: &Path) -> Result<Self> {
        let run = |args: &[&str]| -> Result<()> {
            let out = Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .output()?;
            ensure!(
                out.status.success(),
                "mount {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        };
        run(&["--bind"])?;
        let guard = ReadOnly(dir.to_owned());
        run(&["-o", "remount,bind,ro"])?;
        Ok(guard)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_read_only_history_store_refuses_the_start_and_leaves_the_program_forwarding() -> Result<()> {
    if privileged::require_root_and_bpf("a_read_only_history_store").is_err() {
        return Ok(());
    }
    restart_onto_a_broken_store("read-only store", "read-only", |state| {
        ReadOnly::mount(state).map(Some)
    })
}
