//! The standard topology's names and addresses, shared by the demo and the namespace tests.
//!
//! Everything lives in the benchmarking range `198.18.0.0/15` (RFC 2544) and the documentation
//! prefix `2001:db8::/32` (RFC 3849), so nothing here can collide with a real network.
//!
//! ```text
//!  ┌─ client ns: the client, and the site's router for the backends' replies ──────┐
//!  │ to-lb  02:53:59:00:00:01  198.18.0.1/24  2001:db8::1/64                       │
//!  │   default, VIP/32, VIP/128 via .254 / ::fe; XDP_PASS, tx checksum offload off │
//!  │ to-bI  02:53:59:01:II:fe  198.19.(10+I).254/24  2001:db8:19:(10+I)::fe/64     │
//!  │ rp_filter=2 (loose: DSR replies come from the backends, not from the lb)      │
//!  └───┬──────────────────────────────────────────────────────────────────────┬────┘
//!      │ veth 198.18.0.0/24                              return link I (veth) │
//!      │      2001:db8::/64                  198.19.(10+I).0/24               │
//!      │                                     2001:db8:19:(10+I)::/64          │
//!  ┌─ lb ns: kernel defaults (no sysctls, no static neighbours) ─────┐        │
//!  │ to-client 02:53:59:00:00:fe  198.18.0.254/24  2001:db8::fe/64   │        │
//!  │ to-bI     02:53:59:00:II:fe  198.18.(10+I).254/24               │        │
//!  │                              2001:db8:(10+I)::fe/64             │        │
//!  │ to-rt     02:53:59:02:00:fe  198.18.2.254/24  2001:db8:2::fe/64 │        │
//!  │   routes to 198.18.(10+R).0/24, 2001:db8:(10+R)::/64 via rt     │        │
//!  └───┬──────────────────────────────────────┬──────────────────────┘        │
//!      │ veth 198.18.(10+I).0/24              │ veth 198.18.2.0/24            │
//!      │      2001:db8:(10+I)::/64            │      2001:db8:2::/64          │
//!      │                 ┌─ rt ns: a router ──┴──────────────────────────┐    │
//!      │                 │ to-lb 02:53:59:02:00:01  198.18.2.1/24        │    │
//!      │                 │   2001:db8:2::1/64, default via the lb        │    │
//!      │                 │   XDP_PASS; forwarding on (it is a router)    │    │
//!      │                 │ to-bR 02:53:59:00:RR:fe  198.18.(10+R).254/24 │    │
//!      │                 │   2001:db8:(10+R)::fe/64                      │    │
//!      │                 └───┬───────────────────────────────────────────┘    │
//!      │                     │ veth 198.18.(10+R).0/24, 2001:db8:(10+R)::/64  │
//!      │                 ┌───┴─ bR ns: the routed backend ───────────────┐    │
//!      │                 │ to-lb 02:53:59:00:RR:01  198.18.(10+R).11/24  │    │
//!      │                 │   2001:db8:(10+R)::11/64 (towards rt)         │    │
//!      │                 │   default via .254 / ::fe; no return link     │    │
//!      │                 │ lo: the VIPs; the same sysctls as bI          │    │
//!      │                 └───────────────────────────────────────────────┘    │
//!  ┌─ bI ns: backend I, attached to the lb ───────────────────────────────────┴───┐
//!  │ to-lb     02:53:59:00:II:01  198.18.(10+I).11/24  2001:db8:(10+I)::11/64     │
//!  │   XDP_PASS, tx checksum offload off                                          │
//!  │ to-client 02:53:59:01:II:01  198.19.(10+I).11/24  2001:db8:19:(10+I)::11/64  │
//!  │ lo: VIPs 198.18.0.10/32, 2001:db8::10/128                                    │
//!  │ main table: default via 198.19.(10+I).254 / 2001:db8:19:(10+I)::fe (return)  │
//!  │ from 198.18.(10+I).11 / 2001:db8:(10+I)::11 lookup 100:                      │
//!  │   default via 198.18.(10+I).254 / 2001:db8:(10+I)::fe (the lb)               │
//!  │ arp_ignore=1 arp_announce=2 rp_filter=2 arp_notify=1 ndisc_notify=1          │
//!  └──────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! Each fact arranged on the client and the backends is one the README tells an operator to
//! arrange on theirs (section "Attach to a real NIC"); the lb namespace keeps every kernel
//! default, so the tests show that Switchyard itself needs nothing more.
//!
//! - **Virtual IPs** `198.18.0.10` and `2001:db8::10` sit inside the client's subnets, as a
//!   VIP usually sits in a client-facing subnet. The client reaches them through host routes
//!   via the lb rather than by ARP/ND, because the lb does not own them. Backends hold the
//!   VIPs on `lo` (for DSR) and never answer ARP for them (`arp_ignore=1`, `arp_announce=2`).
//! - **Return links.** The lb does not forward (IP forwarding stays off), so a backend's DSR
//!   replies, whose source is the VIP, must not cross it: as on a real network, where
//!   backends reply through the site's router, each directly attached backend `I` has a
//!   second veth into the client namespace, which plays that router, and its default routes
//!   go there. Its addresses are `198.19.(10+I).11` and `2001:db8:19:(10+I)::11`, the client
//!   at `.254` / `::fe`. The client accepts those replies with loose reverse-path filtering
//!   (its route to the VIP points at the lb), and the backends accept requests from the lb
//!   the same way (their route to the client points at the return link).
//! - **NAT replies** leave a backend with its own address as their source and must go back
//!   through the balancer, which restores the VIP. A policy rule, `from <backend address>
//!   lookup 100` ([`NAT_TABLE`]), sends them to table 100, whose default route is the lb's
//!   address on the backend's link; DSR replies (source the VIP) take the main table. Replies
//!   to the lb's health checks stay on the link either way.
//! - **Backend `I`** (1-based, `I ≤ MAX_BACKENDS`) has its own point-to-point /24 and /64:
//!   `198.18.(10+I).11` and `2001:db8:(10+I)::11`, its gateway (the lb, or for a routed
//!   backend the router) at `.254` / `::fe`. The IPv6 group is written with the same digits as
//!   the IPv4 octet (b1 → `198.18.11.11` and `2001:db8:11::11`, b12 → `198.18.22.11` and
//!   `2001:db8:22::11`), so one can be read from the other.
//! - **A routed backend** `R` (at most one, numbered after the directly attached ones) sits
//!   behind a router namespace `rt`: the lb reaches `198.18.(10+R).0/24` via the router at
//!   `198.18.2.1` / `2001:db8:2::1`, so the lb's next hop for it is the router, not the
//!   backend. The router forwards (it is a router) and runs `XDP_PASS` on its veth facing the
//!   lb, which receives frames the lb's program sends. The routed backend has no return link:
//!   its default routes go via the router, whose default routes go via the lb, so it serves
//!   `nat` (a `dsr-l2` frame to it would be routed by the router on its destination, the VIP).
//! - **MAC addresses** are fixed and locally administered, `02:53:59:LL:SS:HH` (0x53 0x59 is
//!   "SY"): LL is the kind of link (0 a link to the lb or, for a routed backend, to the
//!   router; 1 a return link; 2 the lb–router link), SS is the segment (0 for the client
//!   link, I for backend I), HH is 01 on the host end and fe on the gateway end. Fixed MACs
//!   let packet fixtures name real addresses; nobody writes them into a neighbour table.
//! - **Interface names** are fixed per role (`to-lb`, `to-client`, `to-bI`, `to-rt`): each
//!   names the namespace at its other end, and the veths are created directly inside the
//!   namespaces and never exist in the root namespace, so they cannot collide with the
//!   host's or another test's interfaces.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The IPv4 virtual IP.
pub const VIP_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
/// The IPv6 virtual IP.
pub const VIP_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);
/// The client's IPv4 address (prefix [`CLIENT_PREFIX_V4`]).
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The client's IPv6 address (prefix [`CLIENT_PREFIX_V6`]).
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
/// The lb's IPv4 address on the client link: the client's default gateway.
pub const LB_CLIENT_SIDE_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 254);
/// The lb's IPv6 address on the client link: the client's default gateway.
pub const LB_CLIENT_SIDE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xfe);
/// Prefix length of the client link (IPv4).
pub const CLIENT_PREFIX_V4: u8 = 24;
/// Prefix length of the client link (IPv6).
pub const CLIENT_PREFIX_V6: u8 = 64;
/// Prefix length of each backend link (IPv4).
pub const BACKEND_PREFIX_V4: u8 = 24;
/// Prefix length of each backend link (IPv6).
pub const BACKEND_PREFIX_V6: u8 = 64;

