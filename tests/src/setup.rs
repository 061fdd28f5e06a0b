//! The standard topology's configuration steps, applied by [`crate::netns::Topology`] once
//! its namespaces exist: sysctls, veths, addresses, routes, neighbour entries, offloads and
//! the XDP_PASS programs. Addresses and names come from [`crate::addrs`].

use anyhow::{Context as _, Result};

use crate::addrs::{
    BACKEND_IF, BACKEND_PREFIX_V4, BACKEND_PREFIX_V6, CLIENT_IF, CLIENT_MAC, CLIENT_PREFIX_V4,
    CLIENT_PREFIX_V6, CLIENT_V4, CLIENT_V6, LB_CLIENT_IF, LB_CLIENT_SIDE_MAC, LB_CLIENT_SIDE_V4,
    LB_CLIENT_SIDE_V6, VIP_V4, VIP_V6, backend_mac, backend_v4, backend_v6, lb_backend_if,
    lb_backend_side_mac, lb_backend_side_v4, lb_backend_side_v6, mac_string,
};
use crate::netns::Netns;
use crate::xdp_pass;

/// The namespaces of a topology, to be configured.
pub(crate) struct Plan<'a> {
    pub(crate) client: &'a Netns,
    pub(crate) lb: &'a Netns,
    pub(crate) backends: &'a [Netns],
}

