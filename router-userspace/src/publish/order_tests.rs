//! The publisher's write order, checked after every single write: at no point may a service's
//! live tables name a backend slot that is unwritten, down, or holds a backend the pool never
//! had, nor may a published service lack its filter bit or its slot. Also: an apply that cannot be completed must not start.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use router_common::{
    BACKEND_DOWN, BACKEND_DRAINING, Backend, Config as Generation, Decision, FILTER_F_NAT,
    FILTER_FLAGS, FILTER_NAT_REPLY, FILTER_SERVICE, MAX_BACKENDS, NH_F_RESOLVED, NO_BACKEND,
    NO_POOL, NextHop, Pool, SVC_F_NAT, Service, ServiceKey, hash::filter_bit, next_hop_index,
};

use super::{PublishError, Publisher, addr16};
use crate::{
    config::{
        Agent, Backend as CfgBackend, Config, Conntrack, Forward, HashMode, Pool as CfgPool,
        Protocol, Service as CfgService, Target, WhenAllDown,
    },
    dataplane::{Dataplane, DataplaneError, memory::MemoryDataplane},
};

/// A [`MemoryDataplane`] that checks the program's view after every write.
#[derive(Default)]
struct Checked {
    inner: MemoryDataplane,
    /// Distinct entries of each pool's live table.
    live: HashMap<u32, HashSet<u32>>,
    /// Addresses each pool slot may name (its backends before and after the apply); pools
    /// missing here are not checked for identity.
    allowed: HashMap<u32, HashSet<[u8; 16]>>,
    /// Everything found wrong, with the write that exposed it.
    violations: Vec<String>,
    /// Whether a live table may name only slots whose live next hop is resolved.
    require_hops: bool,
}

impl Checked {
    fn refresh(&mut self, pool: u32) {
        let entries = self
            .inner
            .live_table(pool)
            .map(|t| t.iter().copied().filter(|e| *e != NO_BACKEND).collect())
            .unwrap_or_default();
        self.live.insert(pool, entries);
    }

    fn check(&mut self, write: &str) {
        let mut found = Vec::new();
        for (key, svc) in &self.inner.services {
            // A packet finds the service only through its filter bit, and a tracked flow of it
            // only while its slot holds it.
            let bit = router_common::hash::filter_bit(
                &key.addr,
                key.port,
                key.proto,
                key.family,
                router_common::FILTER_SERVICE,
            );
            let word = self.inner.filter.get(&(bit / 64)).copied().unwrap_or(0);
            if word & (1 << (bit % 64)) == 0 {
                found.push(format!("service {key:?} has no filter bit"));
            }
            if self.inner.service_slots.get(&svc.id) != Some(&(*key, *svc)) {
                found.push(format!(
                    "service {key:?}: its slot {} holds another",
                    svc.id
                ));
            }
            let Some(word) = self.inner.decisions.get(&svc.decision) else {
                found.push(format!("service {key:?} has no decision word"));
                continue;
            };
            let d = Decision::decode(*word);
            for pool in [d.pool_a, d.pool_b, d.fallback] {
                if pool == NO_POOL {
                    continue;
                }
                let pool = u32::from(pool);
                let Some(entries) = self.live.get(&pool) else {
                    found.push(format!(
                        "service {key:?}: pool slot {pool} has no live table"
                    ));
                    continue;
                };
                for slot in entries {
                    match self.inner.backends.get(slot) {
                        None => found.push(format!("pool {pool} names unwritten slot {slot}")),
                        Some(b) if b.state == BACKEND_DOWN => {
                            found.push(format!("pool {pool} names down slot {slot}"));
                        }
                        Some(b) => {
                            let hop = self
                                .inner
                                .next_hops
                                .get(&next_hop_index(*slot, b.hop))
                                .copied()
                                .unwrap_or_default();
                            if self.require_hops && hop.flags & NH_F_RESOLVED == 0 {
                                found.push(format!(
                                    "pool {pool} names slot {slot}, whose live next hop is \
                                     unresolved"
                                ));
                            }
                            if let Some(ok) = self.allowed.get(&pool)
                                && !ok.contains(&b.addr)
                            {
                                found.push(format!(
                                    "pool {pool} names slot {slot}, which now holds a backend \
                                     of another pool"
                                ));
                            }
                        }
                    }
                }
            }
        }
        found.extend(self.filter_violations());
        for f in found {
            self.violations.push(format!("after {write}: {f}"));
        }
    }

