//! Connection tracking: a flow's later packets stay on the backend its first packet reached, and
//! a backend that goes down (or is evicted by a drain's timeout) loses its tracked flows to a
//! fresh selection while the flows of the healthy backends stay where they are; a draining
//! backend keeps them.

use anyhow::{Result, ensure};
use router_common::Reason;
use router_tests::{addrs::backend_v4, packets};

use super::fixture::nat;
use super::fixture::{
    Step, To, check, count, drain, dropped, forwarded, health, on_cpu, run, step,
};
use super::{c4, fixture_config, lab, v4};
use switchyard::{config::Forward, health::Drain, publish::Publisher};

#[test]
fn a_flow_stays_on_its_backend_through_conntrack() -> Result<()> {
    let Some(mut lab) = lab("fx-ct") else {
        return Ok(());
    };
    let frame = packets::tcp(c4(), 41000, v4(), 80);
    let mut table: Vec<Step> = vec![
        forwarded("first packet", frame.clone(), Reason::NewFlow)
            .to(To::Record("flow".into()))
            .into(),
        count("hits", Reason::ConntrackHit),
    ];
    for k in 1..=5 {
        table.push(
            forwarded(&format!("packet {k}"), frame.clone(), Reason::ConntrackHit)
                .to(To::Same("flow".into()))
                .into(),
        );
    }
    table.push(check("conntrack hits counted", |lab, memo| {
        ensure!(
            lab.reason(Reason::ConntrackHit) - memo.get("hits")? as u64 == 5,
            "conntrack hits not counted"
        );
        Ok(())
    }));
    run(&mut lab, table)
}

#[test]
fn a_down_backend_loses_its_flows_to_a_fresh_selection() -> Result<()> {
    backend_1_loses_its_flows("fx-down", health("web", backend_v4(1).into(), false))
}

/// A drain's timeout evicts the backend: its entry says so, and its flows are re-selected as
/// a down backend's are.
#[test]
fn an_evicted_backend_loses_its_flows_to_a_fresh_selection() -> Result<()> {
    backend_1_loses_its_flows(
        "fx-evicted",
        drain("web", backend_v4(1).into(), Drain::Evicted),
    )
}

/// The first two packets of a new TCP flow from each of `ports` (a flow is tracked from its
/// second), its backend recorded as `flow PORT`.
fn track(ports: std::ops::Range<u16>) -> Vec<Step> {
    ports
        .flat_map(|p| {
            let name = format!("flow {p}");
            [
                forwarded(&name, packets::tcp(c4(), p, v4(), 80), Reason::NewFlow)
                    .to(To::Record(name.clone()))
                    .into(),
                forwarded(
                    &format!("{name}, tracked"),
                    packets::tcp(c4(), p, v4(), 80),
                    Reason::ConntrackHit,
                )
                .to(To::Same(name))
                .into(),
            ]
        })
        .collect()
}

/// Tracks 30 flows, takes backend 1 out with `out`, and checks that backend 1's flows are
/// re-selected (and counted so) while the others stay where they are.
fn backend_1_loses_its_flows(tag: &str, out: Step) -> Result<()> {
    let Some(mut lab) = lab(tag) else {
        return Ok(());
    };
    let ports = 44000..44030u16;
    let mut table = track(ports.clone());
    table.push(out);
    table.push(count("reselected", Reason::Reselected));
    // A flow of backend 1 is reselected, the others are conntrack hits: checked by counting.
    for p in ports {
        let name = format!("flow {p}");
        table.push(
            forwarded(
                &format!("flow {p} after backend 1 went out"),
                packets::tcp(c4(), p, v4(), 80),
                Reason::NewFlow,
            )
            .any_reason()
            .to(To::Check(Box::new(move |memo, now| {
                let b = memo.get(&name)?;
                ensure!(now != 1, "a flow still reaches backend 1");
                ensure!(
                    b == 1 || now == b,
                    "a flow on a healthy backend moved ({b} → {now})"
                );
                Ok(())
            })))
            .into(),
        );
    }
    table.push(check("reselections counted", |lab, memo| {
        let moved = memo
            .with_prefix("flow ")
            .iter()
            .filter(|b| **b == 1)
            .count() as u64;
        ensure!(moved > 0, "no flow was on backend 1 to begin with");
        ensure!(
            lab.reason(Reason::Reselected) - memo.get("reselected")? as u64 == moved,
            "reselections not counted"
        );
        Ok(())
    }));
    run(&mut lab, table)
}

