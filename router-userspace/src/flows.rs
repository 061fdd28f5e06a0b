//! Tracked flows (`switchyard flows`): the `CONNTRACK` entries that match a filter — by
//! virtual IP, service, backend or client prefix — listed, or purged (decision 0033).
//!
//! Names are the agent's: the event loop hands out a [`Catalog`] of its published service and
//! backend slots, the filter is resolved against it ([`Selector::new`]), and the table is read
//! from the pinned `CONNTRACK` off the event loop (a pass over its 262,144 entries takes up to
//! a second). A purge deletes the matching entries, has the event loop renew the generation of
//! every backend they named (`Backend.generation`: each CPU's flow cache then trusts no copy
//! of them and asks `CONNTRACK`, which no longer holds them), and deletes once more what a flow
//! cache wrote back meanwhile. A purged flow's next packet is a new flow's: it is selected
//! afresh through its service's decision word and Maglev table.
//!
//! What the data path keeps of a flow is its backend, service slot, protocol state and when it
//! last sent a packet (`router_common::FlowEntry`): a row shows how long the flow has been idle,
//! not its age or packet count, which no map holds.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use aya::maps::{Array, HashMap, Map, MapData, MapError};
use router_common::{
    Config, FAMILY_V4, FLOW_F_FIRST, FLOW_STATE_MASK, FLOW_STATES, FLOW_TCP_CLOSING, FLOW_TCP_OPEN,
    FLOW_TCP_SYN, FLOW_UDP, FlowEntry, FlowKey, PROTO_TCP, PROTO_UDP, ServiceKey, TICK_SHIFT,
    expired, maps,
};
use serde::{Deserialize, Serialize};

use crate::config::SourceRange;

/// A filter as the operator gives it (`GET /flows` query, `POST /flows/purge` body): every
/// given field must match; none given matches every flow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowQuery {
    /// Flows to this virtual IP (any port and protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<String>,
    /// Flows of this service (its name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Flows on this backend address (in any pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Flows from clients in this prefix (`198.18.0.0/15`; an address alone is one host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// A purge without a filter purges every flow only with this set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

impl FlowQuery {
    /// Whether no filter field is given.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.vip.is_none()
            && self.service.is_none()
            && self.backend.is_none()
            && self.client.is_none()
    }

    /// The query string of `GET /flows` (values are addresses, prefixes and names: nothing
    /// that needs escaping in a query).
    #[must_use]
    pub fn query_string(&self) -> String {
        let fields = [
            ("vip", &self.vip),
            ("service", &self.service),
            ("backend", &self.backend),
            ("client", &self.client),
        ];
        fields
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// What the agent published, by slot: how a flow's entry is named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    /// Service slot → (name, key).
    pub services: BTreeMap<u32, (String, ServiceKey)>,
    /// Backend slot → (pool, address).
    pub backends: BTreeMap<u32, (String, IpAddr)>,
    /// The client-class prefix set with each prefix's class name
    /// (`Config::class_prefixes`): a flow's client's class is the longest prefix's that holds
    /// it, as the program finds it.
    pub classes: Vec<(SourceRange, String)>,
}

impl Catalog {
    /// The class of client `addr`: the class of the longest prefix of [`Catalog::classes`]
    /// that holds it, if any.
    #[must_use]
    pub fn class_of(&self, addr: IpAddr) -> Option<&str> {
        self.classes
            .iter()
            .filter(|(p, _)| p.contains(addr))
            .max_by_key(|(p, _)| p.prefix)
            .map(|(_, name)| name.as_str())
    }
}

/// A [`FlowQuery`] resolved against a [`Catalog`]: what a `CONNTRACK` entry must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    vip: Option<IpAddr>,
    services: Option<BTreeSet<u32>>,
    backends: Option<BTreeSet<u32>>,
    client: Option<SourceRange>,
}

/// `a` as an address or `network/prefix` (an address alone is its own host prefix).
///
/// # Errors
///
/// Not an address, a prefix longer than the family's, or host bits set.
pub fn parse_prefix(text: &str) -> Result<SourceRange, String> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let network: IpAddr = addr
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not an address or prefix (198.18.0.0/15)"))?;
    let max = if network.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => p
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to {max}"))?,
    };
    // A prefix is named by its network address: host bits set are a typo, refused.
    let masked = mask(network, prefix);
    if masked != network {
        return Err(format!(
            "{text:?} has host bits set (the prefix is {masked}/{prefix})"
        ));
    }
    Ok(SourceRange { network, prefix })
}

