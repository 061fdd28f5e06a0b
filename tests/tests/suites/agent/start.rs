//! A start that must fail changes nothing: a broken config, a missing interface, an interface
//! another XDP program holds, a config directory that is missing or not a directory, a second
//! agent on the same pin path — each a clear error and a non-zero exit, nothing attached or
//! pinned, a running agent left alone; and a SIGHUP during the start does not kill the agent.

use std::{
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, lb_backend_if, vip_v4},
    agent::{Agent, Exited},
    client::{self},
    config_text::web_pool,
    netns::Topology,
    privileged, servers, xdp_pass,
};

use crate::common::{
    BROKEN, EXIT_LIMIT, LIVE_LIMIT, Lb, broken_errors, check_spread, no_xdp_on_lb, web,
};

/// Checks a failed start: non-zero exit, and nothing left pinned.
fn check_failed(what: &str, exited: &Exited) -> Result<()> {
    println!(
        "{what}: {}; output:\n{}",
        exited.status,
        exited.output.trim_end()
    );
    ensure!(!exited.status.success(), "{what}: exited successfully");
    ensure!(
        exited.pins_left.is_empty(),
        "{what}: pins left behind: {:?}",
        exited.pins_left
    );
    Ok(())
}

#[test]
fn attach_with_a_broken_config_file_exits_non_zero_reports_every_error_and_attaches_nothing()
-> Result<()> {
    if privileged::require_root_and_bpf("attach_with_a_broken_config_file").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let cfg = web_pool(1);
    let files = [
        ("10-web.yaml", cfg.text()),
        ("20-broken.yaml", BROKEN.to_owned()),
    ];
    let ifaces = [LB_CLIENT_IF, "to-b1"];
    let exited = Agent::attach_expecting_exit(&topo, &files, &ifaces, EXIT_LIMIT)?;
    check_failed("broken config", &exited)?;
    // The config was rejected before anything touched the kernel: not even the pin directory
    // of its valid fragment exists.
    ensure!(
        !std::path::Path::new(cfg.pin_path()).exists(),
        "{} was created",
        cfg.pin_path()
    );
    // Every error, each exactly once.
    for error in broken_errors("20-broken.yaml") {
        let n = exited.output.matches(&error).count();
        ensure!(n == 1, "error {error:?} printed {n} times");
    }
    no_xdp_on_lb(&topo, None)
}

#[test]
fn attach_to_a_missing_interface_fails_clearly_and_attaches_nothing() -> Result<()> {
    if privileged::require_root_and_bpf("attach_to_a_missing_interface").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let cfg = web_pool(1);
    // The client side comes first, so it is attached and must be undone.
    let ifaces = [LB_CLIENT_IF, "to-nowhere"];
    let exited =
        Agent::attach_expecting_exit(&topo, &[("10-web.yaml", cfg.text())], &ifaces, EXIT_LIMIT)?;
    check_failed("missing interface", &exited)?;
    ensure!(
        exited.output.contains("no interface named \"to-nowhere\""),
        "the error does not name the missing interface"
    );
    no_xdp_on_lb(&topo, None)
}

