//! The program's maps. Layouts, writers and readers are documented once, in
//! `router_common::maps`; the names here are the ones listed there (a test in the agent checks
//! that the loaded object has every name in `router_common::maps::ALL`).
//!
//! All maps are BTF-described (`#[btf_map]`), so `bpftool map dump pinned …` prints named
//! fields.

use aya_ebpf::{
    btf_maps::{
        Array, DevMapHash, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, RingBuf,
    },
    macros::btf_map,
};
use router_common::{
    Backend, BackendSignals, CLASS_DECISIONS_SIZE, CLASS_STATS_ENTRIES, CLIENT_ANSWERS_SIZE,
    CONNTRACK_SIZE, CachedFlow, ClientAddr, ClientAnswer, Config, FILTER_ENTRIES,
    FLOW_CACHE_ENTRIES, FRAGMENT_SIZE, FlowEntry, FlowKey, FragEntry, FragKey, MAGLEV_LANES,
    MAGLEV_VALUES, MAX_BACKENDS, MAX_CLASS_PREFIXES, MAX_DECISIONS, MAX_POOLS, MAX_SERVICES,
    MAX_TX_PORTS, MAX_VIPS, NatEntry, NextHop, Pool, Reason, Service, ServiceKey, ServiceSlot,
    Traffic, UNKNOWN_CLIENTS_BYTES, UnknownClient, Verdict, Vip, VipKey,
};

/// Services by `(VIP, port, protocol, family)`.
#[btf_map]
pub static SERVICES: HashMap<ServiceKey, Service, { MAX_SERVICES as usize }> = HashMap::new();

/// Services by slot, with their keys: what a tracked flow's slot still holds.
#[btf_map]
pub static SERVICE_SLOTS: Array<ServiceSlot, { MAX_SERVICES as usize }> = Array::new();

/// The filter of service keys and NAT reply sources (`router_common::hash::filter_bit`).
#[btf_map]
pub static SERVICE_FILTER: Array<u64, { FILTER_ENTRIES as usize }> = Array::new();

/// Decision words (`router_common::Decision`), by decision slot.
#[btf_map]
pub static DECISIONS: Array<u64, { MAX_DECISIONS as usize }> = Array::new();

/// Pools: live Maglev half and flags, by pool slot.
#[btf_map]
pub static POOLS: Array<Pool, { MAX_POOLS as usize }> = Array::new();

/// `BPF_F_MMAPABLE`: the agent writes tables through a memory mapping (one copy of 256 KiB
/// instead of 65,537 update syscalls), then flips the pool's `active` word with one update.
const BPF_F_MMAPABLE: usize = 1 << 10;

/// Every pool's two Maglev tables: 16-bit backend slots, four to a value
/// (`router_common::MAGLEV_LANES`), at the positions `router_common::maglev_index` gives.
#[btf_map]
pub static MAGLEV: Array<
    [u16; MAGLEV_LANES as usize],
    { (MAX_POOLS * 2 * MAGLEV_VALUES) as usize },
    BPF_F_MMAPABLE,
> = Array::new();

/// Backends by slot: address, family, state.
#[btf_map]
pub static BACKENDS: Array<Backend, { MAX_BACKENDS as usize }> = Array::new();

/// Next hops, two per backend slot (`router_common::next_hop_index`; the slot's `Backend.hop`
/// names the live one): egress interface and MACs, written by the agent.
#[btf_map]
pub static NEXT_HOPS: Array<NextHop, { (MAX_BACKENDS * 2) as usize }> = Array::new();

/// Connection tracking: a flow's 5-tuple → its backend, state and last packet's time.
#[btf_map]
pub static CONNTRACK: LruHashMap<FlowKey, FlowEntry, { CONNTRACK_SIZE as usize }> =
    LruHashMap::new();

/// The flow cache: copies of `CONNTRACK` entries, [`FLOW_CACHE_ENTRIES`] per CPU, CPU `c`'s
/// from `c · FLOW_CACHE_ENTRIES` (the agent sizes the map for the CPUs online when it loads
/// the object; a CPU past its end has no cache and uses `CONNTRACK` alone). Each CPU reads and
/// writes only its own entries. Page-aligned values (`BPF_F_MMAPABLE`) give each 64-byte
/// entry one cache line. Not part of the ABI: neither pinned nor read by the agent.
#[btf_map]
pub static FLOW_CACHE: Array<CachedFlow, { FLOW_CACHE_ENTRIES as usize }, BPF_F_MMAPABLE> =
    Array::new();

/// NAT replies: the reply's 5-tuple → the VIP to restore as its source and the way back.
#[btf_map]
pub static NAT_REVERSE: LruHashMap<FlowKey, NatEntry, { CONNTRACK_SIZE as usize }> =
    LruHashMap::new();

