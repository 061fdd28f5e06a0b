//! Backend selection: connection tracking first, then the service's decision word and the
//! chosen pool's live Maglev table.

use router_common::{
    BACKEND_DOWN, Backend, Decision, FlowEntry, FlowKey, MAGLEV_SIZE, MAX_POOLS, NO_BACKEND,
    NO_POOL, POOL_F_ALL_DOWN_PASS, Reason, SVC_F_HASH_SOURCE, Service, flow_hash, maglev_index,
    source_hash,
};

use crate::maps::{BACKENDS, CONNTRACK, DECISIONS, MAGLEV, POOLS};

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

/// Chooses a backend for `flow` of `svc`.
///
/// With `track`, a conntrack hit whose backend is still usable wins; a hit on a down or removed
/// backend is re-selected; a new choice is recorded. ICMP errors look up without recording.
/// Errors: `NoBackend` / `AllDownPass` when no pool has a usable backend (by the primary pool's
/// `when_all_down`), `BadState` when the service's decision slot is missing.
#[inline(always)]
pub fn select(flow: &FlowKey, svc: &Service, track: bool) -> Result<Choice, Reason> {
    let mut reason = Reason::NewFlow;
    if let Some(entry) = CONNTRACK.get_ptr(flow) {
        let id = unsafe { (*entry).backend };
        if let Some(backend) = usable_backend(id) {
            return Ok(Choice {
                id,
                backend,
                reason: Reason::ConntrackHit,
            });
        }
        reason = Reason::Reselected;
    }

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
