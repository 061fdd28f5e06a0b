//! The map writer: turns a validated [`Config`] plus backend health into map contents, and
//! writes only what changed, in an order that never exposes a half-built state.
//!
//! Order of one apply (ARCHITECTURE.md, "Map writes"):
//! 0. nothing, unless the slots the new config needs beside the running one are all free;
//! 1. backends that are new or changed (a service cannot reach them yet);
//! 2. pool tables: each changed table is written into the pool's inactive half, then the pool's
//!    `active` word flips (one update); then the backends that left a pool go down and free
//!    their slots (no live table names them any more);
//! 3. decision words (one 8-byte update each);
//! 4. services (new or changed);
//! 5. removals in reverse: services, then backends marked down (their tracked flows re-select),
//!    then pool and decision slots freed;
//! 6. the generation word.
//!
//! Backend health is not the publisher's: it reads the one [`Health`] table, which it keeps
//! beside what it published so that the state store and the decision groups read the same
//! table ([`Publisher::health`]).
//!
//! Parts: [`slots`] (round-robin allocation), [`tables`] (Maglev tables and backend entries in
//! their safe order), [`words`] (the one encoder of decision words, and decision groups),
//! [`ledger`] (slot names kept per version, to resume the maps after a restart).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
};

use router_common::{
    ABI_VERSION, BACKEND_DOWN, BACKEND_DRAINING, BACKEND_UP, Backend, FAMILY_V4, FAMILY_V6,
    MAX_BACKENDS, MAX_POOLS, MAX_SERVICES, NextHop, POOL_F_ALL_DOWN_PASS, PROTO_TCP, PROTO_UDP,
    SVC_F_HASH_SOURCE, SVC_F_NAT, Service, ServiceKey, next_hop_index,
};

use crate::{
    config::{self, Config, Forward, HashMode, Protocol, Target, WhenAllDown},
    dataplane::{Dataplane, DataplaneError},
    health::{BackendHealth, Health},
    maglev::MaglevError,
};

mod ledger;
mod slots;
mod tables;
mod words;

pub use ledger::{Ledger, LedgerPool, LedgerService, RestoreError};
use slots::Slots;
pub use words::GroupState;

/// Why an apply or a health update could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A map write failed.
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    /// No free slot of a kind (the limits are in router-common).
    #[error(
        "not enough free {0} slots (limits: {MAX_SERVICES} services, {MAX_POOLS} pools, \
         {MAX_BACKENDS} backends; a change holds its new slots beside the running ones until it \
         is live, so apply a large renumbering in steps); nothing was changed"
    )]
    Full(&'static str),
    /// A Maglev table could not be built.
    #[error("pool {pool}: {source}")]
    Maglev {
        /// Pool name.
        pool: String,
        /// Cause.
        #[source]
        source: MaglevError,
    },
}

/// One backend of one pool, as published.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendState {
    /// Address.
    pub address: IpAddr,
    /// Backend slot.
    pub slot: u32,
    /// Configured weight.
    pub weight: u32,
    /// The next hop the slot's live `NEXT_HOPS` half holds (`None`: none written, or an
    /// unresolved entry).
    pub hop: Option<NextHop>,
    /// Which `NEXT_HOPS` half of the slot is live.
    pub half: u32,
    /// The entry last written to (or read back from) the slot.
    pub written: Option<Backend>,
}

impl BackendState {
    /// The backend's map entry for its health (`None`: not in the health table, down). A
    /// healthy backend whose next hop became unresolved after it was resolved drains: out of
    /// every table, but its tracked flows stay on the last next hop, so a carrier blip or a
    /// neighbour being re-resolved (the kernel passes through `FAILED` when a MAC changes
    /// unannounced) resets no connection; its health check decides whether it is gone.
    fn entry(&self, health: Option<BackendHealth>) -> Backend {
        let state = match health {
            None => BACKEND_DOWN,
            Some(h) => match (h.healthy, h.reachable, self.weight) {
                (false, _, _) => BACKEND_DOWN,
                (true, false, _) if self.hop.is_some() => BACKEND_DRAINING,
                (true, false, _) => BACKEND_DOWN,
                (true, true, 0) => BACKEND_DRAINING,
                (true, true, _) => BACKEND_UP,
            },
        };
        Backend {
            addr: addr16(self.address),
            family: u32::from(family(self.address)),
            state,
            hop: self.half,
            _pad: 0,
        }
    }

