//! Resuming maps an earlier publisher wrote: a restored publisher must behave exactly like the
//! one that wrote them — the same slots, health, live halves and decisions, and the same writes
//! for the next change.

use std::collections::BTreeMap;

use rules::engine::Action;

use super::{Publisher, RestoreError};
use crate::{
    config::model::SwitchPolicy,
    dataplane::memory::{MemoryDataplane, Write},
    state::tests::web_failover,
};

/// A publisher that applied the web-failover config, switched to dc2, and saw one backend go
/// down; with its maps.
fn running() -> (Publisher, MemoryDataplane) {
    let cfg = web_failover(SwitchPolicy::default());
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let decided = BTreeMap::from([("web-failover".to_owned(), Action::pool("dc1"))]);
    p.apply_decided(&mut dp, &cfg, &decided).expect("apply");
    p.publish_decision(&mut dp, "web-failover", &Action::pool("dc2"))
        .expect("switch");
    let b = p.pools()["dc1"].backends[0].address;
    assert!(p.set_health(&mut dp, "dc1", b, false).expect("health"));
    (p, dp)
}

fn same(a: &Publisher, b: &Publisher) {
    assert_eq!(a.ledger(), b.ledger());
    assert_eq!(a.generation(), b.generation());
    assert_eq!(a.services(), b.services());
    assert_eq!(a.groups(), b.groups());
    for (name, pa) in a.pools() {
        let pb = &b.pools()[name];
        assert_eq!(pa.backends, pb.backends, "pool {name}");
        assert_eq!(
            (pa.slot, pa.flags, pa.active),
            (pb.slot, pb.flags, pb.active)
        );
        assert_eq!(pa.live, pb.live, "pool {name} live table");
    }
}

#[test]
fn a_restored_publisher_is_the_one_that_wrote_the_maps() {
    let (p, dp) = running();
    let ledger = p.ledger();
    // The ledger is what the history store keeps: it survives JSON.
    let json = serde_json::to_string(&ledger).expect("json");
    let ledger = serde_json::from_str(&json).expect("parse");
    let r = Publisher::restore(&ledger, &dp).expect("restore");
    same(&p, &r);
}

#[test]
fn the_next_change_writes_the_same_as_without_a_restart() {
    let (mut p, dp) = running();
    let r = Publisher::restore(&p.ledger(), &dp).expect("restore");
    let mut r = r;
    // The next config: dc1 renamed to east (same backends), a backend added to dc2.
    let mut next = web_failover(SwitchPolicy::default());
    for pool in &mut next.pools {
        if pool.name == "dc2" {
            let mut extra = pool.backends[0].clone();
            extra.address = "198.18.2.99".parse().unwrap();
            pool.backends.push(extra);
        }
    }
    let (mut dp1, mut dp2) = (dp.clone(), dp);
    dp1.log.clear();
    dp2.log.clear();
    p.apply(&mut dp1, &next).expect("apply without restart");
    r.apply(&mut dp2, &next).expect("apply after restart");
    assert_eq!(dp1.log, dp2.log);
    same(&p, &r);
}

#[test]
fn an_unchanged_config_after_a_restart_rewrites_no_backend_table_or_service() {
    let (p, dp) = running();
    let mut r = Publisher::restore(&p.ledger(), &dp).expect("restore");
    let mut dp = dp;
    dp.log.clear();
    r.apply(&mut dp, &web_failover(SwitchPolicy::default()))
        .expect("apply");
    let rewrites: Vec<_> = dp
        .log
        .iter()
        .filter(|w| !matches!(w, Write::Config(_)))
        .collect();
    assert!(rewrites.is_empty(), "{rewrites:?}");
}

#[test]
fn maps_of_another_generation_are_not_resumed() {
    let (p, mut dp) = running();
    let ledger = p.ledger();
    dp.config.generation += 1;
    assert!(matches!(
        Publisher::restore(&ledger, &dp),
        Err(RestoreError::Generation { .. })
    ));
}

#[test]
fn a_ledger_naming_a_service_the_maps_lack_is_refused() {
    let (p, mut dp) = running();
    dp.services.clear();
    assert!(matches!(
        Publisher::restore(&p.ledger(), &dp),
        Err(RestoreError::Mismatch(_))
    ));
}

