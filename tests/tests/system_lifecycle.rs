//! The whole system in network namespaces — the agent's lifecycle and bad input: a start that
//! must fail changes nothing (broken config, missing interface, an interface another XDP
//! program holds); a broken reload keeps the running config and a fixed one applies; on
//! SIGTERM the agent exits, the program stays attached and keeps balancing, and `switchyard
//! detach` removes it; a pinned link whose interface was deleted and created again, or which
//! belongs to another namespace's interface, is replaced rather than adopted, and status tells
//! live links from defunct ones; status and ctl find an agent on a non-default API while a
//! fragment is broken. Each test builds its own topology and agent.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, VIP_V4, backend_name, lb_backend_if, vip_v4},
    agent::{Agent, Exited, pins_under},
    client::{self, Tally},
    config_text::{ConfigText, backends_v4},
    netns::Topology,
    privileged, servers, xdp_pass,
};
use switchyard::dataplane::attach;

/// How long a start that must fail may take (the program load dominates).
const EXIT_LIMIT: Duration = Duration::from_secs(20);

/// A fragment with two mistakes: an unknown pool (line 7) and a misspelt key (line 11).
const BROKEN: &str = "services:
  - name: dns
    vip: 198.18.0.10
    port: 80
    protocol: udp
    forward: dsr-l2
    to: { pool: wbe }
pools:
  - name: extra
    backends: [ { address: 198.18.11.11 } ]
    health_check: { tcp: { port: 80 }, intervall: 1s }
";

/// [`BROKEN`] corrected.
const FIXED: &str = "services:
  - name: dns
    vip: 198.18.0.10
    port: 80
    protocol: udp
    forward: dsr-l2
    to: { pool: web }
pools:
  - name: extra
    backends: [ { address: 198.18.11.11 } ]
    health_check: { tcp: { port: 80 }, interval: 1s }
";

/// The errors [`BROKEN`] must be reported with, as `FILE:LINE PATH`.
fn broken_errors(file: &str) -> [String; 2] {
    [
        format!("{file}:7 services[0].to.pool: unknown pool \"wbe\""),
        format!("{file}:11 pools[0].health_check.intervall: unknown key"),
    ]
}

/// TCP on the IPv4 VIP over backends `1..=n`, equal weights.
fn web(n: usize) -> ConfigText {
    ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&vec![100; n]), None)
}

/// The lb's interfaces in `topo`: the client side, then each backend side.
fn lb_interfaces(topo: &Topology) -> Vec<String> {
    let mut all = vec![LB_CLIENT_IF.to_owned()];
    all.extend((1..=topo.backend_count()).map(lb_backend_if));
    all
}

/// Checks no lb interface but `except` has an XDP program.
fn no_xdp_on_lb(topo: &Topology, except: Option<&str>) -> Result<()> {
    for iface in lb_interfaces(topo) {
        if Some(iface.as_str()) != except {
            let prog = topo.lb().xdp_program(&iface)?;
            ensure!(prog.is_none(), "{iface} has XDP program {prog:?}");
        }
    }
    Ok(())
}

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

/// Checks every one of `backends` backends got at least 20 % of `tally` (300 flows, p = 1/3:
/// about 5 standard deviations below the mean).
fn check_spread(what: &str, tally: &Tally, backends: usize) -> Result<()> {
    let n = client::total(tally);
    println!("{what}: {n} connections: {tally:?}");
    for i in 1..=backends {
        let got = tally.get(&backend_name(i)).copied().unwrap_or(0);
        ensure!(got * 5 >= n, "{what}: {} got {got} of {n}", backend_name(i));
    }
    Ok(())
}

#[test]
fn attach_with_a_broken_config_file_exits_non_zero_reports_every_error_and_attaches_nothing()
-> Result<()> {
    if privileged::require_root_and_bpf("attach_with_a_broken_config_file").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let cfg = web(1);
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
    let cfg = web(1);
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
    let cfg = web(1);
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
fn a_broken_reload_keeps_the_running_config_and_a_fixed_one_applies() -> Result<()> {
    if privileged::require_root_and_bpf("a_broken_reload_keeps_the_running_config").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", web(2).text())])?;
    let first = agent.status()?.generation;

    agent.write_file("20-extra.yaml", BROKEN)?;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| s.rejected.is_some())?;
    let status = agent.status()?;
    let rejected = status.rejected.clone().unwrap_or_default();
    println!(
        "broken reload: generation {first} → {}; status reports:\n{rejected}",
        status.generation
    );
    ensure!(status.generation == first, "the broken config was applied");
    for error in broken_errors("20-extra.yaml") {
        ensure!(rejected.contains(&error), "status lacks {error:?}");
    }
    let human = agent.cli(&["status", "--config-dir", &agent.dir().display().to_string()])?;
    ensure!(
        human.contains("the last change was rejected"),
        "`switchyard status` does not say the change was rejected:\n{human}"
    );
    let tcp = client::tcp_tally(topo.client(), vip_v4(80), 100)?;
    println!("still serving with the old config: {tcp:?}");
    ensure!(client::total(&tcp) == 100 && tcp.len() == 2, "{tcp:?}");

    agent.write_file("20-extra.yaml", FIXED)?;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| {
        s.generation > first && s.rejected.is_none()
    })?;
    let generation = agent.status()?.generation;
    // The fixed fragment's UDP service now answers, over the old pool.
    let udp = client::udp_tally(topo.client(), vip_v4(80), 30).context("the new UDP service")?;
    println!("fixed reload: generation {first} → {generation}; new UDP service answers {udp:?}");
    ensure!(client::total(&udp) == 30);
    Ok(())
}

