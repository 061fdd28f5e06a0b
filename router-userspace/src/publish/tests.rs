//! The publisher's unit tests: what one apply or health change writes, and in which order.
#![expect(
    clippy::cast_possible_truncation,
    reason = "pool slots, below MAX_POOLS, compared with the decision word's u16 fields"
)]

use std::time::Duration;

use router_common::{Decision, NO_BACKEND, SPLIT_SCALE};

use super::*;
use crate::config::FlowPolicy;
use crate::{
    config::{
        Agent, Backend as CfgBackend, Config, Conntrack, Forward, HashMode, Pool as CfgPool,
        Service as CfgService, SplitShare, Target, WhenAllDown,
    },
    dataplane::memory::{MemoryDataplane, Write},
};

fn pool(name: &str, addrs: &[(&str, u32)]) -> CfgPool {
    CfgPool {
        name: name.into(),
        backends: addrs
            .iter()
            .map(|(a, w)| CfgBackend {
                address: a.parse().unwrap(),
                weight: *w,
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

/// `p` with a TCP health check (health verdicts come only from a check).
fn checked(mut p: CfgPool) -> CfgPool {
    let every = std::time::Duration::from_millis(100);
    p.health_check = Some(crate::config::HealthCheck {
        kind: crate::config::CheckKind::Tcp { port: 80 },
        interval: every,
        timeout: every,
        unhealthy_threshold: 1,
        healthy_threshold: 1,
        backoff: crate::config::Backoff {
            factor: 1.0,
            max: every,
        },
    });
    p
}

fn service(name: &str, port: u16, to: Target) -> CfgService {
    CfgService {
        name: name.into(),
        vip: "198.18.0.10".parse().unwrap(),
        port,
        protocol: Protocol::Tcp,
        forward: Forward::DsrL2,
        hash: HashMode::FiveTuple,
        to,
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

fn owners(table: &[u32]) -> BTreeMap<u32, usize> {
    let mut m = BTreeMap::new();
    for id in table {
        *m.entry(*id).or_default() += 1;
    }
    m
}

#[test]
fn apply_publishes_backends_tables_decisions_services_in_order() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100), ("198.18.1.12", 100)])],
    );
    assert_eq!(p.apply(&mut dp, &cfg).unwrap(), 1);
    let pos = |f: &dyn Fn(&Write) -> bool| dp.log.iter().position(f).unwrap();
    let backend = pos(&|w| matches!(w, Write::Backend(..)));
    let table = pos(&|w| matches!(w, Write::Table(..)));
    let flip = pos(&|w| matches!(w, Write::Pool(..)));
    let decision = pos(&|w| matches!(w, Write::Decision(..)));
    let svc = pos(&|w| matches!(w, Write::Service(..)));
    let generation = pos(&|w| matches!(w, Write::Config(..)));
    assert!(
        backend < table && table < flip && flip < decision && decision < svc && svc < generation
    );

    let slot = p.pools()["dc1"].slot;
    let live = dp.live_table(slot).unwrap();
    let counts = owners(live);
    assert_eq!(counts.len(), 2, "both backends own entries: {counts:?}");
    let s = &p.services()["web"];
    assert_eq!(dp.services[&s.key], s.value);
    assert_eq!(
        Decision::decode(dp.decisions[&s.value.decision]).pool_a,
        slot as u16
    );
    assert_eq!(dp.config.generation, 1);
}

#[test]
fn reapplying_the_same_config_writes_only_the_generation() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100)])],
    );
    p.apply(&mut dp, &cfg).unwrap();
    dp.log.clear();
    p.apply(&mut dp, &cfg).unwrap();
    assert!(
        !dp.log.iter().any(|w| matches!(
            w,
            Write::Table(..) | Write::Service(..) | Write::Decision(..)
        )),
        "{:?}",
        dp.log
    );
    assert_eq!(dp.config.generation, 2);
}

#[test]
fn every_apply_writes_the_flow_timeouts_in_ticks_a_change_of_them_alone_included() {
    use router_common::{FLOW_TCP_CLOSING, FLOW_TCP_OPEN, FLOW_TCP_SYN, FLOW_UDP, ticks};
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100)])],
    );
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(dp.config.timeouts, router_common::DEFAULT_TIMEOUT_TICKS);
    cfg.conntrack = Conntrack {
        tcp_syn: Duration::from_secs(5),
        tcp_established: Duration::from_hours(1),
        tcp_closing: Duration::from_secs(2),
        udp: Duration::from_secs(30),
        second_chance: Duration::ZERO,
    };
    dp.log.clear();
    assert_eq!(p.apply(&mut dp, &cfg).unwrap(), 2);
    let Some(Write::Config(written)) = dp.log.last() else {
        panic!("the apply did not end with the CONFIG write: {:?}", dp.log);
    };
    let mut want = [0; router_common::FLOW_STATES];
    want[usize::from(FLOW_TCP_SYN)] = ticks(Duration::from_secs(5));
    want[usize::from(FLOW_TCP_OPEN)] = ticks(Duration::from_hours(1));
    want[usize::from(FLOW_TCP_CLOSING)] = ticks(Duration::from_secs(2));
    want[usize::from(FLOW_UDP)] = ticks(Duration::from_secs(30));
    assert_eq!(written.timeouts, want);
    assert_eq!(dp.config.generation, 2);
}

