//! The standard topology's configuration steps, applied by [`crate::netns::Topology`] once
//! its namespaces exist: sysctls on the hosts and the router, veths, addresses, routes,
//! policy rules, offloads and the `XDP_PASS` programs. Addresses and names come from
//! [`crate::addrs`].
//!
//! The lb namespace gets interfaces, addresses and (for a routed backend) a route, and
//! nothing else: no sysctls, no neighbour entries, default offloads. What the client and the
//! backends get is what the README tells an operator to give theirs; see [`crate::netns`].

use anyhow::{Context as _, Result};

use crate::addrs::{
    BACKEND_IF, BACKEND_PREFIX_V4, BACKEND_PREFIX_V6, BACKEND_RETURN_IF, CLIENT_IF, CLIENT_MAC,
    CLIENT_PREFIX_V4, CLIENT_PREFIX_V6, CLIENT_ROUTER_RETURN_V4, CLIENT_ROUTER_RETURN_V6,
    CLIENT_V4, CLIENT_V6, LB_CLIENT_IF, LB_CLIENT_SIDE_MAC, LB_CLIENT_SIDE_V4, LB_CLIENT_SIDE_V6,
    LB_ROUTER_IF, LB_ROUTER_SIDE_MAC, LB_ROUTER_SIDE_V4, LB_ROUTER_SIDE_V6, NAT_TABLE,
    RETURN_PREFIX_V4, RETURN_PREFIX_V6, ROUTER_LB_IF, ROUTER_MAC, ROUTER_PREFIX_V4,
    ROUTER_PREFIX_V6, ROUTER_RETURN_CLIENT_MAC, ROUTER_RETURN_IF, ROUTER_RETURN_MAC,
    ROUTER_RETURN_V4, ROUTER_RETURN_V6, ROUTER_V4, ROUTER_V6, VIP_V4, VIP_V6, backend_mac,
    backend_return_mac, backend_return_v4, backend_return_v6, backend_v4, backend_v6,
    client_return_side_mac, client_return_side_v4, client_return_side_v6, lb_backend_if,
    lb_backend_side_mac, lb_backend_side_v4, lb_backend_side_v6, mac_string,
};
use crate::netns::Netns;
use crate::xdp_pass;

/// The namespaces of a topology, to be configured.
pub(crate) struct Plan<'a> {
    pub(crate) client: &'a Netns,
    pub(crate) lb: &'a Netns,
    pub(crate) router: Option<&'a Netns>,
    /// Whether the router gets a return link into the client namespace.
    pub(crate) router_return: bool,
    /// Backends `1..=direct.len()`, attached to the lb.
    pub(crate) direct: &'a [Netns],
    /// The backends behind the router, numbered after `direct`.
    pub(crate) routed: &'a [Netns],
}

