//! The driver with an in-memory dataplane and injected time.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use router_common::{Decision, NO_POOL};
use rules::engine::{Action, AuditKind, OverrideRequest};

use super::*;
use crate::{
    config::Config,
    config::model::SwitchPolicy,
    dataplane::memory::{MemoryDataplane, Write},
    publish::Publisher,
    state::Store,
    state::tests::web_failover,
};

struct World {
    cfg: Config,
    store: Store,
    publisher: Publisher,
    dp: MemoryDataplane,
    driver: Driver,
    audit: Audit,
    /// Groups evaluated since last cleared.
    evaluations: Vec<String>,
}

/// One switch written.
struct Published {
    word: u64,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn world(switch: SwitchPolicy) -> World {
    world_of(web_failover(switch))
}

fn world_of(cfg: Config) -> World {
    let mut publisher = Publisher::new();
    let mut health = publisher.health().clone();
    health.configure(&cfg);
    let mut store = Store::new(&cfg, &health);
    store.set_probe("dc1_api_healthy", true);
    let mut dp = MemoryDataplane::default();
    let driver = Driver::new(&cfg);
    let first = driver.initial_actions(View {
        state: store.state(),
        health: &health,
        now: ms(0),
    });
    publisher
        .apply_decided(&mut dp, &cfg, &first)
        .expect("apply");
    let mut w = World {
        cfg,
        store,
        publisher,
        dp,
        driver,
        audit: Audit::new(AUDIT_CAPACITY, None),
        evaluations: Vec::new(),
    };
    w.run(&[], true, ms(0));
    w
}

impl World {
    fn word(&self) -> Decision {
        let slot = self.publisher.groups()["web-failover"].slot;
        Decision::decode(self.dp.decisions[&slot])
    }
    fn pool(&self, name: &str) -> u16 {
        u16::try_from(self.publisher.pools()[name].slot).expect("a pool slot fits a u16")
    }
    fn view(&self, now: Duration) -> View<'_> {
        View {
            state: self.store.state(),
            health: self.publisher.health(),
            now,
        }
    }
    /// Writes what the driver decided, as the agent's runtime does.
    fn publish(&mut self, decided: Vec<Decided>) -> Vec<Published> {
        let event = Instant::now();
        let mut out = Vec::new();
        for d in decided {
            self.evaluations.push(d.group.clone());
            let mut latency = None;
            if let Some(to) = &d.switch_to
                && let Some(word) = self
                    .publisher
                    .publish_decision(&mut self.dp, &d.group, to)
                    .expect("write")
            {
                latency = Some(u64::try_from(event.elapsed().as_micros()).unwrap_or(u64::MAX));
                out.push(Published { word });
            }
            for mut r in d.records {
                if r.kind == AuditKind::Switch {
                    r.latency_us = latency;
                }
                self.audit.push(r);
            }
        }
        out
    }
    fn run(&mut self, changed: &[rules::Slot], all: bool, now: Duration) -> Vec<Published> {
        let view = View {
            state: self.store.state(),
            health: self.publisher.health(),
            now,
        };
        let decided = self.driver.on_change(changed, all, view, "test");
        self.publish(decided)
    }
    fn change(&mut self, changed: &[rules::Slot], now: Duration) -> Vec<Published> {
        self.run(changed, false, now)
    }
    fn timer(&mut self, now: Duration) -> Vec<Published> {
        self.run(&[], false, now)
    }
    fn set_override(
        &mut self,
        request: Option<OverrideRequest>,
        now: Duration,
    ) -> Result<Option<Published>, DriverError> {
        let view = View {
            state: self.store.state(),
            health: self.publisher.health(),
            now,
        };
        let d = self
            .driver
            .set_override("web-failover", request, view, "ctl")?;
        Ok(self.publish(vec![d]).pop())
    }
    fn health(&mut self, pool: &str, addr: &str, healthy: bool, now: Duration) -> Vec<Published> {
        let a: IpAddr = addr.parse().expect("addr");
        self.publisher
            .set_health(&mut self.dp, pool, a, healthy)
            .expect("health");
        let changed = self
            .store
            .refresh_health(self.publisher.health(), &[pool.to_owned()]);
        self.change(&changed, now)
    }
}

#[test]
fn a_switch_writes_exactly_one_word_shared_by_every_service_of_the_group() {
    let mut w = world(SwitchPolicy::default());
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    let n = w.dp.log.len();
    let changed = w.store.set_push("maintenance_mode", "true").expect("set");
    let out = w.change(&changed, ms(10));
    assert_eq!(out.len(), 1);
    let slot = w.publisher.groups()["web-failover"].slot;
    assert_eq!(w.dp.log[n..], [Write::Decision(slot, out[0].word)]);
    let d = w.word();
    assert_eq!((d.pool_a, d.fallback), (w.pool("dc2"), w.pool("dc1")));
    for s in ["web", "web2"] {
        assert_eq!(w.publisher.services()[s].value.decision, slot);
    }
    let rec = w.audit.log.iter().last().expect("audit");
    assert_eq!(rec.kind, AuditKind::Switch);
    assert!(rec.latency_us.is_some());
    assert_eq!(rec.values.get("dc1_ok").map(String::as_str), Some("false"));
    assert_eq!(rec.to, Some(Action::pool("dc2")));
}