#[test]
fn an_unhealthy_backend_leaves_the_table_before_it_is_marked_down() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100), ("198.18.1.12", 100)])],
    );
    p.apply(&mut dp, &cfg).unwrap();
    let dead = p.pools()["dc1"].backends[0].slot;
    dp.log.clear();
    assert!(
        p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), false)
            .unwrap()
    );
    let flip = dp
        .log
        .iter()
        .position(|w| matches!(w, Write::Pool(..)))
        .unwrap();
    let down = dp
        .log
        .iter()
        .position(|w| matches!(w, Write::Backend(..)))
        .unwrap();
    assert!(
        flip < down,
        "table flipped before the backend went down: {:?}",
        dp.log
    );
    // `on_backend_down` defaults to keep: its tracked flows stay.
    assert_eq!(dp.backends[&dead].state, BACKEND_DOWN | BACKEND_F_KEEP);
    let slot = p.pools()["dc1"].slot;
    assert!(!dp.live_table(slot).unwrap().contains(&dead));
    // A repeated verdict changes nothing.
    assert!(
        !p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), false)
            .unwrap()
    );
    // Recovery: back in the table.
    assert!(
        p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), true)
            .unwrap()
    );
    assert!(dp.live_table(slot).unwrap().contains(&dead));
    assert_eq!(dp.backends[&dead].state, BACKEND_UP);
}

/// `on_backend_down` is written into a failed backend's entry as a flag; a change of it alone
/// rewrites the entry (with a new generation, so no cached copy of a flow outlives it); a
/// backend awaiting its first check, or removed, carries none.
#[test]
fn on_backend_down_marks_a_failed_backends_entry() {
    let (mut p, mut dp, mut cfg) = checked_pool_with_one_backend_down();
    let slot = p.pools()["dc1"].backends[1].slot;
    let mut generation = dp.backends[&slot].generation;
    for (policy, want) in [
        (FlowPolicy::Reset, BACKEND_DOWN | BACKEND_F_RESET),
        (FlowPolicy::Migrate, BACKEND_DOWN),
        (FlowPolicy::Keep, BACKEND_DOWN | BACKEND_F_KEEP),
    ] {
        cfg.pools[0].on_backend_down = policy;
        p.apply(&mut dp, &cfg).unwrap();
        assert_eq!(dp.backends[&slot].state, want, "{policy:?}");
        assert_ne!(dp.backends[&slot].generation, generation, "{policy:?}");
        generation = dp.backends[&slot].generation;
    }
    // A healthy backend carries no flag whatever the policy.
    let up = p.pools()["dc1"].backends[0].slot;
    assert_eq!(dp.backends[&up].state, BACKEND_UP);
    // Back up: the flag goes with the failure.
    p.set_health(&mut dp, "dc1", "198.18.1.12".parse().unwrap(), true)
        .unwrap();
    assert_eq!(dp.backends[&slot].state, BACKEND_UP);
    // Removed from the pool: its flows are re-selected, whatever the policy.
    p.set_health(&mut dp, "dc1", "198.18.1.12".parse().unwrap(), false)
        .unwrap();
    cfg.pools[0].backends.truncate(1);
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(dp.backends[&slot].state, BACKEND_DOWN);
}

#[test]
fn all_backends_down_empties_the_table() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(vec![], vec![pool("dc1", &[("198.18.1.11", 100)])]);
    p.apply(&mut dp, &cfg).unwrap();
    p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), false)
        .unwrap();
    let slot = p.pools()["dc1"].slot;
    assert!(
        dp.live_table(slot)
            .unwrap()
            .iter()
            .all(|e| *e == NO_BACKEND)
    );
}

/// A health-checked pool `dc1` of two backends, published; the second one then went down.
fn checked_pool_with_one_backend_down() -> (Publisher, MemoryDataplane, Config) {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(
        vec![],
        vec![checked(pool(
            "dc1",
            &[("198.18.1.11", 100), ("198.18.1.12", 100)],
        ))],
    );
    p.apply(&mut dp, &cfg).unwrap();
    p.set_health(&mut dp, "dc1", "198.18.1.12".parse().unwrap(), false)
        .unwrap();
    (p, dp, cfg)
}

#[test]
fn weight_zero_drains_health_survives_reapply() {
    let (mut p, mut dp, mut cfg) = checked_pool_with_one_backend_down();
    cfg.pools[0].backends[0].weight = 0;
    p.apply(&mut dp, &cfg).unwrap();
    let b = &p.pools()["dc1"].backends;
    assert_eq!(dp.backends[&b[0].slot].state, BACKEND_DRAINING);
    assert_eq!(
        dp.backends[&b[1].slot].state,
        BACKEND_DOWN | BACKEND_F_KEEP,
        "health kept across apply"
    );
}

#[test]
fn an_operators_drain_leaves_the_table_keeps_tracked_flows_and_survives_reapply() {
    let (mut p, mut dp, cfg) = checked_pool_with_one_backend_down();
    let a: IpAddr = "198.18.1.11".parse().unwrap();
    let slot = |p: &Publisher| p.backend_slot("dc1", a).unwrap();
    let live = |p: &Publisher, dp: &MemoryDataplane| {
        let pool = &p.pools()["dc1"];
        owners(&dp.tables[&(pool.slot, pool.active)])
    };
    assert_eq!(
        p.set_drain(&mut dp, "dc1", a, Drain::Draining).unwrap(),
        Some(true)
    );
    // Tracked flows stay (draining, not down); no table names it: the pool's other backend is
    // down, so the table is empty.
    assert_eq!(dp.backends[&slot(&p)].state, BACKEND_DRAINING);
    assert_eq!(
        live(&p, &dp).keys().copied().collect::<Vec<_>>(),
        [NO_BACKEND]
    );
    assert!(!p.health().usable("dc1", a));
    assert_eq!(
        p.set_drain(&mut dp, "dc1", a, Drain::Draining).unwrap(),
        Some(false)
    );
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(
        dp.backends[&slot(&p)].state,
        BACKEND_DRAINING,
        "kept by an apply"
    );
    p.set_drain(&mut dp, "dc1", a, Drain::Evicted).unwrap();
    assert_eq!(
        dp.backends[&slot(&p)].state,
        router_common::BACKEND_EVICTED,
        "its tracked flows re-selected, and a restart does not take it for a failed check"
    );
    p.set_drain(&mut dp, "dc1", a, Drain::Off).unwrap();
    assert_eq!(dp.backends[&slot(&p)].state, BACKEND_UP);
    assert_eq!(
        live(&p, &dp).keys().copied().collect::<Vec<_>>(),
        [slot(&p)],
        "back in the table"
    );
    assert_eq!(
        p.set_drain(
            &mut dp,
            "dc1",
            "198.18.1.99".parse().unwrap(),
            Drain::Draining
        )
        .unwrap(),
        None,
        "no such backend"
    );
}

