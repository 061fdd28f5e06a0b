//! Backend selection: connection tracking first ([`tracked`]: the flow's entry carries what
//! forwarding needs, read through this CPU's flow cache), then, for a new flow, the service's
//! decision word and the chosen pool's live Maglev table ([`select`]).
//!
//! Connection tracking keeps each flow's protocol state and when it last sent a packet
//! (`FlowEntry`, router-common's `first_state`/`next_state`):
//! - a TCP SYN without ACK opens a new connection on any 5-tuple that is not an open one's
//!   (whose backend a duplicate SYN keeps). On a 5-tuple `CONNTRACK` does not hold, its choice
//!   is recorded only in this CPU's flow cache (`FLOW_F_FIRST`, in the set's second way), and
//!   the connection's next packet on this CPU writes it to `CONNTRACK` with that backend (a
//!   retransmitted SYN reuses the record): a SYN flood never writes `CONNTRACK`, so it never
//!   evicts a tracked flow. On a closing or idle connection's 5-tuple, the choice replaces its
//!   entry at once, so the next packet finds it on any CPU;
//! - any other packet of a flow `CONNTRACK` does not hold (a UDP flow's first, a TCP
//!   connection's after a SYN this CPU did not see or lost from its cache) tracks the flow at
//!   once;
//! - a FIN or an RST makes a TCP flow closing: its last packets still go to its backend, for
//!   the closing timeout;
//! - a flow idle past its state's timeout (`Config.timeouts`, in ticks of [`now`]) is a new
//!   flow again, selected from the current table. `seen` is rewritten at most every
//!   `SEEN_REFRESH` ticks.
//!
//! The flow cache (`FLOW_CACHE`, decision 0015) holds copies of `CONNTRACK` entries in
//! two-way sets of 64-byte entries, one region per CPU: a tracked packet costs a dozen
//! instructions of hashing and one cache line instead of the kernel's hash-map lookup. Its
//! invariants:
//! - a copy is never newer than `CONNTRACK` on this CPU: the program writes `CONNTRACK`, then
//!   the copy. A SYN's record is the one entry with no `CONNTRACK` counterpart;
//! - a tracked flow enters the cache with its first packet on a CPU that found it in
//!   `CONNTRACK` (so, for a flow tracked here, its second), into way 0; a SYN's record goes
//!   into way 1 (or over the flow's own entry): a SYN flood churns way 1 only;
//! - every [`FLOW_CACHE_LEASE`] packets of a flow on a CPU, its entry is read from `CONNTRACK`
//!   again (and kept recent in its LRU), so the copy follows rewrites by other CPUs, the agent
//!   and `bpftool` within that many packets. A flow `CONNTRACK` lost meanwhile (evicted, or
//!   deleted) is written back from the copy: a flow the cache still serves stays where it is,
//!   as it would have had its entry been kept recent. Every other check of a tracked packet
//!   (its service slot, its backend's state, its age) is made on every packet, as without the
//!   cache;
//! - a copy that no longer applies (its slot no longer holds the flow's service, its backend
//!   is not usable, it is idle past its timeout) is checked against `CONNTRACK` before the flow
//!   is re-selected: another CPU may have re-selected or refreshed it already;
//! - a copy is used only while its backend's generation (`Backend.generation`, which the agent
//!   changes with every change of the slot's state, address or family) is the one it was made under: a flow that
//!   another CPU re-selected while its backend was down is read from `CONNTRACK` again here
//!   when the backend returns;
//! - when both ways hold one flow, way 0 holds the newer copy and is read first;
//! - an entry is written family word last, after it was made unmatchable, so a reader never
//!   takes a half-written key for a flow.

use aya_ebpf::helpers::generated::bpf_get_smp_processor_id;
use router_common::{
    Backend, CLOCK_AGENT, CLOCK_OFFSET, CachedFlow, Decision, FAMILY_V6, FATE_KEEP, FATE_RESET,
    FILTER_F_NAT, FILTER_FLAGS, FILTER_NAT_REPLY, FILTER_SERVICE, FILTER_WORDS, FLOW_CACHE_ENTRIES,
    FLOW_CACHE_LEASE, FLOW_CACHE_WAYS, FLOW_F_FIRST, FLOW_STATE_MASK, FLOW_STATES,
    FLOW_TCP_CLOSING, FLOW_TCP_SYN, FlowEntry, FlowKey, MAGLEV_LANES, MAGLEV_SIZE, MAX_POOLS,
    NO_BACKEND, NO_POOL, POOL_F_ALL_DOWN_PASS, POOL_F_LEFT_CHANCE, POOL_F_SECOND_CHANCE, PROTO_TCP,
    Reason, SEEN_REFRESH, SVC_F_CLASSES, SVC_F_CLASSIFY, SVC_F_HASH_SOURCE, SVC_F_SPLIT_CLIENT,
    SVC_F_SPLIT_PREFIX, Service, TICK_SHIFT, class_decision_index, class_stat_index, expired,
    first_state, flow_hash,
    hash::{client_split_point, filter_bit_words, flow_cache_set},
    keeps_flows, maglev_backend, maglev_index, next_state, opens, source_hash, tracked_fate,
};

