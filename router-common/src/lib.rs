//! The ABI between Switchyard's XDP program (`router-ebpf`) and its agent (`router-userspace`).
//!
//! Everything the two halves exchange through BPF maps is defined here, once: map names, key and
//! value layouts, the decision word, the flow hash, the [`Reason`] every packet verdict carries,
//! and [`ABI_VERSION`], which names the pin directory so an agent never adopts maps of another
//! shape.
//!
//! Rules for every type in this crate:
//! - `#[repr(C)]`, no implicit padding (explicit `_pad` fields, zeroed), no `bool` (a `u32`
//!   flag word instead);
//! - byte order is part of the field: addresses are `[u8; 16]` in network order (IPv4 in the
//!   first four bytes, the rest zero), ports are `u16` holding network-order bytes
//!   (`u16::from_ne_bytes(wire)`), everything else is host order;
//! - sizes and offsets are pinned by the tests at the bottom of this file.
//!
//! The `user` feature implements `aya::Pod` for the agent.
#![no_std]

pub mod hash;
pub mod maps;
mod reason;

pub use hash::{flow_hash, source_hash};
pub use reason::{Reason, Verdict};

/// Version of the map layout. Maps are pinned under `<pin_path>/v<ABI_VERSION>/`; an agent
/// refuses to adopt pinned maps of another version rather than reading them with the wrong shape.
pub const ABI_VERSION: u32 = 10;

/// Entries in one Maglev lookup table: a prime, as the Maglev paper (§3.4) requires, large
/// enough that each of a few hundred backends gets hundreds of slots.
pub const MAGLEV_SIZE: u32 = 65_537;
/// Maglev entries in one `MAGLEV` map value: four backend slots of 16 bits, eight bytes, the
/// kernel's stride between array values (`round_up(value_size, 8)`), so the entries of a table
/// lie side by side, 2 bytes each.
pub const MAGLEV_LANES: u32 = 4;
/// `MAGLEV` map values per Maglev table: [`MAGLEV_SIZE`] entries, [`MAGLEV_LANES`] to a value
/// (the last value's last three lanes are unused). 128 KiB a table.
pub const MAGLEV_VALUES: u32 = MAGLEV_SIZE.div_ceil(MAGLEV_LANES);
/// A Maglev entry that names no backend (an empty pool).
pub const MAGLEV_EMPTY: u16 = u16::MAX;
/// Pool slots. Each pool owns two Maglev tables (the double buffer), so the `MAGLEV` map holds
/// `MAX_POOLS * 2 * MAGLEV_VALUES` values (16 MiB for 64 pools).
pub const MAX_POOLS: u32 = 64;
/// Backend slots, shared by all pools. A change holds the slots of its new backends beside the
/// running ones until it is live, so this is twice a large configuration (5,000 backends) with
/// room for its changes. Cost per slot: `BACKENDS` 32 bytes, `NEXT_HOPS` 2 × 24 bytes, and per
/// CPU `BACKEND_STATS` 16 bytes (128 KiB per CPU in all).
pub const MAX_BACKENDS: u32 = 8_192;
/// Service slots (one per virtual IP, port and protocol), shared with decision groups (one slot
/// each). Twice a large configuration (1,000 services and their groups), so that one apply can
/// move every service to a new address: new slots are taken beside the running ones.
pub const MAX_SERVICES: u32 = 2_048;
/// Decision slots: one per service with a static target, one per decision group. Decision
/// slots are service slots (the publisher allocates both from `0..MAX_SERVICES`), so this is
/// [`MAX_SERVICES`].
pub const MAX_DECISIONS: u32 = MAX_SERVICES;
/// Flows kept by connection tracking (an LRU: the least recently used flow is evicted first).
pub const CONNTRACK_SIZE: u32 = 262_144;
/// Fragmented datagrams in flight (an LRU keyed by addresses, protocol and IP identification).
pub const FRAGMENT_SIZE: u32 = 16_384;
/// Interfaces the program may redirect to (`XDP_REDIRECT` through a device map).
pub const MAX_TX_PORTS: u32 = 64;

/// A pool slot that names no pool.
pub const NO_POOL: u16 = u16::MAX;
/// A Maglev entry or conntrack value that names no backend (an empty pool).
pub const NO_BACKEND: u32 = u32::MAX;
/// Weight scale of the second pool of a split in the decision word: `split_b / SPLIT_SCALE` of
/// new flows go to pool B.
pub const SPLIT_SCALE: u16 = 10_000;

/// Address family tags used in keys (`family` fields).
pub const FAMILY_V4: u8 = 4;
/// See [`FAMILY_V4`].
pub const FAMILY_V6: u8 = 6;

/// IP protocol numbers used in keys.
pub const PROTO_TCP: u8 = 6;
/// See [`PROTO_TCP`].
pub const PROTO_UDP: u8 = 17;

/// `(virtual IP, port, protocol)`: the key of the `SERVICES` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceKey {
    /// Virtual IP, network order; IPv4 in the first four bytes.
    pub addr: [u8; 16],
    /// Port, network-order bytes.
    pub port: u16,
    /// [`PROTO_TCP`] or [`PROTO_UDP`].
    pub proto: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
}

/// Service flag: forward by rewriting the destination address (NAT) instead of DSR.
pub const SVC_F_NAT: u32 = 1 << 0;
/// Service flag: hash on the source address only (per-client stickiness).
pub const SVC_F_HASH_SOURCE: u32 = 1 << 1;
/// Service flag: forward by IP-in-IP encapsulation (RFC 2003 / RFC 2473) to the backend, the
/// outer source taken from the service's `encap_src`/`encap_mask` range by the flow hash.
pub const SVC_F_IPIP: u32 = 1 << 2;
/// Service flag: its virtual IP limits new flows ([`Vip::new_flows`]): a new flow of the
/// service reads and counts the address's `VIPS` entry.
pub const SVC_F_VIP_LIMIT: u32 = 1 << 3;

/// Service flag: a new flow of the service looks its client's class up (`CLIENT_CLASSES`, then
/// a live `CLIENT_ANSWERS` entry); a class of 1 or more takes its word from `CLASS_DECISIONS`
/// ([`class_decision_index`]) instead of `DECISIONS`. The agent writes every class word of the
/// service's decision slot before it sets this flag: an unwritten word is zero, which is pool 0.
pub const SVC_F_CLASSES: u32 = 1 << 4;
/// Service flag: a new flow of the service whose client has neither a static class nor a live
/// answer is reported in `UNKNOWN_CLIENTS` ([`UnknownClient`]), within the rate limit of
/// [`UNKNOWN_BURST`] records per CPU per [`RATE_WINDOW_TICKS`] and once per client per
/// [`UNKNOWN_HOLD_TICKS`].
pub const SVC_F_CLASSIFY: u32 = 1 << 5;
/// Service flag: the split point of a new flow (which pool of a split it takes) comes from a
/// hash of its client's address ([`hash::client_split_point`]), not of its 5-tuple: a client
/// keeps its side while the weights are unchanged, and a change of `split_b` moves only the
/// clients between the old and the new threshold. The backend within the pool still comes from
/// the flow hash (or the source hash under [`SVC_F_HASH_SOURCE`]).
pub const SVC_F_SPLIT_CLIENT: u32 = 1 << 6;
/// Service flag, with [`SVC_F_SPLIT_CLIENT`]: the split point hashes the client's /24 (IPv4) or
/// /48 (IPv6) instead of its address, so the clients of one network share a side.
pub const SVC_F_SPLIT_PREFIX: u32 = 1 << 7;

/// The value of the `SERVICES` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Service {
    /// Service slot: the index of its counters in `SVC_STATS`.
    pub id: u32,
    /// Index into `DECISIONS` of the word that says where new flows go. Services that share a
    /// decision group share one slot, so one write switches them all.
    pub decision: u32,
    /// `SVC_F_*` bits.
    pub flags: u32,
    /// [`SVC_F_IPIP`]: the host bits of the outer source range, as a mask of the range's last
    /// 32-bit word in host order (`u32::MAX >> prefix` for IPv4, the low 32 bits of
    /// `u128::MAX >> prefix` for IPv6); zero otherwise. See [`encap_source`].
    pub encap_mask: u32,
    /// [`SVC_F_IPIP`]: the outer source range's network address (host bits zero), network
    /// order, IPv4 in the first four bytes; zero otherwise.
    pub encap_src: [u8; 16],
}