#[test]
fn a_drain_ends_with_its_backend_leaving_the_pool() {
    let (mut p, mut dp, mut cfg) = checked_pool_with_one_backend_down();
    let a: IpAddr = "198.18.1.11".parse().unwrap();
    p.set_drain(&mut dp, "dc1", a, Drain::Draining).unwrap();
    let kept = cfg.pools[0].backends.remove(0);
    p.apply(&mut dp, &cfg).unwrap();
    cfg.pools[0].backends.insert(0, kept);
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(p.health().get("dc1", a).map(|b| b.drain), Some(Drain::Off));
}

#[test]
fn removing_the_health_check_brings_down_backends_up() {
    let (mut p, mut dp, mut cfg) = checked_pool_with_one_backend_down();
    cfg.pools[0].health_check = None;
    p.apply(&mut dp, &cfg).unwrap();
    let pool = &p.pools()["dc1"];
    let down = &pool.backends[1];
    assert!(
        p.health().usable("dc1", down.address),
        "nothing would ever probe it up"
    );
    assert_eq!(dp.backends[&down.slot].state, BACKEND_UP);
    let live = dp.tables[&(pool.slot, pool.active)].clone();
    assert_eq!(owners(&live).len(), 2, "back in the table");
}

#[test]
fn removing_a_pool_marks_its_backends_down_and_removing_a_service_deletes_it() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![
            pool("dc1", &[("198.18.1.11", 100)]),
            pool("dc2", &[("198.18.2.11", 100)]),
        ],
    );
    p.apply(&mut dp, &cfg).unwrap();
    let dc2_backend = p.pools()["dc2"].backends[0].slot;
    let key = p.services()["web"].key;
    p.apply(
        &mut dp,
        &config(vec![], vec![pool("dc1", &[("198.18.1.11", 100)])]),
    )
    .unwrap();
    assert_eq!(dp.backends[&dc2_backend].state, BACKEND_DOWN);
    assert!(!dp.services.contains_key(&key));
}

#[test]
fn a_split_carries_both_pools_and_the_share_of_the_second() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let split = Target::Split(vec![
        SplitShare {
            pool: "dc1".into(),
            weight: 95,
        },
        SplitShare {
            pool: "canary".into(),
            weight: 5,
        },
    ]);
    let cfg = config(
        vec![service("web", 80, split)],
        vec![
            pool("dc1", &[("198.18.1.11", 100)]),
            pool("canary", &[("198.18.1.21", 100)]),
        ],
    );
    p.apply(&mut dp, &cfg).unwrap();
    let d = Decision::decode(p.services()["web"].word);
    assert_eq!(d.pool_a, p.pools()["dc1"].slot as u16);
    assert_eq!(d.pool_b, p.pools()["canary"].slot as u16);
    assert_eq!(d.split_b, SPLIT_SCALE / 20);
}

#[test]
fn slots_are_reused_as_late_as_possible() {
    let mut s = Slots::new(3);
    assert_eq!(s.take("x").unwrap(), 0);
    assert_eq!(s.take("x").unwrap(), 1);
    s.free(0);
    assert_eq!(s.take("x").unwrap(), 2);
    assert_eq!(s.take("x").unwrap(), 0);
    assert!(matches!(s.take("x"), Err(PublishError::Full("x"))));
}

/// Whether the filter words the dataplane holds have `bit`.
fn filter_has(dp: &MemoryDataplane, bit: u32) -> bool {
    dp.filter.get(&(bit / 64)).copied().unwrap_or(0) & (1 << (bit % 64)) != 0
}

fn service_bit(key: &ServiceKey) -> u32 {
    router_common::hash::filter_bit(
        &key.addr,
        key.port,
        key.proto,
        key.family,
        router_common::FILTER_SERVICE,
    )
}

#[test]
fn the_filter_holds_every_service_and_nat_reply_source_before_services_name_them() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut nat = service("api", 8080, Target::Pool("dc2".into()));
    nat.forward = Forward::Nat;
    let pools = vec![
        pool("dc1", &[("198.18.1.11", 100)]),
        pool("dc2", &[("198.18.2.11", 100), ("2001:db8::2:11", 100)]),
    ];
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into())), nat],
        pools.clone(),
    );
    p.apply(&mut dp, &cfg).unwrap();
    for s in p.services().values() {
        assert!(filter_has(&dp, service_bit(&s.key)), "{:?}", s.key);
    }
    for b in ["198.18.2.11", "2001:db8::2:11"] {
        let a: IpAddr = b.parse().unwrap();
        let bit = router_common::hash::filter_bit(
            &addr16(a),
            8080u16.to_be(),
            PROTO_TCP,
            family(a),
            router_common::FILTER_NAT_REPLY,
        );
        assert!(filter_has(&dp, bit), "reply source {b}");
    }
    let flags = |dp: &MemoryDataplane| dp.filter.get(&router_common::FILTER_FLAGS).copied();
    assert_eq!(flags(&dp), Some(router_common::FILTER_F_NAT));
    let first_service = dp
        .log
        .iter()
        .position(|w| matches!(w, Write::Service(..)))
        .unwrap();
    let last_filter = dp
        .log
        .iter()
        .rposition(|w| matches!(w, Write::Filter(..)))
        .unwrap();
    assert!(last_filter < first_service, "filter bits after a service");

    // Removing a service removes its key, then frees its slot, then clears its bit.
    let api = p.services()["api"].clone();
    dp.log.clear();
    let cfg = config(vec![service("web", 80, Target::Pool("dc1".into()))], pools);
    p.apply(&mut dp, &cfg).unwrap();
    let pos = |f: &dyn Fn(&Write) -> bool| dp.log.iter().position(f);
    let removed = pos(&|w| *w == Write::RemoveService(api.key)).unwrap();
    let freed = pos(&|w| *w == Write::FreeServiceSlot(api.value.id)).unwrap();
    let bit = service_bit(&api.key);
    let cleared =
        pos(&|w| matches!(w, Write::Filter(i, v) if *i == bit / 64 && v & (1 << (bit % 64)) == 0));
    assert!(removed < freed);
    if service_bit(&p.services()["web"].key) != bit {
        assert!(freed < cleared.unwrap());
        assert!(!filter_has(&dp, bit));
    }
    assert!(!dp.service_slots.contains_key(&api.value.id));
    assert_eq!(
        flags(&dp),
        Some(0),
        "no NAT service is left: no reply probe"
    );
}