/// `a` with the bits past `prefix` cleared.
fn mask(a: IpAddr, prefix: u8) -> IpAddr {
    match a {
        IpAddr::V4(v4) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & m))
        }
        IpAddr::V6(v6) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & m))
        }
    }
}

/// An address as a flow key holds it: network order, IPv4 in the first four bytes.
fn key_addr(bytes: &[u8; 16], family: u8) -> IpAddr {
    if family == FAMILY_V4 {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(*bytes))
    }
}

impl Selector {
    /// Resolves `q` against `catalog`.
    ///
    /// # Errors
    ///
    /// An address or prefix that does not parse, a virtual IP or service the agent does not
    /// publish, a backend address in none of its pools.
    pub fn new(q: &FlowQuery, catalog: &Catalog) -> Result<Self, String> {
        let vip = q
            .vip
            .as_deref()
            .map(|v| {
                v.trim()
                    .parse::<IpAddr>()
                    .map_err(|_| format!("vip {v:?} is not an address"))
            })
            .transpose()?;
        if let Some(v) = vip {
            let vips: BTreeSet<IpAddr> = catalog
                .services
                .values()
                .map(|(_, k)| key_addr(&k.addr, k.family))
                .collect();
            if !vips.contains(&v) {
                let known: Vec<String> = vips.iter().map(ToString::to_string).collect();
                return Err(format!(
                    "no service has virtual IP {v} (the agent publishes: {})",
                    known.join(", ")
                ));
            }
        }
        let services = q
            .service
            .as_deref()
            .map(|name| {
                let slots: BTreeSet<u32> = catalog
                    .services
                    .iter()
                    .filter(|(_, (n, _))| n == name)
                    .map(|(slot, _)| *slot)
                    .collect();
                if slots.is_empty() {
                    let known: Vec<&str> =
                        catalog.services.values().map(|(n, _)| n.as_str()).collect();
                    Err(format!(
                        "unknown service {name:?} (the agent publishes: {})",
                        known.join(", ")
                    ))
                } else {
                    Ok(slots)
                }
            })
            .transpose()?;
        let backends = q
            .backend
            .as_deref()
            .map(|b| {
                let address: IpAddr = b
                    .trim()
                    .parse()
                    .map_err(|_| format!("backend {b:?} is not an address"))?;
                let slots: BTreeSet<u32> = catalog
                    .backends
                    .iter()
                    .filter(|(_, (_, a))| *a == address)
                    .map(|(slot, _)| *slot)
                    .collect();
                if slots.is_empty() {
                    Err(format!("no pool has a backend {address}"))
                } else {
                    Ok(slots)
                }
            })
            .transpose()?;
        let client = q.client.as_deref().map(parse_prefix).transpose()?;
        Ok(Self {
            vip,
            services,
            backends,
            client,
        })
    }

    /// Whether the flow `key` tracked by `entry` matches every part of the filter.
    #[must_use]
    pub fn matches(&self, key: &FlowKey, entry: &FlowEntry) -> bool {
        self.vip.is_none_or(|v| key_addr(&key.dst, key.family) == v)
            && self
                .services
                .as_ref()
                .is_none_or(|s| s.contains(&entry.service))
            && self
                .backends
                .as_ref()
                .is_none_or(|b| b.contains(&entry.backend))
            && self
                .client
                .is_none_or(|c| c.contains(key_addr(&key.src, key.family)))
    }
}

/// One tracked flow, as `switchyard flows` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRow {
    /// The client's address and port.
    pub client: SocketAddr,
    /// The virtual IP and port.
    pub vip: SocketAddr,
    /// `tcp` or `udp` (or the protocol number).
    pub protocol: String,
    /// The service (`None`: its slot holds no service the agent publishes).
    pub service: Option<String>,
    /// The backend's pool and address (`None`: a slot the agent does not publish).
    pub pool: Option<String>,
    /// See `pool`.
    pub backend: Option<IpAddr>,
    /// The backend slot.
    pub backend_slot: u32,
    /// `syn`, `open`, `closing` or `udp`.
    pub state: String,
    /// Milliseconds since the flow last sent a packet, by the program's clock (refreshed at
    /// most every `router_common::SEEN_REFRESH` ticks, about a second).
    pub idle_ms: u64,
    /// The client's class by the configured prefixes (`None`: of none; a classifier's answers
    /// are not shown).
    #[serde(default)]
    pub class: Option<String>,
}