use crate::maps::{
    BACKEND_SIGNALS, BACKENDS, CLASS_DECISIONS, CLOCK, CONFIG, CONNTRACK, DECISIONS, FLOW_CACHE,
    MAGLEV, POOLS, SERVICE_FILTER, SERVICE_SLOTS,
};

/// A chosen backend.
pub struct Choice {
    /// Backend slot.
    pub id: u32,
    /// Its entry (a copy: the agent may rewrite the slot while we forward).
    pub backend: Backend,
    /// How it was chosen: `NewFlow`, `ConntrackHit`, `Reselected` or `FallbackPool`.
    pub reason: Reason,
}

/// The backend in `slot`, if it is up or draining (flags ignored): where a new flow may go.
#[inline(always)]
pub fn usable_backend(slot: u32) -> Option<Backend> {
    let b = BACKENDS.get(slot)?;
    if keeps_flows(b.state) { Some(*b) } else { None }
}

/// The backend in `slot`, if it keeps its tracked flows (`tracked_fate`): where the later
/// fragments of a datagram whose first fragment it took still go.
#[inline(always)]
pub fn keeping_backend(slot: u32) -> Option<Backend> {
    let b = BACKENDS.get(slot)?;
    if tracked_fate(b.state) == FATE_KEEP {
        Some(*b)
    } else {
        None
    }
}

/// The backend the live Maglev table of `pool` holds for `hash`, or `NO_BACKEND`.
#[inline(always)]
fn maglev_lookup(pool: u16, hash: u32) -> u32 {
    let pool = u32::from(pool);
    if pool >= MAX_POOLS {
        return NO_BACKEND;
    }
    let Some(p) = POOLS.get(pool) else {
        return NO_BACKEND;
    };
    let at = maglev_index(pool, p.active, hash % MAGLEV_SIZE);
    match MAGLEV.get(at / MAGLEV_LANES) {
        Some(lanes) => maglev_backend(lanes[(at % MAGLEV_LANES) as usize]),
        None => NO_BACKEND,
    }
}

/// The backend the previous Maglev table of `pool` holds for `hash`, while the pool gives a
/// second chance (`POOL_F_SECOND_CHANCE`: its inactive half is the table the last flip replaced)
/// and that backend keeps tracked flows (up or draining); else `None`.
#[inline(always)]
fn second_chance(pool: u16, hash: u32) -> Option<u32> {
    let pool = u32::from(pool);
    if pool >= MAX_POOLS {
        return None;
    }
    let p = POOLS.get(pool)?;
    if p.flags & POOL_F_SECOND_CHANCE == 0 {
        return None;
    }
    let at = maglev_index(pool, p.active ^ 1, hash % MAGLEV_SIZE);
    let id = maglev_backend(MAGLEV.get(at / MAGLEV_LANES)?[(at % MAGLEV_LANES) as usize]);
    usable_backend(id).map(|_| id)
}

/// The backend the live Maglev table of `pool` holds for `hash`, while a decision group that
/// left `pool` gives it a second chance (`POOL_F_LEFT_CHANCE`) and that backend keeps tracked
/// flows (up or draining); else `None`.
#[inline(always)]
fn left_chance(pool: u16, hash: u32) -> Option<u32> {
    let pool = u32::from(pool);
    if pool >= MAX_POOLS {
        return None;
    }
    let p = POOLS.get(pool)?;
    if p.flags & POOL_F_LEFT_CHANCE == 0 {
        return None;
    }
    let at = maglev_index(pool, p.active, hash % MAGLEV_SIZE);
    let id = maglev_backend(MAGLEV.get(at / MAGLEV_LANES)?[(at % MAGLEV_LANES) as usize]);
    usable_backend(id).map(|_| id)
}

/// An address of a flow as four native-order words, loaded as words.
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the flow's addresses are 4-aligned: `FlowKey` sits 8-aligned in the scratch map \
              (parse.rs), its addresses at offsets 0 and 16"
)]
fn addr_words(a: &[u8; 16]) -> [u32; 4] {
    // SAFETY: 16 readable, 4-aligned bytes (see above); every bit pattern is a valid u32.
    unsafe { core::ptr::read(core::ptr::from_ref(a).cast::<[u32; 4]>()) }
}

/// An address of the flow being processed as two native-order words, loaded as words
/// (`router_common::hash::addr_pair`).
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the flow's addresses are 8-aligned: `FlowKey` sits 8-aligned in the scratch map \
              (parse.rs), its addresses at offsets 0 and 16"
)]
pub(crate) fn addr_pair(a: &[u8; 16]) -> [u64; 2] {
    // Volatile: two 64-bit loads of the key in place, as wide as the stores that wrote it
    // (`parse::set_flow`), rather than a copy through the stack.
    // SAFETY: 16 readable, 8-aligned bytes (see above); every bit pattern is a valid u64.
    let p = core::ptr::from_ref(a).cast::<u64>();
    unsafe {
        [
            core::ptr::read_volatile(p),
            core::ptr::read_volatile(p.add(1)),
        ]
    }
}

