//! NAT replies: the reply of a tracked NAT flow, from the backend's own address, gets the VIP
//! back as its source and goes to the client; an unrelated packet from the backend is left
//! alone.

use anyhow::{Result, ensure};
use router_common::Reason;
use router_tests::{
    addrs::{self, backend_mac, backend_v4},
    packets,
};
use switchyard::config::Target;

use super::fixture::{Fields, Memo, On, Out, Step, To, Verdict, check, forwarded, pass, run, step};
use super::{c4, c6, fixture_config, lab, v4, v6};

/// The UDP datagram the backend of the request sends from its own address, port 53, to the
/// client's port `cport`, on its link to the lb.
fn from_backend(memo: &Memo, cport: u16) -> Result<Vec<u8>> {
    let b = memo.get("request")?;
    let mut frame = packets::udp(backend_v4(b).into(), 53, c4(), cport);
    frame[..6].copy_from_slice(&addrs::lb_backend_side_mac(b));
    frame[6..12].copy_from_slice(&backend_mac(b));
    Ok(frame)
}

#[test]
fn a_nat_reply_gets_the_virtual_ip_back() -> Result<()> {
    let Some(mut lab) = lab("fx-natrep") else {
        return Ok(());
    };
    let request = packets::udp(c4(), 5400, v4(), 53);
    run(
        &mut lab,
        [
            forwarded("request", request, Reason::NewFlow).to(To::Record("request".into())),
            // The backend answers the client from its own address.
            forwarded("reply", Vec::new(), Reason::NatReply)
                .built(|memo| from_backend(memo, 5400))
                .on(On::BackendOf("request".into()))
                .verdict(Verdict::Redirect)
                .out(Out::Fields(Fields {
                    dst_mac: Some(addrs::CLIENT_MAC),
                    src: Some(v4()),
                    dst: Some(c4()),
                    checksums_ok: true,
                    ..Fields::default()
                })),
            // An unrelated packet from the backend is left alone.
            pass("stray packet", Vec::new(), Reason::NoService)
                .built(|memo| from_backend(memo, 5401))
                .on(On::BackendOf("request".into())),
        ]
        .map(Step::from),
    )
}

#[test]
fn a_nat_flow_tracked_on_a_pool_the_service_left_still_gets_its_replies_back() -> Result<()> {
    let Some(mut lab) = lab("fx-natmove") else {
        return Ok(());
    };
    // `dns` moves from `web` (backends 1, 2, 3) to `solo` (backend 1); `web` stays, so its
    // backends stay usable and the flows tracked on them stay there (a conntrack hit).
    let moved = {
        let mut cfg = fixture_config();
        for s in &mut cfg.services {
            if s.name == "dns" {
                s.to = Target::Pool("solo".into());
            }
        }
        cfg
    };
    let ports = 5410..5416u16;
    let mut table: Vec<Step> = ports
        .clone()
        .map(|p| {
            forwarded(
                &format!("request {p}"),
                packets::udp(c4(), p, v4(), 53),
                Reason::NewFlow,
            )
            .to(To::Record(format!("request {p}")))
            .into()
        })
        .collect();
    table.push(check("some flow is on a backend solo lacks", |_, memo| {
        ensure!(
            memo.with_prefix("request ").iter().any(|b| *b != 1),
            "every flow is on backend 1: the test would not show the move"
        );
        Ok(())
    }));
    table.push(step("move dns to solo", move |lab, _| lab.apply(&moved)));
    for p in ports {
        let name = format!("request {p}");
        table.push(
            forwarded(
                &format!("request {p} after the move"),
                packets::udp(c4(), p, v4(), 53),
                Reason::ConntrackHit,
            )
            .to(To::Same(name.clone()))
            .into(),
        );
        let memo_name = name.clone();
        table.push(
            forwarded(
                &format!("reply {p} after the move"),
                Vec::new(),
                Reason::NatReply,
            )
            .built(move |memo| {
                let b = memo.get(&memo_name)?;
                let mut frame = packets::udp(backend_v4(b).into(), 53, c4(), p);
                frame[..6].copy_from_slice(&addrs::lb_backend_side_mac(b));
                frame[6..12].copy_from_slice(&backend_mac(b));
                Ok(frame)
            })
            .on(On::BackendOf(name))
            .verdict(Verdict::Redirect)
            .out(Out::Fields(Fields {
                dst_mac: Some(addrs::CLIENT_MAC),
                src: Some(v4()),
                dst: Some(c4()),
                checksums_ok: true,
                ..Fields::default()
            }))
            .into(),
        );
    }
    run(&mut lab, table)
}

#[test]
fn an_ipv6_nat_reply_gets_the_virtual_ip_back() -> Result<()> {
    let Some(mut lab) = lab("fx-natrep6") else {
        return Ok(());
    };
    let request = packets::udp(c6(), 5420, v6(), 53);
    run(
        &mut lab,
        [
            forwarded("request", request, Reason::NewFlow).to(To::Record("request".into())),
            forwarded("reply", Vec::new(), Reason::NatReply)
                .built(|memo| {
                    let b = memo.get("request")?;
                    let mut frame = packets::udp(addrs::backend_v6(b).into(), 53, c6(), 5420);
                    frame[..6].copy_from_slice(&addrs::lb_backend_side_mac(b));
                    frame[6..12].copy_from_slice(&backend_mac(b));
                    Ok(frame)
                })
                .on(On::BackendOf("request".into()))
                .verdict(Verdict::Redirect)
                .out(Out::Fields(Fields {
                    dst_mac: Some(addrs::CLIENT_MAC),
                    src: Some(v6()),
                    dst: Some(c6()),
                    checksums_ok: true,
                    ..Fields::default()
                })),
        ]
        .map(Step::from),
    )
}