/// Prefix length of each return link (IPv4).
pub const RETURN_PREFIX_V4: u8 = 24;
/// Prefix length of each return link (IPv6).
pub const RETURN_PREFIX_V6: u8 = 64;
/// The policy-routing table in which a backend routes replies from its own address (NAT)
/// through its gateway: `ip rule add from <backend address> lookup 100`.
pub const NAT_TABLE: u32 = 100;

/// The router's IPv4 address on the lb–router link (the lb's gateway to a routed backend).
pub const ROUTER_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
/// The router's IPv6 address on the lb–router link.
pub const ROUTER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
/// The router's IPv4 address on its return link into the client namespace (a topology with
/// [`crate::netns::TopologyBuilder::router_return_link`]), `198.19.2.1`.
pub const ROUTER_RETURN_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 2, 1);
/// The router's IPv6 address on its return link, `2001:db8:19:2::1`.
pub const ROUTER_RETURN_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 2, 0, 0, 0, 1);
/// The client's IPv4 address on the router's return link, `198.19.2.254`.
pub const CLIENT_ROUTER_RETURN_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 2, 254);
/// The client's IPv6 address on the router's return link, `2001:db8:19:2::fe`.
pub const CLIENT_ROUTER_RETURN_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 2, 0, 0, 0, 0xfe);
/// The router's end of its return link, in the router namespace.
pub const ROUTER_RETURN_IF: &str = "to-client";
/// The router's MAC on its return link.
pub const ROUTER_RETURN_MAC: [u8; 6] = link_mac(1, 0, 0x01);
/// The client's MAC on the router's return link (on [`LB_ROUTER_IF`] in the client namespace).
pub const ROUTER_RETURN_CLIENT_MAC: [u8; 6] = link_mac(1, 0, 0xfe);