    /// Whether `bit` of the filter is set, as the program reads it.
    fn filter_has(&self, bit: u32) -> bool {
        let word = self.inner.filter.get(&(bit / 64)).copied().unwrap_or(0);
        (word >> (bit % 64)) & 1 != 0
    }

    /// What the filter hides: a service in `SERVICES` without its bit, or whose slot does not
    /// hold its key; a NAT service (by its slot, which tracked flows read) whose replies can
    /// come from a usable backend without that source's bit, or without the flag word. A
    /// tracked NAT flow stays on its backend while the backend is usable (not down) and the
    /// slot holds the service, whichever pool the backend is in now.
    fn filter_violations(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (key, svc) in &self.inner.services {
            let bit = filter_bit(&key.addr, key.port, key.proto, key.family, FILTER_SERVICE);
            if !self.filter_has(bit) {
                found.push(format!(
                    "service {key:?} is in SERVICES without its filter bit"
                ));
            }
            match self.inner.service_slots.get(&svc.id) {
                Some((k, _)) if k == key => {}
                _ => found.push(format!(
                    "service {key:?} names slot {}, which does not hold its key",
                    svc.id
                )),
            }
        }
        let flags = self.inner.filter.get(&FILTER_FLAGS).copied().unwrap_or(0);
        for (key, svc) in self.inner.service_slots.values() {
            if svc.flags & SVC_F_NAT == 0 {
                continue;
            }
            for (slot, b) in &self.inner.backends {
                if b.state == BACKEND_DOWN || b.family != u32::from(key.family) {
                    continue;
                }
                let bit = filter_bit(&b.addr, key.port, key.proto, key.family, FILTER_NAT_REPLY);
                if !self.filter_has(bit) || flags & FILTER_F_NAT == 0 {
                    found.push(format!(
                        "NAT service {key:?}: the replies of usable backend slot {slot} \
                         ({:?}) have no filter bit",
                        &b.addr[..4]
                    ));
                }
            }
        }
        found
    }
}

impl Dataplane for Checked {
    fn set_backend(&mut self, slot: u32, backend: Backend) -> Result<(), DataplaneError> {
        self.inner.set_backend(slot, backend)?;
        self.check(&format!("set_backend({slot}, state {})", backend.state));
        Ok(())
    }
    fn set_next_hop(&mut self, index: u32, hop: NextHop) -> Result<(), DataplaneError> {
        self.inner.set_next_hop(index, hop)?;
        self.check(&format!("set_next_hop({index})"));
        Ok(())
    }
    fn write_table(&mut self, pool: u32, half: u32, table: &[u32]) -> Result<(), DataplaneError> {
        self.inner.write_table(pool, half, table)?;
        self.refresh(pool);
        self.check(&format!("write_table({pool}, {half})"));
        Ok(())
    }
    fn set_pool(&mut self, slot: u32, pool: Pool) -> Result<(), DataplaneError> {
        self.inner.set_pool(slot, pool)?;
        self.refresh(slot);
        self.check(&format!("set_pool({slot})"));
        Ok(())
    }
    fn set_decision(&mut self, slot: u32, word: u64) -> Result<(), DataplaneError> {
        self.inner.set_decision(slot, word)?;
        self.check(&format!("set_decision({slot})"));
        Ok(())
    }
    fn set_service(&mut self, key: ServiceKey, service: Service) -> Result<(), DataplaneError> {
        self.inner.set_service(key, service)?;
        self.check("set_service");
        Ok(())
    }
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DataplaneError> {
        self.inner.remove_service(key)?;
        self.check("remove_service");
        Ok(())
    }
    fn free_service_slot(&mut self, slot: u32) -> Result<(), DataplaneError> {
        self.inner.free_service_slot(slot)?;
        self.check("free_service_slot");
        Ok(())
    }
    fn set_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        self.inner.set_filter_word(index, word)?;
        self.check(&format!("set_filter_word({index})"));
        Ok(())
    }
    fn set_config(&mut self, config: Generation) -> Result<(), DataplaneError> {
        self.inner.set_config(config)
    }
    fn set_vip(
        &mut self,
        key: router_common::VipKey,
        vip: Option<router_common::Vip>,
    ) -> Result<(), DataplaneError> {
        self.inner.set_vip(key, vip)
    }
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "fixture addresses: 250 to an octet, and no test asks for enough to overflow one"
)]
fn addrs(prefix: [u8; 2], n: usize) -> Vec<IpAddr> {
    (0..n)
        .map(|i| {
            IpAddr::from([
                10,
                prefix[0],
                prefix[1] + (i / 250) as u8,
                1 + (i % 250) as u8,
            ])
        })
        .collect()
}