/// A draining backend keeps its tracked flows: every flow stays where it is.
#[test]
fn a_drained_backend_keeps_its_flows() -> Result<()> {
    let Some(mut lab) = lab("fx-drained") else {
        return Ok(());
    };
    let ports = 44100..44130u16;
    let mut table = track(ports.clone());
    table.push(drain("web", backend_v4(1).into(), Drain::Draining));
    for p in ports {
        let name = format!("flow {p}");
        table.push(
            forwarded(
                &format!("flow {p} while backend 1 drains"),
                packets::tcp(c4(), p, v4(), 80),
                Reason::ConntrackHit,
            )
            .to(To::Check(Box::new(move |memo, now| {
                let b = memo.get(&name)?;
                ensure!(now == b, "a tracked flow moved ({b} → {now})");
                Ok(())
            })))
            .into(),
        );
    }
    table.push(check("backend 1 had flows to keep", |_, memo| {
        ensure!(memo.with_prefix("flow ").contains(&1));
        Ok(())
    }));
    run(&mut lab, table)
}

#[test]
fn a_tracked_flow_ends_with_its_service_and_a_new_one_reselects_it() -> Result<()> {
    let Some(mut lab) = lab("fx-ct-svc") else {
        return Ok(());
    };
    let frame = packets::tcp(c4(), 41500, v4(), 80);
    let without_web = {
        let mut cfg = fixture_config();
        cfg.services.retain(|s| s.name != "web");
        cfg
    };
    let table: Vec<Step> = vec![
        forwarded("first packet", frame.clone(), Reason::NewFlow)
            .to(To::Record("flow".into()))
            .into(),
        forwarded("tracked", frame.clone(), Reason::ConntrackHit)
            .to(To::Same("flow".into()))
            .into(),
        // The flow's conntrack entry outlives the service; its slot no longer holds it.
        step("remove the service", move |lab, memo| {
            memo.set("slot", lab.publisher.services()["web"].value.id as usize);
            lab.apply(&without_web)
        }),
        // The address is still a virtual IP (of the other services): dropped.
        dropped(
            "after the service is gone",
            frame.clone(),
            Reason::VipNoService,
        )
        .into(),
        step("add it back", |lab, _| lab.apply(&fixture_config())),
        check("the service took another slot", |lab, memo| {
            ensure!(
                lab.publisher.services()["web"].value.id as usize != memo.get("slot")?,
                "the service took its old slot back: the test would not show the slot check"
            );
            ensure!(
                lab.maps.conntrack.keys().count() > 0,
                "the flow's entry is gone: the test would not show the slot check"
            );
            Ok(())
        }),
        forwarded(
            "the old entry is re-selected",
            frame.clone(),
            Reason::Reselected,
        )
        .into(),
        forwarded("then tracked again", frame, Reason::ConntrackHit).into(),
    ];
    run(&mut lab, table)
}

