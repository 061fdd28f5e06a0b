//! How the hosts are configured: receiving veths run `XDP_PASS` and have TX checksum offload off;
//! the lb keeps the kernel's defaults and the backends have what the README says.

use router_tests::addrs::{BACKEND_IF, CLIENT_IF, LB_CLIENT_IF, VIP_V4, VIP_V6};
use router_tests::netns::Netns;
use router_tests::privileged::require_root_and_bpf;

use super::{sysctl, topology};

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

/// A namespace nobody configured, deleted on drop: the reference for the lb's sysctls.
struct Fresh(Netns);

impl Drop for Fresh {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", self.0.name()])
            .status();
    }
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