#[test]
fn a_slot_never_gets_back_a_generation_it_had() {
    // The program trusts a flow cache copy only under the generation it was made under: a
    // backend that goes down and comes back, or another backend in its slot, must not match.
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![checked(pool("dc1", &[("198.18.1.11", 100)]))],
    );
    p.apply(&mut dp, &cfg).unwrap();
    let slot = p.pools()["dc1"].backends[0].slot;
    let mut seen = vec![dp.backends[&slot].generation];
    for healthy in [false, true, false, true] {
        assert!(
            p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), healthy)
                .unwrap()
        );
        let g = dp.backends[&slot].generation;
        assert!(!seen.contains(&g), "generation {g} again, after {seen:?}");
        seen.push(g);
    }
    // A reapply of the same config keeps it: nothing changed.
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(dp.backends[&slot].generation, *seen.last().unwrap());
    // The next backend in a slot this process freed continues the slot's generation.
    let last = dp.backends[&slot];
    let next = BackendState {
        address: "198.18.1.99".parse().unwrap(),
        slot,
        weight: 100,
        hop: None,
        half: 1,
        written: Some(last),
        ramp: None,
        adaptive: None,
    };
    assert_eq!(
        next.entry(None, FlowMarks::default()).generation,
        last.generation.wrapping_add(1)
    );
}

#[test]
fn a_freed_slot_is_remembered_for_the_backend_that_takes_it() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let one = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100)])],
    );
    p.apply(&mut dp, &one).unwrap();
    let slot = p.pools()["dc1"].backends[0].slot;
    let other = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.12", 100)])],
    );
    p.apply(&mut dp, &other).unwrap();
    assert_eq!(p.freed.get(&slot), Some(&dp.backends[&slot]));
}

#[test]
fn an_address_that_gets_its_old_slot_back_does_not_get_its_old_generation() {
    // Slots are taken round robin: with every other slot in use, a backend that left its pool
    // and comes back takes its old slot again. A copy the program's flow cache made the first
    // time must not match it.
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let web = |addrs: &[(&str, u32)]| {
        config(
            vec![service("web", 80, Target::Pool("web".into()))],
            vec![pool("web", addrs)],
        )
    };
    p.apply(&mut dp, &web(&[("10.0.0.1", 1), ("10.0.0.2", 1)]))
        .unwrap();
    let slot = p.pools()["web"].backends[0].slot;
    let mut seen = vec![dp.backends[&slot].generation];
    p.apply(&mut dp, &web(&[("10.0.0.2", 1)])).unwrap();
    seen.push(dp.backends[&slot].generation);
    let fillers: Vec<String> = (0..MAX_BACKENDS as usize - 2)
        .map(|i| format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256))
        .collect();
    let with_fillers = |addrs: &[(&str, u32)]| {
        let f: Vec<(&str, u32)> = fillers.iter().map(|a| (a.as_str(), 0)).collect();
        let mut cfg = web(addrs);
        cfg.pools.push(pool("filler", &f));
        cfg
    };
    p.apply(&mut dp, &with_fillers(&[("10.0.0.2", 1)])).unwrap();
    p.apply(&mut dp, &with_fillers(&[("10.0.0.2", 1), ("10.0.0.1", 1)]))
        .unwrap();
    let back = p.pools()["web"]
        .backends
        .iter()
        .find(|b| b.address.to_string() == "10.0.0.1")
        .unwrap()
        .slot;
    assert_eq!(
        back, slot,
        "the test needs the address back in its old slot"
    );
    let now = dp.backends[&slot].generation;
    assert!(
        !seen.contains(&now),
        "generation {now} again, after {seen:?}"
    );
}

#[test]
fn slow_start_weights_ramp_linearly_from_one_to_the_weight() {
    use super::tables::effective_weight;
    let (t, s) = (Duration::from_secs(30), Duration::from_secs(1000));
    assert_eq!(effective_weight(100, s, t, s), 1, "a small share at first");
    assert_eq!(effective_weight(100, s, t, s + t / 4), 25);
    assert_eq!(effective_weight(100, s, t, s + t / 2), 50);
    assert_eq!(effective_weight(100, s, t, s + t / 3), 34, "rounded up");
    assert_eq!(effective_weight(100, s, t, s + t), 100);
    assert_eq!(effective_weight(100, s, t, s + 2 * t), 100);
    assert_eq!(effective_weight(7, s, t, s), 1);
    assert_eq!(effective_weight(65_535, s, t, s + t / 2), 32_768);
    assert_eq!(effective_weight(100, s, Duration::ZERO, s), 100);
    // A clock before the start (never by the runtime's) reads as the start.
    assert_eq!(effective_weight(100, s, t, s.saturating_sub(t)), 1);
}

/// The share of `slot` in the live table of `pool`.
fn share(p: &Publisher, dp: &MemoryDataplane, pool: &str, slot: u32) -> f64 {
    let pool = &p.pools()[pool];
    let table = &dp.tables[&(pool.slot, pool.active)];
    #[expect(
        clippy::cast_precision_loss,
        reason = "table entries, 65,537 at most, as a share"
    )]
    let share = table.iter().filter(|&&id| id == slot).count() as f64 / table.len() as f64;
    share
}