    /// Writes `entry` unless the slot holds it already.
    fn write(&mut self, dp: &mut dyn Dataplane, entry: Backend) -> Result<(), PublishError> {
        if self.written != Some(entry) {
            dp.set_backend(self.slot, entry)?;
            self.written = Some(entry);
        }
        Ok(())
    }

    /// Makes the slot's live `NEXT_HOPS` half hold `hop` (a zeroed, unresolved entry for
    /// `None`): written into the other half, which becomes live with the next write of the
    /// backend's entry ([`entry`](Self::entry) carries the half). Returns whether it wrote.
    fn write_hop(
        &mut self,
        dp: &mut dyn Dataplane,
        hop: Option<NextHop>,
    ) -> Result<bool, PublishError> {
        if self.hop == hop {
            return Ok(false);
        }
        let half = self.half ^ 1;
        dp.set_next_hop(next_hop_index(self.slot, half), hop.unwrap_or_default())?;
        self.half = half;
        self.hop = hop;
        Ok(true)
    }
}

/// One pool, as published.
#[derive(Clone, Debug)]
pub struct PoolState {
    /// Pool slot.
    pub slot: u32,
    /// `POOL_F_*` flags.
    pub flags: u32,
    /// Backends in configuration order.
    pub backends: Vec<BackendState>,
    /// Which half is live.
    active: u32,
    /// The live table (None before the first write).
    live: Option<Vec<u32>>,
    /// The Maglev input `live` was built from (slot, address, weight of each member), so an
    /// apply that leaves a pool's members alone skips building its table (1 ms per pool).
    built_from: Option<Vec<(u32, IpAddr, u32)>>,
}

/// One service, as published.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceState {
    /// Map key.
    pub key: ServiceKey,
    /// Map value (its `id` is the service slot, `decision` the decision slot).
    pub value: Service,
    /// Decision word.
    pub word: u64,
}

/// The published state, and the writer that keeps the maps equal to it.
#[derive(Debug)]
pub struct Publisher {
    generation: u64,
    services: BTreeMap<String, ServiceState>,
    pools: BTreeMap<String, PoolState>,
    service_slots: Slots,
    pool_slots: Slots,
    backend_slots: Slots,
    groups: BTreeMap<String, GroupState>,
    /// Each backend address's resolved next hop as last reported
    /// ([`Publisher::set_next_hops`]), for the slots it takes later.
    hops: BTreeMap<IpAddr, NextHop>,
    /// The backend-health table the maps were written from.
    health: Health,
}

impl Default for Publisher {
    fn default() -> Self {
        Self::new()
    }
}

/// An address as the maps hold it: network order, IPv4 in the first four bytes.
pub fn addr16(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn family(a: IpAddr) -> u8 {
    if a.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 }
}

/// The `SERVICES` key of a configured service.
pub fn service_key(s: &config::Service) -> ServiceKey {
    ServiceKey {
        addr: addr16(s.vip),
        port: s.port.to_be(),
        proto: match s.protocol {
            Protocol::Tcp => PROTO_TCP,
            Protocol::Udp => PROTO_UDP,
        },
        family: family(s.vip),
    }
}

/// What step 1 of an apply leaves for the later steps.
struct Staged {
    /// The new pools, each with whether its flags changed.
    pools: BTreeMap<String, (PoolState, bool)>,
    /// Backends that left a pool that stays: down and freed once no live table names them.
    retired: Vec<BackendState>,
    /// Slots of removed pools' backends that a new pool took over.
    adopted: HashSet<u32>,
}

impl Publisher {
    /// A publisher with nothing published (generation 0), whose backends need no next hop.
    pub fn new() -> Self {
        Self {
            generation: 0,
            services: BTreeMap::new(),
            pools: BTreeMap::new(),
            service_slots: Slots::new(MAX_SERVICES),
            pool_slots: Slots::new(MAX_POOLS),
            backend_slots: Slots::new(MAX_BACKENDS),
            groups: BTreeMap::new(),
            hops: BTreeMap::new(),
            health: Health::new(),
        }
    }

    /// This publisher, with next hops managed: a backend takes new flows only once
    /// [`set_next_hops`](Self::set_next_hops) reported its next hop resolved
    /// ([`Health::require_next_hops`]).
    #[must_use]
    pub fn requiring_next_hops(mut self) -> Self {
        self.health.require_next_hops();
        self
    }

