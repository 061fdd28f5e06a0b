//! The namespace harness itself, without Switchyard: the topology is built as the README tells
//! an operator to build one and torn down without a trace, its routes and servers answer, and
//! the nftables baseline balances.
//!
//! Each test skips loudly without root and BPF (and fails under `CI=true`).

mod hosts;
mod nft;
mod routes;
mod servers;
mod topology;
mod veth;

use std::net::{IpAddr, SocketAddr};

use router_tests::netns::{Netns, Topology};

fn addr(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

fn topology(backends: usize) -> Topology {
    Topology::builder()
        .backends(backends)
        .build()
        .expect("build topology")
}

fn names(topo: &Topology) -> Vec<String> {
    topo.namespaces()
        .iter()
        .map(|n| n.name().to_owned())
        .collect()
}

/// `sysctl -n key` in `ns`.
fn sysctl(ns: &Netns, key: &str) -> String {
    ns.exec(&["sysctl", "-n", key]).unwrap().trim().to_owned()
}