/// A group whose deadline passed, evaluated because some other change arrived first (a
/// health result, a slot it does not read), switches for its timer: the audit says `timer`,
/// not the unrelated change.
#[test]
fn a_switch_due_to_a_passed_deadline_is_audited_as_the_timer_whatever_woke_the_loop() {
    let mut w = world(SwitchPolicy {
        stable_for: ms(50),
        cooldown: ms(0),
        failback_after: ms(1000),
    });
    let changed = w.store.set_probe("dc1_api_healthy", false);
    assert!(w.change(&changed, ms(10)).is_empty());
    let region = w.store.set_push("region", "\"us\"").expect("set");
    assert_eq!(w.change(&region, ms(70)).len(), 1);
    let rec = w.audit.log.iter().last().expect("audit");
    assert_eq!(rec.kind, AuditKind::Switch);
    assert_eq!(rec.cause, crate::decision::TIMER);
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
    w.evaluations.clear();
    assert!(w.change(&region, ms(5)).is_empty());
    assert!(w.evaluations.is_empty(), "{:?}", w.evaluations);
    // dc1 loses its API: pending stable_for, nothing written yet.
    let changed = w.store.set_probe("dc1_api_healthy", false);
    assert!(w.change(&changed, ms(10)).is_empty());
    assert_eq!(w.evaluations.len(), 1);
    assert_eq!(w.driver.next_deadline(), Some(ms(60)));
    assert!(w.timer(ms(59)).is_empty());
    let out = w.timer(ms(60));
    assert_eq!(out.len(), 1);
    assert_eq!(w.word().pool_a, w.pool("dc2"));
    // Back: failback waits failback_after.
    let changed = w.store.set_probe("dc1_api_healthy", true);
    assert!(w.change(&changed, ms(100)).is_empty());
    assert_eq!(w.driver.next_deadline(), Some(ms(1100)));
    assert_eq!(w.timer(ms(1100)).len(), 1);
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
        .set_override(Some(req.clone()), ms(2))
        .err()
        .expect("vetoed");
    assert!(e.to_string().contains("vetoed"), "{e}");
    assert_eq!(w.dp.log.len(), n, "nothing written");
    let out = w.set_override(Some(req.force()), ms(3)).expect("forced");
    assert!(out.is_some());
    assert_eq!(w.driver.active_overrides(), 1);
    w.set_override(None, ms(4)).expect("clear");
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
    assert!(w.change(&changed, ms(6)).is_empty());
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    let explained = w
        .driver
        .explain("web-failover", w.view(ms(7)))
        .expect("explain");
    assert!(explained.text.contains("frozen"), "{}", explained.text);
    // What-if with the gate on shows the switch, changing nothing.
    let hypo = w
        .store
        .hypothetical(&[("automation_enabled".into(), "true".into())])
        .expect("h");
    let e = w
        .driver
        .explain(
            "web-failover",
            View {
                state: &hypo,
                health: w.publisher.health(),
                now: ms(7),
            },
        )
        .expect("what-if");
    assert_eq!(
        e.explanation.active.map(|a| a.action),
        Some(Action::pool("dc2"))
    );
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    let _ = &w.cfg;
}

#[test]
fn a_followed_group_is_not_evaluated_until_it_leads_and_then_goes_on_from_the_followed_action() {
    let mut w = world(SwitchPolicy::default());
    w.driver.follow_all_but(&[]);
    assert!(!w.driver.leads("web-failover"));
    assert_eq!(w.driver.leading(), Vec::<String>::new());
    let changed = w.store.set_push("maintenance_mode", "true").expect("set");
    assert!(
        w.change(&changed, ms(10)).is_empty(),
        "a follower decides nothing"
    );
    assert!(w.run(&[], true, ms(20)).is_empty());
    assert_eq!(w.driver.next_deadline(), None);
    // The leader's decision arrives: the driver takes it as its active action.
    w.driver
        .follow(
            "web-failover",
            Action::pool("dc2"),
            rules::engine::By::Rule("failover-dc2".into()),
            Some(ms(15)),
            ms(30),
        )
        .expect("follow");
    assert_eq!(
        w.driver.active("web-failover").map(|a| a.action.clone()),
        Some(Action::pool("dc2"))
    );
    // Elected: the same inputs choose the same action, so nothing switches.
    assert!(w.driver.set_leading("web-failover", true));
    assert!(w.driver.leads("web-failover"));
    assert!(w.run(&[], true, ms(40)).is_empty(), "no flap on takeover");
    assert!(!w.driver.set_leading("no-such-group", true));
}