#[test]
fn on_sigterm_the_agent_exits_and_the_program_keeps_balancing_until_detach() -> Result<()> {
    if privileged::require_root_and_bpf("on_sigterm_the_agent_exits").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(3).text())])?;
    check_spread(
        "with the agent",
        &client::tcp_tally(topo.client(), vip_v4(80), 300)?,
        3,
    )?;

    let sent = Instant::now();
    let exit = agent.stop()?.context("the agent was not running")?;
    println!("agent exited {exit} {:?} after SIGTERM", sent.elapsed());
    ensure!(exit.success(), "the agent exited with {exit}");
    for iface in lb_interfaces(&topo) {
        let prog = topo.lb().xdp_program(&iface)?;
        ensure!(
            prog.as_deref().is_some_and(|p| p.contains("switchyard")),
            "{iface} lost the program: {prog:?}"
        );
    }
    let dir = agent.dir().display().to_string();
    let gone = agent
        .cli(&["status", "--config-dir", &dir])
        .err()
        .context("status answered without an agent")?;
    println!("status without the agent: {gone:#}");
    ensure!(
        format!("{gone:#}")
            .contains("interfaces with a pinned program: to-b1, to-b2, to-b3, to-client")
    );

    let before: Vec<u64> = servers.iter().map(|s| s.tcp_connections()).collect();
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 300)?;
    check_spread("after the agent exited (last maps)", &tally, 3)?;
    for (s, b) in servers.iter().zip(before) {
        ensure!(s.tcp_connections() - b == tally[s.name()] as u64);
    }

    let mut args = vec!["detach"];
    let ifaces = lb_interfaces(&topo);
    for iface in &ifaces {
        args.extend(["--iface", iface.as_str()]);
    }
    args.extend(["--config-dir", &dir]);
    print!("{}", agent.cli(&args)?);
    no_xdp_on_lb(&topo, None)?;
    let pins = pins_under(&agent.pin_dir());
    ensure!(pins.is_empty(), "detach left pins: {pins:?}");
    Ok(())
}

/// `text` without the lines that mention `needle`.
fn without(text: &str, needle: &str) -> String {
    text.lines()
        .filter(|l| !l.contains(needle))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn a_service_removed_while_the_agent_was_stopped_is_gone_after_it_restarts() -> Result<()> {
    if privileged::require_root_and_bpf("a_service_removed_while_stopped").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let both = web(2)
        .service("dns", VIP_V4.into(), "udp", "dsr-l2", "web")
        .text();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", both.clone())])?;
    let udp = client::udp_tally(topo.client(), vip_v4(80), 10)?;
    ensure!(client::total(&udp) == 10, "the UDP service does not answer");

    agent.stop()?;
    agent.write_file("10-web.yaml", &without(&both, "name: dns"))?;
    agent.restart()?;
    let status = agent.status()?;
    ensure!(status.services.len() == 1, "{:?}", status.services);
    let maps = switchyard::dataplane::maps::KernelMaps::open_pinned(&agent.pin_dir())?;
    let services = maps.services();
    ensure!(
        services.len() == 1,
        "the data plane still balances {} services after the restart: {services:?}",
        services.len()
    );
    Ok(())
}

#[test]
fn established_connections_survive_an_agent_restart_after_a_pool_change() -> Result<()> {
    if privileged::require_root_and_bpf("established_connections_survive_a_restart").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let b = |i: usize| {
        (
            std::net::IpAddr::from(router_tests::addrs::backend_v4(i)),
            100,
        )
    };
    let first = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &[b(1), b(2)], None)
        .text();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", first.clone())])?;
    // b1 leaves, b3 arrives: [b2, b3], in slots 1 and 2 while this agent runs (a fresh
    // agent numbers them 0 and 1).
    let addr = |i: usize| b(i).0.to_string();
    let second = first
        .replace(&addr(2), &addr(3))
        .replace(&addr(1), &addr(2));
    agent.write_file("10-web.yaml", &second)?;
    let generation = agent.status()?.generation;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| s.generation > generation)?;
    let mut sessions = client::tcp_sessions(topo.client(), vip_v4(80), 40)?;
    for (k, s) in sessions.iter_mut().enumerate() {
        s.echo(&client::payload(k, 256))?;
    }
    // A restart with the same config must not move a single connection.
    agent.restart()?;
    let mut broken = Vec::new();
    for (k, mut s) in sessions.into_iter().enumerate() {
        let backend = s.backend().to_owned();
        if let Err(e) = s
            .echo(&client::payload(k + 100, 256))
            .and_then(|()| s.finish())
        {
            broken.push(format!("{backend}: {e:#}"));
        }
    }
    ensure!(
        broken.is_empty(),
        "{} of 40 connections broke across the restart: {broken:?}",
        broken.len()
    );
    Ok(())
}

