//! Which backend a new flow gets: headers in the way (IPv4 options, VLAN tags, IPv6 extension
//! headers) do not change it, source-IP hashing keeps a client on one backend whatever its
//! port, and a split sends its flows to both pools in proportion.

use anyhow::{Result, ensure};
use router_common::Reason;
use router_tests::{
    addrs::{CLIENT_V4, CLIENT_V6, VIP_V4, VIP_V6},
    packets,
};

use super::fixture::{Step, To, check, flush, forwarded, run};
use super::{BACKENDS, c4, c6, lab, v4, v6};

#[test]
fn headers_in_the_way_do_not_change_the_backend() -> Result<()> {
    let Some(mut lab) = lab("fx-hdrs") else {
        return Ok(());
    };
    // Conntrack is emptied before each frame, so none of these is a conntrack hit on another.
    let mut table: Vec<Step> = Vec::new();
    for port in 42000..42010u16 {
        let (plain, plain6) = (format!("port {port}"), format!("port {port} v6"));
        table.extend([
            forwarded(&plain, packets::tcp(c4(), port, v4(), 80), Reason::NewFlow)
                .to(To::Record(plain.clone()))
                .into(),
            flush(),
            forwarded(
                &format!("port {port} with IPv4 options"),
                packets::tcp_v4_with_options(CLIENT_V4, port, VIP_V4, 80)?,
                Reason::NewFlow,
            )
            .to(To::Same(plain.clone()))
            .into(),
            flush(),
            forwarded(
                &format!("port {port} in two VLAN tags"),
                packets::tcp_vlan(CLIENT_V4, port, VIP_V4, 80, 2),
                Reason::NewFlow,
            )
            .to(To::Same(plain))
            .into(),
            flush(),
            forwarded(&plain6, packets::tcp(c6(), port, v6(), 80), Reason::NewFlow)
                .to(To::Record(plain6.clone()))
                .into(),
            flush(),
            forwarded(
                &format!("port {port} v6 with extension headers"),
                packets::tcp_v6_with_ext(CLIENT_V6, port, VIP_V6, 80)?,
                Reason::NewFlow,
            )
            .to(To::Same(plain6))
            .into(),
            flush(),
        ]);
    }
    run(&mut lab, table)
}

#[test]
fn source_ip_hashing_keeps_a_client_on_one_backend() -> Result<()> {
    let Some(mut lab) = lab("fx-src") else {
        return Ok(());
    };
    let mut table: Vec<Step> = vec![
        forwarded(
            "port 45000",
            packets::tcp(c4(), 45000, v4(), 443),
            Reason::NewFlow,
        )
        .to(To::Record("client".into()))
        .into(),
    ];
    for port in 45001..45020u16 {
        table.push(
            forwarded(
                &format!("port {port}"),
                packets::tcp(c4(), port, v4(), 443),
                Reason::NewFlow,
            )
            .to(To::Same("client".into()))
            .into(),
        );
    }
    run(&mut lab, table)
}

#[test]
fn a_split_sends_flows_to_both_pools() -> Result<()> {
    let Some(mut lab) = lab("fx-split") else {
        return Ok(());
    };
    let mut table: Vec<Step> = (46000..46400u16)
        .map(|port| {
            forwarded(
                &format!("port {port}"),
                packets::tcp(c4(), port, v4(), 8443),
                Reason::NewFlow,
            )
            .to(To::Record(format!("split {port}")))
            .into()
        })
        .collect();
    // Half the flows go to "solo" (backend 1 only); the other half spread over "web" (1, 2, 3):
    // backend 1 gets about 1/2 + 1/6 = 2/3 of 400.
    table.push(check("shares", |_, memo| {
        let mut counts = [0usize; BACKENDS + 1];
        for b in memo.with_prefix("split ") {
            counts[b] += 1;
        }
        ensure!(
            (230..=300).contains(&counts[1]),
            "backend 1 got {} of 400: {counts:?}",
            counts[1]
        );
        ensure!(
            counts[2] > 40 && counts[3] > 40,
            "web's other backends starved: {counts:?}"
        );
        Ok(())
    }));
    run(&mut lab, table)
}
