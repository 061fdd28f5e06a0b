//! Next hops of backends, resolved and followed over rtnetlink in the caller's network
//! namespace.
//!
//! For every target address the resolver asks the kernel, as `ip route get`, `ip link show`
//! and `ip neigh get` would:
//!
//! 1. `RTM_GETROUTE` for the address → egress interface and gateway (none when on-link);
//! 2. `RTM_GETLINK` for that interface → its name, MAC, `IFF_UP` and `IFF_LOWER_UP`;
//! 3. `RTM_GETNEIGH` for (interface, gateway or the address itself) → the neighbour's MAC.
//!
//! **Keeping entries resolved.** The program forwards without the kernel's neighbour
//! subsystem, so no traffic ever refreshes an entry. Every entry the resolver reads is made
//! *kernel-managed* (`NTF_EXT_MANAGED` in `NDA_FLAGS_EXT`, Linux ≥ 5.16; `ip neigh add ADDR
//! dev IF managed` sends the same, with state `NUD_NONE`): the kernel resolves it at once
//! (ARP, or NDP for IPv6) and re-validates it periodically, with no traffic through it. A
//! missing entry is created that way; an existing dynamic one is replaced as managed, which
//! keeps its cached MAC and starts a validation. `PERMANENT` and `NOARP` entries are an
//! administrator's and are left alone. Where the kernel refuses managed entries (or ignores
//! the attribute, as kernels before 5.16 do) the resolver falls back, for the rest of its life,
//! to `NTF_USE` writes: each round asks the kernel to resolve every entry it is not already
//! probing, as a packet queued for it would; that keeps them usable at the resync period
//! instead of the kernel's own.
//!
//! **What is reported.** A target is `Resolved` while its neighbour state holds a usable MAC
//! (`REACHABLE`, `STALE`, `DELAY`, `PROBE`, `PERMANENT`, `NOARP`). It becomes `Unresolved`
//! only on a definite failure: `NUD_FAILED`, no route, the egress link down, without carrier
//! or gone. An entry that disappears (`ip neigh flush`) or re-resolves through `INCOMPLETE`
//! changes nothing that was reported (make-before-break: the last MAC stays in use) and the
//! entry is re-created. A changed MAC, egress or gateway is reported as a new `Resolved`.
//!
//! **Following.** A task subscribes to the neighbour, link and IPv4/IPv6 route groups and,
//! on any event that can concern a target, re-resolves every target after [`COALESCE`] (so a
//! burst is one round); it also resyncs every [`RESYNC`], the safety net for events the
//! kernel dropped (`ENOBUFS` on a full socket buffer). Each round sends at most one batch,
//! only of changes. Request errors are logged and the target retried next round; the task
//! never panics. Entries the resolver created and no target needs any more are deleted.
//!
//! Both netlink sockets are opened by [`spawn`] on the calling thread, so they belong to the
//! network namespace that thread is in, wherever the task runs later.

mod decide;
mod netlink;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use futures::channel::mpsc::UnboundedReceiver;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage};
use netlink_sys::SocketAddr;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::{Handle, MulticastGroup};
use serde::{Serialize, Serializer};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use decide::{Observation, Upkeep, Verdict};
use netlink::RouteView;

/// How long a round waits after the first relevant netlink event for more of a burst.
pub const COALESCE: Duration = Duration::from_millis(5);
/// Period of the full resync that catches events the kernel dropped.
pub const RESYNC: Duration = Duration::from_secs(1);

/// One backend's next hop, as the program needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NextHop {
    /// Egress interface index.
    pub ifindex: u32,
    /// The egress interface's name.
    pub iface: String,
    /// The egress interface's MAC: the source of forwarded frames.
    #[serde(serialize_with = "serialize_mac")]
    pub smac: [u8; 6],
    /// The backend's MAC on a shared segment, else its gateway's: the destination of
    /// forwarded frames.
    #[serde(serialize_with = "serialize_mac")]
    pub dmac: [u8; 6],
    /// `Some(gateway)` for a routed backend, `None` for one on a shared segment.
    pub gateway: Option<IpAddr>,
}

/// Formats a MAC as `02:53:59:00:01:01`.
pub fn mac_string(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

fn serialize_mac<S: Serializer>(mac: &[u8; 6], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&mac_string(*mac))
}

impl fmt::Display for NextHop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {} (if {}) from {}",
            mac_string(self.dmac),
            self.iface,
            self.ifindex,
            mac_string(self.smac)
        )?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        Ok(())
    }
}

/// Whether a target can be forwarded to, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Resolution {
    /// Frames to the target go out this way.
    Resolved(NextHop),
    /// A target never resolved yet whose neighbour the kernel is resolving: no verdict yet.
    Resolving {
        /// What is being resolved (`resolving neighbour 198.18.11.11 on to-b1`).
        reason: String,
    },
    /// They cannot be sent: no route, link down or gone, neighbour `FAILED`.
    Unresolved {
        /// Why, for humans (`no route to 198.18.9.9`, `neighbour 198.18.11.11 on to-b1
        /// FAILED`).
        reason: String,
    },
}

impl Resolution {
    /// The next hop, when resolved.
    pub fn next_hop(&self) -> Option<&NextHop> {
        match self {
            Self::Resolved(hop) => Some(hop),
            Self::Resolving { .. } | Self::Unresolved { .. } => None,
        }
    }
}

/// A change of one target's resolution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NextHopEvent {
    /// The target.
    pub address: IpAddr,
    /// Its resolution from now on.
    pub resolution: Resolution,
}