/// The name of a `FLOW_*` state.
#[must_use]
pub fn state_name(state: u8) -> &'static str {
    match state & FLOW_STATE_MASK {
        FLOW_TCP_SYN => "syn",
        FLOW_TCP_OPEN => "open",
        FLOW_TCP_CLOSING => "closing",
        FLOW_UDP => "udp",
        _ => "?",
    }
}

/// The name of an IP protocol.
#[must_use]
pub fn protocol_name(proto: u8) -> String {
    match proto {
        PROTO_TCP => "tcp".to_owned(),
        PROTO_UDP => "udp".to_owned(),
        p => p.to_string(),
    }
}

/// The row of `key`, tracked by `entry`, at the program's time `now` (ticks).
#[must_use]
pub fn row(key: &FlowKey, entry: &FlowEntry, catalog: &Catalog, now: u32) -> FlowRow {
    let (pool, backend) = match catalog.backends.get(&entry.backend) {
        Some((p, a)) => (Some(p.clone()), Some(*a)),
        None => (None, None),
    };
    let idle_ticks = u64::from(now.wrapping_sub(entry.seen));
    // A flow refreshed during the pass is ahead of `now`: idle 0, not 2^32 ticks.
    let idle_ticks = if idle_ticks > u64::from(u32::MAX / 2) {
        0
    } else {
        idle_ticks
    };
    let client = key_addr(&key.src, key.family);
    FlowRow {
        class: catalog.class_of(client).map(str::to_owned),
        client: SocketAddr::new(client, u16::from_be(key.sport)),
        vip: SocketAddr::new(key_addr(&key.dst, key.family), u16::from_be(key.dport)),
        protocol: protocol_name(key.proto),
        service: catalog.services.get(&entry.service).map(|(n, _)| n.clone()),
        pool,
        backend,
        backend_slot: entry.backend,
        state: state_name(entry.state).to_owned(),
        idle_ms: (idle_ticks << TICK_SHIFT) / 1_000_000,
    }
}

/// Whether `entry` is a tracked flow at the program's time `now`: not a first packet's record
/// and not idle past its state's timeout (after which the program selects it afresh).
#[must_use]
pub fn tracked(entry: &FlowEntry, now: u32, timeouts: &[u32; FLOW_STATES]) -> bool {
    let ahead = now.wrapping_sub(entry.seen) > u32::MAX / 2;
    entry.state & FLOW_F_FIRST == 0 && (ahead || !expired(entry.seen, entry.state, now, timeouts))
}

/// The pinned maps a pass reads: `CONNTRACK`, and the program's time and timeouts.
pub(crate) struct Pinned {
    pub(crate) table: HashMap<MapData, FlowKey, FlowEntry>,
    pub(crate) now: u32,
    pub(crate) timeouts: [u32; FLOW_STATES],
}

pub(crate) fn open(pin_dir: &Path) -> Result<Pinned, MapError> {
    let pinned = |name: &str| {
        let path = pin_dir.join(name);
        path.exists().then(|| MapData::from_pin(path)).transpose()
    };
    let timeouts = match pinned(maps::CONFIG)? {
        Some(data) => {
            Array::<MapData, Config>::try_from(Map::Array(data))?
                .get(&0, 0)?
                .timeouts
        }
        None => [0; FLOW_STATES],
    };
    let now = match pinned(maps::CLOCK)? {
        Some(data) => crate::dataplane::clock::pinned_ticks(&Array::try_from(Map::Array(data))?)?,
        None => 0,
    };
    let data = MapData::from_pin(pin_dir.join(maps::CONNTRACK))?;
    let table = HashMap::try_from(Map::LruHashMap(data))?;
    Ok(Pinned {
        table,
        now,
        timeouts,
    })
}