/// Fragmented datagrams in flight: what their first fragment chose.
#[btf_map]
pub static FRAGMENTS: LruHashMap<FragKey, FragEntry, { FRAGMENT_SIZE as usize }> =
    LruHashMap::new();

/// Interfaces the program may redirect to (ifindex → ifindex).
#[btf_map]
pub static TX_PORTS: DevMapHash<{ MAX_TX_PORTS as usize }> = DevMapHash::new();

/// Per-CPU packets and bytes by `Reason`.
#[btf_map]
pub static REASON_STATS: PerCpuArray<Traffic, { Reason::COUNT as usize }> = PerCpuArray::new();

/// Per-CPU packets and bytes by `service · 4 + verdict`.
#[btf_map]
pub static SVC_STATS: PerCpuArray<Traffic, { (MAX_SERVICES * Verdict::COUNT) as usize }> =
    PerCpuArray::new();

/// Per-CPU packets and bytes by backend slot.
#[btf_map]
pub static BACKEND_STATS: PerCpuArray<Traffic, { MAX_BACKENDS as usize }> = PerCpuArray::new();

/// Per-CPU failure signals by backend slot (`router_common::BackendSignals`): RSTs a NAT
/// backend sent, SYNs retransmitted to a backend.
#[btf_map]
pub static BACKEND_SIGNALS: PerCpuArray<BackendSignals, { MAX_BACKENDS as usize }> =
    PerCpuArray::new();

/// The ipip encapsulation program (`switchyard_ipip`) at index 0, which `switchyard`
/// tail-calls for packets of ipip services; written by the agent when it loads the object.
#[btf_map]
pub static IPIP_TX: ProgramArray<1> = ProgramArray::new();

/// Generation, ABI version and flow timeouts, written by the agent.
#[btf_map]
pub static CONFIG: Array<Config, 1> = Array::new();

/// Virtual IPs: what to do with their traffic that no service takes (`router_common::Vip`).
#[btf_map]
pub static VIPS: HashMap<VipKey, Vip, { MAX_VIPS as usize }> = HashMap::new();

/// The program's clock (`crate::select::now`), in ns: the agent's time at
/// `router_common::CLOCK_AGENT`, which the agent advances, and an offset at `CLOCK_OFFSET`
/// (zero, unless a test moves the clock forward to age tracked flows).
#[btf_map]
pub static CLOCK: Array<u64, { router_common::CLOCK_ENTRIES as usize }> = Array::new();

/// Client classes: the longest prefix (`router_common::class_prefix_len`) of a client's
/// `ClientAddr` names its class (1..=`MAX_CLASSES`). `BPF_F_NO_PREALLOC`, as the kernel requires
/// of a trie (the type's default flags).
#[btf_map]
pub static CLIENT_CLASSES: LpmTrie<ClientAddr, u32, { MAX_CLASS_PREFIXES as usize }> =
    LpmTrie::new();

/// The decision words of client classes, at `router_common::class_decision_index`.
#[btf_map]
pub static CLASS_DECISIONS: Array<u64, { CLASS_DECISIONS_SIZE as usize }> = Array::new();

/// A classifier's answers by client address (`router_common::ClientAnswer`); the program adds
/// class-0 placeholders for the clients it reports.
#[btf_map]
pub static CLIENT_ANSWERS: LruHashMap<ClientAddr, ClientAnswer, { CLIENT_ANSWERS_SIZE as usize }> =
    LruHashMap::new();

/// Records of unknown clients (`router_common::UnknownClient`), for the agent's classifier.
#[btf_map]
pub static UNKNOWN_CLIENTS: RingBuf<UnknownClient, { UNKNOWN_CLIENTS_BYTES as usize }> =
    RingBuf::new();

/// Per-CPU new flows by class and side, and the answer and ring counters
/// (`router_common::class_stat_index`, `CLASS_STAT_*`).
#[btf_map]
pub static CLASS_STATS: PerCpuArray<Traffic, { CLASS_STATS_ENTRIES as usize }> = PerCpuArray::new();

/// Per CPU: the tick the current window of `UNKNOWN_CLIENTS` records began, and the records
/// sent in it (`router_common::UNKNOWN_BURST`). Not part of the ABI: neither pinned nor read by
/// the agent.
#[btf_map]
pub static UNKNOWN_LIMIT: PerCpuArray<[u32; 2], 1> = PerCpuArray::new();

/// Per-CPU scratch space for the packet being processed (see `parse::Packet`). Not part of the
/// ABI: the agent neither reads nor pins it.
#[btf_map]
pub static SCRATCH: PerCpuArray<crate::parse::Packet, 1> = PerCpuArray::new();
