//! The publisher's slot assignment, kept with each applied version so that a restarted agent
//! resumes the maps an earlier agent wrote instead of renumbering them.
//!
//! The maps say what every slot holds (backend address and state, pool flags and live half,
//! decision words, services by key) but not the names the config gives them: which pool slot is
//! `dc1`, which backend slot is `dc1`'s `198.18.1.2`. A renumbered backend slot would move every
//! tracked flow that names the old slot (see docs/decisions/0008). The [`Ledger`] is that
//! naming, written at each apply (it changes only then); everything that changes between
//! applies (health, live halves, decision words) is read back from the maps by
//! [`Publisher::restore`]. Cilium restores its service and backend IDs from its pinned maps the
//! same way; the names live in our history store because the maps have no room for them.

use std::{collections::BTreeMap, net::IpAddr};

use router_common::{
    BACKEND_DOWN, BACKEND_STATE_MASK, Decision, MAX_BACKENDS, MAX_POOLS, MAX_SERVICES, NO_POOL,
};
use rules::engine::Action;
use serde::{Deserialize, Serialize};

use super::{BackendState, GroupState, PoolState, Publisher, ServiceState, Slots};
use crate::dataplane::{DataplaneError, Readback};

/// The slot assignment of one generation (serialized as JSON into the history store).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// The generation the maps carried when this was taken.
    pub generation: u64,
    /// Service name → its `SERVICES` key and slot.
    pub services: BTreeMap<String, LedgerService>,
    /// Pool name → its slot and its backends' slots.
    pub pools: BTreeMap<String, LedgerPool>,
    /// Decision group name → its decision slot.
    pub groups: BTreeMap<String, u32>,
    /// Round-robin cursors of the service, pool and backend slot allocators.
    pub cursors: [u32; 3],
}

/// One service in a [`Ledger`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerService {
    /// Virtual IP, network order (IPv4 in the first four bytes).
    pub addr: [u8; 16],
    /// Port, network-order bytes as the map holds them.
    pub port: u16,
    /// IP protocol.
    pub proto: u8,
    /// Address family.
    pub family: u8,
}

/// One pool in a [`Ledger`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerPool {
    /// Pool slot.
    pub slot: u32,
    /// Backends in configuration order: address, slot, configured weight.
    pub backends: Vec<(IpAddr, u32, u32)>,
}

/// Why the maps cannot be resumed with a ledger; the caller starts from an empty publisher
/// (and renumbers) instead.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The maps were written by another generation than the ledger's (an apply whose version
    /// was not recorded, or maps of another installation).
    #[error(
        "the pinned maps carry generation {maps}, the last recorded version generation {ledger}"
    )]
    Generation {
        /// Generation in the `CONFIG` map.
        maps: u64,
        /// Generation of the ledger.
        ledger: u64,
    },
    /// A slot of the ledger is outside the limits, or a service it names is not in the map.
    #[error("the pinned maps do not match the recorded slots: {0}")]
    Mismatch(String),
    /// Reading a map failed.
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
}