/// Whether bit `bit` of `SERVICE_FILTER` is set.
#[inline(always)]
pub(crate) fn filter_has(bit: u32) -> bool {
    match SERVICE_FILTER.get((bit / 64) % FILTER_WORDS) {
        Some(w) => (*w >> (bit % 64)) & 1 != 0,
        None => false,
    }
}

/// Whether `flow` may be for a service: its destination, port, protocol and family are in the
/// filter. `false` is certain; `true` may be a false positive.
#[inline(always)]
pub fn may_be_service(flow: &FlowKey) -> bool {
    filter_has(filter_bit_words(
        addr_pair(&flow.dst),
        flow.dport,
        flow.proto,
        flow.family,
        FILTER_SERVICE,
    ))
}

/// Whether `flow` may be a NAT backend's reply: some NAT service is published and the flow's
/// source, port, protocol and family are in the filter. `false` is certain; `true` may be a
/// false positive.
#[inline(always)]
pub fn may_be_nat_reply(flow: &FlowKey) -> bool {
    let nat = match SERVICE_FILTER.get(FILTER_FLAGS) {
        Some(w) => *w & FILTER_F_NAT != 0,
        None => false,
    };
    nat && filter_has(filter_bit_words(
        addr_pair(&flow.src),
        flow.sport,
        flow.proto,
        flow.family,
        FILTER_NAT_REPLY,
    ))
}

/// Whether `slot`'s service is the one `flow` addresses: its key is the flow's destination,
/// port, protocol and family. Compared as five words (the key's 16 address bytes, then port,
/// protocol and family).
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "map values are 8-aligned, and the key opens the `ServiceSlot` value"
)]
fn slot_serves(slot: &router_common::ServiceSlot, flow: &FlowKey) -> bool {
    // SAFETY: the key is 20 readable bytes at the start of an 8-aligned map value.
    let k = unsafe { core::ptr::read(core::ptr::from_ref(&slot.key).cast::<[u32; 5]>()) };
    let d = addr_words(&flow.dst);
    let tail =
        u32::from(flow.dport) | (u32::from(flow.proto) << 16) | (u32::from(flow.family) << 24);
    (k[0] ^ d[0]) | (k[1] ^ d[1]) | (k[2] ^ d[2]) | (k[3] ^ d[3]) | (k[4] ^ tail) == 0
}

/// Why a packet's flow needs a backend chosen, and what its choice is recorded as.
#[derive(Clone, Copy)]
pub struct Miss {
    /// The flow is tracked and its entry no longer applies (its backend is not usable, or its
    /// service slot holds another service): the new choice goes to `CONNTRACK` at once. Else
    /// the packet is a new flow's first (or a flow's whose tracking ended), recorded in this
    /// CPU's flow cache only.
    pub reselect: bool,
    /// `CONNTRACK` holds an entry for the 5-tuple that this choice replaces (a re-selected
    /// flow's, or a closing or idle connection's whose 5-tuple a SYN reuses): the choice is
    /// written over it at once, so the connection's next packet follows it on any CPU.
    pub replace: bool,
    /// The flow's state with this packet (`FLOW_*`).
    pub state: u8,
    /// Index in `FLOW_CACHE` of way 0 of the flow's set on this CPU ([`cache_index`]).
    pub at: u32,
    /// The service slot of a tracked TCP flow whose backend resets its flows: the packet is
    /// answered with an RST, and no backend is chosen. [`NO_RESET`] otherwise.
    pub reset: u32,
}

/// [`Miss::reset`] of a packet that is not reset.
pub const NO_RESET: u32 = u32::MAX;

/// The program's clock: `(CLOCK[CLOCK_AGENT] + CLOCK[CLOCK_OFFSET]) >> TICK_SHIFT`, in ticks
/// of about a millisecond, wrapping (`router_common::TICK_SHIFT`). Two array reads and no
/// helper call (decision 0021): the agent advances the clock every 100 ms, and it stands still
/// while no agent runs.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the clock is kept as a wrapping u32 of ticks; ages are wrapping differences"
)]
pub fn now() -> u32 {
    let agent = CLOCK.get(CLOCK_AGENT).copied().unwrap_or(0);
    let offset = CLOCK.get(CLOCK_OFFSET).copied().unwrap_or(0);
    (agent.wrapping_add(offset) >> TICK_SHIFT) as u32
}

/// The flow timeouts the agent wrote (`Config.timeouts`, ticks; 0 is the default).
#[inline(always)]
fn timeouts() -> [u32; FLOW_STATES] {
    CONFIG.get(0).map_or([0; FLOW_STATES], |c| c.timeouts)
}

