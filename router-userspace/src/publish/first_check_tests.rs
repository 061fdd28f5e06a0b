//! Where a backend's health starts: a backend an apply adds to a running health-checked pool
//! takes no new flow until its first check has passed (`healthy_threshold` probes in a row); a
//! backend the apply carries over keeps its state; a pool without a check, a cold start and a
//! restart over the maps serve at once. Probes are driven through the pure policy and time
//! through the publisher's injected clock: nothing sleeps.

use std::{fmt::Write as _, net::IpAddr, time::Duration};

use router_common::{BACKEND_DOWN, BACKEND_UP, NH_F_RESOLVED, NO_BACKEND, NextHop};

use super::Publisher;
use crate::{
    config::{Config, load_files},
    dataplane::memory::MemoryDataplane,
    health::{AWAITING_FIRST_CHECK, BackendHealth},
    probe::{self, HealthState, Subject, Transition},
};

/// A TCP service over pool `dc1` of backends `198.18.1.1N` for each `N` in `backends`; with
/// `check`, the pool has a TCP health check of `healthy_threshold: 3`, and with `slow_start`,
/// that slow start.
fn config(backends: &[u8], check: bool, slow_start: Option<&str>) -> Config {
    let mut text = "services:\n  - { name: web, vip: \"198.18.0.10\", port: 80, protocol: tcp, \
                    forward: dsr-l2, to: { pool: dc1 } }\npools:\n  - name: dc1\n"
        .to_owned();
    if check {
        text.push_str(
            "    health_check: { tcp: { port: 80 }, interval: 1s, timeout: 300ms, \
             unhealthy_threshold: 2, healthy_threshold: 3 }\n",
        );
    }
    if let Some(t) = slow_start {
        let _ = writeln!(text, "    slow_start: {t}");
    }
    text.push_str("    backends:\n");
    for n in backends {
        let _ = writeln!(text, "      - {{ address: \"198.18.1.1{n}\" }}");
    }
    load_files(&[("10-web.yaml".into(), text)]).expect("config")
}

fn backend(n: u8) -> IpAddr {
    format!("198.18.1.1{n}").parse().expect("address")
}

