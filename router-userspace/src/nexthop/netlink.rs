//! The rtnetlink requests the resolver makes: one route lookup, one link and one neighbour
//! entry per target, and the writes that create or mark managed neighbour entries.

use std::net::IpAddr;

use futures::StreamExt as _;
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    link::{LinkAttribute, LinkFlags},
    neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourExtFlags, NeighbourFlags, NeighbourMessage,
        NeighbourState,
    },
    route::{RouteAddress, RouteAttribute, RouteProtocol, RouteType, RouteVia},
};
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::{Handle, RouteMessageBuilder};

use super::NextHopError;
use super::decide::NeighbourEntry;

/// The `NDA_PROTOCOL` the resolver marks the neighbour entries it creates with, so a later
/// resolver (after a restart) knows them as its own and removes those no backend needs. 83 is
/// 'S'; no protocol in iproute2's `rt_protos` uses it.
pub(crate) const PROTOCOL: u8 = 83;

/// The output route the kernel picks for a destination (`RTM_GETROUTE`, as `ip route get`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RouteView {
    /// Unicast through `oif`, via `gateway` or on-link.
    Unicast {
        /// Egress interface index (`RTA_OIF`).
        oif: u32,
        /// `RTA_GATEWAY` or `RTA_VIA`; `None` on-link.
        gateway: Option<IpAddr>,
    },
    /// No usable unicast route; the reason is for humans.
    Unusable(String),
}

/// An interface as `RTM_GETLINK` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LinkView {
    /// `IFLA_IFNAME`.
    pub(crate) name: String,
    /// `IFLA_ADDRESS`, when it is 6 bytes (Ethernet).
    pub(crate) mac: Option<[u8; 6]>,
    /// `IFF_UP`.
    pub(crate) up: bool,
    /// `IFF_LOWER_UP` (carrier).
    pub(crate) carrier: bool,
    /// `IFLA_MTU`; 1,500 (Ethernet's) when the kernel sends none.
    pub(crate) mtu: u32,
}

/// The positive errno of a kernel refusal, if `e` is one.
pub(crate) fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

