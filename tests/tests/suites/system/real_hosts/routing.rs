//! Routing on the lb: a backend behind a router is reached through it, and DSR and NAT are
//! served with the lb's IP forwarding off.

use anyhow::{Result, ensure};
use router_tests::netns::Topology;

use super::{hosts, only_from, services, sysctl, tally};

/// A backend behind a router (lb → router → backend) is served with NAT: the lb's next hop
/// for it is the router, and its replies come back through the router to the lb.
#[test]
fn a_routed_backend_is_served_through_its_router() -> Result<()> {
    let test = "a_routed_backend_is_served_through_its_router";
    let builder = Topology::builder().backends(1).routed_backend();
    // Backend 2 is the routed one (numbered after the one attached directly).
    let pool = [2];
    let Some(hosts) = hosts(test, builder, "nat", &pool)? else {
        return Ok(());
    };
    ensure!(hosts.topo.routed_backend() == Some(2));
    for (what, addr) in services() {
        let tally = tally(&hosts, what, addr, 20)?;
        println!("nat via the router, {what}: {tally:?}");
        only_from(what, &tally, 20, &pool)?;
    }
    let routed = &hosts.servers[1];
    ensure!(
        routed.tcp_connections() == 40 && routed.udp_datagrams() >= 40,
        "the routed backend saw {} connections and {} datagrams",
        routed.tcp_connections(),
        routed.udp_datagrams()
    );
    Ok(())
}

/// With IP forwarding off on the lb (the kernel's default, which the topology keeps), every
/// service is served over both backends.
fn served_with_forwarding_off(test: &str, forward: &str) -> Result<()> {
    let pool = [1, 2];
    let Some(hosts) = hosts(test, Topology::builder().backends(2), forward, &pool)? else {
        return Ok(());
    };
    let lb = hosts.topo.lb();
    ensure!(sysctl(lb, "net.ipv4.ip_forward")? == "0");
    ensure!(sysctl(lb, "net.ipv6.conf.all.forwarding")? == "0");
    for (what, addr) in services() {
        let tally = tally(&hosts, what, addr, 40)?;
        println!("{forward} with forwarding off, {what}: {tally:?}");
        only_from(what, &tally, 40, &pool)?;
        ensure!(
            tally.len() == 2,
            "{what}: one backend got nothing: {tally:?}"
        );
    }
    Ok(())
}

#[test]
fn dsr_is_served_with_forwarding_off() -> Result<()> {
    served_with_forwarding_off("dsr_is_served_with_forwarding_off", "dsr-l2")
}

#[test]
fn nat_is_served_with_forwarding_off() -> Result<()> {
    served_with_forwarding_off("nat_is_served_with_forwarding_off", "nat")
}