#[test]
fn a_renumbering_agent_leaves_no_slot_that_still_serves_an_old_flow() -> Result<()> {
    let Some(mut lab) = lab("fx-ct-renum") else {
        return Ok(());
    };
    let frame = packets::tcp(c4(), 42000, v4(), 443);
    // The agent restarts with no ledger to resume the maps (decision 0008: it renumbers),
    // and a config with fewer services before `sticky`, which is now NAT.
    let changed = {
        let mut cfg = fixture_config();
        cfg.services
            .retain(|s| !["dns", "web6", "dns6", "api"].contains(&s.name.as_str()));
        for s in &mut cfg.services {
            if s.name == "sticky" {
                s.forward = Forward::Nat;
            }
        }
        cfg
    };
    let table: Vec<Step> = vec![
        forwarded("first packet", frame.clone(), Reason::NewFlow)
            .to(To::Record("flow".into()))
            .into(),
        step(
            "an agent renumbers over the adopted maps",
            move |lab, memo| {
                memo.set("slot", lab.publisher.services()["sticky"].value.id as usize);
                // The new agent's resolver reports the same next hops.
                let hops: Vec<_> = lab
                    .publisher
                    .pools()
                    .values()
                    .flat_map(|p| p.backends.iter().map(|b| (b.address, b.hop)))
                    .collect();
                lab.publisher = Publisher::new().requiring_next_hops();
                lab.set_next_hops(&hops)?;
                lab.apply(&changed)?;
                switchyard::agent::remove_unknown_services(&lab.publisher, &mut lab.maps)?;
                ensure!(
                    lab.publisher.services()["sticky"].value.id as usize != memo.get("slot")?,
                    "sticky kept its slot: the test would not show a stale one"
                );
                Ok(())
            },
        ),
        // Its old slot must no longer serve it: the flow follows the service as it is now
        // (NAT), re-selected, instead of the old slot's value (DSR) forever.
        nat("the old flow after the restart", frame, Reason::Reselected).into(),
    ];
    run(&mut lab, table)
}

/// The backend slot the publisher gave backend `b` (1-based) of the `web` pool.
fn web_slot(lab: &router_tests::lab::Lab, b: usize) -> Result<u32> {
    let addr = std::net::IpAddr::from(backend_v4(b));
    lab.publisher.pools()["web"]
        .backends
        .iter()
        .find(|x| x.address == addr)
        .map(|x| x.slot)
        .ok_or_else(|| anyhow::anyhow!("no slot for backend {b}"))
}

/// The conntrack key of a TCP flow from the IPv4 client's `sport` to the IPv4 VIP's port 80.
fn web_flow(sport: u16) -> router_common::FlowKey {
    router_common::FlowKey {
        src: switchyard::publish::addr16(c4()),
        dst: switchyard::publish::addr16(v4()),
        sport: sport.to_be(),
        dport: 80u16.to_be(),
        proto: router_common::PROTO_TCP,
        family: router_common::FAMILY_V4,
        _pad: [0; 2],
    }
}

/// A backend of `web` (1-based; all three are up there) other than `b`.
fn another_web_backend(b: usize) -> usize {
    b % 3 + 1
}

/// The flow's first packet: a new flow, its backend remembered as "flow".
fn first_packet(frame: &[u8]) -> Step {
    forwarded("first packet", frame.to_vec(), Reason::NewFlow)
        .to(To::Record("flow".into()))
        .into()
}

/// Its second packet: a conntrack hit on the same backend, which puts the flow in this CPU's
/// flow cache.
fn second_packet(frame: &[u8]) -> Step {
    forwarded(
        "second packet, cached",
        frame.to_vec(),
        Reason::ConntrackHit,
    )
    .to(To::Same("flow".into()))
    .into()
}

/// The flow cache's lease, as a row count.
const LEASE: usize = router_common::FLOW_CACHE_LEASE as usize;

#[test]
fn a_cached_flow_follows_its_rewritten_conntrack_entry_within_the_lease() -> Result<()> {
    let Some(mut lab) = lab("fx-fc-rewrite") else {
        return Ok(());
    };
    let port = 45_000;
    let frame = packets::tcp(c4(), port, v4(), 80);
    let mut table: Vec<Step> = vec![
        on_cpu(0),
        first_packet(&frame),
        second_packet(&frame),
        // Another writer (another CPU, the agent, an operator with bpftool) moves the flow.
        step("rewrite the flow's conntrack entry", move |lab, memo| {
            let to = another_web_backend(memo.get("flow")?);
            memo.set("moved", to);
            let entry = router_common::FlowEntry {
                backend: web_slot(lab, to)?,
                service: lab.publisher.services()["web"].value.id,
                seen: lab.now()?,
                state: router_common::FLOW_TCP_OPEN,
                _pad: [0; 3],
            };
            lab.maps.conntrack.insert(web_flow(port), entry, 0)?;
            Ok(())
        }),
    ];
    // Within the lease, a packet may still take the cached backend; none goes anywhere else.
    for k in 0..LEASE {
        table.push(
            forwarded(
                &format!("within the lease {k}"),
                frame.clone(),
                Reason::ConntrackHit,
            )
            .to(To::Check(Box::new(|memo, now| {
                ensure!(
                    now == memo.get("flow")? || now == memo.get("moved")?,
                    "a cached flow went to backend {now}"
                );
                Ok(())
            })))
            .into(),
        );
    }
    for k in 0..3 {
        table.push(
            forwarded(
                &format!("after the lease {k}"),
                frame.clone(),
                Reason::ConntrackHit,
            )
            .to(To::Same("moved".into()))
            .into(),
        );
    }
    run(&mut lab, table)
}

