//! The topology's routes: backends reply from the VIP over their return link and from their own
//! address via the lb; the client reaches the lb, each backend and (through the router) a routed
//! backend; the VIP answers nothing without a load balancer.

use std::net::IpAddr;
use std::time::Duration;

use router_tests::addrs::{
    BACKEND_IF, BACKEND_RETURN_IF, CLIENT_V4, CLIENT_V6, LB_CLIENT_IF, LB_CLIENT_SIDE_V4,
    LB_CLIENT_SIDE_V6, LB_ROUTER_IF, LB_ROUTER_SIDE_V4, ROUTER_LB_IF, TCP_ECHO_PORT, UDP_NAME_PORT,
    VIP_V4, VIP_V6, backend_name, backend_return_v4, backend_return_v6, backend_v4, backend_v6,
    client_return_side_v4, client_return_side_v6, lb_backend_if, lb_backend_side_v4,
    lb_backend_side_v6, vip_v4,
};
use router_tests::client::{self, Tally, TcpSession};
use router_tests::netns::{Netns, Topology};
use router_tests::privileged::require_root_and_bpf;
use router_tests::servers::{self};

use super::{addr, sysctl, topology};

/// `ip route get` in `ns`, reduced to its first line.
fn route_get(ns: &Netns, args: &[&str]) -> String {
    let mut command = vec!["route", "get"];
    command.extend(args);
    let out = ns.ip(&command).unwrap();
    out.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn backends_reply_from_the_vip_over_the_return_link_and_from_their_address_via_the_lb() {
    if require_root_and_bpf(
        "backends_reply_from_the_vip_over_the_return_link_and_from_their_address_via_the_lb",
    )
    .is_err()
    {
        return;
    }
    let topo = topology(2);
    for i in 1..=2 {
        let b = topo.backend(i);
        for (client, vip, own, lb, router) in [
            (
                IpAddr::from(CLIENT_V4),
                IpAddr::from(VIP_V4),
                IpAddr::from(backend_v4(i)),
                IpAddr::from(lb_backend_side_v4(i)),
                IpAddr::from(client_return_side_v4(i)),
            ),
            (
                CLIENT_V6.into(),
                VIP_V6.into(),
                backend_v6(i).into(),
                lb_backend_side_v6(i).into(),
                client_return_side_v6(i).into(),
            ),
        ] {
            let (client, vip, own) = (client.to_string(), vip.to_string(), own.to_string());
            let dsr = route_get(b, &[&client, "from", &vip]);
            assert!(
                dsr.contains(&format!("via {router} dev {BACKEND_RETURN_IF}")),
                "b{i}: a DSR reply must take the return link: {dsr}"
            );
            let nat = route_get(b, &[&client, "from", &own]);
            assert!(
                nat.contains(&format!("via {lb} dev {BACKEND_IF}")),
                "b{i}: a NAT reply must go through the lb: {nat}"
            );
            let health = route_get(b, &[&lb.to_string(), "from", &own]);
            assert!(
                health.contains(&format!("dev {BACKEND_IF}")),
                "b{i}: a reply to the lb must stay on its link: {health}"
            );
        }
    }

    // A real datagram from the VIP reaches the client over the return link, with the VIP as
    // its source, although the lb does not forward.
    for (vip, client_addr) in [
        (IpAddr::from(VIP_V4), IpAddr::from(CLIENT_V4)),
        (VIP_V6.into(), CLIENT_V6.into()),
    ] {
        let listener = topo
            .client()
            .run(move || std::net::UdpSocket::bind((client_addr, 0)).unwrap())
            .unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let to = listener.local_addr().unwrap();
        topo.backend(2)
            .run(move || {
                let sock = std::net::UdpSocket::bind((vip, 0)).unwrap();
                sock.send_to(b"dsr", to).unwrap();
            })
            .unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = listener.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from.ip()), (&b"dsr"[..], vip));
    }

    // A datagram from a backend's own address is sent to the lb (which, forwarding off,
    // drops it): the lb's veth towards the backend receives it.
    let received = |ns: &Netns, dev: &str| -> u64 {
        let text = ns
            .exec(&[
                "cat",
                &format!("/sys/class/net/{dev}/statistics/rx_packets"),
            ])
            .unwrap();
        text.trim().parse().unwrap()
    };
    let before = received(topo.lb(), &lb_backend_if(1));
    let datagrams: u64 = 20;
    topo.backend(1)
        .run(|| {
            let sock = std::net::UdpSocket::bind((backend_v4(1), 0)).unwrap();
            for _ in 0..datagrams {
                sock.send_to(b"nat", (CLIENT_V4, 9)).unwrap();
            }
        })
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while received(topo.lb(), &lb_backend_if(1)) < before + datagrams {
        assert!(
            std::time::Instant::now() < deadline,
            "the lb did not receive the backend's NAT-source datagrams"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `dst` answers from inside `ns`, like a ping without a ping binary: a datagram to
/// the discard port, where nothing listens, comes back as ICMP port unreachable, which a
/// connected socket reports as "connection refused". Three tries, 1 s each.
fn reachable(ns: &Netns, dst: IpAddr) -> bool {
    ns.run(move || {
        let any: IpAddr = if dst.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        let sock = std::net::UdpSocket::bind((any, 0)).unwrap();
        sock.connect((dst, 9)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        (0..3).any(|_| {
            let _ = sock.send(b"?");
            let mut buf = [0u8; 8];
            matches!(sock.recv(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
        })
    })
    .unwrap()
}

#[test]
fn client_reaches_the_lb_and_the_lb_reaches_a_routed_backend_via_the_router() {
    if require_root_and_bpf(
        "client_reaches_the_lb_and_the_lb_reaches_a_routed_backend_via_the_router",
    )
    .is_err()
    {
        return;
    }
    let topo = Topology::builder()
        .backends(1)
        .routed_backend()
        .build()
        .unwrap();
    assert_eq!(topo.routed_backend(), Some(2));
    assert_eq!(topo.backend_count(), 2);
    assert_eq!(topo.direct_backend_count(), 1);
    let router = topo.router().expect("a router namespace");
    assert!(router.name().ends_with("-rt"), "{}", router.name());
    assert_eq!(topo.lb_interfaces(), [LB_CLIENT_IF, "to-b1", LB_ROUTER_IF]);
    assert_eq!(sysctl(router, "net.ipv4.ip_forward"), "1");
    assert_eq!(sysctl(router, "net.ipv6.conf.all.forwarding"), "1");
    assert!(
        router.xdp_program(ROUTER_LB_IF).unwrap().is_some(),
        "the router's veth facing the lb needs XDP_PASS"
    );
    for dst in [IpAddr::from(LB_CLIENT_SIDE_V4), LB_CLIENT_SIDE_V6.into()] {
        assert!(reachable(topo.client(), dst), "client → lb {dst}");
    }
    for dst in [IpAddr::from(backend_v4(2)), backend_v6(2).into()] {
        let route = route_get(topo.lb(), &[&dst.to_string()]);
        assert!(
            route.contains(&format!("dev {LB_ROUTER_IF}")) && route.contains("via"),
            "the lb's next hop for the routed backend is the router: {route}"
        );
        assert!(reachable(topo.lb(), dst), "lb → routed backend {dst}");
    }
    // The directly attached backend's own addresses, from the lb, on the link.
    for dst in [IpAddr::from(backend_v4(1)), backend_v6(1).into()] {
        assert!(reachable(topo.lb(), dst), "lb → b1 {dst}");
    }
    // The routed backend's NAT-source replies go via the router, which routes them to the lb.
    let from_routed = route_get(
        router,
        &[
            &CLIENT_V4.to_string(),
            "from",
            &backend_v4(2).to_string(),
            "iif",
            &lb_backend_if(2),
        ],
    );
    assert!(
        from_routed.contains(&format!("via {LB_ROUTER_SIDE_V4} dev {ROUTER_LB_IF}")),
        "{from_routed}"
    );
}

#[test]
fn client_reaches_each_backend_over_tcp_and_udp_on_its_return_link_v4_and_v6() {
    if require_root_and_bpf(
        "client_reaches_each_backend_over_tcp_and_udp_on_its_return_link_v4_and_v6",
    )
    .is_err()
    {
        return;
    }
    let topo = topology(2);
    let servers = servers::start_all(&topo).unwrap();
    for i in 1..=2 {
        for ip in [
            IpAddr::from(backend_return_v4(i)),
            backend_return_v6(i).into(),
        ] {
            let tally = client::tcp_tally(topo.client(), addr(ip, TCP_ECHO_PORT), 3).unwrap();
            assert_eq!(tally, Tally::from([(backend_name(i), 3)]), "TCP {ip}");
            let tally = client::udp_tally(topo.client(), addr(ip, UDP_NAME_PORT), 3).unwrap();
            assert_eq!(tally, Tally::from([(backend_name(i), 3)]), "UDP {ip}");
        }
    }
    // A larger transfer crosses the XDP_PASS programs with valid checksums.
    let mut session = topo
        .client()
        .run(|| TcpSession::connect(addr(backend_return_v6(2), TCP_ECHO_PORT)))
        .unwrap()
        .unwrap();
    session.echo(&client::payload(7, 1 << 20)).unwrap();
    session.finish().unwrap();
    assert_eq!(servers[0].tcp_connections(), 6);
    assert_eq!(servers[1].udp_datagrams(), 6);
}

#[test]
fn vip_is_unreachable_without_a_load_balancer() {
    if require_root_and_bpf("vip_is_unreachable_without_a_load_balancer").is_err() {
        return;
    }
    let topo = topology(1);
    let _servers = servers::start_all(&topo).unwrap();
    let result = topo
        .client()
        .run(|| TcpSession::connect_with_timeout(vip_v4(TCP_ECHO_PORT), Duration::from_millis(500)))
        .unwrap();
    assert!(
        result.is_err(),
        "nothing balances the VIP, yet a backend answered"
    );
}