/// `web_failover` with a canary ramp onto dc2 at `steps` (basis points), a hold of 1 s, rolled
/// back when a dc2 backend is down.
fn with_canary(steps: &[u32]) -> Config {
    let mut cfg = web_failover(SwitchPolicy::default());
    cfg.decisions[0].canary = Some(crate::config::model::CanaryRamp {
        pool: "dc2".into(),
        steps: steps.to_vec(),
        hold: ms(1_000),
        rollback_when: Some("pool.dc2.healthy_ratio < 0.9".into()),
    });
    cfg.compiled().expect("rules")
}

impl World {
    /// An apply of `cfg`, as the agent's: a new driver takes the ramps it keeps, resumes the
    /// published words, and every group is evaluated.
    fn apply(&mut self, cfg: &Config, now: Duration) -> Vec<Published> {
        let mut driver = Driver::new(cfg);
        driver.carry_ramps(&self.driver);
        driver.resume(cfg, &self.publisher, now);
        self.driver = driver;
        self.run(&[], true, now)
    }

    fn split_b(&self) -> (u16, u16) {
        let d = self.word();
        (d.pool_b, d.split_b)
    }
}

#[test]
fn a_canary_ramp_is_written_step_by_step_and_an_apply_keeps_or_restarts_it() {
    let steps = [1_000, 5_000, 10_000];
    let mut w = world_of(with_canary(&steps));
    let dc2 = w.pool("dc2");
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    assert_eq!(w.split_b(), (dc2, 1_000));
    assert_eq!(w.driver.next_deadline(), Some(ms(1_000)));
    assert!(w.timer(ms(999)).is_empty());
    assert_eq!(w.timer(ms(1_000)).len(), 1);
    assert_eq!(w.split_b(), (dc2, 5_000));
    let rec = w.audit.log.iter().last().expect("audit");
    assert_eq!(rec.switch, Some(rules::engine::SwitchKind::Canary));
    assert_eq!(rec.cause, "canary");

    // An apply that keeps the block: nothing is written, the ramp goes on from its step.
    let n = w.dp.log.len();
    assert!(w.apply(&with_canary(&steps), ms(1_500)).is_empty());
    assert_eq!(w.dp.log.len(), n, "an unrelated apply rewrote the word");
    let ramp = w.driver.canary_status("web-failover").expect("ramp");
    assert_eq!((ramp.step, ramp.next_step_at), (2, Some(ms(2_000))));

    // One that changes it starts over at its first step.
    let changed = [2_000, 10_000];
    assert_eq!(w.apply(&with_canary(&changed), ms(1_600)).len(), 1);
    assert_eq!(w.split_b(), (dc2, 2_000));
    let ramp = w.driver.canary_status("web-failover").expect("ramp");
    assert_eq!((ramp.step, ramp.next_step_at), (1, Some(ms(2_600))));

    // A canary backend down: rollback_when is true and the share goes to zero in the
    // evaluation that sees it.
    let out = w.health("dc2", "198.18.2.11", false, ms(1_700));
    assert_eq!(out.len(), 1);
    assert_eq!(w.word().pool_a, w.pool("dc1"));
    assert_eq!(w.word().pool_b, NO_POOL);
    let ramp = w.driver.canary_status("web-failover").expect("ramp");
    assert_eq!(ramp.state, rules::engine::RampPhase::RolledBack);
    let rec = w.audit.log.iter().last().expect("audit");
    assert_eq!(
        rec.values.get("pool.dc2.healthy_ratio").map(String::as_str),
        Some("0.5")
    );
    assert_eq!(w.driver.next_deadline(), None);
}

#[test]
fn canary_operations_go_through_the_driver_and_refuse_a_group_without_a_ramp() {
    let mut w = world(SwitchPolicy::default());
    let view = View {
        state: w.store.state(),
        health: w.publisher.health(),
        now: ms(1),
    };
    let e = w
        .driver
        .canary_op(
            "web-failover",
            rules::engine::CanaryOp::Pause,
            view,
            "canary pause",
        )
        .expect_err("no ramp");
    assert!(e.to_string().contains("has no canary ramp"), "{e}");

    let mut w = world_of(with_canary(&[1_000, 10_000]));
    let view = View {
        state: w.store.state(),
        health: w.publisher.health(),
        now: ms(10),
    };
    let d = w
        .driver
        .canary_op(
            "web-failover",
            rules::engine::CanaryOp::Abort("bad build".into()),
            view,
            "canary abort",
        )
        .expect("abort");
    assert_eq!(w.publish(vec![d]).len(), 1);
    assert_eq!(w.word().pool_b, NO_POOL);
    let rec = w.audit.log.iter().last().expect("audit");
    assert_eq!(rec.reason.as_deref(), Some("bad build"));
    assert_eq!(rec.cause, "canary abort");
}