/// The outer source address of an IP-in-IP flow whose flow hash is `hash`, from a service's
/// range (`src`, the network address, and `mask`, the host bits of its last 32-bit word): the
/// host bits come from the hash, so a flow keeps one source and flows spread over the range.
/// IPv4 (`v6` false) uses the first four bytes, IPv6 the last four (a range wider than 32
/// host bits varies in its low 32 only).
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn encap_source(src: [u8; 16], mask: u32, hash: u32, v6: bool) -> [u8; 16] {
    let mut out = src;
    if v6 {
        let base = u32::from_be_bytes([src[12], src[13], src[14], src[15]]);
        let w = ((base & !mask) | (hash & mask)).to_be_bytes();
        out[12] = w[0];
        out[13] = w[1];
        out[14] = w[2];
        out[15] = w[3];
    } else {
        let base = u32::from_be_bytes([src[0], src[1], src[2], src[3]]);
        let w = ((base & !mask) | (hash & mask)).to_be_bytes();
        out[0] = w[0];
        out[1] = w[1];
        out[2] = w[2];
        out[3] = w[3];
    }
    out
}

/// The value of `SERVICE_SLOTS`, indexed by service slot: the service a slot holds and its key
/// (all zero for a free slot). A tracked flow names its service by slot; the program forwards
/// it on the entry alone only while the slot still holds the flow's virtual IP, port, protocol
/// and family, so a removed service, or a slot another service took, ends its tracked flows
/// without a `SERVICES` lookup on the packet path.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceSlot {
    /// The service's `SERVICES` key.
    pub key: ServiceKey,
    /// Its `SERVICES` value.
    pub service: Service,
}

/// Words (`u64`) of `SERVICE_FILTER`: a one-hash Bloom filter of 2^20 bits over the keys of
/// every service and the reply sources of every NAT service ([`hash::filter_bit`]). A packet
/// whose bits are clear is for no service and no NAT flow: the program passes it after the
/// parse and one array load, without a hash-map lookup. A set bit may be a false positive
/// (one in about a hundred with 10,000 keys), which costs only the lookups that follow.
pub const FILTER_WORDS: u32 = 1 << 14;
/// Index of the flag word that follows the filter's bit words in `SERVICE_FILTER` (which has
/// [`FILTER_ENTRIES`] entries).
pub const FILTER_FLAGS: u32 = FILTER_WORDS;
/// Entries of `SERVICE_FILTER`: the bit words, then the flag word.
pub const FILTER_ENTRIES: u32 = FILTER_WORDS + 1;
/// Flag word bit: some NAT service's reply sources have bits. Without it the program skips the
/// reply probe, so traffic for no service pays one filter probe, not two.
pub const FILTER_F_NAT: u64 = 1;
/// [`hash::filter_bit`] salt of a service key: virtual IP, port, protocol, family of a request.
pub const FILTER_SERVICE: u32 = 0;
/// [`hash::filter_bit`] salt of a NAT reply source: backend address, service port, protocol,
/// family.
pub const FILTER_NAT_REPLY: u32 = 1;
/// [`hash::filter_bit`] salt of a virtual IP: its address and family (port and protocol 0).
pub const FILTER_VIP: u32 = 2;

/// Client classes: class ids `1..=MAX_CLASSES`, assigned by the agent (classes sorted by name).
/// Class 0 is no class: the rule's `default`, the word in `DECISIONS`.
pub const MAX_CLASSES: u32 = 15;
/// Entries of `CLIENT_CLASSES`: the prefixes of every class, IPv4 and IPv6 together.
pub const MAX_CLASS_PREFIXES: u32 = 16_384;
/// Entries of `CLASS_DECISIONS`: [`MAX_CLASSES`] + 1 words per decision slot (the one of class 0
/// is unused: class 0 reads `DECISIONS`).
pub const CLASS_DECISIONS_SIZE: u32 = MAX_DECISIONS * (MAX_CLASSES + 1);
/// Entries of `CLIENT_ANSWERS` (an LRU: the least recently used answer is evicted first).
pub const CLIENT_ANSWERS_SIZE: u32 = 65_536;
/// Bytes of the `UNKNOWN_CLIENTS` ring buffer (a power of two, a multiple of the page size):
/// about 5,000 records of 48 bytes (36 and the kernel's 8-byte header, rounded up to 8).
pub const UNKNOWN_CLIENTS_BYTES: u32 = 256 * 1024;
/// Records one CPU may put into `UNKNOWN_CLIENTS` per [`RATE_WINDOW_TICKS`] window (about a
/// second): a flood of new clients costs the ring, and the agent, at most this many a second per
/// CPU; the records past it are counted ([`CLASS_STAT_RING_LIMITED`]) and dropped.
pub const UNKNOWN_BURST: u32 = 64;
/// Ticks (about 8.6 s) a reported client is not reported again: with its record the program
/// writes a placeholder answer of class 0 that lives this long into `CLIENT_ANSWERS`, which the
/// classifier's answer replaces. One client's burst of connections costs one record.
pub const UNKNOWN_HOLD_TICKS: u32 = 1 << 13;

/// The prefix length of a `CLIENT_CLASSES` key for a CIDR of `bits` bits: the key's data is a
/// [`ClientAddr`], whose 32-bit family word is matched whole before the address.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per new flow: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn class_prefix_len(bits: u32) -> u32 {
    32 + bits
}

/// Index in `CLASS_DECISIONS` of the word of class `class` (1..=[`MAX_CLASSES`]) of decision
/// slot `slot`. The result is not checked (the map lookup is).
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per new flow: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn class_decision_index(slot: u32, class: u32) -> u32 {
    slot.wrapping_mul(MAX_CLASSES + 1).wrapping_add(class)
}

/// A client address: the data of a `CLIENT_CLASSES` key (after its prefix length) and the key of
/// `CLIENT_ANSWERS`. The family is a whole 32-bit word, so a trie prefix never matches across
/// families.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ClientAddr {
    /// [`FAMILY_V4`] or [`FAMILY_V6`], widened, host order.
    pub family: u32,
    /// The address, network order; IPv4 in the first four bytes, the rest zero.
    pub addr: [u8; 16],
}

/// The value of `CLIENT_ANSWERS`: a classifier's answer for one client address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClientAnswer {
    /// The class, 0..=[`MAX_CLASSES`] (0: no class, the `default`).
    pub class: u32,
    /// Until when the answer holds, in ticks of the program's clock ([`TICK_SHIFT`], the clock
    /// of `FlowEntry.seen`): it is used while [`answer_live`].
    pub expires: u32,
}

/// Whether an answer that `expires` at that tick still holds at `now`: `expires` is ahead of
/// `now` by less than 2^31 ticks (a wrapping difference, as ages are).
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per new flow: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
#[expect(
    clippy::cast_possible_wrap,
    reason = "the wrapping difference read as signed: ahead (positive) or behind"
)]
pub const fn answer_live(expires: u32, now: u32) -> bool {
    (expires.wrapping_sub(now) as i32) > 0
}

/// A record of `UNKNOWN_CLIENTS`: a new flow of a [`SVC_F_CLASSIFY`] service from a client with
/// neither a static class nor a live answer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct UnknownClient {
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    /// [`PROTO_TCP`] or [`PROTO_UDP`].
    pub proto: u8,
    /// The service's port, network-order bytes.
    pub port: u16,
    /// The client's address, network order; IPv4 in the first four bytes.
    pub addr: [u8; 16],
    /// The virtual IP, network order; IPv4 in the first four bytes.
    pub vip: [u8; 16],
}

