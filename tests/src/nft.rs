//! The nftables baseline: a kernel DNAT load balancer in the lb namespace, to compare
//! Switchyard against in benchmarks.
//!
//! [`NftDnat::install`] adds one `inet` table whose prerouting NAT chain rewrites new TCP and
//! UDP flows to a VIP port (both VIPs) onto the backends' own addresses, chosen by
//! `numgen random mod N` or by `jhash` of the source address and port. Conntrack keeps each
//! flow on its backend and restores the VIP on replies, which come back through the lb
//! (backends route replies from their own addresses via the lb), so no backend configuration
//! changes. Unlike Switchyard, this balancer is a router: installing it turns IP forwarding
//! on in the lb namespace ([`set_forwarding`]), and removing it turns forwarding off again.

use std::fmt::Write as _;

use anyhow::{Context as _, Result};

use crate::addrs::{VIP_V4, VIP_V6, backend_v4, backend_v6};
use crate::netns::{Netns, Topology};

/// The table the baseline installs in the lb namespace.
pub const TABLE: &str = "switchyard_baseline";

/// How the baseline picks a backend for a new flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selector {
    /// `numgen random mod N`: uniform, independent per flow.
    Random,
    /// `jhash <saddr> . <sport> mod N seed …`: deterministic per client address and port.
    Jhash,
}

/// The installed baseline; [`NftDnat::remove`] or dropping deletes its table.
#[derive(Debug)]
pub struct NftDnat {
    lb: Netns,
    ruleset: String,
    removed: bool,
}

impl NftDnat {
    /// Installs DNAT for TCP and UDP `port` on both VIPs over every backend of `topo`.
    ///
    /// # Errors
    ///
    /// When forwarding cannot be turned on in the lb namespace, or `nft` refuses the ruleset.
    pub fn install(topo: &Topology, port: u16, selector: Selector) -> Result<Self> {
        let v4: Vec<String> = (1..=topo.backend_count())
            .map(|i| backend_v4(i).to_string())
            .collect();
        let v6: Vec<String> = (1..=topo.backend_count())
            .map(|i| backend_v6(i).to_string())
            .collect();
        let ruleset = ruleset(port, selector, &v4, &v6);
        set_forwarding(topo.lb(), true)?;
        topo.lb()
            .exec_with_stdin(&["nft", "-f", "-"], Some(&ruleset))
            .context("cannot install the nftables DNAT baseline")?;
        Ok(Self {
            lb: topo.lb().clone(),
            ruleset,
            removed: false,
        })
    }

    /// The ruleset that was installed (`nft -f` syntax).
    #[must_use]
    pub fn ruleset(&self) -> &str {
        &self.ruleset
    }

    /// Deletes the table. Flows already translated keep their conntrack entries until they
    /// expire. Also turns IP forwarding off again.
    ///
    /// # Errors
    ///
    /// When `nft` cannot delete the table, or forwarding cannot be turned off.
    pub fn remove(mut self) -> Result<()> {
        self.removed = true;
        self.lb
            .exec(&["nft", "delete", "table", "inet", TABLE])
            .map(drop)?;
        set_forwarding(&self.lb, false)
    }
}

impl Drop for NftDnat {
    fn drop(&mut self) {
        if !self.removed && self.lb.exists() {
            let _ = self.lb.exec(&["nft", "delete", "table", "inet", TABLE]);
            let _ = set_forwarding(&self.lb, false);
        }
    }
}

/// Turns IPv4 and IPv6 forwarding on or off in `ns`. For the kernel baselines only (this
/// DNAT balancer and the benchmarks' plain routing), which forward packets as a router does;
/// the standard topology leaves the lb with forwarding off (the kernel's default), and
/// Switchyard needs nothing else.
///
/// # Errors
///
/// When the sysctls cannot be set in `ns`.
pub fn set_forwarding(ns: &Netns, on: bool) -> Result<()> {
    let value = if on { "1" } else { "0" };
    ns.sysctl(&[
        ("net.ipv4.ip_forward", value),
        ("net.ipv6.conf.all.forwarding", value),
    ])
}

fn anonymous_map(targets: &[String]) -> String {
    let entries: Vec<String> = targets
        .iter()
        .enumerate()
        .map(|(k, t)| format!("{k} : {t}"))
        .collect();
    format!("{{ {} }}", entries.join(", "))
}

fn selector_expr(selector: Selector, family: &str, proto: &str, n: usize) -> String {
    match selector {
        Selector::Random => format!("numgen random mod {n}"),
        Selector::Jhash => format!("jhash {family} saddr . {proto} sport mod {n} seed 0x5359"),
    }
}

/// Builds the ruleset for `port` over the given backend addresses.
#[must_use]
pub fn ruleset(port: u16, selector: Selector, v4: &[String], v6: &[String]) -> String {
    let mut r = format!(
        "table inet {TABLE} {{\n\tchain prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n"
    );
    for proto in ["tcp", "udp"] {
        for (family, vip, targets) in [
            ("ip", VIP_V4.to_string(), v4),
            ("ip6", VIP_V6.to_string(), v6),
        ] {
            // Writing into a String cannot fail.
            let _ = writeln!(
                r,
                "\t\t{family} daddr {vip} {proto} dport {port} dnat {family} to {} map {}",
                selector_expr(selector, family, proto, targets.len()),
                anonymous_map(targets)
            );
        }
    }
    r.push_str("\t}\n}\n");
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_maps_each_slot_to_a_backend() {
        let r = ruleset(
            80,
            Selector::Random,
            &["198.18.11.11".into()],
            &["2001:db8:11::11".into()],
        );
        assert!(r.contains(
            "ip daddr 198.18.0.10 tcp dport 80 dnat ip to numgen random mod 1 map { 0 : 198.18.11.11 }"
        ));
        assert!(r.contains("ip6 daddr 2001:db8::10 udp dport 80 dnat ip6 to numgen random mod 1"));
        let j = ruleset(
            80,
            Selector::Jhash,
            &["a".into(), "b".into()],
            &["c".into(), "d".into()],
        );
        assert!(j.contains("jhash ip6 saddr . udp sport mod 2 seed 0x5359 map { 0 : c, 1 : d }"));
    }
}
