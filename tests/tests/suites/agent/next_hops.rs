//! T2 tests of the next-hop resolver (`switchyard::nexthop`) in the lb namespace of a real
//! topology, without Switchyard's program: routes, links and neighbour entries are the
//! kernel's, the backends answer ARP and NDP themselves.
//!
//! The topology writes permanent neighbour entries on the lb; each test deletes them first, so
//! the resolver has to create its own (kernel-managed) entries and the kernel has to resolve
//! them. Each test skips loudly without root and BPF (and fails under `CI=true`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use router_tests::addrs::{
    BACKEND_IF, backend_mac, backend_v4, backend_v6, lb_backend_if, lb_backend_side_mac, mac_string,
};
use router_tests::netns::{Netns, Topology};
use router_tests::privileged::{require, require_root_and_bpf};
use switchyard::nexthop::{self, NextHop, NextHopEvent, RESYNC, Resolution};
use tokio::sync::mpsc;

/// Longest a resolution may take: ARP/NDP on a veth answers in microseconds, this is room
/// for a loaded machine.
const RESOLVE_DEADLINE: Duration = Duration::from_secs(10);

enum Command {
    /// Each set in turn, with no await in between: no round of the resolver runs between them.
    SetTargets(Vec<BTreeSet<IpAddr>>),
    Snapshot(std_mpsc::Sender<BTreeMap<IpAddr, Resolution>>),
}

/// A resolver running on a tokio runtime in a thread inside a namespace, and what it reported.
struct Running {
    commands: mpsc::UnboundedSender<Command>,
    events: std_mpsc::Receiver<(Instant, NextHopEvent)>,
    /// The latest resolution of every target, from the events received so far.
    state: BTreeMap<IpAddr, Resolution>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn start(ns: &Netns) -> Running {
        let (commands, mut command_rx) = mpsc::unbounded_channel::<Command>();
        let (event_tx, events) = std_mpsc::channel();
        let (started_tx, started_rx) = std_mpsc::channel();
        let thread = ns
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                runtime.block_on(async move {
                    let (tx, mut rx) = mpsc::channel(16);
                    let resolver = match nexthop::spawn(tx) {
                        Ok(r) => {
                            started_tx.send(Ok(())).unwrap();
                            r
                        }
                        Err(e) => {
                            started_tx.send(Err(e.to_string())).unwrap();
                            return;
                        }
                    };
                    loop {
                        tokio::select! {
                            command = command_rx.recv() => match command {
                                Some(Command::SetTargets(sets)) => {
                                    for t in sets {
                                        resolver.set_targets(t);
                                    }
                                }
                                Some(Command::Snapshot(reply)) => {
                                    let _ = reply.send(resolver.snapshot());
                                }
                                None => return,
                            },
                            batch = rx.recv() => {
                                let Some(batch) = batch else { return };
                                let now = Instant::now();
                                for event in batch {
                                    if event_tx.send((now, event)).is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    }
                });
            })
            .expect("spawn the resolver thread in the lb namespace");
        started_rx
            .recv()
            .expect("resolver thread")
            .expect("nexthop::spawn");
        Running {
            commands,
            events,
            state: BTreeMap::new(),
            thread: Some(thread),
        }
    }

    fn set_targets(&self, targets: &[IpAddr]) {
        self.set_targets_in_turn(&[targets]);
    }

    /// Sets each of `sets` in turn, faster than a round: the resolver sees only the last.
    fn set_targets_in_turn(&self, sets: &[&[IpAddr]]) {
        let sets = sets.iter().map(|t| t.iter().copied().collect()).collect();
        self.commands
            .send(Command::SetTargets(sets))
            .expect("resolver thread alive");
    }

    fn snapshot(&self) -> BTreeMap<IpAddr, Resolution> {
        let (tx, rx) = std_mpsc::channel();
        self.commands
            .send(Command::Snapshot(tx))
            .expect("resolver thread alive");
        rx.recv_timeout(Duration::from_secs(5)).expect("snapshot")
    }

    /// Receives events until `done(state)` holds; returns the events seen on the way, with
    /// when each arrived. Panics at the deadline with the state and those events.
    fn wait_until(
        &mut self,
        what: &str,
        deadline: Duration,
        mut done: impl FnMut(&BTreeMap<IpAddr, Resolution>) -> bool,
    ) -> Vec<(Instant, NextHopEvent)> {
        let end = Instant::now() + deadline;
        let mut seen = Vec::new();
        while !done(&self.state) {
            let left = end.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok((at, event)) => {
                    self.state.insert(event.address, event.resolution.clone());
                    seen.push((at, event));
                }
                Err(e) => panic!(
                    "{what}: not within {deadline:?} ({e}); state {:#?}; events {seen:#?}",
                    self.state
                ),
            }
        }
        seen
    }

