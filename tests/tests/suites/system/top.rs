//! `switchyard top` under a real terminal (tmux), against a real agent in the lb namespace,
//! asked with the API token of the config directory (every request needs it): the screen shows
//! the service and its backends, its packets per second under traffic, a decision group's
//! active rule and its switch, and a backend whose
//! health server stops as down within 2 s; `q` exits 0. Started again, it exits non-zero with a
//! message when the agent is killed.

use std::time::Duration;

use anyhow::{Result, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::{Agent, temp_dir},
    client,
    config_text::{ConfigText, FAST_HTTP_CHECK, Group, backends_v4},
    netns::Topology,
    privileged, servers,
    tmux::Tmux,
};

/// What the issue asks: a health change on the screen within this long.
const SHOWN_WITHIN: Duration = Duration::from_secs(2);

/// `switchyard top` of `agent` in a tmux session, its stderr to `stderr`.
fn top(topo: &Topology, agent: &Agent, stderr: &std::path::Path) -> Result<Tmux> {
    let net = format!("--net={}", topo.lb().path().display());
    let bin = agent.bin().display().to_string();
    let dir = agent.dir().display().to_string();
    Tmux::start(
        &["nsenter", &net, &bin, "top", "--config-dir", &dir],
        stderr,
        160,
        40,
    )
}

/// The screen line that shows `address`, if any.
fn line_of<'a>(screen: &'a str, address: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == address))
}

/// The line of decision group `group` (not the service that names it).
fn group_line<'a>(screen: &'a str, group: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.split_whitespace().next() == Some(group))
}

/// The pps column of a service line: `web 198.18.0.10:80/tcp dsr-l2 pool web PPS BPS`.
fn pps_column(line: &str) -> Option<&str> {
    line.split_whitespace().nth(5)
}

#[test]
fn top_shows_the_services_and_a_health_change_and_exits_on_q_and_on_a_lost_agent() -> Result<()> {
    if privileged::require_root_and_bpf("top_shows_the_services").is_err() {
        return Ok(());
    }
    let logs = temp_dir("top")?;
    let outcome = scenario(&logs);
    let _ = std::fs::remove_dir_all(&logs);
    outcome
}

/// The test, with its token and `top`'s stderr in `logs`.
fn scenario(logs: &std::path::Path) -> Result<()> {
    let topo = Topology::builder().backends(2).build()?;
    let mut servers = servers::start_all(&topo)?;
    // Every request needs the token: `top` reads it from the config directory.
    let token_file = logs.join("api.token");
    std::fs::write(&token_file, "9f4c2a7e1b3d5f60718293a4b5c6d7e8\n")?;
    // As the README tells the operator: the token file is the owner's alone.
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    // A second service, decided by group `edge`: pool `web` by default, `spare` (the first
    // backend alone) while `maintenance` holds.
    let cfg = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .deciding_service("dns", VIP_V4.into(), "udp", "dsr-l2", "edge")
        .pool("web", &backends_v4(&[100, 100]), Some(FAST_HTTP_CHECK))
        .pool("spare", &backends_v4(&[100]), None)
        .state("maintenance", "{ push: { default: false } }")
        .decision(
            &Group::new("edge")
                .rule("to-spare", 100, "maintenance", "spare")
                .default_pool("web")
                .switch("{ stable_for: 0s, cooldown: 0s, failback_after: 0s }"),
        )
        .text()
        .replacen(
            "agent:\n",
            &format!("agent:\n  api_token_file: {}\n", token_file.display()),
            1,
        );
    let mut agent = Agent::start(&topo, &[("10-web.yaml", cfg)])?;
    agent.wait_for(Duration::from_secs(5), |s| {
        s.pools.iter().flat_map(|p| &p.backends).all(|b| b.healthy)
    })?;
    let failing = backend_v4(2).to_string();
    let service = format!("{VIP_V4}:80/tcp");

    let t = top(&topo, &agent, &logs.join("first.err"))?;
    let (screen, _) = t.wait_screen(Duration::from_secs(10), |s| {
        s.contains(&service) && line_of(s, &failing).is_some_and(|l| l.contains(" up "))
    })?;
    println!("top at the start:\n{screen}");

    // Traffic: the service's packets per second, from two scrapes of its counters, go above 0
    // for the second after the connections.
    client::tcp_tally(topo.client(), vip_v4(80), 40)?;
    let (screen, _) = t.wait_screen(Duration::from_secs(3), |s| {
        line_of(s, &service).is_some_and(|l| pps_column(l).is_some_and(|p| p != "0" && p != "-"))
    })?;
    println!("top after 40 connections:\n{screen}");

    // The decision group: its active action and rule, then a switch.
    t.wait_screen(Duration::from_secs(3), |s| {
        group_line(s, "edge").is_some_and(|l| l.contains("pool=web") && l.contains("default"))
    })?;
    let dir = agent.dir().display().to_string();
    agent.cli(&[
        "ctl",
        "--config-dir",
        &dir,
        "state",
        "set",
        "maintenance=true",
    ])?;
    let (screen, _) = t.wait_screen(Duration::from_secs(3), |s| {
        group_line(s, "edge").is_some_and(|l| l.contains("pool=spare") && l.contains("to-spare"))
            && s.contains("pool=web → pool=spare")
    })?;
    println!("after the switch:\n{screen}");

    servers[1].kill_health();
    let (screen, took) = t.wait_screen(SHOWN_WITHIN, |s| {
        line_of(s, &failing).is_some_and(|l| l.contains("down"))
    })?;
    println!(
        "{failing} shown down {:.0} ms after its health server stopped:\n{screen}",
        took.as_secs_f64() * 1000.0
    );
    t.send_keys("q")?;
    let code = t.wait_exit(Duration::from_secs(3))?;
    ensure!(code == 0, "top exited {code} on q");

    let stderr = logs.join("second.err");
    let t = top(&topo, &agent, &stderr)?;
    t.wait_screen(Duration::from_secs(10), |s| s.contains(&service))?;
    agent.kill()?;
    let code = t.wait_exit(Duration::from_secs(5))?;
    let message = std::fs::read_to_string(&stderr)?;
    println!("top exited {code} when the agent was killed: {message}");
    ensure!(code != 0, "top exited 0 when the agent was killed");
    ensure!(
        message.contains("lost the agent"),
        "top's message: {message:?}"
    );
    Ok(())
}
