//! One apply, in the order of the module docs: reserve, backends, tables, decision words,
//! filter and services, removals, generation.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
};

use router_common::{
    ABI_VERSION, POOL_F_ALL_DOWN_PASS, POOL_F_LEFT_CHANCE, SVC_F_CLASSES, SVC_F_HASH_SOURCE,
    SVC_F_IPIP, SVC_F_NAT, SVC_F_SPLIT_CLIENT, SVC_F_SPLIT_PREFIX, SVC_F_VIP_LIMIT, Service,
    next_hop_index,
};

use super::{
    BackendState, FlowMarks, PoolState, PublishError, Publisher, ServiceState, service_key, tables,
};
use crate::{
    config::{Config, Forward, HashMode, SplitBy, Target, WhenAllDown},
    dataplane::Dataplane,
};

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

    /// Takes the settings of `cfg`'s pools that no map holds — `conntrack.second_chance`,
    /// `slow_start` and the breaker's trial weight — into a publisher restored from the maps
    /// `cfg` wrote, when the start resumes them without an apply (the same config). Restored,
    /// they are neutral (no second chance, no slow start, a trial weight of 100 %): without
    /// this, a restarted agent would give no flip a second chance until its next config change.
    pub fn resume_settings(&mut self, cfg: &Config) {
        for p in &cfg.pools {
            if let Some(state) = self.pools.get_mut(&p.name) {
                state.second_chance = cfg.conntrack.second_chance;
                state.slow_start = p.slow_start;
                state.trial_weight = trial_weight(p);
            }
        }
        self.set_classes(cfg);
    }

    /// Takes the client classes of `cfg` and the groups that look them up: what the class
    /// words of the next writes follow.
    fn set_classes(&mut self, cfg: &Config) {
        self.classes = cfg.classes.iter().map(|c| c.name.clone()).collect();
        self.class_groups = cfg
            .decisions
            .iter()
            .filter(|g| g.uses_classes())
            .map(|g| g.name.clone())
            .collect();
    }

    /// Makes `CLIENT_CLASSES` hold the prefix set of `cfg` ([`Config::class_prefixes`]),
    /// new and changed prefixes before removals (`classes::replace_class_prefixes`). The first
    /// call of a process reads what an earlier one left.
    fn write_class_prefixes(
        &mut self,
        dp: &mut dyn Dataplane,
        cfg: &Config,
    ) -> Result<(), PublishError> {
        let wanted: BTreeMap<super::classes::ClientPrefix, u32> = cfg
            .class_prefixes()
            .into_iter()
            .filter_map(|(r, id)| {
                Some((super::classes::ClientPrefix::new(r.network, r.prefix)?, id))
            })
            .collect();
        let mut published = match self.prefixes.take() {
            Some(p) => p,
            None => super::classes::read_class_prefixes(&*dp),
        };
        let result = super::classes::replace_class_prefixes(dp, &mut published, &wanted);
        self.prefixes = Some(published);
        result?;
        Ok(())
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
        // The filter with the bits of the running and the new config, before anything a
        // packet can reach changes: a backend added to a NAT pool is named by its table
        // (step 2), and a new pool by a group's word (step 3), before the services step.
        let filter = super::filter::build(cfg);
        self.write_filter(dp, self.filter_union(&filter))?;
        // 1. Backends, pool by pool.
        let staged = self.stage_backends(dp, cfg)?;
        // 2. Tables and pool words; then the backends that left a pool.
        let removed_pools = self.publish_tables(dp, staged.pools, staged.retired)?;
        // 3 + 4. Decisions (groups' words first, each group's class words before its word),
        //    the client-class prefix set, then services (a service looks classes up only once
        //    its group's class words are written).
        self.set_classes(cfg);
        let group_names: Vec<String> = cfg.decisions.iter().map(|g| g.name.clone()).collect();
        let removed_groups = self.apply_groups(dp, &group_names, decided)?;
        self.write_class_prefixes(dp, cfg)?;
        let stale = self.publish_services(dp, cfg)?;
        // 5. Removals, in reverse. A failed removal keeps the rest for the next apply.
        let mut stale = stale.into_iter();
        while let Some(gone) = stale.next() {
            let removed = if self.services.values().any(|s| s.key == gone.key) {
                Ok(())
            } else {
                dp.remove_service(&gone.key)
            }
            .and_then(|()| dp.free_service_slot(gone.value.id));
            if let Err(e) = removed {
                self.stale.push(gone);
                self.stale.extend(stale);
                return Err(e.into());
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
        // Virtual IPs: what their traffic that no service takes gets.
        self.configure_vips(dp, cfg)?;
        self.write_filter(dp, filter)?;
        // 6. Generation, with the flow timeouts (a change of timeouts alone is an apply too:
        //    every apply writes them).
        self.generation += 1;
        dp.set_config(router_common::Config {
            generation: self.generation,
            abi_version: ABI_VERSION,
            _pad: 0,
            timeouts: cfg.conntrack.ticks(),
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
            let marks = FlowMarks {
                on_down: p.on_backend_down,
                left: old.as_ref().and_then(|o| o.marks.left),
            };
            let mut backends = Vec::with_capacity(p.backends.len());
            for b in &p.backends {
                let prev = old_backends.remove(&b.address).or_else(|| {
                    let orphan = orphans.remove(&b.address)?;
                    staged.adopted.insert(orphan.slot);
                    Some(orphan)
                });
                let mut state = match prev {
                    // An adaptive weight stands while the pool keeps adaptive weights and the
                    // backend its base; otherwise the runtime gives the new one after the apply.
                    Some(prev) => BackendState {
                        weight: b.weight,
                        adaptive: prev
                            .adaptive
                            .filter(|_| p.adaptive.is_some() && prev.weight == b.weight),
                        ..prev
                    },
                    None => self.fresh_backend(dp, b.address, b.weight)?,
                };
                // Only what differs is written: a restarted agent that resumed the maps
                // rewrites nothing for an unchanged backend.
                state.write(dp, state.entry(self.health.get(&p.name, b.address), marks))?;
                backends.push(state);
            }
            // Backends that left this pool stay as they are until the pool's new table is
            // live (step 2): marked down before, they would drop the flows the old table
            // still sends them; freed before, a new backend could take the slot the old table
            // names.
            staged.retired.extend(old_backends.into_values());
            // A group's second chance on the pool outlives the apply (its deadline ends it).
            let left = old.as_ref().map_or(0, |o| o.flags & POOL_F_LEFT_CHANCE);
            let flags = left
                | match p.when_all_down {
                    WhenAllDown::Drop => 0,
                    WhenAllDown::Pass => POOL_F_ALL_DOWN_PASS,
                };
            let flags_changed = old.as_ref().is_none_or(|o| o.flags != flags);
            let state = match old {
                Some(o) => PoolState {
                    flags,
                    backends,
                    slow_start: p.slow_start,
                    trial_weight: trial_weight(p),
                    marks,
                    second_chance: cfg.conntrack.second_chance,
                    // A grace under way never outlasts the new setting: one turned off (or
                    // shortened) ends at once (in step 2) rather than at the old deadline.
                    chance_until: o
                        .chance_until
                        .map(|t| t.min(self.now.saturating_add(cfg.conntrack.second_chance))),
                    left_until: o
                        .left_until
                        .map(|t| t.min(self.now.saturating_add(cfg.conntrack.second_chance))),
                    ..o
                },
                None => PoolState {
                    slot: self.pool_slots.take("pool")?,
                    flags,
                    backends,
                    slow_start: p.slow_start,
                    trial_weight: trial_weight(p),
                    marks,
                    second_chance: cfg.conntrack.second_chance,
                    chance_until: None,
                    left_until: None,
                    active: 1,
                    live: None,
                    digest: None,
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
            // What the slot's previous backend left (its generation continues), if this
            // process freed it.
            written: self.freed.remove(&slot),
            ramp: None,
            adaptive: None,
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
        let mut chances = Vec::new();
        for (name, (pool, flags_changed)) in &mut pools {
            let (health, now) = (&self.health, self.now);
            if tables::publish_deferring(dp, name, pool, health, *flags_changed, now, true)? {
                chances.push(name.clone());
            }
        }
        let pools: BTreeMap<String, PoolState> =
            pools.into_iter().map(|(n, (p, _))| (n, p)).collect();
        for gone in retired {
            self.retire(dp, gone)?;
        }
        // A replaced table that named a retired backend is a second chance only once that
        // backend's entry is down.
        for name in &chances {
            if let Some(pool) = pools.get(name) {
                tables::begin_second_chance(dp, pool)?;
            }
        }
        Ok(std::mem::replace(&mut self.pools, pools))
    }

    /// Marks a backend no table names down and frees its slot.
    fn retire(
        &mut self,
        dp: &mut dyn Dataplane,
        mut gone: BackendState,
    ) -> Result<(), PublishError> {
        gone.write(dp, gone.entry(None, FlowMarks::default()))?;
        if let Some(last) = gone.written {
            self.freed.insert(gone.slot, last);
        }
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
        let mut stale = std::mem::take(&mut self.stale);
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
                None => match self.service_slots.take("service") {
                    Ok(slot) => slot,
                    Err(e) => {
                        self.services.extend(services);
                        self.stale = stale;
                        return Err(e);
                    }
                },
            };
            let group = match &s.to {
                Target::Decide(g) => self.groups.get(g).map(|g| (g.slot, g.word)),
                _ => None,
            };
            let word = group.map_or_else(|| self.target_word(&s.to), |(_, w)| w);
            let mut flags = 0;
            let (mut encap_mask, mut encap_src) = (0, [0; 16]);
            match s.forward {
                Forward::DsrL2 => {}
                Forward::Nat => flags |= SVC_F_NAT,
                Forward::Ipip(range) => {
                    flags |= SVC_F_IPIP;
                    (encap_src, encap_mask) = encap_range(range);
                }
            }
            if s.hash == HashMode::SourceIp {
                flags |= SVC_F_HASH_SOURCE;
            }
            if let Target::Decide(g) = &s.to {
                flags |= self.group_flags(cfg, g);
            }
            if cfg
                .vips
                .iter()
                .any(|v| v.address == s.vip && v.new_flows_per_second.is_some())
            {
                flags |= SVC_F_VIP_LIMIT;
            }
            // A service's decision slot is its own slot, or its group's.
            let value = Service {
                id: slot,
                decision: group.map_or(slot, |(g, _)| g),
                flags,
                encap_mask,
                encap_src,
            };
            let written = if group.is_none()
                && old
                    .as_ref()
                    .is_none_or(|o| o.word != word || o.value.decision != slot)
            {
                dp.set_decision(slot, word)
            } else {
                Ok(())
            }
            .and_then(|()| {
                if old.as_ref().is_none_or(|o| o.value != value) {
                    dp.set_service(key, value)
                } else {
                    Ok(())
                }
            });
            if let Err(e) = written {
                // The publisher holds what runs: the services written so far, the ones not
                // reached, and this one as it was. A slot this one took (its writes may have
                // reached it) is removed by the next apply, unless it is published by then.
                match old {
                    Some(o) => {
                        self.services.insert(s.name.clone(), o);
                    }
                    None => stale.push(ServiceState { key, value, word }),
                }
                self.services.extend(services);
                self.stale = stale;
                return Err(e.into());
            }
            services.insert(s.name.clone(), ServiceState { key, value, word });
        }
        stale.extend(std::mem::replace(&mut self.services, services).into_values());
        Ok(stale)
    }

    /// The service flags a service of group `g` takes from it: `SVC_F_CLASSES` when the
    /// group acts per class and its class words are in the map, the split flags of its
    /// `split_by`.
    fn group_flags(&self, cfg: &Config, g: &str) -> u32 {
        let mut flags = 0;
        // Only once the group's class words are in the map.
        if self.class_groups.contains(g)
            && self.groups.get(g).is_some_and(|g| g.class_words.is_some())
        {
            flags |= SVC_F_CLASSES;
        }
        match cfg
            .decisions
            .iter()
            .find(|d| d.name == g)
            .map(|d| d.split_by)
        {
            Some(SplitBy::Client) => flags |= SVC_F_SPLIT_CLIENT,
            Some(SplitBy::ClientPrefix) => flags |= SVC_F_SPLIT_CLIENT | SVC_F_SPLIT_PREFIX,
            Some(SplitBy::Flow) | None => {}
        }
        flags
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

/// The `Service` fields of an `ipip` service's source range: its network address (map
/// layout) and the host bits of its last 32-bit word in host order (`router_common::encap_source`).
#[must_use]
pub fn encap_range(range: crate::config::SourceRange) -> ([u8; 16], u32) {
    let host_bits = match range.network {
        std::net::IpAddr::V4(_) => 32 - u32::from(range.prefix),
        std::net::IpAddr::V6(_) => (128 - u32::from(range.prefix)).min(32),
    };
    let mask = u32::MAX.checked_shr(32 - host_bits).unwrap_or(0);
    (super::addr16(range.network), mask)
}

/// A pool's half-open share, percent: its breaker's `trial_weight`, 100 without a breaker.
fn trial_weight(p: &crate::config::model::Pool) -> u32 {
    p.breaker.map_or(100, |b| b.trial_weight)
}

#[cfg(test)]
mod encap_tests {
    use super::encap_range;
    use crate::config::SourceRange;

    #[test]
    fn an_encap_range_is_its_network_and_the_host_bits_of_its_last_word() {
        let r = |net: &str, prefix| {
            encap_range(SourceRange {
                network: net.parse().unwrap(),
                prefix,
            })
        };
        let (src, mask) = r("198.18.250.0", 24);
        assert_eq!((&src[..4], mask), (&[198, 18, 250, 0][..], 0xff));
        assert_eq!(r("198.18.250.7", 32).1, 0);
        assert_eq!(r("198.18.0.0", 15).1, 0x1_ffff);
        assert_eq!(r("2001:db8:250::", 64).1, u32::MAX);
        assert_eq!(r("2001:db8:250::", 120).1, 0xff);
        assert_eq!(r("2001:db8:250::1", 128).1, 0);
    }
}