/// Index in `CLASS_STATS` of the new flows of class `class` (0..=[`MAX_CLASSES`]) sent to side
/// `side` of their decision word (0: pool A, 1: pool B).
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per new flow: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn class_stat_index(class: u32, side: u32) -> u32 {
    class.wrapping_mul(2).wrapping_add(side & 1)
}
/// `CLASS_STATS` index: new flows classed by a live `CLIENT_ANSWERS` entry (no static class),
/// the class-0 placeholder of a client reported and not yet answered included.
pub const CLASS_STAT_ANSWER: u32 = (MAX_CLASSES + 1) * 2;
/// `CLASS_STATS` index: new flows of a [`SVC_F_CLASSIFY`] service whose client had neither a
/// static class nor a live answer.
pub const CLASS_STAT_UNKNOWN: u32 = CLASS_STAT_ANSWER + 1;
/// `CLASS_STATS` index: records put into `UNKNOWN_CLIENTS`.
pub const CLASS_STAT_RING_SENT: u32 = CLASS_STAT_ANSWER + 2;
/// `CLASS_STATS` index: records not sent, past this CPU's [`UNKNOWN_BURST`] of the window.
pub const CLASS_STAT_RING_LIMITED: u32 = CLASS_STAT_ANSWER + 3;
/// `CLASS_STATS` index: records not sent, the ring being full (the agent reads too slowly).
pub const CLASS_STAT_RING_FULL: u32 = CLASS_STAT_ANSWER + 4;
/// Entries of `CLASS_STATS`.
pub const CLASS_STATS_ENTRIES: u32 = CLASS_STAT_ANSWER + 5;

/// Virtual IPs in `VIPS`: as many as services.
pub const MAX_VIPS: u32 = MAX_SERVICES;
/// Host ports per virtual IP ([`Vip::host_ports`]).
pub const VIP_HOST_PORTS: usize = 8;
/// [`Vip`] flag: answer ICMP/`ICMPv6` echo requests to the address (while [`VIP_F_LIVE`]).
pub const VIP_F_ECHO: u32 = 1 << 0;
/// [`Vip`] flag: one of the address's services has a usable backend.
pub const VIP_F_LIVE: u32 = 1 << 1;

/// The key of `VIPS`: a virtual IP.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct VipKey {
    /// The address, network order; IPv4 in the first four bytes.
    pub addr: [u8; 16],
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    /// Zero.
    #[expect(
        clippy::pub_underscore_fields,
        reason = "explicit padding: public so that other crates can build the value with a struct literal"
    )]
    pub _pad: [u8; 3],
}

/// The value of `VIPS`, written by the agent: what the program does with a packet to the
/// virtual IP that no service takes. It drops it (`vip_no_service`), unless it is an echo
/// request it answers ([`VIP_F_ECHO`] and [`VIP_F_LIVE`]), an ICMP/`ICMPv6` message of another
/// type (errors and neighbour discovery are the host's), or for one of `host_ports`. With
/// `new_flows`, it also counts the address's new flows ([`SVC_F_VIP_LIMIT`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Vip {
    /// `VIP_F_*` flags.
    pub flags: u32,
    /// Ports passed to the host's stack: [`host_port`] of each, 0 for an unused entry.
    pub host_ports: [u32; VIP_HOST_PORTS],
    /// New flows the address takes per [`RATE_WINDOW_TICKS`] window, across all its services
    /// and CPUs; 0: no limit. A new flow past it is dropped (`vip_rate_limited`); tracked flows
    /// are never limited.
    pub new_flows: u32,
    /// The program's: the tick its current window began (the agent writes 0).
    pub window: u32,
    /// Zero.
    #[expect(
        clippy::pub_underscore_fields,
        reason = "explicit padding: public so that other crates can build the value with a struct literal"
    )]
    pub _pad: u32,
    /// The program's: new flows counted in the current window (the agent writes 0); a 64-bit
    /// word, which every BPF instruction set version adds to atomically.
    pub count: u64,
}

/// A virtual IP's new-flow window, in ticks of the program's clock (about a second): a
/// fixed window, so a burst at a window's end and the next one's start may reach twice the
/// limit within a second.
pub const RATE_WINDOW_TICKS: u32 = 1 << 10;

/// A [`Vip::host_ports`] entry: `port` (network-order bytes, as in [`FlowKey`]) and `proto`.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn host_port(port: u16, proto: u8) -> u32 {
    (port as u32) | ((proto as u32) << 16)
}

/// Pool flag: when no backend of the pool (nor the fallback pool) is usable, pass packets to
/// the kernel instead of dropping them (`when_all_down: pass`).
pub const POOL_F_ALL_DOWN_PASS: u32 = 1 << 0;

/// Pool flag: the inactive half of the pool's Maglev table holds the table this flip replaced,
/// whole, and a TCP packet that opens no connection and has no tracked flow (it reached a node
/// that never saw its SYN, after ECMP moved it, or its entry was lost) goes to the backend that
/// table names if that backend keeps tracked flows: the second chance. The agent sets it with a
/// flip and clears it after the grace period (`conntrack.second_chance`), and before it writes
/// the inactive half again.
pub const POOL_F_SECOND_CHANCE: u32 = 1 << 1;

/// Pool flag: a decision group just left this pool for another (a switch, not a failure: the
/// pool is the group's decision word's fallback), and a TCP packet that opens no connection and
/// has no tracked flow, on a service whose word names this pool as its fallback, goes to the
/// backend this pool's live table names if that backend keeps tracked flows: the second chance
/// of a connection that began before the switch. The agent sets it before it writes the word
/// that leaves the pool and clears it after the grace period (`conntrack.second_chance`).
pub const POOL_F_LEFT_CHANCE: u32 = 1 << 2;

/// The value of the `POOLS` map, indexed by pool slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pool {
    /// Which half of the pool's double-buffered Maglev table is live: 0 or 1. The agent writes
    /// the inactive half, then flips this word.
    pub active: u32,
    /// `POOL_F_*` bits.
    pub flags: u32,
}

/// Position among the `MAGLEV` map's 16-bit entries of entry `slot` (`0..MAGLEV_SIZE`) of half
/// `half` (0 or 1; only its low bit is used) of pool slot `pool`'s double-buffered table: the
/// entry is lane `position % MAGLEV_LANES` of map value `position / MAGLEV_LANES`, at byte
/// `2 · position` of the mapped array. `pool` must be below [`MAX_POOLS`] and `slot` below
/// [`MAGLEV_SIZE`] for the position to fall inside the map; the result is not checked (the
/// map lookup is).
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn maglev_index(pool: u32, half: u32, slot: u32) -> u32 {
    (pool * 2 + (half & 1)) * (MAGLEV_VALUES * MAGLEV_LANES) + slot
}

/// The backend slot a 16-bit Maglev entry names, or [`NO_BACKEND`] for [`MAGLEV_EMPTY`].
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn maglev_backend(entry: u16) -> u32 {
    if entry == MAGLEV_EMPTY {
        NO_BACKEND
    } else {
        entry as u32
    }
}

/// The 16-bit Maglev entry of backend slot `id` ([`NO_BACKEND`] gives [`MAGLEV_EMPTY`]), or
/// `None` for a slot that does not fit (at or past [`MAGLEV_EMPTY`]; every slot below
/// [`MAX_BACKENDS`] fits).
#[must_use]
pub fn maglev_entry(id: u32) -> Option<u16> {
    if id == NO_BACKEND {
        Some(MAGLEV_EMPTY)
    } else {
        u16::try_from(id).ok().filter(|&e| e != MAGLEV_EMPTY)
    }
}

const _: () = assert!(
    MAX_BACKENDS < MAGLEV_EMPTY as u32,
    "backend slots fit a Maglev entry"
);

/// Backend state: in use and healthy; tracked flows stay, new flows may be sent to it.
pub const BACKEND_UP: u32 = 1;
/// Backend state: draining (weight 0): tracked flows stay, it is in no Maglev table.
pub const BACKEND_DRAINING: u32 = 2;
/// Backend state: unhealthy or removed: tracked flows are re-selected.
pub const BACKEND_DOWN: u32 = 0;
/// Backend state: healthy, but an operator's drain timed out: tracked flows are re-selected, as
/// for [`BACKEND_DOWN`]. Its own value so that an agent resuming the maps does not take it for
/// a failed health check (a restart ends the drain).
pub const BACKEND_EVICTED: u32 = 3;