    /// The backend-health table the maps hold.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Generation of the last applied config (0 before the first).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Published pools by name.
    pub fn pools(&self) -> &BTreeMap<String, PoolState> {
        &self.pools
    }

    /// Published services by name.
    pub fn services(&self) -> &BTreeMap<String, ServiceState> {
        &self.services
    }

    /// Records a health verdict for `address` in `pool`; when its usability changed, writes
    /// the pool's table and the backend's entry in their safe order. Returns whether anything
    /// changed. Unknown pools or addresses (a probe that outlived a config change) are ignored.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; the publisher then holds what it wrote.
    pub fn set_health(
        &mut self,
        dp: &mut dyn Dataplane,
        pool: &str,
        address: IpAddr,
        healthy: bool,
    ) -> Result<bool, PublishError> {
        if !self.health.set_check(pool, address, healthy) {
            return Ok(false);
        }
        if let Some(p) = self.pools.get_mut(pool) {
            tables::refresh(dp, pool, p, &self.health)?;
        }
        Ok(true)
    }

    /// Records next hops (`Some` resolved, `None` unresolved) and writes them into every slot
    /// of their addresses; a backend that became reachable or unreachable changes its pools'
    /// tables, in the safe order of [`tables::refresh`]. An unresolved next hop keeps the last
    /// resolved one in the slot, for the backend's tracked flows (it drains). Returns the pools
    /// whose usable backends changed.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; the publisher then holds what it wrote.
    pub fn set_next_hops(
        &mut self,
        dp: &mut dyn Dataplane,
        hops: &[(IpAddr, Option<NextHop>)],
    ) -> Result<Vec<String>, PublishError> {
        // The last report of an address in the batch wins.
        let batch: HashMap<IpAddr, Option<NextHop>> = hops.iter().copied().collect();
        let mut changed = Vec::new();
        for (&address, &hop) in &batch {
            for pool in self.health.set_next_hop(address, hop.is_some()) {
                if !changed.contains(&pool) {
                    changed.push(pool);
                }
            }
            if let Some(h) = hop {
                self.hops.insert(address, h);
            }
        }
        let mut touched = changed.clone();
        for (name, pool) in &mut self.pools {
            for b in &mut pool.backends {
                if let Some(Some(hop)) = batch.get(&b.address)
                    && b.write_hop(dp, Some(*hop))?
                    && !touched.contains(name)
                {
                    touched.push(name.clone());
                }
            }
        }
        for name in &touched {
            if let Some(p) = self.pools.get_mut(name) {
                tables::refresh(dp, name, p, &self.health)?;
            }
        }
        Ok(changed)
    }

    /// Makes the maps hold `cfg`, keeping the health of backends that stay. Returns the new
    /// generation.
    ///
    /// # Errors
    ///
    /// [`PublishError`]: for want of slots before anything is written; a failed map write
    /// leaves what was written.
    pub fn apply(&mut self, dp: &mut dyn Dataplane, cfg: &Config) -> Result<u64, PublishError> {
        self.apply_decided(dp, cfg, &BTreeMap::new())
    }

    /// [`apply`](Self::apply), with the actions the engine decided for decision groups (a
    /// group missing here keeps its published action; a new one without an action publishes a
    /// word with no pool until [`publish_decision`](Self::publish_decision)).
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub fn apply_decided(
        &mut self,
        dp: &mut dyn Dataplane,
        cfg: &Config,
        decided: &BTreeMap<String, rules::engine::Action>,
    ) -> Result<u64, PublishError> {
        // 0. Every slot the new config needs must be free now (old and new stand side by side
        //    until the removals): refuse before the first write rather than stop half way.
        self.reserve(cfg)?;
        self.health.configure(cfg);
        // 1. Backends, pool by pool.
        let staged = self.stage_backends(dp, cfg)?;
        // 2. Tables and pool words; then the backends that left a pool.
        let removed_pools = self.publish_tables(dp, staged.pools, staged.retired)?;
        // 3 + 4. Decisions (groups' words first), then services.
        let group_names: Vec<String> = cfg.decisions.iter().map(|g| g.name.clone()).collect();
        let removed_groups = self.apply_groups(dp, &group_names, decided)?;
        let stale = self.publish_services(dp, cfg)?;
        // 5. Removals, in reverse.
        for gone in stale {
            if !self.services.values().any(|s| s.key == gone.key) {
                dp.remove_service(&gone.key)?;
            }
            self.service_slots.free(gone.value.id);
        }
        for gone in removed_groups {
            self.service_slots.free(gone.slot);
        }
        for gone in removed_pools.into_values() {
            for b in gone.backends {
                if !staged.adopted.contains(&b.slot) {
                    self.retire(dp, b)?;
                }
            }
            self.pool_slots.free(gone.slot);
        }
        // Next hops of addresses no pool has any more are forgotten: one that comes back gets
        // the resolver's report, not a MAC from before it left.
        let configured: HashSet<IpAddr> = cfg
            .pools
            .iter()
            .flat_map(|p| p.backends.iter().map(|b| b.address))
            .collect();
        self.hops.retain(|a, _| configured.contains(a));
        // 6. Generation.
        self.generation += 1;
        dp.set_config(router_common::Config {
            generation: self.generation,
            abi_version: ABI_VERSION,
            _pad: 0,
        })?;
        Ok(self.generation)
    }

