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
//!
//! Not pinned and not part of the layout: `FLOW_CACHE`, the program's per-CPU copies of
//! `CONNTRACK` entries ([`CachedFlow`], [`FLOW_CACHE_ENTRIES`] per online CPU), and its
//! scratch space.
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

/// The program's per-CPU flow cache (`CachedFlow` entries, `FLOW_CACHE_ENTRIES` per online
/// CPU): internal to one loaded program, like its scratch space. Not pinned and not in
/// [`ALL`]; the agent only sizes it at load.
pub const FLOW_CACHE: &str = "FLOW_CACHE";

/// Every map the program defines, for pinning and `switchyard maps`.
pub const ALL: [&str; 20] = [
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