/// A tracked flow, forwarded on its conntrack entry alone: the backend it had, and the service
/// its slot holds. The packet (TCP flags `tcp`, 0 for UDP, at time `now`) moves the flow's
/// state and refreshes its `seen`, unless `update` is false (an ICMP error quoting the flow).
///
/// `Err` when a backend must be chosen ([`Miss`]): the flow has no entry, its entry expired, the
/// packet opens a connection, or its entry no longer applies (`reselect`); or when the packet
/// is to be answered with an RST (`reset`: its backend resets its flows; the flow is closing).
#[inline(always)]
pub fn tracked(
    flow: &FlowKey,
    tcp: u32,
    now: u32,
    update: bool,
) -> Result<(Service, Choice), Miss> {
    let w = key_words(flow);
    let at = cache_index(&w);
    let new = Miss {
        reselect: false,
        replace: false,
        state: first_state(flow.proto, tcp),
        at,
        reset: NO_RESET,
    };
    let timeouts = timeouts();
    let way = cache_way(at, &w);
    if let Some(e) = way {
        // SAFETY: a map value of this CPU's region (see `cache_write`).
        let copy = unsafe { (*e).entry };
        if copy.state & FLOW_F_FIRST != 0 {
            return first_again(flow, e, &w, copy, tcp, now, update, &timeouts).ok_or(new);
        }
    }
    if opens(tcp) {
        return syn(flow, now, &timeouts, new);
    }
    let Some((mut entry, mut cached)) = flow_entry(flow, way, at, &w) else {
        return Err(new);
    };
    if expired(entry.seen, entry.state, now, &timeouts) {
        // Another CPU may have seen the flow since this copy was made.
        let fresh = if cached { conntrack_entry(flow) } else { None };
        match fresh {
            Some(f) if !expired(f.seen, f.state, now, &timeouts) => {
                entry = f;
                cached = false;
                fill_at(at, &w, f);
            }
            _ => return Err(new),
        }
    }
    let reselect = Miss {
        reselect: true,
        replace: true,
        state: next_state(entry.state, tcp),
        at,
        reset: NO_RESET,
    };
    let hit = if let Some(hit) = applies(flow, entry, false) {
        hit
    } else {
        // A copy that no longer applies may be older than conntrack: another CPU may have
        // re-selected the flow. Conntrack decides, and the copy follows it.
        let fresh = if cached { conntrack_entry(flow) } else { None };
        let Some(f) = fresh else {
            return Err(reselect);
        };
        if f.backend == entry.backend && f.service == entry.service {
            return Err(reselect);
        }
        let hit = applies(flow, f, false).ok_or(reselect)?;
        entry = f;
        fill_at(at, &w, f);
        hit
    };
    // A reset flow is closing: its later packets are answered alike, until a SYN replaces it.
    let reset = tracked_fate(hit.1.backend.state) == FATE_RESET;
    let state = if reset {
        FLOW_TCP_CLOSING
    } else {
        next_state(entry.state, tcp)
    };
    if update && (state != entry.state || now.wrapping_sub(entry.seen) >= SEEN_REFRESH) {
        entry.state = state;
        entry.seen = now;
        refresh(flow, at, &w, entry);
    }
    if reset {
        return Err(Miss {
            reset: hit.0.id,
            ..reselect
        });
    }
    Ok(hit)
}

/// A SYN this CPU holds no record of, against `CONNTRACK`'s entry for its 5-tuple. An open
/// connection within its timeout whose entry applies keeps its backend: the SYN is a duplicate
/// or forged, and a live connection is never moved by one. Without an entry, the SYN is a new
/// flow (`new`), recorded on this CPU only. Any other entry (a closing or idle connection's, or
/// one whose backend is not usable) is replaced by the new connection at once: its next packet
/// may reach another CPU, and must not find the old connection's backend there.
#[inline(always)]
fn syn(
    flow: &FlowKey,
    now: u32,
    timeouts: &[u32; FLOW_STATES],
    new: Miss,
) -> Result<(Service, Choice), Miss> {
    let Some(x) = conntrack_entry(flow) else {
        return Err(new);
    };
    if x.state & FLOW_STATE_MASK != FLOW_TCP_CLOSING
        && !expired(x.seen, x.state, now, timeouts)
        && let Some(hit) = applies(flow, x, true)
    {
        return Ok(hit);
    }
    Err(Miss {
        replace: true,
        ..new
    })
}

/// A packet of a flow whose first packet this CPU recorded (`copy`, in cache entry `e`): the
/// same backend while the record is within its timeout and applies. A repeated opening packet
/// (a retransmitted SYN) leaves it a record; any other packet (with `update`) tracks the flow in
/// `CONNTRACK` and makes the record its copy. `None`: the flow is new again.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "inlined into `tracked`, whose locals these are"
)]
fn first_again(
    flow: &FlowKey,
    e: *mut CachedFlow,
    w: &[u64; 5],
    copy: FlowEntry,
    tcp: u32,
    now: u32,
    update: bool,
    timeouts: &[u32; FLOW_STATES],
) -> Option<(Service, Choice)> {
    let applied = if expired(copy.seen, copy.state, now, timeouts) {
        None
    } else {
        applies(flow, copy, true)
    };
    let Some((svc, mut choice)) = applied else {
        // A record that no longer applies is dropped: the flow's next packets are selected,
        // and tracked, afresh.
        // SAFETY: a map value of this CPU's region (see `cache_write`).
        unsafe { core::ptr::write_volatile(words(e).add(4), 0) };
        return None;
    };
    if opens(tcp) || !update {
        if opens(tcp) && update && now.wrapping_sub(copy.seen) >= SYN_RETRANSMIT_TICKS {
            // The connection's SYN got no answer through this CPU within a retransmission
            // timeout: one signal, and the record's time moves on, so SYNs repeated faster
            // than a client's retransmission timer (a forged burst) count once a second.
            signal(copy.backend, Signal::SynRetransmit);
            cache_set_entry(e, FlowEntry { seen: now, ..copy });
        }
        choice.reason = Reason::NewFlow;
        return Some((svc, choice));
    }
    let entry = FlowEntry {
        seen: now,
        state: next_state(copy.state, tcp),
        ..copy
    };
    if CONNTRACK.insert(flow, entry, BPF_NOEXIST).is_err() {
        // `CONNTRACK` holds this 5-tuple. An open flow there that still applies keeps its
        // backend: the SYN was a duplicate or forged, and a live connection is never moved by
        // one. A closing or expired one is replaced by the new connection.
        if let Some(x) = conntrack_entry(flow)
            && x.state & FLOW_STATE_MASK != FLOW_TCP_CLOSING
            && !expired(x.seen, x.state, now, timeouts)
            && let Some(hit) = applies(flow, x, true)
        {
            cache_write(e, w, entry_words(x), hits_word(hit.1.backend.generation));
            return Some(hit);
        }
        // A failed insert (map full of pinned entries) leaves the flow untracked: its next
        // packet finds the record again and tries once more.
        if CONNTRACK.insert(flow, entry, 0).is_err() {
            return Some((svc, choice));
        }
    }
    cache_write(
        e,
        w,
        entry_words(entry),
        hits_word(choice.backend.generation),
    );
    Some((svc, choice))
}

