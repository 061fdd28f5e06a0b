//! ICMP path-MTU errors: a "fragmentation needed" or "packet too big" quoting a flow's packet
//! from the VIP reaches that flow's backend, and only when it is addressed to the VIP it quotes.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::Result;
use router_common::Reason;
use router_tests::{
    addrs::{CLIENT_V4, CLIENT_V6, LB_CLIENT_SIDE_V4, VIP_V4, VIP_V6},
    packets::{self, fix_v4_checksum, unhex},
};

use super::fixture::{Step, To, dsr, forwarded, pass, run};
use super::{c4, c6, lab, v4, v6};

#[test]
fn icmp_too_big_errors_reach_the_backend_of_the_flow_they_quote() -> Result<()> {
    let Some(mut lab) = lab("fx-icmp") else {
        return Ok(());
    };
    let router4 = Ipv4Addr::new(198, 18, 0, 77);
    let router6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x77);
    let mut table: Vec<Step> = Vec::new();
    for port in 43000..43010u16 {
        let (flow, flow6) = (format!("port {port}"), format!("port {port} v6"));
        table.extend([
            forwarded(&flow, packets::tcp(c4(), port, v4(), 80), Reason::NewFlow)
                .to(To::Record(flow.clone()))
                .into(),
            dsr(
                &format!("port {port}: icmp frag needed"),
                packets::icmp_frag_needed(router4, VIP_V4, 80, CLIENT_V4, port)?,
                Reason::IcmpForwarded,
            )
            .to(To::Same(flow))
            .into(),
            forwarded(&flow6, packets::tcp(c6(), port, v6(), 80), Reason::NewFlow)
                .to(To::Record(flow6.clone()))
                .into(),
            dsr(
                &format!("port {port}: icmpv6 packet too big"),
                packets::icmpv6_too_big(router6, VIP_V6, 80, CLIENT_V6, port)?,
                Reason::IcmpForwarded,
            )
            .to(To::Same(flow6))
            .into(),
        ]);
    }
    run(&mut lab, table)
}

#[test]
fn a_pmtu_error_is_steered_only_when_addressed_to_the_vip_it_quotes() -> Result<()> {
    let Some(mut lab) = lab("fz-icmp") else {
        return Ok(());
    };
    let router4 = Ipv4Addr::new(198, 18, 0, 77);
    // Addressed to the lb itself, quoting a packet "from" the VIP: the lb's, not a backend's.
    let mut to_lb = packets::icmp_frag_needed(router4, VIP_V4, 80, CLIENT_V4, 40000)?;
    to_lb[14 + 16..14 + 20].copy_from_slice(&LB_CLIENT_SIDE_V4.octets());
    fix_v4_checksum(&mut to_lb);
    run(
        &mut lab,
        [
            pass(
                "icmp frag needed to the lb quoting the VIP",
                to_lb,
                Reason::NoService,
            ),
            // Found by the fuzz run (seed 1): a quote whose IP version is 8.
            pass(
                "icmpv6 too big quoting a header of IP version 8",
                unhex(
                    "0253590000fe02535900000186dd6000000000383a4020010db8000000000000000000000077\
                     20010db80000000000000000000000100200583800000500800000000043064020010db80000\
                     0000000000000000001020010db800000000000000000000000100507e1d000003e8a5a5a500\
                     00a50000a5a500a50000a500a5a5a5a5a50000000000a5a500a50000a5a5a5000000a5a50000\
                     a50000",
                ),
                Reason::MalformedPass,
            ),
            // Found by the fuzz run: an ICMPv6 too-big from the VIP to a router, quoting the VIP.
            pass(
                "icmpv6 too big not addressed to the VIP (fuzz)",
                unhex(
                    "0253590000fe02535900000186dd6000000000383a4020010db80000000000000000000000\
                     1020010db80000000000000000000000770200bf9000000500600000000043064020010db8\
                     00000000000000000000001020010db8000000000000000000000001005016c5000003e8a5\
                     a5a5a5a5000000a5a50000a5a5a50000000000a5",
                ),
                Reason::NoService,
            ),
        ]
        .map(Step::from),
    )
}
