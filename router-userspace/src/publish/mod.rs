//! The map writer: turns a validated [`Config`] plus backend health into map contents, and
//! writes only what changed, in an order that never exposes a half-built state.
//!
//! Order of one apply (ARCHITECTURE.md, "Map writes"):
//! 0. nothing, unless the slots the new config needs beside the running one are all free;
//!    then the service filter, with the bits of the running and the new config ([`filter`]):
//!    before any table or word names a backend whose NAT replies need a bit;
//! 1. backends that are new or changed (a service cannot reach them yet);
//! 2. pool tables: each changed table is written into the pool's inactive half, then the pool's
//!    `active` word flips (one update); then the backends that left a pool go down and free
//!    their slots (no live table names them any more);
//! 3. decision words (one 8-byte update each; a group that acts per client class writes its
//!    class words first), then the client-class prefix set;
//! 4. services (new or changed: a service's slot, then its key);
//! 5. removals in reverse: services (key, then slot), then backends marked down (their tracked
//!    flows re-select), then pool and decision slots freed; then the filter without the bits
//!    of removed services;
//! 6. the `CONFIG` word: the generation, with the flow timeouts of `conntrack:` (written by
//!    every apply, so a change of timeouts alone takes effect).
//!
//! Backend health is not the publisher's: it reads the one [`Health`] table, which it keeps
//! beside what it published so that the state store and the decision groups read the same
//! table ([`Publisher::health`]).
//!
//! Parts: [`slots`] (round-robin allocation), [`tables`] (Maglev tables and backend entries in
//! their safe order), [`words`] (the one encoder of decision words, and decision groups),
//! [`ledger`] (slot names kept per version, to resume the maps after a restart).

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    time::Duration,
};

use router_common::{
    BACKEND_DOWN, BACKEND_DRAINING, BACKEND_EVICTED, BACKEND_F_KEEP, BACKEND_F_MIGRATE,
    BACKEND_F_RESET, BACKEND_UP, Backend, FAMILY_V4, FAMILY_V6, MAX_BACKENDS, MAX_POOLS,
    MAX_SERVICES, NextHop, PROTO_TCP, PROTO_UDP, Service, ServiceKey, next_hop_index,
};

use crate::{
    breaker::Phase,
    config::{self, FlowPolicy, Protocol},
    dataplane::{Dataplane, DataplaneError},
    health::{BackendHealth, Drain, Health},
    maglev::MaglevError,
};

mod apply;
pub use apply::encap_range;
pub mod classes;
mod filter;
mod ledger;
mod slots;
pub mod tables;
pub mod vips;
mod words;

pub use ledger::{Ledger, LedgerPool, LedgerService, RestoreError};
use slots::Slots;
pub use words::{ClassWords, GroupState};

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

/// Steps of a slow start: its weight lags the linear schedule by at most `1 / RAMP_STEPS` of
/// the weight.
pub const RAMP_STEPS: u32 = 20;
/// The shortest time between two steps of slow starts.
pub const RAMP_STEP_MIN: Duration = Duration::from_millis(100);

/// What a pool's backend entries say about their tracked flows (`router_common::BACKEND_F_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowMarks {
    /// `on_backend_down` of the running config: for a backend whose health check failed.
    pub on_down: FlowPolicy,
    /// `on_failback` of a decision group that failed back away from the pool and names it no
    /// more (`Publisher::set_left`), for every backend of the pool; `None` when no group left
    /// it, or one did under `keep`.
    pub left: Option<FlowPolicy>,
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
    /// Engine time its slow start began, while it ramps ([`tables::effective_weight`]).
    pub ramp: Option<Duration>,
    /// Its adaptive weight (`crate::weights`), which replaces `weight` in the table while its
    /// pool has adaptive weights; 0 keeps it out of the table like `weight: 0`.
    pub adaptive: Option<u32>,
}