#[test]
fn a_renamed_pool_keeps_its_backends_slots_so_tracked_flows_stay() {
    let (mut p, mut dp) = running();
    let before: Vec<(std::net::IpAddr, u32)> = p.pools()["dc2"]
        .backends
        .iter()
        .map(|b| (b.address, b.slot))
        .collect();
    let mut next = web_failover(SwitchPolicy::default());
    for pool in &mut next.pools {
        if pool.name == "dc2" {
            pool.name = "east".into();
        }
    }
    for svc in &mut next.services {
        if let crate::config::Target::Pool(name) = &mut svc.to
            && name == "dc2"
        {
            *name = "east".into();
        }
    }
    // The decision group's rules name dc2: rename there too.
    let text = format!("{:?}", next.decisions);
    assert!(text.contains("dc2"), "{text}");
    next.decisions.clear();
    next.state.clear();
    for svc in &mut next.services {
        if matches!(svc.to, crate::config::Target::Decide(_)) {
            svc.to = crate::config::Target::Pool("east".into());
        }
    }
    dp.log.clear();
    p.apply(&mut dp, &next).expect("apply");
    let after: Vec<(std::net::IpAddr, u32)> = p.pools()["east"]
        .backends
        .iter()
        .map(|b| (b.address, b.slot))
        .collect();
    assert_eq!(before, after);
    for (_, slot) in &after {
        let down = dp.log.iter().any(|w| {
            matches!(w, Write::Backend(s, b) if s == slot && b.state == router_common::BACKEND_DOWN)
        });
        assert!(!down, "slot {slot} was marked down: {:?}", dp.log);
    }
}

/// The config after [`running`]'s: a backend added to dc2 and dc1's first backend removed.
fn grown() -> crate::config::Config {
    let mut next = web_failover(SwitchPolicy::default());
    for pool in &mut next.pools {
        if pool.name == "dc2" {
            let mut extra = pool.backends[0].clone();
            extra.address = "198.18.2.99".parse().unwrap();
            pool.backends.push(extra);
        }
        if pool.name == "dc1" {
            pool.backends.remove(0);
        }
    }
    next
}

#[test]
fn maps_ahead_of_the_ledger_resume_from_it_and_the_same_config_takes_the_same_slots() {
    let (mut p, mut dp) = running();
    let ledger = p.ledger();
    // An apply whose version was never recorded.
    p.apply(&mut dp, &grown()).expect("unrecorded apply");
    assert!(matches!(
        Publisher::restore(&ledger, &dp),
        Err(RestoreError::Generation { .. })
    ));
    let mut r = Publisher::restore_behind(&ledger, &dp).expect("restore behind");
    assert_eq!(r.generation(), p.generation());
    let mut again = dp.clone();
    r.apply(&mut again, &grown()).expect("apply again");
    assert!(r.generation() > p.generation());
    let (a, b) = (p.ledger(), r.ledger());
    assert_eq!(a.pools, b.pools, "the same slots for the same config");
    assert_eq!(a.services, b.services);
    assert_eq!(a.groups, b.groups);
    assert_eq!(again.backends, dp.backends);
}

#[test]
fn maps_ahead_are_refused_when_a_slot_holds_another_backend() {
    let (mut p, mut dp) = running();
    let ledger = p.ledger();
    p.apply(&mut dp, &grown()).expect("unrecorded apply");
    let slot = ledger.pools["dc2"].backends[0].1;
    dp.backends.get_mut(&slot).expect("slot").addr[3] ^= 0xff;
    assert!(matches!(
        Publisher::restore_behind(&ledger, &dp),
        Err(RestoreError::Mismatch(_))
    ));
    // Not ahead at all: the exact restore's business.
    let (p, dp) = running();
    assert!(matches!(
        Publisher::restore_behind(&p.ledger(), &dp),
        Err(RestoreError::Generation { .. })
    ));
}

/// A start that resumes the maps without an apply (the same config) takes the pools' settings
/// no map holds from that config: the next flip still gives its previous table a second
/// chance, as it would have before the restart.
#[test]
fn a_resumed_publisher_takes_the_pools_settings_that_no_map_holds() {
    use std::time::Duration;

    use router_common::POOL_F_SECOND_CHANCE;
    let mut cfg = web_failover(SwitchPolicy::default());
    cfg.conntrack.second_chance = Duration::from_mins(1);
    for pool in &mut cfg.pools {
        pool.slow_start = Some(Duration::from_secs(30));
    }
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let decided = BTreeMap::from([("web-failover".to_owned(), Action::pool("dc1"))]);
    p.apply_decided(&mut dp, &cfg, &decided).expect("apply");
    let mut r = Publisher::restore(&p.ledger(), &dp).expect("restore");
    assert_eq!(r.pools()["dc1"].second_chance, Duration::ZERO, "restored");
    r.resume_settings(&cfg);
    for (name, pool) in r.pools() {
        assert_eq!(pool.second_chance, Duration::from_mins(1), "pool {name}");
        assert_eq!(
            pool.slow_start,
            Some(Duration::from_secs(30)),
            "pool {name}"
        );
        assert_eq!(pool.trial_weight, 100, "pool {name}");
    }
    let slot = r.pools()["dc1"].slot;
    let b = r.pools()["dc1"].backends[0].address;
    assert!(r.set_health(&mut dp, "dc1", b, false).expect("health"));
    assert_ne!(
        dp.pools[&slot].flags & POOL_F_SECOND_CHANCE,
        0,
        "the flip gave the previous table no second chance"
    );
}