    /// Every event that arrives within `window`.
    fn events_within(&mut self, window: Duration) -> Vec<NextHopEvent> {
        let end = Instant::now() + window;
        let mut seen = Vec::new();
        while let Ok((_, event)) = self
            .events
            .recv_timeout(end.saturating_duration_since(Instant::now()))
        {
            self.state.insert(event.address, event.resolution.clone());
            seen.push(event);
        }
        seen
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let (dead, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.commands, dead));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn topology() -> Topology {
    let topo = Topology::builder().backends(2).build().expect("topology");
    // The harness's permanent entries would answer for the resolver: it must make its own.
    topo.lb()
        .ip(&["neigh", "flush", "all", "nud", "all"])
        .expect("flush the lb's neighbour table");
    let left = topo.lb().ip(&["neigh", "show"]).unwrap();
    assert!(
        !left.contains("PERMANENT"),
        "permanent entries left: {left}"
    );
    topo
}

fn ip(a: impl Into<IpAddr>) -> IpAddr {
    a.into()
}

/// The next hop backend `i` must resolve to, on its own segment.
fn direct(i: usize, ifindex: u32) -> NextHop {
    NextHop {
        ifindex,
        iface: lb_backend_if(i),
        smac: lb_backend_side_mac(i),
        dmac: backend_mac(i),
        gateway: None,
        mtu: 1500,
    }
}

fn ifindex(ns: &Netns, iface: &str) -> u32 {
    let text = ns.ip(&["-o", "link", "show", "dev", iface]).unwrap();
    text.split(':').next().unwrap().trim().parse().unwrap()
}

/// `ip neigh show ADDR dev IF` in `ns`.
fn neigh_line(ns: &Netns, addr: IpAddr, iface: &str) -> String {
    ns.ip(&["neigh", "show", &addr.to_string(), "dev", iface])
        .unwrap()
        .trim()
        .to_owned()
}

fn resolved_to(state: &BTreeMap<IpAddr, Resolution>, addr: IpAddr, hop: &NextHop) -> bool {
    state.get(&addr) == Some(&Resolution::Resolved(hop.clone()))
}

/// Polls `cond` every 20 ms until it holds or `deadline` passes.
fn poll(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn both_families_resolve_through_managed_entries_that_survive_a_flush() {
    if require(
        "both_families_resolve_through_managed_entries_that_survive_a_flush",
        &["nft"],
    )
    .is_err()
    {
        return;
    }
    let topo = topology();
    let lb = topo.lb();
    let mut running = Running::start(lb);
    let targets: Vec<IpAddr> = (1..=2)
        .flat_map(|i| [ip(backend_v4(i)), ip(backend_v6(i))])
        .collect();
    running.set_targets(&targets);
    let hops: Vec<NextHop> = (1..=2)
        .map(|i| direct(i, ifindex(lb, &lb_backend_if(i))))
        .collect();
    running.wait_until("all four resolve", RESOLVE_DEADLINE, |s| {
        (1..=2).all(|i| {
            resolved_to(s, ip(backend_v4(i)), &hops[i - 1])
                && resolved_to(s, ip(backend_v6(i)), &hops[i - 1])
        })
    });
    for i in 1..=2 {
        for addr in [ip(backend_v4(i)), ip(backend_v6(i))] {
            let line = neigh_line(lb, addr, &lb_backend_if(i));
            assert!(line.contains("managed"), "{addr}: not managed: {line:?}");
            assert!(
                line.contains(&mac_string(backend_mac(i))),
                "{addr}: wrong MAC: {line:?}"
            );
        }
    }
    assert_eq!(running.snapshot(), running.state);

    // While b1 does not answer, its flushed entries are re-created and stay INCOMPLETE; the
    // lb gives up only after 10 solicitations (1 s apart), well after the checks below.
    lb.sysctl(&[
        ("net.ipv4.neigh.to-b1.mcast_solicit", "10"),
        ("net.ipv6.neigh.to-b1.mcast_solicit", "10"),
    ])
    .unwrap();
    let b1 = &topo.backends()[0];
    b1.exec_with_stdin(&["nft", "-f", "-"], Some(BLOCK_SOLICITATIONS))
        .unwrap();
    let flushed = lb.ip(&["-s", "neigh", "flush", "all"]).unwrap();
    eprintln!("{}", flushed.trim());
    assert!(
        flushed.contains("deleting"),
        "the flush deleted nothing: {flushed}"
    );
    let entry_of = |k: usize| neigh_line(lb, targets[k], &lb_backend_if(k / 2 + 1));
    let recreated = poll(RESOLVE_DEADLINE, || {
        (0..targets.len()).all(|k| {
            let line = entry_of(k);
            line.contains("managed")
                && if k < 2 {
                    line.contains("INCOMPLETE")
                } else {
                    line.contains("lladdr")
                }
        })
    });
    assert!(
        recreated,
        "the flushed entries were not re-created: {}",
        lb.ip(&["neigh"]).unwrap()
    );
    // A full resync while b1's entries re-resolve: nothing may be reported.
    let events = running.events_within(RESYNC + Duration::from_millis(300));
    assert!(
        events.is_empty(),
        "a flush or an INCOMPLETE re-resolution was reported: {events:#?}"
    );
    assert!(
        entry_of(0).contains("INCOMPLETE"),
        "b1 answered too early: {}",
        entry_of(0)
    );

    b1.exec(&["nft", "delete", "table", "netdev", "sy_block"])
        .unwrap();
    let back = poll(RESOLVE_DEADLINE, || {
        (0..targets.len()).all(|k| entry_of(k).contains("lladdr"))
    });
    assert!(
        back,
        "b1's entries did not resolve again: {}",
        lb.ip(&["neigh"]).unwrap()
    );
    let events = running.events_within(RESYNC + Duration::from_millis(300));
    assert!(
        events.is_empty(),
        "the same MACs were reported: {events:#?}"
    );
    let snapshot = running.snapshot();
    for (k, addr) in targets.iter().enumerate() {
        assert_eq!(
            snapshot.get(addr),
            Some(&Resolution::Resolved(hops[k / 2].clone())),
            "{addr} after the flush"
        );
    }
}

/// nftables for a backend: drop the lb's ARP requests and neighbour solicitations.
const BLOCK_SOLICITATIONS: &str = r#"
table netdev sy_block {
    chain ingress {
        type filter hook ingress device "to-lb" priority 0; policy accept;
        arp operation request drop
        icmpv6 type nd-neighbor-solicit drop
    }
}
"#;

#[test]
fn a_backend_mac_change_is_followed() {
    if require_root_and_bpf("a_backend_mac_change_is_followed").is_err() {
        return;
    }
    let topo = topology();
    let lb = topo.lb();
    let b1 = &topo.backends()[0];
    // The backend announces its new MAC (gratuitous ARP, unsolicited NA) when it changes.
    b1.sysctl(&[
        ("net.ipv4.conf.all.arp_notify", "1"),
        ("net.ipv6.conf.all.ndisc_notify", "1"),
        (&format!("net.ipv4.conf.{BACKEND_IF}.arp_notify"), "1"),
        (&format!("net.ipv6.conf.{BACKEND_IF}.ndisc_notify"), "1"),
    ])
    .unwrap();
    let mut running = Running::start(lb);
    let targets = [ip(backend_v4(1)), ip(backend_v6(1))];
    running.set_targets(&targets);
    let before = direct(1, ifindex(lb, &lb_backend_if(1)));
    running.wait_until("b1 resolves", RESOLVE_DEADLINE, |s| {
        targets.iter().all(|a| resolved_to(s, *a, &before))
    });

    let new_mac = [0x02, 0x53, 0x59, 0x00, 0x99, 0x01];
    let after = NextHop {
        dmac: new_mac,
        ..before.clone()
    };
    let changed = Instant::now();
    b1.ip(&[
        "link",
        "set",
        "dev",
        BACKEND_IF,
        "address",
        &mac_string(new_mac),
    ])
    .unwrap();
    let seen = running.wait_until("the new MAC is reported", Duration::from_mins(1), |s| {
        targets.iter().all(|a| resolved_to(s, *a, &after))
    });
    for addr in targets {
        let (at, _) = seen
            .iter()
            .find(|(_, e)| e.address == addr && e.resolution == Resolution::Resolved(after.clone()))
            .expect("the event that reached the state");
        eprintln!(
            "MAC change of {addr} reported after {:?}",
            at.duration_since(changed)
        );
    }
    assert!(
        seen.iter()
            .all(|(_, e)| matches!(e.resolution, Resolution::Resolved(_))),
        "the change went through Unresolved: {seen:#?}"
    );
}

#[test]
fn an_egress_mtu_change_is_followed() {
    if require_root_and_bpf("an_egress_mtu_change_is_followed").is_err() {
        return;
    }
    let topo = topology();
    let lb = topo.lb();
    let mut running = Running::start(lb);
    let targets = [ip(backend_v4(1)), ip(backend_v6(1))];
    running.set_targets(&targets);
    let before = direct(1, ifindex(lb, &lb_backend_if(1)));
    running.wait_until("b1 resolves", RESOLVE_DEADLINE, |s| {
        targets.iter().all(|a| resolved_to(s, *a, &before))
    });
    // The MTU ipip's too-big check uses comes with the next hop, and follows the interface.
    let after = NextHop {
        mtu: 1400,
        ..before.clone()
    };
    lb.ip(&["link", "set", "dev", &lb_backend_if(1), "mtu", "1400"])
        .unwrap();
    running.wait_until("the new MTU is reported", Duration::from_mins(1), |s| {
        targets.iter().all(|a| resolved_to(s, *a, &after))
    });
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario per kind of target, step by step"
)]
fn unroutable_routed_and_downed_targets() {
    if require_root_and_bpf("unroutable_routed_and_downed_targets").is_err() {
        return;
    }
    let topo = topology();
    let lb = topo.lb();
    for family in ["-4", "-6"] {
        let default = lb.ip(&[family, "route", "show", "default"]).unwrap();
        assert!(
            default.trim().is_empty(),
            "the lb has a default route: {default}"
        );
    }
    let mut running = Running::start(lb);
    let nowhere = ip("198.19.200.1".parse::<std::net::Ipv4Addr>().unwrap());
    let routed_v4: IpAddr = "198.19.250.1".parse().unwrap();
    let routed_v6: IpAddr = "2001:db8:250::1".parse().unwrap();
    // Nobody holds these on backend 2's segment: ARP and NDP go unanswered.
    let absent_v4: IpAddr = "198.18.12.99".parse().unwrap();
    let absent_v6: IpAddr = "2001:db8:12::99".parse().unwrap();
    running.set_targets(&[
        nowhere,
        routed_v4,
        routed_v6,
        ip(backend_v4(2)),
        absent_v4,
        absent_v6,
    ]);
    let no_route = |addr: IpAddr| {
        move |s: &BTreeMap<IpAddr, Resolution>| {
            matches!(s.get(&addr), Some(Resolution::Unresolved { reason })
                if reason == &format!("no route to {addr}"))
        }
    };
    running.wait_until("nothing routes yet", RESOLVE_DEADLINE, |s| {
        [nowhere, routed_v4, routed_v6]
            .into_iter()
            .all(|a| no_route(a)(s))
    });

    // An unanswered neighbour fails once the kernel has given up (3 probes, 1 s apart, by
    // default), and is reported as such.
    let failed = |addr: IpAddr| {
        move |s: &BTreeMap<IpAddr, Resolution>| {
            s.get(&addr)
                == Some(&Resolution::Unresolved {
                    reason: format!("neighbour {addr} on {} FAILED", lb_backend_if(2)),
                })
        }
    };
    running.wait_until("unanswered neighbours fail", RESOLVE_DEADLINE, |s| {
        failed(absent_v4)(s) && failed(absent_v6)(s)
    });

    // A route via backend 1 makes the routed targets resolve to its MAC, with the gateway.
    lb.ip(&[
        "route",
        "add",
        "198.19.250.0/24",
        "via",
        &backend_v4(1).to_string(),
    ])
    .unwrap();
    lb.ip(&[
        "-6",
        "route",
        "add",
        "2001:db8:250::/64",
        "via",
        &backend_v6(1).to_string(),
    ])
    .unwrap();
    let to_b1 = ifindex(lb, &lb_backend_if(1));
    let via = |gw: IpAddr| NextHop {
        gateway: Some(gw),
        ..direct(1, to_b1)
    };
    running.wait_until("routed targets resolve", RESOLVE_DEADLINE, |s| {
        resolved_to(s, routed_v4, &via(ip(backend_v4(1))))
            && resolved_to(s, routed_v6, &via(ip(backend_v6(1))))
    });
    let line = neigh_line(lb, ip(backend_v4(1)), &lb_backend_if(1));
    assert!(
        line.contains("managed"),
        "gateway entry not managed: {line:?}"
    );
    assert!(no_route(nowhere)(&running.snapshot()));

    // Removing the route is a definite failure.
    lb.ip(&["route", "del", "198.19.250.0/24"]).unwrap();
    running.wait_until("the route is gone", RESOLVE_DEADLINE, no_route(routed_v4));
    // The gateway's entry, which the resolver created and nothing needs now, is deleted.
    let gone = poll(RESOLVE_DEADLINE, || {
        neigh_line(lb, ip(backend_v4(1)), &lb_backend_if(1)).is_empty()
    });
    assert!(
        gone,
        "the unused entry stayed: {}",
        neigh_line(lb, ip(backend_v4(1)), &lb_backend_if(1))
    );

    // So is a link without carrier (the backend's end down: the route stays)…
    let b2 = ip(backend_v4(2));
    let b2_hop = direct(2, ifindex(lb, &lb_backend_if(2)));
    running.wait_until("b2 resolves", RESOLVE_DEADLINE, |s| {
        resolved_to(s, b2, &b2_hop)
    });
    let b2_ns = &topo.backends()[1];
    b2_ns
        .ip(&["link", "set", "dev", BACKEND_IF, "down"])
        .unwrap();
    let no_carrier = format!("link {} has no carrier", lb_backend_if(2));
    running.wait_until("b2's link loses carrier", RESOLVE_DEADLINE, |s| {
        s.get(&b2)
            == Some(&Resolution::Unresolved {
                reason: no_carrier.clone(),
            })
    });
    // …which ends when the carrier returns…
    b2_ns.ip(&["link", "set", "dev", BACKEND_IF, "up"]).unwrap();
    running.wait_until("b2 resolves again", RESOLVE_DEADLINE, |s| {
        resolved_to(s, b2, &b2_hop)
    });
    // …and the egress link going down.
    lb.ip(&["link", "set", "dev", &lb_backend_if(2), "down"])
        .unwrap();
    running.wait_until("b2's link is down", RESOLVE_DEADLINE, |s| {
        matches!(s.get(&b2), Some(Resolution::Unresolved { .. }))
    });
    eprintln!("b2 with its link down: {:?}", running.state.get(&b2));
}

/// The managed entries a resolver created carry its protocol mark; a later resolver (an agent
/// restarted after a backend left the config) takes them as its own and deletes the ones no
/// target needs, keeping the rest.
#[test]
fn a_later_resolver_removes_the_entries_an_earlier_one_left_for_backends_gone_since() {
    if require(
        "a_later_resolver_removes_the_entries_an_earlier_one_left_for_backends_gone_since",
        &[],
    )
    .is_err()
    {
        return;
    }
    let topo = topology();
    let lb = topo.lb();
    let (b1, b2) = (ip(backend_v4(1)), ip(backend_v4(2)));
    let hops: Vec<NextHop> = (1..=2)
        .map(|i| direct(i, ifindex(lb, &lb_backend_if(i))))
        .collect();
    {
        let mut first = Running::start(lb);
        first.set_targets(&[b1, b2]);
        first.wait_until("both resolve", RESOLVE_DEADLINE, |s| {
            resolved_to(s, b1, &hops[0]) && resolved_to(s, b2, &hops[1])
        });
    }
    let line = neigh_line(lb, b2, &lb_backend_if(2));
    assert!(
        line.contains("managed") && line.contains("proto 83"),
        "the stopped resolver's entry for b2: {line:?}"
    );
    let mut second = Running::start(lb);
    second.set_targets(&[b1]);
    second.wait_until("b1 resolves", RESOLVE_DEADLINE, |s| {
        resolved_to(s, b1, &hops[0])
    });
    assert!(
        poll(RESOLVE_DEADLINE, || neigh_line(lb, b2, &lb_backend_if(2))
            .is_empty()),
        "b2's entry outlived its backend: {:?}",
        neigh_line(lb, b2, &lb_backend_if(2))
    );
    let line = neigh_line(lb, b1, &lb_backend_if(1));
    assert!(line.contains("managed"), "b1's entry went too: {line:?}");
}

/// A target removed and added back before any round saw it gone (two applies faster than a
/// round: a config without the backend, then one with it again) is reported again: the agent
/// forgot its next hop when it removed it, and would otherwise wait for a report forever.
#[test]
fn a_target_removed_and_added_back_within_a_round_is_reported_again() {
    if require(
        "a_target_removed_and_added_back_within_a_round_is_reported_again",
        &[],
    )
    .is_err()
    {
        return;
    }
    let topo = topology();
    let lb = topo.lb();
    let (b1, b2) = (ip(backend_v4(1)), ip(backend_v4(2)));
    let hops: Vec<NextHop> = (1..=2)
        .map(|i| direct(i, ifindex(lb, &lb_backend_if(i))))
        .collect();
    let mut running = Running::start(lb);
    running.set_targets(&[b1, b2]);
    running.wait_until("both resolve", RESOLVE_DEADLINE, |s| {
        resolved_to(s, b1, &hops[0]) && resolved_to(s, b2, &hops[1])
    });
    running.set_targets_in_turn(&[&[], &[b1, b2]]);
    let seen = running.events_within(RESYNC * 3);
    for (addr, hop) in [(b1, &hops[0]), (b2, &hops[1])] {
        assert!(
            seen.iter()
                .any(|e| e.address == addr && e.resolution == Resolution::Resolved(hop.clone())),
            "{addr} is not reported again: {seen:#?}"
        );
    }
}