#[test]
fn a_backend_back_from_down_ramps_over_slow_start_with_an_injected_clock() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut dc1 = checked(pool("dc1", &[("198.18.1.11", 100), ("198.18.1.12", 100)]));
    dc1.slow_start = Some(Duration::from_secs(10));
    let cfg = config(vec![], vec![dc1]);
    let b: IpAddr = "198.18.1.12".parse().unwrap();
    let at = |s: u64| Duration::from_secs(s);
    p.set_now(at(100));
    p.apply(&mut dp, &cfg).unwrap();
    let slot = p.backend_slot("dc1", b).unwrap();
    assert!(
        (share(&p, &dp, "dc1", slot) - 0.5).abs() < 0.02,
        "a first build ramps nobody"
    );
    p.set_health(&mut dp, "dc1", b, false).unwrap();
    assert!(share(&p, &dp, "dc1", slot) == 0.0);
    p.set_now(at(200));
    p.set_health(&mut dp, "dc1", b, true).unwrap();
    // Weight 1 against 100 at first, then 50 at half time, then its weight.
    let expect = |p: &Publisher, dp: &MemoryDataplane, w: f64| {
        let s = share(p, dp, "dc1", slot);
        assert!((s - w / (w + 100.0)).abs() < 0.02, "share {s}, weight {w}");
    };
    expect(&p, &dp, 1.0);
    assert!(
        p.next_ramp_step().is_some_and(|s| s <= at(200)),
        "due at once"
    );
    p.set_now(at(205));
    assert_eq!(p.advance_ramps(&mut dp).unwrap(), ["dc1"]);
    expect(&p, &dp, 50.0);
    assert_eq!(
        p.next_ramp_step(),
        Some(at(205) + Duration::from_millis(500)),
        "every twentieth of slow_start"
    );
    p.set_now(at(210));
    p.advance_ramps(&mut dp).unwrap();
    expect(&p, &dp, 100.0);
    assert!(p.pools()["dc1"].backends.iter().all(|b| b.ramp.is_none()));
    assert!(
        p.advance_ramps(&mut dp).unwrap().is_empty(),
        "nothing ramps any more"
    );
    assert_eq!(p.next_ramp_step(), None);
    // Back from a drain, and a backend new to the pool, ramp as well.
    p.set_drain(&mut dp, "dc1", b, Drain::Draining).unwrap();
    p.set_now(at(300));
    p.set_drain(&mut dp, "dc1", b, Drain::Off).unwrap();
    expect(&p, &dp, 1.0);
    let mut cfg = cfg;
    cfg.pools[0].backends.push(CfgBackend {
        address: "198.18.1.13".parse().unwrap(),
        weight: 100,
    });
    p.set_now(at(302));
    p.apply(&mut dp, &cfg).unwrap();
    let added: IpAddr = "198.18.1.13".parse().unwrap();
    let new = p.backend_slot("dc1", added).unwrap();
    assert!(
        share(&p, &dp, "dc1", new) == 0.0,
        "a new backend of a checked pool waits for its first check"
    );
    p.set_now(at(303));
    p.set_health(&mut dp, "dc1", added, true).unwrap();
    let s = share(&p, &dp, "dc1", new);
    assert!(s > 0.0 && s < 0.02, "a new backend starts small: {s}");
}

#[test]
fn a_pool_without_slow_start_takes_a_returning_backend_at_its_weight() {
    let (mut p, mut dp, _) = checked_pool_with_one_backend_down();
    let b: IpAddr = "198.18.1.12".parse().unwrap();
    p.set_health(&mut dp, "dc1", b, true).unwrap();
    let slot = p.backend_slot("dc1", b).unwrap();
    assert!((share(&p, &dp, "dc1", slot) - 0.5).abs() < 0.02);
    assert!(p.pools()["dc1"].backends.iter().all(|b| b.ramp.is_none()));
}

#[test]
fn a_ramp_shorter_than_a_step_ends_on_time() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut dc1 = checked(pool("dc1", &[("198.18.1.11", 100), ("198.18.1.12", 100)]));
    dc1.slow_start = Some(Duration::from_millis(1));
    let cfg = config(vec![], vec![dc1]);
    let b: IpAddr = "198.18.1.12".parse().unwrap();
    let at = |ms: u64| Duration::from_millis(ms);
    p.set_now(at(10_000));
    p.apply(&mut dp, &cfg).unwrap();
    p.set_health(&mut dp, "dc1", b, false).unwrap();
    p.set_now(at(11_000));
    p.advance_ramps(&mut dp).unwrap();
    p.set_health(&mut dp, "dc1", b, true).unwrap();
    // Steps are at least 100 ms apart, but the ramp ends after 1 ms: its end is the next step.
    assert_eq!(p.next_ramp_step(), Some(at(11_001)));
    p.set_now(at(11_001));
    p.advance_ramps(&mut dp).unwrap();
    let slot = p.backend_slot("dc1", b).unwrap();
    assert!((share(&p, &dp, "dc1", slot) - 0.5).abs() < 0.02);
    assert_eq!(p.next_ramp_step(), None);
}

/// The `VIPS` entry the dataplane holds for the fixture VIP.
fn vip_entry(dp: &MemoryDataplane) -> Option<router_common::Vip> {
    dp.vips
        .get(&super::vips::vip_key("198.18.0.10".parse().unwrap()))
        .copied()
}