/// Ticks (about 0.94 s) between a SYN's record and a repeat of it counted as a retransmission:
/// a client's first retransmission comes after its initial RTO, 1 s (RFC 6298 §2.1).
const SYN_RETRANSMIT_TICKS: u32 = 900;

/// A failure signal the program counts for a backend (`BACKEND_SIGNALS`).
#[derive(Clone, Copy)]
pub enum Signal {
    /// The backend reset a NAT connection.
    Rst,
    /// A SYN to the backend was retransmitted.
    SynRetransmit,
}

/// Counts `signal` for backend slot `backend` on this CPU.
#[inline(always)]
pub fn signal(backend: u32, signal: Signal) {
    if let Some(s) = BACKEND_SIGNALS.get_ptr_mut(backend) {
        // SAFETY: a per-CPU slot: no other writer while this program runs on this CPU.
        unsafe {
            match signal {
                Signal::Rst => (*s).rsts += 1,
                Signal::SynRetransmit => (*s).syn_retransmits += 1,
            }
        }
    }
}

/// The service and backend a tracked flow's entry sends it to, if the entry still applies: its
/// service slot holds the flow's key and its backend keeps its tracked flows
/// (`router_common::tracked_fate`). A TCP flow on a backend whose tracked flows are reset
/// applies too (`tracked` has the caller answer it with an RST), unless the packet
/// may open a connection (`opening`: a new connection is selected afresh, never reset, and
/// never kept on a backend that is down or evicted whatever its flag says); a UDP
/// flow there, or any flow on a backend whose flows migrate, does not apply (it is
/// re-selected).
#[inline(always)]
fn applies(flow: &FlowKey, entry: FlowEntry, opening: bool) -> Option<(Service, Choice)> {
    let slot = SERVICE_SLOTS.get(entry.service)?;
    if !slot_serves(slot, flow) {
        return None;
    }
    let svc = slot.service;
    let id = entry.backend;
    let b = BACKENDS.get(id)?;
    // A connection being opened (a SYN, or a first-packet record) goes only to a backend that
    // takes flows: the keep flag of a down backend is for established flows.
    if opening && !keeps_flows(b.state) {
        return None;
    }
    let fate = tracked_fate(b.state);
    if fate != FATE_KEEP && (fate != FATE_RESET || opening || flow.proto != PROTO_TCP) {
        return None;
    }
    Some((
        svc,
        Choice {
            id,
            backend: *b,
            reason: Reason::ConntrackHit,
        },
    ))
}