fn failed(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NextHopError {
    let what = what.into();
    move |source| NextHopError::Netlink { what, source }
}

/// The route the kernel would send a packet to `addr` by.
pub(crate) async fn route(handle: &Handle, addr: IpAddr) -> Result<RouteView, NextHopError> {
    let full = if addr.is_ipv4() { 32 } else { 128 };
    let message = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(addr, full)
        .map_err(|e| NextHopError::Request(format!("route lookup for {addr}: {e}")))?
        .build();
    let mut answers = handle.route().get(message).execute();
    let mut found = None;
    while let Some(answer) = answers.next().await {
        match answer {
            Ok(route) => found = found.or(Some(route)),
            Err(e) if matches!(errno(&e), Some(libc::ENETUNREACH | libc::EHOSTUNREACH)) => {
                return Ok(RouteView::Unusable(format!("no route to {addr}")));
            }
            Err(e) if matches!(errno(&e), Some(libc::EACCES | libc::EPERM | libc::EINVAL)) => {
                return Ok(RouteView::Unusable(format!(
                    "no route to {addr} (the kernel refuses it: {e})"
                )));
            }
            Err(e) => return Err(failed(format!("route lookup for {addr}"))(e)),
        }
    }
    let Some(route) = found else {
        return Ok(RouteView::Unusable(format!("no route to {addr}")));
    };
    match route.header.kind {
        RouteType::Unicast => {}
        RouteType::Local => {
            return Ok(RouteView::Unusable(format!(
                "{addr} is an address of this host"
            )));
        }
        kind => {
            return Ok(RouteView::Unusable(format!(
                "no route to {addr} (route type {kind:?})"
            )));
        }
    }
    let mut oif = None;
    let mut gateway = None;
    for attr in &route.attributes {
        match attr {
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Gateway(RouteAddress::Inet(a))
            | RouteAttribute::Via(RouteVia::Inet(a)) => gateway = Some(IpAddr::V4(*a)),
            RouteAttribute::Gateway(RouteAddress::Inet6(a))
            | RouteAttribute::Via(RouteVia::Inet6(a)) => gateway = Some(IpAddr::V6(*a)),
            _ => {}
        }
    }
    Ok(match oif {
        Some(oif) => RouteView::Unicast { oif, gateway },
        None => RouteView::Unusable(format!("the route to {addr} has no output interface")),
    })
}

/// Ethernet's MTU (RFC 894), for a link whose `IFLA_MTU` is missing.
const ETHERNET_MTU: u32 = 1500;

/// The interface `ifindex`, or `None` when it does not exist.
pub(crate) async fn link(handle: &Handle, ifindex: u32) -> Result<Option<LinkView>, NextHopError> {
    let mut answers = handle.link().get().match_index(ifindex).execute();
    let mut found = None;
    while let Some(answer) = answers.next().await {
        match answer {
            Ok(link) => found = found.or(Some(link)),
            Err(e) if errno(&e) == Some(libc::ENODEV) => return Ok(None),
            Err(e) => return Err(failed(format!("link {ifindex}"))(e)),
        }
    }
    let Some(link) = found else {
        return Ok(None);
    };
    let mut view = LinkView {
        name: format!("if{ifindex}"),
        mac: None,
        up: link.header.flags.contains(LinkFlags::Up),
        carrier: link.header.flags.contains(LinkFlags::LowerUp),
        mtu: ETHERNET_MTU,
    };
    for attr in link.attributes {
        match attr {
            LinkAttribute::IfName(name) => view.name = name,
            LinkAttribute::Address(a) => view.mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
            LinkAttribute::Mtu(m) => view.mtu = m,
            _ => {}
        }
    }
    Ok(Some(view))
}

fn family(addr: IpAddr) -> AddressFamily {
    if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn neighbour_address(addr: IpAddr) -> NeighbourAddress {
    match addr {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }
}

/// The neighbour entry for `addr` on `ifindex` (a single `RTM_GETNEIGH`, kernel ≥ 4.20), or
/// `None` when there is none.
pub(crate) async fn neighbour(
    handle: &Handle,
    ifindex: u32,
    addr: IpAddr,
) -> Result<Option<NeighbourEntry>, NextHopError> {
    let mut message = NeighbourMessage::default();
    message.header.family = family(addr);
    message.header.ifindex = ifindex;
    message
        .attributes
        .push(NeighbourAttribute::Destination(neighbour_address(addr)));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetNeighbour(message));
    request.header.flags = NLM_F_REQUEST;
    let what = || format!("neighbour {addr} on link {ifindex}");
    let mut answers = handle.clone().request(request).map_err(failed(what()))?;
    let mut found = None;
    while let Some(answer) = answers.next().await {
        match answer.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) => {
                found = found.or(Some(n));
            }
            NetlinkPayload::Error(e) => {
                let e = rtnetlink::Error::NetlinkError(e);
                if errno(&e) == Some(libc::ENOENT) {
                    return Ok(None);
                }
                return Err(failed(what())(e));
            }
            _ => {}
        }
    }
    Ok(found.map(|n| {
        let mut entry = NeighbourEntry {
            state: n.header.state,
            lladdr: None,
            managed: false,
        };
        for attr in n.attributes {
            match attr {
                NeighbourAttribute::LinkLayerAddress(a) => entry.lladdr = Some(a),
                NeighbourAttribute::ExtFlags(f) => {
                    entry.managed = f.contains(NeighbourExtFlags::Managed);
                }
                _ => {}
            }
        }
        entry
    }))
}