fn at(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// Backend slots in `dc1`'s live table, with how many entries each owns.
fn live(p: &Publisher, dp: &MemoryDataplane) -> std::collections::BTreeMap<u32, usize> {
    let pool = &p.pools()["dc1"];
    let mut owners = std::collections::BTreeMap::new();
    for slot in dp.live_table(pool.slot).expect("live table") {
        *owners.entry(*slot).or_default() += 1;
    }
    owners
}

/// Whether backend `n` owns entries of `dc1`'s live table.
fn in_table(p: &Publisher, dp: &MemoryDataplane, n: u8) -> bool {
    let slot = p.backend_slot("dc1", backend(n)).expect("slot");
    live(p, dp).contains_key(&slot)
}

/// Backend `n` of `dc1` in the health table.
fn of(p: &Publisher, n: u8) -> BackendHealth {
    p.health()
        .get("dc1", backend(n))
        .expect("in the health table")
}

/// The state of backend `n`'s map entry.
fn entry(p: &Publisher, dp: &MemoryDataplane, n: u8) -> u32 {
    dp.backends[&p.backend_slot("dc1", backend(n)).expect("slot")].state
}

/// The probe the agent would start for backend `n` of `cfg` after the publisher applied it:
/// from the health table's verdict, as `Runtime::start_probes` starts it.
fn probe_of(p: &Publisher, cfg: &Config, n: u8) -> HealthState {
    let health = p.health();
    let target = probe::targets(cfg, |pool, address| {
        health.get(pool, address).is_none_or(|b| b.healthy)
    })
    .into_iter()
    .find(|t| {
        t.subject
            == Subject::Backend {
                pool: "dc1".into(),
                address: backend(n),
            }
    })
    .expect("a probe target");
    HealthState::resume(&target.check, target.healthy)
}

/// One probe of backend `n`: a transition goes into the maps, as `Runtime::on_health` does.
fn probe(
    p: &mut Publisher,
    dp: &mut MemoryDataplane,
    state: &mut HealthState,
    n: u8,
    success: bool,
) -> Option<Transition> {
    let transition = state.record(success);
    if transition.is_some() {
        p.set_health(dp, "dc1", backend(n), state.is_healthy())
            .expect("health");
    }
    transition
}

#[test]
fn a_backend_an_apply_adds_to_a_checked_pool_takes_no_flow_until_healthy_threshold_passes() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    p.set_now(at(100));
    p.apply(&mut dp, &config(&[1, 2], true, Some("10s")))
        .expect("apply");
    // A cold start: nothing was running, every backend serves at once.
    assert_eq!(p.health().counts("dc1"), (2, 2));

    let cfg = config(&[1, 2, 3], true, Some("10s"));
    p.set_now(at(200));
    p.apply(&mut dp, &cfg).expect("apply");
    let b3 = of(&p, 3);
    assert!(b3.awaiting_check && !b3.healthy && !b3.usable(), "{b3:?}");
    assert_eq!(b3.reason(), Some(AWAITING_FIRST_CHECK));
    assert_eq!(entry(&p, &dp, 3), BACKEND_DOWN);
    assert!(!in_table(&p, &dp, 3));
    assert!(in_table(&p, &dp, 1) && in_table(&p, &dp, 2));
    assert_eq!(p.health().counts("dc1"), (2, 3));

    // Its probe starts down: two passes, a failure and two passes again are not three in a row.
    let mut state = probe_of(&p, &cfg, 3);
    assert!(!state.is_healthy());
    for (secs, success) in [
        (201, true),
        (202, true),
        (203, false),
        (204, true),
        (205, true),
    ] {
        p.set_now(at(secs));
        assert_eq!(probe(&mut p, &mut dp, &mut state, 3, success), None);
        assert!(!p.health().usable("dc1", backend(3)), "at {secs} s");
        assert!(!in_table(&p, &dp, 3), "at {secs} s");
    }
    // The third pass in a row puts it in service, ramping from then on.
    p.set_now(at(206));
    assert_eq!(
        probe(&mut p, &mut dp, &mut state, 3, true),
        Some(Transition::Up)
    );
    let b3 = of(&p, 3);
    assert!(b3.usable() && !b3.awaiting_check && b3.reason().is_none());
    assert_eq!(entry(&p, &dp, 3), BACKEND_UP);
    assert!(in_table(&p, &dp, 3));
    let ramp = p.pools()["dc1"]
        .backends
        .iter()
        .find(|b| b.address == backend(3))
        .and_then(|b| b.ramp);
    assert_eq!(
        ramp,
        Some(at(206)),
        "its slow start begins at its first pass"
    );
}

#[test]
fn a_backend_an_apply_carries_over_keeps_its_state_waiting_included() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    p.apply(&mut dp, &config(&[1, 2], true, None))
        .expect("apply");
    p.set_health(&mut dp, "dc1", backend(2), false)
        .expect("health");
    p.apply(&mut dp, &config(&[1, 2, 3], true, None))
        .expect("apply");
    // Another change (a backend removed, one added): the rest are carried over.
    let cfg = config(&[2, 3, 1, 4], true, None);
    p.apply(&mut dp, &cfg).expect("apply");
    assert!(of(&p, 1).usable(), "up stays up");
    assert!(
        !of(&p, 2).healthy && !of(&p, 2).awaiting_check,
        "down stays down: {:?}",
        of(&p, 2)
    );
    assert_eq!(of(&p, 2).reason(), Some("health check failed"));
    assert!(of(&p, 3).awaiting_check, "a reload does not end a wait");
    assert!(of(&p, 4).awaiting_check, "new");
    assert_eq!(p.health().counts("dc1"), (1, 4));
    // Their probes restart from what the table says.
    assert!(probe_of(&p, &cfg, 1).is_healthy());
    assert!(!probe_of(&p, &cfg, 2).is_healthy());
    assert!(!probe_of(&p, &cfg, 3).is_healthy());
    // A backend removed and added again is new.
    p.apply(&mut dp, &config(&[2, 3, 4], true, None))
        .expect("apply");
    p.apply(&mut dp, &config(&[1, 2, 3, 4], true, None))
        .expect("apply");
    assert!(of(&p, 1).awaiting_check);
    // Its pool's check removed, every backend serves (nothing would probe it up).
    p.apply(&mut dp, &config(&[1, 2, 3, 4], false, None))
        .expect("apply");
    assert_eq!(p.health().counts("dc1"), (4, 4));
    assert!(live(&p, &dp).len() == 4 && !live(&p, &dp).contains_key(&NO_BACKEND));
}

