//! What a veth needs for XDP forwarding: a redirect from the lb reaches a backend and its DSR
//! replies return; a redirected frame needs XDP on the receiver and checksum offload off.

use std::time::Duration;

use router_tests::addrs::{
    BACKEND_IF, CLIENT_IF, LB_CLIENT_IF, TCP_ECHO_PORT, UDP_NAME_PORT, VIP_V4, vip_v4,
};
use router_tests::client::{self, Tally, TcpSession};
use router_tests::netns::Netns;
use router_tests::privileged::require_root_and_bpf;
use router_tests::servers::{self};

use super::topology;

/// A 19-instruction DSR redirector for IPv4 (the lb's side of what Switchyard's `dsr-l2` mode
/// does): frames to the IPv4 VIP get backend `i`'s MACs and are redirected into its veth;
/// everything else passes.
#[cfg(target_endian = "little")]
#[expect(
    clippy::cast_possible_wrap,
    reason = "an ifindex, small and positive, as the instruction's i32 immediate"
)]
fn dsr_redirector(lb_ifindex_to_backend: u32, i: usize) -> Vec<u64> {
    use router_tests::addrs::{backend_mac, lb_backend_side_mac};
    use router_tests::xdp_pass::insn;
    let w = |b: &[u8]| i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let h = |b: &[u8]| i32::from(u16::from_le_bytes([b[0], b[1]]));
    let (dst, src) = (backend_mac(i), lb_backend_side_mac(i));
    vec![
        insn(0x61, 0x12, 0, 0),                            // 0: r2 = ctx->data
        insn(0x61, 0x13, 4, 0),                            // 1: r3 = ctx->data_end
        insn(0xbf, 0x24, 0, 0),                            // 2: r4 = r2
        insn(0x07, 0x04, 0, 34),                           // 3: r4 += 14 + 20
        insn(0x2d, 0x34, 12, 0),                           // 4: if r4 > r3 goto pass
        insn(0x69, 0x25, 12, 0),                           // 5: r5 = eth.h_proto
        insn(0x55, 0x05, 10, 0x0008),                      // 6: if r5 != htons(0x0800) goto pass
        insn(0x61, 0x25, 30, 0),                           // 7: r5 = ip.daddr
        insn(0x55, 0x05, 8, w(&VIP_V4.octets())),          // 8: if r5 != VIP goto pass
        insn(0x62, 0x02, 0, w(&dst[..4])),                 // 9: eth.h_dest = backend MAC
        insn(0x6a, 0x02, 4, h(&dst[4..])),                 // 10
        insn(0x62, 0x02, 6, w(&src[..4])),                 // 11: eth.h_source = lb MAC on that link
        insn(0x6a, 0x02, 10, h(&src[4..])),                // 12
        insn(0xb7, 0x01, 0, lb_ifindex_to_backend as i32), // 13: r1 = ifindex
        insn(0xb7, 0x02, 0, 0),                            // 14: r2 = 0
        insn(0x85, 0x00, 0, 23),                           // 15: r0 = bpf_redirect(r1, r2)
        insn(0x95, 0x00, 0, 0),                            // 16: exit
        insn(0xb7, 0x00, 0, 2),                            // 17: pass: r0 = XDP_PASS
        insn(0x95, 0x00, 0, 0),                            // 18: exit
    ]
}

fn ifindex(ns: &Netns, ifname: &str) -> u32 {
    let line = ns.ip(&["-o", "link", "show", ifname]).unwrap();
    line.split(':').next().unwrap().trim().parse().unwrap()
}

#[test]
#[cfg(target_endian = "little")]
fn xdp_redirect_from_the_lb_reaches_a_backend_and_dsr_replies_return() {
    if require_root_and_bpf("xdp_redirect_from_the_lb_reaches_a_backend_and_dsr_replies_return")
        .is_err()
    {
        return;
    }
    let topo = topology(2);
    let _servers = servers::start_all(&topo).unwrap();
    let prog = router_tests::xdp_pass::load_raw(
        "sy_dsr_test",
        &dsr_redirector(ifindex(topo.lb(), "to-b2"), 2),
    )
    .unwrap();
    router_tests::xdp_pass::attach(topo.lb(), LB_CLIENT_IF, &prog).unwrap();
    let tally = client::tcp_tally(topo.client(), vip_v4(TCP_ECHO_PORT), 5).unwrap();
    assert_eq!(tally, Tally::from([("b2".to_owned(), 5)]));
    let tally = client::udp_tally(topo.client(), vip_v4(UDP_NAME_PORT), 5).unwrap();
    assert_eq!(tally, Tally::from([("b2".to_owned(), 5)]));
    let mut big = topo
        .client()
        .run(|| TcpSession::connect(vip_v4(TCP_ECHO_PORT)))
        .unwrap()
        .unwrap();
    big.echo(&client::payload(3, 1 << 20)).unwrap();
    big.finish().unwrap();
}

/// `InCsumErrors` of `proto` ("Tcp" or "Udp") in `ns`, from /proc/net/snmp.
fn csum_errors(ns: &Netns, proto: &'static str) -> u64 {
    let snmp = ns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap())
        .unwrap();
    let mut rows = snmp.lines().filter(|l| l.starts_with(&format!("{proto}:")));
    let (names, values) = (rows.next().unwrap(), rows.next().unwrap());
    let col = names
        .split_whitespace()
        .position(|n| n == "InCsumErrors")
        .unwrap();
    values.split_whitespace().nth(col).unwrap().parse().unwrap()
}

/// Pins down the two veth facts the topology works around (see `router_tests::netns`), so a kernel
/// that changes them is noticed: a redirected frame needs an XDP program on the receiving veth,
/// and a sender with checksum offload on delivers bad checksums through an XDP redirect.
#[test]
#[cfg(target_endian = "little")]
fn veth_facts_redirect_needs_xdp_on_the_receiver_and_checksum_offload_off() {
    if require_root_and_bpf(
        "veth_facts_redirect_needs_xdp_on_the_receiver_and_checksum_offload_off",
    )
    .is_err()
    {
        return;
    }
    let topo = topology(1);
    let _servers = servers::start_all(&topo).unwrap();
    let prog = router_tests::xdp_pass::load_raw(
        "sy_dsr_test",
        &dsr_redirector(ifindex(topo.lb(), "to-b1"), 1),
    )
    .unwrap();
    router_tests::xdp_pass::attach(topo.lb(), LB_CLIENT_IF, &prog).unwrap();
    let connect = || {
        topo.client()
            .run(|| {
                TcpSession::connect_with_timeout(vip_v4(TCP_ECHO_PORT), Duration::from_millis(700))
            })
            .unwrap()
    };
    assert_eq!(
        connect().unwrap().backend(),
        "b1",
        "the harness as built must work"
    );

    router_tests::xdp_pass::detach(topo.backend(1), BACKEND_IF).unwrap();
    assert!(
        connect().is_err(),
        "a redirected frame reached a veth without XDP"
    );
    let pass = router_tests::xdp_pass::load().unwrap();
    router_tests::xdp_pass::attach(topo.backend(1), BACKEND_IF, &pass).unwrap();
    assert!(
        connect().is_ok(),
        "XDP_PASS on the receiver must bring redirected frames back"
    );

    let before = csum_errors(topo.backend(1), "Tcp");
    topo.client()
        .exec(&["ethtool", "-K", CLIENT_IF, "tx", "on"])
        .unwrap();
    assert!(
        connect().is_err(),
        "offloaded checksums survived an XDP redirect"
    );
    assert!(
        csum_errors(topo.backend(1), "Tcp") > before,
        "the backend saw no bad checksum"
    );
}