/// Chooses a backend for flow `flow` of `svc` ([`Miss`] says why) through the service's
/// decision word and the chosen pool's live Maglev table. With `track`, the choice is recorded:
/// a re-selected flow's in `CONNTRACK` and this CPU's cache; a SYN's as a first-packet record
/// in this CPU's cache (in `CONNTRACK` at once on a CPU without a cache); any other new flow's
/// in `CONNTRACK`. ICMP errors look up without recording.
///
/// The word: with `SVC_F_CLASSES`, a client of class 1 or more ([`crate::class::of`]) reads
/// its class's word in `CLASS_DECISIONS`, any other the service's in `DECISIONS`. The split
/// point: from the client's address (or network) under `SVC_F_SPLIT_CLIENT`, else from the flow
/// hash. A new flow (`track`, not re-selected) of a service with a class flag is counted in
/// `CLASS_STATS` by class and side, with `bytes` (the packet's length); under `SVC_F_CLASSIFY`
/// an unknown client is reported.
///
/// Errors: `NoBackend` / `AllDownPass` when no pool has a usable backend (by the primary pool's
/// `when_all_down`), `BadState` when the service's decision slot (or its class's) is missing.
#[inline(always)]
pub fn select(
    flow: &FlowKey,
    svc: &Service,
    track: bool,
    miss: Miss,
    now: u32,
    bytes: u64,
) -> Result<Choice, Reason> {
    let mut reason = if miss.reselect {
        Reason::Reselected
    } else {
        Reason::NewFlow
    };
    let hash = if svc.flags & SVC_F_HASH_SOURCE != 0 {
        source_hash(&flow.src)
    } else {
        flow_hash(flow)
    };
    let (decision, pool) = pick(flow, svc, hash, track && !miss.reselect, now, bytes)?;
    let mut id = maglev_lookup(pool, hash);
    if track
        && flow.proto == PROTO_TCP
        && !miss.reselect
        && !miss.replace
        && miss.state != FLOW_TCP_SYN
    {
        // The pool's previous table first (its table changed), then the pool the group left
        // (the decision changed): each only while the agent keeps its flag set.
        let previous = match second_chance(pool, hash) {
            Some(previous) => Some(previous),
            None if decision.fallback != NO_POOL && decision.fallback != pool => {
                left_chance(decision.fallback, hash)
            }
            None => None,
        };
        if let Some(previous) = previous
            && previous != id
        {
            id = previous;
            reason = Reason::SecondChance;
        }
    }
    if id == NO_BACKEND && decision.fallback != NO_POOL {
        id = maglev_lookup(decision.fallback, hash);
        reason = Reason::FallbackPool;
    }
    let Some(backend) = (if id == NO_BACKEND {
        None
    } else {
        usable_backend(id)
    }) else {
        let pass = match POOLS.get(u32::from(pool)) {
            Some(p) => p.flags & POOL_F_ALL_DOWN_PASS != 0,
            None => false,
        };
        return Err(if pass {
            Reason::AllDownPass
        } else {
            Reason::NoBackend
        });
    };
    if track {
        let mut entry = FlowEntry {
            backend: id,
            service: svc.id,
            seen: now,
            state: miss.state,
            _pad: [0; 3],
        };
        let w = key_words(flow);
        if miss.replace {
            // A failed insert (map full of pinned entries) only costs stickiness for this flow.
            if CONNTRACK.insert(flow, entry, 0).is_ok() {
                fill_at(miss.at, &w, entry);
            } else {
                forget_at(miss.at, &w);
            }
        } else if miss.state == FLOW_TCP_SYN {
            entry.state |= FLOW_F_FIRST;
            if !first_at(miss.at, &w, entry, backend.generation) {
                let _ = CONNTRACK.insert(
                    flow,
                    FlowEntry {
                        state: miss.state,
                        ..entry
                    },
                    0,
                );
            }
        } else {
            // Tracked at once; it enters this CPU's cache with its next packet here.
            let _ = CONNTRACK.insert(flow, entry, 0);
        }
    }
    Ok(Choice {
        id,
        backend,
        reason,
    })
}

/// The decision word of a new flow of `svc` and the pool it picks (`hash`: the flow's, for a
/// split by flow): with `SVC_F_CLASSES`, a client of class 1 or more takes its class's word in
/// `CLASS_DECISIONS`, any other the service's in `DECISIONS`; under `SVC_F_SPLIT_CLIENT` the
/// split point is the client's (or its network's). A `new` flow (tracked, not re-selected) of a
/// service with a class flag is counted in `CLASS_STATS` (`bytes`: the packet's length), and
/// may report its client ([`crate::class::of`]).
#[inline(always)]
fn pick(
    flow: &FlowKey,
    svc: &Service,
    hash: u32,
    new: bool,
    now: u32,
    bytes: u64,
) -> Result<(Decision, u16), Reason> {
    let flags = svc.flags;
    let mut word = *DECISIONS.get(svc.decision).ok_or(Reason::BadState)?;
    let classed = flags & (SVC_F_CLASSES | SVC_F_CLASSIFY) != 0;
    let mut class = 0;
    if classed {
        class = crate::class::of(flow, now, new, new && flags & SVC_F_CLASSIFY != 0, bytes);
        if class != 0 && flags & SVC_F_CLASSES != 0 {
            word = *CLASS_DECISIONS
                .get(class_decision_index(svc.decision, class))
                .ok_or(Reason::BadState)?;
        }
    }
    let decision = Decision::decode(word);
    let pool = if flags & SVC_F_SPLIT_CLIENT == 0 {
        decision.pick(hash)
    } else {
        decision.pick_at(client_split_point(
            &flow.src,
            flow.family == FAMILY_V6,
            flags & SVC_F_SPLIT_PREFIX != 0,
        ))
    };
    if classed && new {
        let side = u32::from(pool != decision.pool_a);
        crate::class::add(class_stat_index(class, side), bytes);
    }
    Ok((decision, pool))
}

/// A flow key as five 64-bit words, loaded as words (`router_common::hash::flow_words`).
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the flow being processed is 8-aligned: `FlowKey` opens `Packet.flow` at offset 16 \
              of the scratch map's value (parse.rs)"
)]
pub fn key_words(flow: &FlowKey) -> [u64; 5] {
    // SAFETY: 40 readable, 8-aligned bytes (see above); every bit pattern is a valid u64.
    unsafe { core::ptr::read(core::ptr::from_ref(flow).cast::<[u64; 5]>()) }
}

