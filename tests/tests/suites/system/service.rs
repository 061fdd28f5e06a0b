//! The agent as its systemd unit runs it (`switchyard.service` of the Debian package): the
//! unit's `ExecStart` line with `$SWITCHYARD_OPTS` expanded and `/usr/bin/switchyard` the built
//! binary, the interfaces in `SWITCHYARD_IFACES`, under the unit's `CapabilityBoundingSet`
//! (setpriv), with `NOTIFY_SOCKET` a datagram socket of the test, as systemd would give it.
//! `READY=1` arrives once the program runs on every interface and the API answers; SIGHUP (the
//! unit's `ExecReload`) brings `RELOADING=1` with the monotonic time, then `READY=1` once the
//! changed directory runs; SIGTERM brings `STOPPING=1`, exit status 0, and the same programs
//! stay attached. With no interface named, the unit's command exits 2 (which the unit does not
//! restart) with a journal-priority error line naming `SWITCHYARD_IFACES`.

use std::{
    os::unix::{fs::MetadataExt as _, net::UnixDatagram},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::VIP_V4,
    agent::{self, Agent, temp_dir, unique_pin_path},
    config_text::{ConfigText, backends_v4},
    netns::Topology,
    privileged,
};

/// The unit the package installs.
const UNIT: &str = include_str!("../../../../router-userspace/package/switchyard.service");

/// The value of `key=` in the unit (its last setting).
fn setting(key: &str) -> Result<&'static str> {
    UNIT.lines()
        .rev()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .with_context(|| format!("the unit has no {key}="))
}

/// The unit's `ExecStart` as systemd runs it: `$SWITCHYARD_OPTS` split into `opts`' words
/// (an unset variable gives none), `/usr/bin/switchyard` replaced by `bin`.
fn exec_start(bin: &Path, opts: &str) -> Result<Vec<String>> {
    let line = setting("ExecStart")?;
    let mut words = Vec::new();
    for word in line.split_whitespace() {
        match word {
            "/usr/bin/switchyard" => words.push(bin.display().to_string()),
            "$SWITCHYARD_OPTS" => words.extend(opts.split_whitespace().map(str::to_owned)),
            w if w.starts_with('$') => bail!("ExecStart uses {w}, which this test does not set"),
            w => words.push(w.to_owned()),
        }
    }
    ensure!(
        words.first().map(String::as_str) == Some(&*bin.display().to_string()),
        "ExecStart does not run /usr/bin/switchyard: {line}"
    );
    Ok(words)
}

/// The unit's `CapabilityBoundingSet` as setpriv's `--bounding-set` argument.
fn bounding_set() -> Result<String> {
    let mut arg = "-all".to_owned();
    for cap in setting("CapabilityBoundingSet")?.split_whitespace() {
        let name = cap
            .strip_prefix("CAP_")
            .with_context(|| format!("capability {cap}"))?;
        arg.push_str(",+");
        arg.push_str(&name.to_ascii_lowercase());
    }
    Ok(arg)
}

/// The next notification (one datagram: `KEY=VALUE` lines) within `limit`; the agent's log
/// in the error.
fn next_notification(sock: &UnixDatagram, limit: Duration, agent: &Agent) -> Result<String> {
    sock.set_read_timeout(Some(limit))?;
    let mut buf = [0u8; 4096];
    match sock.recv(&mut buf) {
        Ok(n) => Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e) => bail!(
            "no notification within {limit:?} ({e}); the agent's log:\n{}",
            agent.log_text()
        ),
    }
}

fn says(message: &str, state: &str) -> bool {
    message.lines().any(|l| l == state)
}

