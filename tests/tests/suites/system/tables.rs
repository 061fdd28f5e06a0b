//! The whole system in network namespaces — identical tables across nodes: two balancers with
//! the same pool build the same Maglev table, entry by entry, even when their histories gave the
//! backends other slots, so either node sends a flow to the same backend (what ECMP in front of
//! a fleet needs). Compared twice: the fingerprint each agent reports in `status`, and the
//! tables read from each node's pinned maps with every slot replaced by its backend's address.

use std::{net::IpAddr, time::Duration};

use anyhow::{Context as _, Result, ensure};
use router_common::{Decision, MAGLEV_SIZE};
use router_tests::{
    addrs::{VIP_V4, backend_v4},
    agent::{Agent, unique_pin_path},
    config_text::ConfigText,
    netns::Topology,
    privileged,
};
use switchyard::{api::status::Status, dataplane::maps::KernelMaps};

/// Pool `web` of backends `order` (1-based, weight 100), at pin path `pin`.
fn config(pin: &str, order: &[usize]) -> String {
    let backends: Vec<(IpAddr, u32)> = order.iter().map(|&i| (backend_v4(i).into(), 100)).collect();
    ConfigText::at_pin_path(pin)
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends, None)
        .text()
}

/// Whether every backend of `web` in `s` is healthy and the pool has a table.
fn settled(s: &Status, backends: usize) -> bool {
    s.pools.iter().any(|p| {
        p.name == "web"
            && p.table.is_some()
            && p.backends.len() == backends
            && p.backends.iter().all(|b| b.healthy)
    })
}

/// The live table of the service's pool, each entry as its backend's address (the first four
/// bytes: IPv4), and each entry's raw slot.
fn table(maps: &KernelMaps) -> Result<(Vec<[u8; 4]>, Vec<u32>)> {
    let (_, service) = maps.services().into_iter().next().context("no service")?;
    let pool = u32::from(Decision::decode(maps.decision(service.decision)?).pool_a);
    let half = maps.pool(pool)?.active;
    let mut slots = Vec::with_capacity(MAGLEV_SIZE as usize);
    for e in 0..MAGLEV_SIZE {
        slots.push(
            maps.table_entry(pool, half, e)
                .context("entry out of the map")?,
        );
    }
    ensure!(
        maps.pool(pool)?.active == half,
        "the table flipped while it was read"
    );
    let mut addresses = Vec::with_capacity(slots.len());
    for &slot in &slots {
        let b = maps.backend(slot)?;
        addresses.push([b.addr[0], b.addr[1], b.addr[2], b.addr[3]]);
    }
    Ok((addresses, slots))
}

fn fingerprint(agent: &Agent) -> Result<String> {
    agent
        .status()?
        .pools
        .into_iter()
        .find(|p| p.name == "web")
        .and_then(|p| p.table)
        .context("no table for web in status")
}

#[test]
fn two_nodes_with_the_same_pool_build_the_same_table_whatever_their_slots() -> Result<()> {
    if privileged::require_root_and_bpf("two_nodes_build_the_same_table").is_err() {
        return Ok(());
    }
    let settle = Duration::from_secs(10);
    let node_a = Topology::builder().backends(3).build()?;
    let node_b = Topology::builder().backends(3).build()?;

    let pin_a = unique_pin_path();
    let a = Agent::start(&node_a, &[("10-web.yaml", config(&pin_a, &[1, 2, 3]))])?;
    a.wait_for(settle, |s| settled(s, 3))?;

    // Node b ran with backends 3 and 2 first: they took the first slots.
    let pin_b = unique_pin_path();
    let b = Agent::start(&node_b, &[("10-web.yaml", config(&pin_b, &[3, 2]))])?;
    b.wait_for(settle, |s| settled(s, 2))?;
    b.write_file("10-web.yaml", &config(&pin_b, &[1, 2, 3]))?;
    b.reload()?;
    b.wait_for(settle, |s| settled(s, 3))?;

    let (addresses_a, slots_a) = table(&KernelMaps::open_pinned(&a.pin_dir())?)?;
    let (addresses_b, slots_b) = table(&KernelMaps::open_pinned(&b.pin_dir())?)?;
    ensure!(
        slots_a != slots_b,
        "the two histories gave the backends the same slots"
    );
    let differ = addresses_a
        .iter()
        .zip(&addresses_b)
        .filter(|(x, y)| x != y)
        .count();
    ensure!(
        differ == 0,
        "{differ} of {MAGLEV_SIZE} entries name other backends"
    );
    for i in 1..=3 {
        let octets = backend_v4(i).octets();
        ensure!(addresses_a.contains(&octets), "backend {i} is in no entry");
    }
    let (fa, fb) = (fingerprint(&a)?, fingerprint(&b)?);
    ensure!(fa == fb, "status fingerprints differ: {fa} and {fb}");

    // A weight changed on one node only: the fingerprints tell.
    b.write_file(
        "10-web.yaml",
        &config(&pin_b, &[1, 2, 3]).replacen("weight: 100", "weight: 150", 1),
    )?;
    b.reload()?;
    b.wait_for(settle, |s| {
        s.pools
            .iter()
            .any(|p| p.backends.iter().any(|b| b.weight == 150))
    })?;
    let fb = fingerprint(&b)?;
    ensure!(
        fa != fb,
        "a node with other weights reports the same fingerprint {fa}"
    );
    Ok(())
}