/// Index in `FLOW_CACHE` of way 0 of the set of the flow with key words `w`, in this CPU's
/// region.
#[inline(always)]
fn cache_index(w: &[u64; 5]) -> u32 {
    // SAFETY: a helper without arguments; XDP runs with migration disabled, so the CPU is the
    // one this program runs on until it returns.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    cpu.wrapping_mul(FLOW_CACHE_ENTRIES)
        .wrapping_add(flow_cache_set(*w) * FLOW_CACHE_WAYS)
}

/// Cache entry `e` as its eight 64-bit words (key 0–4, entry 5–6, hit count and backend
/// generation 7).
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "map values are 8-aligned (and the cache's page-aligned), though `CachedFlow` \
              alone is 4-aligned"
)]
fn words(e: *mut CachedFlow) -> *mut u64 {
    e.cast::<u64>()
}

/// Whether cache entry `e` holds the flow with key words `w`.
#[inline(always)]
fn holds(e: *mut CachedFlow, w: &[u64; 5]) -> bool {
    // SAFETY: `e` is a map value, 8-aligned, and its key is its first 40 bytes.
    let k = unsafe { core::ptr::read(words(e).cast::<[u64; 5]>()) };
    (k[0] ^ w[0]) | (k[1] ^ w[1]) | (k[2] ^ w[2]) | (k[3] ^ w[3]) | (k[4] ^ w[4]) == 0
}

/// The way of the set at `at` that holds the flow with key words `w`, if one does (way 0 first).
#[inline(always)]
fn cache_way(at: u32, w: &[u64; 5]) -> Option<*mut CachedFlow> {
    let mut way = 0;
    while way < FLOW_CACHE_WAYS {
        let e = FLOW_CACHE.get_ptr_mut(at + way)?;
        if holds(e, w) {
            return Some(e);
        }
        way += 1;
    }
    None
}

/// A `FlowEntry` as the two 64-bit words it is stored as in the cache.
#[inline(always)]
fn entry_words(entry: FlowEntry) -> [u64; 2] {
    // SAFETY: `FlowEntry` is 16 bytes without implicit padding (its `_pad` is a field).
    unsafe { core::mem::transmute::<FlowEntry, [u64; 2]>(entry) }
}

/// The generation of backend slot `id` (`Backend.generation`); 0 for a slot past the map.
#[inline(always)]
fn backend_generation(id: u32) -> u32 {
    BACKENDS.get(id).map_or(0, |b| b.generation)
}

/// Word 7 of a cache entry: no hits, and the backend generation `generation`.
#[inline(always)]
fn hits_word(generation: u32) -> u64 {
    // SAFETY: two `u32` are eight bytes; `CachedFlow.hits` comes first (offset 56), then
    // `generation` (offset 60).
    unsafe { core::mem::transmute::<[u32; 2], u64>([0, generation]) }
}

/// Writes cache entry `e`: key words `w`, `entry` (two words), no hits, backend generation in
/// `word7` ([`hits_word`]). The family word (the key's last) is cleared first and written last,
/// so the entry matches no flow until it is whole.
#[inline(always)]
fn cache_write(e: *mut CachedFlow, w: &[u64; 5], entry: [u64; 2], word7: u64) {
    let p = words(e);
    // SAFETY: `e` is a 64-byte map value of this CPU's region: words 0–4 are the key, 5–6 the
    // entry, 7 the hit count and backend generation.
    unsafe {
        core::ptr::write_volatile(p.add(4), 0);
        core::ptr::write_volatile(p, w[0]);
        core::ptr::write_volatile(p.add(1), w[1]);
        core::ptr::write_volatile(p.add(2), w[2]);
        core::ptr::write_volatile(p.add(3), w[3]);
        core::ptr::write_volatile(p.add(5), entry[0]);
        core::ptr::write_volatile(p.add(6), entry[1]);
        core::ptr::write_volatile(p.add(7), word7);
        core::ptr::write_volatile(p.add(4), w[4]);
    }
}

/// Rewrites the entry words of cache entry `e` (not its key, hits or generation).
#[inline(always)]
fn cache_set_entry(e: *mut CachedFlow, entry: FlowEntry) {
    let [a, b] = entry_words(entry);
    // SAFETY: a map value of this CPU's region (see `cache_write`).
    unsafe {
        core::ptr::write_volatile(words(e).add(5), a);
        core::ptr::write_volatile(words(e).add(6), b);
    }
}

/// Records tracked `entry` for the flow with key words `w` in the set whose way 0 is at `at`:
/// over the flow's copy if the set holds one, else in way 0, after way 0's flow moved to way 1
/// (the set's older flow leaves).
#[inline(always)]
fn fill_at(at: u32, w: &[u64; 5], entry: FlowEntry) {
    let (Some(w0), Some(w1)) = (FLOW_CACHE.get_ptr_mut(at), FLOW_CACHE.get_ptr_mut(at + 1)) else {
        return;
    };
    let word7 = hits_word(backend_generation(entry.backend));
    let entry = entry_words(entry);
    if holds(w1, w) && !holds(w0, w) {
        cache_write(w1, w, entry, word7);
        return;
    }
    if !holds(w0, w) {
        // SAFETY: way 0 is a 64-byte map value of this CPU's region (see `cache_write`).
        let (k, e, h) = unsafe {
            (
                core::ptr::read(words(w0).cast::<[u64; 5]>()),
                [
                    core::ptr::read_volatile(words(w0).add(5)),
                    core::ptr::read_volatile(words(w0).add(6)),
                ],
                core::ptr::read_volatile(words(w0).add(7)),
            )
        };
        cache_write(w1, &k, e, h);
    }
    cache_write(w0, w, entry, word7);
}