fn pool(name: &str, backends: Vec<IpAddr>) -> CfgPool {
    CfgPool {
        name: name.into(),
        backends: backends
            .into_iter()
            .map(|address| CfgBackend {
                address,
                weight: 100,
            })
            .collect(),
        health_check: None,
        when_all_down: WhenAllDown::Drop,
        slow_start: None,
        breaker: None,
        adaptive: None,
        on_backend_down: crate::config::FlowPolicy::Keep,
    }
}

fn service(name: &str, port: u16, to: &str) -> CfgService {
    CfgService {
        name: name.into(),
        vip: "198.18.0.10".parse().unwrap(),
        port,
        protocol: Protocol::Tcp,
        forward: Forward::DsrL2,
        hash: HashMode::FiveTuple,
        to: Target::Pool(to.into()),
    }
}

fn config(services: Vec<CfgService>, pools: Vec<CfgPool>) -> Config {
    Config {
        agent: Agent::default(),
        fleet: None,
        conntrack: Conntrack::default(),
        announce: None,
        hooks: Vec::new(),
        vips: vec![],
        services,
        pools,
        state: vec![],
        decisions: vec![],
        classes: Vec::new(),
        rules: std::sync::Arc::default(),
    }
}

/// Allows, for each pool of `cfgs` published by `p`, every address it has in any of them.
fn allow(dp: &mut Checked, p: &Publisher, cfgs: &[&Config]) {
    for cfg in cfgs {
        for pool in &cfg.pools {
            if let Some(state) = p.pools().get(&pool.name) {
                dp.allowed
                    .entry(state.slot)
                    .or_default()
                    .extend(pool.backends.iter().map(|b| addr16(b.address)));
            }
        }
    }
}

#[test]
fn a_backend_removed_from_a_pool_leaves_the_table_before_it_goes_down() {
    let mut dp = Checked::default();
    let mut p = Publisher::new();
    let before = config(
        vec![service("web", 80, "dc1")],
        vec![pool("dc1", addrs([1, 0], 3))],
    );
    p.apply(&mut dp, &before).unwrap();
    let after = config(
        vec![service("web", 80, "dc1")],
        vec![pool("dc1", addrs([1, 0], 2))],
    );
    p.apply(&mut dp, &after).unwrap();
    assert_violations(&dp);
}

