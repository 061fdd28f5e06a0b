//! The follower task: one round of resolution per burst of relevant netlink events, and a
//! resync every [`RESYNC`]; see the module docs of [`super`].

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    sync::Arc,
    time::SystemTime,
};

use futures::{StreamExt as _, channel::mpsc::UnboundedReceiver};
use netlink_packet_route::{
    RouteNetlinkMessage,
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage},
};
use netlink_sys::SocketAddr;
use rtnetlink::{
    Handle,
    packet_core::{NetlinkMessage, NetlinkPayload},
};
use tokio::sync::mpsc;

use super::{
    COALESCE, NextHop, NextHopError, NextHopEvent, RESYNC, Resolution, Shared, TargetStatus,
    decide::{self, Observation, Upkeep, Verdict},
    lock,
    netlink::{self, RouteView},
};

type Events = UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>;

/// A neighbour entry by (interface index, address).
pub(crate) type NeighbourKey = (u32, IpAddr);

pub(super) struct Follower {
    pub(super) shared: Arc<Shared>,
    pub(super) handle: Handle,
    pub(super) tx: mpsc::Sender<Vec<NextHopEvent>>,
    /// False once the kernel refused or ignored a managed entry: `NTF_USE` from then on.
    pub(super) managed_supported: bool,
    /// Managed entries this resolver (or an earlier one: [`netlink::PROTOCOL`]) created, to
    /// delete when no target needs them.
    pub(super) created: BTreeSet<NeighbourKey>,
    /// Whether `created` holds the entries an earlier resolver left (read when the first
    /// targets arrive, so an agent's start deletes only what its backends do not need).
    pub(super) adopted: bool,
    /// The entries the last round read: neighbour events about others are ignored.
    pub(super) watched: BTreeSet<NeighbourKey>,
    /// The last reported resolution of every target.
    pub(super) last: BTreeMap<IpAddr, Resolution>,
}

/// Whether an event can change a target's next hop: every link and route change, a
/// neighbour change of an entry a target uses, and an overrun (events were lost).
fn relevant(
    message: &NetlinkMessage<RouteNetlinkMessage>,
    watched: &BTreeSet<NeighbourKey>,
) -> bool {
    match &message.payload {
        NetlinkPayload::Overrun(_) => true,
        NetlinkPayload::InnerMessage(m) => match m {
            RouteNetlinkMessage::NewNeighbour(n) | RouteNetlinkMessage::DelNeighbour(n) => {
                neighbour_key(n).is_some_and(|k| watched.contains(&k))
            }
            RouteNetlinkMessage::NewLink(_)
            | RouteNetlinkMessage::DelLink(_)
            | RouteNetlinkMessage::NewRoute(_)
            | RouteNetlinkMessage::DelRoute(_) => true,
            _ => false,
        },
        _ => false,
    }
}

/// The `(ifindex, address)` a neighbour message is about.
pub(crate) fn neighbour_key(n: &NeighbourMessage) -> Option<NeighbourKey> {
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
            Some((n.header.ifindex, IpAddr::V4(*v4)))
        }
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
            Some((n.header.ifindex, IpAddr::V6(*v6)))
        }
        _ => None,
    })
}

impl Follower {
    pub(super) async fn run(mut self, mut events: Events) {
        let mut events_open = true;
        loop {
            if !self.round().await {
                log::debug!("next-hop receiver gone; the resolver stops");
                return;
            }
            let resync = tokio::time::sleep(RESYNC);
            tokio::pin!(resync);
            loop {
                tokio::select! {
                    () = &mut resync => break,
                    () = self.shared.wake.notified() => break,
                    event = events.next(), if events_open => match event {
                        Some((message, _)) if relevant(&message, &self.watched) => {
                            events_open = Self::coalesce(&mut events).await;
                            break;
                        }
                        Some(_) => {}
                        None => {
                            log::error!(
                                "the rtnetlink event socket closed; next hops follow changes \
                                 by the {RESYNC:?} resync only"
                            );
                            events_open = false;
                        }
                    },
                }
            }
        }
    }