/// The bits of `Backend.state` that hold the backend's state (`BACKEND_UP`, …); the bits
/// above are `BACKEND_F_*` flags saying what becomes of its tracked flows.
pub const BACKEND_STATE_MASK: u32 = 0xff;
/// Backend flag: its tracked flows stay on it whatever its state (`on_backend_down: keep`):
/// a down backend keeps them as a draining one does, and takes no new flows.
pub const BACKEND_F_KEEP: u32 = 1 << 8;
/// Backend flag: the next packet of a tracked TCP flow on it is answered with a TCP RST from
/// the virtual IP, and the flow becomes closing (`on_backend_down: reset`, or
/// `on_failback: reset` on a pool a decision group left); a tracked UDP flow is re-selected.
/// Overrides [`BACKEND_F_KEEP`] and [`BACKEND_F_MIGRATE`].
pub const BACKEND_F_RESET: u32 = 1 << 9;
/// Backend flag: its tracked flows are re-selected even while it is up (`on_failback:
/// migrate` on a pool a decision group left). Overrides [`BACKEND_F_KEEP`].
pub const BACKEND_F_MIGRATE: u32 = 1 << 10;

/// What becomes of a tracked flow on a backend ([`tracked_fate`]): it stays.
pub const FATE_KEEP: u32 = 0;
/// See [`FATE_KEEP`]: it is re-selected.
pub const FATE_MIGRATE: u32 = 1;
/// See [`FATE_KEEP`]: a TCP flow is reset (a UDP flow is re-selected).
pub const FATE_RESET: u32 = 2;

/// Whether a backend in `state` (flags ignored) may take new flows and keeps its tracked ones
/// by default ([`BACKEND_UP`] or [`BACKEND_DRAINING`]); every other value, known or not, does
/// not.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn keeps_flows(state: u32) -> bool {
    let s = state & BACKEND_STATE_MASK;
    s == BACKEND_UP || s == BACKEND_DRAINING
}

/// What becomes of a tracked flow on a backend whose entry says `state`: a `BACKEND_F_*` flag
/// decides ([`BACKEND_F_RESET`] first, then [`BACKEND_F_MIGRATE`], then [`BACKEND_F_KEEP`]);
/// without one, an up or draining backend keeps it and any other state re-selects it.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn tracked_fate(state: u32) -> u32 {
    if state & BACKEND_F_RESET != 0 {
        FATE_RESET
    } else if state & BACKEND_F_MIGRATE != 0 {
        FATE_MIGRATE
    } else if state & BACKEND_F_KEEP != 0 || keeps_flows(state) {
        FATE_KEEP
    } else {
        FATE_MIGRATE
    }
}

/// The value of the `BACKENDS` map, indexed by backend slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Backend {
    /// Backend address, network order; IPv4 in the first four bytes.
    pub addr: [u8; 16],
    /// [`FAMILY_V4`] or [`FAMILY_V6`], widened.
    pub family: u32,
    /// `BACKEND_UP`, `BACKEND_DRAINING`, `BACKEND_DOWN` or `BACKEND_EVICTED` in the low byte
    /// ([`BACKEND_STATE_MASK`]), with `BACKEND_F_*` flags above it.
    pub state: u32,
    /// Which of the slot's two `NEXT_HOPS` entries is live (0 or 1, see [`next_hop_index`]):
    /// the agent writes a changed next hop into the other one, then flips this word, so no
    /// packet reads a next hop half-written.
    pub hop: u32,
    /// Changes whenever the slot's state or address does (the agent never writes a slot's
    /// previous value back): the program's flow cache trusts a copy of a flow's entry only
    /// while its backend's generation is the one the copy was made under, so a backend that
    /// went down and came back does not get back the flows another CPU re-selected away.
    pub generation: u32,
}

/// Index in `NEXT_HOPS` of half `half` (0 or 1; only its low bit is used) of backend slot
/// `slot`'s next hop. `slot` must be below [`MAX_BACKENDS`] for the index to fall inside the
/// map; the result is not checked (the map lookup is).
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn next_hop_index(slot: u32, half: u32) -> u32 {
    slot * 2 + (half & 1)
}

/// A flow's 5-tuple (plus family): the key of `CONNTRACK` and `NAT_REVERSE`, and the input of
/// [`flow_hash`]. A first fragment carries the whole 5-tuple and is keyed like the flow's
/// unfragmented datagrams.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// Source address, network order.
    pub src: [u8; 16],
    /// Destination address, network order.
    pub dst: [u8; 16],
    /// Source port, network-order bytes.
    pub sport: u16,
    /// Destination port, network-order bytes.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    /// Zero.
    #[expect(
        clippy::pub_underscore_fields,
        reason = "explicit padding: public so that other crates can build the value with a struct literal"
    )]
    pub _pad: [u8; 2],
}

/// The value of `CONNTRACK`: where a tracked flow goes, the state of its protocol and when it
/// last sent a packet.
///
/// A TCP connection is tracked from its first packet after the SYN: the SYN's choice is
/// recorded only in the flow cache of the CPU it arrived on ([`FLOW_F_FIRST`]), so a SYN flood
/// never writes `CONNTRACK` and never evicts a tracked flow from it. Other flows are tracked
/// from their first packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowEntry {
    /// Backend slot.
    pub backend: u32,
    /// Service slot (for counters; the key's destination already names the service).
    pub service: u32,
    /// When the flow last sent a packet, in ticks of the program's clock ([`TICK_SHIFT`]),
    /// refreshed at most every [`SEEN_REFRESH`] ticks.
    pub seen: u32,
    /// A `FLOW_*` state: [`FLOW_TCP_SYN`], [`FLOW_TCP_OPEN`], [`FLOW_TCP_CLOSING`] or
    /// [`FLOW_UDP`], with [`FLOW_F_FIRST`] on a SYN's record.
    pub state: u8,
    /// Zero.
    #[expect(
        clippy::pub_underscore_fields,
        reason = "explicit padding: public so that other crates can build the value with a struct literal"
    )]
    pub _pad: [u8; 3],
}

/// The program's clock runs in ticks of `2^TICK_SHIFT` ns (1.048576 ms): its time is
/// `(CLOCK[CLOCK_AGENT] + CLOCK[CLOCK_OFFSET]) >> TICK_SHIFT`, kept as a `u32` that wraps after
/// about 52 days; ages are wrapping differences. The program calls no clock helper (decision
/// 0021): the agent advances `CLOCK[CLOCK_AGENT]`, so the clock stands still while no agent runs.
pub const TICK_SHIFT: u32 = 20;
/// Index in `CLOCK` of the agent's time: nanoseconds the agent has run, summed over its runs
/// on these maps (each run resumes from the value it finds), advanced every 100 ms. The agent
/// is its only writer.
pub const CLOCK_AGENT: u32 = 0;
/// Index in `CLOCK` of nanoseconds added to the agent's time: 0 unless a test (or an operator,
/// to age every flow at once) moves the program's clock forward.
pub const CLOCK_OFFSET: u32 = 1;
/// Entries of `CLOCK`.
pub const CLOCK_ENTRIES: u32 = 2;
/// A tracked flow's `seen` is rewritten in `CONNTRACK` when it is at least this many ticks old
/// (about a second): a flow's packets write its entry at most once a second, and an idle
/// timeout is honoured to within a second.
pub const SEEN_REFRESH: u32 = 1 << 10;
/// Longest timeout, in ticks: ages are compared as wrapping differences below `2^31` ticks.
pub const MAX_TIMEOUT_TICKS: u32 = 1 << 30;

/// `duration` in ticks of the program's clock, rounded up, at most [`MAX_TIMEOUT_TICKS`].
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the value is at most MAX_TIMEOUT_TICKS, checked just before"
)]
pub const fn ticks(duration: core::time::Duration) -> u32 {
    let ns = duration.as_nanos();
    let t = ns.div_ceil(1 << TICK_SHIFT);
    if t > MAX_TIMEOUT_TICKS as u128 {
        MAX_TIMEOUT_TICKS
    } else {
        t as u32
    }
}

/// Flow state: a TCP SYN was seen, nothing else yet (a SYN's record in a flow cache; in
/// `CONNTRACK` only from a CPU without a cache).
/// Also the index of each state's timeout in [`Config::timeouts`].
pub const FLOW_TCP_SYN: u8 = 0;
/// Flow state: a TCP flow that sent more than a SYN, and neither FIN nor RST.
pub const FLOW_TCP_OPEN: u8 = 1;
/// Flow state: a TCP flow that sent a FIN or an RST: its last packets still reach its backend,
/// a new SYN on its 5-tuple is a new flow.
pub const FLOW_TCP_CLOSING: u8 = 2;
/// Flow state: a UDP flow.
pub const FLOW_UDP: u8 = 3;
/// States, and entries of [`Config::timeouts`].
pub const FLOW_STATES: usize = 4;
/// The low bits of `FlowEntry.state` that hold the state.
pub const FLOW_STATE_MASK: u8 = 0x03;
/// State flag: the record of a SYN, in one CPU's flow cache and not in `CONNTRACK`. The
/// connection's next packet on that CPU tracks it with this record's backend.
pub const FLOW_F_FIRST: u8 = 0x80;