#[test]
fn a_slot_freed_in_an_apply_is_not_reused_while_a_live_table_names_it() {
    // Leave one slot free, the last, so the allocator wraps around in the second apply.
    let filler = addrs([2, 0], MAX_BACKENDS as usize - 3);
    let mut dp = Checked::default();
    let mut p = Publisher::new();
    let before = config(
        vec![service("web", 80, "a"), service("api", 81, "b")],
        vec![
            pool("a", addrs([1, 0], 1)),
            pool("b", addrs([3, 0], 1)),
            pool("filler", filler.clone()),
        ],
    );
    p.apply(&mut dp, &before).unwrap();
    // Pool "a" swaps its backend; "b" gains one, which takes the first free slot after the
    // last one taken: the slot "a" just gave up, while a's live table still names it.
    let after = config(
        vec![service("web", 80, "a"), service("api", 81, "b")],
        vec![
            pool("a", addrs([1, 1], 1)),
            pool("b", [addrs([3, 0], 1), addrs([3, 1], 1)].concat()),
            pool("filler", filler),
        ],
    );
    allow(&mut dp, &p, &[&before, &after]);
    match p.apply(&mut dp, &after) {
        // Refusing the transition (not enough slots to build it beside the old one) is fine,
        // as long as nothing was exposed on the way.
        Ok(_) | Err(PublishError::Full(_)) => {}
        Err(e) => panic!("{e}"),
    }
    assert_violations(&dp);
}

#[test]
fn an_apply_that_cannot_get_its_slots_changes_nothing() {
    // One pool of more than half the backend slots renumbered at once: more slots than there
    // are would be needed side by side.
    let half = MAX_BACKENDS as usize / 2 + 1;
    let mut dp = Checked::default();
    let mut p = Publisher::new();
    let before = config(
        vec![service("web", 80, "dc1")],
        vec![pool("dc1", addrs([1, 0], half))],
    );
    p.apply(&mut dp, &before).unwrap();
    let generation = p.generation();
    let writes = dp.inner.log.len();
    let maps = |dp: &Checked| {
        (
            dp.inner.services.clone(),
            dp.inner.decisions.clone(),
            dp.inner.pools.clone(),
            dp.inner.backends.clone(),
        )
    };
    let published = maps(&dp);
    let slots: Vec<u32> = p.pools()["dc1"].backends.iter().map(|b| b.slot).collect();
    let after = config(
        vec![service("web", 80, "dc1")],
        vec![pool("dc1", addrs([50, 0], half))],
    );
    assert!(matches!(
        p.apply(&mut dp, &after),
        Err(PublishError::Full("backend"))
    ));
    assert_eq!(
        dp.inner.log.len(),
        writes,
        "the refused apply wrote to the maps"
    );
    assert_eq!(p.generation(), generation);
    // The publisher still knows what runs: re-applying it changes nothing.
    p.apply(&mut dp, &before).unwrap();
    assert!(
        maps(&dp) == published,
        "re-applying the running config changed the maps"
    );
    let again: Vec<u32> = p.pools()["dc1"].backends.iter().map(|b| b.slot).collect();
    assert_eq!(again, slots);
    assert_violations(&dp);
}

fn assert_violations(dp: &Checked) {
    assert!(
        dp.violations.is_empty(),
        "{} exposed states, first: {:#?}",
        dp.violations.len(),
        &dp.violations[..dp.violations.len().min(3)]
    );
}

/// A resolved next hop whose destination MAC ends in `tag`.
fn hop(tag: u8) -> NextHop {
    NextHop {
        ifindex: 7,
        flags: NH_F_RESOLVED,
        macs: [2, 0, 0, 0, 0, tag, 2, 0, 0, 0, 0, 0xfe],
        mtu: 1500,
    }
}

