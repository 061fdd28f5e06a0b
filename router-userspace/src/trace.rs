//! `switchyard trace CLIENT:PORT VIP:PORT/PROTO`: where a new flow from that client would go
//! and why, read from the live maps (decision 0033).
//!
//! [`path`] follows the program's selection (router-ebpf `select.rs`) step by step over the
//! values the maps hold: the service the virtual IP, port and protocol name; the flow hash
//! (`router_common::flow_hash`, or `source_hash` for `hash: source_ip`: the program's own
//! functions); the decision word and the pool it picks for that hash
//! (`router_common::Decision::pick`); the pool's live Maglev half and the entry at
//! `hash % MAGLEV_SIZE` (`router_common::maglev_index`); the fallback pool when that entry is
//! empty; whether the backend takes new flows. Then whether `CONNTRACK` holds the 5-tuple as a
//! flow the program keeps on its backend (a TCP SYN keeps an open connection's backend; a UDP
//! datagram a tracked flow's), which then overrides the selection.
//!
//! With client classes (`SVC_F_CLASSES`): the client's class, as `router-ebpf` `class.rs` finds
//! it (the longest prefix of `CLIENT_CLASSES` holding the client, else a live `CLIENT_ANSWERS`
//! entry), and for a class of 1 or more the class's word in `CLASS_DECISIONS`. Under
//! `SVC_F_SPLIT_CLIENT` the split point is the client's (`hash::client_split_point`), not the
//! flow hash's.
//!
//! Not seen: a SYN's record in one CPU's flow cache (`FLOW_CACHE` is per program and not
//! pinned): a SYN retransmitted to the same CPU within its timeout keeps the backend its first
//! SYN got, which differs from this answer only when the table changed in between.

use router_common::{
    Backend, ClientAddr, ClientAnswer, Decision, FAMILY_V6, FATE_KEEP, FLOW_STATE_MASK,
    FLOW_STATES, FLOW_TCP_CLOSING, FlowEntry, FlowKey, MAGLEV_SIZE, MAX_CLASSES, MAX_POOLS,
    NO_BACKEND, NO_POOL, POOL_F_ALL_DOWN_PASS, PROTO_TCP, Pool, SVC_F_CLASSES, SVC_F_HASH_SOURCE,
    SVC_F_SPLIT_CLIENT, SVC_F_SPLIT_PREFIX, Service, ServiceKey, ServiceSlot, Vip, VipKey,
    answer_live, class_decision_index, expired, flow_hash,
    hash::{client_split_point, split_point},
    host_port, keeps_flows, source_hash, tracked_fate,
};
use serde::{Deserialize, Serialize};

/// The map reads a trace makes (the kernel maps, or a test's).
pub trait LiveMaps {
    /// `SERVICES[key]`.
    fn service(&self, key: &ServiceKey) -> Option<Service>;
    /// `SERVICE_SLOTS[slot]`.
    fn service_slot(&self, slot: u32) -> Option<ServiceSlot>;
    /// `DECISIONS[slot]`.
    fn decision(&self, slot: u32) -> Option<u64>;
    /// `POOLS[slot]`.
    fn pool(&self, slot: u32) -> Option<Pool>;
    /// Entry `entry` of half `half` of pool `pool`'s Maglev table (a backend slot, or
    /// `NO_BACKEND`).
    fn table_entry(&self, pool: u32, half: u32, entry: u32) -> Option<u32>;
    /// `BACKENDS[slot]`.
    fn backend(&self, slot: u32) -> Option<Backend>;
    /// `CONNTRACK[key]`.
    fn conntrack(&self, key: &FlowKey) -> Option<FlowEntry>;
    /// `VIPS[key]`.
    fn vip(&self, key: &VipKey) -> Option<Vip>;
    /// The longest prefix of `CLIENT_CLASSES` holding `addr`: its class.
    fn client_class(&self, addr: &ClientAddr) -> Option<u32> {
        let _ = addr;
        None
    }
    /// `CLIENT_ANSWERS[addr]`, live or not.
    fn client_answer(&self, addr: &ClientAddr) -> Option<ClientAnswer> {
        let _ = addr;
        None
    }
    /// `CLASS_DECISIONS[index]`.
    fn class_decision(&self, index: u32) -> Option<u64> {
        let _ = index;
        None
    }
}

