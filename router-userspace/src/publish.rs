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
//! Slots (service, pool, backend) are allocated round-robin, so a freed slot is reused as late as
//! possible: a conntrack entry that still names a removed backend's slot sees it down (and
//! re-selects) rather than meeting a new backend there.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
};

use router_common::{
    ABI_VERSION, BACKEND_DOWN, BACKEND_DRAINING, BACKEND_UP, Backend, FAMILY_V4, FAMILY_V6,
    MAGLEV_SIZE, MAX_BACKENDS, MAX_POOLS, MAX_SERVICES, NextHop, POOL_F_ALL_DOWN_PASS, PROTO_TCP,
    PROTO_UDP, Pool, SVC_F_HASH_SOURCE, SVC_F_NAT, Service, ServiceKey, next_hop_index,
};

use crate::{
    config::{self, Config, Forward, HashMode, Protocol, Target, WhenAllDown},
    dataplane::{Dataplane, DataplaneError},
    maglev::{self, MaglevBackend, MaglevError},
};

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

/// Round-robin slot allocator over `0..limit`.
#[derive(Debug)]
struct Slots {
    used: Vec<bool>,
    next: usize,
}

impl Slots {
    fn new(limit: u32) -> Self {
        Self {
            used: vec![false; limit as usize],
            next: 0,
        }
    }

    fn take(&mut self, what: &'static str) -> Result<u32, PublishError> {
        let n = self.used.len();
        for i in 0..n {
            let at = (self.next + i) % n;
            if let Some(slot) = self.used.get_mut(at).filter(|u| !**u) {
                *slot = true;
                self.next = (at + 1) % n;
                return Ok(at as u32);
            }
        }
        Err(PublishError::Full(what))
    }

    fn free_count(&self) -> usize {
        self.used.iter().filter(|u| !**u).count()
    }

    fn free(&mut self, slot: u32) {
        if let Some(u) = self.used.get_mut(slot as usize) {
            *u = false;
        }
    }
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
    /// Last health verdict (true until a health check says otherwise).
    pub healthy: bool,
    /// Whether its next hop is resolved (always, for a publisher that does not manage next
    /// hops): a backend takes new flows only when it is healthy and reachable.
    pub reachable: bool,
    /// The next hop the slot's live `NEXT_HOPS` half holds (`None`: none written, or an
    /// unresolved entry).
    pub hop: Option<NextHop>,
    /// Which `NEXT_HOPS` half of the slot is live.
    pub half: u32,
}

impl BackendState {
    /// Takes new flows: healthy and reachable.
    pub fn usable(&self) -> bool {
        self.healthy && self.reachable
    }

