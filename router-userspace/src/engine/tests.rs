//! The driver with an in-memory dataplane and injected time.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use router_common::{Decision, NO_POOL};
use rules::engine::{Action, AuditKind, OverrideRequest};

use super::*;
use crate::{
    config::model::SwitchPolicy,
    dataplane::memory::{MemoryDataplane, Write},
    state::tests::web_failover,
};

struct World {
    cfg: Config,
    store: Store,
    publisher: Publisher,
    dp: MemoryDataplane,
    driver: Driver,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn world(switch: SwitchPolicy) -> World {
    let cfg = web_failover(switch);
    let mut store = Store::new(&cfg).expect("store");
    store.set_probe("dc1_api_healthy", true);
    let mut publisher = Publisher::new();
    let mut dp = MemoryDataplane::default();
    let mut driver = Driver::new(&cfg, &store, None).expect("driver");
    let first = driver.initial_actions(&store, &publisher, ms(0));
    publisher
        .apply_decided(&mut dp, &cfg, &first)
        .expect("apply");
    driver.on_change(
        &[],
        true,
        &store,
        &mut publisher,
        &mut dp,
        ms(0),
        "start",
        Instant::now(),
    );
    World {
        cfg,
        store,
        publisher,
        dp,
        driver,
    }
}

impl World {
    fn word(&self) -> Decision {
        let slot = self.publisher.groups()["web-failover"].slot;
        Decision::decode(self.dp.decisions[&slot])
    }
    fn pool(&self, name: &str) -> u16 {
        self.publisher.pools()[name].slot as u16
    }
    fn change(&mut self, changed: Vec<rules::Slot>, now: Duration) -> Vec<Published> {
        self.driver.on_change(
            &changed,
            false,
            &self.store,
            &mut self.publisher,
            &mut self.dp,
            now,
            "test",
            Instant::now(),
        )
    }
    fn health(&mut self, pool: &str, addr: &str, healthy: bool, now: Duration) -> Vec<Published> {
        let a: IpAddr = addr.parse().expect("addr");
        self.publisher
            .set_health(&mut self.dp, pool, a, healthy)
            .expect("health");
        let changed = self.store.set_backend_health(pool, a, healthy);
        self.change(changed, now)
    }
}

#[test]
fn a_switch_writes_exactly_one_word_shared_by_every_service_of_the_group() {
    let mut w = world(SwitchPolicy::default());
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    let n = w.dp.log.len();
    let changed = w.store.set_push("maintenance_mode", "true").expect("set");
    let out = w.change(changed, ms(10));
    assert_eq!(out.len(), 1);
    let slot = w.publisher.groups()["web-failover"].slot;
    assert_eq!(w.dp.log[n..], [Write::Decision(slot, out[0].word)]);
    let d = w.word();
    assert_eq!((d.pool_a, d.fallback), (w.pool("dc2"), w.pool("dc1")));
    for s in ["web", "web2"] {
        assert_eq!(w.publisher.services()[s].value.decision, slot);
    }
    let rec = w.driver.audit.iter().last().expect("audit");
    assert_eq!(rec.kind, AuditKind::Switch);
    assert!(rec.latency_us.is_some());
    assert_eq!(rec.values.get("dc1_ok").map(String::as_str), Some("false"));
    assert_eq!(rec.to, Some(Action::pool("dc2")));
}

#[test]
fn only_groups_that_read_a_changed_slot_reevaluate_and_deadlines_drive_the_timer() {
    let mut w = world(SwitchPolicy {
        stable_for: ms(50),
        cooldown: ms(0),
        failback_after: ms(1000),
    });
    // A slot no group reads.
    let region = w.store.set_push("region", "\"us\"").expect("set");
    w.driver.evaluations.clear();
    assert!(w.change(region, ms(5)).is_empty());
    assert!(
        w.driver.evaluations.is_empty(),
        "{:?}",
        w.driver.evaluations
    );
    // dc1 loses its API: pending stable_for, nothing written yet.
    let changed = w.store.set_probe("dc1_api_healthy", false);
    assert!(w.change(changed, ms(10)).is_empty());
    assert_eq!(w.driver.evaluations.len(), 1);
    assert_eq!(w.driver.next_deadline(), Some(ms(60)));
    assert!(
        w.driver
            .on_timer(&w.store, &mut w.publisher, &mut w.dp, ms(59))
            .is_empty()
    );
    let out = w
        .driver
        .on_timer(&w.store, &mut w.publisher, &mut w.dp, ms(60));
    assert_eq!(out.len(), 1);
    assert_eq!(w.word().pool_a, w.pool("dc2"));
    // Back: failback waits failback_after.
    let changed = w.store.set_probe("dc1_api_healthy", true);
    assert!(w.change(changed, ms(100)).is_empty());
    assert_eq!(w.driver.next_deadline(), Some(ms(1100)));
    assert_eq!(
        w.driver
            .on_timer(&w.store, &mut w.publisher, &mut w.dp, ms(1100))
            .len(),
        1
    );
    assert_eq!(w.word().pool_a, w.pool("dc1"));
}

#[test]
fn a_pool_with_no_healthy_backend_is_left_at_once_with_fallback() {
    let mut w = world(SwitchPolicy {
        stable_for: ms(500),
        cooldown: ms(10_000),
        failback_after: ms(0),
    });
    assert!(w.health("dc1", "198.18.1.11", false, ms(10)).is_empty());
    let out = w.health("dc1", "198.18.1.12", false, ms(20));
    assert_eq!(out.len(), 1, "emergency exit");
    let d = w.word();
    // dc1 had no healthy backend when left: no fallback to it.
    assert_eq!((d.pool_a, d.fallback), (w.pool("dc2"), NO_POOL));
}

#[test]
fn overrides_are_vetoed_by_require_unless_forced_and_the_gate_freezes() {
    let mut w = world(SwitchPolicy::default());
    for b in ["198.18.2.11", "198.18.2.12"] {
        w.health("dc2", b, false, ms(1));
    }
    let n = w.dp.log.len();
    let req = OverrideRequest::new(Action::pool("dc2"), "drill");
    let e = w
        .driver
        .set_override(
            "web-failover",
            Some(req.clone()),
            &w.store,
            &mut w.publisher,
            &mut w.dp,
            ms(2),
            "ctl",
        )
        .expect_err("vetoed");
    assert!(e.to_string().contains("vetoed"), "{e}");
    assert_eq!(w.dp.log.len(), n, "nothing written");
    let out = w
        .driver
        .set_override(
            "web-failover",
            Some(req.force()),
            &w.store,
            &mut w.publisher,
            &mut w.dp,
            ms(3),
            "ctl",
        )
        .expect("forced");
    assert!(out.is_some());
    assert_eq!(w.driver.active_overrides(), 1);
    w.driver
        .set_override(
            "web-failover",
            None,
            &w.store,
            &mut w.publisher,
            &mut w.dp,
            ms(4),
            "ctl",
        )
        .expect("clear");
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    // Gate off: maintenance does not move traffic.
    let mut changed = w
        .store
        .set_push("automation_enabled", "false")
        .expect("gate");
    changed.extend(w.store.set_push("maintenance_mode", "true").expect("set"));
    for b in ["198.18.2.11", "198.18.2.12"] {
        w.health("dc2", b, true, ms(5));
    }
    assert!(w.change(changed, ms(6)).is_empty());
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    let explained = w
        .driver
        .explain("web-failover", w.store.state(), &w.publisher, ms(7))
        .expect("explain");
    assert!(explained.text.contains("frozen"), "{}", explained.text);
    // What-if with the gate on shows the switch, changing nothing.
    let hypo = w
        .store
        .hypothetical(&[("automation_enabled".into(), "true".into())])
        .expect("h");
    let e = w
        .driver
        .explain("web-failover", &hypo, &w.publisher, ms(7))
        .expect("what-if");
    assert_eq!(
        e.explanation.active.map(|a| a.action),
        Some(Action::pool("dc2"))
    );
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    let _ = &w.cfg;
}