#[test]
fn a_backend_added_to_a_pool_without_a_check_serves_at_once() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    p.apply(&mut dp, &config(&[1], false, None)).expect("apply");
    p.apply(&mut dp, &config(&[1, 2], false, None))
        .expect("apply");
    let b2 = of(&p, 2);
    assert!(b2.usable() && !b2.awaiting_check);
    assert_eq!(entry(&p, &dp, 2), BACKEND_UP);
    assert!(in_table(&p, &dp, 2));
    // A check added to a serving pool keeps its backends serving; a backend added with it
    // waits for its first pass.
    p.apply(&mut dp, &config(&[1, 2, 3], true, None))
        .expect("apply");
    assert!(p.health().usable("dc1", backend(1)) && p.health().usable("dc1", backend(2)));
    assert!(of(&p, 3).awaiting_check);
}

#[test]
fn a_restart_over_the_maps_keeps_serving_backends_in_service() {
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    p.apply(&mut dp, &config(&[1, 2], true, None))
        .expect("apply");
    p.set_health(&mut dp, "dc1", backend(2), false)
        .expect("health");
    let cfg = config(&[1, 2, 3], true, None);
    p.apply(&mut dp, &cfg).expect("apply");
    let hop = NextHop {
        ifindex: 2,
        flags: NH_F_RESOLVED,
        macs: [2; 12],
        mtu: 1500,
    };
    let hops: Vec<_> = [1, 2, 3].map(|n| (backend(n), Some(hop))).into();
    p.set_next_hops(&mut dp, &hops).expect("next hops");
    let table = live(&p, &dp);

    // The agent restarts: the publisher is restored from the ledger and the maps, its
    // backends reachable through the next hops their slots hold.
    let mut r = Publisher::restore(&p.ledger(), &dp)
        .expect("restore")
        .requiring_next_hops();
    assert!(
        r.health().usable("dc1", backend(1)),
        "serving before, serving now"
    );
    assert!(!r.health().usable("dc1", backend(2)));
    assert!(!r.health().usable("dc1", backend(3)), "its entry is down");
    assert!(
        !probe_of(&r, &cfg, 3).is_healthy(),
        "it still needs its passes"
    );
    // The same config again rewrites no table; a backend added by this apply waits.
    r.apply(&mut dp, &cfg).expect("apply");
    assert_eq!(live(&r, &dp), table);
    r.apply(&mut dp, &config(&[1, 2, 3, 4], true, None))
        .expect("apply");
    assert_eq!(live(&r, &dp), table, "the new backend is not in the table");
    assert!(of(&r, 4).awaiting_check);
    assert!(r.health().usable("dc1", backend(1)));

    // Maps resumed from a version without pools hold a running config too.
    let mut dp = MemoryDataplane::default();
    let mut empty = Publisher::new();
    empty
        .apply(&mut dp, &load_files(&[]).expect("empty config"))
        .expect("apply");
    let mut r = Publisher::restore(&empty.ledger(), &dp).expect("restore");
    r.apply(&mut dp, &config(&[1], true, None)).expect("apply");
    assert!(of(&r, 1).awaiting_check);
}