impl BackendState {
    /// The weight the table is to give it once any slow start is over: its adaptive weight,
    /// or its configured one.
    #[must_use]
    pub fn target(&self) -> u32 {
        self.adaptive.unwrap_or(self.weight)
    }

    /// The backend's map entry for its health (`None`: not in the health table, down). A
    /// healthy backend whose next hop became unresolved after it was resolved drains: out of
    /// every table, but its tracked flows stay on the last next hop, so a carrier blip or a
    /// neighbour being re-resolved (the kernel passes through `FAILED` when a MAC changes
    /// unannounced) resets no connection; its health check decides whether it is gone.
    #[expect(
        clippy::match_same_arms,
        reason = "a table read top to bottom: unhealthy, evicted by a drain's timeout, then \
                  unreachable with a last next hop and without one, then drained, then by weight"
    )]
    fn entry(&self, health: Option<BackendHealth>, marks: FlowMarks) -> Backend {
        // A backend awaiting its first check has no flows to keep.
        let failed = health.is_some_and(|h| !h.healthy && !h.awaiting_check);
        let state = match health {
            None => BACKEND_DOWN,
            Some(h) => match (h.healthy, h.reachable, h.drain, self.target()) {
                (false, _, _, _) => BACKEND_DOWN,
                (_, _, Drain::Evicted, _) => BACKEND_EVICTED,
                (true, false, _, _) if self.hop.is_some() => BACKEND_DRAINING,
                (true, false, _, _) => BACKEND_DOWN,
                (true, true, Drain::Draining, _) => BACKEND_DRAINING,
                (true, true, _, 0) => BACKEND_DRAINING,
                // An open circuit breaker drains: tracked flows stay, no new ones.
                (true, true, _, _) if h.breaker == Phase::Open => BACKEND_DRAINING,
                (true, true, _, _) => BACKEND_UP,
            },
        };
        // A failed check's flows follow `on_backend_down`; a removed backend's, or one without
        // a next hop, are re-selected (there is nowhere to keep them).
        let down = match (failed, marks.on_down) {
            (true, FlowPolicy::Keep) => BACKEND_F_KEEP,
            (true, FlowPolicy::Reset) => BACKEND_F_RESET,
            _ => 0,
        };
        let left = match marks.left {
            Some(FlowPolicy::Reset) => BACKEND_F_RESET,
            Some(FlowPolicy::Migrate) => BACKEND_F_MIGRATE,
            _ => 0,
        };
        let state = state | down | left;
        let (addr, family) = (addr16(self.address), u32::from(family(self.address)));
        let generation = match self.written {
            Some(w) if (w.state, w.addr, w.family) == (state, addr, family) => w.generation,
            Some(w) => w.generation.wrapping_add(1),
            None => fresh_generation(self.slot, &addr, state),
        };
        Backend {
            addr,
            family,
            state,
            hop: self.half,
            generation,
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
    /// `POOL_F_*` flags, with `POOL_F_LEFT_CHANCE` while a decision group that left the pool
    /// gives its flows a second chance (`POOL_F_SECOND_CHANCE` is never here).
    pub flags: u32,
    /// Backends in configuration order.
    pub backends: Vec<BackendState>,
    /// `slow_start` of the running config.
    pub slow_start: Option<Duration>,
    /// `breaker.trial_weight` of the running config, percent (100 without a breaker).
    pub trial_weight: u32,
    /// What its backend entries say about their tracked flows.
    pub marks: FlowMarks,
    /// `conntrack.second_chance` of the running config: how long the previous table stays
    /// readable after a flip (zero: never).
    pub second_chance: Duration,
    /// Engine time the second chance ends, while the map's `POOL_F_SECOND_CHANCE` is set
    /// (`flags` never holds it).
    chance_until: Option<Duration>,
    /// Engine time the second chance of a decision that left the pool ends, while `flags`
    /// holds `POOL_F_LEFT_CHANCE`.
    left_until: Option<Duration>,
    /// Which half is live.
    active: u32,
    /// The live table (None before the first write).
    live: Option<Vec<u32>>,
    /// [`fingerprint`] of `live`, taken when it is written or read back.
    digest: Option<u64>,
    /// The Maglev input `live` was built from (slot, address, weight of each member), so an
    /// apply that leaves a pool's members alone skips building its table (1 ms per pool).
    built_from: Option<Vec<(u32, IpAddr, u32)>>,
}

impl PoolState {
    /// The weight backend slot `slot` has in the live table (`None`: not in it).
    #[must_use]
    pub fn weight_in_table(&self, slot: u32) -> Option<u32> {
        self.built_from
            .as_ref()?
            .iter()
            .find(|m| m.0 == slot)
            .map(|m| m.2)
    }

    /// A fingerprint of the live Maglev table as the program reads it, with each entry's
    /// backend slot replaced by that backend's address: XXH64 (seed 0) over the entries in
    /// order, each as the 16 bytes of its address (IPv4 mapped into IPv6, RFC 4291 §2.5.5.2) or
    /// 16 bytes of `0xff` for an empty entry. Slots are local to a node (its history of
    /// changes assigns them), addresses are not: nodes with the same members, weights and table
    /// size have the same fingerprint (Maglev paper §3.3). `None` before the first write.
    #[must_use]
    pub fn table_digest(&self) -> Option<u64> {
        self.digest
    }

    /// Engine time the pool's second chance ends (`POOL_F_SECOND_CHANCE` set), if it has one.
    #[must_use]
    pub fn second_chance_until(&self) -> Option<Duration> {
        self.chance_until
    }

    /// Engine time the second chance of a decision group that left the pool ends
    /// (`POOL_F_LEFT_CHANCE` set), if it has one.
    #[must_use]
    pub fn left_chance_until(&self) -> Option<Duration> {
        self.left_until
    }
}

/// XXH64 (seed 0) over `table`'s entries in order, each as the 16 bytes of its backend's
/// address (IPv4 mapped into IPv6, RFC 4291 §2.5.5.2), or 16 bytes of `0xff` for an entry no
/// backend of `backends` holds ([`PoolState::table_digest`]).
fn fingerprint(table: &[u32], backends: &[BackendState]) -> u64 {
    let address: HashMap<u32, [u8; 16]> = backends
        .iter()
        .map(|b| {
            let v6 = match b.address {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            (b.slot, v6.octets())
        })
        .collect();
    let mut hash = xxhash_rust::xxh64::Xxh64::new(0);
    for id in table {
        hash.update(address.get(id).unwrap_or(&[0xff; 16]));
    }
    hash.digest()
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
    /// The last entry written to each backend slot this process freed: the next backend in the
    /// slot continues its generation, so no copy made under an earlier one becomes valid.
    freed: BTreeMap<u32, Backend>,
    groups: BTreeMap<String, GroupState>,
    /// Each backend address's resolved next hop as last reported
    /// ([`Publisher::set_next_hops`]), for the slots it takes later.
    hops: BTreeMap<IpAddr, NextHop>,
    /// The backend-health table the maps were written from.
    health: Health,
    /// What `SERVICE_FILTER` holds (`None`: unknown, before the first write of this process).
    filter: Option<Vec<u64>>,
    /// Services an apply that failed part way left in the maps without holding them (a key
    /// and slot it wrote, or one it was about to remove): the next apply removes them with its
    /// own removals, so no slot keeps serving tracked flows unknown to the publisher.
    stale: Vec<ServiceState>,
    /// Engine time of the change being published ([`Publisher::set_now`]): when slow starts
    /// begin and how far they are.
    now: Duration,
    /// Engine time of the last [`Publisher::advance_ramps`].
    ramped_at: Duration,
    /// The virtual IPs, as published.
    vips: BTreeMap<IpAddr, vips::VipState>,
    /// Whether the keys an earlier process left in `VIPS` were read (and the stale removed).
    vips_read: bool,
    /// The client classes of the running config by id - 1 (sorted by name).
    classes: Vec<String>,
    /// The decision groups whose services look their clients' classes up
    /// (`DecisionGroup::uses_classes`): their class words are written with their words.
    class_groups: std::collections::BTreeSet<String>,
    /// What `CLIENT_CLASSES` holds (`None`: not read yet by this process).
    prefixes: Option<BTreeMap<classes::ClientPrefix, u32>>,
}

impl Default for Publisher {
    fn default() -> Self {
        Self::new()
    }
}

/// A backend generation for a slot whose earlier value this process does not know: a hash of
/// the slot's value under a seed drawn once per process, so it repeats none a previous process
/// wrote there (but for a chance of one in 2^32), and one process computes it alike for the
/// same value (a restored publisher writes what the running one would).
fn fresh_generation(slot: u32, addr: &[u8; 16], state: u32) -> u32 {
    use std::hash::BuildHasher as _;
    static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let h = SEED
        .get_or_init(std::collections::hash_map::RandomState::new)
        .hash_one((slot, addr, state));
    #[expect(
        clippy::cast_possible_truncation,
        reason = "any 32 bits of the hash will do"
    )]
    let g = h as u32;
    g
}

