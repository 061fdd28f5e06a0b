//! The standard topology's names and addresses, shared by the demo and the namespace tests.
//!
//! Everything lives in the benchmarking range 198.18.0.0/15 (RFC 2544) and the documentation
//! prefix 2001:db8::/32 (RFC 3849), so nothing here can collide with a real network.
//!
//! ```text
//!  ┌─ client ns ──────────┐   198.18.0.0/24        ┌─ lb ns (ip_forward, IPv6 forwarding) ─┐
//!  │ to-lb 02:53:59:00:00:01   2001:db8::/64      │ to-client 02:53:59:00:00:fe           │
//!  │   198.18.0.1/24      ├───────── veth ─────────┤   198.18.0.254/24                     │
//!  │   2001:db8::1/64     │                        │   2001:db8::fe/64                     │
//!  │ default  via .254/::fe                        │                                       │
//!  │ VIP/32, VIP/128 via .254/::fe (host routes)   │ to-b1 02:53:59:00:01:fe               │
//!  │ XDP_PASS on to-lb, tx checksum offload off    │   198.18.11.254/24, 2001:db8:11::fe/64│
//!  └──────────────────────┘                        │ to-bI 02:53:59:00:II:fe               │
//!                                                  │   198.18.(10+I).254/24                │
//!                                                  │   2001:db8:(10+I)::fe/64              │
//!                                                  │ permanent neighbour entries for the   │
//!                                                  │ client and every backend              │
//!                                                  └───┬───────────────────────────────┬───┘
//!                                  198.18.11.0/24 veth │                               │ veth 198.18.(10+I).0/24
//!                                  2001:db8:11::/64    │                               │ 2001:db8:(10+I)::/64
//!  ┌─ b1 ns ──────────────────────────────────────────┴─┐   ┌─ bI ns ───────────────────┴───┐
//!  │ to-lb 02:53:59:00:01:01  198.18.11.11/24            │   │ to-lb 02:53:59:00:II:01       │
//!  │   2001:db8:11::11/64, default via .254 / ::fe       │   │   198.18.(10+I).11/24         │
//!  │ lo: VIPs 198.18.0.10/32, 2001:db8::10/128 (DSR)     │   │   2001:db8:(10+I)::11/64      │
//!  │ arp_ignore=1, arp_announce=2, rp_filter=0           │   │ lo: the VIPs                  │
//!  │ XDP_PASS on to-lb, tx checksum offload off          │   │                               │
//!  └─────────────────────────────────────────────────────┘   └───────────────────────────────┘
//! ```
//!
//! - **Virtual IPs** `198.18.0.10` and `2001:db8::10` sit inside the client's subnets, as a
//!   VIP usually sits in a client-facing subnet. The client reaches them through host routes
//!   via the lb rather than by ARP/ND, because the lb must *not* own them: a DSR reply leaves a
//!   backend with the VIP as its source and is forwarded by the lb, and Linux drops a forwarded
//!   packet whose source is one of its own addresses as a martian. Backends hold the VIPs on
//!   `lo` (for DSR) and never answer ARP for them (`arp_ignore=1`, `arp_announce=2`).
//! - **Backend `I`** (1-based, `I ≤ MAX_BACKENDS`) has its own point-to-point /24 and /64:
//!   `198.18.(10+I).11` and `2001:db8:(10+I)::11`, the lb at `.254` / `::fe`. The IPv6 group
//!   is written with the same digits as the IPv4 octet (b1 → `198.18.11.11` and
//!   `2001:db8:11::11`, b12 → `198.18.22.11` and `2001:db8:22::11`), so one can be read from
//!   the other.
//! - **MAC addresses** are fixed and locally administered, `02:53:59:00:SS:HH` (0x53 0x59 is
//!   "SY"): SS is the segment (0 for the client link, I for backend I), HH is 01 on the host
//!   end and fe on the lb end. Fixed MACs let the lb carry permanent neighbour entries and let
//!   packet fixtures name real addresses.
//! - **Interface names** are fixed per role (`to-lb`, `to-client`, `to-bI`): the veths are
//!   created directly inside the namespaces and never exist in the root namespace, so they
//!   cannot collide with the host's or another test's interfaces.

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
/// Each backend's veth, in its own namespace.
pub const BACKEND_IF: &str = "to-lb";

/// The client's MAC address (on [`CLIENT_IF`]).
pub const CLIENT_MAC: [u8; 6] = mac(0, 0x01);
/// The lb's MAC address on the client link (on [`LB_CLIENT_IF`]).
pub const LB_CLIENT_SIDE_MAC: [u8; 6] = mac(0, 0xfe);

const fn mac(segment: u8, host: u8) -> [u8; 6] {
    [0x02, 0x53, 0x59, 0x00, segment, host]
}

/// Checks a 1-based backend index.
///
/// # Panics
/// If `i` is 0 or above [`MAX_BACKENDS`].
fn segment(i: usize) -> u8 {
    assert!(
        (1..=MAX_BACKENDS).contains(&i),
        "backend index {i} outside 1..={MAX_BACKENDS}"
    );
    // In range by the assertion: 1 ≤ i ≤ 32.
    i as u8
}

/// The IPv6 group for backend `i`: the digits of `10 + i` read as hexadecimal (b1 → 0x11).
fn v6_group(i: usize) -> u16 {
    let n = u16::from(segment(i)) + 10;
    (n / 10) * 16 + n % 10
}

/// Backend `i`'s own IPv4 address, `198.18.(10+i).11` (1-based).
pub fn backend_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10 + segment(i), 11)
}

/// Backend `i`'s own IPv6 address, `2001:db8:(10+i)::11` (1-based).
pub fn backend_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, v6_group(i), 0, 0, 0, 0, 0x11)
}

/// The lb's IPv4 address on backend `i`'s link, `198.18.(10+i).254`: that backend's gateway.
pub fn lb_backend_side_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10 + segment(i), 254)
}

/// The lb's IPv6 address on backend `i`'s link, `2001:db8:(10+i)::fe`: that backend's gateway.
pub fn lb_backend_side_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, v6_group(i), 0, 0, 0, 0, 0xfe)
}

/// The lb's veth towards backend `i`, `to-bI`, in the lb namespace.
pub fn lb_backend_if(i: usize) -> String {
    format!("to-b{}", segment(i))
}

/// Backend `i`'s MAC address (on its [`BACKEND_IF`]).
pub fn backend_mac(i: usize) -> [u8; 6] {
    mac(segment(i), 0x01)
}

/// The lb's MAC address on backend `i`'s link (on [`lb_backend_if`]`(i)`).
pub fn lb_backend_side_mac(i: usize) -> [u8; 6] {
    mac(segment(i), 0xfe)
}

/// Backend `i`'s name as its servers announce it: `b1`, `b2`, …
pub fn backend_name(i: usize) -> String {
    format!("b{}", segment(i))
}

/// Formats a MAC address as `ip` and `ethtool` expect it.
pub fn mac_string(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

/// The IPv4 VIP with `port`.
pub fn vip_v4(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(VIP_V4), port)
}

/// The IPv6 VIP with `port`.
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
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn backend_zero_is_rejected() {
        let _ = backend_v4(0);
    }
}