/// The lb's IPv4 address on the lb–router link (the router's default gateway).
pub const LB_ROUTER_SIDE_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 254);
/// The lb's IPv6 address on the lb–router link.
pub const LB_ROUTER_SIDE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0xfe);
/// Prefix length of the lb–router link (IPv4).
pub const ROUTER_PREFIX_V4: u8 = 24;
/// Prefix length of the lb–router link (IPv6).
pub const ROUTER_PREFIX_V6: u8 = 64;

/// Most backends a topology can have (keeps `2001:db8:(10+I)::` readable and names short).
pub const MAX_BACKENDS: usize = 32;

/// Port of the backends' TCP echo server (it first writes its name, then echoes).
pub const TCP_ECHO_PORT: u16 = 80;
/// Port of the backends' UDP server (it answers each datagram with its name).
pub const UDP_NAME_PORT: u16 = 80;
/// Port of the backends' HTTP health endpoint (`GET /health`).
pub const HEALTH_PORT: u16 = 8080;

/// The client's veth, in the client namespace.
pub const CLIENT_IF: &str = "to-lb";
/// The lb's veth towards the client, in the lb namespace.
pub const LB_CLIENT_IF: &str = "to-client";
/// Each backend's veth towards its gateway (the lb, or the router for a routed backend), in
/// its own namespace.
pub const BACKEND_IF: &str = "to-lb";
/// Each directly attached backend's return link, towards the client namespace (the site's
/// router), in its own namespace.
pub const BACKEND_RETURN_IF: &str = "to-client";
/// The lb's veth towards the router, in the lb namespace.
pub const LB_ROUTER_IF: &str = "to-rt";
/// The router's veth towards the lb, in the router namespace.
pub const ROUTER_LB_IF: &str = "to-lb";

/// The client's MAC address (on [`CLIENT_IF`]).
pub const CLIENT_MAC: [u8; 6] = mac(0, 0x01);
/// The lb's MAC address on the client link (on [`LB_CLIENT_IF`]).
pub const LB_CLIENT_SIDE_MAC: [u8; 6] = mac(0, 0xfe);

/// The router's MAC address on the lb–router link (on [`ROUTER_LB_IF`]).
pub const ROUTER_MAC: [u8; 6] = link_mac(2, 0, 0x01);
/// The lb's MAC address on the lb–router link (on [`LB_ROUTER_IF`]).
pub const LB_ROUTER_SIDE_MAC: [u8; 6] = link_mac(2, 0, 0xfe);

const fn mac(segment: u8, host: u8) -> [u8; 6] {
    link_mac(0, segment, host)
}

const fn link_mac(kind: u8, segment: u8, host: u8) -> [u8; 6] {
    [0x02, 0x53, 0x59, kind, segment, host]
}

/// Checks a 1-based backend index.
///
/// # Panics
/// If `i` is 0 or above [`MAX_BACKENDS`].
#[expect(
    clippy::cast_possible_truncation,
    reason = "in range by the assertion: 1 ≤ i ≤ MAX_BACKENDS = 32"
)]
fn segment(i: usize) -> u8 {
    assert!(
        (1..=MAX_BACKENDS).contains(&i),
        "backend index {i} outside 1..={MAX_BACKENDS}"
    );
    i as u8
}

/// The IPv6 group for backend `i`: the digits of `10 + i` read as hexadecimal (b1 → 0x11).
fn v6_group(i: usize) -> u16 {
    let n = u16::from(segment(i)) + 10;
    (n / 10) * 16 + n % 10
}

/// Backend `i`'s own IPv4 address, `198.18.(10+i).11` (1-based).
#[must_use]
pub fn backend_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10 + segment(i), 11)
}

