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
mod follow;
mod netlink;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rtnetlink::MulticastGroup;
use serde::{Serialize, Serializer};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use follow::Follower;
pub(crate) use follow::neighbour_key;
pub(crate) use netlink::errno;

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
    /// The egress interface's MTU, in bytes.
    pub mtu: u32,
}

/// Formats a MAC as `02:53:59:00:01:01`.
#[must_use]
#[expect(
    clippy::many_single_char_names,
    reason = "the six octets of the address, in order"
)]
pub fn mac_string(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's serialize_with hands the field over by reference"
)]
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
    #[must_use]
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
    targets: Mutex<Targets>,
    status: Mutex<BTreeMap<IpAddr, TargetStatus>>,
    wake: Notify,
}

/// The addresses to follow, and those added since the last round read them.
#[derive(Debug, Default)]
struct Targets {
    set: BTreeSet<IpAddr>,
    /// Reported by the next round whatever was reported of them before: the caller forgot a
    /// target it removed, even when it added it back before any round saw it gone.
    added: BTreeSet<IpAddr>,
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
            .field("targets", &lock(&self.shared.targets).set)
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
        targets: Mutex::new(Targets::default()),
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
    /// waiting for the resync. Every address added is reported by the next round, even one
    /// removed and added back before any round saw it gone: a caller forgets what it knew of
    /// the targets it removes.
    pub fn set_targets(&self, targets: BTreeSet<IpAddr>) {
        let mut t = lock(&self.shared.targets);
        let added: Vec<IpAddr> = targets.difference(&t.set).copied().collect();
        t.added.extend(added);
        t.set = targets;
        drop(t);
        self.shared.wake.notify_one();
    }

    /// The last reported resolution of every target a round has seen.
    #[must_use]
    pub fn snapshot(&self) -> BTreeMap<IpAddr, Resolution> {
        lock(&self.shared.status)
            .iter()
            .map(|(a, s)| (*a, s.resolution.clone()))
            .collect()
    }

    /// Like [`Resolver::snapshot`], with when each resolution began (for "no neighbour
    /// since …").
    #[must_use]
    pub fn status(&self) -> BTreeMap<IpAddr, TargetStatus> {
        lock(&self.shared.status).clone()
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
