//! The announcement routes over rtnetlink: the dummy interface, and one host route per
//! announced virtual IP on it.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::StreamExt as _;
use log::{info, warn};
use netlink_packet_route::{
    link::{InfoKind, LinkAttribute, LinkInfo},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope},
};
use rtnetlink::{Handle, LinkDummy, LinkIfb, LinkUnspec, RouteMessageBuilder};

use crate::config::Announce;

/// Why an announcement could not be made or withdrawn.
#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    /// No rtnetlink socket could be opened.
    #[error("opening an rtnetlink socket for the announcement routes: {0}")]
    Socket(#[source] std::io::Error),
    /// The kernel refused a request.
    #[error("{what}: {source}")]
    Netlink {
        /// The request, for humans.
        what: String,
        /// The kernel's answer.
        #[source]
        source: rtnetlink::Error,
    },
    /// The dummy interface does not exist after it was created.
    #[error("the interface {0} is missing after it was created")]
    NoInterface(String),
    /// `announce.interface` names an interface that is not a dummy (or `ifb`) one: routes on
    /// it would steer real traffic, and the agent's clean-up would remove routes it did not add.
    #[error(
        "announce.interface {name} is a {kind} interface, not a dummy one: name an interface \
         the agent may own (it creates a dummy one when none exists)"
    )]
    NotDummy {
        /// The interface.
        name: String,
        /// Its kind as the kernel reports it (`veth`, `bridge`, … or `device` without one).
        kind: String,
    },
}

fn failed(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> AnnounceError {
    let what = what.into();
    move |source| AnnounceError::Netlink { what, source }
}

/// The agent's announcement routes: what it added, on which interface.
pub struct Routes {
    handle: Handle,
    settings: Announce,
    /// The dummy interface's index.
    index: u32,
    /// The virtual IPs routed on it (what the kernel holds, as far as this process knows).
    announced: BTreeSet<IpAddr>,
}

/// The index and MAC address of the interface `name`, `None` if there is none.
pub(super) async fn link(
    handle: &Handle,
    name: &str,
) -> Result<Option<(u32, Option<[u8; 6]>)>, AnnounceError> {
    let mut links = handle.link().get().match_name(name.to_owned()).execute();
    match links.next().await {
        Some(Ok(link)) => {
            let mac = link.attributes.iter().find_map(|a| match a {
                LinkAttribute::Address(m) => <[u8; 6]>::try_from(m.as_slice()).ok(),
                _ => None,
            });
            Ok(Some((link.header.index, mac)))
        }
        Some(Err(e)) if crate::nexthop::errno(&e) == Some(libc::ENODEV) => Ok(None),
        Some(Err(e)) => Err(failed(format!("looking up interface {name}"))(e)),
        None => Ok(None),
    }
}

/// The kind of the interface `name` (`IFLA_INFO_KIND`), `None` for a device without one (a
/// physical NIC) or when there is no such interface.
async fn kind(handle: &Handle, name: &str) -> Result<Option<InfoKind>, AnnounceError> {
    let mut links = handle.link().get().match_name(name.to_owned()).execute();
    match links.next().await {
        Some(Ok(link)) => Ok(link.attributes.iter().find_map(|a| match a {
            LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
                LinkInfo::Kind(k) => Some(k.clone()),
                _ => None,
            }),
            _ => None,
        })),
        Some(Err(e)) if crate::nexthop::errno(&e) == Some(libc::ENODEV) => Ok(None),
        Some(Err(e)) => Err(failed(format!("looking up interface {name}"))(e)),
        None => Ok(None),
    }
}