/// Records a first packet's `entry` (with `FLOW_F_FIRST`) for the flow with key words `w` in
/// the set whose way 0 is at `at`: over the flow's own entry if the set holds one, else in
/// way 1, so first packets never displace way 0. `false` on a CPU without a cache.
#[inline(always)]
fn first_at(at: u32, w: &[u64; 5], entry: FlowEntry, generation: u32) -> bool {
    let (Some(w0), Some(w1)) = (FLOW_CACHE.get_ptr_mut(at), FLOW_CACHE.get_ptr_mut(at + 1)) else {
        return false;
    };
    let e = if holds(w0, w) { w0 } else { w1 };
    cache_write(e, w, entry_words(entry), hits_word(generation));
    true
}

/// Empties the cache entry of the flow with key words `w` in the set at `at`, if it has one.
#[inline(always)]
fn forget_at(at: u32, w: &[u64; 5]) {
    if let Some(e) = cache_way(at, w) {
        // SAFETY: a map value of this CPU's region (see `cache_write`).
        unsafe { core::ptr::write_volatile(words(e).add(4), 0) };
    }
}

/// Writes a tracked flow's new `seen` and state to `CONNTRACK` in place (a flow it lost
/// meanwhile is tracked again with `entry`), then to this CPU's copy.
#[inline(always)]
fn refresh(flow: &FlowKey, at: u32, w: &[u64; 5], entry: FlowEntry) {
    match CONNTRACK.get_ptr_mut(flow) {
        // SAFETY: a map value; `seen` and `state` are each one aligned store, so a reader
        // sees the old or the new value of each (and either pair is a valid entry).
        // A closing flow stays closing: a copy older than another CPU's FIN does not reopen it.
        Some(c) => unsafe {
            core::ptr::write_volatile(&raw mut (*c).seen, entry.seen);
            if (*c).state & FLOW_STATE_MASK != FLOW_TCP_CLOSING {
                core::ptr::write_volatile(&raw mut (*c).state, entry.state);
            }
        },
        None => {
            let _ = CONNTRACK.insert(flow, entry, BPF_NOEXIST);
        }
    }
    if let Some(e) = cache_way(at, w) {
        cache_set_entry(e, entry);
    }
}

/// `CONNTRACK`'s entry of `flow`, if it has one.
#[inline(always)]
fn conntrack_entry(flow: &FlowKey) -> Option<FlowEntry> {
    // SAFETY: a map value, copied out.
    CONNTRACK.get_ptr(flow).map(|c| unsafe { *c })
}

/// `BPF_NOEXIST`: a map update that creates the entry only.
const BPF_NOEXIST: u64 = 1;

/// The conntrack entry of tracked `flow` (key words `w`, set at `at`, `way` the cache entry
/// holding it if any), through this CPU's flow cache, and whether it is the cached copy: the
/// copy while its lease lasts and its backend's generation is unchanged, else `CONNTRACK`'s
/// (which refills the cache). A copy whose lease ended and whose flow `CONNTRACK` lost is
/// written back there; a stale copy whose flow `CONNTRACK` lost is emptied, and the flow is
/// selected again.
#[inline(always)]
fn flow_entry(
    flow: &FlowKey,
    way: Option<*mut CachedFlow>,
    at: u32,
    w: &[u64; 5],
) -> Option<(FlowEntry, bool)> {
    let Some(e) = way else {
        let entry = conntrack_entry(flow)?;
        fill_at(at, w, entry);
        return Some((entry, false));
    };
    // SAFETY: a map value of this CPU's region (see `cache_write`).
    unsafe {
        let hits = (*e).hits + 1;
        let copy = (*e).entry;
        let current = (*e).generation == backend_generation(copy.backend);
        if hits < FLOW_CACHE_LEASE && current {
            (*e).hits = hits;
            return Some((copy, true));
        }
        let entry = match conntrack_entry(flow) {
            Some(c) => c,
            // A flow the cache serves lost its conntrack entry (evicted, or deleted by
            // another writer): it stays where it is and is tracked again, unless another
            // CPU tracked it meanwhile (then that entry holds).
            None if current => match CONNTRACK.insert(flow, copy, BPF_NOEXIST) {
                Ok(()) => copy,
                Err(_) => conntrack_entry(flow)?,
            },
            None => {
                core::ptr::write_volatile(words(e).add(4), 0);
                return None;
            }
        };
        cache_set_entry(e, entry);
        core::ptr::write_volatile(
            words(e).add(7),
            hits_word(backend_generation(entry.backend)),
        );
        Some((entry, false))
    }
}
