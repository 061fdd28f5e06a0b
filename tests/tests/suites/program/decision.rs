//! A decision group's word: the first packet after the write follows the new decision, every
//! service of the group switches with that one write, and established flows stay where they
//! are.

use std::{net::IpAddr, time::Instant};

use anyhow::{Context as _, Result, ensure};
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
            canary: None,
            split_by: switchyard::config::SplitBy::Flow,
        }],
        classes: Vec::new(),
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
            publish("publish dc1", "dc1"),
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

/// A frame of the SYN of `src_port → VIP:port`, which must reach backend `to`, counted under
/// `reason`.
fn syn_to_backend(name: &str, port: u16, src_port: u16, to: usize, reason: Reason) -> Step {
    let frame = packets::syn(IpAddr::V4(CLIENT_V4), src_port, VIP_V4.into(), port);
    forwarded(name, frame, reason)
        .out(Out::Mac)
        .to(To::Is(to))
        .into()
}

/// A step that publishes `pool=POOL` for group `g`.
fn publish(name: &str, pool: &'static str) -> Step {
    step(name, move |lab, _| {
        let Lab {
            publisher, maps, ..
        } = lab;
        publisher.publish_decision(maps, "g", &Action::pool(pool))?;
        Ok(())
    })
}

fn flush(name: &str) -> Step {
    step(name, |lab, _| {
        lab.flush_conntrack();
        Ok(())
    })
}

/// With `conntrack.second_chance`, a switch that leaves a pool which still serves (dc1 → dc2)
/// flags it (`POOL_F_LEFT_CHANCE`, decision 0035): a TCP segment that opens no connection and
/// has no tracked flow — a connection that began on dc1 and reached a node that never saw its
/// SYN — goes to the backend dc1's table names while the grace lasts; a SYN follows the new
/// decision; once the grace ends, every new flow does.
#[test]
fn after_a_switch_an_untracked_segment_keeps_the_pool_left_during_the_grace() -> Result<()> {
    use std::time::Duration;

    use router_common::POOL_F_LEFT_CHANCE;
    const GRACE: Duration = Duration::from_mins(1);
    if privileged::require_root_and_bpf("left chance").is_err() {
        return Ok(());
    }
    let mut cfg = config();
    cfg.conntrack.second_chance = GRACE;
    let mut lab = Lab::new("lc", 2, &cfg)?;
    run(
        &mut lab,
        [
            publish("publish dc1", "dc1"),
            to_backend("a connection on dc1", 80, 50100, 1, Reason::NewFlow),
            step("switch to dc2", |lab, _| {
                let Lab {
                    publisher, maps, ..
                } = lab;
                publisher.publish_decision(maps, "g", &Action::pool("dc2"))?;
                let dc1 = &publisher.pools()["dc1"];
                ensure!(
                    dc1.flags & POOL_F_LEFT_CHANCE != 0 && dc1.left_chance_until().is_some(),
                    "dc1 is not flagged: {:#x}",
                    dc1.flags
                );
                Ok(())
            }),
            to_backend(
                "tracked, it stays on dc1",
                80,
                50100,
                1,
                Reason::ConntrackHit,
            ),
            flush("the node forgets it, as one ECMP moved it to never knew it"),
            to_backend(
                "untracked, it keeps dc1's backend",
                80,
                50100,
                1,
                Reason::SecondChance,
            ),
            to_backend("tracked where it went", 80, 50100, 1, Reason::ConntrackHit),
            flush("forgotten again"),
            syn_to_backend("a SYN follows the decision", 80, 50100, 2, Reason::NewFlow),
            flush("forgotten again"),
            step("the grace ends", |lab, _| {
                let until = lab.publisher.pools()["dc1"]
                    .left_chance_until()
                    .context("no grace")?;
                lab.publisher.set_now(until);
                let ended = lab.publisher.end_second_chances(&mut lab.maps)?;
                ensure!(ended == ["dc1"], "ended {ended:?}");
                ensure!(lab.publisher.pools()["dc1"].flags & POOL_F_LEFT_CHANCE == 0);
                Ok(())
            }),
            to_backend(
                "after the grace, untracked segments follow the decision",
                80,
                50100,
                2,
                Reason::NewFlow,
            ),
        ],
    )
}

/// Without `conntrack.second_chance`, a switch flags nothing: an untracked segment follows the
/// decision at once.
#[test]
fn without_a_grace_a_switch_gives_no_second_chance() -> Result<()> {
    if privileged::require_root_and_bpf("no left chance").is_err() {
        return Ok(());
    }
    let mut lab = Lab::new("nlc", 2, &config())?;
    run(
        &mut lab,
        [
            publish("publish dc1", "dc1"),
            to_backend("a connection on dc1", 80, 50200, 1, Reason::NewFlow),
            publish("switch to dc2", "dc2"),
            flush("the node forgets it"),
            to_backend("untracked, it follows dc2", 80, 50200, 2, Reason::NewFlow),
        ],
    )
}