impl Publisher {
    /// The current slot assignment.
    #[must_use]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a cursor is below its kind's slot limit, which is a u32"
    )]
    pub fn ledger(&self) -> Ledger {
        Ledger {
            generation: self.generation,
            services: self
                .services
                .iter()
                .map(|(name, s)| {
                    (
                        name.clone(),
                        LedgerService {
                            addr: s.key.addr,
                            port: s.key.port,
                            proto: s.key.proto,
                            family: s.key.family,
                        },
                    )
                })
                .collect(),
            pools: self
                .pools
                .iter()
                .map(|(name, p)| {
                    (
                        name.clone(),
                        LedgerPool {
                            slot: p.slot,
                            backends: p
                                .backends
                                .iter()
                                .map(|b| (b.address, b.slot, b.weight))
                                .collect(),
                        },
                    )
                })
                .collect(),
            groups: self
                .groups
                .iter()
                .map(|(name, g)| (name.clone(), g.slot))
                .collect(),
            cursors: [
                self.service_slots.next as u32,
                self.pool_slots.next as u32,
                self.backend_slots.next as u32,
            ],
        }
    }

    /// The publisher that wrote `maps`, from the slot assignment `ledger` recorded at the same
    /// generation and what the maps hold now: backend health (a backend not `DOWN` is
    /// healthy; one the next apply adds awaits its first check), each pool's flags, live half
    /// and live table, services' values and every decision word. A decision group's action is
    /// read from its word (pool slots back to names); the engine matches it to a rule's action
    /// when it resumes.
    ///
    /// # Errors
    ///
    /// [`RestoreError`] when the maps are not the ledger's generation or do not hold what it
    /// names; nothing is written either way.
    pub fn restore(ledger: &Ledger, maps: &dyn Readback) -> Result<Self, RestoreError> {
        Self::restore_from(ledger, maps, false)
    }

    /// [`restore`](Self::restore) for maps that an apply wrote after `ledger` was recorded,
    /// without a ledger of its own: its version could not be recorded (the history store
    /// failed; decision 0008), or the agent died between the map writes and the record.
    ///
    /// That apply started from this ledger's publisher, so every slot the ledger names still
    /// holds what it names unless that apply removed it: each backend slot must still hold the
    /// ledger's address, and a service no longer in `SERVICES` is left out. Slots that apply
    /// took are free here; applying the same config again takes the same ones (allocation
    /// starts from the ledger's cursors). The generation is the maps', so the next apply moves
    /// past it. Apply the config over the result at once: until then the publisher does not
    /// know what that apply added.
    ///
    /// Without this, the agent renumbers: every tracked flow whose backend slot changes is
    /// moved to another backend.
    ///
    /// # Errors
    ///
    /// [`RestoreError`] when the maps are not newer than the ledger or a slot it names holds
    /// something else; nothing is written either way.
    pub fn restore_behind(ledger: &Ledger, maps: &dyn Readback) -> Result<Self, RestoreError> {
        Self::restore_from(ledger, maps, true)
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the maps read back in the order they are written: services, pools with their \
                  backends, groups; each step checks what the next relies on"
    )]
    fn restore_from(
        ledger: &Ledger,
        maps: &dyn Readback,
        behind: bool,
    ) -> Result<Self, RestoreError> {
        let config = maps.read_config()?;
        let fits = if behind {
            config.generation > ledger.generation
        } else {
            config.generation == ledger.generation
        };
        if !fits {
            return Err(RestoreError::Generation {
                maps: config.generation,
                ledger: ledger.generation,
            });
        }
        let mut p = Publisher::new();
        // The maps' config is running: a backend the next apply adds awaits its first check.
        p.health.mark_running();
        p.generation = config.generation;
        p.filter = maps.read_filter();
        let in_map: std::collections::HashMap<_, _> = maps.read_services().into_iter().collect();
        for (name, s) in &ledger.services {
            let key = router_common::ServiceKey {
                addr: s.addr,
                port: s.port,
                proto: s.proto,
                family: s.family,
            };
            let value = match in_map.get(&key) {
                Some(v) => *v,
                // Removed by the unrecorded apply: its slots are free.
                None if behind => continue,
                None => {
                    return Err(RestoreError::Mismatch(format!(
                        "service {name} is not in SERVICES"
                    )));
                }
            };
            take(&mut p.service_slots, value.id, "service", MAX_SERVICES)?;
            let word = maps.read_decision(value.decision)?;
            p.services
                .insert(name.clone(), ServiceState { key, value, word });
        }
        for (name, lp) in &ledger.pools {
            take(&mut p.pool_slots, lp.slot, "pool", MAX_POOLS)?;
            let pool = maps.read_pool(lp.slot)?;
            let mut backends = Vec::with_capacity(lp.backends.len());
            for &(address, slot, weight) in &lp.backends {
                take(&mut p.backend_slots, slot, "backend", MAX_BACKENDS)?;
                let entry = maps.read_backend(slot)?;
                // A slot is written before any table names it and keeps its address until
                // it is taken again: another address means another writer.
                if entry.addr != super::addr16(address) {
                    return Err(RestoreError::Mismatch(format!(
                        "backend slot {slot} of pool {name} does not hold {address}"
                    )));
                }
                // The live next hop is known again (reachability follows from it once next
                // hops are required: `Publisher::requiring_next_hops`).
                let half = entry.hop & 1;
                let hop = maps
                    .read_next_hop(router_common::next_hop_index(slot, half))
                    .ok()
                    .filter(|h| h.flags & router_common::NH_F_RESOLVED != 0);
                if let Some(h) = hop {
                    p.hops.insert(address, h);
                }
                // Only a failed check is down; an evicted backend was healthy, and a restart
                // ends its drain.
                p.health.resume(
                    name,
                    address,
                    entry.state & BACKEND_STATE_MASK != BACKEND_DOWN,
                    hop.is_some(),
                );
                backends.push(BackendState {
                    address,
                    slot,
                    weight,
                    hop,
                    half,
                    written: Some(entry),
                    ramp: None,
                    adaptive: None,
                });
            }
            let live = maps.read_table(lp.slot, pool.active & 1);
            let digest = live.as_deref().map(|t| super::fingerprint(t, &backends));
            p.pools.insert(
                name.clone(),
                PoolState {
                    slot: lp.slot,
                    flags: pool.flags & !router_common::POOL_F_SECOND_CHANCE,
                    backends,
                    // Set by the first apply, or by `resume_settings` when a start
                    // resumes the maps without one.
                    slow_start: None,
                    trial_weight: 100,
                    marks: super::FlowMarks::default(),
                    // Set as `slow_start` is. A second chance an earlier process began
                    // ends at this one's first deadline: when it began is not known.
                    second_chance: std::time::Duration::ZERO,
                    chance_until: (pool.flags & router_common::POOL_F_SECOND_CHANCE != 0)
                        .then_some(std::time::Duration::ZERO),
                    left_until: (pool.flags & router_common::POOL_F_LEFT_CHANCE != 0)
                        .then_some(std::time::Duration::ZERO),
                    active: pool.active & 1,
                    live,
                    digest,
                    // Unknown: the first apply builds each table once and finds it equal.
                    built_from: None,
                },
            );
        }
        for (name, &slot) in &ledger.groups {
            take(&mut p.service_slots, slot, "decision", MAX_SERVICES)?;
            let word = maps.read_decision(slot)?;
            let d = Decision::decode(word);
            let pool_name = |slot: u16| p.pool_name(slot);
            let action = match (pool_name(d.pool_a), pool_name(d.pool_b)) {
                (None, _) => None,
                (Some(a), None) => Some(Action::Pool(a)),
                (Some(a), Some(b)) => {
                    let [wa, wb] = word_weights(d.split_b);
                    Some(Action::Split(vec![(a, wa), (b, wb)]))
                }
            };
            let fallback = pool_name(d.fallback);
            p.groups.insert(
                name.clone(),
                GroupState {
                    slot,
                    action,
                    fallback,
                    word,
                    // Not read back: the first write of the group's words writes them all.
                    class_words: None,
                },
            );
        }
        let [s, pl, b] = ledger.cursors;
        p.service_slots.next = s as usize % MAX_SERVICES as usize;
        p.pool_slots.next = pl as usize % MAX_POOLS as usize;
        p.backend_slots.next = b as usize % MAX_BACKENDS as usize;
        Ok(p)
    }

    /// The name of the published pool in slot `slot` (`None` for [`NO_POOL`] or a slot no
    /// pool holds).
    fn pool_name(&self, slot: u16) -> Option<String> {
        if slot == NO_POOL {
            return None;
        }
        self.pools
            .iter()
            .find(|(_, p)| p.slot == u32::from(slot))
            .map(|(name, _)| name.clone())
    }
}

