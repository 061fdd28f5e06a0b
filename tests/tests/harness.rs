//! T2 tests of the namespace harness itself, without Switchyard: the topology routes, the
//! servers answer, the nftables baseline balances, and nothing is left behind.
//!
//! Each test skips loudly without root and BPF (and fails under `CI=true`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use router_tests::addrs::{
    BACKEND_IF, BACKEND_RETURN_IF, CLIENT_IF, CLIENT_V4, CLIENT_V6, HEALTH_PORT, LB_CLIENT_IF,
    LB_CLIENT_SIDE_V4, LB_CLIENT_SIDE_V6, LB_ROUTER_IF, LB_ROUTER_SIDE_V4, ROUTER_LB_IF,
    TCP_ECHO_PORT, UDP_NAME_PORT, VIP_V4, VIP_V6, backend_name, backend_return_v4,
    backend_return_v6, backend_v4, backend_v6, client_return_side_v4, client_return_side_v6,
    lb_backend_if, lb_backend_side_v4, lb_backend_side_v6, vip_v4, vip_v6,
};
use router_tests::client::{self, Tally, TcpSession};
use router_tests::netns::{self, Netns, Topology};
use router_tests::nft::{NftDnat, Selector};
use router_tests::privileged::{require, require_root_and_bpf};
use router_tests::servers::{self, BackendServers};

fn addr(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

fn topology(backends: usize) -> Topology {
    Topology::builder()
        .backends(backends)
        .build()
        .expect("build topology")
}

fn names(topo: &Topology) -> Vec<String> {
    topo.namespaces()
        .iter()
        .map(|n| n.name().to_owned())
        .collect()
}

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
fn topology_creates_unique_short_names_and_deletes_them_on_drop() {
    if require_root_and_bpf("topology_creates_unique_short_names_and_deletes_them_on_drop").is_err()
    {
        return;
    }
    let a = topology(3);
    let b = topology(1);
    let (a_names, b_names) = (names(&a), names(&b));
    assert_eq!(a_names.len(), 5);
    let listed = netns::list_namespaces().unwrap();
    for n in a_names.iter().chain(&b_names) {
        assert!(n.starts_with("sy") && n.len() <= 15, "bad name {n}");
        assert!(listed.contains(n), "{n} not in `ip netns list`");
    }
    assert!(
        a_names.iter().all(|n| !b_names.contains(n)),
        "names collide"
    );
    drop(a);
    b.teardown().unwrap();
    let listed = netns::list_namespaces().unwrap();
    for n in a_names.iter().chain(&b_names) {
        assert!(!listed.contains(n), "{n} left behind");
    }
}

#[test]
fn topology_is_torn_down_when_a_test_panics() {
    if require_root_and_bpf("topology_is_torn_down_when_a_test_panics").is_err() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let topo = topology(1);
        tx.send(names(&topo)).unwrap();
        panic!("a failing test");
    });
    assert!(result.is_err());
    let created = rx.recv().unwrap();
    let listed = netns::list_namespaces().unwrap();
    for n in &created {
        assert!(!listed.contains(n), "{n} survived the panic");
    }
}

