//! Flow state in connection tracking: a TCP flow is tracked from its second packet, open until
//! a FIN or an RST makes it closing, and a SYN on its 5-tuple opens a new connection; a flow
//! idle past its state's timeout is a new flow, selected from the current table. Time is the
//! program's clock moved forward through its `CLOCK` map, not waited for.

use std::time::Duration;

use anyhow::{Result, ensure};
use router_common::{
    DEFAULT_TIMEOUTS, FLOW_STATE_MASK, FLOW_TCP_CLOSING, FLOW_TCP_OPEN, FLOW_UDP, FlowKey, Reason,
};
use router_tests::{
    addrs::backend_v4,
    packets::{self, Tcp},
};

use super::fixture::{Step, To, advance, check, count, forwarded, health, on_cpu, run, step};
use super::{c4, lab, v4};

/// The conntrack key of a flow from the IPv4 client's `sport` to the IPv4 VIP's `dport`.
fn key(sport: u16, dport: u16, proto: u8) -> FlowKey {
    FlowKey {
        src: switchyard::publish::addr16(c4()),
        dst: switchyard::publish::addr16(v4()),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        family: router_common::FAMILY_V4,
        _pad: [0; 2],
    }
}

/// A TCP segment with `flags` from the client's `sport` to `web` (port 80).
fn seg(sport: u16, flags: Tcp) -> Vec<u8> {
    packets::tcp_with(c4(), sport, v4(), 80, flags)
}

/// Checks the state `CONNTRACK` holds for TCP flow `sport` of `web` (`None`: no entry).
fn state_is(sport: u16, want: Option<u8>) -> Step {
    check(
        &format!("conntrack state of {sport} is {want:?}"),
        move |lab, _| {
            let got = lab
                .maps
                .conntrack
                .get(&key(sport, 80, router_common::PROTO_TCP), 0)
                .ok()
                .map(|e| e.state);
            ensure!(got == want, "state {got:?}, expected {want:?}");
            Ok(())
        },
    )
}

/// The default timeout of a state, plus a margin past the clock's granularity.
fn past(state: usize) -> Duration {
    Duration::from_secs(u64::from(DEFAULT_TIMEOUTS[state]) + 2)
}

#[test]
fn syn_then_open_then_fin_closing_then_expired_is_a_new_flow() -> Result<()> {
    let Some(mut lab) = lab("fx-st-fin") else {
        return Ok(());
    };
    let p = 46_000;
    let table: Vec<Step> = vec![
        forwarded("SYN", seg(p, Tcp::Syn), Reason::NewFlow)
            .to(To::Record("flow".into()))
            .into(),
        // The first packet is recorded in the CPU's flow cache only.
        state_is(p, None),
        forwarded("SYN retransmitted", seg(p, Tcp::Syn), Reason::NewFlow)
            .to(To::Same("flow".into()))
            .into(),
        state_is(p, None),
        forwarded("ACK", seg(p, Tcp::Ack), Reason::ConntrackHit)
            .to(To::Same("flow".into()))
            .into(),
        state_is(p, Some(FLOW_TCP_OPEN)),
        forwarded("FIN", seg(p, Tcp::Fin), Reason::ConntrackHit)
            .to(To::Same("flow".into()))
            .into(),
        state_is(p, Some(FLOW_TCP_CLOSING)),
        // The last ACKs of a closing connection still reach its backend, and keep it closing.
        forwarded("last ACK", seg(p, Tcp::Ack), Reason::ConntrackHit)
            .to(To::Same("flow".into()))
            .into(),
        state_is(p, Some(FLOW_TCP_CLOSING)),
        advance(past(FLOW_TCP_CLOSING as usize)),
        forwarded(
            "after the closing timeout",
            seg(p, Tcp::Ack),
            Reason::NewFlow,
        )
        .into(),
    ];
    run(&mut lab, table)
}

