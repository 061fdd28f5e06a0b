//! The pure half of the resolver: what a neighbour entry means, what to write to keep it
//! resolved, and which observations are worth an event (make-before-break).

use std::net::IpAddr;

use netlink_packet_route::neighbour::NeighbourState;

use super::{NextHop, Resolution};

/// What one round saw for one target, before comparing it with what was last reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Observation {
    /// A usable next hop.
    Resolved(NextHop),
    /// The neighbour is being resolved, or its entry is gone and is being re-created: not a
    /// failure, so a target that was resolved keeps its last next hop (make-before-break).
    Pending {
        /// Why it is not resolved yet, reported only for a target never reported before.
        reason: String,
    },
    /// A definite failure: the neighbour did not answer (`NUD_FAILED`), no route, the egress
    /// link is down or gone.
    Failed {
        /// What failed, for humans.
        reason: String,
    },
}

/// The resolution to report for a target after `seen`, or `None` when nothing changed that
/// the program must know.
///
/// - `Resolved` is reported whenever it differs from the last report (new MAC, egress or
///   gateway included).
/// - `Pending` is reported only for a target never reported before (as `Resolving`, so every
///   target appears in the first round that saw it); after a report it is silent, so a flushed
///   entry or an `INCOMPLETE` re-resolution never takes a working next hop away, and a
///   definite failure keeps its reason while the kernel probes again.
/// - `Failed` is reported unless the last report is the same failure.
pub(crate) fn report(last: Option<&Resolution>, seen: Observation) -> Option<Resolution> {
    let next = match seen {
        Observation::Resolved(hop) => Resolution::Resolved(hop),
        Observation::Pending { reason } => {
            return last.is_none().then_some(Resolution::Resolving { reason });
        }
        Observation::Failed { reason } => Resolution::Unresolved { reason },
    };
    (last != Some(&next)).then_some(next)
}

/// A neighbour entry as the kernel reported it (`RTM_NEWNEIGH`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NeighbourEntry {
    /// `ndm_state`.
    pub(crate) state: NeighbourState,
    /// `NDA_LLADDR`, when present.
    pub(crate) lladdr: Option<Vec<u8>>,
    /// Whether `NDA_FLAGS_EXT` carries `NTF_EXT_MANAGED`.
    pub(crate) managed: bool,
}

/// What a neighbour entry means for forwarding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Frames can be sent to this MAC.
    Usable([u8; 6]),
    /// Being resolved (`INCOMPLETE`, `NONE`), or no entry.
    Pending,
    /// The kernel gave up (`FAILED`).
    Failed,
    /// A valid state without a 6-byte link-layer address (not Ethernet).
    NoLinkLayerAddress,
}

/// Whether `state` holds a link-layer address the kernel itself would send to. `STALE`,
/// `DELAY` and `PROBE` still forward to the cached address while the kernel re-validates it
/// (RFC 4861 §7.3.2 for NDP; the ARP table follows the same state machine).
pub(crate) fn is_valid(state: NeighbourState) -> bool {
    matches!(
        state,
        NeighbourState::Reachable
            | NeighbourState::Stale
            | NeighbourState::Delay
            | NeighbourState::Probe
            | NeighbourState::Permanent
            | NeighbourState::Noarp
    )
}

/// The verdict on an entry, `None` meaning there is none.
pub(crate) fn verdict(entry: Option<&NeighbourEntry>) -> Verdict {
    let Some(entry) = entry else {
        return Verdict::Pending;
    };
    if entry.state == NeighbourState::Failed {
        return Verdict::Failed;
    }
    if !is_valid(entry.state) {
        return Verdict::Pending;
    }
    match entry.lladdr.as_deref().map(<[u8; 6]>::try_from) {
        Some(Ok(mac)) => Verdict::Usable(mac),
        _ => Verdict::NoLinkLayerAddress,
    }
}

/// The write that keeps an entry resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upkeep {
    /// Nothing: the kernel already keeps it (managed), or an administrator fixed it
    /// (`PERMANENT`, `NOARP`), or the kernel is resolving it already (fallback mode).
    Nothing,
    /// Create the entry, or mark the existing one, as kernel-managed (`NTF_EXT_MANAGED`): the
    /// kernel resolves it and re-validates it periodically, without traffic through it.
    /// Replacing keeps the cached address and starts its validation.
    MakeManaged,
    /// Fallback where managed entries are not supported: ask the kernel to resolve the entry
    /// now (`NTF_USE`, as if a packet were sent through it), creating it if needed.
    Use,
}

/// What to write for `entry` (`None`: no entry), given whether the kernel takes managed
/// entries.
pub(crate) fn upkeep(entry: Option<&NeighbourEntry>, managed_supported: bool) -> Upkeep {
    let Some(entry) = entry else {
        return if managed_supported {
            Upkeep::MakeManaged
        } else {
            Upkeep::Use
        };
    };
    if matches!(
        entry.state,
        NeighbourState::Permanent | NeighbourState::Noarp
    ) || entry.managed
    {
        return Upkeep::Nothing;
    }
    if managed_supported {
        return Upkeep::MakeManaged;
    }
    // Without managed entries the kernel re-validates an entry only when traffic uses it: an
    // entry it is not probing (STALE, FAILED, NONE) is nudged on every round.
    match entry.state {
        NeighbourState::Reachable
        | NeighbourState::Delay
        | NeighbourState::Probe
        | NeighbourState::Incomplete => Upkeep::Nothing,
        _ => Upkeep::Use,
    }
}