/// The root namespace's links, addresses, routes and neighbours, one line each.
fn root_snapshot() -> std::collections::BTreeSet<String> {
    ["link", "addr", "route", "-6 route", "neigh"]
        .iter()
        .flat_map(|args| {
            let argv: Vec<&str> = ["-o"].into_iter().chain(args.split(' ')).collect();
            let out = std::process::Command::new("ip")
                .args(&argv)
                .output()
                .unwrap();
            assert!(out.status.success(), "ip {argv:?} failed");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Lines of `now` that are not in `before` and name anything of the harness: its address
/// ranges, MAC prefix or interface names. (Only those: on a shared machine other things may
/// change the root namespace meanwhile.)
fn harness_traces(
    before: &std::collections::BTreeSet<String>,
    now: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    now.difference(before)
        .filter(|l| {
            [
                "198.18.",
                "198.19.",
                "2001:db8",
                "02:53:59",
                "to-lb",
                "to-client",
                "to-b",
            ]
            .iter()
            .any(|m| l.contains(m))
        })
        .cloned()
        .collect()
}

#[test]
fn topology_leaves_the_root_namespace_untouched() {
    if require_root_and_bpf("topology_leaves_the_root_namespace_untouched").is_err() {
        return;
    }
    let before = root_snapshot();
    let topo = topology(2);
    let servers = servers::start_all(&topo).unwrap();
    client::tcp_tally(topo.client(), addr(backend_return_v4(1), TCP_ECHO_PORT), 1).unwrap();
    assert_eq!(
        harness_traces(&before, &root_snapshot()),
        Vec::<String>::new(),
        "while running"
    );
    drop(servers);
    drop(topo);
    assert_eq!(
        harness_traces(&before, &root_snapshot()),
        Vec::<String>::new(),
        "after teardown"
    );
}

#[test]
fn closures_and_commands_run_inside_the_namespace() {
    if require_root_and_bpf("closures_and_commands_run_inside_the_namespace").is_err() {
        return;
    }
    let topo = topology(1);
    let dev = |ns: &Netns| {
        ns.run(|| {
            let text = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
            let mut ifs: Vec<String> = text
                .lines()
                .skip(2)
                .map(|l| l.split(':').next().unwrap().trim().to_owned())
                .collect();
            ifs.sort();
            ifs
        })
        .unwrap()
    };
    assert_eq!(dev(topo.client()), ["lo", "to-b1", CLIENT_IF]);
    assert_eq!(dev(topo.lb()), ["lo", "to-b1", LB_CLIENT_IF]);
    let handle = topo
        .backend(1)
        .spawn(|| std::fs::read_to_string("/proc/thread-self/net/dev").unwrap())
        .unwrap();
    assert!(handle.join().unwrap().contains(BACKEND_IF));
    assert!(
        topo.lb()
            .exec(&["ip", "-o", "link"])
            .unwrap()
            .contains(LB_CLIENT_IF)
    );
    assert!(
        topo.backend(1).exec(&["false"]).is_err(),
        "a failing command must be an error"
    );
}

#[test]
fn receiving_veths_run_xdp_pass_and_hosts_have_tx_checksum_offload_off() {
    if require_root_and_bpf("receiving_veths_run_xdp_pass_and_hosts_have_tx_checksum_offload_off")
        .is_err()
    {
        return;
    }
    let topo = topology(2);
    for (ns, ifname) in [
        (topo.client(), CLIENT_IF),
        (topo.backend(1), BACKEND_IF),
        (topo.backend(2), BACKEND_IF),
    ] {
        let link = ns.ip(&["-d", "link", "show", ifname]).unwrap();
        assert!(
            link.contains("xdp") && link.contains("prog/xdp"),
            "{}: no native XDP:\n{link}",
            ns.name()
        );
        let features = ns.exec(&["ethtool", "-k", ifname]).unwrap();
        assert!(
            features.contains("tx-checksumming: off"),
            "{}: tx offload on",
            ns.name()
        );
    }
    let lb_link = topo.lb().ip(&["-d", "link", "show", LB_CLIENT_IF]).unwrap();
    assert!(
        !lb_link.contains("prog/xdp"),
        "the lb's interfaces are left for Switchyard"
    );
}

/// `sysctl -n key` in `ns`.
fn sysctl(ns: &Netns, key: &str) -> String {
    ns.exec(&["sysctl", "-n", key]).unwrap().trim().to_owned()
}

/// The `net.*` sysctls of `ns` that are not per interface (`conf.all`, `conf.default` and
/// everything outside `conf` and `neigh`), as `key = value` lines.
fn namespace_sysctls(ns: &Netns) -> Vec<String> {
    let all = ns.exec(&["sysctl", "-a", "-r", "^net\\."]).unwrap();
    all.lines()
        .filter(|l| {
            let key = l.split(" = ").next().unwrap_or_default();
            let per_device = [".conf.", ".neigh."].iter().any(|part| {
                key.split_once(part).is_some_and(|(_, rest)| {
                    !rest.starts_with("all.") && !rest.starts_with("default.")
                })
            });
            !per_device
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn lb_keeps_the_kernel_defaults_and_backends_are_configured_as_the_readme_says() {
    if require_root_and_bpf(
        "lb_keeps_the_kernel_defaults_and_backends_are_configured_as_the_readme_says",
    )
    .is_err()
    {
        return;
    }
    let topo = topology(2);
    // The lb: every namespace-wide sysctl as in a namespace nobody configured, and no
    // neighbour entry anyone wrote.
    struct Fresh(Netns);
    impl Drop for Fresh {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", self.0.name()])
                .status();
        }
    }
    let fresh = Fresh(Netns::new(format!("{}-fresh", topo.tag())));
    let status = std::process::Command::new("ip")
        .args(["netns", "add", fresh.0.name()])
        .status()
        .unwrap();
    assert!(status.success(), "ip netns add {}", fresh.0.name());
    let (lb, reference) = (namespace_sysctls(topo.lb()), namespace_sysctls(&fresh.0));
    drop(fresh);
    let differs: Vec<&String> = lb.iter().filter(|l| !reference.contains(l)).collect();
    assert!(differs.is_empty(), "lb sysctls changed: {differs:?}");
    assert_eq!(sysctl(topo.lb(), "net.ipv4.ip_forward"), "0");
    assert_eq!(sysctl(topo.lb(), "net.ipv6.conf.all.forwarding"), "0");
    let permanent = topo
        .lb()
        .ip(&["neigh", "show", "nud", "permanent"])
        .unwrap();
    assert_eq!(permanent.trim(), "", "static neighbours on the lb");

    // A backend: the VIPs on lo and exactly the README's sysctls.
    let b1 = topo.backend(1);
    let lo = b1.ip(&["addr", "show", "dev", "lo"]).unwrap();
    assert!(
        lo.contains(&format!("{VIP_V4}/32")) && lo.contains(&format!("{VIP_V6}/128")),
        "{lo}"
    );
    for (key, value) in [
        ("net.ipv4.conf.all.arp_ignore", "1"),
        ("net.ipv4.conf.all.arp_announce", "2"),
        ("net.ipv4.conf.all.rp_filter", "2"),
        ("net.ipv4.conf.all.arp_notify", "1"),
        ("net.ipv6.conf.all.ndisc_notify", "1"),
        ("net.ipv4.ip_forward", "0"),
    ] {
        assert_eq!(sysctl(b1, key), value, "{key}");
    }
    assert_eq!(sysctl(topo.client(), "net.ipv4.conf.all.rp_filter"), "2");
}

/// `ip route get` in `ns`, reduced to its first line.
fn route_get(ns: &Netns, args: &[&str]) -> String {
    let mut argv = vec!["route", "get"];
    argv.extend(args);
    let out = ns.ip(&argv).unwrap();
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
    const N: u64 = 20;
    topo.backend(1)
        .run(|| {
            let sock = std::net::UdpSocket::bind((backend_v4(1), 0)).unwrap();
            for _ in 0..N {
                sock.send_to(b"nat", (CLIENT_V4, 9)).unwrap();
            }
        })
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while received(topo.lb(), &lb_backend_if(1)) < before + N {
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
fn health_endpoint_answers_200_then_503_then_refuses_when_killed() {
    if require_root_and_bpf("health_endpoint_answers_200_then_503_then_refuses_when_killed")
        .is_err()
    {
        return;
    }
    let topo = topology(1);
    let mut b1 = BackendServers::start_standard(&topo, 1).unwrap();
    let v4 = addr(backend_return_v4(1), HEALTH_PORT);
    let v6 = addr(backend_return_v6(1), HEALTH_PORT);
    let status = |a: SocketAddr, path: &'static str| {
        topo.client()
            .run(move || client::http_status(a, path))
            .unwrap()
    };
    assert_eq!(status(v4, "/health").unwrap(), 200);
    assert_eq!(status(v6, "/health").unwrap(), 200);
    assert_eq!(status(v4, "/other").unwrap(), 404);
    b1.set_healthy(false);
    assert_eq!(status(v4, "/health").unwrap(), 503);
    b1.set_healthy(true);
    assert_eq!(status(v6, "/health").unwrap(), 200);
    b1.kill_health();
    let err = status(v4, "/health").unwrap_err();
    let refused = err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    });
    assert!(refused, "expected connection refused, got {err:#}");
    // The echo server still runs.
    let tally =
        client::tcp_tally(topo.client(), addr(backend_return_v4(1), TCP_ECHO_PORT), 1).unwrap();
    assert_eq!(tally, Tally::from([("b1".to_owned(), 1)]));
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

#[test]
fn sweep_removes_namespaces_left_by_dead_processes_only() {
    if require_root_and_bpf("sweep_removes_namespaces_left_by_dead_processes_only").is_err() {
        return;
    }
    let dead = (1..0x3f_ffffu32)
        .rev()
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let stale = format!("sy{dead:x}-0-lb");
    let status = std::process::Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    assert!(status.success());
    let live = topology(1);
    let swept = netns::sweep_stale().unwrap();
    let listed = netns::list_namespaces().unwrap();
    if listed.contains(&stale) {
        // Leave nothing behind even if the assertion below fails.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &stale])
            .status();
    }
    assert!(
        swept.contains(&stale) || !listed.contains(&stale),
        "{stale} not swept"
    );
    for n in names(&live) {
        assert!(listed.contains(&n), "sweep removed the live namespace {n}");
    }
}

/// A 19-instruction DSR redirector for IPv4 (the lb's side of what Switchyard's `dsr-l2` mode
/// does): frames to the IPv4 VIP get backend `i`'s MACs and are redirected into its veth;
/// everything else passes.
#[cfg(target_endian = "little")]
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