#[test]
fn rst_closes_a_flow_and_the_next_syn_is_a_new_flow() -> Result<()> {
    let Some(mut lab) = lab("fx-st-rst") else {
        return Ok(());
    };
    let p = 46_100;
    let table: Vec<Step> = vec![
        forwarded("SYN", seg(p, Tcp::Syn), Reason::NewFlow)
            .to(To::Record("flow".into()))
            .into(),
        forwarded("ACK", seg(p, Tcp::Ack), Reason::ConntrackHit)
            .to(To::Same("flow".into()))
            .into(),
        forwarded("RST", seg(p, Tcp::Rst), Reason::ConntrackHit)
            .to(To::Same("flow".into()))
            .into(),
        state_is(p, Some(FLOW_TCP_CLOSING)),
        forwarded(
            "SYN on the reused 5-tuple",
            seg(p, Tcp::Syn),
            Reason::NewFlow,
        )
        .into(),
        forwarded("its ACK", seg(p, Tcp::Ack), Reason::ConntrackHit).into(),
        state_is(p, Some(FLOW_TCP_OPEN)),
    ];
    run(&mut lab, table)
}

#[test]
fn an_open_flow_outlives_the_closing_timeout_and_expires_after_its_own() -> Result<()> {
    let Some(mut lab) = lab("fx-st-open") else {
        return Ok(());
    };
    let p = 46_200;
    let table: Vec<Step> = vec![
        forwarded(
            "ACK (picked up mid-stream)",
            seg(p, Tcp::Ack),
            Reason::NewFlow,
        )
        .to(To::Record("flow".into()))
        .into(),
        forwarded("ACK", seg(p, Tcp::Ack), Reason::ConntrackHit)
            .to(To::Same("flow".into()))
            .into(),
        advance(past(FLOW_TCP_CLOSING as usize)),
        forwarded(
            "idle past the closing timeout",
            seg(p, Tcp::Ack),
            Reason::ConntrackHit,
        )
        .to(To::Same("flow".into()))
        .into(),
        advance(past(FLOW_TCP_OPEN as usize)),
        forwarded(
            "idle past the open timeout",
            seg(p, Tcp::Ack),
            Reason::NewFlow,
        )
        .into(),
    ];
    run(&mut lab, table)
}

/// Ports of the flows the table-change tests track.
const FLOWS: std::ops::Range<u16> = 47_000..47_040;

/// Takes `web`'s backend 3 out, so flows spread over backends 1 and 2 until it returns.
fn without_backend_3() -> Step {
    health("web", backend_v4(3).into(), false)
}

/// Brings backend 3 back: the table changes, and fresh selections reach it.
fn with_backend_3() -> Step {
    health("web", backend_v4(3).into(), true)
}

/// Every flow of [`FLOWS`] opened with `frame` (a SYN, then an ACK: tracked from the second),
/// its backend recorded as `flow PORT`.
fn open_flows(frame: fn(u16, Tcp) -> Vec<u8>) -> Vec<Step> {
    FLOWS
        .flat_map(|p| {
            let name = format!("flow {p}");
            [
                forwarded(&name, frame(p, Tcp::Syn), Reason::NewFlow)
                    .to(To::Record(name.clone()))
                    .into(),
                forwarded(
                    &format!("{name}, tracked"),
                    frame(p, Tcp::Ack),
                    Reason::ConntrackHit,
                )
                .to(To::Same(name))
                .into(),
            ]
        })
        .collect()
}

/// A UDP datagram from the client's `sport` to `dns` (53); the flags are ignored.
fn dns(sport: u16, _: Tcp) -> Vec<u8> {
    packets::udp(c4(), sport, v4(), 53)
}

#[test]
fn a_table_change_keeps_open_flows_and_moves_closed_ones() -> Result<()> {
    let Some(mut lab) = lab("fx-st-table") else {
        return Ok(());
    };
    let mut table = vec![without_backend_3()];
    table.extend(open_flows(seg));
    // Every other flow is reset by its client.
    for p in FLOWS.step_by(2) {
        table.push(
            forwarded(&format!("RST {p}"), seg(p, Tcp::Rst), Reason::ConntrackHit)
                .to(To::Same(format!("flow {p}")))
                .into(),
        );
    }
    table.push(with_backend_3());
    for p in FLOWS {
        let name = format!("flow {p}");
        let row = if p % 2 == 0 {
            // Reset: its 5-tuple's next SYN is selected from the current table.
            forwarded(
                &format!("SYN {p} after RST"),
                seg(p, Tcp::Syn),
                Reason::NewFlow,
            )
            .to(To::Record(format!("moved {p}")))
        } else {
            forwarded(&format!("open {p}"), seg(p, Tcp::Ack), Reason::ConntrackHit)
                .to(To::Same(name))
        };
        table.push(row.into());
    }
    table.push(check("reset flows spread over the new table", |_, memo| {
        let on_3 = memo
            .with_prefix("moved ")
            .iter()
            .filter(|b| **b == 3)
            .count();
        ensure!(on_3 > 0, "no reset flow reached the returned backend 3");
        Ok(())
    }));
    run(&mut lab, table)
}