impl LiveMaps for crate::dataplane::maps::KernelMaps {
    fn service(&self, key: &ServiceKey) -> Option<Service> {
        self.service(key)
    }
    fn service_slot(&self, slot: u32) -> Option<ServiceSlot> {
        self.service_slot(slot)
    }
    fn decision(&self, slot: u32) -> Option<u64> {
        self.decision(slot).ok()
    }
    fn pool(&self, slot: u32) -> Option<Pool> {
        self.pool(slot).ok()
    }
    fn table_entry(&self, pool: u32, half: u32, entry: u32) -> Option<u32> {
        self.table_entry(pool, half, entry)
    }
    fn backend(&self, slot: u32) -> Option<Backend> {
        self.backend(slot).ok()
    }
    fn conntrack(&self, key: &FlowKey) -> Option<FlowEntry> {
        self.conntrack.get(key, 0).ok()
    }
    fn vip(&self, key: &VipKey) -> Option<Vip> {
        self.vips.get(key, 0).ok()
    }
    fn client_class(&self, addr: &ClientAddr) -> Option<u32> {
        self.client_class(addr)
    }
    fn client_answer(&self, addr: &ClientAddr) -> Option<ClientAnswer> {
        self.client_answer(addr)
    }
    fn class_decision(&self, index: u32) -> Option<u64> {
        self.class_decision(index).ok()
    }
}

/// A `CONNTRACK` entry (`router_common::FlowEntry`), as a trace shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracked {
    /// Backend slot.
    pub backend: u32,
    /// Service slot.
    pub service: u32,
    /// When it last sent a packet, in ticks of the program's clock.
    pub seen: u32,
    /// Its `FLOW_*` state.
    pub state: u8,
}

impl From<FlowEntry> for Tracked {
    fn from(e: FlowEntry) -> Self {
        Self {
            backend: e.backend,
            service: e.service,
            seen: e.seen,
            state: e.state,
        }
    }
}

/// A new flow's way through the maps, in slots ([`path`]).
#[expect(
    clippy::struct_excessive_bools,
    reason = "each is the outcome of one step of the program's selection, as a trace shows it"
)]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Path {
    /// The service slot (`None`: no service has this address, port and protocol; see `vip`).
    pub service: Option<u32>,
    /// Without a service: `None` when the address is no virtual IP (the program passes the
    /// packet to the kernel); for a virtual IP (`VIPS` holds it), `Some(true)` when the port is
    /// one of its `host_ports` (passed to the host's stack), `Some(false)` otherwise (dropped,
    /// counted `vip_no_service`), as router-ebpf `vip.rs` decides.
    pub vip_host_port: Option<bool>,
    /// The service hashes the source address only (`hash: source_ip`).
    pub source_hash: bool,
    /// The flow hash.
    pub hash: u32,
    /// The client's class, when the service looks classes up (`SVC_F_CLASSES`): 1..=15, or
    /// 0 for none (the word in `DECISIONS`).
    #[serde(default)]
    pub class: Option<u32>,
    /// That class came from a live classifier answer, not from a configured prefix.
    #[serde(default)]
    pub class_from_answer: bool,
    /// The split point is the client's (`split_by: client` or `client_prefix`), not the flow's.
    #[serde(default)]
    pub client_split: bool,
    /// The decision slot and its word.
    pub decision: Option<(u32, u64)>,
    /// The flow's split point (`0..SPLIT_SCALE`), when the word splits over two pools.
    pub split_point: Option<u32>,
    /// The pool the word picks for the hash.
    pub pool: Option<u16>,
    /// Its live table half.
    pub half: u32,
    /// The Maglev entry: `hash % MAGLEV_SIZE`.
    pub maglev_slot: u32,
    /// The backend slot that entry names (`NO_BACKEND`: empty).
    pub table_backend: u32,
    /// The fallback pool was used (the picked pool's entry was empty).
    pub fallback: bool,
    /// The backend a new flow is sent to (`None`: none usable).
    pub selected: Option<u32>,
    /// With no usable backend: the pool passes new flows to the kernel (`when_all_down:
    /// pass`) rather than dropping them.
    pub all_down_pass: bool,
    /// `CONNTRACK`'s entry for the 5-tuple, if it holds one.
    pub tracked: Option<Tracked>,
    /// That entry keeps the flow on its backend: the answer is its backend, not `selected`.
    pub tracked_overrides: bool,
}