/// Marks `slot` used, refusing one out of range or taken twice.
fn take(slots: &mut Slots, slot: u32, what: &str, limit: u32) -> Result<(), RestoreError> {
    match slots.used.get_mut(slot as usize) {
        Some(used) if !*used => {
            *used = true;
            Ok(())
        }
        Some(_) => Err(RestoreError::Mismatch(format!(
            "{what} slot {slot} named twice"
        ))),
        None => Err(RestoreError::Mismatch(format!(
            "{what} slot {slot} is beyond the limit {limit}"
        ))),
    }
}

/// The weights of a split whose second pool takes `split_b` / `SPLIT_SCALE` of new flows, in the
/// smallest of the word's units, tenths or percents that give them whole: a split written as
/// `95:5` reads back as `95:5`, not as the word's `9500:500`.
fn word_weights(split_b: u16) -> [u32; 2] {
    let scale = u32::from(router_common::SPLIT_SCALE);
    let b = u32::from(split_b).min(scale);
    let a = scale - b;
    let unit = [100, 10]
        .into_iter()
        .find(|u| a % u == 0 && b % u == 0)
        .unwrap_or(1);
    [a / unit, b / unit]
}

#[cfg(test)]
mod word_weight_tests {
    #[test]
    fn a_split_reads_back_in_the_largest_whole_unit() {
        assert_eq!(super::word_weights(500), [95, 5]);
        assert_eq!(super::word_weights(50), [995, 5]);
        assert_eq!(super::word_weights(1), [9999, 1]);
        assert_eq!(super::word_weights(5000), [50, 50]);
        assert_eq!(super::word_weights(u16::MAX), [0, 100]);
    }
}