    /// Step 1: every backend that is new or changed gets its entry (a service cannot reach it
    /// yet); new pools get slots (their tables come in step 2).
    fn stage_backends(
        &mut self,
        dp: &mut dyn Dataplane,
        cfg: &Config,
    ) -> Result<Staged, PublishError> {
        let mut staged = Staged {
            pools: BTreeMap::new(),
            retired: Vec::new(),
            adopted: HashSet::new(),
        };
        // Backends of pools this config removes, by address: a new pool that has the same
        // address takes the backend's slot over (a renamed pool), so the flows tracked on it
        // stay where they are instead of re-selecting through the new pool's table.
        let mut orphans: HashMap<IpAddr, BackendState> = HashMap::new();
        for (name, old) in &self.pools {
            if cfg.pools.iter().all(|p| &p.name != name) {
                for b in &old.backends {
                    orphans.entry(b.address).or_insert_with(|| b.clone());
                }
            }
        }
        for p in &cfg.pools {
            let old = self.pools.remove(&p.name);
            let mut old_backends: HashMap<IpAddr, BackendState> = old
                .as_ref()
                .map(|o| o.backends.iter().map(|b| (b.address, b.clone())).collect())
                .unwrap_or_default();
            let mut backends = Vec::with_capacity(p.backends.len());
            for b in &p.backends {
                let prev = old_backends.remove(&b.address).or_else(|| {
                    let orphan = orphans.remove(&b.address)?;
                    staged.adopted.insert(orphan.slot);
                    Some(orphan)
                });
                let mut state = match prev {
                    Some(prev) => BackendState {
                        weight: b.weight,
                        ..prev
                    },
                    None => self.fresh_backend(dp, b.address, b.weight)?,
                };
                // Only what differs is written: a restarted agent that resumed the maps
                // rewrites nothing for an unchanged backend.
                state.write(dp, state.entry(self.health.get(&p.name, b.address)))?;
                backends.push(state);
            }
            // Backends that left this pool stay as they are until the pool's new table is
            // live (step 2): marked down before, they would drop the flows the old table
            // still sends them; freed before, a new backend could take the slot the old table
            // names.
            staged.retired.extend(old_backends.into_values());
            let flags = match p.when_all_down {
                WhenAllDown::Drop => 0,
                WhenAllDown::Pass => POOL_F_ALL_DOWN_PASS,
            };
            let flags_changed = old.as_ref().is_none_or(|o| o.flags != flags);
            let state = match old {
                Some(o) => PoolState {
                    flags,
                    backends,
                    ..o
                },
                None => PoolState {
                    slot: self.pool_slots.take("pool")?,
                    flags,
                    backends,
                    active: 1,
                    live: None,
                    built_from: None,
                },
            };
            staged.pools.insert(p.name.clone(), (state, flags_changed));
        }
        Ok(staged)
    }

    /// A backend in a newly taken slot. The slot may hold an earlier backend's next hop: its
    /// live half gets this address's (or an unresolved entry) before anything names it.
    fn fresh_backend(
        &mut self,
        dp: &mut dyn Dataplane,
        address: IpAddr,
        weight: u32,
    ) -> Result<BackendState, PublishError> {
        let slot = self.backend_slots.take("backend")?;
        let hop = self.hops.get(&address).copied();
        dp.set_next_hop(next_hop_index(slot, 1), hop.unwrap_or_default())?;
        Ok(BackendState {
            address,
            slot,
            weight,
            hop,
            half: 1,
            written: None,
        })
    }