impl Path {
    /// The backend slot the flow goes to: the tracked one when it overrides, else the selected.
    #[must_use]
    pub fn backend(&self) -> Option<u32> {
        if self.tracked_overrides {
            self.tracked.map(|e| e.backend)
        } else {
            self.selected
        }
    }
}

/// The backend the live table of `pool` holds for `hash` (the program's `maglev_lookup`).
fn lookup(maps: &dyn LiveMaps, pool: u16, hash: u32) -> (u32, u32) {
    let pool = u32::from(pool);
    if pool >= MAX_POOLS {
        return (0, NO_BACKEND);
    }
    let Some(p) = maps.pool(pool) else {
        return (0, NO_BACKEND);
    };
    let id = maps
        .table_entry(pool, p.active, hash % MAGLEV_SIZE)
        .unwrap_or(NO_BACKEND);
    (p.active, id)
}

/// Whether tracked `entry` keeps the flow `key` on its backend when a new flow's first packet
/// arrives (the program's `syn` for TCP, `tracked` for UDP): it is within its state's timeout
/// at `now`, a TCP connection is not closing, its service slot still holds the flow's service,
/// and its backend takes flows and keeps its tracked ones.
fn keeps(
    maps: &dyn LiveMaps,
    key: &FlowKey,
    entry: &FlowEntry,
    now: u32,
    timeouts: &[u32; FLOW_STATES],
) -> bool {
    let tcp = key.proto == PROTO_TCP;
    if expired(entry.seen, entry.state, now, timeouts)
        || (tcp && entry.state & FLOW_STATE_MASK == FLOW_TCP_CLOSING)
    {
        return false;
    }
    let serves = maps.service_slot(entry.service).is_some_and(|s| {
        s.key
            == ServiceKey {
                addr: key.dst,
                port: key.dport,
                proto: key.proto,
                family: key.family,
            }
    });
    let Some(b) = maps.backend(entry.backend) else {
        return false;
    };
    // A SYN goes only to a backend that takes flows; a datagram stays where its fate keeps it.
    serves && (!tcp || keeps_flows(b.state)) && tracked_fate(b.state) == FATE_KEEP
}

/// The class of `key`'s client at `now`, as the program finds it: the longest configured
/// prefix's, else a live answer's, else 0; and whether an answer gave it.
fn class_of(maps: &dyn LiveMaps, key: &FlowKey, now: u32) -> (u32, bool) {
    let client = ClientAddr {
        family: u32::from(key.family),
        addr: key.src,
    };
    let bounded = |c: u32| if c > MAX_CLASSES { 0 } else { c };
    if let Some(class) = maps.client_class(&client) {
        return (bounded(class), false);
    }
    match maps.client_answer(&client) {
        Some(a) if answer_live(a.expires, now) => (bounded(a.class), true),
        _ => (0, false),
    }
}