#[test]
fn attach_where_another_xdp_program_runs_fails_clearly_and_leaves_it_attached() -> Result<()> {
    if privileged::require_root_and_bpf("attach_where_another_xdp_program_runs").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let other = xdp_pass::load()?;
    xdp_pass::attach(topo.lb(), LB_CLIENT_IF, &other)?;
    let before = topo.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(
        before.as_deref().is_some_and(|p| p.contains("sy_xdp_pass")),
        "the other program is not attached: {before:?}"
    );
    let cfg = web_pool(1);
    // The backend side comes first, so it is attached and must be undone.
    let ifaces = ["to-b1", LB_CLIENT_IF];
    let exited =
        Agent::attach_expecting_exit(&topo, &[("10-web.yaml", cfg.text())], &ifaces, EXIT_LIMIT)?;
    check_failed("interface in use", &exited)?;
    ensure!(
        exited
            .output
            .contains("interface to-client already has another XDP program attached"),
        "the error does not name the busy interface"
    );
    let after = topo.lb().xdp_program(LB_CLIENT_IF)?;
    println!("to-client before: {before:?}, after: {after:?}");
    ensure!(after == before, "the other program was replaced: {after:?}");
    no_xdp_on_lb(&topo, Some(LB_CLIENT_IF))
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

#[test]
fn a_second_agent_on_the_same_pin_path_refuses_to_start_and_leaves_the_first_alone() -> Result<()> {
    if privileged::require_root_and_bpf("a_second_agent_on_the_same_pin_path").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let cfg = web_pool(2);
    let agent = Agent::start(&topo, &[("10-web.yaml", cfg.text())])?;
    // Another config directory, another API port, the same pin path: it would adopt the
    // running agent's program and maps and write them with its own slot numbering.
    let dir = router_tests::agent::temp_dir("second")?;
    std::fs::write(
        dir.join("10-other.yaml"),
        format!(
            "agent:\n  pin_path: {}\n  api: 127.0.0.1:9901\n",
            cfg.pin_path()
        ),
    )?;
    let mut child = std::process::Command::new("nsenter")
        .arg(format!("--net={}", topo.lb().path().display()))
        .arg(router_tests::agent::binary()?)
        .args(["attach", "--iface", LB_CLIENT_IF, "--config-dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > EXIT_LIMIT {
            // SAFETY: kill(2) on our own child (SIGTERM: the program stays attached).
            unsafe { libc::kill(libc::pid_t::try_from(child.id())?, libc::SIGTERM) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output()?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let status = status.with_context(|| format!("the second agent kept running:\n{text}"))?;
    println!("second agent: {status}: {text}");
    ensure!(!status.success(), "the second agent succeeded:\n{text}");
    ensure!(text.contains("another switchyard agent"), "{text}");
    // The first still runs and balances.
    agent.status()?;
    check_spread(
        "with the first agent",
        &client::tcp_tally(topo.client(), vip_v4(80), 100)?,
        2,
    )?;
    Ok(())
}

/// SIGHUP sent while the agent is still starting (a configuration manager that writes the
/// config and signals a reload right as the service restarts): a reload asked for before the
/// agent is ready must not terminate it (SIGHUP's default action).
#[test]
fn a_sighup_during_start_does_not_kill_the_agent() -> Result<()> {
    let Some(lb) = Lb::start("a_sighup_during_start", 1, |pin| web(pin, "web", &[100]))? else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        mut agent,
        ..
    } = lb;
    agent.stop()?;
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", topo.lb().path().display()))
        .arg(router_tests::agent::binary()?)
        .args([
            "attach",
            "--iface",
            LB_CLIENT_IF,
            "--iface",
            &lb_backend_if(1),
        ])
        .arg("--config-dir")
        .arg(agent.dir())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn()?;
    // Once nsenter has exec'd the agent (a signal before that would be nsenter's), and a little
    // later: into the start (loading and verifying the program takes hundreds of ms), past the
    // process's own few ms of setup before its `main` runs.
    let exe = format!("/proc/{}/exe", child.id());
    let started = Instant::now();
    while !fs::read_link(&exe).is_ok_and(|p| p.ends_with("switchyard")) {
        ensure!(started.elapsed() < LIVE_LIMIT, "the agent never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: kill(2) on our own child (nsenter execs the agent: same pid).
    unsafe { libc::kill(libc::pid_t::try_from(child.id())?, libc::SIGHUP) };
    let ready = agent.wait_for(LIVE_LIMIT, |s| s.generation >= 1);
    let exited = child.try_wait()?;
    // SAFETY: as above.
    unsafe { libc::kill(libc::pid_t::try_from(child.id())?, libc::SIGTERM) };
    let _ = child.wait();
    ensure!(exited.is_none(), "the agent died of the SIGHUP: {exited:?}");
    ready.context("the agent did not come up")?;
    Ok(())
}
