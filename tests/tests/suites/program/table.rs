//! One frame of each kind, each on a fresh flow, and the verdict, reason and output it gets:
//! what is balanced (TCP and UDP, IPv4 and IPv6, DSR and NAT, VLAN tags, IPv4 options, IPv6
//! extension headers, a UDP datagram without checksum), what is passed untouched (not a
//! service, not IP, malformed), and what a pool with every backend down does.

use anyhow::Result;
use router_common::Reason;
use router_tests::{
    addrs::{CLIENT_V4, CLIENT_V6, VIP_V4, VIP_V6},
    packets::{self, set_byte, zero_udp_checksum},
};

use super::fixture::{Step, dropped, dsr, nat, pass, run};
use super::{OTHER_V4, c4, c6, lab, v4, v6};

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "the fixture table: one row per packet and its verdict"
)]
fn fixture_table_gives_each_packet_its_documented_verdict() -> Result<()> {
    let Some(mut lab) = lab("fx-table") else {
        return Ok(());
    };
    let tcp4 = packets::tcp(c4(), 40000, v4(), 80);
    let table: Vec<Step> = vec![
        dsr("tcp v4 to a dsr VIP", tcp4.clone(), Reason::NewFlow).into(),
        dsr(
            "tcp v6 to a dsr VIP",
            packets::tcp(c6(), 40000, v6(), 80),
            Reason::NewFlow,
        )
        .into(),
        nat(
            "udp v4 to a nat VIP",
            packets::udp(c4(), 5353, v4(), 53),
            Reason::NewFlow,
        )
        .into(),
        nat(
            "udp v6 to a nat VIP",
            packets::udp(c6(), 5353, v6(), 53),
            Reason::NewFlow,
        )
        .into(),
        nat(
            "tcp v4 to a nat VIP",
            packets::tcp(c4(), 40001, v4(), 8080),
            Reason::NewFlow,
        )
        .into(),
        nat(
            "udp v4 nat without checksum",
            zero_udp_checksum(packets::udp(c4(), 5354, v4(), 53)),
            Reason::NewFlow,
        )
        .into(),
        dsr(
            "802.1Q tagged",
            packets::tcp_vlan(CLIENT_V4, 40002, VIP_V4, 80, 1),
            Reason::NewFlow,
        )
        .into(),
        dsr(
            "802.1ad + 802.1Q tagged",
            packets::tcp_vlan(CLIENT_V4, 40003, VIP_V4, 80, 2),
            Reason::NewFlow,
        )
        .into(),
        dsr(
            "ipv4 with options",
            packets::tcp_v4_with_options(CLIENT_V4, 40004, VIP_V4, 80)?,
            Reason::NewFlow,
        )
        .into(),
        dsr(
            "ipv6 with extension headers",
            packets::tcp_v6_with_ext(CLIENT_V6, 40005, VIP_V6, 80)?,
            Reason::NewFlow,
        )
        .into(),
        pass(
            "not a VIP",
            packets::tcp(c4(), 40000, OTHER_V4.into(), 80),
            Reason::NoService,
        )
        .into(),
        // A virtual IP is the balancer's: what no service takes is dropped, never passed to
        // a host that would route it back.
        dropped(
            "VIP, other port",
            packets::tcp(c4(), 40000, v4(), 8081),
            Reason::VipNoService,
        )
        .into(),
        dropped(
            "VIP, other protocol",
            packets::udp(c4(), 40000, v4(), 80),
            Reason::VipNoService,
        )
        .into(),
        pass(
            "ping to an address that is no VIP",
            packets::ping(CLIENT_V4, OTHER_V4)?,
            Reason::NoService,
        )
        .into(),
        pass("ARP", packets::arp(), Reason::NotIp).into(),
        pass(
            "runt: Ethernet header only",
            tcp4[..14].to_vec(),
            Reason::MalformedPass,
        )
        .into(),
        pass(
            "truncated IPv4 header",
            tcp4[..14 + 12].to_vec(),
            Reason::MalformedPass,
        )
        .into(),
        pass(
            "truncated before the ports",
            tcp4[..14 + 20 + 2].to_vec(),
            Reason::MalformedPass,
        )
        .into(),
        pass(
            "IPv4 IHL below 5",
            set_byte(tcp4.clone(), 14, 0x44),
            Reason::MalformedPass,
        )
        .into(),
        pass(
            "IPv4 IHL past the end",
            set_byte(tcp4[..14 + 20 + 4].to_vec(), 14, 0x4f),
            Reason::MalformedPass,
        )
        .into(),
        pass(
            "IP version 4 in an IPv6 frame",
            set_byte(packets::tcp(c6(), 1, v6(), 80), 14, 0x45),
            Reason::MalformedPass,
        )
        .into(),
        pass(
            "VLAN tag cut short",
            packets::tcp_vlan(CLIENT_V4, 40006, VIP_V4, 80, 2)[..16].to_vec(),
            Reason::MalformedPass,
        )
        .into(),
        dropped(
            "pool down, when_all_down drop",
            packets::tcp(c4(), 40000, v4(), 81),
            Reason::NoBackend,
        )
        .into(),
        pass(
            "pool down, when_all_down pass",
            packets::tcp(c4(), 40000, v4(), 82),
            Reason::AllDownPass,
        )
        .into(),
    ];
    run(&mut lab, table)
}
