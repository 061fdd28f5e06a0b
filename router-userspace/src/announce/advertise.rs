//! Gratuitous ARP (IPv4) and unsolicited neighbour advertisements (IPv6) for a newly announced
//! virtual IP, sent on the interfaces of `announce.garp` through a packet socket, so hosts on
//! a shared segment that cached another node's MAC address for it learn this one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The frame that advertises `addr` at `mac`: a gratuitous ARP request (sender and target
/// `addr`, to the broadcast address) for IPv4; for IPv6 an unsolicited neighbour advertisement
/// (override flag, target link-layer address option) from the EUI-64 link-local address of
/// `mac` to all nodes (`ff02::1`), hop limit 255 as RFC 4861 requires.
#[must_use]
pub fn frame(addr: IpAddr, mac: [u8; 6]) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => arp(a, mac),
        IpAddr::V6(a) => na(a, mac),
    }
}

fn arp(addr: Ipv4Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&0x0806u16.to_be_bytes());
    // Ethernet, IPv4, 6-byte and 4-byte addresses, a request.
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&addr.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&addr.octets());
    f
}

fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a[0] = 0xfe;
    a[1] = 0x80;
    a[8] = mac[0] ^ 0x02;
    a[9] = mac[1];
    a[10] = mac[2];
    a[11] = 0xff;
    a[12] = 0xfe;
    a[13] = mac[3];
    a[14] = mac[4];
    a[15] = mac[5];
    Ipv6Addr::from(a)
}

fn na(target: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    let src = link_local(mac);
    let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    // Type 136, code 0, checksum, flags (override), target, option 2 (target link-layer
    // address) of one 8-byte unit.
    let mut icmp = vec![136, 0, 0, 0, 0x20, 0, 0, 0];
    icmp.extend_from_slice(&target.octets());
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&mac);
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let hi = u32::from(pair[0]) << 8;
            sum += hi | pair.get(1).copied().map_or(0, u32::from);
        }
    };
    add(&src.octets());
    add(&dst.octets());
    let len = u32::try_from(icmp.len()).unwrap_or(0);
    add(&len.to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(&icmp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let checksum = !u16::try_from(sum).unwrap_or(0xffff);
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());
    let mut f = Vec::with_capacity(14 + 40 + icmp.len());
    f.extend_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&0x86ddu16.to_be_bytes());
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&u16::try_from(icmp.len()).unwrap_or(0).to_be_bytes());
    f.extend_from_slice(&[58, 255]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&icmp);
    f
}

/// Sends `frame` as is out of the interface of index `ifindex`.
///
/// # Errors
///
/// The socket's error (no `CAP_NET_RAW`, the interface gone or down).
pub fn send(ifindex: u32, frame: &[u8]) -> std::io::Result<()> {
    // SAFETY: plain socket(2); the descriptor is closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: an all-zero `sockaddr_ll` is valid; the fields set below complete it.
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or(17);
    to.sll_ifindex = i32::try_from(ifindex).unwrap_or(0);
    to.sll_halen = 6;
    to.sll_addr[..6].copy_from_slice(&frame[..6]);
    // SAFETY: `frame` and `to` outlive the call; the lengths are theirs.
    let sent = unsafe {
        libc::sendto(
            fd,
            frame.as_ptr().cast(),
            frame.len(),
            0,
            std::ptr::from_ref(&to).cast(),
            u32::try_from(std::mem::size_of::<libc::sockaddr_ll>()).unwrap_or(20),
        )
    };
    let result = if sent < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    };
    // SAFETY: `fd` is the socket opened above.
    unsafe { libc::close(fd) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

    #[test]
    fn a_gratuitous_arp_names_the_address_as_sender_and_target() {
        let f = frame("198.18.0.10".parse().unwrap(), MAC);
        assert_eq!(f.len(), 42);
        assert_eq!(&f[..6], &[0xff; 6]);
        assert_eq!(&f[12..14], &[8, 6]);
        assert_eq!(&f[22..28], &MAC);
        assert_eq!(&f[28..32], &[198, 18, 0, 10]);
        assert_eq!(&f[38..42], &[198, 18, 0, 10]);
    }

    #[test]
    fn an_unsolicited_advertisement_checksums_to_zero() {
        let f = frame("2001:db8::10".parse().unwrap(), MAC);
        assert_eq!(f.len(), 14 + 40 + 32);
        assert_eq!(f[21], 255, "hop limit");
        // The one's complement sum over the pseudo-header and message is 0xffff.
        let (ip, icmp) = (&f[14..54], &f[54..]);
        let mut sum: u32 = 0;
        let mut add = |b: &[u8]| {
            for p in b.chunks(2) {
                sum += (u32::from(p[0]) << 8) | u32::from(p[1]);
            }
        };
        add(&ip[8..40]);
        add(&[0, 0, 0, 32, 0, 0, 0, 58]);
        add(icmp);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        assert_eq!(icmp[4], 0x20, "override, not solicited");
    }
}