/// Where a new flow `key` goes, from `maps` at the program's time `now` (ticks) with the flow
/// timeouts `timeouts` (`Config.timeouts`).
#[must_use]
pub fn path(maps: &dyn LiveMaps, key: &FlowKey, now: u32, timeouts: &[u32; FLOW_STATES]) -> Path {
    let mut p = Path {
        table_backend: NO_BACKEND,
        ..Path::default()
    };
    let skey = ServiceKey {
        addr: key.dst,
        port: key.dport,
        proto: key.proto,
        family: key.family,
    };
    let Some(svc) = maps.service(&skey) else {
        let vip = VipKey {
            addr: key.dst,
            family: key.family,
            _pad: [0; 3],
        };
        let want = host_port(key.dport, key.proto);
        p.vip_host_port = maps
            .vip(&vip)
            .map(|v| want & 0xffff != 0 && v.host_ports.contains(&want));
        return p;
    };
    p.service = Some(svc.id);
    p.source_hash = svc.flags & SVC_F_HASH_SOURCE != 0;
    p.hash = if p.source_hash {
        source_hash(&key.src)
    } else {
        flow_hash(key)
    };
    p.maglev_slot = p.hash % MAGLEV_SIZE;
    let mut word = maps.decision(svc.decision);
    if svc.flags & SVC_F_CLASSES != 0 {
        let (class, from_answer) = class_of(maps, key, now);
        p.class = Some(class);
        p.class_from_answer = from_answer;
        if class != 0 {
            word = maps.class_decision(class_decision_index(svc.decision, class));
        }
    }
    p.client_split = svc.flags & SVC_F_SPLIT_CLIENT != 0;
    if let Some(word) = word {
        p.decision = Some((svc.decision, word));
        let d = Decision::decode(word);
        let point = if p.client_split {
            let prefix = svc.flags & SVC_F_SPLIT_PREFIX != 0;
            client_split_point(&key.src, key.family == FAMILY_V6, prefix)
        } else {
            split_point(p.hash)
        };
        if d.pool_b != NO_POOL {
            p.split_point = Some(point);
        }
        let pool = d.pick_at(point);
        p.pool = Some(pool);
        let (half, mut id) = lookup(maps, pool, p.hash);
        p.half = half;
        p.table_backend = id;
        if id == NO_BACKEND && d.fallback != NO_POOL {
            id = lookup(maps, d.fallback, p.hash).1;
            p.fallback = true;
        }
        let usable = id != NO_BACKEND && maps.backend(id).is_some_and(|b| keeps_flows(b.state));
        if usable {
            p.selected = Some(id);
        } else {
            p.all_down_pass = maps
                .pool(u32::from(pool))
                .is_some_and(|p| p.flags & POOL_F_ALL_DOWN_PASS != 0);
        }
    }
    let entry = maps.conntrack(key);
    p.tracked = entry.map(Tracked::from);
    p.tracked_overrides = entry.is_some_and(|e| keeps(maps, key, &e, now, timeouts));
    p
}

/// A [`Path`] with names: the answer of `GET /trace`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// The client's address and port.
    pub client: String,
    /// The virtual IP, port and protocol.
    pub vip: String,
    /// The service's name (`None`: no service; or a slot the agent does not publish).
    pub service: Option<String>,
    /// The decision group that writes the service's word, if one does.
    pub group: Option<String>,
    /// The group's active action (`pool=dc1`, `split=dc1:95,dc2:5`).
    pub action: Option<String>,
    /// The client's class, when the service looks classes up: its name, or `none` (the
    /// action's `default`); with ` (classifier answer)` when an answer gave it.
    #[serde(default)]
    pub class: Option<String>,
    /// What made it active: `rule ID`, `default`, `override` or `kept`.
    pub rule: Option<String>,
    /// The decision word, as its fields name pools.
    pub word: Option<String>,
    /// The picked pool's name.
    pub pool: Option<String>,
    /// The fallback pool's name, when its table was used.
    pub fallback: Option<String>,
    /// The backend's address (the answer).
    pub backend: Option<String>,
    /// The pool of that backend.
    pub backend_pool: Option<String>,
    /// `tracked flow` (connection tracking keeps the flow where it is), `new flow`, or why no
    /// backend: `no service` (not a virtual IP), `no service: host port`, `no service: dropped
    /// (vip_no_service)`, `no backend: dropped`, `no backend: passed to the kernel`.
    pub by: String,
    /// The tracked flow's backend and state, when `CONNTRACK` holds the 5-tuple.
    pub tracked: Option<String>,
    /// The path in slots.
    pub path: Path,
}