#[test]
fn a_virtual_ip_is_live_while_a_pool_of_its_services_has_a_usable_backend() {
    use router_common::{VIP_F_ECHO, VIP_F_LIVE};
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![checked(pool(
            "dc1",
            &[("198.18.1.11", 100), ("198.18.1.12", 100)],
        ))],
    );
    p.apply(&mut dp, &cfg).unwrap();
    let a = "198.18.1.11".parse().unwrap();
    let b = "198.18.1.12".parse().unwrap();
    for address in [a, b] {
        p.set_health(&mut dp, "dc1", address, true).unwrap();
    }
    assert_eq!(vip_entry(&dp).unwrap().flags, VIP_F_ECHO | VIP_F_LIVE);
    p.set_health(&mut dp, "dc1", a, false).unwrap();
    assert_eq!(
        vip_entry(&dp).unwrap().flags,
        VIP_F_ECHO | VIP_F_LIVE,
        "one is left"
    );
    p.set_health(&mut dp, "dc1", b, false).unwrap();
    assert_eq!(vip_entry(&dp).unwrap().flags, VIP_F_ECHO, "none is left");
    // Echo off, and a host port, from `vips:`.
    cfg.vips = vec![crate::config::Vip {
        address: "198.18.0.10".parse().unwrap(),
        echo: false,
        host_ports: vec![(Protocol::Tcp, 22)],
        new_flows_per_second: None,
    }];
    p.apply(&mut dp, &cfg).unwrap();
    let v = vip_entry(&dp).unwrap();
    assert_eq!(v.flags, 0);
    assert_eq!(v.host_ports[0], router_common::host_port(22u16.to_be(), 6));
    // Reapplied unchanged: nothing written; the service removed: the VIP goes with it.
    dp.log.clear();
    p.apply(&mut dp, &cfg).unwrap();
    assert!(
        !dp.log.iter().any(|w| matches!(w, Write::Vip(..))),
        "{:?}",
        dp.log
    );
    cfg.services.clear();
    p.apply(&mut dp, &cfg).unwrap();
    assert!(vip_entry(&dp).is_none());
}

#[test]
fn a_restarted_agent_removes_the_virtual_ips_an_earlier_one_left_and_keeps_the_others() {
    let mut dp = MemoryDataplane::default();
    let stale = super::vips::vip_key("198.18.0.99".parse().unwrap());
    dp.vips.insert(stale, router_common::Vip::default());
    let mut p = Publisher::new();
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100)])],
    );
    p.apply(&mut dp, &cfg).unwrap();
    assert!(!dp.vips.contains_key(&stale));
    assert!(vip_entry(&dp).is_some());
    // A new process over the same maps writes no entry that already holds.
    let mut again = Publisher::new();
    dp.log.clear();
    again.apply(&mut dp, &cfg).unwrap();
    assert!(
        !dp.log.iter().any(|w| matches!(w, Write::Vip(..))),
        "{:?}",
        dp.log
    );
}

#[test]
fn adaptive_weights_replace_the_configured_ones_and_zero_drains_the_entry() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut dc1 = checked(pool("dc1", &[("198.18.1.11", 100), ("198.18.1.12", 100)]));
    dc1.slow_start = Some(Duration::from_secs(10));
    let cfg = config(vec![], vec![dc1]);
    let (a, b): (IpAddr, IpAddr) = (
        "198.18.1.11".parse().unwrap(),
        "198.18.1.12".parse().unwrap(),
    );
    let at = |s: u64| Duration::from_secs(s);
    p.set_now(at(100));
    p.apply(&mut dp, &cfg).unwrap();
    let slot = p.backend_slot("dc1", b).unwrap();
    // 300 against 100: a quarter of the table.
    assert!(
        p.set_adaptive_weights(&mut dp, "dc1", &[(a, Some(300)), (b, Some(100))])
            .unwrap()
    );
    assert!((share(&p, &dp, "dc1", slot) - 0.25).abs() < 0.02);
    assert_eq!(p.pools()["dc1"].weight_in_table(slot), Some(100));
    assert!(
        !p.set_adaptive_weights(&mut dp, "dc1", &[(a, Some(300)), (b, Some(100))])
            .unwrap()
    );
    // 0: out of the table, its entry draining (tracked flows stay), as `weight: 0`.
    p.set_adaptive_weights(&mut dp, "dc1", &[(b, Some(0))])
        .unwrap();
    assert!(share(&p, &dp, "dc1", slot) == 0.0);
    assert_eq!(dp.backends[&slot].state, router_common::BACKEND_DRAINING);
    // Back in: it slow-starts toward its adaptive weight, and its entry is up first.
    p.set_now(at(200));
    p.set_adaptive_weights(&mut dp, "dc1", &[(b, Some(300))])
        .unwrap();
    assert_eq!(dp.backends[&slot].state, router_common::BACKEND_UP);
    assert_eq!(p.pools()["dc1"].weight_in_table(slot), Some(1));
    p.set_now(at(205));
    p.advance_ramps(&mut dp).unwrap();
    assert_eq!(p.pools()["dc1"].weight_in_table(slot), Some(150));
    p.set_now(at(210));
    p.advance_ramps(&mut dp).unwrap();
    assert!((share(&p, &dp, "dc1", slot) - 0.5).abs() < 0.02);
    // An apply whose pool has no adaptive weights gives the configured weights back.
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(p.pools()["dc1"].weight_in_table(slot), Some(100));
}

/// A failback mark goes on every backend entry of the pool (up ones too) with a new
/// generation, survives an apply, and comes off again; `keep` is no mark. A pool a static
/// target sends new flows to is in use.
#[test]
fn a_failback_mark_covers_the_pool_and_comes_off() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![
            pool("dc1", &[("198.18.1.11", 100)]),
            pool("dc2", &[("198.18.2.11", 100), ("198.18.2.12", 100)]),
        ],
    );
    p.apply(&mut dp, &cfg).unwrap();
    assert!(p.pool_in_use("dc1", "any"));
    assert!(!p.pool_in_use("dc2", "any"));
    let slots: Vec<u32> = p.pools()["dc2"].backends.iter().map(|b| b.slot).collect();
    let before: Vec<u32> = slots.iter().map(|s| dp.backends[s].generation).collect();
    assert!(p.set_left(&mut dp, "dc2", Some(FlowPolicy::Reset)).unwrap());
    for (s, g) in slots.iter().zip(&before) {
        assert_eq!(dp.backends[s].state, BACKEND_UP | BACKEND_F_RESET);
        assert_ne!(dp.backends[s].generation, *g);
    }
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(dp.backends[&slots[0]].state, BACKEND_UP | BACKEND_F_RESET);
    assert!(
        p.set_left(&mut dp, "dc2", Some(FlowPolicy::Migrate))
            .unwrap()
    );
    assert_eq!(dp.backends[&slots[1]].state, BACKEND_UP | BACKEND_F_MIGRATE);
    assert!(p.set_left(&mut dp, "dc2", Some(FlowPolicy::Keep)).unwrap());
    assert_eq!(dp.backends[&slots[1]].state, BACKEND_UP);
    assert!(!p.set_left(&mut dp, "dc2", None).unwrap());
    // The mark does not take the backends out of the table.
    let slot = p.pools()["dc2"].slot;
    assert!(dp.live_table(slot).unwrap().contains(&slots[0]));
}