#[test]
fn a_table_names_only_backends_whose_next_hop_is_resolved() {
    let mut dp = Checked {
        require_hops: true,
        ..Checked::default()
    };
    let mut p = Publisher::new().requiring_next_hops();
    let backends = addrs([3, 0], 4);
    let cfg = config(
        vec![service("web", 80, "dc1")],
        vec![pool("dc1", backends.clone())],
    );
    // Two resolved before the apply, one after, one never.
    p.set_next_hops(
        &mut dp,
        &[(backends[0], Some(hop(1))), (backends[1], Some(hop(2)))],
    )
    .unwrap();
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(p.health().counts("dc1").0, 2);
    let changed = p
        .set_next_hops(&mut dp, &[(backends[2], Some(hop(3)))])
        .unwrap();
    assert_eq!(changed, vec!["dc1".to_owned()]);
    assert_eq!(p.health().counts("dc1").0, 3);
    // A changed MAC is written into the other half, which the entry then names.
    let slot = p.pools()["dc1"].backends[0].slot;
    let half = dp.inner.backends[&slot].hop;
    assert!(
        p.set_next_hops(&mut dp, &[(backends[0], Some(hop(9)))])
            .unwrap()
            .is_empty()
    );
    let now = dp.inner.backends[&slot].hop;
    assert_ne!(
        now, half,
        "the changed next hop was written over the live half"
    );
    assert_eq!(dp.inner.next_hops[&next_hop_index(slot, now)], hop(9));
    assert_eq!(dp.inner.next_hops[&next_hop_index(slot, half)], hop(1));
    // Unresolved after it was resolved: out of the table, the entry drains (its tracked flows
    // stay), the last next hop kept. One never resolved is down.
    p.set_next_hops(&mut dp, &[(backends[1], None)]).unwrap();
    assert_eq!(p.health().counts("dc1").0, 2);
    let gone = p.pools()["dc1"].backends[1].slot;
    assert_eq!(dp.inner.backends[&gone].state, BACKEND_DRAINING);
    let never = p.pools()["dc1"].backends[3].slot;
    assert_eq!(dp.inner.backends[&never].state, BACKEND_DOWN);
    let table = dp.inner.live_table(p.pools()["dc1"].slot).unwrap();
    assert!(!table.contains(&gone));
    // A slot taken again starts from an unresolved entry, not its last occupant's next hop.
    let other = config(
        vec![service("web", 80, "dc1")],
        vec![pool("dc1", addrs([4, 0], 1))],
    );
    for _ in 0..3 {
        p.apply(&mut dp, &other).unwrap();
        p.apply(&mut dp, &cfg).unwrap();
    }
    assert_violations(&dp);
}

/// `service` with `forward: nat`.
fn nat(mut service: CfgService) -> CfgService {
    service.forward = Forward::Nat;
    service
}

#[test]
fn a_backend_added_to_a_nat_pool_has_its_reply_bit_before_a_table_names_it() {
    let mut dp = Checked::default();
    let mut p = Publisher::new();
    let before = config(
        vec![nat(service("dns", 53, "dc1"))],
        vec![pool("dc1", addrs([1, 0], 2))],
    );
    p.apply(&mut dp, &before).unwrap();
    assert_violations(&dp);
    // The new backend is in the live table (its new flows are NATed to it) from step 2 on:
    // its replies need their bit from then on, not from the services step.
    let after = config(
        vec![nat(service("dns", 53, "dc1"))],
        vec![pool("dc1", addrs([1, 0], 3))],
    );
    p.apply(&mut dp, &after).unwrap();
    assert_violations(&dp);
}

#[test]
fn a_nat_service_moved_to_another_pool_keeps_the_reply_bits_of_its_tracked_backends() {
    let mut dp = Checked::default();
    let mut p = Publisher::new();
    // dc1 stays configured (another service uses it): its backends stay usable, so the NAT
    // service's flows tracked on them keep going there after the move (a conntrack hit needs
    // only the slot's key and a usable backend), and so must their replies.
    let before = config(
        vec![nat(service("dns", 53, "dc1")), service("web", 80, "dc1")],
        vec![pool("dc1", addrs([1, 0], 2)), pool("dc2", addrs([2, 0], 2))],
    );
    p.apply(&mut dp, &before).unwrap();
    let after = config(
        vec![nat(service("dns", 53, "dc2")), service("web", 80, "dc1")],
        vec![pool("dc1", addrs([1, 0], 2)), pool("dc2", addrs([2, 0], 2))],
    );
    p.apply(&mut dp, &after).unwrap();
    let key = p.services()["dns"].key;
    for b in addrs([1, 0], 2) {
        let bit = filter_bit(
            &addr16(b),
            key.port,
            key.proto,
            key.family,
            FILTER_NAT_REPLY,
        );
        assert!(
            dp.filter_has(bit),
            "the replies of {b} (dc1), where dns's tracked flows still go, lost their bit"
        );
    }
    assert_violations(&dp);
}

