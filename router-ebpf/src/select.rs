//! Backend selection: connection tracking first ([`tracked`]: the flow's entry carries what
//! forwarding needs, read through this CPU's flow cache), then, for a new flow, the service's
//! decision word and the chosen pool's live Maglev table ([`select`]).
//!
//! The flow cache (`FLOW_CACHE`, decision 0015) holds copies of `CONNTRACK` entries in
//! two-way sets of 64-byte entries, one region per CPU: a tracked packet costs a dozen
//! instructions of hashing and one cache line instead of the kernel's hash-map lookup. Its
//! invariants:
//! - a copy is never newer than `CONNTRACK` on this CPU: the program writes `CONNTRACK`, then
//!   the copy;
//! - a flow enters the cache with its second packet on a CPU, read from `CONNTRACK`: a flood of
//!   one-packet flows does not displace the cached ones;
//! - every [`FLOW_CACHE_LEASE`] packets of a flow on a CPU, its entry is read from `CONNTRACK`
//!   again (and kept recent in its LRU), so the copy follows rewrites by other CPUs, the agent
//!   and `bpftool` within that many packets. A flow `CONNTRACK` lost meanwhile (evicted, or
//!   deleted) is written back from the copy: a flow the cache still serves stays where it is,
//!   as it would have had its entry been kept recent. Every other check of a tracked packet
//!   (its service slot, its backend's state) is made on every packet, as without the cache;
//! - a copy that no longer applies (its slot no longer holds the flow's service, its backend
//!   is not usable) is checked against `CONNTRACK` before the flow is re-selected: another CPU
//!   may have re-selected it already;
//! - a copy is used only while its backend's generation (`Backend.generation`, which the agent
//!   changes with every change of the slot's state, address or family) is the one it was made under: a flow that
//!   another CPU re-selected while its backend was down is read from `CONNTRACK` again here
//!   when the backend returns;
//! - when both ways hold one flow, way 0 holds the newer copy and is read first;
//! - an entry is written family word last, after it was made unmatchable, so a reader never
//!   takes a half-written key for a flow.

use aya_ebpf::helpers::generated::bpf_get_smp_processor_id;
use router_common::{
    Backend, CachedFlow, Decision, FILTER_F_NAT, FILTER_FLAGS, FILTER_NAT_REPLY, FILTER_SERVICE,
    FILTER_WORDS, FLOW_CACHE_ENTRIES, FLOW_CACHE_LEASE, FLOW_CACHE_WAYS, FlowEntry, FlowKey,
    MAGLEV_LANES, MAGLEV_SIZE, MAX_POOLS, NO_BACKEND, NO_POOL, POOL_F_ALL_DOWN_PASS, Reason,
    SVC_F_HASH_SOURCE, Service, flow_hash,
    hash::{filter_bit_words, flow_cache_set},
    keeps_flows, maglev_backend, maglev_index, source_hash,
};

