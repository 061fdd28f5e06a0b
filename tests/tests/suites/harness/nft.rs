//! The nftables DNAT baseline spreads TCP and UDP over every backend (random and jhash), and
//! stops balancing once removed.

use std::net::SocketAddr;
use std::time::Duration;

use router_tests::addrs::{TCP_ECHO_PORT, UDP_NAME_PORT, backend_name, vip_v4, vip_v6};
use router_tests::client::{self, Tally, TcpSession};
use router_tests::nft::{NftDnat, Selector};
use router_tests::privileged::require;
use router_tests::servers::{self};

use super::topology;

fn assert_all_backends_used(tally: &Tally, backends: usize, what: &str) {
    for i in 1..=backends {
        assert!(
            tally.get(&backend_name(i)).copied().unwrap_or(0) > 0,
            "{what}: b{i} got nothing: {tally:?}"
        );
    }
    assert_eq!(
        tally.len(),
        backends,
        "{what}: unexpected answers {tally:?}"
    );
}

#[test]
fn nft_dnat_random_spreads_tcp_and_udp_over_all_backends_v4_and_v6() {
    if require(
        "nft_dnat_random_spreads_tcp_and_udp_over_all_backends_v4_and_v6",
        &["nft"],
    )
    .is_err()
    {
        return;
    }
    let topo = topology(3);
    let _servers = servers::start_all(&topo).unwrap();
    let dnat = NftDnat::install(&topo, TCP_ECHO_PORT, Selector::Random).unwrap();
    // 60 flows over 3 backends: P(some backend gets none) = 3·(2/3)^60 ≈ 1e-10.
    for vip in [vip_v4(TCP_ECHO_PORT), vip_v6(TCP_ECHO_PORT)] {
        let tally = client::tcp_tally(topo.client(), vip, 60).unwrap();
        assert_eq!(client::total(&tally), 60);
        assert_all_backends_used(&tally, 3, &format!("TCP {vip}"));
        let tally =
            client::udp_tally(topo.client(), SocketAddr::new(vip.ip(), UDP_NAME_PORT), 60).unwrap();
        assert_all_backends_used(&tally, 3, &format!("UDP {vip}"));
    }
    // Open connections stay on their backend while more are made.
    let mut sessions = client::tcp_sessions(topo.client(), vip_v4(TCP_ECHO_PORT), 10).unwrap();
    client::tcp_tally(topo.client(), vip_v4(TCP_ECHO_PORT), 10).unwrap();
    for (k, s) in sessions.iter_mut().enumerate() {
        s.echo(&client::payload(k, 4096)).unwrap();
    }
    dnat.remove().unwrap();
    let left = topo.lb().exec(&["nft", "list", "tables"]).unwrap();
    assert!(
        !left.contains(router_tests::nft::TABLE),
        "table not removed: {left}"
    );
}

#[test]
fn nft_dnat_jhash_spreads_connections_and_removal_stops_balancing() {
    if require(
        "nft_dnat_jhash_spreads_connections_and_removal_stops_balancing",
        &["nft"],
    )
    .is_err()
    {
        return;
    }
    let topo = topology(2);
    let _servers = servers::start_all(&topo).unwrap();
    let dnat = NftDnat::install(&topo, TCP_ECHO_PORT, Selector::Jhash).unwrap();
    assert!(dnat.ruleset().contains("jhash ip saddr . tcp sport mod 2"));
    let tally = client::tcp_tally(topo.client(), vip_v4(TCP_ECHO_PORT), 40).unwrap();
    assert_all_backends_used(&tally, 2, "jhash TCP v4");
    let tally = client::tcp_tally(topo.client(), vip_v6(TCP_ECHO_PORT), 40).unwrap();
    assert_all_backends_used(&tally, 2, "jhash TCP v6");
    dnat.remove().unwrap();
    let result = topo
        .client()
        .run(|| TcpSession::connect_with_timeout(vip_v4(TCP_ECHO_PORT), Duration::from_millis(500)))
        .unwrap();
    assert!(
        result.is_err(),
        "VIP still answers after the baseline was removed"
    );
}