/// The tracked flows ([`tracked`]) of the maps pinned in `pin_dir` that `selector` matches,
/// named by `catalog`, each once, sorted by service, virtual IP and client. One pass over the
/// table: flows the LRU adds or evicts during it may be missed or listed.
///
/// # Errors
///
/// When a pinned map cannot be opened or read.
pub fn list(
    pin_dir: &Path,
    selector: &Selector,
    catalog: &Catalog,
) -> Result<Vec<FlowRow>, MapError> {
    let p = open(pin_dir)?;
    let mut seen = HashSet::new();
    let mut rows: Vec<FlowRow> = p
        .table
        .iter()
        .flatten()
        .filter(|(k, e)| tracked(e, p.now, &p.timeouts) && selector.matches(k, e))
        .filter(|(k, _)| seen.insert(*k))
        .map(|(k, e)| row(&k, &e, catalog, p.now))
        .collect();
    rows.sort_by(|a, b| {
        (&a.service, a.vip, a.client, &a.protocol).cmp(&(&b.service, b.vip, b.client, &b.protocol))
    });
    Ok(rows)
}

/// What one purge pass removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    /// Entries deleted.
    pub flows: u64,
    /// The backend slots they named.
    pub backends: BTreeSet<u32>,
}

/// Deletes every `CONNTRACK` entry of the maps pinned in `pin_dir` that `selector` matches
/// (tracked or expired alike: an expired one is a new flow already). The keys are collected
/// in one pass, then deleted one by one; a key gone meanwhile is not counted.
///
/// # Errors
///
/// When a pinned map cannot be opened or read, or a deletion fails otherwise than for a key
/// already gone.
pub fn purge_pass(pin_dir: &Path, selector: &Selector) -> Result<Purged, MapError> {
    let mut p = open(pin_dir)?;
    let matching: BTreeMap<[u8; 40], (FlowKey, u32)> = p
        .table
        .iter()
        .flatten()
        .filter(|(k, e)| selector.matches(k, e))
        .map(|(k, e)| (key_bytes(&k), (k, e.backend)))
        .collect();
    let mut purged = Purged::default();
    for (key, backend) in matching.into_values() {
        match p.table.remove(&key) {
            Ok(()) => {
                purged.flows += 1;
                purged.backends.insert(backend);
            }
            Err(MapError::KeyNotFound) => {}
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(purged)
}

/// A flow key's 40 bytes, for ordering.
fn key_bytes(k: &FlowKey) -> [u8; 40] {
    let mut out = [0; 40];
    out[..16].copy_from_slice(&k.src);
    out[16..32].copy_from_slice(&k.dst);
    out[32..34].copy_from_slice(&k.sport.to_ne_bytes());
    out[34..36].copy_from_slice(&k.dport.to_ne_bytes());
    out[36] = k.proto;
    out[37] = k.family;
    out
}

/// `switchyard flows`: one line per flow, then a count.
#[must_use]
pub fn table_text(rows: &[FlowRow]) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:<16} {:<5} {:<44} {:<26} {:<12} {:<24} {:<8} {:>9} class\n",
        "service", "proto", "client", "vip", "pool", "backend", "state", "idle"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<16} {:<5} {:<44} {:<26} {:<12} {:<24} {:<8} {:>9} {}",
            r.service.as_deref().unwrap_or("-"),
            r.protocol,
            r.client.to_string(),
            r.vip.to_string(),
            r.pool.as_deref().unwrap_or("-"),
            r.backend
                .map_or_else(|| format!("slot {}", r.backend_slot), |a| a.to_string()),
            r.state,
            format!("{:.1}s", Duration::from_millis(r.idle_ms).as_secs_f64()),
            r.class.as_deref().unwrap_or("-"),
        );
    }
    let _ = writeln!(out, "{} tracked flows", rows.len());
    out
}

#[cfg(test)]
mod tests {
    use router_common::{FAMILY_V6, FLOW_TCP_OPEN};