#[test]
fn a_sighup_storm_with_status_polls_and_an_emptied_config_leaves_a_working_agent() -> Result<()> {
    if privileged::require_root_and_bpf("a_sighup_storm").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let cfg = web(2).text();
    let agent = Agent::start(&topo, &[("10-web.yaml", cfg.clone())])?;
    let first = agent.status()?.generation;
    // 200 reloads as fast as signals go, status read in between.
    for i in 0..200 {
        agent.reload()?;
        if i % 20 == 0 {
            agent.status()?;
        }
    }
    // The directory did not change, so no reload applied anything (an unchanged content hash
    // is a no-op): same generation, nothing rejected, still balancing.
    std::thread::sleep(Duration::from_millis(300));
    let after = agent.status()?;
    ensure!(
        after.generation == first && after.rejected.is_none(),
        "an unchanged config was applied or rejected: generation {first} → {}, {:?}",
        after.generation,
        after.rejected
    );
    check_spread(
        "after the storm",
        &client::tcp_tally(topo.client(), vip_v4(80), 100)?,
        2,
    )?;
    // Every service and pool removed: nothing is balanced, nothing breaks.
    let pin = cfg.lines().take(2).collect::<Vec<_>>().join("\n");
    agent.write_file("10-web.yaml", &format!("{pin}\n"))?;
    let generation = agent.status()?.generation;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| {
        s.generation > generation && s.services.is_empty() && s.pools.is_empty()
    })?;
    let maps = switchyard::dataplane::maps::KernelMaps::open_pinned(&agent.pin_dir())?;
    ensure!(maps.services().is_empty(), "{:?}", maps.services());
    // And back.
    agent.write_file("10-web.yaml", &cfg)?;
    let generation = agent.status()?.generation;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| s.generation > generation)?;
    check_spread(
        "after emptying and restoring",
        &client::tcp_tally(topo.client(), vip_v4(80), 100)?,
        2,
    )?;
    Ok(())
}