/// Sets of the program's flow cache per CPU (`FLOW_CACHE`): a power of two. Each set holds
/// [`FLOW_CACHE_WAYS`] entries of 64 bytes, so the cache is 512 KiB per CPU.
pub const FLOW_CACHE_SETS: u32 = 1 << 12;
/// Entries per set of the flow cache: the newer of two flows of one set is in way 0.
pub const FLOW_CACHE_WAYS: u32 = 2;
/// Entries of the flow cache per CPU; the map holds this many for every CPU up to the highest
/// online one (the agent sets its size when it loads the object), CPU `c`'s from
/// `c · FLOW_CACHE_ENTRIES`.
pub const FLOW_CACHE_ENTRIES: u32 = FLOW_CACHE_SETS * FLOW_CACHE_WAYS;
/// Packets a cached flow is forwarded on before its conntrack entry is read again: the cache
/// follows any other writer of `CONNTRACK` (another CPU, the agent, an operator's `bpftool`)
/// within this many of the flow's packets on a CPU, and the read keeps the flow recent in
/// conntrack's LRU.
pub const FLOW_CACHE_LEASE: u32 = 16;

/// An entry of the program's per-CPU flow cache: a copy of a flow's `CONNTRACK` entry. One
/// 64-byte entry, so the cache map (page-aligned values, `BPF_F_MMAPABLE`) gives every entry
/// one cache line. An all-zero key is an empty entry: no flow has family 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CachedFlow {
    /// The flow.
    pub key: FlowKey,
    /// Its conntrack entry, as last read or written on this CPU.
    pub entry: FlowEntry,
    /// Packets forwarded on this entry since it was filled or last checked against
    /// `CONNTRACK` (the check comes every [`FLOW_CACHE_LEASE`]).
    pub hits: u32,
    /// The [`Backend::generation`] of the entry's backend when the copy was made.
    pub generation: u32,
}

/// The value of `NAT_REVERSE`, keyed by the 5-tuple a NAT backend's reply carries: what to
/// restore as its source, and the way back to the client. The reply leaves by the interface the
/// request arrived on, towards the MAC it came from (the client, or the router in front of the
/// balancer): the program needs no route lookup and the host no IP forwarding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatEntry {
    /// The virtual IP the client addressed, network order.
    pub vip: [u8; 16],
    /// Service slot.
    pub service: u32,
    /// Interface the request arrived on, where the reply leaves.
    pub ifindex: u32,
    /// The reply's Ethernet destination then source: the request's source MAC, then the MAC
    /// it was addressed to (the first 12 bytes of the reply's Ethernet header).
    pub macs: [u8; 12],
    /// Backend slot the request went to (whose failure signals the reply counts).
    pub backend: u32,
}

/// [`NextHop`] flag: the entry holds a resolved next hop. A slot without it has none: the
/// program drops its packets (`no_next_hop`).
pub const NH_F_RESOLVED: u32 = 1 << 0;

/// The value of `NEXT_HOPS`, two per backend slot ([`next_hop_index`]): how to reach the backend, as the agent
/// resolved it over netlink (the route's egress interface, that interface's MAC, and the
/// neighbour entry of the backend on a shared segment or of the route's gateway). The program
/// copies `macs` into the Ethernet header and sends the frame out of `ifindex`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NextHop {
    /// Egress interface.
    pub ifindex: u32,
    /// `NH_F_*` bits.
    pub flags: u32,
    /// Destination MAC (the backend's or its gateway's) then source MAC (the egress
    /// interface's): the first 12 bytes of the Ethernet header.
    pub macs: [u8; 12],
    /// The egress interface's MTU (`IFLA_MTU`), in bytes of IP packet, as the agent last read
    /// it: an `ipip` packet that would not fit once encapsulated gets an ICMP error instead.
    pub mtu: u32,
}

/// Key of `FRAGMENTS`: one fragmented datagram (RFC 791 §2.3 / RFC 8200 §4.5 identification).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FragKey {
    /// Source address, network order.
    pub src: [u8; 16],
    /// Destination address, network order.
    pub dst: [u8; 16],
    /// IP identification (IPv4: 16 bits widened), host order.
    pub id: u32,
    /// IP protocol of the datagram (IPv4); 0 for IPv6, whose fragments are identified by
    /// addresses and identification alone.
    pub proto: u8,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    /// Zero.
    #[expect(
        clippy::pub_underscore_fields,
        reason = "explicit padding: public so that other crates can build the value with a struct literal"
    )]
    pub _pad: [u8; 2],
}

/// [`FragEntry`] flag: the datagram is a NAT backend's reply; its later fragments get `vip`
/// as their source and leave by `ifindex` with `macs`, as its first fragment did.
pub const FRAG_F_NAT_REPLY: u32 = 1 << 16;

/// Value of `FRAGMENTS`: what the first fragment decided, for the ones that follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FragEntry {
    /// Backend slot ([`NO_BACKEND`] for a NAT reply).
    pub backend: u32,
    /// Service slot.
    pub service: u32,
    /// The service's `SVC_F_*` bits, or [`FRAG_F_NAT_REPLY`].
    pub flags: u32,
    /// A NAT reply's egress interface (its request's ingress); zero otherwise.
    pub ifindex: u32,
    /// A NAT reply's virtual IP, restored as the source; for a request of a [`SVC_F_IPIP`]
    /// service, the outer source its first fragment got (so every fragment of a datagram
    /// leaves with one source); zero otherwise.
    pub vip: [u8; 16],
    /// A NAT reply's Ethernet destination then source; zero otherwise.
    pub macs: [u8; 12],
}

/// Packets and bytes: the value of every per-CPU counter map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Traffic {
    /// Packets.
    pub packets: u64,
    /// Bytes, counted from the Ethernet header.
    pub bytes: u64,
}

/// Failure signals of one backend, counted by the program per CPU (`BACKEND_SIGNALS`): what
/// the agent's circuit breaker reads besides the health check.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BackendSignals {
    /// TCP segments with RST from the backend to a client, seen on the NAT reply path (in
    /// `dsr-l2` and `ipip` the backend answers the client directly: none are seen).
    pub rsts: u64,
    /// SYNs retransmitted to the backend: a SYN of a connection whose first SYN this CPU
    /// recorded and whose next packet never came (the backend did not answer within the
    /// client's retransmission timeout). Every forward mode sees these.
    pub syn_retransmits: u64,
}

/// The value of the one-entry `CONFIG` map, written by the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Config {
    /// Generation of the applied configuration (increases by one per apply).
    pub generation: u64,
    /// [`ABI_VERSION`] of the agent that wrote it.
    pub abi_version: u32,
    /// Zero.
    #[expect(
        clippy::pub_underscore_fields,
        reason = "explicit padding: public so that other crates can build the value with a struct literal"
    )]
    pub _pad: u32,
    /// Idle timeout of each flow state (`FLOW_*`, the index), in ticks of the program's clock
    /// ([`ticks`]); 0 means [`DEFAULT_TIMEOUTS`]'s. A tracked flow idle for longer is a new flow
    /// again: its next packet is selected from the current table.
    pub timeouts: [u32; FLOW_STATES],
}

/// Default idle timeouts by flow state, in seconds (the config's `conntrack:` defaults):
/// a SYN 60 s and a closing flow 10 s (Cilium's `bpf-ct-timeout-regular-tcp-syn` and
/// `-tcp-fin`), an open TCP flow 900 s and a UDP flow 60 s (IPVS's `tcp` timeout, and Cilium's
/// `bpf-ct-timeout-regular-any`).
pub const DEFAULT_TIMEOUTS: [u32; FLOW_STATES] = [60, 900, 10, 60];