    /// Step 2: every pool's table and pool word; then the backends that left a pool go down
    /// (no live table names them any more: their tracked flows re-select) and free their
    /// slots. Returns the pools no longer configured (their slots are freed after services).
    fn publish_tables(
        &mut self,
        dp: &mut dyn Dataplane,
        mut pools: BTreeMap<String, (PoolState, bool)>,
        retired: Vec<BackendState>,
    ) -> Result<BTreeMap<String, PoolState>, PublishError> {
        for (name, (pool, flags_changed)) in &mut pools {
            tables::publish(dp, name, pool, &self.health, *flags_changed)?;
        }
        let pools = pools.into_iter().map(|(n, (p, _))| (n, p)).collect();
        for gone in retired {
            self.retire(dp, gone)?;
        }
        Ok(std::mem::replace(&mut self.pools, pools))
    }

    /// Marks a backend no table names down and frees its slot.
    fn retire(
        &mut self,
        dp: &mut dyn Dataplane,
        mut gone: BackendState,
    ) -> Result<(), PublishError> {
        gone.write(dp, gone.entry(None))?;
        self.backend_slots.free(gone.slot);
        Ok(())
    }

    /// Step 4: every service (new or changed; a static target's word first). Returns the
    /// services that are gone or changed key (removed in step 5).
    fn publish_services(
        &mut self,
        dp: &mut dyn Dataplane,
        cfg: &Config,
    ) -> Result<Vec<ServiceState>, PublishError> {
        let mut services = BTreeMap::new();
        let mut stale = Vec::new();
        for s in &cfg.services {
            let key = service_key(s);
            // A service whose address, port or protocol changed is a new service.
            let old = match self.services.remove(&s.name) {
                Some(o) if o.key == key => Some(o),
                Some(o) => {
                    stale.push(o);
                    None
                }
                None => None,
            };
            let slot = match &old {
                Some(o) => o.value.id,
                None => self.service_slots.take("service")?,
            };
            let group = match &s.to {
                Target::Decide(g) => self.groups.get(g).map(|g| (g.slot, g.word)),
                _ => None,
            };
            let word = group.map_or_else(|| self.target_word(&s.to), |(_, w)| w);
            let mut flags = 0;
            if s.forward == Forward::Nat {
                flags |= SVC_F_NAT;
            }
            if s.hash == HashMode::SourceIp {
                flags |= SVC_F_HASH_SOURCE;
            }
            // A service's decision slot is its own slot, or its group's.
            let value = Service {
                id: slot,
                decision: group.map_or(slot, |(g, _)| g),
                flags,
                _pad: 0,
            };
            if group.is_none()
                && old
                    .as_ref()
                    .is_none_or(|o| o.word != word || o.value.decision != slot)
            {
                dp.set_decision(slot, word)?;
            }
            if old.as_ref().is_none_or(|o| o.value != value) {
                dp.set_service(key, value)?;
            }
            services.insert(s.name.clone(), ServiceState { key, value, word });
        }
        stale.extend(std::mem::replace(&mut self.services, services).into_values());
        Ok(stale)
    }

    /// Checks that the slots `cfg` needs beside the published ones are free.
    fn reserve(&self, cfg: &Config) -> Result<(), PublishError> {
        let new_pools = cfg
            .pools
            .iter()
            .filter(|p| !self.pools.contains_key(&p.name))
            .count();
        let new_backends: usize = cfg
            .pools
            .iter()
            .map(|p| {
                let old = self.pools.get(&p.name);
                p.backends
                    .iter()
                    .filter(|b| {
                        old.is_none_or(|o| o.backends.iter().all(|x| x.address != b.address))
                    })
                    .count()
            })
            .sum();
        let new_services = cfg
            .services
            .iter()
            .filter(|s| {
                self.services
                    .get(&s.name)
                    .is_none_or(|o| o.key != service_key(s))
            })
            .count()
            + cfg
                .decisions
                .iter()
                .filter(|g| !self.groups.contains_key(&g.name))
                .count();
        for (need, slots, what) in [
            (new_pools, &self.pool_slots, "pool"),
            (new_backends, &self.backend_slots, "backend"),
            (new_services, &self.service_slots, "service"),
        ] {
            if need > slots.free_count() {
                return Err(PublishError::Full(what));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod order_tests;
#[cfg(test)]
mod restore_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod words_tests;
