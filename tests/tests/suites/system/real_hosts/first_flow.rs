//! A pool without a health check is served from its first flow, DSR and NAT.

use std::time::Instant;

use anyhow::{Context as _, Result};
use router_tests::{client::Tally, netns::Topology};

use super::{first_tcp, first_udp, hosts, only_from, services, tally};

/// The first flow of every service is served — right after the agent answers, with no
/// health check to wait for, so the next hops must be there from the start.
fn first_flow_is_served(test: &str, forward: &str) -> Result<()> {
    let pool = [1, 2];
    let Some(hosts) = hosts(test, Topology::builder().backends(2), forward, &pool)? else {
        return Ok(());
    };
    let client = hosts.topo.client();
    for (what, addr) in services() {
        let started = Instant::now();
        let first = if what.starts_with("TCP") {
            first_tcp(client, addr)
        } else {
            first_udp(client, addr)
        }
        .with_context(|| format!("{what}: {}", hosts.agent.log_text()))?;
        println!(
            "{forward} {what}: the first flow was served by {first} in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        only_from(what, &Tally::from([(first, 1)]), 1, &pool)?;
        only_from(what, &tally(&hosts, what, addr, 20)?, 20, &pool)?;
    }
    Ok(())
}

#[test]
fn a_pool_without_health_check_is_served_from_the_first_flow_with_dsr() -> Result<()> {
    first_flow_is_served(
        "a_pool_without_health_check_is_served_from_the_first_flow_with_dsr",
        "dsr-l2",
    )
}

#[test]
fn a_pool_without_health_check_is_served_from_the_first_flow_with_nat() -> Result<()> {
    first_flow_is_served(
        "a_pool_without_health_check_is_served_from_the_first_flow_with_nat",
        "nat",
    )
}