/// The human-readable form of `t`.
#[must_use]
pub fn text(t: &Trace) -> String {
    use std::fmt::Write as _;
    let mut o = format!("{} -> {}\n", t.client, t.vip);
    let p = &t.path;
    let Some(slot) = p.service else {
        let _ = writeln!(
            o,
            "  no service: {}",
            match p.vip_host_port {
                None => "not a virtual IP; the program passes it to the kernel",
                Some(true) => "a host port of the virtual IP; passed to the host's stack",
                Some(false) =>
                    "the virtual IP has no service on this port; dropped (vip_no_service)",
            }
        );
        return o;
    };
    let name = |n: &Option<String>| n.clone().unwrap_or_else(|| "?".to_owned());
    let _ = writeln!(o, "  service   {} (slot {slot})", name(&t.service));
    let _ = writeln!(
        o,
        "  hash      {:#010x} of the {}",
        p.hash,
        if p.source_hash {
            "source address (hash: source_ip)"
        } else {
            "5-tuple"
        }
    );
    if let Some(class) = &t.class {
        let _ = writeln!(o, "  class     {class}");
    }
    if let Some((d, word)) = p.decision {
        let _ = writeln!(
            o,
            "  decision  slot {d}, word {word:#018x}: {}",
            t.word.as_deref().unwrap_or("")
        );
    }
    if let Some(g) = &t.group {
        let _ = writeln!(
            o,
            "  group     {g}: {} (by {})",
            t.action.as_deref().unwrap_or("no action yet"),
            t.rule.as_deref().unwrap_or("-")
        );
    }
    if let Some(sp) = p.split_point {
        let _ = writeln!(
            o,
            "  split     point {sp} of {}{}",
            router_common::SPLIT_SCALE,
            if p.client_split {
                " (the client's: split_by client)"
            } else {
                ""
            }
        );
    }
    if let Some(pool) = p.pool {
        let entry = if p.table_backend == NO_BACKEND {
            "empty".to_owned()
        } else {
            format!("backend slot {}", p.table_backend)
        };
        let _ = writeln!(
            o,
            "  pool      {} (slot {pool}), live half {}, Maglev slot {} of {MAGLEV_SIZE}: {entry}",
            name(&t.pool),
            p.half,
            p.maglev_slot
        );
    }
    if p.fallback {
        let _ = writeln!(o, "  fallback  {}", name(&t.fallback));
    }
    if let Some(tracked) = &t.tracked {
        let _ = writeln!(
            o,
            "  tracked   {tracked}: {}",
            if p.tracked_overrides {
                "keeps the flow there (overrides the selection)"
            } else {
                "does not keep it (the flow is selected afresh)"
            }
        );
    }
    let _ = writeln!(
        o,
        "  backend   {} {}({})",
        t.backend.as_deref().unwrap_or("none"),
        t.backend_pool
            .as_ref()
            .map_or(String::new(), |p| format!("in pool {p} ")),
        t.by
    );
    o
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use router_common::{
        BACKEND_DOWN, BACKEND_DRAINING, BACKEND_F_KEEP, BACKEND_UP, FAMILY_V4, FLOW_TCP_OPEN,
        FLOW_UDP, PROTO_UDP,
    };

    use super::*;

    /// Maps as a test writes them: one service (slot 1, decision 5) over pools 0 and 1.
    #[derive(Default)]
    struct Fake {
        services: HashMap<ServiceKey, Service>,
        slots: HashMap<u32, ServiceSlot>,
        decisions: HashMap<u32, u64>,
        pools: HashMap<u32, Pool>,
        tables: HashMap<u32, Vec<u32>>,
        backends: HashMap<u32, Backend>,
        conntrack: HashMap<FlowKey, FlowEntry>,
        vips: HashMap<VipKey, Vip>,
        /// Client classes by exact address (the trie's longest match, for one address).
        classes: HashMap<ClientAddr, u32>,
        answers: HashMap<ClientAddr, ClientAnswer>,
        class_words: HashMap<u32, u64>,
    }

    impl LiveMaps for Fake {
        fn service(&self, key: &ServiceKey) -> Option<Service> {
            self.services.get(key).copied()
        }
        fn service_slot(&self, slot: u32) -> Option<ServiceSlot> {
            self.slots.get(&slot).copied()
        }
        fn decision(&self, slot: u32) -> Option<u64> {
            self.decisions.get(&slot).copied()
        }
        fn pool(&self, slot: u32) -> Option<Pool> {
            self.pools.get(&slot).copied()
        }
        fn table_entry(&self, pool: u32, half: u32, entry: u32) -> Option<u32> {
            // Only the live half is written.
            let p = self.pools.get(&pool)?;
            if p.active != half {
                return Some(NO_BACKEND);
            }
            self.tables.get(&pool)?.get(entry as usize).copied()
        }
        fn backend(&self, slot: u32) -> Option<Backend> {
            self.backends.get(&slot).copied()
        }
        fn conntrack(&self, key: &FlowKey) -> Option<FlowEntry> {
            self.conntrack.get(key).copied()
        }
        fn vip(&self, key: &VipKey) -> Option<Vip> {
            self.vips.get(key).copied()
        }
        fn client_class(&self, addr: &ClientAddr) -> Option<u32> {
            self.classes.get(addr).copied()
        }
        fn client_answer(&self, addr: &ClientAddr) -> Option<ClientAnswer> {
            self.answers.get(addr).copied()
        }
        fn class_decision(&self, index: u32) -> Option<u64> {
            self.class_words.get(&index).copied()
        }
    }

    fn skey(proto: u8) -> ServiceKey {
        let mut addr = [0; 16];
        addr[..4].copy_from_slice(&[198, 18, 0, 10]);
        ServiceKey {
            addr,
            port: 80u16.to_be(),
            proto,
            family: FAMILY_V4,
        }
    }

    fn flow(sport: u16, proto: u8) -> FlowKey {
        let mut src = [0; 16];
        src[..4].copy_from_slice(&[198, 18, 0, 1]);
        let s = skey(proto);
        FlowKey {
            src,
            dst: s.addr,
            sport: sport.to_be(),
            dport: s.port,
            proto,
            family: FAMILY_V4,
            _pad: [0; 2],
        }
    }

    fn up(state: u32) -> Backend {
        Backend {
            state,
            ..Backend::default()
        }
    }

    /// Pool 0's table: entries alternate backends 10 and 11; pool 1's all 20 (live half 1).
    fn fake(word: Decision, proto: u8) -> Fake {
        let mut f = Fake::default();
        let svc = Service {
            id: 1,
            decision: 5,
            ..Service::default()
        };
        f.services.insert(skey(proto), svc);
        f.slots.insert(
            1,
            ServiceSlot {
                key: skey(proto),
                service: svc,
            },
        );
        f.decisions.insert(5, word.encode());
        f.pools.insert(0, Pool::default());
        f.pools.insert(
            1,
            Pool {
                active: 1,
                ..Pool::default()
            },
        );
        f.tables
            .insert(0, (0..MAGLEV_SIZE).map(|i| 10 + i % 2).collect());
        f.tables.insert(1, vec![20; MAGLEV_SIZE as usize]);
        for b in [10, 11, 20] {
            f.backends.insert(b, up(BACKEND_UP));
        }
        f
    }

    const T: [u32; FLOW_STATES] = [100, 1_000, 100, 500];

    #[test]
    fn a_new_flow_follows_hash_word_pool_and_table() {
        let f = fake(Decision::pool(0), PROTO_TCP);
        for port in 1_000..1_100 {
            let k = flow(port, PROTO_TCP);
            let p = path(&f, &k, 0, &T);
            assert_eq!(p.hash, flow_hash(&k));
            assert_eq!(p.maglev_slot, p.hash % MAGLEV_SIZE);
            assert_eq!(p.backend(), Some(10 + p.maglev_slot % 2));
            assert_eq!((p.pool, p.split_point, p.fallback), (Some(0), None, false));
        }
    }

    #[test]
    fn a_split_picks_by_the_flows_split_point() {
        let word = Decision {
            pool_a: 0,
            pool_b: 1,
            split_b: 5_000,
            fallback: NO_POOL,
        };
        let f = fake(word, PROTO_TCP);
        let mut on_b = 0;
        for port in 1_000..2_000 {
            let p = path(&f, &flow(port, PROTO_TCP), 0, &T);
            let point = p.split_point.unwrap();
            let to_b = point < 5_000;
            assert_eq!(p.pool, Some(u16::from(to_b)));
            if to_b {
                on_b += 1;
                assert_eq!((p.half, p.backend()), (1, Some(20)));
            }
        }
        assert!((350..650).contains(&on_b), "{on_b} of 1000 on pool 1");
    }

    #[test]
    fn an_empty_table_uses_the_fallback_and_no_usable_backend_says_so() {
        let word = Decision {
            fallback: 1,
            ..Decision::pool(0)
        };
        let mut f = fake(word, PROTO_TCP);
        f.tables.insert(0, vec![NO_BACKEND; MAGLEV_SIZE as usize]);
        let p = path(&f, &flow(7, PROTO_TCP), 0, &T);
        assert!(p.fallback && p.table_backend == NO_BACKEND);
        assert_eq!(p.backend(), Some(20));
        f.backends.insert(20, up(BACKEND_DOWN));
        f.pools.insert(
            0,
            Pool {
                flags: POOL_F_ALL_DOWN_PASS,
                ..Pool::default()
            },
        );
        let p = path(&f, &flow(7, PROTO_TCP), 0, &T);
        assert_eq!((p.backend(), p.all_down_pass), (None, true));
    }

    #[test]
    fn no_service_no_path() {
        let f = fake(Decision::pool(0), PROTO_TCP);
        let p = path(&f, &flow(7, PROTO_UDP), 0, &T);
        assert_eq!((p.service, p.backend()), (None, None));
    }

    #[test]
    fn an_open_tracked_connection_overrides_while_it_applies() {
        let mut f = fake(Decision::pool(0), PROTO_TCP);
        let k = flow(7, PROTO_TCP);
        let e = FlowEntry {
            backend: 20,
            service: 1,
            seen: 1_000,
            state: FLOW_TCP_OPEN,
            _pad: [0; 3],
        };
        f.conntrack.insert(k, e);
        assert_eq!(path(&f, &k, 1_500, &T).backend(), Some(20));
        // Idle past its timeout, closing, or its backend draining-but-down: selected afresh.
        assert!(!path(&f, &k, 2_001, &T).tracked_overrides);
        f.conntrack.insert(
            k,
            FlowEntry {
                state: FLOW_TCP_CLOSING,
                ..e
            },
        );
        assert!(!path(&f, &k, 1_050, &T).tracked_overrides);
        f.conntrack.insert(k, e);
        f.backends.insert(20, up(BACKEND_DRAINING));
        assert!(path(&f, &k, 1_050, &T).tracked_overrides);
        f.backends.insert(20, up(BACKEND_DOWN | BACKEND_F_KEEP));
        let p = path(&f, &k, 1_050, &T);
        assert!(!p.tracked_overrides && p.tracked.is_some());
        assert_eq!(p.backend(), p.selected);
        // A slot that holds another service now.
        f.backends.insert(20, up(BACKEND_UP));
        f.slots.insert(1, ServiceSlot::default());
        assert!(!path(&f, &k, 1_050, &T).tracked_overrides);
    }

    #[test]
    fn the_text_names_each_step() {
        let word = Decision {
            pool_a: 0,
            pool_b: 1,
            split_b: 5_000,
            fallback: NO_POOL,
        };
        let f = fake(word, PROTO_TCP);
        let p = path(&f, &flow(7, PROTO_TCP), 0, &T);
        let t = Trace {
            client: "198.18.0.1:7".into(),
            vip: "198.18.0.10:80/tcp".into(),
            service: Some("web".into()),
            group: Some("g".into()),
            action: Some("split=a:50,b:50".into()),
            rule: Some("rule r1".into()),
            pool: Some("a".into()),
            backend: Some("198.18.1.1".into()),
            backend_pool: Some("a".into()),
            by: "new flow".into(),
            path: p.clone(),
            ..Trace::default()
        };
        let out = text(&t);
        for part in [
            "198.18.0.1:7 -> 198.18.0.10:80/tcp",
            "service   web (slot 1)",
            "of the 5-tuple",
            "group     g: split=a:50,b:50 (by rule r1)",
            &format!("Maglev slot {} of 65537", p.maglev_slot),
            "backend   198.18.1.1 in pool a (new flow)",
        ] {
            assert!(out.contains(part), "no {part:?} in:\n{out}");
        }
        let none = text(&Trace {
            path: Path::default(),
            ..t
        });
        assert!(none.contains("no service"), "{none}");
    }

    /// A client of a class takes its class's word; one of none, or of a class from an expired
    /// answer, the service's; under `SVC_F_SPLIT_CLIENT` every flow of a client has one point.
    #[test]
    fn a_client_s_class_picks_its_word_and_split_by_client_its_point() {
        let default = Decision {
            pool_a: 0,
            pool_b: 1,
            split_b: 5_000,
            fallback: NO_POOL,
        };
        let mut f = fake(default, PROTO_TCP);
        let k = flow(7, PROTO_TCP);
        let client = ClientAddr {
            family: u32::from(FAMILY_V4),
            addr: k.src,
        };
        // Without the flag, no class is looked up.
        f.classes.insert(client, 2);
        f.class_words
            .insert(class_decision_index(5, 2), Decision::pool(1).encode());
        assert_eq!(path(&f, &k, 0, &T).class, None);
        for svc in f.services.values_mut() {
            svc.flags |= SVC_F_CLASSES | SVC_F_SPLIT_CLIENT;
        }
        let p = path(&f, &k, 0, &T);
        assert_eq!((p.class, p.pool, p.split_point), (Some(2), Some(1), None));
        assert_eq!(p.decision, Some((5, Decision::pool(1).encode())));
        // An answer counts only while it lives.
        f.classes.clear();
        f.answers.insert(
            client,
            ClientAnswer {
                class: 2,
                expires: 100,
            },
        );
        let p = path(&f, &k, 99, &T);
        assert_eq!((p.class, p.class_from_answer), (Some(2), true));
        let p = path(&f, &k, 100, &T);
        assert_eq!((p.class, p.pool.is_some()), (Some(0), true));
        // Class 0 splits by the client's point: the same for each of its flows.
        let point = client_split_point(&k.src, false, false);
        for sport in [7, 8, 9] {
            let p = path(&f, &flow(sport, PROTO_TCP), 100, &T);
            assert!(p.client_split);
            assert_eq!(p.split_point, Some(point));
            assert_eq!(p.pool, Some(default.pick_at(point)));
        }
    }

    /// A port of a virtual IP that no service takes is dropped unless it is a host port; an
    /// address that is no virtual IP is the kernel's (router-ebpf `vip.rs`).
    #[test]
    fn without_a_service_a_virtual_ip_drops_all_but_its_host_ports() {
        let mut f = fake(Decision::pool(0), PROTO_TCP);
        let timeouts = [0; FLOW_STATES];
        let mut k = flow(7, PROTO_TCP);
        k.dport = 81u16.to_be();
        assert_eq!(path(&f, &k, 0, &timeouts).vip_host_port, None);
        let vip = VipKey {
            addr: k.dst,
            family: FAMILY_V4,
            _pad: [0; 3],
        };
        let mut v = Vip::default();
        v.host_ports[0] = host_port(22u16.to_be(), PROTO_TCP);
        f.vips.insert(vip, v);
        let dropped = path(&f, &k, 0, &timeouts);
        assert_eq!(
            (dropped.service, dropped.vip_host_port),
            (None, Some(false))
        );
        assert!(
            text(&Trace {
                path: dropped,
                ..Trace::default()
            })
            .contains("dropped (vip_no_service)")
        );
        k.dport = 22u16.to_be();
        assert_eq!(path(&f, &k, 0, &timeouts).vip_host_port, Some(true));
        k.proto = PROTO_UDP;
        assert_eq!(path(&f, &k, 0, &timeouts).vip_host_port, Some(false));
    }

    #[test]
    fn a_tracked_datagram_stays_on_a_down_backend_that_keeps_its_flows() {
        let mut f = fake(Decision::pool(0), PROTO_UDP);
        let k = flow(7, PROTO_UDP);
        f.conntrack.insert(
            k,
            FlowEntry {
                backend: 20,
                service: 1,
                seen: 1_000,
                state: FLOW_UDP,
                _pad: [0; 3],
            },
        );
        f.backends.insert(20, up(BACKEND_DOWN | BACKEND_F_KEEP));
        assert_eq!(path(&f, &k, 1_050, &T).backend(), Some(20));
    }
}
