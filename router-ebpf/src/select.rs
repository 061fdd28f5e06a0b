//! Backend selection: connection tracking first ([`tracked`]: one hash lookup, and the flow's
//! entry carries what forwarding needs), then, for a new flow, the service's decision word and
//! the chosen pool's live Maglev table ([`select`]).

use router_common::{
    BACKEND_DOWN, Backend, Decision, FILTER_NAT_REPLY, FILTER_SERVICE, FILTER_WORDS, FlowEntry,
    FlowKey, MAGLEV_SIZE, MAX_POOLS, NO_BACKEND, NO_POOL, POOL_F_ALL_DOWN_PASS, Reason,
    SVC_F_HASH_SOURCE, Service, flow_hash, hash::filter_bit_words, maglev_index, source_hash,
};

use crate::maps::{BACKENDS, CONNTRACK, DECISIONS, MAGLEV, POOLS, SERVICE_FILTER, SERVICE_SLOTS};

/// A chosen backend.
pub struct Choice {
    /// Backend slot.
    pub id: u32,
    /// Its entry (a copy: the agent may rewrite the slot while we forward).
    pub backend: Backend,
    /// How it was chosen: `NewFlow`, `ConntrackHit`, `Reselected` or `FallbackPool`.
    pub reason: Reason,
}

/// The backend in `slot`, if the slot is in use and not down.
#[inline(always)]
pub fn usable_backend(slot: u32) -> Option<Backend> {
    let b = BACKENDS.get(slot)?;
    if b.state == BACKEND_DOWN {
        None
    } else {
        Some(*b)
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
    let index = maglev_index(pool, p.active, hash % MAGLEV_SIZE);
    match MAGLEV.get(index) {
        Some(id) => *id,
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
        addr_words(&flow.dst),
        flow.dport,
        flow.proto,
        flow.family,
        FILTER_SERVICE,
    ))
}

/// Whether `flow` may be a NAT backend's reply: its source, port, protocol and family are in
/// the filter. `false` is certain; `true` may be a false positive.
#[inline(always)]
pub fn may_be_nat_reply(flow: &FlowKey) -> bool {
    filter_has(filter_bit_words(
        addr_words(&flow.src),
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
    let Some(entry) = CONNTRACK.get_ptr(flow) else {
        return Err(false);
    };
    let FlowEntry {
        backend: id,
        service,
    } = unsafe { *entry };
    let Some(slot) = SERVICE_SLOTS.get(service) else {
        return Err(true);
    };
    if !slot_serves(slot, flow) {
        return Err(true);
    }
    let svc = slot.service;
    let Some(backend) = usable_backend(id) else {
        return Err(true);
    };
    Ok((
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
        // A failed insert (map full of pinned entries) only costs stickiness for this flow.
        let _ = CONNTRACK.insert(
            flow,
            FlowEntry {
                backend: id,
                service: svc.id,
            },
            0,
        );
    }
    Ok(Choice {
        id,
        backend,
        reason,
    })
}
