//! A topology gets unique short namespace names, runs closures and commands inside its
//! namespaces, leaves the root namespace untouched, and is torn down on drop — after a panic
//! too; a sweep removes only the namespaces of dead processes.

use router_tests::addrs::{BACKEND_IF, CLIENT_IF, LB_CLIENT_IF, TCP_ECHO_PORT, backend_return_v4};
use router_tests::client::{self};
use router_tests::netns::{self, Netns};
use router_tests::privileged::require_root_and_bpf;
use router_tests::servers::{self};

use super::{addr, names, topology};

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