#[test]
fn a_syn_reusing_a_reset_tuple_is_followed_by_its_ack_on_another_cpu() -> Result<()> {
    let Some(mut lab) = lab("fx-st-cpus") else {
        return Ok(());
    };
    let mut table = vec![on_cpu(0), without_backend_3()];
    table.extend(open_flows(seg));
    for p in FLOWS {
        table.push(
            forwarded(&format!("RST {p}"), seg(p, Tcp::Rst), Reason::ConntrackHit)
                .to(To::Same(format!("flow {p}")))
                .into(),
        );
    }
    table.push(with_backend_3());
    for p in FLOWS {
        let moved = format!("moved {p}");
        table.extend([
            on_cpu(0),
            forwarded(
                &format!("SYN {p} after RST"),
                seg(p, Tcp::Syn),
                Reason::NewFlow,
            )
            .to(To::Record(moved.clone()))
            .into(),
            state_is(p, Some(router_common::FLOW_TCP_SYN)),
            // The connection's ACK reaches another CPU, which never saw its SYN.
            on_cpu(1),
            forwarded(
                &format!("ACK {p} on CPU 1"),
                seg(p, Tcp::Ack),
                Reason::ConntrackHit,
            )
            .to(To::Same(moved))
            .into(),
            state_is(p, Some(FLOW_TCP_OPEN)),
        ]);
    }
    table.push(check("reset flows spread over the new table", |_, memo| {
        ensure!(memo.with_prefix("moved ").contains(&3));
        Ok(())
    }));
    run(&mut lab, table)
}

#[test]
fn a_udp_flow_idle_past_its_timeout_is_selected_from_the_current_table() -> Result<()> {
    let Some(mut lab) = lab("fx-st-udp") else {
        return Ok(());
    };
    let mut table = vec![without_backend_3()];
    table.extend(open_flows(dns));
    table.push(check("UDP flows are tracked as UDP", |lab, _| {
        let e = lab
            .maps
            .conntrack
            .get(&key(FLOWS.start, 53, router_common::PROTO_UDP), 0)?;
        ensure!(e.state & FLOW_STATE_MASK == FLOW_UDP, "state {}", e.state);
        Ok(())
    }));
    table.push(with_backend_3());
    // Within the timeout, every flow stays.
    table.push(advance(Duration::from_secs(
        u64::from(DEFAULT_TIMEOUTS[FLOW_UDP as usize]) / 2,
    )));
    for p in FLOWS {
        table.push(
            forwarded(
                &format!("{p} within the timeout"),
                dns(p, Tcp::Ack),
                Reason::ConntrackHit,
            )
            .to(To::Same(format!("flow {p}")))
            .into(),
        );
    }
    table.push(advance(past(FLOW_UDP as usize)));
    table.push(count("new", Reason::NewFlow));
    for p in FLOWS {
        table.push(
            forwarded(
                &format!("{p} after the timeout"),
                dns(p, Tcp::Ack),
                Reason::NewFlow,
            )
            .to(To::Record(format!("moved {p}")))
            .into(),
        );
    }
    table.push(check(
        "expired flows spread over the new table",
        |_, memo| {
            let on_3 = memo
                .with_prefix("moved ")
                .iter()
                .filter(|b| **b == 3)
                .count();
            ensure!(on_3 > 0, "no expired flow reached the returned backend 3");
            Ok(())
        },
    ));
    run(&mut lab, table)
}