impl Plan<'_> {
    /// Applies every step, in an order where each finds what it needs: sysctls before
    /// interfaces exist (so they inherit them), each veth's creator (the lb for its links,
    /// the client for the return links, the router for its backend's link) before the
    /// namespace at its other end, per-interface settings and XDP last.
    pub(crate) fn apply(&self) -> Result<()> {
        self.configure_sysctls()?;
        self.lb.ip_batch(&self.lb_commands())?;
        self.client.ip_batch(&self.client_commands())?;
        if let Some(router) = self.router {
            router.ip_batch(&self.router_commands())?;
        }
        for (i, b) in self.indexed_direct() {
            b.ip_batch(&direct_backend_commands(i))?;
            // `ip rule` cannot tell an IPv6 rule by its address, and a batch line cannot
            // carry `-6`.
            let own = backend_v6(i).to_string();
            let table = NAT_TABLE.to_string();
            b.ip(&["-6", "rule", "add", "from", &own, "lookup", &table])?;
        }
        for (i, b) in self.indexed_routed() {
            b.ip_batch(&routed_backend_commands(i))?;
        }
        self.tune_hosts()?;
        self.attach_xdp_pass()
    }

    fn indexed_direct(&self) -> impl Iterator<Item = (usize, &Netns)> {
        self.direct.iter().enumerate().map(|(k, b)| (k + 1, b))
    }

    fn indexed_routed(&self) -> impl Iterator<Item = (usize, &Netns)> {
        let first = self.direct.len() + 1;
        self.routed
            .iter()
            .enumerate()
            .map(move |(k, b)| (first + k, b))
    }

    fn all_backends(&self) -> impl Iterator<Item = &Netns> {
        self.direct.iter().chain(self.routed)
    }

    /// Sysctls, set before interfaces exist. The lb gets none.
    fn configure_sysctls(&self) -> Result<()> {
        // Loose reverse-path filtering (the effective value is max(all, interface), so `all`
        // decides): DSR is asymmetric. The client receives replies from the VIP on a return
        // link while its route to the VIP points at the lb; a backend receives requests from
        // the lb while its route to the client points at its return link.
        let loose = ("net.ipv4.conf.all.rp_filter", "2");
        self.client.sysctl(&[loose])?;
        // A backend holds the VIP on lo and must never answer ARP for it or use it as the
        // source of its own ARP requests; it announces a new MAC address at once (gratuitous
        // ARP, unsolicited neighbour advertisement), so the balancer follows it.
        let backend = [
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
            loose,
            ("net.ipv4.conf.all.arp_notify", "1"),
            ("net.ipv6.conf.all.ndisc_notify", "1"),
        ];
        for b in self.all_backends() {
            b.sysctl(&backend)?;
        }
        if let Some(router) = self.router {
            router.sysctl(&[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv6.conf.all.forwarding", "1"),
            ])?;
            if self.router_return {
                // It receives the backends' replies (source the VIP) while it routes the VIP
                // to the lb.
                router.sysctl(&[loose])?;
            }
        }
        Ok(())
    }

    /// The lb creates its veths (peers go straight into their namespaces) and addresses them;
    /// a routed backend's link is reached via the router. Neighbours are left to the kernel
    /// (and to Switchyard).
    fn lb_commands(&self) -> Vec<String> {
        let mut c = vec!["link set lo up".to_owned()];
        c.extend(veth(
            LB_CLIENT_IF,
            LB_CLIENT_SIDE_MAC,
            CLIENT_IF,
            CLIENT_MAC,
            self.client,
        ));
        c.extend(addresses(
            LB_CLIENT_IF,
            (LB_CLIENT_SIDE_V4, CLIENT_PREFIX_V4),
            (LB_CLIENT_SIDE_V6, CLIENT_PREFIX_V6),
        ));
        for (i, b) in self.indexed_direct() {
            let dev = lb_backend_if(i);
            c.extend(veth(
                &dev,
                lb_backend_side_mac(i),
                BACKEND_IF,
                backend_mac(i),
                b,
            ));
            c.extend(addresses(
                &dev,
                (lb_backend_side_v4(i), BACKEND_PREFIX_V4),
                (lb_backend_side_v6(i), BACKEND_PREFIX_V6),
            ));
        }
        if let Some(router) = self.router {
            c.extend(veth(
                LB_ROUTER_IF,
                LB_ROUTER_SIDE_MAC,
                ROUTER_LB_IF,
                ROUTER_MAC,
                router,
            ));
            c.extend(addresses(
                LB_ROUTER_IF,
                (LB_ROUTER_SIDE_V4, ROUTER_PREFIX_V4),
                (LB_ROUTER_SIDE_V6, ROUTER_PREFIX_V6),
            ));
            for (i, _) in self.indexed_routed() {
                let (v4, v6) = backend_prefixes(i);
                c.push(format!("route add {v4} via {ROUTER_V4}"));
                c.push(format!("route add {v6} via {ROUTER_V6}"));
            }
        }
        c
    }

    /// The client's link to the lb (created by the lb) and its routes, and the return link to
    /// every directly attached backend, which the client creates: it plays the site's router
    /// that backends send their DSR replies through.
    fn client_commands(&self) -> Vec<String> {
        let mut c = vec![
            "link set lo up".to_owned(),
            format!("link set {CLIENT_IF} up"),
            format!("addr add {CLIENT_V4}/{CLIENT_PREFIX_V4} dev {CLIENT_IF}"),
            format!("addr add {CLIENT_V6}/{CLIENT_PREFIX_V6} dev {CLIENT_IF} nodad"),
            format!("route add default via {LB_CLIENT_SIDE_V4}"),
            format!("route add ::/0 via {LB_CLIENT_SIDE_V6}"),
            // The VIPs are inside the client's subnets; host routes send them to the lb
            // instead of ARP/ND on the link (the lb does not own them; see crate::addrs).
            format!("route add {VIP_V4}/32 via {LB_CLIENT_SIDE_V4}"),
            format!("route add {VIP_V6}/128 via {LB_CLIENT_SIDE_V6}"),
        ];
        if let (Some(router), true) = (self.router, self.router_return) {
            c.extend(veth(
                LB_ROUTER_IF,
                ROUTER_RETURN_CLIENT_MAC,
                ROUTER_RETURN_IF,
                ROUTER_RETURN_MAC,
                router,
            ));
            c.extend(addresses(
                LB_ROUTER_IF,
                (CLIENT_ROUTER_RETURN_V4, RETURN_PREFIX_V4),
                (CLIENT_ROUTER_RETURN_V6, RETURN_PREFIX_V6),
            ));
        }
        for (i, b) in self.indexed_direct() {
            let dev = lb_backend_if(i);
            c.extend(veth(
                &dev,
                client_return_side_mac(i),
                BACKEND_RETURN_IF,
                backend_return_mac(i),
                b,
            ));
            c.extend(addresses(
                &dev,
                (client_return_side_v4(i), RETURN_PREFIX_V4),
                (client_return_side_v6(i), RETURN_PREFIX_V6),
            ));
        }
        c
    }

    /// The router's link to the lb (created by the lb), its link to each routed backend
    /// (created here), and its default routes via the lb, through which the replies of its
    /// backends reach the clients.
    fn router_commands(&self) -> Vec<String> {
        let mut c = vec![
            "link set lo up".to_owned(),
            format!("link set {ROUTER_LB_IF} up"),
            format!("addr add {ROUTER_V4}/{ROUTER_PREFIX_V4} dev {ROUTER_LB_IF}"),
            format!("addr add {ROUTER_V6}/{ROUTER_PREFIX_V6} dev {ROUTER_LB_IF} nodad"),
            format!("route add default via {LB_ROUTER_SIDE_V4}"),
            format!("route add ::/0 via {LB_ROUTER_SIDE_V6}"),
        ];
        if self.router_return {
            c.extend([
                format!("link set {ROUTER_RETURN_IF} up"),
                format!("addr add {ROUTER_RETURN_V4}/{RETURN_PREFIX_V4} dev {ROUTER_RETURN_IF}"),
                format!(
                    "addr add {ROUTER_RETURN_V6}/{RETURN_PREFIX_V6} dev {ROUTER_RETURN_IF} nodad"
                ),
                format!("route add {CLIENT_V4}/32 via {CLIENT_ROUTER_RETURN_V4}"),
                format!("route add {CLIENT_V6}/128 via {CLIENT_ROUTER_RETURN_V6}"),
            ]);
        }
        for (i, b) in self.indexed_routed() {
            let dev = lb_backend_if(i);
            c.extend(veth(
                &dev,
                lb_backend_side_mac(i),
                BACKEND_IF,
                backend_mac(i),
                b,
            ));
            c.extend(addresses(
                &dev,
                (lb_backend_side_v4(i), BACKEND_PREFIX_V4),
                (lb_backend_side_v6(i), BACKEND_PREFIX_V6),
            ));
        }
        c
    }

    /// Per-interface settings that need the interfaces to exist.
    fn tune_hosts(&self) -> Result<()> {
        // Checksum offload off on every host veth whose traffic crosses an XDP program: a
        // veth leaves TCP/UDP checksums to "hardware" (CHECKSUM_PARTIAL), and a frame that
        // native XDP forwards (XDP_TX/XDP_REDIRECT) loses that skb state, so it would arrive
        // with a bad checksum. The client's traffic crosses the lb's XDP program; backend
        // replies cross it in NAT mode.
        self.client
            .exec(&["ethtool", "-K", CLIENT_IF, "tx", "off"])?;
        for b in self.all_backends() {
            b.exec(&["ethtool", "-K", BACKEND_IF, "tx", "off"])?;
        }
        Ok(())
    }

    /// A frame that the lb sends into a veth with `XDP_TX` or `XDP_REDIRECT` is dropped unless
    /// the receiving end runs NAPI, which on a veth means it has an XDP program (or GRO on); so
    /// the client's veth to the lb, the router's and each backend's veth towards its gateway
    /// get a native-mode `XDP_PASS` program.
    fn attach_xdp_pass(&self) -> Result<()> {
        let prog = xdp_pass::load().context("cannot load the XDP_PASS program")?;
        xdp_pass::attach(self.client, CLIENT_IF, &prog)?;
        if let Some(router) = self.router {
            xdp_pass::attach(router, ROUTER_LB_IF, &prog)?;
        }
        for b in self.all_backends() {
            xdp_pass::attach(b, BACKEND_IF, &prog)?;
        }
        Ok(())
    }
}