/// A [`MemoryDataplane`] whose `set_service` fails once, after `ok` more succeed.
struct FailingService {
    inner: MemoryDataplane,
    ok: Option<usize>,
}

impl Dataplane for FailingService {
    fn set_backend(&mut self, slot: u32, backend: Backend) -> Result<(), DataplaneError> {
        self.inner.set_backend(slot, backend)
    }
    fn set_next_hop(&mut self, index: u32, hop: NextHop) -> Result<(), DataplaneError> {
        self.inner.set_next_hop(index, hop)
    }
    fn write_table(&mut self, pool: u32, half: u32, table: &[u32]) -> Result<(), DataplaneError> {
        self.inner.write_table(pool, half, table)
    }
    fn set_pool(&mut self, slot: u32, pool: Pool) -> Result<(), DataplaneError> {
        self.inner.set_pool(slot, pool)
    }
    fn set_decision(&mut self, slot: u32, word: u64) -> Result<(), DataplaneError> {
        self.inner.set_decision(slot, word)
    }
    fn set_service(&mut self, key: ServiceKey, service: Service) -> Result<(), DataplaneError> {
        match self.ok {
            Some(0) => {
                self.ok = None;
                Err(DataplaneError::MissingMap("SERVICES (injected failure)"))
            }
            Some(n) => {
                self.ok = Some(n - 1);
                self.inner.set_service(key, service)
            }
            None => self.inner.set_service(key, service),
        }
    }
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DataplaneError> {
        self.inner.remove_service(key)
    }
    fn free_service_slot(&mut self, slot: u32) -> Result<(), DataplaneError> {
        self.inner.free_service_slot(slot)
    }
    fn set_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        self.inner.set_filter_word(index, word)
    }
    fn set_config(&mut self, config: Generation) -> Result<(), DataplaneError> {
        self.inner.set_config(config)
    }
    fn set_vip(
        &mut self,
        key: router_common::VipKey,
        vip: Option<router_common::Vip>,
    ) -> Result<(), DataplaneError> {
        self.inner.set_vip(key, vip)
    }
}

#[test]
fn an_apply_that_fails_half_way_through_the_services_leaves_no_stale_slot_once_it_succeeds() {
    let mut dp = FailingService {
        inner: MemoryDataplane::default(),
        ok: None,
    };
    let mut p = Publisher::new();
    let pools = || vec![pool("dc1", addrs([1, 0], 2))];
    p.apply(
        &mut dp,
        &config(
            vec![service("a", 80, "dc1"), service("b", 81, "dc1")],
            pools(),
        ),
    )
    .unwrap();
    // Both services change value (DSR → NAT); the second write fails.
    let after = config(
        vec![nat(service("a", 80, "dc1")), nat(service("b", 81, "dc1"))],
        pools(),
    );
    dp.ok = Some(1);
    assert!(p.apply(&mut dp, &after).is_err());
    // The agent logs the failure and applies again on the next reload.
    p.apply(&mut dp, &after).unwrap();
    // Every slot the program can forward a tracked flow on is one the publisher holds (else
    // a flow naming it is served by the value it held, and nothing ever frees it).
    for (slot, (key, _)) in &dp.inner.service_slots {
        assert!(
            p.services()
                .values()
                .any(|s| s.value.id == *slot && s.key == *key),
            "slot {slot} holds {key:?}, but the publisher does not hold it: {:?}",
            p.services()
        );
    }
}
