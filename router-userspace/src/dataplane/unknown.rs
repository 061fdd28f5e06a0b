//! Reading `UNKNOWN_CLIENTS`: the ring buffer in which the program reports new flows from
//! clients with neither a static class nor a live classifier answer (services with
//! `SVC_F_CLASSIFY`; its rate limits are in `router_common::maps`).
//!
//! [`UnknownClients`] drains the ring without waiting (tests, a poll loop);
//! [`AsyncUnknownClients`] waits on the ring's file descriptor with tokio's [`AsyncFd`] (the
//! kernel wakes it when a record is submitted) and returns each batch it finds. Records are
//! decoded into [`Unknown`]; one that does not decode (of another layout) is counted, not
//! returned.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, RawFd},
};

use aya::maps::{MapData, RingBuf};
use router_common::{FAMILY_V4, FAMILY_V6, UnknownClient};
use tokio::io::{Interest, unix::AsyncFd};

/// One record of `UNKNOWN_CLIENTS`, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Unknown {
    /// The client (the flow's source address).
    pub client: IpAddr,
    /// The virtual IP the flow addressed.
    pub vip: IpAddr,
    /// The service's port, host order.
    pub port: u16,
    /// The IP protocol (`6` TCP, `17` UDP).
    pub proto: u8,
}

/// Decodes one ring record: `None` when it is not the size of an [`UnknownClient`] or its
/// family is neither IPv4 nor IPv6.
#[must_use]
pub fn decode(record: &[u8]) -> Option<Unknown> {
    if record.len() != size_of::<UnknownClient>() {
        return None;
    }
    let addr = |at: usize, v6: bool| -> Option<IpAddr> {
        let b: [u8; 16] = record.get(at..at + 16)?.try_into().ok()?;
        Some(if v6 {
            IpAddr::V6(Ipv6Addr::from(b))
        } else {
            IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
        })
    };
    let v6 = match record[0] {
        FAMILY_V4 => false,
        FAMILY_V6 => true,
        _ => return None,
    };
    Some(Unknown {
        client: addr(4, v6)?,
        vip: addr(20, v6)?,
        // `port` holds network-order bytes.
        port: u16::from_be_bytes([record[2], record[3]]),
        proto: record[1],
    })
}

/// The consumer side of `UNKNOWN_CLIENTS`, without waiting.
pub struct UnknownClients {
    ring: RingBuf<MapData>,
    undecodable: u64,
}

impl UnknownClients {
    /// The reader of `ring` (from [`super::maps::KernelMaps::take_unknown_clients`]).
    #[must_use]
    pub const fn new(ring: RingBuf<MapData>) -> Self {
        Self {
            ring,
            undecodable: 0,
        }
    }

    /// Every record the ring holds now, in the order they were submitted (possibly none).
    pub fn drain(&mut self) -> Vec<Unknown> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            match decode(&item) {
                Some(u) => out.push(u),
                None => self.undecodable += 1,
            }
        }
        out
    }

    /// Records read that did not decode, since this reader was made.
    #[must_use]
    pub const fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// The reader, waiting on the ring's file descriptor through tokio.
    ///
    /// # Errors
    ///
    /// When the descriptor cannot be registered with tokio's reactor (no runtime, or epoll
    /// refuses it).
    pub fn into_async(self) -> io::Result<AsyncUnknownClients> {
        // SAFETY: the descriptor is the ring's map fd, owned by `self.ring` (an `OwnedFd` in
        // its `MapData`), which the `AsyncFd` owns in turn: it stays open, and `as_raw_fd`
        // returns it, for the `AsyncFd`'s whole life.
        let fd = unsafe { AsyncFd::register_with_interest(self, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(AsyncUnknownClients { fd })
    }
}

impl AsRawFd for UnknownClients {
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

/// The consumer side of `UNKNOWN_CLIENTS`, woken by the kernel when records arrive.
pub struct AsyncUnknownClients {
    fd: AsyncFd<UnknownClients>,
}

impl AsyncUnknownClients {
    /// The next records: waits until the ring holds at least one, then returns all it holds
    /// (never an empty batch).
    ///
    /// # Errors
    ///
    /// When polling the descriptor fails.
    pub async fn next_batch(&mut self) -> io::Result<Vec<Unknown>> {
        loop {
            let mut guard = self.fd.readable_mut().await?;
            let batch = guard.get_inner_mut().drain();
            // tokio keeps a readiness that arrived after `readable_mut` returned: no wakeup
            // between the drain and this is lost.
            guard.clear_ready();
            if !batch.is_empty() {
                return Ok(batch);
            }
        }
    }

    /// The underlying reader (its [`UnknownClients::undecodable`] count).
    #[must_use]
    pub fn get_ref(&self) -> &UnknownClients {
        self.fd.get_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(family: u8, client: [u8; 16], vip: [u8; 16]) -> Vec<u8> {
        let r = UnknownClient {
            family,
            proto: 6,
            port: 443u16.to_be(),
            addr: client,
            vip,
        };
        let mut b = vec![r.family, r.proto];
        b.extend_from_slice(&r.port.to_ne_bytes());
        b.extend_from_slice(&r.addr);
        b.extend_from_slice(&r.vip);
        b
    }

    #[test]
    fn records_decode_with_their_family_s_addresses_and_a_host_order_port() {
        let mut c = [0u8; 16];
        c[..4].copy_from_slice(&[198, 18, 6, 7]);
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(&[198, 19, 0, 1]);
        assert_eq!(
            decode(&record(FAMILY_V4, c, v)),
            Some(Unknown {
                client: "198.18.6.7".parse().unwrap(),
                vip: "198.19.0.1".parse().unwrap(),
                port: 443,
                proto: 6,
            })
        );
        let c6: Ipv6Addr = "2001:db8:6::7".parse().unwrap();
        let v6: Ipv6Addr = "2001:db8:ffff::1".parse().unwrap();
        let u = decode(&record(FAMILY_V6, c6.octets(), v6.octets())).unwrap();
        assert_eq!((u.client, u.vip), (IpAddr::V6(c6), IpAddr::V6(v6)));
    }

    #[test]
    fn records_of_another_size_or_family_do_not_decode() {
        let r = record(FAMILY_V4, [0; 16], [0; 16]);
        assert_eq!(decode(&r[..35]), None);
        let mut longer = r.clone();
        longer.push(0);
        assert_eq!(decode(&longer), None);
        assert_eq!(decode(&record(5, [0; 16], [0; 16])), None);
    }
}