/// Creates the veth `dev` (with `mac`) in the namespace running the batch, its peer `peer`
/// (with `peer_mac`) directly inside `peer_ns`, and brings `dev` up.
fn veth(dev: &str, mac: [u8; 6], peer: &str, peer_mac: [u8; 6], peer_ns: &Netns) -> [String; 2] {
    [
        format!(
            "link add {dev} address {} type veth peer name {peer} address {} netns {}",
            mac_string(mac),
            mac_string(peer_mac),
            peer_ns.name()
        ),
        format!("link set {dev} up"),
    ]
}

/// Backend `i`'s link prefixes, `198.18.(10+i).0/24` and `2001:db8:(10+i)::/64`.
fn backend_prefixes(i: usize) -> (String, String) {
    let [a, b, c, _] = backend_v4(i).octets();
    let seg = backend_v6(i).segments();
    (
        format!("{a}.{b}.{c}.0/{BACKEND_PREFIX_V4}"),
        format!(
            "{}/{BACKEND_PREFIX_V6}",
            std::net::Ipv6Addr::new(seg[0], seg[1], seg[2], seg[3], 0, 0, 0, 0)
        ),
    )
}

/// Adds an IPv4 and an IPv6 address (without duplicate address detection) to `dev`.
fn addresses(
    dev: &str,
    (v4, len4): (std::net::Ipv4Addr, u8),
    (v6, len6): (std::net::Ipv6Addr, u8),
) -> [String; 2] {
    [
        format!("addr add {v4}/{len4} dev {dev}"),
        format!("addr add {v6}/{len6} dev {dev} nodad"),
    ]
}