/// The neighbour a target's frames go to: its gateway when routed, else itself.
pub(crate) fn neighbour_of(target: IpAddr, gateway: Option<IpAddr>) -> IpAddr {
    gateway.unwrap_or(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(dmac_last: u8) -> NextHop {
        NextHop {
            ifindex: 3,
            iface: "to-b1".into(),
            smac: [2, 0x53, 0x59, 0, 1, 0xfe],
            dmac: [2, 0x53, 0x59, 0, 1, dmac_last],
            gateway: None,
            mtu: 1500,
        }
    }

    fn entry(state: NeighbourState, lladdr: Option<&[u8]>, managed: bool) -> NeighbourEntry {
        NeighbourEntry {
            state,
            lladdr: lladdr.map(<[u8]>::to_vec),
            managed,
        }
    }

    fn pending() -> Observation {
        Observation::Pending {
            reason: "resolving".into(),
        }
    }

    fn failed(why: &str) -> Observation {
        Observation::Failed { reason: why.into() }
    }

    #[test]
    fn a_new_target_is_reported_whatever_it_is() {
        assert_eq!(
            report(None, Observation::Resolved(hop(1))),
            Some(Resolution::Resolved(hop(1)))
        );
        assert_eq!(
            report(None, pending()),
            Some(Resolution::Resolving {
                reason: "resolving".into()
            })
        );
        assert_eq!(
            report(None, failed("no route")),
            Some(Resolution::Unresolved {
                reason: "no route".into()
            })
        );
    }

    #[test]
    fn pending_never_takes_a_resolved_next_hop_away() {
        let last = Resolution::Resolved(hop(1));
        assert_eq!(report(Some(&last), pending()), None);
        let failed_before = Resolution::Unresolved {
            reason: "FAILED".into(),
        };
        assert_eq!(report(Some(&failed_before), pending()), None);
    }

    #[test]
    fn only_changes_are_reported() {
        let last = Resolution::Resolved(hop(1));
        assert_eq!(report(Some(&last), Observation::Resolved(hop(1))), None);
        assert_eq!(
            report(Some(&last), Observation::Resolved(hop(0x99))),
            Some(Resolution::Resolved(hop(0x99)))
        );
        let gone = Resolution::Unresolved {
            reason: "no route".into(),
        };
        assert_eq!(report(Some(&gone), failed("no route")), None);
        assert_eq!(
            report(Some(&gone), failed("link down")),
            Some(Resolution::Unresolved {
                reason: "link down".into()
            })
        );
        assert_eq!(
            report(Some(&last), failed("FAILED")),
            Some(Resolution::Unresolved {
                reason: "FAILED".into()
            })
        );
    }

    #[test]
    fn verdicts_follow_the_neighbour_states() {
        let mac: &[u8] = &[2, 0x53, 0x59, 0, 1, 1];
        for state in [
            NeighbourState::Reachable,
            NeighbourState::Stale,
            NeighbourState::Delay,
            NeighbourState::Probe,
            NeighbourState::Permanent,
            NeighbourState::Noarp,
        ] {
            assert_eq!(
                verdict(Some(&entry(state, Some(mac), false))),
                Verdict::Usable([2, 0x53, 0x59, 0, 1, 1]),
                "{state}"
            );
        }
        assert_eq!(verdict(None), Verdict::Pending);
        assert_eq!(
            verdict(Some(&entry(NeighbourState::Incomplete, None, true))),
            Verdict::Pending
        );
        assert_eq!(
            verdict(Some(&entry(NeighbourState::None, None, true))),
            Verdict::Pending
        );
        assert_eq!(
            verdict(Some(&entry(NeighbourState::Failed, Some(mac), true))),
            Verdict::Failed
        );
        assert_eq!(
            verdict(Some(&entry(NeighbourState::Noarp, None, false))),
            Verdict::NoLinkLayerAddress
        );
        assert_eq!(
            verdict(Some(&entry(
                NeighbourState::Reachable,
                Some(&[1, 2]),
                false
            ))),
            Verdict::NoLinkLayerAddress
        );
    }

    #[test]
    fn managed_entries_are_made_only_where_the_kernel_does_not_keep_one() {
        let mac: &[u8] = &[2, 0, 0, 0, 0, 1];
        assert_eq!(upkeep(None, true), Upkeep::MakeManaged);
        assert_eq!(
            upkeep(Some(&entry(NeighbourState::Stale, Some(mac), false)), true),
            Upkeep::MakeManaged
        );
        assert_eq!(
            upkeep(Some(&entry(NeighbourState::Failed, None, true)), true),
            Upkeep::Nothing
        );
        assert_eq!(
            upkeep(
                Some(&entry(NeighbourState::Permanent, Some(mac), false)),
                true
            ),
            Upkeep::Nothing
        );
    }

    #[test]
    fn without_managed_entries_the_kernel_is_nudged_when_it_is_not_probing() {
        let mac: &[u8] = &[2, 0, 0, 0, 0, 1];
        assert_eq!(upkeep(None, false), Upkeep::Use);
        assert_eq!(
            upkeep(Some(&entry(NeighbourState::Stale, Some(mac), false)), false),
            Upkeep::Use
        );
        assert_eq!(
            upkeep(Some(&entry(NeighbourState::Failed, None, false)), false),
            Upkeep::Use
        );
        assert_eq!(
            upkeep(
                Some(&entry(NeighbourState::Reachable, Some(mac), false)),
                false
            ),
            Upkeep::Nothing
        );
        assert_eq!(
            upkeep(Some(&entry(NeighbourState::Incomplete, None, false)), false),
            Upkeep::Nothing
        );
    }

    #[test]
    fn a_routed_target_resolves_its_gateway() {
        let t: IpAddr = "198.19.250.1".parse().unwrap();
        let gw: IpAddr = "198.18.11.11".parse().unwrap();
        assert_eq!(neighbour_of(t, Some(gw)), gw);
        assert_eq!(neighbour_of(t, None), t);
    }
}