/// Creates the interface `name`: a dummy interface, or an `ifb` one (which also drops what is
/// sent to it) on a kernel built without dummy interfaces (`CONFIG_DUMMY`).
async fn create(handle: &Handle, name: &str) -> Result<(), AnnounceError> {
    match handle
        .link()
        .add(LinkDummy::new(name).build())
        .execute()
        .await
    {
        Ok(()) => {
            info!("created the dummy interface {name} for the announcement routes");
            Ok(())
        }
        Err(e) if crate::nexthop::errno(&e) == Some(libc::EOPNOTSUPP) => {
            handle
                .link()
                .add(LinkIfb::new(name).build())
                .execute()
                .await
                .map_err(failed(format!(
                    "creating {name}: this kernel has no dummy interfaces ({e}), and an ifb one"
                )))?;
            warn!(
                "created {name} as an ifb interface for the announcement routes: this kernel \
                 has no dummy interfaces"
            );
            Ok(())
        }
        Err(e) => Err(failed(format!("creating the dummy interface {name}"))(e)),
    }
}

impl Routes {
    /// Opens an rtnetlink socket, creates the dummy interface of `settings` if it is missing
    /// and sets it up, and takes as announced every route of `settings.protocol` on it in
    /// `settings.table` (an earlier agent's: [`Routes::sync`] removes those not announced).
    ///
    /// # Errors
    ///
    /// [`AnnounceError`] when the socket cannot be opened or the kernel refuses a request.
    pub async fn open(settings: Announce) -> Result<Self, AnnounceError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(AnnounceError::Socket)?;
        tokio::spawn(connection);
        let name = settings.interface.clone();
        if link(&handle, &name).await?.is_none() {
            create(&handle, &name).await?;
        }
        match kind(&handle, &name).await? {
            Some(InfoKind::Dummy | InfoKind::Ifb) => {}
            other => {
                return Err(AnnounceError::NotDummy {
                    kind: other.map_or_else(|| "device".to_owned(), |k| k.to_string()),
                    name,
                });
            }
        }
        let (index, _) = link(&handle, &name)
            .await?
            .ok_or_else(|| AnnounceError::NoInterface(name.clone()))?;
        handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(failed(format!("setting {name} up")))?;
        let mut routes = Self {
            handle,
            settings,
            index,
            announced: BTreeSet::new(),
        };
        routes.announced = routes.held().await?;
        Ok(routes)
    }

    /// The settings these routes follow.
    #[must_use]
    pub fn settings(&self) -> &Announce {
        &self.settings
    }

    /// The virtual IPs announced.
    #[must_use]
    pub fn announced(&self) -> &BTreeSet<IpAddr> {
        &self.announced
    }

    /// The host routes of the agent's protocol on its interface and table, as the kernel holds
    /// them.
    async fn held(&self) -> Result<BTreeSet<IpAddr>, AnnounceError> {
        let mut out = BTreeSet::new();
        let dumps = [
            RouteMessageBuilder::<Ipv4Addr>::new().build(),
            RouteMessageBuilder::<Ipv6Addr>::new().build(),
        ];
        for message in dumps {
            let mut answers = self.handle.route().get(message).execute();
            while let Some(answer) = answers.next().await {
                let route = answer.map_err(failed("listing the announcement routes"))?;
                if let Some(addr) = self.ours(&route) {
                    out.insert(addr);
                }
            }
        }
        Ok(out)
    }

    /// The destination of `route` if it is one of the agent's host routes.
    fn ours(&self, route: &RouteMessage) -> Option<IpAddr> {
        let table = route
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or_else(|| u32::from(route.header.table));
        let oif = route.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        });
        if table != self.settings.table
            || route.header.protocol != RouteProtocol::from(self.settings.protocol)
            || oif != Some(self.index)
        {
            return None;
        }
        let addr = route.attributes.iter().find_map(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
            RouteAttribute::Destination(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
            _ => None,
        })?;
        let full = if addr.is_ipv4() { 32 } else { 128 };
        (route.header.destination_prefix_length == full).then_some(addr)
    }

    fn message(&self, addr: IpAddr) -> RouteMessage {
        let full = if addr.is_ipv4() { 32 } else { 128 };
        let mut message = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(addr, full)
            .map(|b| {
                b.output_interface(self.index)
                    .table_id(self.settings.table)
                    .protocol(RouteProtocol::from(self.settings.protocol))
                    .scope(RouteScope::Link)
                    .build()
            })
            .unwrap_or_default();
        message.header.destination_prefix_length = full;
        message
    }

    /// Re-reads the announced set from the kernel: routes someone else removed (`switchyard
    /// detach`, an operator) are added again by the next [`Routes::sync`] if still wanted,
    /// and routes of the agent's protocol added by hand are removed. A failure is logged and
    /// keeps what this process knows.
    ///
    /// Returns `false` when the interface is gone or was replaced (another index): these
    /// routes are then void, and the caller opens the interface again.
    pub async fn refresh(&mut self) -> bool {
        match link(&self.handle, &self.settings.interface).await {
            Ok(Some((index, _))) if index == self.index => {}
            Ok(_) => return false,
            Err(e) => warn!("looking up the announcement interface: {e}"),
        }
        match self.held().await {
            Ok(held) => self.announced = held,
            Err(e) => warn!("re-reading the announcement routes: {e}"),
        }
        true
    }

    /// Makes the announced set `wanted`: withdraws first what is no longer wanted, then adds
    /// what is new. Returns the virtual IPs newly announced (for gratuitous ARP / unsolicited
    /// NA). A failed request is logged and retried by the next call; what succeeded is kept.
    pub async fn sync(&mut self, wanted: &BTreeSet<IpAddr>) -> Vec<IpAddr> {
        let gone: Vec<IpAddr> = self.announced.difference(wanted).copied().collect();
        for addr in gone {
            match self.handle.route().del(self.message(addr)).execute().await {
                Ok(()) => {
                    info!("withdrew {addr} (route on {})", self.settings.interface);
                    self.announced.remove(&addr);
                }
                Err(e) if crate::nexthop::errno(&e) == Some(libc::ESRCH) => {
                    self.announced.remove(&addr);
                }
                Err(e) => warn!("withdrawing {addr}: {e}; retried at the next check"),
            }
        }
        let mut new = Vec::new();
        for &addr in wanted.difference(&self.announced.clone()) {
            match self
                .handle
                .route()
                .add(self.message(addr))
                .replace()
                .execute()
                .await
            {
                Ok(()) => {
                    info!("announced {addr} (route on {})", self.settings.interface);
                    self.announced.insert(addr);
                    new.push(addr);
                }
                Err(e) => warn!("announcing {addr}: {e}; retried at the next check"),
            }
        }
        new
    }

    /// Advertises each of `addrs` on every interface of `garp` (gratuitous ARP, unsolicited
    /// NA); a failure is logged, and changes nothing else.
    pub async fn advertise(&self, addrs: &[IpAddr]) {
        if addrs.is_empty() {
            return;
        }
        for iface in &self.settings.garp {
            match link(&self.handle, iface).await {
                Ok(Some((index, Some(mac)))) => {
                    for &addr in addrs {
                        let frame = super::advertise::frame(addr, mac);
                        if let Err(e) = super::advertise::send(index, &frame) {
                            warn!("{iface}: advertising {addr}: {e}");
                        }
                    }
                }
                Ok(_) => warn!("{iface}: no such Ethernet interface; {addrs:?} not advertised"),
                Err(e) => warn!("{iface}: {e}; {addrs:?} not advertised"),
            }
        }
    }

    /// Withdraws every announcement (a shutdown, a detach, or other settings).
    pub async fn withdraw_all(&mut self) {
        self.sync(&BTreeSet::new()).await;
    }
}

/// Removes every route of `settings.protocol` on `settings.interface` in `settings.table`
/// (`switchyard detach`, before it detaches); nothing when the interface does not exist.
///
/// # Errors
///
/// [`AnnounceError`] when the socket cannot be opened or the kernel refuses a request.
pub async fn withdraw(settings: &Announce) -> Result<usize, AnnounceError> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(AnnounceError::Socket)?;
    tokio::spawn(connection);
    let Some((index, _)) = link(&handle, &settings.interface).await? else {
        return Ok(0);
    };
    let mut routes = Routes {
        handle,
        settings: settings.clone(),
        index,
        announced: BTreeSet::new(),
    };
    routes.announced = routes.held().await?;
    let n = routes.announced.len();
    routes.withdraw_all().await;
    Ok(n - routes.announced.len())
}