/// Backend `i`'s own IPv6 address, `2001:db8:(10+i)::11` (1-based).
#[must_use]
pub fn backend_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, v6_group(i), 0, 0, 0, 0, 0x11)
}

/// The gateway's IPv4 address on backend `i`'s link, `198.18.(10+i).254`: the lb's, or for a
/// routed backend the router's.
#[must_use]
pub fn lb_backend_side_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10 + segment(i), 254)
}

/// The gateway's IPv6 address on backend `i`'s link, `2001:db8:(10+i)::fe`: the lb's, or for a
/// routed backend the router's.
#[must_use]
pub fn lb_backend_side_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, v6_group(i), 0, 0, 0, 0, 0xfe)
}

/// The veth towards backend `i`, `to-bI`: in the lb namespace for a directly attached backend,
/// in the router namespace for a routed one, and (the return link) in the client namespace.
#[must_use]
pub fn lb_backend_if(i: usize) -> String {
    format!("to-b{}", segment(i))
}

/// Backend `i`'s MAC address (on its [`BACKEND_IF`]).
#[must_use]
pub fn backend_mac(i: usize) -> [u8; 6] {
    mac(segment(i), 0x01)
}

/// The gateway's MAC address on backend `i`'s link (on [`lb_backend_if`]`(i)` of the lb, or of
/// the router for a routed backend).
#[must_use]
pub fn lb_backend_side_mac(i: usize) -> [u8; 6] {
    mac(segment(i), 0xfe)
}

/// Backend `i`'s IPv4 address on its return link, `198.19.(10+i).11`.
#[must_use]
pub fn backend_return_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 10 + segment(i), 11)
}

/// Backend `i`'s IPv6 address on its return link, `2001:db8:19:(10+i)::11`.
#[must_use]
pub fn backend_return_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x19, v6_group(i), 0, 0, 0, 0x11)
}

/// The client's (the site router's) IPv4 address on backend `i`'s return link,
/// `198.19.(10+i).254`: that backend's default gateway.
#[must_use]
pub fn client_return_side_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 10 + segment(i), 254)
}

/// The client's IPv6 address on backend `i`'s return link, `2001:db8:19:(10+i)::fe`.
#[must_use]
pub fn client_return_side_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x19, v6_group(i), 0, 0, 0, 0xfe)
}

/// Backend `i`'s MAC address on its return link (on [`BACKEND_RETURN_IF`]).
#[must_use]
pub fn backend_return_mac(i: usize) -> [u8; 6] {
    link_mac(1, segment(i), 0x01)
}

/// The client's MAC address on backend `i`'s return link (on [`lb_backend_if`]`(i)` in the
/// client namespace).
#[must_use]
pub fn client_return_side_mac(i: usize) -> [u8; 6] {
    link_mac(1, segment(i), 0xfe)
}

/// Backend `i`'s name as its servers announce it: `b1`, `b2`, …
#[must_use]
pub fn backend_name(i: usize) -> String {
    format!("b{}", segment(i))
}

/// Formats a MAC address as `ip` and `ethtool` expect it.
#[must_use]
#[expect(
    clippy::many_single_char_names,
    reason = "the six octets of the address, in order"
)]
pub fn mac_string(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

/// The IPv4 VIP with `port`.
#[must_use]
pub fn vip_v4(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(VIP_V4), port)
}

/// The IPv6 VIP with `port`.
#[must_use]
pub fn vip_v6(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(VIP_V6), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_addresses_follow_the_documented_layout() {
        assert_eq!(backend_v4(1), Ipv4Addr::new(198, 18, 11, 11));
        assert_eq!(backend_v6(1).to_string(), "2001:db8:11::11");
        assert_eq!(backend_v6(12).to_string(), "2001:db8:22::11");
        assert_eq!(lb_backend_side_v6(32).to_string(), "2001:db8:42::fe");
        assert_eq!(lb_backend_side_v4(32), Ipv4Addr::new(198, 18, 42, 254));
        assert_eq!(mac_string(backend_mac(3)), "02:53:59:00:03:01");
        assert_eq!(lb_backend_if(7), "to-b7");
        assert_eq!(backend_return_v4(1), Ipv4Addr::new(198, 19, 11, 11));
        assert_eq!(backend_return_v6(12).to_string(), "2001:db8:19:22::11");
        assert_eq!(client_return_side_v6(1).to_string(), "2001:db8:19:11::fe");
        assert_eq!(mac_string(backend_return_mac(3)), "02:53:59:01:03:01");
        assert_eq!(mac_string(LB_ROUTER_SIDE_MAC), "02:53:59:02:00:fe");
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn backend_zero_is_rejected() {
        let _ = backend_v4(0);
    }
}