impl Plan<'_> {
    /// Applies every step, in an order where each finds what it needs: sysctls before
    /// interfaces exist (so they inherit them), the lb (which creates every veth) before the
    /// hosts, per-interface settings and XDP last.
    pub(crate) fn apply(&self) -> Result<()> {
        self.configure_sysctls()?;
        self.lb.ip_batch(&self.lb_commands())?;
        self.client.ip_batch(&client_commands())?;
        for (i, b) in self.indexed_backends() {
            b.ip_batch(&backend_commands(i))?;
        }
        self.tune_hosts()?;
        self.attach_xdp_pass()
    }

    fn indexed_backends(&self) -> impl Iterator<Item = (usize, &Netns)> {
        self.backends.iter().enumerate().map(|(k, b)| (k + 1, b))
    }

    /// Sysctls that must hold before interfaces exist, so new interfaces inherit them.
    fn configure_sysctls(&self) -> Result<()> {
        // No duplicate address detection: addresses are usable at once, not after ~1 s.
        // rp_filter off: DSR replies enter the lb from a backend with the VIP, which routes
        // towards the client, as source; the effective value is max(all, interface).
        let common = [
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_ra", "0"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ];
        self.client.sysctl(&common)?;
        let mut lb = common.to_vec();
        lb.extend([
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
        ]);
        self.lb.sysctl(&lb)?;
        let mut backend = common.to_vec();
        // A backend holds the VIP on lo and must never answer ARP for it or use it as the
        // source of its own ARP requests.
        backend.extend([
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
            ("net.ipv4.conf.default.arp_ignore", "1"),
            ("net.ipv4.conf.default.arp_announce", "2"),
        ]);
        for b in self.backends {
            b.sysctl(&backend)?;
        }
        Ok(())
    }

    /// The lb creates every veth (peers go straight into their namespaces), and carries
    /// permanent neighbour entries for the client and every backend: `bpf_fib_lookup` reads the
    /// neighbour table but never resolves a missing entry (it answers `NO_NEIGH`), so without
    /// them the first packets towards a host would take the kernel's slow path instead of the
    /// XDP fast path. The MACs are fixed, so no ping is needed to learn them.
    fn lb_commands(&self) -> Vec<String> {
        let mut c = vec![
            "link set lo up".to_owned(),
            format!(
                "link add {LB_CLIENT_IF} address {} type veth peer name {CLIENT_IF} address {} netns {}",
                mac_string(LB_CLIENT_SIDE_MAC),
                mac_string(CLIENT_MAC),
                self.client.name()
            ),
            format!("link set {LB_CLIENT_IF} up"),
            format!("addr add {LB_CLIENT_SIDE_V4}/{CLIENT_PREFIX_V4} dev {LB_CLIENT_IF}"),
            format!("addr add {LB_CLIENT_SIDE_V6}/{CLIENT_PREFIX_V6} dev {LB_CLIENT_IF} nodad"),
        ];
        for addr in [CLIENT_V4.to_string(), CLIENT_V6.to_string()] {
            c.push(format!(
                "neigh replace {addr} lladdr {} dev {LB_CLIENT_IF} nud permanent",
                mac_string(CLIENT_MAC)
            ));
        }
        for (i, b) in self.indexed_backends() {
            let dev = lb_backend_if(i);
            c.push(format!(
                "link add {dev} address {} type veth peer name {BACKEND_IF} address {} netns {}",
                mac_string(lb_backend_side_mac(i)),
                mac_string(backend_mac(i)),
                b.name()
            ));
            c.push(format!("link set {dev} up"));
            c.push(format!(
                "addr add {}/{BACKEND_PREFIX_V4} dev {dev}",
                lb_backend_side_v4(i)
            ));
            c.push(format!(
                "addr add {}/{BACKEND_PREFIX_V6} dev {dev} nodad",
                lb_backend_side_v6(i)
            ));
            for addr in [backend_v4(i).to_string(), backend_v6(i).to_string()] {
                c.push(format!(
                    "neigh replace {addr} lladdr {} dev {dev} nud permanent",
                    mac_string(backend_mac(i))
                ));
            }
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
        for b in self.backends {
            b.exec(&["ethtool", "-K", BACKEND_IF, "tx", "off"])?;
            let conf = format!("net.ipv4.conf.{BACKEND_IF}");
            b.sysctl(&[
                (&format!("{conf}.arp_ignore"), "1"),
                (&format!("{conf}.arp_announce"), "2"),
                (&format!("{conf}.rp_filter"), "0"),
            ])?;
        }
        Ok(())
    }

    /// A frame that the lb sends into a veth with XDP_TX or XDP_REDIRECT is dropped unless the
    /// receiving end runs NAPI, which on a veth means it has an XDP program (or GRO on); so the
    /// client's and each backend's veth get a native-mode XDP_PASS program.
    fn attach_xdp_pass(&self) -> Result<()> {
        let prog = xdp_pass::load().context("cannot load the XDP_PASS program")?;
        xdp_pass::attach(self.client, CLIENT_IF, &prog)?;
        for b in self.backends {
            xdp_pass::attach(b, BACKEND_IF, &prog)?;
        }
        Ok(())
    }
}

fn client_commands() -> Vec<String> {
    vec![
        "link set lo up".to_owned(),
        format!("link set {CLIENT_IF} up"),
        format!("addr add {CLIENT_V4}/{CLIENT_PREFIX_V4} dev {CLIENT_IF}"),
        format!("addr add {CLIENT_V6}/{CLIENT_PREFIX_V6} dev {CLIENT_IF} nodad"),
        format!("route add default via {LB_CLIENT_SIDE_V4}"),
        format!("route add ::/0 via {LB_CLIENT_SIDE_V6}"),
        // The VIPs are inside the client's subnets; host routes send them to the lb instead
        // of ARP/ND on the link (the lb does not own them; see crate::addrs).
        format!("route add {VIP_V4}/32 via {LB_CLIENT_SIDE_V4}"),
        format!("route add {VIP_V6}/128 via {LB_CLIENT_SIDE_V6}"),
    ]
}

fn backend_commands(i: usize) -> Vec<String> {
    vec![
        "link set lo up".to_owned(),
        format!("addr add {VIP_V4}/32 dev lo"),
        format!("addr add {VIP_V6}/128 dev lo nodad"),
        format!("link set {BACKEND_IF} up"),
        format!(
            "addr add {}/{BACKEND_PREFIX_V4} dev {BACKEND_IF}",
            backend_v4(i)
        ),
        format!(
            "addr add {}/{BACKEND_PREFIX_V6} dev {BACKEND_IF} nodad",
            backend_v6(i)
        ),
        format!("route add default via {}", lb_backend_side_v4(i)),
        format!("route add ::/0 via {}", lb_backend_side_v6(i)),
    ]
}