/// SYNs of the flood: half as many as a CPU's flow cache has entries, so each set's second way
/// is rewritten twice over on average.
const FLOOD: u16 = 4_096;
const _: () = assert!(FLOOD as u32 == router_common::FLOW_CACHE_ENTRIES / 2);

#[test]
fn a_syn_flood_writes_nothing_to_conntrack_and_tracked_flows_stay() -> Result<()> {
    let Some(mut lab) = lab("fx-st-flood") else {
        return Ok(());
    };
    let mut table = open_flows(seg);
    table.push(step("count tracked flows", |lab, memo| {
        memo.set("tracked", lab.maps.conntrack.keys().count());
        Ok(())
    }));
    // Each SYN from its own port of another client address: each is a new flow, none is
    // tracked.
    for p in 1_024..1_024 + FLOOD {
        table.push(
            forwarded(
                &format!("flood SYN {p}"),
                packets::syn(std::net::Ipv4Addr::new(198, 19, 7, 1).into(), p, v4(), 80),
                Reason::NewFlow,
            )
            .into(),
        );
    }
    table.push(check("the flood wrote no conntrack entry", |lab, memo| {
        let now = lab.maps.conntrack.keys().count();
        ensure!(
            now == memo.get("tracked")?,
            "{now} entries, {} before",
            memo.get("tracked")?
        );
        Ok(())
    }));
    for p in FLOWS {
        table.push(
            forwarded(
                &format!("open {p} after the flood"),
                seg(p, Tcp::Ack),
                Reason::ConntrackHit,
            )
            .to(To::Same(format!("flow {p}")))
            .into(),
        );
    }
    run(&mut lab, table)
}

#[test]
fn a_duplicate_syn_on_an_open_connection_does_not_move_it_after_a_table_change() -> Result<()> {
    let Some(mut lab) = lab("fx-st-dupsyn") else {
        return Ok(());
    };
    let mut table = vec![without_backend_3()];
    table.extend(open_flows(seg));
    table.push(with_backend_3());
    for p in FLOWS {
        let name = format!("flow {p}");
        // The duplicate SYN reaches the connection's backend, and so does its next segment.
        table.push(
            forwarded(
                &format!("duplicate SYN {p}"),
                seg(p, Tcp::Syn),
                Reason::ConntrackHit,
            )
            .to(To::Same(name.clone()))
            .into(),
        );
        table.push(
            forwarded(
                &format!("ACK {p} after it"),
                seg(p, Tcp::Ack),
                Reason::ConntrackHit,
            )
            .to(To::Same(name))
            .into(),
        );
    }
    run(&mut lab, table)
}

#[test]
fn a_syn_record_whose_backend_went_down_is_dropped_and_not_revived() -> Result<()> {
    let Some(mut lab) = lab("fx-st-record") else {
        return Ok(());
    };
    let mut table: Vec<Step> = Vec::new();
    for p in FLOWS {
        table.push(
            forwarded(&format!("SYN {p}"), seg(p, Tcp::Syn), Reason::NewFlow)
                .to(To::Record(format!("syn {p}")))
                .into(),
        );
    }
    table.push(health("web", backend_v4(1).into(), false));
    for p in FLOWS {
        let syn = format!("syn {p}");
        table.push(
            forwarded(&format!("ACK {p}"), seg(p, Tcp::Ack), Reason::NewFlow)
                .any_reason()
                .to(To::Record(format!("flow {p}")))
                .into(),
        );
        table.push(check(&format!("{p} left backend 1"), move |_, memo| {
            let (was, now) = (memo.get(&syn)?, memo.get(&format!("flow {p}"))?);
            ensure!(
                now != 1,
                "flow {p} still on backend 1 (its SYN went to {was})"
            );
            Ok(())
        }));
    }
    table.push(health("web", backend_v4(1).into(), true));
    for p in FLOWS {
        table.push(
            forwarded(
                &format!("ACK {p}, backend 1 back"),
                seg(p, Tcp::Ack),
                Reason::ConntrackHit,
            )
            .to(To::Same(format!("flow {p}")))
            .into(),
        );
    }
    table.push(check("some SYN had gone to backend 1", |_, memo| {
        ensure!(memo.with_prefix("syn ").contains(&1));
        Ok(())
    }));
    run(&mut lab, table)
}