/// The VIPs on lo, the backend's address on its link to the gateway, `dev` up.
fn backend_base(i: usize) -> Vec<String> {
    let mut c = vec![
        "link set lo up".to_owned(),
        format!("addr add {VIP_V4}/32 dev lo"),
        format!("addr add {VIP_V6}/128 dev lo nodad"),
        format!("link set {BACKEND_IF} up"),
    ];
    c.extend(addresses(
        BACKEND_IF,
        (backend_v4(i), BACKEND_PREFIX_V4),
        (backend_v6(i), BACKEND_PREFIX_V6),
    ));
    c
}

/// A backend attached to the lb: its return link (created by the client) carries its default
/// routes, so DSR replies (source the VIP) never cross the lb; a policy rule on its own
/// address sends NAT replies (source the backend's address) through the lb instead
/// ([`NAT_TABLE`]; the IPv6 rule is added apart, see [`Plan::apply`]). Replies to the lb's
/// health checks reach it on the link either way.
fn direct_backend_commands(i: usize) -> Vec<String> {
    let mut c = backend_base(i);
    c.push(format!("link set {BACKEND_RETURN_IF} up"));
    c.extend(addresses(
        BACKEND_RETURN_IF,
        (backend_return_v4(i), RETURN_PREFIX_V4),
        (backend_return_v6(i), RETURN_PREFIX_V6),
    ));
    c.extend([
        format!("route add default via {}", client_return_side_v4(i)),
        format!("route add ::/0 via {}", client_return_side_v6(i)),
        format!("rule add from {} lookup {NAT_TABLE}", backend_v4(i)),
        format!(
            "route add default via {} table {NAT_TABLE}",
            lb_backend_side_v4(i)
        ),
        format!(
            "route add ::/0 via {} table {NAT_TABLE}",
            lb_backend_side_v6(i)
        ),
    ]);
    c
}

/// A backend behind the router: its only link leads to the router, whose default routes lead
/// to the lb, so its default routes are all it needs (it serves NAT).
fn routed_backend_commands(i: usize) -> Vec<String> {
    let mut c = backend_base(i);
    c.extend([
        format!("route add default via {}", lb_backend_side_v4(i)),
        format!("route add ::/0 via {}", lb_backend_side_v6(i)),
    ]);
    c
}