/// An address as the maps hold it: network order, IPv4 in the first four bytes.
#[must_use]
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
#[must_use]
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
    /// A publisher with nothing published (generation 0), whose backends need no next hop.
    #[must_use]
    pub fn new() -> Self {
        Self {
            generation: 0,
            services: BTreeMap::new(),
            pools: BTreeMap::new(),
            service_slots: Slots::new(MAX_SERVICES),
            pool_slots: Slots::new(MAX_POOLS),
            backend_slots: Slots::new(MAX_BACKENDS),
            freed: BTreeMap::new(),
            groups: BTreeMap::new(),
            hops: BTreeMap::new(),
            health: Health::new(),
            filter: None,
            stale: Vec::new(),
            now: Duration::ZERO,
            ramped_at: Duration::ZERO,
            vips: BTreeMap::new(),
            vips_read: false,
            classes: Vec::new(),
            class_groups: std::collections::BTreeSet::new(),
            prefixes: None,
        }
    }

    /// Sets the engine time of what follows: the runtime sets it before each change, tests
    /// inject it.
    pub fn set_now(&mut self, now: Duration) {
        self.now = now;
    }

    /// When the slow starts take their next step (engine time), if any backend ramps: every
    /// [`RAMP_STEPS`]th of a ramping pool's `slow_start`, at least [`RAMP_STEP_MIN`] apart,
    /// and when a ramp ends, so a weight lags its schedule by at most one step and reaches
    /// its full value on time.
    #[must_use]
    pub fn next_ramp_step(&self) -> Option<Duration> {
        self.pools
            .values()
            .filter_map(|p| {
                let t = p.slow_start?;
                let starts = p.backends.iter().filter_map(|b| b.ramp);
                let first_end = starts.clone().filter_map(|s| s.checked_add(t)).min();
                let step = self
                    .ramped_at
                    .checked_add((t / RAMP_STEPS).max(RAMP_STEP_MIN));
                // Nothing ramps in this pool: no step.
                starts.min()?;
                [step, first_end].into_iter().flatten().min()
            })
            .min()
    }

    /// When the next second chance ends (engine time): a pool's previous table stops being
    /// read `conntrack.second_chance` after its flip.
    #[must_use]
    pub fn next_second_chance_end(&self) -> Option<Duration> {
        self.pools
            .values()
            .flat_map(|p| [p.chance_until, p.left_until])
            .flatten()
            .min()
    }

    /// Ends every second chance whose time is up (`POOL_F_SECOND_CHANCE` cleared). Returns the
    /// pools it ended in.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; the pool keeps its second chance and the next
    /// deadline tries again.
    pub fn end_second_chances(
        &mut self,
        dp: &mut dyn Dataplane,
    ) -> Result<Vec<String>, PublishError> {
        let mut ended = Vec::new();
        for (name, pool) in &mut self.pools {
            let mut end = false;
            if pool.left_until.is_some_and(|t| t <= self.now) {
                tables::set_left_chance(dp, pool, None)?;
                end = true;
            }
            if pool.chance_until.is_some_and(|t| t <= self.now) {
                tables::end_second_chance(dp, pool)?;
                end = true;
            }
            if end {
                ended.push(name.clone());
            }
        }
        Ok(ended)
    }

    /// Rebuilds the tables of pools with a backend in slow start, at the weights it has
    /// reached by now (only a table that changed is written). Returns the pools rebuilt.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; the publisher then holds what it wrote.
    pub fn advance_ramps(&mut self, dp: &mut dyn Dataplane) -> Result<Vec<String>, PublishError> {
        self.ramped_at = self.now;
        let mut rewritten = Vec::new();
        for (name, pool) in &mut self.pools {
            if pool.backends.iter().any(|b| b.ramp.is_some()) {
                tables::publish(dp, name, pool, &self.health, false, self.now)?;
                rewritten.push(name.clone());
            }
        }
        Ok(rewritten)
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
    #[must_use]
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Generation of the last applied config (0 before the first).
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Published pools by name.
    #[must_use]
    pub fn pools(&self) -> &BTreeMap<String, PoolState> {
        &self.pools
    }

    /// Published services by name.
    #[must_use]
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
            tables::refresh(dp, pool, p, &self.health, self.now)?;
        }
        self.write_vips(dp)?;
        Ok(true)
    }

    /// Sets the circuit-breaker phase of `address` in `pool` and rewrites the pool's table and
    /// entries in the safe order of [`tables::refresh`] (open: out of the table, tracked flows
    /// stay; half-open: its trial share). Returns whether anything changed, `None` when the
    /// pool has no such backend.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; the publisher then holds what it wrote.
    pub fn set_breaker(
        &mut self,
        dp: &mut dyn Dataplane,
        pool: &str,
        address: IpAddr,
        phase: Phase,
    ) -> Result<Option<bool>, PublishError> {
        let changed = self.health.set_breaker(pool, address, phase);
        if changed == Some(true)
            && let Some(p) = self.pools.get_mut(pool)
        {
            tables::refresh(dp, pool, p, &self.health, self.now)?;
            self.write_vips(dp)?;
        }
        Ok(changed)
    }

    /// Marks every backend entry of `pool` with what becomes of its tracked flows now that a
    /// decision group failed back away from it (`on_failback`; `None`, or `keep`, clears the
    /// mark: the group chose the pool again). Returns whether an entry changed.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; the publisher then holds what it wrote.
    pub fn set_left(
        &mut self,
        dp: &mut dyn Dataplane,
        pool: &str,
        policy: Option<FlowPolicy>,
    ) -> Result<bool, PublishError> {
        let left = policy.filter(|p| *p != FlowPolicy::Keep);
        let Some(p) = self.pools.get_mut(pool) else {
            return Ok(false);
        };
        if p.marks.left == left {
            return Ok(false);
        }
        p.marks.left = left;
        tables::refresh(dp, pool, p, &self.health, self.now)?;
        Ok(true)
    }

    /// Whether a service's static target or a decision group other than `except` sends new
    /// flows to `pool` now (its action, not its fallback).
    #[must_use]
    pub fn pool_in_use(&self, pool: &str, except: &str) -> bool {
        let by_group = self
            .groups
            .iter()
            .filter(|(name, _)| name.as_str() != except)
            .any(|(_, g)| {
                g.action
                    .as_ref()
                    .is_some_and(|a| a.live_pools().any(|p| p == pool))
            });
        let slot = self.pools.get(pool).map(|p| p.slot);
        let group_slots: std::collections::BTreeSet<u32> =
            self.groups.values().map(|g| g.slot).collect();
        let by_service = self.services.values().any(|s| {
            !group_slots.contains(&s.value.decision) && {
                let d = router_common::Decision::decode(s.word);
                slot.is_some_and(|slot| {
                    let slot = u16::try_from(slot).unwrap_or(router_common::NO_POOL);
                    d.pool_a == slot || (d.pool_b == slot && d.split_b > 0)
                })
            }
        });
        by_group || by_service
    }

    /// Drains `address` in `pool` (or ends its drain) and rewrites the pool's table and
    /// entries in the safe order of [`tables::refresh`]. Returns whether anything changed,
    /// `None` when the pool has no such backend.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; the publisher then holds what it wrote.
    pub fn set_drain(
        &mut self,
        dp: &mut dyn Dataplane,
        pool: &str,
        address: IpAddr,
        drain: Drain,
    ) -> Result<Option<bool>, PublishError> {
        let changed = self.health.set_drain(pool, address, drain);
        if changed == Some(true)
            && let Some(p) = self.pools.get_mut(pool)
        {
            tables::refresh(dp, pool, p, &self.health, self.now)?;
            self.write_vips(dp)?;
        }
        Ok(changed)
    }

    /// Sets the adaptive weights of `pool`'s backends (`None` for each: the configured weights
    /// stand) and rewrites the pool, entries and table in their safe order, when any changed.
    /// Returns whether one did.
    ///
    /// # Errors
    ///
    /// A map write failed, or the table could not be built.
    pub fn set_adaptive_weights(
        &mut self,
        dp: &mut dyn Dataplane,
        pool: &str,
        weights: &[(IpAddr, Option<u32>)],
    ) -> Result<bool, PublishError> {
        let Some(p) = self.pools.get_mut(pool) else {
            return Ok(false);
        };
        let mut changed = false;
        for b in &mut p.backends {
            if let Some(&(_, w)) = weights.iter().find(|(a, _)| *a == b.address)
                && b.adaptive != w
            {
                b.adaptive = w;
                changed = true;
            }
        }
        if changed {
            tables::refresh(dp, pool, p, &self.health, self.now)?;
            self.write_vips(dp)?;
        }
        Ok(changed)
    }

    /// The backend slot of `address` in `pool`, as published.
    #[must_use]
    pub fn backend_slot(&self, pool: &str, address: IpAddr) -> Option<u32> {
        self.pools
            .get(pool)?
            .backends
            .iter()
            .find(|b| b.address == address)
            .map(|b| b.slot)
    }

    /// Writes each backend slot of `slots` again with its generation advanced by one, nothing
    /// else changed: every CPU's flow cache then trusts no copy it made of a flow on it and
    /// reads `CONNTRACK` instead (`switchyard flows --purge`, after deleting the flows there).
    /// Slots the publisher does not hold are skipped. Returns how many were written.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; the slots written before it keep their new
    /// generation.
    pub fn renew_generations(
        &mut self,
        dp: &mut dyn Dataplane,
        slots: &[u32],
    ) -> Result<usize, PublishError> {
        let mut renewed = 0;
        for b in self
            .pools
            .values_mut()
            .flat_map(|p| p.backends.iter_mut())
            .filter(|b| slots.contains(&b.slot))
        {
            if let Some(w) = b.written {
                // `BackendState::entry` keeps a written generation while state and address
                // stay, so the next write of the slot continues from this one.
                let entry = Backend {
                    generation: w.generation.wrapping_add(1),
                    ..w
                };
                b.write(dp, entry)?;
                renewed += 1;
            }
        }
        Ok(renewed)
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
                tables::refresh(dp, name, p, &self.health, self.now)?;
            }
        }
        if !changed.is_empty() {
            self.write_vips(dp)?;
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod first_check_tests;
#[cfg(test)]
mod order_tests;
#[cfg(test)]
mod restore_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod words_tests;