#[test]
fn a_cached_flow_whose_conntrack_entry_is_lost_stays_on_its_backend_and_is_tracked_again()
-> Result<()> {
    let Some(mut lab) = lab("fx-fc-delete") else {
        return Ok(());
    };
    let port = 45_100;
    let frame = packets::tcp(c4(), port, v4(), 80);
    let mut table: Vec<Step> = vec![
        on_cpu(0),
        first_packet(&frame),
        second_packet(&frame),
        // Evicted while the cache served it, or deleted by an operator.
        step("delete the flow's conntrack entry", move |lab, _| {
            lab.maps.conntrack.remove(&web_flow(port))?;
            Ok(())
        }),
        count("new flows", Reason::NewFlow),
    ];
    for k in 0..=LEASE {
        table.push(
            forwarded(&format!("packet {k}"), frame.clone(), Reason::ConntrackHit)
                .to(To::Same("flow".into()))
                .into(),
        );
    }
    table.push(check("tracked again, never selected", move |lab, memo| {
        ensure!(
            lab.reason(Reason::NewFlow) == memo.get("new flows")? as u64,
            "the flow was selected again"
        );
        let entry = lab.maps.conntrack.get(&web_flow(port), 0)?;
        ensure!(
            entry.backend == web_slot(lab, memo.get("flow")?)?,
            "the flow is tracked on another backend"
        );
        Ok(())
    }));
    run(&mut lab, table)
}

#[test]
fn a_reselected_flow_stays_on_its_new_backend_when_the_old_one_returns() -> Result<()> {
    let Some(mut lab) = lab("fx-fc-reselect") else {
        return Ok(());
    };
    let frame = packets::tcp(c4(), 45_200, v4(), 80);
    let mut table: Vec<Step> = vec![
        on_cpu(0),
        first_packet(&frame),
        second_packet(&frame),
        step("its backend goes down", |lab, memo| {
            let b = memo.get("flow")?;
            lab.set_health("web", &backend_v4(b).to_string(), false)
        }),
        forwarded("re-selected", frame.clone(), Reason::Reselected)
            .to(To::Other("flow".into()))
            .into(),
        forwarded("on its new backend", frame.clone(), Reason::ConntrackHit)
            .to(To::Record("new".into()))
            .into(),
        step("the old backend returns", |lab, memo| {
            let b = memo.get("flow")?;
            lab.set_health("web", &backend_v4(b).to_string(), true)
        }),
    ];
    // Past a whole lease: neither the cached copy nor conntrack sends it back.
    for k in 0..=LEASE {
        table.push(
            forwarded(&format!("packet {k}"), frame.clone(), Reason::ConntrackHit)
                .to(To::Same("new".into()))
                .into(),
        );
    }
    run(&mut lab, table)
}

