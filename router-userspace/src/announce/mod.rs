//! Announcing virtual IPs to a routing daemon: the agent adds a host route (/32, /128) for each
//! virtual IP it announces to a dummy interface it owns, and BIRD exports the routes it finds
//! there to the router (decision 0026).
//!
//! A virtual IP is announced while, and only while ([`should_announce`]):
//! - the program is attached to every interface the agent was started on (its pinned link is
//!   live: `switchyard detach` removes it, and the check of the next second withdraws);
//! - the `VIPS` entry of the address is written, as the publisher knows it (written by this
//!   process once the publish that wrote the address's services and tables returned, or found
//!   in adopted maps as the config wants it), so a route never precedes the maps;
//! - that entry carries `VIP_F_LIVE`: one of its services reaches a usable backend of a weight
//!   above 0 (the same notion that makes the program answer the address's echo requests).
//!
//! Routes are withdrawn before anything else on SIGINT/SIGTERM and by `switchyard detach`
//! before it detaches. A starting agent takes as its own every route of the configured
//! protocol on its interface and table, and the first check removes those it does not
//! announce.

mod advertise;
mod routes;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use router_common::{VIP_F_LIVE, Vip};

pub use routes::{AnnounceError, Routes, withdraw};

use crate::publish::vips::VipState;

/// Whether a virtual IP is announced: the program is `attached`, and the `VIPS` entry
/// `written` for it (`None`: not written yet) carries [`VIP_F_LIVE`].
#[must_use]
pub fn should_announce(attached: bool, written: Option<&Vip>) -> bool {
    attached && written.is_some_and(|v| v.flags & VIP_F_LIVE != 0)
}

/// The virtual IPs to announce, of those `vips` the publisher holds.
#[must_use]
pub fn wanted(attached: bool, vips: &BTreeMap<IpAddr, VipState>) -> BTreeSet<IpAddr> {
    vips.iter()
        .filter(|(_, v)| should_announce(attached, v.written.as_ref()))
        .map(|(a, _)| *a)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_common::VIP_F_ECHO;

    fn state(written: Option<u32>) -> VipState {
        VipState {
            pools: BTreeSet::new(),
            base: Vip::default(),
            written: written.map(|flags| Vip {
                flags,
                ..Vip::default()
            }),
        }
    }

    #[test]
    fn only_a_written_live_entry_of_an_attached_program_is_announced() {
        let live = Vip {
            flags: VIP_F_LIVE,
            ..Vip::default()
        };
        let down = Vip {
            flags: VIP_F_ECHO,
            ..Vip::default()
        };
        assert!(should_announce(true, Some(&live)));
        assert!(!should_announce(false, Some(&live)), "detached");
        assert!(!should_announce(true, None), "maps not written yet");
        assert!(!should_announce(true, Some(&down)), "no usable backend");
    }

    #[test]
    fn wanted_keeps_the_live_written_addresses() {
        let a: IpAddr = "198.18.0.10".parse().unwrap();
        let b: IpAddr = "198.18.0.11".parse().unwrap();
        let c: IpAddr = "2001:db8::10".parse().unwrap();
        let vips = BTreeMap::from([
            (a, state(Some(VIP_F_LIVE | VIP_F_ECHO))),
            (b, state(Some(VIP_F_ECHO))),
            (c, state(None)),
        ]);
        assert_eq!(wanted(true, &vips), BTreeSet::from([a]));
        assert!(wanted(false, &vips).is_empty());
    }
}
