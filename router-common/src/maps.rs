//! Names of the program's maps, which the agent uses to find and pin them (so neither side can
//! misspell one), with what each holds. Names are at most 15 bytes (`BPF_OBJ_NAME_LEN` - 1).
//!
//! | map | type | key → value | writer → reader | entries |
//! |---|---|---|---|---|
//! | `SERVICES` | hash | [`ServiceKey`] → [`Service`] | agent → program | [`MAX_SERVICES`] |
//! | `SERVICE_SLOTS` | array | service slot → [`ServiceSlot`] | agent → program | [`MAX_SERVICES`] |
//! | `SERVICE_FILTER` | array | word → 64 bits of the filter ([`filter_bit`]), then a flag word | agent → program | [`FILTER_ENTRIES`] |
//! | `DECISIONS` | array | slot → decision word `u64` ([`Decision`]) | agent → program | [`MAX_DECISIONS`] |
//! | `POOLS` | array | pool slot → [`Pool`] | agent → program | [`MAX_POOLS`] |
//! | `MAGLEV` | array | [`maglev_index`] `/ MAGLEV_LANES` → four 16-bit backend slots | agent → program | `MAX_POOLS·2·MAGLEV_VALUES` |
//! | `BACKENDS` | array | backend slot → [`Backend`] | agent → program | [`MAX_BACKENDS`] |
//! | `NEXT_HOPS` | array | [`next_hop_index`] → [`NextHop`] | agent → program | `MAX_BACKENDS·2` |
//! | `CONNTRACK` | LRU hash | [`FlowKey`] → [`FlowEntry`] | program → program, agent (read) | [`CONNTRACK_SIZE`] |
//! | `NAT_REVERSE` | LRU hash | reply [`FlowKey`] → [`NatEntry`] | program → program | [`CONNTRACK_SIZE`] |
//! | `FRAGMENTS` | LRU hash | [`FragKey`] → [`FragEntry`] | program → program | [`FRAGMENT_SIZE`] |
//! | `TX_PORTS` | devmap hash | ifindex → ifindex | agent → program | [`MAX_TX_PORTS`] |
//! | `REASON_STATS` | per-CPU array | [`Reason`] → [`Traffic`] | program → agent | [`Reason::COUNT`] |
//! | `SVC_STATS` | per-CPU array | `service·4 + verdict` → [`Traffic`] | program → agent | `MAX_SERVICES·4` |
//! | `BACKEND_STATS` | per-CPU array | backend slot → [`Traffic`] | program → agent | [`MAX_BACKENDS`] |
//! | `IPIP_TX` | program array | 0 → the `switchyard_ipip` program | agent → program (tail call) | 1 |
//! | `CONFIG` | array | 0 → [`Config`] | agent → program, `status` | 1 |
//! | `VIPS` | hash | [`VipKey`] → [`Vip`] | agent → program | [`MAX_VIPS`] |
//! | `BACKEND_SIGNALS` | per-CPU array | backend slot → [`BackendSignals`] | program → agent | [`MAX_BACKENDS`] |
//! | `CLOCK` | array | [`CLOCK_AGENT`] → the agent's time, [`CLOCK_OFFSET`] → ns added to it (`u64` ns, see [`TICK_SHIFT`]) | agent, tests → program | [`CLOCK_ENTRIES`] |
//! | `CLIENT_CLASSES` | LPM trie (`BPF_F_NO_PREALLOC`) | prefix length ([`class_prefix_len`]: 32 + the CIDR's bits) and [`ClientAddr`] → class id `u32` (1..=[`MAX_CLASSES`]) | agent → program | [`MAX_CLASS_PREFIXES`] |
//! | `CLASS_DECISIONS` | array | [`class_decision_index`] (`slot·16 + class`) → decision word `u64` of that class | agent → program | [`CLASS_DECISIONS_SIZE`] |
//! | `CLIENT_ANSWERS` | LRU hash | [`ClientAddr`] → [`ClientAnswer`] (class, expiry tick) | classifier (agent) → program; the program writes class-0 placeholders ([`UNKNOWN_HOLD_TICKS`]) | [`CLIENT_ANSWERS_SIZE`] |
//! | `UNKNOWN_CLIENTS` | ring buffer | records [`UnknownClient`] | program → agent | [`UNKNOWN_CLIENTS_BYTES`] bytes |
//! | `CLASS_STATS` | per-CPU array | [`class_stat_index`] (`class·2 + side`, side 0 pool A, 1 pool B) → [`Traffic`] of new flows; then [`CLASS_STAT_ANSWER`] (classed by an answer), [`CLASS_STAT_UNKNOWN`] (neither class nor answer), [`CLASS_STAT_RING_SENT`], [`CLASS_STAT_RING_LIMITED`], [`CLASS_STAT_RING_FULL`] | program → agent | [`CLASS_STATS_ENTRIES`] |
//!
//! Not pinned and not part of the layout: `FLOW_CACHE`, the program's per-CPU copies of
//! `CONNTRACK` entries ([`CachedFlow`], [`FLOW_CACHE_ENTRIES`] per online CPU), `UNKNOWN_LIMIT`,
//! each CPU's window and count of `UNKNOWN_CLIENTS` records ([`UNKNOWN_BURST`]), and its
//! scratch space.
//!
//! A new flow of a service with [`SVC_F_CLASSES`] or [`SVC_F_CLASSIFY`] takes its client's class
//! from `CLIENT_CLASSES` (the longest prefix), else from a live `CLIENT_ANSWERS` entry
//! ([`answer_live`]); static classes win over answers. With [`SVC_F_CLASSES`], a class of 1 or
//! more reads its word from `CLASS_DECISIONS`, class 0 from `DECISIONS`. With
//! [`SVC_F_CLASSIFY`], a client with neither is reported in `UNKNOWN_CLIENTS`: at most
//! [`UNKNOWN_BURST`] records per CPU per [`RATE_WINDOW_TICKS`], and, since each record writes a
//! class-0 answer that lives [`UNKNOWN_HOLD_TICKS`], once per client until the classifier
//! answers or the placeholder expires.
//!
//! [`ClientAddr`]: crate::ClientAddr
//! [`ClientAnswer`]: crate::ClientAnswer
//! [`UnknownClient`]: crate::UnknownClient
//! [`class_prefix_len`]: crate::class_prefix_len
//! [`class_decision_index`]: crate::class_decision_index
//! [`class_stat_index`]: crate::class_stat_index
//! [`answer_live`]: crate::answer_live
//! [`MAX_CLASSES`]: crate::MAX_CLASSES
//! [`MAX_CLASS_PREFIXES`]: crate::MAX_CLASS_PREFIXES
//! [`CLASS_DECISIONS_SIZE`]: crate::CLASS_DECISIONS_SIZE
//! [`CLIENT_ANSWERS_SIZE`]: crate::CLIENT_ANSWERS_SIZE
//! [`UNKNOWN_CLIENTS_BYTES`]: crate::UNKNOWN_CLIENTS_BYTES
//! [`UNKNOWN_BURST`]: crate::UNKNOWN_BURST
//! [`UNKNOWN_HOLD_TICKS`]: crate::UNKNOWN_HOLD_TICKS
//! [`RATE_WINDOW_TICKS`]: crate::RATE_WINDOW_TICKS
//! [`CLASS_STAT_ANSWER`]: crate::CLASS_STAT_ANSWER
//! [`CLASS_STAT_UNKNOWN`]: crate::CLASS_STAT_UNKNOWN
//! [`CLASS_STAT_RING_SENT`]: crate::CLASS_STAT_RING_SENT
//! [`CLASS_STAT_RING_LIMITED`]: crate::CLASS_STAT_RING_LIMITED
//! [`CLASS_STAT_RING_FULL`]: crate::CLASS_STAT_RING_FULL
//! [`CLASS_STATS_ENTRIES`]: crate::CLASS_STATS_ENTRIES
//! [`SVC_F_CLASSES`]: crate::SVC_F_CLASSES
//! [`SVC_F_CLASSIFY`]: crate::SVC_F_CLASSIFY
//!
//! [`ServiceKey`]: crate::ServiceKey
//! [`Service`]: crate::Service
//! [`ServiceSlot`]: crate::ServiceSlot
//! [`filter_bit`]: crate::hash::filter_bit
//! [`FILTER_ENTRIES`]: crate::FILTER_ENTRIES
//! [`Decision`]: crate::Decision
//! [`Pool`]: crate::Pool
//! [`maglev_index`]: crate::maglev_index
//! [`Backend`]: crate::Backend
//! [`NextHop`]: crate::NextHop
//! [`next_hop_index`]: crate::next_hop_index
//! [`FlowKey`]: crate::FlowKey
//! [`FlowEntry`]: crate::FlowEntry
//! [`NatEntry`]: crate::NatEntry
//! [`FragKey`]: crate::FragKey
//! [`FragEntry`]: crate::FragEntry
//! [`Traffic`]: crate::Traffic
//! [`BackendSignals`]: crate::BackendSignals
//! [`Config`]: crate::Config
//! [`CachedFlow`]: crate::CachedFlow
//! [`TICK_SHIFT`]: crate::TICK_SHIFT
//! [`CLOCK_AGENT`]: crate::CLOCK_AGENT
//! [`CLOCK_OFFSET`]: crate::CLOCK_OFFSET
//! [`CLOCK_ENTRIES`]: crate::CLOCK_ENTRIES
//! [`VipKey`]: crate::VipKey
//! [`Vip`]: crate::Vip
//! [`MAX_VIPS`]: crate::MAX_VIPS
//! [`FLOW_CACHE_ENTRIES`]: crate::FLOW_CACHE_ENTRIES
//! [`Reason`]: crate::Reason
//! [`Reason::COUNT`]: crate::Reason::COUNT
//! [`MAX_SERVICES`]: crate::MAX_SERVICES
//! [`MAX_DECISIONS`]: crate::MAX_DECISIONS
//! [`MAX_POOLS`]: crate::MAX_POOLS
//! [`MAX_BACKENDS`]: crate::MAX_BACKENDS
//! [`CONNTRACK_SIZE`]: crate::CONNTRACK_SIZE
//! [`FRAGMENT_SIZE`]: crate::FRAGMENT_SIZE
//! [`MAX_TX_PORTS`]: crate::MAX_TX_PORTS

