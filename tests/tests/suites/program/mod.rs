//! The XDP program as a pure function of (maps, frames), through `BPF_PROG_TEST_RUN`, with real
//! maps filled by the real publisher and the routes of a real topology ([`router_tests::lab`]).
//!
//! Most suites here are fixture tables run by [`fixture::run`]: frames in sequence, each with
//! the verdict, the reason counter and the output (MACs, addresses, every checksum recomputed
//! here, independently of the program) it must get, against the services of
//! [`fixture_config`]. The fuzz run checks hostile frames against an independent oracle; the
//! verifier suite loads the object itself.
//!
//! Privileged: needs root and BPF. Without them these tests say so loudly and return; under
//! `CI=true` that is a failure.

mod backend_down;
mod classes;
mod conntrack;
mod decision;
mod fixture;
mod flow_state;
mod fragments;
mod fuzz;
mod icmp;
mod ipip;
mod malformed;
mod nat;
mod next_hops;
mod second_chance;
mod selection;
mod signals;
mod table;
mod verifier;
mod vip;

use std::net::{IpAddr, Ipv4Addr};

use router_tests::{
    addrs::{CLIENT_V4, CLIENT_V6, VIP_V4, VIP_V6, backend_v4, backend_v6},
    lab::{Lab, pool},
    privileged,
};
use switchyard::config::{
    Agent, Config, Conntrack, Forward, HashMode, Protocol, Service, SplitShare, Target, WhenAllDown,
};

const BACKENDS: usize = 3;
const OTHER_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 99);

fn svc(
    name: &str,
    vip: IpAddr,
    port: u16,
    protocol: Protocol,
    forward: Forward,
    to: &str,
) -> Service {
    Service {
        name: name.into(),
        vip,
        port,
        protocol,
        forward,
        hash: HashMode::FiveTuple,
        to: Target::Pool(to.into()),
    }
}

/// The services every fixture table runs against: on the IPv4 VIP `web` (80, TCP, DSR), `dns`
/// (53, UDP, NAT), `api` (8080, TCP, NAT), `sticky` (443, source-IP hash), `split` (8443, half
/// to `web`, half to `solo`), `closed` (81, pool down, drop) and `open` (82, pool down, pass);
/// on the IPv6 VIP `web6` (80, DSR) and `dns6` (53, NAT). `web` and `web6` migrate the flows
/// of a down backend. [`lab`] marks the only backends of `drop` and `pass` down.
fn fixture_config() -> Config {
    let v4: Vec<IpAddr> = (1..=BACKENDS).map(|i| backend_v4(i).into()).collect();
    let v6: Vec<IpAddr> = (1..=BACKENDS).map(|i| backend_v6(i).into()).collect();
    let vip4 = IpAddr::V4(VIP_V4);
    let vip6 = IpAddr::V6(VIP_V6);
    let mut sticky = svc("sticky", vip4, 443, Protocol::Tcp, Forward::DsrL2, "web");
    sticky.hash = HashMode::SourceIp;
    let mut split = svc("split", vip4, 8443, Protocol::Tcp, Forward::DsrL2, "web");
    split.to = Target::Split(vec![
        SplitShare {
            pool: "web".into(),
            weight: 1,
        },
        SplitShare {
            pool: "solo".into(),
            weight: 1,
        },
    ]);
    Config {
        agent: Agent {
            pin_path: "/sys/fs/bpf/x".into(),
            ..Agent::default()
        },
        fleet: None,
        conntrack: Conntrack::default(),
        announce: None,
        hooks: Vec::new(),
        vips: vec![],
        services: vec![
            svc("web", vip4, 80, Protocol::Tcp, Forward::DsrL2, "web"),
            svc("dns", vip4, 53, Protocol::Udp, Forward::Nat, "web"),
            svc("web6", vip6, 80, Protocol::Tcp, Forward::DsrL2, "web6"),
            svc("dns6", vip6, 53, Protocol::Udp, Forward::Nat, "web6"),
            svc("api", vip4, 8080, Protocol::Tcp, Forward::Nat, "web"),
            sticky,
            split,
            svc("closed", vip4, 81, Protocol::Tcp, Forward::DsrL2, "drop"),
            svc("open", vip4, 82, Protocol::Tcp, Forward::DsrL2, "pass"),
        ],
        pools: vec![
            migrating(pool("web", v4, WhenAllDown::Drop)),
            migrating(pool("web6", v6, WhenAllDown::Drop)),
            pool("solo", vec![backend_v4(1).into()], WhenAllDown::Drop),
            pool("drop", vec![backend_v4(2).into()], WhenAllDown::Drop),
            pool("pass", vec![backend_v4(3).into()], WhenAllDown::Pass),
        ],
        state: vec![],
        decisions: vec![],
        classes: Vec::new(),
        rules: std::sync::Arc::default(),
    }
}

/// `pool` with `on_backend_down: migrate`: the fixtures of re-selection take a backend down.
fn migrating(mut pool: switchyard::config::Pool) -> switchyard::config::Pool {
    pool.on_backend_down = switchyard::config::FlowPolicy::Migrate;
    pool
}

/// The program loaded with [`fixture_config`], `drop`'s and `pass`'s backends down; `None`
/// when `tag` cannot run here.
fn lab(tag: &str) -> Option<Lab> {
    if privileged::require_root_and_bpf(tag).is_err() {
        return None;
    }
    let mut lab = Lab::new(tag, BACKENDS, &fixture_config()).expect("lab");
    lab.set_health("drop", &backend_v4(2).to_string(), false)
        .expect("health");
    lab.set_health("pass", &backend_v4(3).to_string(), false)
        .expect("health");
    Some(lab)
}

fn c4() -> IpAddr {
    CLIENT_V4.into()
}
fn c6() -> IpAddr {
    CLIENT_V6.into()
}
fn v4() -> IpAddr {
    VIP_V4.into()
}
fn v6() -> IpAddr {
    VIP_V6.into()
}
