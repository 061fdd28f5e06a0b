//! The whole system in network namespaces — the announcement interface is the agent's own: an
//! `announce.interface` that names a real interface (here the balancer's own veth) announces
//! nothing and says why, and an announcement interface deleted under a running agent is made
//! again, with its routes, within the once-a-second check.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use router_tests::{
    addrs::VIP_V4,
    agent::Agent,
    config_text::web_pool,
    netns::{Netns, Topology},
    privileged,
};
use switchyard::api::status::Status;

fn config(interface: &str) -> String {
    format!(
        "{}announce:\n  interface: {interface}\n",
        web_pool(2).text()
    )
}

/// Whether `s` reports the VIP announced.
fn announced(s: &Status) -> bool {
    s.vips
        .iter()
        .any(|v| v.address == VIP_V4.to_string() && v.announced == Some(true))
}

/// The agent's routes (protocol 83) to the VIP in `ns`.
fn routes(ns: &Netns) -> Result<String> {
    ns.exec(&[
        "ip",
        "-4",
        "route",
        "show",
        "proto",
        "83",
        &format!("{VIP_V4}/32"),
    ])
}

#[test]
fn an_announce_interface_that_is_a_real_one_announces_nothing_and_says_why() -> Result<()> {
    if privileged::require_root_and_bpf("an_announce_interface_that_is_a_real_one").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let real = topo.lb_interfaces()[0].clone();
    let agent = Agent::start(&topo, &[("10-web.yaml", config(&real))])?;
    let start = Instant::now();
    while !agent.log_text().contains("not a dummy one") {
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "no word of the refused interface:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(!announced(&agent.status()?), "announced on {real}");
    let held = routes(topo.lb())?;
    ensure!(
        held.trim().is_empty(),
        "a route on a real interface: {held}"
    );
    Ok(())
}

#[test]
fn an_announcement_interface_deleted_under_the_agent_comes_back_with_its_routes() -> Result<()> {
    if privileged::require_root_and_bpf("an_announcement_interface_deleted").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let agent = Agent::start(&topo, &[("10-web.yaml", config("sytest0"))])?;
    agent.wait_for(Duration::from_secs(10), announced)?;
    ensure!(!routes(topo.lb())?.trim().is_empty(), "no route");

    topo.lb().exec(&["ip", "link", "del", "sytest0"])?;
    let start = Instant::now();
    while routes(topo.lb())?.trim().is_empty() {
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "the route did not come back:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.wait_for(Duration::from_secs(5), announced)?;
    Ok(())
}