/// A flip gives the replaced table a second chance (`POOL_F_SECOND_CHANCE`) for
/// `conntrack.second_chance`; the flag comes off before the inactive half is written again and
/// at its deadline; a pool's first table, and a config without a second chance, set none; a
/// restored publisher ends an earlier process's at its first deadline.
#[test]
fn a_flip_gives_the_previous_table_a_second_chance_until_its_deadline() {
    use router_common::POOL_F_SECOND_CHANCE;
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100), ("198.18.1.12", 100)])],
    );
    cfg.conntrack.second_chance = Duration::from_mins(1);
    p.apply(&mut dp, &cfg).unwrap();
    let slot = p.pools()["dc1"].slot;
    let flagged = |dp: &MemoryDataplane| dp.pools[&slot].flags & POOL_F_SECOND_CHANCE != 0;
    assert!(!flagged(&dp), "a first table replaces none");
    assert_eq!(p.next_second_chance_end(), None);

    p.set_now(Duration::from_secs(10));
    let before = dp.pools[&slot].active;
    assert!(
        p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), false)
            .unwrap()
    );
    assert!(flagged(&dp));
    assert_ne!(dp.pools[&slot].active, before);
    assert_eq!(p.next_second_chance_end(), Some(Duration::from_secs(70)));

    // Another flip within the grace: the flag comes off before the inactive half is written.
    p.set_now(Duration::from_secs(20));
    dp.log.clear();
    assert!(
        p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), true)
            .unwrap()
    );
    let writes: Vec<&Write> = dp
        .log
        .iter()
        .filter(|w| matches!(w, Write::Table(..) | Write::Pool(..)))
        .collect();
    assert!(
        matches!(
            writes.as_slice(),
            [Write::Pool(_, off), Write::Table(..), Write::Pool(_, flip), Write::Pool(_, on)]
                if off.flags & POOL_F_SECOND_CHANCE == 0
                    && flip.flags & POOL_F_SECOND_CHANCE == 0
                    && on.flags & POOL_F_SECOND_CHANCE != 0
        ),
        "{writes:?}"
    );
    assert_eq!(p.next_second_chance_end(), Some(Duration::from_secs(80)));
    let live = dp.pools[&slot].active;
    p.apply(&mut dp, &cfg).unwrap();
    assert_eq!(dp.pools[&slot].active, live, "the apply changes no table");
    assert!(flagged(&dp), "an apply that changes no table keeps it");

    // Not before its deadline; at it, the flag comes off and the live half stays.
    p.set_now(Duration::from_secs(79));
    assert!(p.end_second_chances(&mut dp).unwrap().is_empty());
    assert!(flagged(&dp));
    let live = dp.pools[&slot].active;
    p.set_now(Duration::from_secs(80));
    assert_eq!(p.end_second_chances(&mut dp).unwrap(), ["dc1"]);
    assert!(!flagged(&dp));
    assert_eq!(dp.pools[&slot].active, live);
    assert_eq!(p.next_second_chance_end(), None);

    // A restored publisher ends a second chance it finds at its first deadline.
    p.set_now(Duration::from_secs(90));
    p.set_health(&mut dp, "dc1", "198.18.1.12".parse().unwrap(), false)
        .unwrap();
    assert!(flagged(&dp));
    let mut r = Publisher::restore(&p.ledger(), &dp).expect("restore");
    assert_eq!(r.next_second_chance_end(), Some(Duration::ZERO));
    assert_eq!(r.end_second_chances(&mut dp).unwrap(), ["dc1"]);
    assert!(!flagged(&dp));

    // Without a second chance in the config, a flip sets none.
    cfg.conntrack.second_chance = Duration::ZERO;
    r.apply(&mut dp, &cfg).unwrap();
    r.set_health(&mut dp, "dc1", "198.18.1.12".parse().unwrap(), true)
        .unwrap();
    assert!(!flagged(&dp));
}

/// A backend that goes down (or leaves the config) is named by the table its flip replaces:
/// that table becomes a second chance only after the backend's entry says down, so the program
/// never sends (and tracks) a flow there in between.
#[test]
fn the_replaced_table_is_a_second_chance_only_once_its_lost_backend_is_marked() {
    use router_common::POOL_F_SECOND_CHANCE;
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool(
            "dc1",
            &[
                ("198.18.1.11", 100),
                ("198.18.1.12", 100),
                ("198.18.1.13", 100),
            ],
        )],
    );
    cfg.conntrack.second_chance = Duration::from_mins(1);
    p.apply(&mut dp, &cfg).unwrap();
    let slot = p.pools()["dc1"].slot;
    let slot_of = |p: &Publisher, a: &str| {
        let a: IpAddr = a.parse().unwrap();
        p.pools()["dc1"]
            .backends
            .iter()
            .find(|b| b.address == a)
            .unwrap()
            .slot
    };
    // The position of the backend write of `gone` and of the first pool write with the flag.
    let order = |dp: &MemoryDataplane, gone: u32| {
        let down = dp
            .log
            .iter()
            .position(|w| matches!(w, Write::Backend(s, _) if *s == gone));
        let flag = dp.log.iter().position(
            |w| matches!(w, Write::Pool(s, v) if *s == slot && v.flags & POOL_F_SECOND_CHANCE != 0),
        );
        (
            down.expect("the lost backend is written"),
            flag.expect("the flag is set"),
        )
    };

    let gone = slot_of(&p, "198.18.1.11");
    p.set_now(Duration::from_secs(10));
    dp.log.clear();
    p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), false)
        .unwrap();
    let (down, flag) = order(&dp, gone);
    assert!(down < flag, "health: {:?}", dp.log);

    // Past the grace, a backend removed from the config.
    p.set_now(Duration::from_secs(100));
    p.end_second_chances(&mut dp).unwrap();
    let gone = slot_of(&p, "198.18.1.12");
    cfg.pools[0]
        .backends
        .retain(|b| b.address.to_string() != "198.18.1.12");
    dp.log.clear();
    p.apply(&mut dp, &cfg).unwrap();
    let (down, flag) = order(&dp, gone);
    assert!(down < flag, "retired: {:?}", dp.log);
}