    use super::*;

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut out = [0; 16];
        out[..4].copy_from_slice(&a);
        out
    }

    fn key(src: [u8; 4], sport: u16) -> FlowKey {
        FlowKey {
            src: v4(src),
            dst: v4([198, 18, 0, 10]),
            sport: sport.to_be(),
            dport: 80u16.to_be(),
            proto: PROTO_TCP,
            family: FAMILY_V4,
            _pad: [0; 2],
        }
    }

    fn entry(backend: u32, service: u32) -> FlowEntry {
        FlowEntry {
            backend,
            service,
            seen: 1_000,
            state: FLOW_TCP_OPEN,
            _pad: [0; 3],
        }
    }

    fn catalog() -> Catalog {
        let svc = ServiceKey {
            addr: v4([198, 18, 0, 10]),
            port: 80u16.to_be(),
            proto: PROTO_TCP,
            family: FAMILY_V4,
        };
        Catalog {
            services: [
                (3, ("web".to_owned(), svc)),
                (4, ("dns".to_owned(), svc)),
                (
                    5,
                    (
                        "web6".to_owned(),
                        ServiceKey {
                            addr: "2001:db8::10".parse::<Ipv6Addr>().unwrap().octets(),
                            family: FAMILY_V6,
                            ..svc
                        },
                    ),
                ),
            ]
            .into(),
            backends: [
                (10, ("a".to_owned(), "198.18.1.1".parse().unwrap())),
                (11, ("a".to_owned(), "198.18.1.2".parse().unwrap())),
                (12, ("b".to_owned(), "198.18.1.1".parse().unwrap())),
            ]
            .into(),
            classes: vec![
                (parse_prefix("198.18.0.0/16").unwrap(), "wide".to_owned()),
                (parse_prefix("198.18.0.2/32").unwrap(), "one".to_owned()),
            ],
        }
    }

    fn query(f: impl FnOnce(&mut FlowQuery)) -> FlowQuery {
        let mut q = FlowQuery::default();
        f(&mut q);
        q
    }

    #[test]
    fn a_flow_s_class_is_its_client_s_longest_prefix_s() {
        let cat = catalog();
        let class = |src, sport| row(&key(src, sport), &entry(10, 3), &cat, 1_000).class;
        assert_eq!(class([198, 18, 0, 1], 5000).as_deref(), Some("wide"));
        assert_eq!(class([198, 18, 0, 2], 5000).as_deref(), Some("one"));
        assert_eq!(class([198, 19, 0, 2], 5000), None);
    }

    #[test]
    fn each_filter_narrows_and_all_must_match() {
        let cat = catalog();
        let first = (key([198, 18, 0, 1], 5000), entry(10, 3));
        let second = (key([198, 18, 0, 2], 5001), entry(11, 3));
        let third = (key([198, 19, 0, 1], 5002), entry(12, 4));
        let pick = |q: FlowQuery| -> Vec<u16> {
            let sel = Selector::new(&q, &cat).unwrap();
            [first, second, third]
                .iter()
                .filter(|(k, e)| sel.matches(k, e))
                .map(|(k, _)| u16::from_be(k.sport))
                .collect()
        };
        assert_eq!(pick(FlowQuery::default()), [5000, 5001, 5002]);
        // One address, two pools: both slots.
        assert_eq!(
            pick(query(|q| q.backend = Some("198.18.1.1".into()))),
            [5000, 5002]
        );
        assert_eq!(
            pick(query(|q| q.service = Some("web".into()))),
            [5000, 5001]
        );
        assert_eq!(
            pick(query(|q| q.client = Some("198.18.0.0/24".into()))),
            [5000, 5001]
        );
        assert_eq!(
            pick(query(|q| q.client = Some("198.18.0.2".into()))),
            [5001]
        );
        assert_eq!(
            pick(query(|q| q.vip = Some("198.18.0.10".into()))),
            [5000, 5001, 5002]
        );
        assert_eq!(
            pick(query(|q| {
                q.backend = Some("198.18.1.1".into());
                q.client = Some("198.18.0.0/15".into());
                q.service = Some("dns".into());
            })),
            [5002]
        );
        // An IPv6 prefix matches no IPv4 client.
        assert!(pick(query(|q| q.client = Some("2001:db8::/32".into()))).is_empty());
    }

    #[test]
    fn bad_filters_are_refused_with_a_reason() {
        let c = catalog();
        let err = |q: FlowQuery| Selector::new(&q, &c).unwrap_err();
        assert!(
            err(query(|q| q.service = Some("nope".into()))).contains("unknown service \"nope\"")
        );
        assert!(err(query(|q| q.backend = Some("198.18.1.9".into()))).contains("no pool has"));
        assert!(err(query(|q| q.backend = Some("x".into()))).contains("not an address"));
        assert!(err(query(|q| q.client = Some("198.18.0.1/24".into()))).contains("host bits"));
        assert!(err(query(|q| q.client = Some("198.18.0.0/33".into()))).contains("0 to 32"));
        assert!(err(query(|q| q.vip = Some("1.2.3".into()))).contains("not an address"));
        assert!(
            err(query(|q| q.vip = Some("198.18.0.11".into())))
                .contains("no service has virtual IP 198.18.0.11")
        );
    }

    #[test]
    fn rows_name_service_pool_backend_and_idle_time() {
        let c = catalog();
        let r = row(
            &key([198, 18, 0, 1], 5000),
            &entry(11, 3),
            &c,
            1_000 + 2_000,
        );
        assert_eq!(r.client, "198.18.0.1:5000".parse().unwrap());
        assert_eq!(r.vip, "198.18.0.10:80".parse().unwrap());
        assert_eq!(r.service.as_deref(), Some("web"));
        assert_eq!(r.pool.as_deref(), Some("a"));
        assert_eq!(r.backend, Some("198.18.1.2".parse().unwrap()));
        assert_eq!(r.state, "open");
        // 2,000 ticks of 1.048576 ms.
        assert_eq!(r.idle_ms, 2_097);
        // Seen after the pass began: not idle.
        assert_eq!(
            row(&key([1, 1, 1, 1], 1), &entry(99, 99), &c, 999).idle_ms,
            0
        );
        let unknown = row(&key([1, 1, 1, 1], 1), &entry(99, 99), &c, 1_000);
        assert_eq!((unknown.service, unknown.backend), (None, None));
        let text = table_text(&[r]);
        assert!(
            text.contains("198.18.0.1:5000") && text.contains("1 tracked flows"),
            "{text}"
        );
        let v6 = FlowKey {
            src: "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets(),
            family: FAMILY_V6,
            ..key([0; 4], 7)
        };
        assert_eq!(
            row(&v6, &entry(10, 3), &c, 1_000).client.to_string(),
            "[2001:db8::1]:7"
        );
    }

    #[test]
    fn records_and_expired_entries_are_not_tracked_flows() {
        let t = [10, 100, 10, 50];
        let e = entry(1, 1);
        assert!(tracked(&e, 1_050, &t));
        assert!(!tracked(&e, 1_101, &t));
        assert!(tracked(&e, 990, &t), "seen after the clock was read");
        let first = FlowEntry {
            state: FLOW_TCP_OPEN | FLOW_F_FIRST,
            ..e
        };
        assert!(!tracked(&first, 1_000, &t));
    }

    #[test]
    fn ipv6_clients_and_virtual_ips_match_by_prefix() {
        let cat = catalog();
        let v6 = |a: &str| a.parse::<Ipv6Addr>().unwrap().octets();
        let k = FlowKey {
            src: v6("2001:db8:1::7"),
            dst: v6("2001:db8::10"),
            family: FAMILY_V6,
            ..key([0; 4], 7)
        };
        let sel = |q: FlowQuery| Selector::new(&q, &cat).unwrap();
        let e = entry(10, 3);
        assert!(sel(query(|q| q.client = Some("2001:db8:1::/48".into()))).matches(&k, &e));
        assert!(!sel(query(|q| q.client = Some("2001:db8:2::/48".into()))).matches(&k, &e));
        assert!(!sel(query(|q| q.client = Some("198.18.0.0/15".into()))).matches(&k, &e));
        assert!(sel(query(|q| q.vip = Some("2001:db8::10".into()))).matches(&k, &e));
        assert!(
            parse_prefix("2001:db8::1/64")
                .unwrap_err()
                .contains("host bits")
        );
        assert!(
            parse_prefix("2001:db8::/129")
                .unwrap_err()
                .contains("0 to 128")
        );
    }

    #[test]
    fn the_query_string_carries_the_given_fields() {
        let q = query(|q| {
            q.backend = Some("198.18.1.1".into());
            q.client = Some("198.18.0.0/15".into());
        });
        assert_eq!(q.query_string(), "backend=198.18.1.1&client=198.18.0.0/15");
        assert!(FlowQuery::default().is_empty() && !q.is_empty());
    }
}