use crate::maps::{
    BACKENDS, CONNTRACK, DECISIONS, FLOW_CACHE, MAGLEV, POOLS, SERVICE_FILTER, SERVICE_SLOTS,
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

/// The backend in `slot`, if it keeps its tracked flows (up or draining).
#[inline(always)]
pub fn usable_backend(slot: u32) -> Option<Backend> {
    let b = BACKENDS.get(slot)?;
    if keeps_flows(b.state) { Some(*b) } else { None }
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
fn addr_pair(a: &[u8; 16]) -> [u64; 2] {
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
fn filter_has(bit: u32) -> bool {
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

/// A tracked flow, forwarded on its conntrack entry alone: the backend it had, and the service
/// its slot holds. `Err(true)` when the flow has an entry that no longer applies (its backend is
/// down or removed, or its service slot no longer holds the flow's service: it is re-selected),
/// `Err(false)` when it has none.
#[inline(always)]
pub fn tracked(flow: &FlowKey) -> Result<(Service, Choice), bool> {
    let Some((entry, cached)) = flow_entry(flow) else {
        return Err(false);
    };
    if let Some(hit) = applies(flow, entry) {
        return Ok(hit);
    }
    if !cached {
        return Err(true);
    }
    // A copy that no longer applies may be older than conntrack: another CPU may have
    // re-selected the flow. Conntrack decides, and the copy follows it.
    let Some(c) = CONNTRACK.get_ptr(flow) else {
        return Err(true);
    };
    let fresh = unsafe { *c };
    if fresh == entry {
        return Err(true);
    }
    let hit = applies(flow, fresh).ok_or(true)?;
    cache_fill(flow, fresh);
    Ok(hit)
}

/// The service and backend a tracked flow's entry sends it to, if the entry still applies: its
/// service slot holds the flow's key and its backend is usable.
#[inline(always)]
fn applies(flow: &FlowKey, entry: FlowEntry) -> Option<(Service, Choice)> {
    let FlowEntry {
        backend: id,
        service,
    } = entry;
    let slot = SERVICE_SLOTS.get(service)?;
    if !slot_serves(slot, flow) {
        return None;
    }
    let svc = slot.service;
    let backend = usable_backend(id)?;
    Some((
        svc,
        Choice {
            id,
            backend,
            reason: Reason::ConntrackHit,
        },
    ))
}

/// Chooses a backend for a new (or re-selected, `reselect`) flow `flow` of `svc` through the
/// service's decision word and the chosen pool's live Maglev table; with `track`, the choice is
/// recorded in connection tracking (ICMP errors look up without recording).
///
/// Errors: `NoBackend` / `AllDownPass` when no pool has a usable backend (by the primary pool's
/// `when_all_down`), `BadState` when the service's decision slot is missing.
#[inline(always)]
pub fn select(
    flow: &FlowKey,
    svc: &Service,
    track: bool,
    reselect: bool,
) -> Result<Choice, Reason> {
    let mut reason = if reselect {
        Reason::Reselected
    } else {
        Reason::NewFlow
    };
    let hash = if svc.flags & SVC_F_HASH_SOURCE != 0 {
        source_hash(&flow.src)
    } else {
        flow_hash(flow)
    };
    let word = DECISIONS.get(svc.decision).ok_or(Reason::BadState)?;
    let decision = Decision::decode(*word);
    let pool = decision.pick(hash);
    let mut id = maglev_lookup(pool, hash);
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
        let entry = FlowEntry {
            backend: id,
            service: svc.id,
        };
        // A failed insert (map full of pinned entries) only costs stickiness for this flow.
        // A new flow enters the cache with its second packet (a flood of one-packet flows
        // never displaces the cached ones); a re-selected one is in it and gets its new
        // entry there.
        let inserted = CONNTRACK.insert(flow, entry, 0).is_ok();
        if reselect {
            if inserted {
                cache_fill(flow, entry);
            } else {
                cache_forget(flow);
            }
        }
    }
    Ok(Choice {
        id,
        backend,
        reason,
    })
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

/// Cache entry `e` as its eight 64-bit words (key 0–4, entry 5, hit count and backend
/// generation 6).
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

/// A `FlowEntry` as the one 64-bit word it is stored as, so it is written with one store.
#[inline(always)]
fn entry_word(entry: FlowEntry) -> u64 {
    // SAFETY: `FlowEntry` is two `u32`, eight bytes without padding.
    unsafe { core::mem::transmute::<FlowEntry, u64>(entry) }
}

/// The generation of backend slot `id` (`Backend.generation`); 0 for a slot past the map.
#[inline(always)]
fn backend_generation(id: u32) -> u32 {
    BACKENDS.get(id).map_or(0, |b| b.generation)
}

/// Word 6 of a cache entry: no hits, and the backend generation `generation`.
#[inline(always)]
fn hits_word(generation: u32) -> u64 {
    // SAFETY: two `u32` are eight bytes; `CachedFlow.hits` comes first (offset 48), then
    // `generation` (offset 52).
    unsafe { core::mem::transmute::<[u32; 2], u64>([0, generation]) }
}

/// Writes cache entry `e`: key words `w`, `entry`, no hits, backend generation in `word6`
/// ([`hits_word`]). The family word (the key's last) is cleared first and written last, so
/// the entry matches no flow until it is whole.
#[inline(always)]
fn cache_write(e: *mut CachedFlow, w: &[u64; 5], entry: u64, word6: u64) {
    let p = words(e);
    // SAFETY: `e` is a 64-byte map value of this CPU's region: words 0–4 are the key, 5 the
    // entry, 6 the hit count and backend generation.
    unsafe {
        core::ptr::write_volatile(p.add(4), 0);
        core::ptr::write_volatile(p, w[0]);
        core::ptr::write_volatile(p.add(1), w[1]);
        core::ptr::write_volatile(p.add(2), w[2]);
        core::ptr::write_volatile(p.add(3), w[3]);
        core::ptr::write_volatile(p.add(5), entry);
        core::ptr::write_volatile(p.add(6), word6);
        core::ptr::write_volatile(p.add(4), w[4]);
    }
}

/// Records `entry` for `flow` in this CPU's cache: over the flow's copy if its set holds one,
/// else in way 0, after way 0's flow moved to way 1 (the set's older flow leaves).
#[inline(always)]
fn cache_fill(flow: &FlowKey, entry: FlowEntry) {
    let w = key_words(flow);
    fill_at(cache_index(&w), &w, entry);
}

/// [`cache_fill`] of the flow with key words `w` into the set whose way 0 is at `at`.
#[inline(always)]
fn fill_at(at: u32, w: &[u64; 5], entry: FlowEntry) {
    let (Some(w0), Some(w1)) = (FLOW_CACHE.get_ptr_mut(at), FLOW_CACHE.get_ptr_mut(at + 1)) else {
        return;
    };
    let word6 = hits_word(backend_generation(entry.backend));
    let entry = entry_word(entry);
    if holds(w1, w) && !holds(w0, w) {
        cache_write(w1, w, entry, word6);
        return;
    }
    if !holds(w0, w) {
        // SAFETY: way 0 is a 64-byte map value of this CPU's region (see `cache_write`).
        let (k, e, h) = unsafe {
            (
                core::ptr::read(words(w0).cast::<[u64; 5]>()),
                core::ptr::read_volatile(words(w0).add(5)),
                core::ptr::read_volatile(words(w0).add(6)),
            )
        };
        cache_write(w1, &k, e, h);
    }
    cache_write(w0, w, entry, word6);
}

/// Empties this CPU's cache entry of `flow`, if it has one.
#[inline(always)]
fn cache_forget(flow: &FlowKey) {
    let w = key_words(flow);
    let at = cache_index(&w);
    let mut way = 0;
    while way < FLOW_CACHE_WAYS {
        if let Some(e) = FLOW_CACHE.get_ptr_mut(at + way)
            && holds(e, &w)
        {
            // SAFETY: a map value of this CPU's region (see `cache_write`).
            unsafe { core::ptr::write_volatile(words(e).add(4), 0) };
        }
        way += 1;
    }
}

/// `BPF_NOEXIST`: a map update that creates the entry only.
const BPF_NOEXIST: u64 = 1;

/// The conntrack entry of `flow`, through this CPU's flow cache, and whether it is the cached
/// copy: the copy while its lease lasts and its backend's generation is unchanged, else
/// `CONNTRACK`'s (which refills the cache). A copy whose lease ended and whose flow `CONNTRACK` lost is written back there;
/// a stale copy whose flow `CONNTRACK` lost is emptied, and the flow is selected again.
#[inline(always)]
fn flow_entry(flow: &FlowKey) -> Option<(FlowEntry, bool)> {
    let w = key_words(flow);
    let at = cache_index(&w);
    let mut way = 0;
    while way < FLOW_CACHE_WAYS {
        let Some(e) = FLOW_CACHE.get_ptr_mut(at + way) else {
            break;
        };
        if holds(e, &w) {
            // SAFETY: a map value of this CPU's region (see `cache_write`).
            unsafe {
                let hits = (*e).hits + 1;
                let copy = (*e).entry;
                let current = (*e).generation == backend_generation(copy.backend);
                if hits < FLOW_CACHE_LEASE && current {
                    (*e).hits = hits;
                    return Some((copy, true));
                }
                let entry = match CONNTRACK.get_ptr(flow) {
                    Some(c) => *c,
                    // A flow the cache serves lost its conntrack entry (evicted, or deleted by
                    // another writer): it stays where it is and is tracked again, unless another
                    // CPU tracked it meanwhile (then that entry holds).
                    None if current => match CONNTRACK.insert(flow, copy, BPF_NOEXIST) {
                        Ok(()) => copy,
                        Err(_) => *CONNTRACK.get_ptr(flow)?,
                    },
                    None => {
                        core::ptr::write_volatile(words(e).add(4), 0);
                        return None;
                    }
                };
                core::ptr::write_volatile(words(e).add(5), entry_word(entry));
                core::ptr::write_volatile(
                    words(e).add(6),
                    hits_word(backend_generation(entry.backend)),
                );
                return Some((entry, false));
            }
        }
        way += 1;
    }
    let entry = unsafe { *CONNTRACK.get_ptr(flow)? };
    fill_at(at, &w, entry);
    Some((entry, false))
}