#[test]
fn three_flows_of_one_cache_set_keep_their_backends() -> Result<()> {
    let Some(mut lab) = lab("fx-fc-set") else {
        return Ok(());
    };
    // Two ways per set: the third flow of a set displaces the oldest, which is read from
    // conntrack again on its next packet.
    let set =
        |p: u16| router_common::hash::flow_cache_set(router_common::hash::flow_words(&web_flow(p)));
    let first = 46_000u16;
    let ports: Vec<u16> = std::iter::once(first)
        .chain(
            (first + 1..u16::MAX)
                .filter(|p| set(*p) == set(first))
                .take(2),
        )
        .collect();
    ensure!(ports.len() == 3, "no three ports share a set");
    let mut table: Vec<Step> = ports
        .iter()
        .map(|p| {
            forwarded(
                &format!("flow {p}"),
                packets::tcp(c4(), *p, v4(), 80),
                Reason::NewFlow,
            )
            .to(To::Record(format!("flow {p}")))
            .into()
        })
        .collect();
    table.push(count("hits", Reason::ConntrackHit));
    for round in 0..4 {
        for p in &ports {
            table.push(
                forwarded(
                    &format!("round {round}, flow {p}"),
                    packets::tcp(c4(), *p, v4(), 80),
                    Reason::ConntrackHit,
                )
                .to(To::Same(format!("flow {p}")))
                .into(),
            );
        }
    }
    table.push(check("every packet a conntrack hit", |lab, memo| {
        ensure!(
            lab.reason(Reason::ConntrackHit) - memo.get("hits")? as u64 == 12,
            "conntrack hits not counted"
        );
        Ok(())
    }));
    run(&mut lab, table)
}

#[test]
fn a_flow_re_selected_on_another_cpu_is_not_sent_back_by_an_old_copy() -> Result<()> {
    let Some(mut lab) = lab("fx-fc-cpus") else {
        return Ok(());
    };
    if router_tests::bench::host::cpu_count() < 2 {
        eprintln!("fx-fc-cpus: skipped: one CPU");
        return Ok(());
    }
    let frame = packets::tcp(c4(), 45_300, v4(), 80);
    let mut table: Vec<Step> = vec![
        on_cpu(0),
        first_packet(&frame),
        second_packet(&frame),
        step("its backend goes down", |lab, memo| {
            let b = memo.get("flow")?;
            lab.set_health("web", &backend_v4(b).to_string(), false)
        }),
        on_cpu(1),
        forwarded("re-selected on CPU 1", frame.clone(), Reason::Reselected)
            .to(To::Other("flow".into()))
            .to(To::Record("new".into()))
            .into(),
        step("the old backend returns", |lab, memo| {
            let b = memo.get("flow")?;
            lab.set_health("web", &backend_v4(b).to_string(), true)
        }),
        on_cpu(0),
    ];
    // CPU 0's copy names the old backend, well within its lease: its generation changed.
    for k in 0..3 {
        table.push(
            forwarded(
                &format!("back on CPU 0, packet {k}"),
                frame.clone(),
                Reason::ConntrackHit,
            )
            .to(To::Same("new".into()))
            .into(),
        );
    }
    run(&mut lab, table)
}

#[test]
fn a_flow_re_selected_on_another_cpu_after_its_service_moved_slot_is_tracked_here() -> Result<()> {
    let Some(mut lab) = lab("fx-fc-moved") else {
        return Ok(());
    };
    if router_tests::bench::host::cpu_count() < 2 {
        eprintln!("fx-fc-moved: skipped: one CPU");
        return Ok(());
    }
    let frame = packets::tcp(c4(), 45_500, v4(), 80);
    let without_web = {
        let mut cfg = super::fixture_config();
        cfg.services.retain(|s| s.name != "web");
        cfg
    };
    let table: Vec<Step> = vec![
        on_cpu(0),
        first_packet(&frame),
        second_packet(&frame),
        // CPU 0's copy names the service's old slot.
        step(
            "the service leaves and comes back in another slot",
            move |lab, _| {
                lab.apply(&without_web)?;
                lab.apply(&super::fixture_config())
            },
        ),
        on_cpu(1),
        forwarded("re-selected on CPU 1", frame.clone(), Reason::Reselected).into(),
        on_cpu(0),
        // Conntrack has the flow in the new slot: CPU 0's stale copy is not a reason to
        // select it again.
        forwarded("tracked on CPU 0", frame.clone(), Reason::ConntrackHit).into(),
        forwarded("and then", frame, Reason::ConntrackHit).into(),
    ];
    run(&mut lab, table)
}
