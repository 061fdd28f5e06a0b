//! A decision group's word: the first packet after the write follows the new decision, every
//! service of the group switches with that one write, and established flows stay where they
//! are.

use std::{net::IpAddr, time::Instant};

use anyhow::{Result, ensure};
use router_common::Reason;
use router_tests::{
    addrs::{CLIENT_V4, VIP_V4, backend_v4},
    lab::Lab,
    packets, privileged,
};
use rules::engine::Action;
use switchyard::config::{
    Agent, Backend, Config, Conntrack, Forward, HashMode, Pool, Protocol, Service, Target,
    WhenAllDown,
    model::{DecisionGroup, DecisionRule, SwitchPolicy},
};

use super::fixture::{Out, Step, To, forwarded, run, step};

/// Services `api` (80) and `ws` (443) on the IPv4 VIP, both decided by group `g` between pools
/// `dc1` (backend 1) and `dc2` (backend 2).
fn config() -> Config {
    let pool = |name: &str, i: usize| Pool {
        name: name.into(),
        backends: vec![Backend {
            address: backend_v4(i).into(),
            weight: 100,
        }],
        health_check: None,
        when_all_down: WhenAllDown::Drop,
        slow_start: None,
        breaker: None,
        adaptive: None,
        on_backend_down: switchyard::config::FlowPolicy::Keep,
    };
    let service = |name: &str, port: u16| Service {
        name: name.into(),
        vip: VIP_V4.into(),
        port,
        protocol: Protocol::Tcp,
        forward: Forward::DsrL2,
        hash: HashMode::FiveTuple,
        to: Target::Decide("g".into()),
    };
    Config {
        agent: Agent::default(),
        fleet: None,
        conntrack: Conntrack::default(),
        announce: None,
        hooks: Vec::new(),
        vips: vec![],
        services: vec![service("api", 80), service("ws", 443)],
        pools: vec![pool("dc1", 1), pool("dc2", 2)],
        state: vec![],
        decisions: vec![DecisionGroup {
            name: "g".into(),
            rules: vec![DecisionRule {
                id: "r".into(),
                priority: 0,
                when: "true".into(),
                then: Action::pool("dc1"),
            }],
            default: None,
            switch: SwitchPolicy::default(),
            require: None,
            automatic: None,
            on_failback: switchyard::config::FlowPolicy::Keep,
        }],
        rules: std::sync::Arc::default(),
    }
}

/// A frame of `src_port → VIP:port`, which must reach backend `to` (by MAC), counted under
/// `reason`.
fn to_backend(name: &str, port: u16, src_port: u16, to: usize, reason: Reason) -> Step {
    let frame = packets::tcp(IpAddr::V4(CLIENT_V4), src_port, VIP_V4.into(), port);
    forwarded(name, frame, reason)
        .out(Out::Mac)
        .to(To::Is(to))
        .into()
}

#[test]
fn the_first_packet_after_a_decision_write_follows_it_for_every_service_of_the_group() -> Result<()>
{
    if privileged::require_root_and_bpf("decision word").is_err() {
        return Ok(());
    }
    let mut lab = Lab::new("dw", 2, &config())?;
    run(
        &mut lab,
        [
            step("publish dc1", |lab, _| {
                let Lab {
                    publisher, maps, ..
                } = lab;
                publisher.publish_decision(maps, "g", &Action::pool("dc1"))?;
                Ok(())
            }),
            to_backend("dc1 first: api", 80, 50000, 1, Reason::NewFlow),
            to_backend("dc1 first: ws", 443, 50000, 1, Reason::NewFlow),
            step("publish dc2", |lab, _| {
                let Lab {
                    publisher, maps, ..
                } = lab;
                let start = Instant::now();
                let word = publisher.publish_decision(maps, "g", &Action::pool("dc2"))?;
                let took = start.elapsed();
                ensure!(word.is_some(), "switching wrote nothing");
                println!(
                    "decision write (one map update, in process): {} µs",
                    took.as_micros()
                );
                Ok(())
            }),
            // The very next packets of new flows, on both services, follow the new word.
            to_backend(
                "api's first new flow after the write",
                80,
                50001,
                2,
                Reason::NewFlow,
            ),
            to_backend(
                "ws's first new flow after the write",
                443,
                50001,
                2,
                Reason::NewFlow,
            ),
            // An established flow stays on its backend (conntrack).
            to_backend(
                "an established flow stays",
                80,
                50000,
                1,
                Reason::ConntrackHit,
            ),
        ],
    )
}