    /// Swallows the rest of a burst for [`COALESCE`]; false when the event socket closed.
    async fn coalesce(events: &mut Events) -> bool {
        let deadline = tokio::time::sleep(COALESCE);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return true,
                event = events.next() => if event.is_none() { return false },
            }
        }
    }

    /// Resolves every target and sends the changes; false when the receiver is gone.
    async fn round(&mut self) -> bool {
        let (targets, added) = {
            let mut t = lock(&self.shared.targets);
            (t.set.clone(), std::mem::take(&mut t.added))
        };
        for target in &added {
            self.last.remove(target);
        }
        if !self.adopted && !targets.is_empty() {
            match netlink::ours(&self.handle).await {
                Ok(earlier) => {
                    self.created.extend(earlier);
                    self.adopted = true;
                }
                Err(e) => log::warn!("{e} (retrying)"),
            }
        }
        let mut links = HashMap::new();
        let mut used = BTreeSet::new();
        let mut changes = Vec::new();
        for &target in &targets {
            let seen = match self.resolve(target, &mut links, &mut used).await {
                Ok(seen) => seen,
                Err(e) => {
                    log::warn!("next hop of {target}: {e} (retrying)");
                    continue;
                }
            };
            if let Some(resolution) = decide::report(self.last.get(&target), seen) {
                match &resolution {
                    Resolution::Resolved(hop) => log::info!("next hop of {target}: {hop}"),
                    Resolution::Resolving { reason } => {
                        log::info!("next hop of {target}: {reason}");
                    }
                    Resolution::Unresolved { reason } => {
                        log::warn!("next hop of {target} unresolved: {reason}");
                    }
                }
                self.last.insert(target, resolution.clone());
                changes.push(NextHopEvent {
                    address: target,
                    resolution,
                });
            }
        }
        self.last.retain(|a, _| targets.contains(a));
        self.publish_status(&changes);
        self.forget_unused(&used).await;
        self.watched = used;
        changes.is_empty() || self.tx.send(changes).await.is_ok()
    }

    fn publish_status(&self, changes: &[NextHopEvent]) {
        let now = SystemTime::now();
        let mut status = lock(&self.shared.status);
        status.retain(|a, _| self.last.contains_key(a));
        for change in changes {
            let keeps_since = matches!(
                (
                    status.get(&change.address).map(|s| &s.resolution),
                    &change.resolution
                ),
                (
                    Some(Resolution::Unresolved { .. } | Resolution::Resolving { .. }),
                    Resolution::Unresolved { .. }
                )
            );
            let since = match status.get(&change.address) {
                Some(s) if keeps_since => s.since,
                _ => now,
            };
            status.insert(
                change.address,
                TargetStatus {
                    resolution: change.resolution.clone(),
                    since,
                },
            );
        }
    }

    /// Deletes the managed entries this resolver created that no target uses any more (a
    /// removed target, a changed route), unless an administrator has made them their own.
    async fn forget_unused(&mut self, used: &BTreeSet<NeighbourKey>) {
        let unused: Vec<NeighbourKey> = self.created.difference(used).copied().collect();
        for (ifindex, addr) in unused {
            match netlink::neighbour(&self.handle, ifindex, addr).await {
                Ok(Some(entry)) if entry.managed => {
                    if let Err(e) = netlink::delete_neighbour(&self.handle, ifindex, addr).await {
                        log::warn!("{e} (retrying)");
                        continue;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    log::warn!("{e} (retrying)");
                    continue;
                }
            }
            self.created.remove(&(ifindex, addr));
        }
    }

    /// One target's route, link and neighbour; writes the entry when it needs keeping.
    async fn resolve(
        &mut self,
        target: IpAddr,
        links: &mut HashMap<u32, Option<netlink::LinkView>>,
        used: &mut BTreeSet<NeighbourKey>,
    ) -> Result<Observation, NextHopError> {
        let (oif, gateway) = match netlink::route(&self.handle, target).await? {
            RouteView::Unicast { oif, gateway } => (oif, gateway),
            RouteView::Unusable(reason) => return Ok(Observation::Failed { reason }),
        };
        let link = if let Some(link) = links.get(&oif) {
            link.clone()
        } else {
            let link = netlink::link(&self.handle, oif).await?;
            links.insert(oif, link.clone());
            link
        };
        let Some(link) = link else {
            return Ok(Observation::Failed {
                reason: format!("link {oif} of the route to {target} is gone"),
            });
        };
        if !link.up {
            return Ok(Observation::Failed {
                reason: format!("link {} is down", link.name),
            });
        }
        if !link.carrier {
            return Ok(Observation::Failed {
                reason: format!("link {} has no carrier", link.name),
            });
        }
        let Some(smac) = link.mac else {
            return Ok(Observation::Failed {
                reason: format!("link {} has no Ethernet address", link.name),
            });
        };
        let neighbour = decide::neighbour_of(target, gateway);
        used.insert((oif, neighbour));
        let mut entry = netlink::neighbour(&self.handle, oif, neighbour).await?;
        let upkeep = decide::upkeep(entry.as_ref(), self.managed_supported);
        if upkeep != Upkeep::Nothing {
            match self.keep(oif, neighbour, entry.is_some(), upkeep).await {
                Ok(()) => {}
                // The kernel's neighbour table is full (`gc_thresh3`, 1,024 entries by
                // default, shared by every namespace): a verdict with the fix, not a retry.
                Err(e) if netlink::errno_of(&e) == Some(libc::ENOBUFS) => {
                    let family = if neighbour.is_ipv4() { "ipv4" } else { "ipv6" };
                    return Ok(Observation::Failed {
                        reason: format!(
                            "the kernel's neighbour table is full, no entry for {neighbour} on \
                             {}: raise net.{family}.neigh.default.gc_thresh3 (and gc_thresh2)",
                            link.name
                        ),
                    });
                }
                Err(e) => return Err(e),
            }
            entry = netlink::neighbour(&self.handle, oif, neighbour).await?;
            if upkeep == Upkeep::MakeManaged && entry.as_ref().is_some_and(|e| !e.managed) {
                log::warn!(
                    "the kernel ignored a managed neighbour entry ({neighbour} on {}); next \
                     hops are kept resolved by NTF_USE on every {RESYNC:?} resync instead",
                    link.name
                );
                self.managed_supported = false;
            }
        }
        let on = &link.name;
        Ok(match decide::verdict(entry.as_ref()) {
            Verdict::Usable(dmac) => Observation::Resolved(NextHop {
                ifindex: oif,
                iface: link.name,
                smac,
                dmac,
                gateway,
                mtu: link.mtu,
            }),
            Verdict::Pending => Observation::Pending {
                reason: format!("resolving neighbour {neighbour} on {on}"),
            },
            Verdict::Failed => Observation::Failed {
                reason: format!("neighbour {neighbour} on {on} FAILED"),
            },
            Verdict::NoLinkLayerAddress => Observation::Failed {
                reason: format!("neighbour {neighbour} on {on} has no Ethernet address"),
            },
        })
    }

    /// Writes what `upkeep` asks for; a refused managed entry switches to `NTF_USE`.
    async fn keep(
        &mut self,
        ifindex: u32,
        addr: IpAddr,
        exists: bool,
        upkeep: Upkeep,
    ) -> Result<(), NextHopError> {
        match upkeep {
            Upkeep::Nothing => Ok(()),
            Upkeep::Use => netlink::use_neighbour(&self.handle, ifindex, addr).await,
            Upkeep::MakeManaged => {
                match netlink::make_managed(&self.handle, ifindex, addr, exists).await {
                    Ok(()) => {
                        log::debug!("managed neighbour entry {addr} on link {ifindex}");
                        self.created.insert((ifindex, addr));
                        Ok(())
                    }
                    // Someone created it between our read and write: read it next round.
                    Err(e) if netlink::errno_of(&e) == Some(libc::EEXIST) => Ok(()),
                    Err(e)
                        if matches!(
                            netlink::errno_of(&e),
                            Some(libc::EINVAL | libc::EOPNOTSUPP)
                        ) =>
                    {
                        log::warn!(
                            "the kernel refuses managed neighbour entries ({e}); next hops \
                             are kept resolved by NTF_USE on every {RESYNC:?} resync instead"
                        );
                        self.managed_supported = false;
                        netlink::use_neighbour(&self.handle, ifindex, addr).await
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }
}
