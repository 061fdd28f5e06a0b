//! `NEXT_HOPS`, the map the agent's resolver writes: a resolved next hop gives the frame its
//! MACs (hit); a changed one is used from the next packet on, tracked flows included (changed);
//! an unresolved backend takes no new flows while its tracked flow stays on the last next hop,
//! and a packet that still reaches a slot without a resolved next hop is dropped with
//! `no_next_hop` (miss).

use std::net::IpAddr;

use anyhow::{Context as _, Result};
use router_common::Reason;
use router_tests::{
    addrs::{self, backend_v4},
    lab::next_hop,
    packets,
};
use switchyard::dataplane::Dataplane as _;

use super::fixture::{Fields, Out, Step, To, Verdict, dropped, dsr, forwarded, run, step};
use super::{c4, lab, v4};

const NEW_MAC: [u8; 6] = [0x02, 0x5e, 0x00, 0x00, 0x00, 0x42];

#[test]
#[expect(clippy::too_many_lines, reason = "one fixture table, step by step")]
fn next_hops_come_from_the_map_the_agent_writes() -> Result<()> {
    let Some(mut lab) = lab("fx-nexthop") else {
        return Ok(());
    };
    let frame = packets::tcp(c4(), 47000, v4(), 80);
    let new_mac = || {
        Out::Fields(Fields {
            dst_mac: Some(NEW_MAC),
            ..Fields::default()
        })
    };
    let mut table: Vec<Step> = vec![
        // Hit: the backend's MAC, the lb side's, out of the backend's veth.
        dsr("hit", frame.clone(), Reason::NewFlow)
            .verdict(Verdict::Redirect)
            .to(To::Record("b".into()))
            .into(),
        step("the backend's next hop changes its MAC", |lab, memo| {
            let b = memo.get("b")?;
            let ifindex = lab.ifindex(&addrs::lb_backend_if(b))?;
            let mut moved = next_hop(ifindex, b);
            moved.macs[..6].copy_from_slice(&NEW_MAC);
            lab.set_next_hops(&[(backend_v4(b).into(), Some(moved))])
        }),
        // Changed: the tracked flow's next packet carries the new MAC at once.
        forwarded("changed", frame.clone(), Reason::ConntrackHit)
            .out(new_mac())
            .into(),
        // Miss: unresolved, the backend leaves the table; its tracked flow stays on the last
        // next hop (a carrier blip resets no connection) and new flows never reach it.
        step("the backend's next hop is unresolved", |lab, memo| {
            let b = memo.get("b")?;
            lab.set_next_hops(&[(backend_v4(b).into(), None)])
        }),
        forwarded(
            "the tracked flow of an unresolved backend",
            frame.clone(),
            Reason::ConntrackHit,
        )
        .verdict(Verdict::Redirect)
        .out(Out::Unread)
        .into(),
        forwarded(
            "the tracked flow stays on the last next hop",
            frame,
            Reason::ConntrackHit,
        )
        .out(new_mac())
        .into(),
    ];
    for port in 47100..47300u16 {
        table.push(
            forwarded(
                &format!("port {port}"),
                packets::tcp(c4(), port, v4(), 80),
                Reason::NewFlow,
            )
            .to(To::Other("b".into()))
            .into(),
        );
    }
    // A slot whose live next hop is unresolved (its entry written by hand, as a program that
    // runs before the agent's first resolution sees it) drops with its own reason.
    table.push(step(
        "a tracked flow on a live slot without a next hop",
        |lab, memo| {
            let b = memo.get("b")?;
            let slot = lab
                .publisher
                .pools()
                .values()
                .flat_map(|p| p.backends.iter())
                .find(|x| x.address == IpAddr::from(backend_v4(b)))
                .map(|x| x.slot)
                .context("no slot for the backend")?;
            let mut entry = lab.maps.backend(slot)?;
            entry.state = router_common::BACKEND_UP;
            lab.maps.set_backend(slot, entry)?;
            lab.maps.set_next_hop(
                router_common::next_hop_index(slot, entry.hop),
                router_common::NextHop::default(),
            )?;
            let now = lab.now()?;
            lab.maps.conntrack.insert(
                router_common::FlowKey {
                    src: switchyard::publish::addr16(c4()),
                    dst: switchyard::publish::addr16(v4()),
                    sport: 47001u16.to_be(),
                    dport: 80u16.to_be(),
                    proto: router_common::PROTO_TCP,
                    family: router_common::FAMILY_V4,
                    _pad: [0; 2],
                },
                router_common::FlowEntry {
                    backend: slot,
                    service: 0,
                    seen: now,
                    state: router_common::FLOW_TCP_OPEN,
                    _pad: [0; 3],
                },
                0,
            )?;
            Ok(())
        },
    ));
    table.push(
        dropped(
            "a slot without a next hop",
            packets::tcp(c4(), 47001, v4(), 80),
            Reason::NoNextHop,
        )
        .into(),
    );
    run(&mut lab, table)
}