#[test]
fn the_unit_s_command_notifies_ready_reload_and_stop_and_leaves_the_program() -> Result<()> {
    if privileged::require("service", &["setpriv"]).is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let pin = unique_pin_path();
    let web = ConfigText::at_pin_path(&pin)
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&[100, 100]), None)
        .text();
    let interfaces = topo.lb_interfaces();
    let names: Vec<&str> = interfaces.iter().map(String::as_str).collect();
    let notify_dir = temp_dir("notify")?;
    let notify_path: PathBuf = notify_dir.join("notify");
    let sock = UnixDatagram::bind(&notify_path)?;
    let bin = agent::binary()?;
    let caps = bounding_set()?;
    let lb = topo.lb().clone();
    let mut launch_error = None;
    let mut agent = Agent::launch_command_in(topo.lb(), &[("10-web.yaml", web)], &names, |dir| {
        let opts = format!("--config-dir {}", dir.display());
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", lb.path().display())).args([
            "setpriv",
            "--bounding-set",
            &caps,
        ]);
        match exec_start(&bin, &opts) {
            Ok(words) => {
                cmd.args(words);
            }
            Err(e) => launch_error = Some(e),
        }
        cmd.env("NOTIFY_SOCKET", &notify_path)
            .env("SWITCHYARD_IFACES", interfaces.join(" "))
            .env("SWITCHYARD_OPTS", opts);
        cmd
    })?;
    if let Some(e) = launch_error {
        return Err(e);
    }

    // READY=1 only once the program runs on every interface and the API answers.
    let ready = next_notification(&sock, Duration::from_secs(30), &agent)?;
    ensure!(says(&ready, "READY=1"), "first notification: {ready:?}");
    let mut programs = Vec::new();
    for iface in &interfaces {
        let id = topo.lb().xdp_program_id(iface)?;
        ensure!(id.is_some(), "{iface}: no program at READY=1");
        programs.push(id);
    }
    let status = agent
        .status()
        .context("the API does not answer at READY=1")?;
    ensure!(
        status.services.iter().any(|s| s.name == "web"),
        "web is not running at READY=1"
    );
    println!("READY=1 with programs {programs:?} on {interfaces:?}");

    // SIGHUP: RELOADING=1 with the monotonic time, then READY=1 once the directory runs.
    let dns = ConfigText::without_agent()
        .service("dns", VIP_V4.into(), "udp", "dsr-l2", "web")
        .text();
    agent.write_file("20-dns.yaml", &dns)?;
    agent.send_signal(libc::SIGHUP)?;
    let reloading = next_notification(&sock, Duration::from_secs(10), &agent)?;
    ensure!(
        says(&reloading, "RELOADING=1")
            && reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "after SIGHUP: {reloading:?}"
    );
    let reloaded = next_notification(&sock, Duration::from_secs(10), &agent)?;
    ensure!(
        says(&reloaded, "READY=1"),
        "after RELOADING=1: {reloaded:?}"
    );
    let status = agent.status()?;
    ensure!(
        status.services.iter().any(|s| s.name == "dns") && status.rejected.is_none(),
        "dns is not running at READY=1 after the reload"
    );

    // SIGTERM: STOPPING=1, exit 0, the same programs attached.
    agent.send_signal(libc::SIGTERM)?;
    let stopping = next_notification(&sock, Duration::from_secs(10), &agent)?;
    ensure!(says(&stopping, "STOPPING=1"), "after SIGTERM: {stopping:?}");
    let exited = agent.stop()?.context("the agent was not running")?;
    ensure!(
        exited.success(),
        "the agent exited with {exited} on SIGTERM:\n{}",
        agent.log_text()
    );
    for (iface, before) in interfaces.iter().zip(&programs) {
        let after = topo.lb().xdp_program_id(iface)?;
        ensure!(
            after == *before,
            "{iface}: program {before:?} before SIGTERM, {after:?} after"
        );
    }
    let _ = std::fs::remove_dir_all(&notify_dir);
    Ok(())
}

#[test]
fn the_unit_s_command_without_interfaces_exits_2_with_a_journal_error() -> Result<()> {
    let bin = agent::binary()?;
    let dir = temp_dir("no-ifaces")?;
    let stderr_path = dir.join("stderr");
    let stderr = std::fs::File::create(&stderr_path)?;
    let meta = stderr.metadata()?;
    let words = exec_start(&bin, "")?;
    let start = Instant::now();
    let status = Command::new(&words[0])
        .args(&words[1..])
        .env("SWITCHYARD_IFACES", " ")
        // stderr is this file, as it is the journal's stream under systemd.
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .status()?;
    let text = std::fs::read_to_string(&stderr_path)?;
    let _ = std::fs::remove_dir_all(&dir);
    ensure!(status.code() == Some(2), "exit {status}: {text}");
    ensure!(
        setting("RestartPreventExitStatus")?
            .split_whitespace()
            .any(|s| s == "2"),
        "the unit restarts on exit status 2"
    );
    ensure!(
        text.starts_with("<3>switchyard attach: no interface to attach to")
            && text.contains("SWITCHYARD_IFACES"),
        "{text:?}"
    );
    ensure!(start.elapsed() < Duration::from_secs(10), "it did not exit");
    Ok(())
}