/// A target's last reported resolution and when it was first reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TargetStatus {
    /// What was last reported.
    pub resolution: Resolution,
    /// When that resolution was reported (a resolved target whose MAC changes gets a new
    /// time; an unresolved one whose reason changes keeps the time it became unresolved).
    pub since: SystemTime,
}

/// Why the resolver could not start, or a request that failed (logged and retried).
#[derive(Debug, thiserror::Error)]
pub enum NextHopError {
    /// [`spawn`] was called outside a tokio runtime.
    #[error("the next-hop resolver needs a tokio runtime")]
    NoRuntime,
    /// A netlink socket could not be opened or subscribed.
    #[error("cannot open the rtnetlink socket for {what}: {source}")]
    Socket {
        /// Which socket.
        what: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// A request could not be built.
    #[error("{0}")]
    Request(String),
    /// The kernel refused a request, or the connection is gone.
    #[error("{what}: {source}")]
    Netlink {
        /// The request.
        what: String,
        /// rtnetlink's error (a kernel refusal carries its errno).
        source: rtnetlink::Error,
    },
}

struct Shared {
    targets: Mutex<BTreeSet<IpAddr>>,
    status: Mutex<BTreeMap<IpAddr, TargetStatus>>,
    wake: Notify,
}

/// The running follower. Dropping it stops the task (entries it created stay; they are
/// kernel-managed and harmless).
#[must_use = "dropping the Resolver stops it"]
pub struct Resolver {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolver")
            .field("targets", &*lock(&self.shared.targets))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The data stays consistent under every critical section (plain assignments), so a
    // poisoned lock is still good.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts the follower (a tokio task) in the current network namespace, with no targets.
/// Changes are sent to `tx`, one `Vec` per round; the task ends when `tx`'s receiver is
/// dropped or the [`Resolver`] is. The runtime needs its IO and time drivers (tokio panics
/// without them; the agent's runtime has both).
///
/// # Errors
/// [`NextHopError::NoRuntime`] outside a tokio runtime; [`NextHopError::Socket`] when a
/// netlink socket cannot be opened or subscribed to its groups.
pub fn spawn(tx: mpsc::Sender<Vec<NextHopEvent>>) -> Result<Resolver, NextHopError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| NextHopError::NoRuntime)?;
    let _entered = runtime.enter();
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|source| NextHopError::Socket {
            what: "requests",
            source,
        })?;
    let (events_connection, _, events) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Neigh,
        MulticastGroup::Ipv4Route,
        MulticastGroup::Ipv6Route,
    ])
    .map_err(|source| NextHopError::Socket {
        what: "events",
        source,
    })?;
    runtime.spawn(connection);
    runtime.spawn(events_connection);
    let shared = Arc::new(Shared {
        targets: Mutex::new(BTreeSet::new()),
        status: Mutex::new(BTreeMap::new()),
        wake: Notify::new(),
    });
    let task = runtime.spawn(
        Follower {
            shared: Arc::clone(&shared),
            handle,
            tx,
            managed_supported: true,
            created: BTreeSet::new(),
            adopted: false,
            watched: BTreeSet::new(),
            last: BTreeMap::new(),
        }
        .run(events),
    );
    Ok(Resolver { shared, task })
}

impl Resolver {
    /// Replaces the set of addresses to resolve and follow; a round runs at once, so new
    /// ones are resolved (and removed ones dropped from [`Resolver::snapshot`]) without
    /// waiting for the resync.
    pub fn set_targets(&self, targets: BTreeSet<IpAddr>) {
        *lock(&self.shared.targets) = targets;
        self.shared.wake.notify_one();
    }

    /// The last reported resolution of every target a round has seen.
    pub fn snapshot(&self) -> BTreeMap<IpAddr, Resolution> {
        lock(&self.shared.status)
            .iter()
            .map(|(a, s)| (*a, s.resolution.clone()))
            .collect()
    }

    /// Like [`Resolver::snapshot`], with when each resolution began (for "no neighbour
    /// since …").
    pub fn status(&self) -> BTreeMap<IpAddr, TargetStatus> {
        lock(&self.shared.status).clone()
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Events = UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>;

/// A neighbour entry by (interface index, address).
type NeighbourKey = (u32, IpAddr);

struct Follower {
    shared: Arc<Shared>,
    handle: Handle,
    tx: mpsc::Sender<Vec<NextHopEvent>>,
    /// False once the kernel refused or ignored a managed entry: `NTF_USE` from then on.
    managed_supported: bool,
    /// Managed entries this resolver (or an earlier one: [`netlink::PROTOCOL`]) created, to
    /// delete when no target needs them.
    created: BTreeSet<NeighbourKey>,
    /// Whether `created` holds the entries an earlier resolver left (read when the first
    /// targets arrive, so an agent's start deletes only what its backends do not need).
    adopted: bool,
    /// The entries the last round read: neighbour events about others are ignored.
    watched: BTreeSet<NeighbourKey>,
    /// The last reported resolution of every target.
    last: BTreeMap<IpAddr, Resolution>,
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
    async fn run(mut self, mut events: Events) {
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
        let targets = lock(&self.shared.targets).clone();
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
                        log::info!("next hop of {target}: {reason}")
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
        let link = match links.get(&oif) {
            Some(link) => link.clone(),
            None => {
                let link = netlink::link(&self.handle, oif).await?;
                links.insert(oif, link.clone());
                link
            }
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