/// Services by `(virtual IP, port, protocol)`.
pub const SERVICES: &str = "SERVICES";
/// Services by slot, with their keys: what a tracked flow's slot still holds.
pub const SERVICE_SLOTS: &str = "SERVICE_SLOTS";
/// The filter of service keys and NAT reply sources.
pub const SERVICE_FILTER: &str = "SERVICE_FILTER";
/// Decision words.
pub const DECISIONS: &str = "DECISIONS";
/// Pools: live table half and flags.
pub const POOLS: &str = "POOLS";
/// All pools' double-buffered Maglev tables.
pub const MAGLEV: &str = "MAGLEV";
/// Backends by slot.
pub const BACKENDS: &str = "BACKENDS";
/// Each backend slot's next hop (egress interface and MACs).
pub const NEXT_HOPS: &str = "NEXT_HOPS";
/// Connection tracking.
pub const CONNTRACK: &str = "CONNTRACK";
/// NAT reply rewriting.
pub const NAT_REVERSE: &str = "NAT_REVERSE";
/// Fragmented datagrams in flight.
pub const FRAGMENTS: &str = "FRAGMENTS";
/// Redirect targets.
pub const TX_PORTS: &str = "TX_PORTS";
/// Packets and bytes by reason.
pub const REASON_STATS: &str = "REASON_STATS";
/// Packets and bytes by service and verdict.
pub const SVC_STATS: &str = "SVC_STATS";
/// Packets and bytes forwarded to each backend.
pub const BACKEND_STATS: &str = "BACKEND_STATS";
/// The ipip encapsulation program, tail-called by the data plane.
pub const IPIP_TX: &str = "IPIP_TX";
/// Generation, ABI version and flow timeouts.
pub const CONFIG: &str = "CONFIG";
/// Virtual IPs: what to do with their traffic that no service takes.
pub const VIPS: &str = "VIPS";
/// The program's clock: the agent's time, which it advances while it runs, and an offset a
/// test may add to age tracked flows without waiting.
pub const CLOCK: &str = "CLOCK";
/// Failure signals the program sees for each backend (RSTs it sent to a NAT client, SYNs
/// retransmitted to it), which the agent's circuit breakers count.
pub const BACKEND_SIGNALS: &str = "BACKEND_SIGNALS";