#[test]
fn a_second_agent_on_the_same_pin_path_refuses_to_start_and_leaves_the_first_alone() -> Result<()> {
    if privileged::require_root_and_bpf("a_second_agent_on_the_same_pin_path").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let cfg = web(2);
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
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
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

/// The lb-side end of a veth pair of the test's own inside the lb namespace (its peer is
/// [`EXTRA_PEER`]), for a test that deletes an interface the agent is attached to and creates
/// it again without breaking the topology's own.
const EXTRA_IF: &str = "sy-extra0";
/// The peer of [`EXTRA_IF`], in the lb namespace too.
const EXTRA_PEER: &str = "sy-extra1";

/// Creates the [`EXTRA_IF`] veth pair in the lb namespace, both ends up.
fn add_extra_veth(topo: &Topology) -> Result<()> {
    topo.lb().ip_batch(&[
        format!("link add {EXTRA_IF} type veth peer name {EXTRA_PEER}"),
        format!("link set {EXTRA_IF} up"),
        format!("link set {EXTRA_PEER} up"),
    ])
}

/// Deletes the [`EXTRA_IF`] veth pair (deleting one end deletes both).
fn delete_extra_veth(topo: &Topology) -> Result<()> {
    topo.lb().ip(&["link", "del", EXTRA_IF]).map(drop)
}

/// `status`'s `link` of `iface`.
fn link_of(status: &switchyard::api::status::Status, iface: &str) -> Option<String> {
    status
        .interfaces
        .iter()
        .find(|i| i.name == iface)
        .map(|i| i.link.clone())
}

#[test]
fn a_link_whose_interface_was_created_again_is_replaced_and_status_tells_live_from_defunct()
-> Result<()> {
    if privileged::require_root_and_bpf("a_link_whose_interface_was_created_again").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    add_extra_veth(&topo)?;
    let first_index = topo.lb().ip(&["-o", "link", "show", "dev", EXTRA_IF])?;
    let mut agent = Agent::start_on(
        &topo,
        &[("10-web.yaml", web(1).text())],
        &[LB_CLIENT_IF, EXTRA_IF],
    )?;
    let status = agent.status()?;
    for iface in [LB_CLIENT_IF, EXTRA_IF] {
        ensure!(
            link_of(&status, iface).as_deref() == Some("live"),
            "{iface}: {:?}",
            status.interfaces
        );
    }

    // The interface is deleted and created again (same name, new ifindex) while no agent runs:
    // the pinned link survives with no interface.
    agent.stop()?;
    delete_extra_veth(&topo)?;
    add_extra_veth(&topo)?;
    let second_index = topo.lb().ip(&["-o", "link", "show", "dev", EXTRA_IF])?;
    println!("{EXTRA_IF} before: {first_index}{EXTRA_IF} after: {second_index}");
    ensure!(topo.lb().xdp_program(EXTRA_IF)?.is_none());
    ensure!(
        attach::link_path(&agent.pin_dir(), EXTRA_IF).exists(),
        "the pinned link went with its interface"
    );
    agent.relaunch()?;
    let log = agent.log_text();
    ensure!(
        log.contains(&format!(
            "{EXTRA_IF}: link_{EXTRA_IF} was defunct (interface gone): attached anew"
        )),
        "the restarted agent did not say it attached anew:\n{log}"
    );
    ensure!(
        log.contains(&format!(
            "{LB_CLIENT_IF}: adopted the program already attached"
        )),
        "the live link was not adopted:\n{log}"
    );
    let status = agent.status()?;
    println!("after the restart: {:?}", status.interfaces);
    let extra = status
        .interfaces
        .iter()
        .find(|i| i.name == EXTRA_IF)
        .context("no status of the extra interface")?;
    ensure!(extra.link == "live", "{extra:?}");
    let program = extra
        .program_id
        .context("no program on the new interface")?;
    let shown = topo.lb().xdp_program(EXTRA_IF)?;
    println!("ip -d link show dev {EXTRA_IF}: {shown:?}");
    ensure!(
        shown
            .as_deref()
            .is_some_and(|p| p.starts_with(&format!("id {program} ")) && p.contains("switchyard")),
        "{EXTRA_IF} does not run program {program}: {shown:?}"
    );
    ensure!(link_of(&status, LB_CLIENT_IF).as_deref() == Some("live"));

    // Deleted while the agent runs: status says the link is defunct.
    delete_extra_veth(&topo)?;
    agent.wait_for(Duration::from_secs(5), |s| {
        link_of(s, EXTRA_IF).as_deref() == Some("defunct (interface gone)")
    })?;
    let dir = agent.dir().display().to_string();
    let human = agent.cli(&["status", "--config-dir", &dir])?;
    print!("{human}");
    ensure!(
        human.contains(&format!("{EXTRA_IF} (link DEFUNCT (interface gone)")),
        "the text status does not say the link is defunct:\n{human}"
    );
    // No program to upgrade behind a defunct link: refused, naming it.
    let refused = agent
        .cli(&["upgrade", "--iface", EXTRA_IF, "--config-dir", &dir])
        .err()
        .context("upgrade accepted a defunct link")?;
    println!("upgrade: {refused:#}");
    ensure!(
        format!("{refused:#}").contains("is defunct (interface gone)"),
        "{refused:#}"
    );
    // Detach removes it, and says it was defunct.
    let out = agent.cli(&[
        "detach",
        "--iface",
        EXTRA_IF,
        "--keep-maps",
        "--config-dir",
        &dir,
    ])?;
    print!("{out}");
    ensure!(
        out.contains(&format!(
            "{EXTRA_IF}: removed the defunct link (interface gone)"
        )),
        "{out}"
    );
    ensure!(!attach::link_path(&agent.pin_dir(), EXTRA_IF).exists());
    agent.wait_for(Duration::from_secs(5), |s| {
        link_of(s, EXTRA_IF).as_deref() == Some("none")
    })?;
    Ok(())
}

#[test]
fn a_link_pinned_for_an_interface_of_another_namespace_is_not_adopted() -> Result<()> {
    if privileged::require_root_and_bpf("a_link_of_another_namespace").is_err() {
        return Ok(());
    }
    // Two lb namespaces, each with a `to-client`, and agents sharing one pin path (bpffs is
    // the same in both).
    let ours = Topology::builder().backends(1).build()?;
    let theirs = Topology::builder().backends(1).build()?;
    let cfg = web(1).text();
    let mut first = Agent::start_on(&theirs, &[("10-web.yaml", cfg.clone())], &[LB_CLIENT_IF])?;
    first.stop()?;
    ensure!(theirs.lb().xdp_program(LB_CLIENT_IF)?.is_some());
    let second = Agent::start_on(&ours, &[("10-web.yaml", cfg)], &[LB_CLIENT_IF])?;
    let log = second.log_text();
    let said = log
        .lines()
        .find(|l| l.contains(&format!("link_{LB_CLIENT_IF} was defunct (")))
        .with_context(|| format!("the other namespace's link was adopted:\n{log}"))?;
    println!("{said}");
    ensure!(said.ends_with("attached anew (native mode)"), "{said}");
    let status = second.status()?;
    ensure!(link_of(&status, LB_CLIENT_IF).as_deref() == Some("live"));
    let program = status.interfaces[0].program_id.context("no program")?;
    let shown = ours.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(
        shown
            .as_deref()
            .is_some_and(|p| p.starts_with(&format!("id {program} "))),
        "this namespace's {LB_CLIENT_IF} does not run program {program}: {shown:?}"
    );
    // The link pinned there was the only reference to the other namespace's attachment.
    let left = theirs.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(left.is_none(), "the other namespace still runs {left:?}");
    drop(second);
    drop(first);
    Ok(())
}

#[test]
fn status_and_ctl_reach_an_agent_on_a_non_default_api_while_a_fragment_is_broken() -> Result<()> {
    if privileged::require_root_and_bpf("status_reaches_an_agent_on_a_non_default_api").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let cfg = web(1)
        .text()
        .replacen("agent:\n", "agent:\n  api: 127.0.0.1:9911\n", 1);
    let mut agent = Agent::start(&topo, &[("10-web.yaml", cfg)])?;
    let record = switchyard::record::record_path(
        std::path::Path::new(switchyard::record::RUN_DIR),
        agent.dir(),
    );
    let text = std::fs::read_to_string(&record)
        .with_context(|| format!("no record at {}", record.display()))?;
    println!("{}: {text}", record.display());
    ensure!(text.contains("\"api\":\"127.0.0.1:9911\""), "{text}");

    // A second agent for the same directory, started in another namespace (so its API binds),
    // is refused by the pin-directory lock before it records anything: the running agent's
    // record stays.
    let other = Topology::builder().backends(1).build()?;
    let refused = std::process::Command::new("nsenter")
        .arg(format!("--net={}", other.lb().path().display()))
        .arg(router_tests::agent::binary()?)
        .args(["attach", "--iface", LB_CLIENT_IF, "--config-dir"])
        .arg(agent.dir())
        .stdin(std::process::Stdio::null())
        .output()?;
    ensure!(
        !refused.status.success(),
        "a second agent for the same directory started"
    );
    ensure!(
        std::fs::read_to_string(&record).ok().as_deref() == Some(text.as_str()),
        "the refused agent replaced or removed the running one's record: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    drop(other);

    agent.write_file("20-broken.yaml", BROKEN)?;
    agent.reload()?;
    // The directory no longer parses, so its `agent.api` is unknown to the CLI: the answer can
    // only come through the agent's record.
    agent.wait_for(Duration::from_secs(5), |s| s.rejected.is_some())?;
    let dir = agent.dir().display().to_string();
    let human = agent.cli(&["status", "--config-dir", &dir])?;
    print!("{human}");
    ensure!(
        human.contains("the last change was rejected"),
        "`switchyard status` does not show the rejection:\n{human}"
    );
    for error in broken_errors("20-broken.yaml") {
        ensure!(human.contains(&error), "status lacks {error:?}:\n{human}");
    }
    let versions = agent.cli(&["ctl", "--config-dir", &dir, "versions"])?;
    print!("{versions}");
    ensure!(
        versions.lines().any(|l| l.starts_with('*')),
        "ctl versions marks no running version"
    );

    // An orderly exit removes the record; status then says where it looked.
    agent.stop()?;
    ensure!(!record.exists(), "the record outlived the agent");
    let gone = agent
        .cli(&["status", "--config-dir", &dir])
        .err()
        .context("status answered without an agent")?;
    println!("without the agent: {gone:#}");
    ensure!(format!("{gone:#}").contains("from the default address"));
    Ok(())
}