    /// The backend's map entry. A healthy backend whose next hop became unresolved after it
    /// was resolved drains: out of every table, but its tracked flows stay on the last next
    /// hop, so a carrier blip or a neighbour being re-resolved (the kernel passes through
    /// `FAILED` when a MAC changes unannounced) resets no connection; its health check
    /// decides whether it is gone.
    fn entry(&self) -> Backend {
        let state = match (self.healthy, self.reachable, self.weight) {
            (false, _, _) => BACKEND_DOWN,
            (true, false, _) if self.hop.is_some() => BACKEND_DRAINING,
            (true, false, _) => BACKEND_DOWN,
            (true, true, 0) => BACKEND_DRAINING,
            (true, true, _) => BACKEND_UP,
        };
        Backend {
            addr: addr16(self.address),
            family: family(self.address) as u32,
            state,
            hop: self.half,
            _pad: 0,
        }
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

impl PoolState {
    /// Backends that receive new flows (healthy and reachable).
    pub fn healthy_count(&self) -> usize {
        self.backends.iter().filter(|b| b.usable()).count()
    }
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
    groups: BTreeMap<String, decide::GroupState>,
    /// Each backend address's next hop as last reported ([`Publisher::set_next_hops`]):
    /// `Some` resolved, `None` unresolved.
    hops: BTreeMap<IpAddr, Option<NextHop>>,
    /// Whether a backend whose address has no reported next hop is unreachable (the agent,
    /// which resolves next hops) or reachable (a publisher whose next hops nobody manages).
    require_hops: bool,
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

impl Publisher {
    /// A publisher with nothing published (generation 0).
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
            require_hops: false,
        }
    }

    /// This publisher, with next hops managed: a backend takes new flows only once
    /// [`set_next_hops`](Self::set_next_hops) reported its next hop resolved.
    #[must_use]
    pub fn requiring_next_hops(mut self) -> Self {
        self.require_hops = true;
        let hops = &self.hops;
        for b in self.pools.values_mut().flat_map(|p| p.backends.iter_mut()) {
            let reachable = matches!(hops.get(&b.address), Some(Some(_)));
            if !reachable && b.reachable {
                // A restored backend whose slot holds no resolved next hop: a down entry is
                // explained by that, so its health is unknown, and unknown is healthy (as for
                // a new backend) until a probe says otherwise.
                b.reachable = false;
                b.healthy = true;
            }
        }
        self
    }

    /// Whether a backend at `address` is reachable by what is known of its next hop.
    fn reachable(&self, address: IpAddr) -> bool {
        match self.hops.get(&address) {
            Some(hop) => hop.is_some(),
            None => !self.require_hops,
        }
    }

    /// Records next hops (`Some` resolved, `None` unresolved) and writes them into every slot
    /// of their addresses; a backend that became reachable or unreachable changes its pools'
    /// tables. Order per pool: a backend's next hop is written before the table names it;
    /// one that becomes unreachable leaves the table before its entry changes (to draining:
    /// tracked flows stay on the last next hop, which stays in the map). Returns the pools
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
        self.hops.extend(batch.iter().map(|(a, h)| (*a, *h)));
        let mut changed = Vec::new();
        for (name, pool) in &mut self.pools {
            let mut up = Vec::new();
            let mut down = Vec::new();
            for b in &mut pool.backends {
                let Some(&hop) = batch.get(&b.address) else {
                    continue;
                };
                let was = b.usable();
                // An unresolved next hop keeps the last resolved one in the map, for the
                // backend's tracked flows; nothing half-known is published.
                let wrote = match hop {
                    Some(_) => b.write_hop(dp, hop)?,
                    None => false,
                };
                b.reachable = hop.is_some();
                if b.usable() && !was {
                    up.push(b.slot);
                } else if was && !b.usable() {
                    down.push(b.slot);
                } else if wrote {
                    // Same usability, new next hop: the entry flips to the half just written.
                    dp.set_backend(b.slot, b.entry())?;
                }
            }
            if up.is_empty() && down.is_empty() {
                continue;
            }
            // Up: the entry (with its next hop's half) is valid before the table names it.
            for b in pool.backends.iter().filter(|b| up.contains(&b.slot)) {
                dp.set_backend(b.slot, b.entry())?;
            }
            publish_pool(dp, name, pool, false)?;
            // Unusable: out of the table first, then the entry drains (or goes down).
            for b in pool.backends.iter().filter(|b| down.contains(&b.slot)) {
                dp.set_backend(b.slot, b.entry())?;
            }
            changed.push(name.clone());
        }
        Ok(changed)
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

    /// Makes the maps hold `cfg`, keeping the health of backends that stay. Returns the new
    /// generation.
    pub fn apply(&mut self, dp: &mut dyn Dataplane, cfg: &Config) -> Result<u64, PublishError> {
        self.apply_decided(dp, cfg, &BTreeMap::new())
    }

    /// [`apply`](Self::apply), with the actions the engine decided for decision groups (a
    /// group missing here keeps its published action; a new one without an action publishes a
    /// word with no pool until [`publish_decision`](Self::publish_decision)).
    pub fn apply_decided(
        &mut self,
        dp: &mut dyn Dataplane,
        cfg: &Config,
        decided: &BTreeMap<String, rules::engine::Action>,
    ) -> Result<u64, PublishError> {
        // 0. Every slot the new config needs must be free now (old and new stand side by side
        //    until the removals): refuse before the first write rather than stop half way.
        self.reserve(cfg)?;
        // 1. Backends, pool by pool (new pools get slots; their tables come in step 2).
        let mut pools = BTreeMap::new();
        let mut retired = Vec::new();
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
        let mut adopted = std::collections::HashSet::new();
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
                    adopted.insert(orphan.slot);
                    Some(orphan)
                });
                let (state, written) = match prev {
                    Some(prev) => (
                        BackendState {
                            weight: b.weight,
                            // Nothing probes a pool without a health check: a backend its
                            // removed check had marked down would stay down for good.
                            healthy: prev.healthy || p.health_check.is_none(),
                            ..prev.clone()
                        },
                        Some(prev.entry()),
                    ),
                    None => {
                        let mut fresh = BackendState {
                            address: b.address,
                            slot: self.backend_slots.take("backend")?,
                            weight: b.weight,
                            healthy: true,
                            reachable: self.reachable(b.address),
                            hop: None,
                            half: 0,
                        };
                        // A taken slot may hold an earlier backend's next hop: its live half
                        // gets this address's (or an unresolved entry) before anything names it.
                        let hop = self.hops.get(&b.address).copied().flatten();
                        dp.set_next_hop(next_hop_index(fresh.slot, 1), hop.unwrap_or_default())?;
                        fresh.hop = hop;
                        fresh.half = 1;
                        (fresh, None)
                    }
                };
                // Only what differs is written: a restarted agent that resumed the maps rewrites
                // nothing for an unchanged backend.
                if written != Some(state.entry()) {
                    dp.set_backend(state.slot, state.entry())?;
                }
                backends.push(state);
            }
            // Backends that left this pool stay as they are until the pool's new table is live
            // (step 2): marked down before, they would drop the flows the old table still
            // sends them; freed before, a new backend could take the slot the old table names.
            retired.extend(old_backends.into_values());
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
            pools.insert(p.name.clone(), (state, flags_changed));
        }
        // 2. Tables and pool words.
        for (name, (pool, flags_changed)) in &mut pools {
            publish_pool(dp, name, pool, *flags_changed)?;
        }
        let pools: BTreeMap<String, PoolState> =
            pools.into_iter().map(|(n, (p, _))| (n, p)).collect();
        // No live table names the backends that left a pool now: down (their tracked flows
        // re-select), then their slots are free.
        for gone in retired {
            dp.set_backend(
                gone.slot,
                BackendState {
                    healthy: false,
                    ..gone
                }
                .entry(),
            )?;
            self.backend_slots.free(gone.slot);
        }
        // Pools no longer configured: their backends go down; slots are freed after services.
        let removed_pools = std::mem::replace(&mut self.pools, pools);
        // 3 + 4. Decisions (groups' words first), then services.
        let group_names: Vec<String> = cfg.decisions.iter().map(|g| g.name.clone()).collect();
        let removed_groups = self.apply_groups(dp, &group_names, decided)?;
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
            let word = group.map_or_else(|| self.decision_word(&s.to), |(_, w)| w);
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
        // 5. Removals, in reverse.
        stale.extend(std::mem::replace(&mut self.services, services).into_values());
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
            for b in gone.backends.iter().filter(|b| !adopted.contains(&b.slot)) {
                dp.set_backend(
                    b.slot,
                    BackendState {
                        healthy: false,
                        ..b.clone()
                    }
                    .entry(),
                )?;
                self.backend_slots.free(b.slot);
            }
            self.pool_slots.free(gone.slot);
        }
        // Next hops of addresses no pool has any more are forgotten: one that comes back gets
        // the resolver's report, not a MAC from before it left.
        let configured: std::collections::HashSet<IpAddr> = cfg
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

    /// Records a health verdict for `address` in `pool`; on a change, writes the backend's state
    /// and republishes the pool's table. Returns whether anything changed. Unknown pools or
    /// addresses (a probe that outlived a config change) are ignored.
    pub fn set_health(
        &mut self,
        dp: &mut dyn Dataplane,
        pool: &str,
        address: IpAddr,
        healthy: bool,
    ) -> Result<bool, PublishError> {
        let Some(p) = self.pools.get_mut(pool) else {
            return Ok(false);
        };
        let Some(b) = p.backends.iter_mut().find(|b| b.address == address) else {
            return Ok(false);
        };
        if b.healthy == healthy {
            return Ok(false);
        }
        b.healthy = healthy;
        let (slot, entry) = (b.slot, b.entry());
        if healthy {
            // Up: the slot is valid before the table points at it.
            dp.set_backend(slot, entry)?;
            publish_pool(dp, pool, p, false)?;
        } else {
            // Down: out of the table first, then tracked flows re-select.
            publish_pool(dp, pool, p, false)?;
            dp.set_backend(slot, entry)?;
        }
        Ok(true)
    }

    /// The word of a service's static target: the same encoder as a group's action
    /// ([`action_word`](Self::action_word)); a `decide` target is published through its group's
    /// slot, never here, so it gets a word with no pool.
    fn decision_word(&self, to: &Target) -> u64 {
        let action = match to {
            Target::Decide(_) => None,
            Target::Pool(p) => Some(rules::engine::Action::Pool(p.clone())),
            Target::Split(shares) => Some(rules::engine::Action::Split(
                shares.iter().map(|s| (s.pool.clone(), s.weight)).collect(),
            )),
        };
        self.action_word(action.as_ref(), None)
    }
}