/// Sends one `RTM_NEWNEIGH` for `addr` on `ifindex` and waits for the kernel's answer.
async fn new_neighbour(
    handle: &Handle,
    ifindex: u32,
    addr: IpAddr,
    flags: NeighbourFlags,
    ext_flags: Option<NeighbourExtFlags>,
    nlm_flags: u16,
    what: String,
) -> Result<(), NextHopError> {
    let mut message = NeighbourMessage::default();
    message.header.family = family(addr);
    message.header.ifindex = ifindex;
    message.header.state = NeighbourState::None;
    message.header.flags = flags;
    message
        .attributes
        .push(NeighbourAttribute::Destination(neighbour_address(addr)));
    if let Some(ext) = ext_flags {
        message.attributes.push(NeighbourAttribute::ExtFlags(ext));
    }
    message
        .attributes
        .push(NeighbourAttribute::Protocol(RouteProtocol::Other(PROTOCOL)));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewNeighbour(message));
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK | nlm_flags;
    let mut answers = handle
        .clone()
        .request(request)
        .map_err(failed(what.clone()))?;
    while let Some(answer) = answers.next().await {
        if let NetlinkPayload::Error(e) = answer.payload
            && e.code.is_some()
        {
            return Err(failed(what)(rtnetlink::Error::NetlinkError(e)));
        }
    }
    Ok(())
}

/// Creates the entry for `addr` on `ifindex` as kernel-managed (`NTF_EXT_MANAGED` in
/// `NDA_FLAGS_EXT`, state `NUD_NONE`: what `ip neigh add ADDR dev IF managed` sends), or with
/// `replace` marks the existing one managed, keeping its cached address (`ip neigh replace`).
/// The kernel resolves it at once and keeps re-validating it (kernel ≥ 5.16).
pub(crate) async fn make_managed(
    handle: &Handle,
    ifindex: u32,
    addr: IpAddr,
    replace: bool,
) -> Result<(), NextHopError> {
    let mode = if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
    new_neighbour(
        handle,
        ifindex,
        addr,
        NeighbourFlags::empty(),
        Some(NeighbourExtFlags::Managed),
        NLM_F_CREATE | mode,
        format!("managed neighbour {addr} on link {ifindex}"),
    )
    .await
}

/// Asks the kernel to resolve `addr` on `ifindex` now, creating the entry if needed
/// (`NTF_USE`: the kernel sends a solicitation as if a packet were queued for it).
pub(crate) async fn use_neighbour(
    handle: &Handle,
    ifindex: u32,
    addr: IpAddr,
) -> Result<(), NextHopError> {
    new_neighbour(
        handle,
        ifindex,
        addr,
        NeighbourFlags::Use,
        None,
        NLM_F_CREATE | NLM_F_REPLACE,
        format!("resolving neighbour {addr} on link {ifindex}"),
    )
    .await
}

/// Every neighbour entry of this namespace marked with [`PROTOCOL`] and still managed: what an
/// earlier resolver created (a dump of both families).
pub(crate) async fn ours(handle: &Handle) -> Result<Vec<(u32, IpAddr)>, NextHopError> {
    let mut found = Vec::new();
    let mut dump = handle.neighbours().get().execute();
    while let Some(n) = dump.next().await {
        let n = n.map_err(failed("listing neighbour entries".to_owned()))?;
        let marked = n
            .attributes
            .iter()
            .any(|a| matches!(a, NeighbourAttribute::Protocol(p) if u8::from(*p) == PROTOCOL));
        let managed = n.attributes.iter().any(|a| {
            matches!(a, NeighbourAttribute::ExtFlags(f) if f.contains(NeighbourExtFlags::Managed))
        });
        if let (true, true, Some(key)) = (marked, managed, super::neighbour_key(&n)) {
            found.push(key);
        }
    }
    Ok(found)
}

/// Deletes the entry for `addr` on `ifindex`; a missing entry is not an error.
pub(crate) async fn delete_neighbour(
    handle: &Handle,
    ifindex: u32,
    addr: IpAddr,
) -> Result<(), NextHopError> {
    let mut message = NeighbourMessage::default();
    message.header.family = family(addr);
    message.header.ifindex = ifindex;
    message
        .attributes
        .push(NeighbourAttribute::Destination(neighbour_address(addr)));
    match handle.neighbours().del(message).execute().await {
        Ok(()) => Ok(()),
        Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(failed(format!(
            "deleting neighbour {addr} on link {ifindex}"
        ))(e)),
    }
}

/// The positive errno of a kernel refusal inside `e`, if it is one.
pub(crate) fn errno_of(e: &NextHopError) -> Option<i32> {
    match e {
        NextHopError::Netlink { source, .. } => errno(source),
        _ => None,
    }
}
