//! A decision group's word through `BPF_PROG_TEST_RUN`: the first packet after the write
//! follows the new decision, every service of the group switches with that one write, and
//! established flows stay where they are.
//!
//! Privileged: needs root and BPF (skips loudly otherwise; a failure under `CI=true`).

use std::{net::IpAddr, time::Instant};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{CLIENT_V4, VIP_V4, backend_mac, backend_v4},
    lab::Lab,
    packets, privileged,
};
use rules::engine::Action;
use switchyard::config::{
    Agent, Backend, Config, Forward, HashMode, Pool, Protocol, Service, Target, WhenAllDown,
    model::{DecisionGroup, DecisionRule, SwitchPolicy},
};

fn config() -> Config {
    let pool = |name: &str, i: usize| Pool {
        name: name.into(),
        backends: vec![Backend {
            address: backend_v4(i).into(),
            weight: 100,
        }],
        health_check: None,
        when_all_down: WhenAllDown::Drop,
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
        }],
        rules: Default::default(),
    }
}

/// Which backend (1 or 2) a frame of `src_port → VIP:port` goes to.
fn backend(lab: &Lab, port: u16, src_port: u16) -> Result<usize> {
    let run = lab.run(&packets::tcp(
        IpAddr::V4(CLIENT_V4),
        src_port,
        VIP_V4.into(),
        port,
    ))?;
    let mac = run.out.get(..6).context("runt")?;
    (1..=2)
        .find(|i| backend_mac(*i) == mac)
        .with_context(|| format!("action {}", run.action))
}

#[test]
fn the_first_packet_after_a_decision_write_follows_it_for_every_service_of_the_group() -> Result<()>
{
    if privileged::require_root_and_bpf("decision word").is_err() {
        return Ok(());
    }
    let mut lab = Lab::new("dw", 2, &config())?;
    let Lab {
        publisher, maps, ..
    } = &mut lab;
    publisher.publish_decision(maps, "g", &Action::pool("dc1"))?;
    ensure!(
        backend(&lab, 80, 50000)? == 1 && backend(&lab, 443, 50000)? == 1,
        "dc1 first"
    );

    let Lab {
        publisher, maps, ..
    } = &mut lab;
    let start = Instant::now();
    let word = publisher.publish_decision(maps, "g", &Action::pool("dc2"))?;
    let took = start.elapsed();
    ensure!(word.is_some(), "switching wrote nothing");
    // The very next packets of new flows, on both services, follow the new word.
    ensure!(
        backend(&lab, 80, 50001)? == 2,
        "api's first new flow after the write"
    );
    ensure!(
        backend(&lab, 443, 50001)? == 2,
        "ws's first new flow after the write"
    );
    // An established flow stays on its backend (conntrack).
    ensure!(backend(&lab, 80, 50000)? == 1, "an established flow moved");
    println!(
        "decision write (one map update, in process): {} µs",
        took.as_micros()
    );
    Ok(())
}
