//! Connection tracking: a flow's later packets stay on the backend its first packet reached, and
//! a backend that goes down loses its tracked flows to a fresh selection while the flows of the
//! healthy backends stay where they are.

use anyhow::{Result, ensure};
use router_common::Reason;
use router_tests::{addrs::backend_v4, packets};

use super::fixture::nat;
use super::fixture::{Step, To, check, count, forwarded, health, pass, run, step};
use super::{c4, fixture_config, lab, v4};
use switchyard::{config::Forward, publish::Publisher};

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
    let Some(mut lab) = lab("fx-down") else {
        return Ok(());
    };
    let ports = 44000..44030u16;
    let mut table: Vec<Step> = ports
        .clone()
        .map(|p| {
            forwarded(
                &format!("flow {p}"),
                packets::tcp(c4(), p, v4(), 80),
                Reason::NewFlow,
            )
            .to(To::Record(format!("flow {p}")))
            .into()
        })
        .collect();
    table.push(health("web", backend_v4(1).into(), false));
    table.push(count("reselected", Reason::Reselected));
    // A flow of backend 1 is reselected, the others are conntrack hits: checked by counting.
    for p in ports {
        let name = format!("flow {p}");
        table.push(
            forwarded(
                &format!("flow {p} after backend 1 went down"),
                packets::tcp(c4(), p, v4(), 80),
                Reason::NewFlow,
            )
            .any_reason()
            .to(To::Check(Box::new(move |memo, now| {
                let b = memo.get(&name)?;
                ensure!(now != 1, "a flow still reaches the down backend");
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
        pass(
            "after the service is gone",
            frame.clone(),
            Reason::NoService,
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
