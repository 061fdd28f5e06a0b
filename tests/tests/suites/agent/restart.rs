//! The program outlives its agent: on SIGTERM the agent exits and the program keeps balancing
//! until `detach`; an agent restarted (after SIGTERM or SIGKILL, around applies) adopts the
//! pinned program and maps, runs the directory's config, keeps established connections, and
//! never replaces a missing map pin under the running program with a fresh map.

use std::{
    fmt::Write as _,
    fs,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, vip_v4},
    agent::{Agent, pins_under},
    client::{self},
    config_text::{ConfigText, web_pool},
    netns::Topology,
    privileged,
    servers::{self, BackendServers},
};

use crate::common::{
    LIVE_LIMIT, Lb, check_spread, consistent, dns, lb_interfaces, no_xdp_on_lb, serves, web,
};

#[test]
fn on_sigterm_the_agent_exits_and_the_program_keeps_balancing_until_detach() -> Result<()> {
    if privileged::require_root_and_bpf("on_sigterm_the_agent_exits").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web_pool(3).text())])?;
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

    let before: Vec<u64> = servers
        .iter()
        .map(BackendServers::tcp_connections)
        .collect();
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
    text.lines().filter(|l| !l.contains(needle)).fold(
        String::with_capacity(text.len()),
        |mut out, l| {
            let _ = writeln!(out, "{l}");
            out
        },
    )
}

#[test]
fn a_service_removed_while_the_agent_was_stopped_is_gone_after_it_restarts() -> Result<()> {
    if privileged::require_root_and_bpf("a_service_removed_while_stopped").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let both = web_pool(2)
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

/// SIGKILL at moments around an apply (during the debounce, during the apply, right after),
/// then a restart on the same directory: each time the agent comes back consistent with the
/// maps, runs the directory's config and serves.
#[test]
fn sigkill_around_applies_then_restart_is_consistent() -> Result<()> {
    let Some(lb) = Lb::start("sigkill_around_applies", 3, |pin| {
        web(pin, "web", &[100, 100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        mut agent,
    } = lb;
    for (k, delay) in [150u64, 230, 300].into_iter().enumerate() {
        let weights = [100, 40 + 20 * u32::try_from(k)?, 100];
        agent.write_file("10-web.yaml", &web(&pin, "web", &weights))?;
        agent.write_file(
            "20-dns.yaml",
            &if k % 2 == 0 { dns() } else { String::new() },
        )?;
        std::thread::sleep(Duration::from_millis(delay));
        agent.kill()?;
        agent.relaunch()?;
        agent
            .wait_for(LIVE_LIMIT, |s| {
                s.differs_from_files == Some(false) && s.rejected.is_none()
            })
            .with_context(|| format!("kill {k} after {delay} ms"))?;
        consistent(&agent).with_context(|| format!("kill {k} after {delay} ms"))?;
        let status = agent.status()?;
        let got: Vec<u32> = status.pools[0].backends.iter().map(|b| b.weight).collect();
        ensure!(got == weights, "kill {k}: {got:?}");
        serves(&topo, 5)?;
    }
    Ok(())
}

/// One map pin removed while the agent is stopped (a clean-up script, a hand-run `rm`), the
/// program still attached through its pinned link and using the map. A starting agent that
/// created a fresh map under that name would write a map the running program never reads:
/// every change would be "applied" and none would reach the data plane. It must refuse to
/// start (the program keeps forwarding) or keep using the program's map.
#[test]
fn a_missing_map_pin_under_an_attached_program_is_not_replaced_by_a_fresh_map() -> Result<()> {
    let Some(lb) = Lb::start("a_missing_map_pin", 2, |pin| web(pin, "web", &[100, 100]))? else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        mut agent,
        ..
    } = lb;
    agent.stop()?;
    fs::remove_file(agent.pin_dir().join(router_common::maps::SERVICES))?;
    agent.write_file("20-dns.yaml", &dns())?;
    if let Ok(exited) = agent.relaunch_expecting_exit(Duration::from_secs(10)) {
        // Refused: with a clear error, and the old program still forwards.
        ensure!(!exited.status.success(), "{}", exited.output);
        ensure!(
            exited.output.contains(router_common::maps::SERVICES),
            "the refusal does not name the map:\n{}",
            exited.output
        );
        serves(&topo, 5)
    } else {
        // Running: then the change must reach the program.
        agent.wait_for(LIVE_LIMIT, |s| s.services.len() == 2)?;
        let udp = client::udp_tally(topo.client(), vip_v4(80), 5)
            .context("the new service does not reach the running program")?;
        ensure!(client::total(&udp) == 5, "{udp:?}");
        Ok(())
    }
}

/// The agent's time in the pinned `CLOCK` map (`router_common::CLOCK_AGENT`), in ns.
fn agent_time(agent: &Agent) -> Result<u64> {
    use aya::maps::{Array, Map, MapData};
    let path = agent.pin_dir().join(router_common::maps::CLOCK);
    let data = MapData::from_pin(&path).with_context(|| format!("{}", path.display()))?;
    let clock: Array<MapData, u64> = Array::try_from(Map::Array(data))?;
    Ok(clock.get(&router_common::CLOCK_AGENT, 0)?)
}

/// Polls the agent's time until it passes `past`, for up to 5 s; returns it.
fn agent_time_past(agent: &Agent, past: u64) -> Result<u64> {
    let start = Instant::now();
    loop {
        let t = agent_time(agent)?;
        if t > past {
            return Ok(t);
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "the program's clock stayed at {t} ns, not past {past}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_programs_clock_runs_with_the_agent_and_a_restart_resumes_it_where_it_stopped() -> Result<()>
{
    if privileged::require_root_and_bpf("the_programs_clock_runs_with_the_agent").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web_pool(1).text())])?;
    let first = agent_time(&agent)?;
    let later = agent_time_past(&agent, first + 250_000_000)?;
    println!("the clock ran from {first} to {later} ns");
    agent.stop()?.context("the agent was not running")?;
    let stopped = agent_time(&agent)?;
    // The downtime: real time the clock must not count.
    let down = Duration::from_secs(1);
    std::thread::sleep(down);
    ensure!(
        agent_time(&agent)? == stopped,
        "the clock moved while no agent ran"
    );
    let relaunched = Instant::now();
    agent.relaunch()?;
    let resumed = agent_time_past(&agent, stopped)?;
    let since = u64::try_from(relaunched.elapsed().as_nanos())?;
    println!("stopped at {stopped} ns, resumed to {resumed} ns within {since} ns of the relaunch");
    // Resumed from where it stopped: it advanced by no more than the time since the relaunch
    // (plus one step), not by the downtime too.
    ensure!(
        resumed - stopped <= since + 100_000_000,
        "the clock jumped by {} ns over a restart {since} ns ago (down {down:?})",
        resumed - stopped
    );
    Ok(())
}