/// Builds `pool`'s table from its usable (healthy and reachable), weighted backends; when it differs from the live one
/// (or the flags changed), writes the inactive half and flips.
fn publish_pool(
    dp: &mut dyn Dataplane,
    name: &str,
    pool: &mut PoolState,
    flags_changed: bool,
) -> Result<(), PublishError> {
    let input: Vec<(u32, IpAddr, u32)> = pool
        .backends
        .iter()
        .filter(|b| b.usable() && b.weight > 0)
        .map(|b| (b.slot, b.address, b.weight))
        .collect();
    // Same members as the live table: it stands, unbuilt. Otherwise build, and write only a
    // table that differs (the inactive half, then one flip, which also carries the flags).
    if !(pool.live.is_some() && pool.built_from.as_ref() == Some(&input)) {
        let members: Vec<MaglevBackend> = input
            .iter()
            .map(|&(id, address, weight)| MaglevBackend {
                id,
                key: address.to_string(),
                weight,
            })
            .collect();
        let table =
            maglev::build(&members, MAGLEV_SIZE).map_err(|source| PublishError::Maglev {
                pool: name.to_owned(),
                source,
            })?;
        pool.built_from = Some(input);
        if pool.live.as_ref() != Some(&table) {
            let half = pool.active ^ 1;
            dp.write_table(pool.slot, half, &table)?;
            dp.set_pool(
                pool.slot,
                Pool {
                    active: half,
                    flags: pool.flags,
                },
            )?;
            pool.active = half;
            pool.live = Some(table);
            return Ok(());
        }
    }
    if flags_changed {
        dp.set_pool(
            pool.slot,
            Pool {
                active: pool.active,
                flags: pool.flags,
            },
        )?;
    }
    Ok(())
}

mod decide;
mod ledger;
pub use decide::GroupState;
pub use ledger::{Ledger, LedgerPool, LedgerService, RestoreError};

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod order_tests;
#[cfg(test)]
mod restore_tests;

#[cfg(test)]
mod tests;