/// Client classes by prefix: the longest prefix of a client's address names its class.
pub const CLIENT_CLASSES: &str = "CLIENT_CLASSES";
/// The decision words of client classes, `MAX_CLASSES + 1` per decision slot.
pub const CLASS_DECISIONS: &str = "CLASS_DECISIONS";
/// A classifier's answers by client address, with an expiry.
pub const CLIENT_ANSWERS: &str = "CLIENT_ANSWERS";
/// New flows of clients with neither a class nor an answer, for the classifier.
pub const UNKNOWN_CLIENTS: &str = "UNKNOWN_CLIENTS";
/// New flows by class and side of the split; answer, unknown-client and ring counters.
pub const CLASS_STATS: &str = "CLASS_STATS";

/// The program's per-CPU flow cache (`CachedFlow` entries, `FLOW_CACHE_ENTRIES` per online
/// CPU): internal to one loaded program, like its scratch space. Not pinned and not in
/// [`ALL`]; the agent only sizes it at load.
pub const FLOW_CACHE: &str = "FLOW_CACHE";

/// Every map the program defines, for pinning and `switchyard maps`.
pub const ALL: [&str; 25] = [
    SERVICES,
    SERVICE_SLOTS,
    SERVICE_FILTER,
    DECISIONS,
    POOLS,
    MAGLEV,
    BACKENDS,
    NEXT_HOPS,
    CONNTRACK,
    NAT_REVERSE,
    FRAGMENTS,
    TX_PORTS,
    REASON_STATS,
    SVC_STATS,
    BACKEND_STATS,
    IPIP_TX,
    CONFIG,
    VIPS,
    CLOCK,
    BACKEND_SIGNALS,
    CLIENT_CLASSES,
    CLASS_DECISIONS,
    CLIENT_ANSWERS,
    UNKNOWN_CLIENTS,
    CLASS_STATS,
];

#[cfg(test)]
mod tests {
    #[test]
    fn names_fit_the_kernel_limit() {
        for name in super::ALL {
            assert!(name.len() <= 15, "{name} is longer than 15 bytes");
        }
    }
}