/// A config that shortens `conntrack.second_chance` during a grace shortens the grace from the
/// apply on; one that turns it off clears `POOL_F_SECOND_CHANCE` in that apply, not at the
/// deadline the earlier setting gave (up to an hour later).
#[test]
fn an_apply_that_turns_the_second_chance_off_ends_the_grace_under_way() {
    use router_common::POOL_F_SECOND_CHANCE;
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let mut cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100), ("198.18.1.12", 100)])],
    );
    cfg.conntrack.second_chance = Duration::from_hours(1);
    p.apply(&mut dp, &cfg).unwrap();
    let slot = p.pools()["dc1"].slot;
    let flagged = |dp: &MemoryDataplane| dp.pools[&slot].flags & POOL_F_SECOND_CHANCE != 0;
    p.set_now(Duration::from_secs(10));
    p.set_health(&mut dp, "dc1", "198.18.1.11".parse().unwrap(), false)
        .unwrap();
    assert!(flagged(&dp));
    assert_eq!(p.next_second_chance_end(), Some(Duration::from_secs(3610)));

    p.set_now(Duration::from_secs(20));
    cfg.conntrack.second_chance = Duration::from_secs(5);
    p.apply(&mut dp, &cfg).unwrap();
    assert!(flagged(&dp), "shortened, not over");
    assert_eq!(p.next_second_chance_end(), Some(Duration::from_secs(25)));

    p.set_now(Duration::from_secs(21));
    cfg.conntrack.second_chance = Duration::ZERO;
    let active = dp.pools[&slot].active;
    p.apply(&mut dp, &cfg).unwrap();
    assert!(
        !flagged(&dp),
        "turned off: the previous table is read no more"
    );
    assert_eq!(dp.pools[&slot].active, active);
    assert_eq!(p.next_second_chance_end(), None);
}

/// Two nodes with the same members and weights build the same table, whatever slots their
/// histories gave the backends: the fingerprint compares addresses, not slots. Another weight
/// gives another fingerprint.
#[test]
fn the_table_fingerprint_is_the_same_on_nodes_whose_slots_differ() {
    let members = [
        ("198.18.1.11", 100),
        ("198.18.1.12", 100),
        ("198.18.1.13", 100),
    ];
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &members)],
    );
    let mut dp_a = MemoryDataplane::default();
    let mut a = Publisher::new();
    a.apply(&mut dp_a, &cfg).unwrap();

    // Node b first ran with another backend ahead of them, then with the same three.
    let mut dp_b = MemoryDataplane::default();
    let mut b = Publisher::new();
    let earlier = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool(
            "dc1",
            &[
                ("198.18.1.10", 100),
                ("198.18.1.13", 100),
                ("198.18.1.12", 100),
            ],
        )],
    );
    b.apply(&mut dp_b, &earlier).unwrap();
    b.apply(&mut dp_b, &cfg).unwrap();

    let slots =
        |p: &Publisher| -> Vec<u32> { p.pools()["dc1"].backends.iter().map(|b| b.slot).collect() };
    assert_ne!(slots(&a), slots(&b), "the histories give other slots");
    let (table_a, table_b) = (
        dp_a.live_table(a.pools()["dc1"].slot).unwrap(),
        dp_b.live_table(b.pools()["dc1"].slot).unwrap(),
    );
    assert_ne!(table_a, table_b, "the raw tables name other slots");
    let digest = a.pools()["dc1"].table_digest().unwrap();
    assert_eq!(b.pools()["dc1"].table_digest(), Some(digest));

    let mut heavier = cfg.clone();
    heavier.pools[0].backends[0].weight = 200;
    b.apply(&mut dp_b, &heavier).unwrap();
    assert_ne!(b.pools()["dc1"].table_digest(), Some(digest));
}

#[test]
fn renewing_generations_rewrites_only_those_slots_and_later_writes_continue_from_them() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let cfg = config(
        vec![service("web", 80, Target::Pool("dc1".into()))],
        vec![pool("dc1", &[("198.18.1.11", 100), ("198.18.1.12", 100)])],
    );
    p.apply(&mut dp, &cfg).unwrap();
    let slot = |a: &str| p.backend_slot("dc1", a.parse().unwrap()).unwrap();
    let (a, b) = (slot("198.18.1.11"), slot("198.18.1.12"));
    let before = (dp.backends[&a], dp.backends[&b]);
    // A slot the publisher does not hold is skipped.
    assert_eq!(p.renew_generations(&mut dp, &[a, 9_999]).unwrap(), 1);
    assert_eq!(
        dp.backends[&a],
        Backend {
            generation: before.0.generation.wrapping_add(1),
            ..before.0
        }
    );
    assert_eq!(dp.backends[&b], before.1);
    // A drain changes the state: the generation moves on from the renewed one.
    p.set_drain(
        &mut dp,
        "dc1",
        "198.18.1.11".parse().unwrap(),
        Drain::Draining,
    )
    .unwrap();
    assert_eq!(
        dp.backends[&a].generation,
        before.0.generation.wrapping_add(2)
    );
}