/// TCP flag bits of the header's flags byte (RFC 9293 §3.1), as the program passes them to
/// [`first_state`] and [`next_state`].
pub mod tcp_flags {
    /// No more data from the sender.
    pub const FIN: u32 = 0x01;
    /// Synchronise sequence numbers: opens a connection.
    pub const SYN: u32 = 0x02;
    /// Reset the connection.
    pub const RST: u32 = 0x04;
    /// The acknowledgment field is significant.
    pub const ACK: u32 = 0x10;
}

/// Whether a TCP packet with flags `tcp` opens a connection: a SYN without ACK. Such a packet is
/// a new flow on any 5-tuple, tracked or not: a client sends it only for a connection it does
/// not have (IPVS's `conn_reuse_mode` reschedules it likewise).
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn opens(tcp: u32) -> bool {
    tcp & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN
}

/// The state of a flow whose first packet is of protocol `proto` with TCP flags `tcp` (0 for
/// UDP): [`FLOW_UDP`]; for TCP, [`FLOW_TCP_SYN`] for a SYN, [`FLOW_TCP_CLOSING`] for a FIN or
/// an RST, else [`FLOW_TCP_OPEN`] (a connection picked up mid-stream).
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn first_state(proto: u8, tcp: u32) -> u8 {
    if proto != PROTO_TCP {
        FLOW_UDP
    } else if opens(tcp) {
        FLOW_TCP_SYN
    } else {
        next_state(FLOW_TCP_SYN, tcp)
    }
}

/// The state a tracked flow in `state` (flags ignored) enters with a packet that does not open
/// a connection, with TCP flags `tcp`: a FIN or an RST closes a TCP flow, for good; any other
/// packet makes a SYN's flow open. A UDP flow stays UDP.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub const fn next_state(state: u8, tcp: u32) -> u8 {
    let state = state & FLOW_STATE_MASK;
    if state == FLOW_UDP {
        FLOW_UDP
    } else if tcp & (tcp_flags::FIN | tcp_flags::RST) != 0 || state == FLOW_TCP_CLOSING {
        FLOW_TCP_CLOSING
    } else {
        FLOW_TCP_OPEN
    }
}

/// Whether a flow whose entry says `seen` and `state` has been idle past its state's timeout
/// at `now` (ticks; `timeouts` as in [`Config::timeouts`], 0 meaning the default). A `seen`
/// ahead of `now` (a wrapping age of 2^31 ticks or more, about 26 days) is not expired.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub fn expired(seen: u32, state: u8, now: u32, timeouts: &[u32; FLOW_STATES]) -> bool {
    let age = now.wrapping_sub(seen);
    // An age of 2^31 ticks or more is a `seen` ahead of `now`: another CPU refreshed the entry
    // after this packet read the clock. Timeouts are at most `MAX_TIMEOUT_TICKS` (2^30).
    age > timeout(state, timeouts) && age < 1 << 31
}

/// The timeout of flow state `state` (flags ignored), in ticks: `timeouts`'s, or the default for
/// a 0.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
)]
#[inline(always)]
pub fn timeout(state: u8, timeouts: &[u32; FLOW_STATES]) -> u32 {
    let i = (state & FLOW_STATE_MASK) as usize;
    let (Some(&t), Some(&d)) = (timeouts.get(i), DEFAULT_TIMEOUT_TICKS.get(i)) else {
        return 0;
    };
    if t == 0 { d } else { t }
}

/// [`DEFAULT_TIMEOUTS`] in ticks: what the program uses for a timeout of 0 in [`Config`].
pub const DEFAULT_TIMEOUT_TICKS: [u32; FLOW_STATES] = [
    ticks(core::time::Duration::from_secs(DEFAULT_TIMEOUTS[0] as u64)),
    ticks(core::time::Duration::from_secs(DEFAULT_TIMEOUTS[1] as u64)),
    ticks(core::time::Duration::from_secs(DEFAULT_TIMEOUTS[2] as u64)),
    ticks(core::time::Duration::from_secs(DEFAULT_TIMEOUTS[3] as u64)),
];

/// Whether the `CONNTRACK` entry `entry` is an open flow at `now` (ticks of the program's
/// clock), with the idle timeouts `timeouts` of [`Config::timeouts`] (0 meaning the default):
/// an open TCP flow ([`FLOW_TCP_OPEN`]) or a UDP flow ([`FLOW_UDP`]), not a first packet's
/// record ([`FLOW_F_FIRST`]), and not [`expired`] (its age `now.wrapping_sub(entry.seen)` is
/// at most its state's [`timeout`]). A SYN or a closing TCP flow is not open: a drain waits
/// for the open ones.
#[must_use]
pub fn flow_open(entry: &FlowEntry, now: u32, timeouts: &[u32; FLOW_STATES]) -> bool {
    let state = entry.state & FLOW_STATE_MASK;
    entry.state & FLOW_F_FIRST == 0
        && (state == FLOW_TCP_OPEN || state == FLOW_UDP)
        && !expired(entry.seen, entry.state, now, timeouts)
}

/// The decision word: where a service's new flows go. One `u64`, written by the agent with one
/// map update and read by the program with one load, so no packet sees half of two decisions.
///
/// Layout (host order): bits 0–15 pool A, 16–31 pool B, 32–47 the share of new flows sent to
/// pool B in units of 1/[`SPLIT_SCALE`], 48–63 the fallback pool (the last known good pool, used
/// when A and B have no usable backend). Unused pools are [`NO_POOL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The primary pool.
    pub pool_a: u16,
    /// The second pool of a split, or [`NO_POOL`].
    pub pool_b: u16,
    /// Share of new flows sent to `pool_b`, out of [`SPLIT_SCALE`].
    pub split_b: u16,
    /// Pool used when neither `pool_a` nor `pool_b` has a backend, or [`NO_POOL`].
    pub fallback: u16,
}

impl Decision {
    /// A decision that sends every new flow to `pool`: no second pool, no fallback.
    #[must_use]
    pub const fn pool(pool: u16) -> Self {
        Self {
            pool_a: pool,
            pool_b: NO_POOL,
            split_b: 0,
            fallback: NO_POOL,
        }
    }

    /// Packs the decision into its map word (the layout in the type's doc).
    #[must_use]
    #[inline]
    pub const fn encode(self) -> u64 {
        (self.pool_a as u64)
            | ((self.pool_b as u64) << 16)
            | ((self.split_b as u64) << 32)
            | ((self.fallback as u64) << 48)
    }

    /// Unpacks a map word (the layout in the type's doc). Every word decodes; whether its pools
    /// name pool slots is for the reader to check.
    #[must_use]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "each `as u16` keeps the 16 bits of one field of the word, shifted down first"
    )]
    #[expect(
        clippy::inline_always,
        reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
    )]
    #[inline(always)]
    pub const fn decode(word: u64) -> Self {
        Self {
            pool_a: word as u16,
            pool_b: (word >> 16) as u16,
            split_b: (word >> 32) as u16,
            fallback: (word >> 48) as u16,
        }
    }

    /// Which pool a new flow with hash `hash` uses: pool B when the flow's split point, a value
    /// in `0..SPLIT_SCALE` derived from the hash ([`hash::split_point`]), falls below `split_b`;
    /// pool A otherwise, and always when pool B is [`NO_POOL`]. The fallback is not considered.
    #[must_use]
    #[expect(
        clippy::inline_always,
        reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
    )]
    #[inline(always)]
    pub const fn pick(self, hash: u32) -> u16 {
        self.pick_at(hash::split_point(hash))
    }

    /// Which pool a new flow whose split point is `point` (in `0..SPLIT_SCALE`) uses: pool B
    /// when `point` falls below `split_b` (and pool B is not [`NO_POOL`]), else pool A. A
    /// threshold: raising `split_b` moves only the points between the old and the new value,
    /// all from A to B.
    #[must_use]
    #[expect(
        clippy::inline_always,
        reason = "called by the XDP program per packet: inlined, it costs no BPF-to-BPF call"
    )]
    #[inline(always)]
    pub const fn pick_at(self, point: u32) -> u16 {
        if self.pool_b != NO_POOL && point < self.split_b as u32 {
            self.pool_b
        } else {
            self.pool_a
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type is #[repr(C)], has no padding (checked by the layout tests) and is
    // valid for any bit pattern.
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::Service {}
    unsafe impl aya::Pod for super::ServiceSlot {}
    unsafe impl aya::Pod for super::Pool {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowEntry {}
    unsafe impl aya::Pod for super::VipKey {}
    unsafe impl aya::Pod for super::Vip {}
    unsafe impl aya::Pod for super::CachedFlow {}
    unsafe impl aya::Pod for super::NatEntry {}
    unsafe impl aya::Pod for super::NextHop {}
    unsafe impl aya::Pod for super::FragKey {}
    unsafe impl aya::Pod for super::FragEntry {}
    unsafe impl aya::Pod for super::Traffic {}
    unsafe impl aya::Pod for super::BackendSignals {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::ClientAddr {}
    unsafe impl aya::Pod for super::ClientAnswer {}
    unsafe impl aya::Pod for super::UnknownClient {}
}

#[cfg(test)]
mod tests {
    use core::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn layouts_are_pinned() {
        assert_eq!(size_of::<ServiceKey>(), 20);
        assert_eq!(offset_of!(ServiceKey, port), 16);
        assert_eq!(offset_of!(ServiceKey, proto), 18);
        assert_eq!(offset_of!(ServiceKey, family), 19);

        assert_eq!(size_of::<Service>(), 32);
        assert_eq!(offset_of!(Service, decision), 4);
        assert_eq!(offset_of!(Service, flags), 8);
        assert_eq!(offset_of!(Service, encap_mask), 12);
        assert_eq!(offset_of!(Service, encap_src), 16);

        assert_eq!(size_of::<ServiceSlot>(), 52);
        assert_eq!(offset_of!(ServiceSlot, service), 20);

        assert_eq!(size_of::<Pool>(), 8);
        assert_eq!(offset_of!(Pool, flags), 4);

        assert_eq!(size_of::<Backend>(), 32);
        assert_eq!(offset_of!(Backend, family), 16);
        assert_eq!(offset_of!(Backend, state), 20);
        assert_eq!(offset_of!(Backend, hop), 24);

        assert_eq!(size_of::<FlowKey>(), 40);
        assert_eq!(offset_of!(FlowKey, dst), 16);
        assert_eq!(offset_of!(FlowKey, sport), 32);
        assert_eq!(offset_of!(FlowKey, dport), 34);
        assert_eq!(offset_of!(FlowKey, proto), 36);
        assert_eq!(offset_of!(FlowKey, family), 37);

        assert_eq!(size_of::<FlowEntry>(), 16);
        assert_eq!(offset_of!(FlowEntry, seen), 8);
        assert_eq!(offset_of!(FlowEntry, state), 12);
        // The program writes an entry as eight 64-bit words: key 0–4, entry 5–6, hits 7.
        assert_eq!(size_of::<CachedFlow>(), 64);
        assert_eq!(offset_of!(CachedFlow, entry), 40);
        assert_eq!(offset_of!(CachedFlow, hits), 56);
        assert_eq!(offset_of!(CachedFlow, generation), 60);
        assert_eq!(size_of::<NatEntry>(), 40);
        assert_eq!(offset_of!(NatEntry, backend), 36);
        assert_eq!(size_of::<BackendSignals>(), 16);
        assert_eq!(offset_of!(NatEntry, service), 16);
        assert_eq!(offset_of!(NatEntry, ifindex), 20);
        assert_eq!(offset_of!(NatEntry, macs), 24);

        assert_eq!(size_of::<NextHop>(), 24);
        assert_eq!(offset_of!(NextHop, flags), 4);
        assert_eq!(offset_of!(NextHop, macs), 8);
        assert_eq!(offset_of!(NextHop, mtu), 20);

        assert_eq!(size_of::<FragKey>(), 40);
        assert_eq!(offset_of!(FragKey, id), 32);
        assert_eq!(offset_of!(FragKey, proto), 36);
        assert_eq!(size_of::<FragEntry>(), 44);
        assert_eq!(offset_of!(FragEntry, vip), 16);
        assert_eq!(offset_of!(FragEntry, macs), 32);

        assert_eq!(size_of::<VipKey>(), 20);
        assert_eq!(size_of::<Vip>(), 56);
        assert_eq!(offset_of!(Vip, count), 48);
        assert_eq!(offset_of!(Vip, new_flows), 36);

        assert_eq!(size_of::<ClientAddr>(), 20);
        assert_eq!(offset_of!(ClientAddr, addr), 4);
        assert_eq!(size_of::<ClientAnswer>(), 8);
        assert_eq!(offset_of!(ClientAnswer, expires), 4);
        assert_eq!(size_of::<UnknownClient>(), 36);
        assert_eq!(offset_of!(UnknownClient, proto), 1);
        assert_eq!(offset_of!(UnknownClient, port), 2);
        assert_eq!(offset_of!(UnknownClient, addr), 4);
        assert_eq!(offset_of!(UnknownClient, vip), 20);

        assert_eq!(size_of::<Traffic>(), 16);
        assert_eq!(size_of::<Config>(), 32);
        assert_eq!(offset_of!(Config, abi_version), 8);
        assert_eq!(offset_of!(Config, timeouts), 16);
    }

    #[test]
    fn a_flow_is_open_in_an_open_state_within_its_timeout() {
        let entry = |state, seen| FlowEntry {
            backend: 1,
            service: 2,
            seen,
            state,
            _pad: [0; 3],
        };
        let timeouts = [0, 100, 0, 50];
        // Open TCP: open up to and including its timeout, not one tick past it.
        assert!(flow_open(&entry(FLOW_TCP_OPEN, 1_000), 1_000, &timeouts));
        assert!(flow_open(&entry(FLOW_TCP_OPEN, 1_000), 1_100, &timeouts));
        assert!(!flow_open(&entry(FLOW_TCP_OPEN, 1_000), 1_101, &timeouts));
        // UDP, with its own timeout.
        assert!(flow_open(&entry(FLOW_UDP, 1_000), 1_050, &timeouts));
        assert!(!flow_open(&entry(FLOW_UDP, 1_000), 1_051, &timeouts));
        // A SYN, a closing flow and a first packet's record are never open.
        assert!(!flow_open(&entry(FLOW_TCP_SYN, 1_000), 1_000, &timeouts));
        assert!(!flow_open(
            &entry(FLOW_TCP_CLOSING, 1_000),
            1_000,
            &timeouts
        ));
        assert!(!flow_open(
            &entry(FLOW_TCP_OPEN | FLOW_F_FIRST, 1_000),
            1_000,
            &timeouts
        ));
        assert!(!flow_open(
            &entry(FLOW_UDP | FLOW_F_FIRST, 1_000),
            1_000,
            &timeouts
        ));
        // Ages are wrapping differences: a flow seen just before the clock wrapped.
        assert!(flow_open(
            &entry(FLOW_TCP_OPEN, u32::MAX - 10),
            20,
            &timeouts
        ));
        // A timeout of 0 is the default.
        let defaults = [0; FLOW_STATES];
        let open = DEFAULT_TIMEOUT_TICKS[FLOW_TCP_OPEN as usize];
        assert!(flow_open(&entry(FLOW_TCP_OPEN, 0), open, &defaults));
        assert!(!flow_open(&entry(FLOW_TCP_OPEN, 0), open + 1, &defaults));
        let udp = DEFAULT_TIMEOUT_TICKS[FLOW_UDP as usize];
        assert!(flow_open(&entry(FLOW_UDP, 0), udp, &defaults));
        assert!(!flow_open(&entry(FLOW_UDP, 0), udp + 1, &defaults));
    }

    #[test]
    fn tcp_flows_open_with_a_syn_and_close_for_good_with_a_fin_or_an_rst() {
        use tcp_flags::{ACK, FIN, RST, SYN};
        assert!(opens(SYN));
        assert!(!opens(SYN | ACK), "a SYN-ACK opens nothing here");
        assert!(!opens(ACK));
        assert_eq!(first_state(PROTO_TCP, SYN), FLOW_TCP_SYN);
        assert_eq!(
            first_state(PROTO_TCP, ACK),
            FLOW_TCP_OPEN,
            "picked up mid-stream"
        );
        assert_eq!(first_state(PROTO_TCP, RST), FLOW_TCP_CLOSING);
        assert_eq!(first_state(PROTO_TCP, FIN | ACK), FLOW_TCP_CLOSING);
        assert_eq!(first_state(PROTO_UDP, 0), FLOW_UDP);
        assert_eq!(next_state(FLOW_TCP_SYN | FLOW_F_FIRST, ACK), FLOW_TCP_OPEN);
        assert_eq!(next_state(FLOW_TCP_OPEN, ACK), FLOW_TCP_OPEN);
        assert_eq!(next_state(FLOW_TCP_OPEN, FIN | ACK), FLOW_TCP_CLOSING);
        assert_eq!(next_state(FLOW_TCP_OPEN, RST), FLOW_TCP_CLOSING);
        assert_eq!(next_state(FLOW_TCP_CLOSING, ACK), FLOW_TCP_CLOSING);
        assert_eq!(next_state(FLOW_UDP, 0), FLOW_UDP);
    }

    #[test]
    fn ticks_round_up_and_stop_at_the_longest_timeout() {
        use core::time::Duration;
        assert_eq!(ticks(Duration::ZERO), 0);
        assert_eq!(ticks(Duration::from_nanos(1)), 1);
        assert_eq!(ticks(Duration::from_nanos(1 << TICK_SHIFT)), 1);
        assert_eq!(ticks(Duration::from_mins(1)), 57_221);
        assert_eq!(ticks(Duration::from_secs(1 << 40)), MAX_TIMEOUT_TICKS);
        let timeouts = [0, 5, 0, 0];
        assert!(!expired(100, FLOW_TCP_OPEN, 105, &timeouts));
        assert!(expired(100, FLOW_TCP_OPEN, 106, &timeouts));
        assert_eq!(
            timeout(FLOW_UDP | FLOW_F_FIRST, &timeouts),
            DEFAULT_TIMEOUT_TICKS[3]
        );
    }

    #[test]
    fn a_flag_decides_what_becomes_of_tracked_flows_before_the_state() {
        assert_eq!(tracked_fate(BACKEND_UP), FATE_KEEP);
        assert_eq!(tracked_fate(BACKEND_DRAINING), FATE_KEEP);
        assert_eq!(tracked_fate(BACKEND_DOWN), FATE_MIGRATE);
        assert_eq!(tracked_fate(BACKEND_EVICTED), FATE_MIGRATE);
        assert_eq!(tracked_fate(BACKEND_DOWN | BACKEND_F_KEEP), FATE_KEEP);
        assert_eq!(tracked_fate(BACKEND_DOWN | BACKEND_F_RESET), FATE_RESET);
        assert_eq!(tracked_fate(BACKEND_UP | BACKEND_F_MIGRATE), FATE_MIGRATE);
        assert_eq!(
            tracked_fate(BACKEND_UP | BACKEND_F_MIGRATE | BACKEND_F_RESET),
            FATE_RESET
        );
        assert_eq!(
            tracked_fate(BACKEND_DOWN | BACKEND_F_KEEP | BACKEND_F_MIGRATE),
            FATE_MIGRATE
        );
        // New flows read the state alone: a kept down backend takes none.
        assert!(!keeps_flows(BACKEND_DOWN | BACKEND_F_KEEP));
        assert!(keeps_flows(BACKEND_UP | BACKEND_F_MIGRATE));
        assert!(!keeps_flows(0x44));
    }

    #[test]
    fn decision_word_round_trips() {
        let d = Decision {
            pool_a: 3,
            pool_b: 7,
            split_b: 500,
            fallback: 9,
        };
        assert_eq!(Decision::decode(d.encode()), d);
        assert_eq!(d.encode(), 3 | (7 << 16) | (500 << 32) | (9 << 48));
        assert_eq!(Decision::decode(Decision::pool(2).encode()).pool_b, NO_POOL);
    }

    #[test]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the counter's low and high 16 bits are the two ports"
    )]
    fn split_sends_its_share_to_pool_b() {
        let d = Decision {
            pool_a: 0,
            pool_b: 1,
            split_b: 500,
            fallback: NO_POOL,
        };
        let mut b = 0u32;
        for i in 0..100_000u32 {
            let key = FlowKey {
                sport: i as u16,
                dport: (i >> 16) as u16,
                ..FlowKey::default()
            };
            if d.pick(flow_hash(&key)) == 1 {
                b += 1;
            }
        }
        // 5 % of 100,000 = 5,000; allow 0.3 percentage points.
        assert!((4_700..=5_300).contains(&b), "{b} of 100000 went to pool B");
    }

    #[test]
    fn class_words_of_a_slot_are_disjoint_from_the_next_slot_s() {
        assert_eq!(class_decision_index(0, 1), 1);
        assert_eq!(class_decision_index(0, MAX_CLASSES), MAX_CLASSES);
        assert_eq!(class_decision_index(1, 1), MAX_CLASSES + 2);
        assert_eq!(
            class_decision_index(MAX_DECISIONS - 1, MAX_CLASSES),
            CLASS_DECISIONS_SIZE - 1
        );
        assert_eq!(class_stat_index(MAX_CLASSES, 1), CLASS_STAT_ANSWER - 1);
        assert_eq!(class_prefix_len(24), 56);
    }

    #[test]
    fn an_answer_lives_until_its_tick_across_the_clock_s_wrap() {
        assert!(answer_live(100, 99));
        assert!(!answer_live(100, 100), "expired at its tick");
        assert!(!answer_live(100, 5_000));
        assert!(answer_live(10, u32::MAX - 10), "across the wrap");
        assert!(!answer_live(u32::MAX - 10, 10));
        assert!(!answer_live(0, 0), "a zeroed entry is no answer");
    }

    #[test]
    fn raising_a_threshold_moves_points_from_a_to_b_only() {
        let at = |split_b| Decision {
            pool_a: 0,
            pool_b: 1,
            split_b,
            fallback: NO_POOL,
        };
        let (before, after) = (at(500), at(2_500));
        let mut moved = 0;
        for point in 0..u32::from(SPLIT_SCALE) {
            let (b, a) = (before.pick_at(point), after.pick_at(point));
            assert!(!(b == 1 && a == 0), "point {point} moved from B to A");
            if b != a {
                moved += 1;
            }
        }
        assert_eq!(moved, 2_000, "exactly the points between the thresholds");
        assert_eq!(Decision::pool(3).pick_at(0), 3, "no pool B: always A");
    }

    #[test]
    fn encap_source_keeps_the_prefix_and_takes_host_bits_from_the_hash() {
        let v4 = [198, 18, 250, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let s = encap_source(v4, 0xff, 0x1234_5678, false);
        assert_eq!(&s[..4], &[198, 18, 250, 0x78]);
        assert_eq!(&s[4..], &[0; 12]);
        // A /32 has no host bits: always the one address.
        assert_eq!(encap_source(v4, 0, u32::MAX, false), v4);
        let mut v6 = [0u8; 16];
        v6[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        let s = encap_source(v6, 0xffff, 0xdead_beef, true);
        assert_eq!(&s[..12], &v6[..12]);
        assert_eq!(&s[12..], &[0, 0, 0xbe, 0xef]);
    }

    #[test]
    fn maglev_index_is_disjoint_per_pool_and_half() {
        let table = MAGLEV_VALUES * MAGLEV_LANES;
        assert!(table >= MAGLEV_SIZE && table - MAGLEV_SIZE < MAGLEV_LANES);
        assert_eq!(maglev_index(0, 0, 0), 0);
        assert_eq!(maglev_index(0, 1, 0), table);
        assert_eq!(maglev_index(1, 0, 5), 2 * table + 5);
        assert!(maglev_index(0, 0, MAGLEV_SIZE - 1) < maglev_index(0, 1, 0));
        assert_eq!(
            maglev_index(MAX_POOLS - 1, 1, MAGLEV_SIZE - 1) / MAGLEV_LANES,
            MAX_POOLS * 2 * MAGLEV_VALUES - 1
        );
    }

    #[test]
    fn maglev_entries_round_trip_backend_slots_and_refuse_what_does_not_fit() {
        for id in [0, 1, MAX_BACKENDS - 1, NO_BACKEND] {
            assert_eq!(maglev_entry(id).map(maglev_backend), Some(id));
        }
        assert_eq!(maglev_entry(NO_BACKEND), Some(MAGLEV_EMPTY));
        assert_eq!(maglev_entry(u32::from(MAGLEV_EMPTY)), None);
        assert_eq!(maglev_entry(NO_BACKEND - 1), None);
    }
}
