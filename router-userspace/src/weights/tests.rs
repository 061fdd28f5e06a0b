//! The computation with injected engine times: smoothing, the decrease limit, tolerance, the
//! scores, and the agent's words.

use std::{net::IpAddr, time::Duration};

use super::{Admin, Weights};
use crate::config::{
    Adaptive, AgentCheck, Backend, CheckKind, HealthCheck, Pool, WhenAllDown,
    model::{Backoff, DEFAULT_WEIGHT_WINDOW},
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ip(last: u8) -> IpAddr {
    IpAddr::from([198, 18, 1, last])
}

/// alpha 0.6, beta 0.2, gamma 0.2, every 1 s, no smoothing, no decrease limit, no tolerance.
fn params() -> Adaptive {
    Adaptive {
        alpha: 0.6,
        beta: 0.2,
        gamma: 0.2,
        delta: 0.0,
        interval: secs(1),
        smoothing: 0.0,
        max_decrease_per_second: 1e9,
        window: DEFAULT_WEIGHT_WINDOW,
        tolerance: 0.0,
        agent_check: None,
    }
}

fn pool(params: Adaptive, weights: &[u32]) -> Pool {
    Pool {
        name: "p".into(),
        backends: (1u8..)
            .zip(weights)
            .map(|(i, &weight)| Backend {
                address: ip(i),
                weight,
            })
            .collect(),
        health_check: Some(HealthCheck {
            kind: CheckKind::Tcp { port: 80 },
            interval: secs(1),
            timeout: secs(1),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            backoff: Backoff {
                factor: 1.0,
                max: secs(1),
            },
        }),
        when_all_down: WhenAllDown::Drop,
        slow_start: None,
        adaptive: Some(params),
        breaker: None,
        on_backend_down: crate::config::FlowPolicy::Keep,
    }
}

fn engine(params: Adaptive, weights: &[u32]) -> Weights {
    let mut w = Weights::new();
    w.configure(&[pool(params, weights)], Duration::ZERO);
    w
}

fn computed(w: &Weights) -> Vec<f64> {
    w.pool("p")
        .unwrap()
        .backends
        .iter()
        .map(|b| (b.computed * 1000.0).round() / 1000.0)
        .collect()
}

fn table(w: &Weights) -> Vec<u32> {
    w.table_weights("p")
        .unwrap()
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

/// `n` probes of backend `last`, `passed` of them passed with round-trip time `rtt`, at `at`.
fn probes(w: &mut Weights, last: u8, n: usize, passed: usize, rtt: Duration, at: Duration) {
    for i in 0..n {
        w.record_probe("p", ip(last), i < passed, rtt, at);
    }
}

#[test]
fn pass_rate_and_latency_are_normalised_across_the_pool() {
    let mut w = engine(params(), &[100, 100, 100, 200]);
    let ms = Duration::from_millis;
    probes(&mut w, 1, 10, 10, ms(10), secs(1));
    // Half of its probes fail; the passed ones take twice as long as the fastest backend's.
    probes(&mut w, 2, 10, 5, ms(20), secs(1));
    // 3 has no probe: pass rate and latency score are neutral.
    // 4: every probe fails (no passed RTT: latency score neutral), twice the base.
    probes(&mut w, 4, 4, 0, ms(1), secs(1));
    assert!(w.compute_due(secs(1)).contains(&"p".to_owned()));
    // 100·(0.6 + 0.2·1 + 0.2·1); 100·(0.6 + 0.2·0.5 + 0.2·0.5); 100; 200·(0.6 + 0 + 0.2).
    assert_eq!(computed(&w), [100.0, 80.0, 100.0, 160.0]);
    assert_eq!(table(&w), [100, 80, 100, 160]);
    let b = &w.pool("p").unwrap().backends[1];
    assert_eq!(
        (b.pass_rate, b.rtt_p99, b.latency_score),
        (0.5, Some(ms(20)), 0.5)
    );
}

#[test]
fn the_p99_is_the_nearest_rank_and_the_window_forgets_old_probes() {
    let mut p = params();
    p.window = secs(10);
    let mut w = engine(p, &[100, 100]);
    let ms = Duration::from_millis;
    // 1: 99 fast probes and one slow: the p99 is the 99th of 100, still fast.
    probes(&mut w, 1, 99, 99, ms(10), secs(1));
    probes(&mut w, 1, 1, 1, ms(500), secs(1));
    probes(&mut w, 2, 10, 10, ms(40), secs(1));
    w.compute_due(secs(1));
    assert_eq!(w.pool("p").unwrap().backends[0].rtt_p99, Some(ms(10)));
    assert_eq!(computed(&w), [100.0, 85.0]);
    // 2's slow probes leave the window; its fast new ones make it the fastest, like 1.
    probes(&mut w, 2, 1, 1, ms(10), secs(12));
    w.compute_due(secs(12));
    assert_eq!(w.pool("p").unwrap().backends[0].rtt_p99, None);
    assert_eq!(computed(&w), [100.0, 100.0]);
}

#[test]
fn smoothing_keeps_part_of_the_previous_weight() {
    let mut p = params();
    p.smoothing = 0.5;
    let mut w = engine(p, &[100]);
    probes(&mut w, 1, 10, 0, Duration::ZERO, secs(1));
    w.compute_due(secs(1));
    // W_new = 80: 0.5·100 + 0.5·80.
    assert_eq!(computed(&w), [90.0]);
    w.compute_due(secs(2));
    assert_eq!(computed(&w), [85.0]);
    w.compute_due(secs(3));
    assert_eq!(computed(&w), [82.5]);
}

#[test]
fn a_weight_falls_at_most_the_configured_share_per_second_and_rises_at_once() {
    let mut p = params();
    p.max_decrease_per_second = 0.05;
    p.window = Duration::from_millis(500);
    let mut w = engine(p, &[100]);
    probes(&mut w, 1, 10, 0, Duration::ZERO, secs(1));
    w.compute_due(secs(1));
    // W_new = 80, but one second since the pool was configured: at most 5 % down.
    assert_eq!(computed(&w), [95.0]);
    probes(&mut w, 1, 10, 0, Duration::ZERO, secs(2));
    w.compute_due(secs(2));
    assert_eq!(computed(&w), [90.25]);
    // Two seconds late: 10 % of 90.25.
    probes(&mut w, 1, 10, 0, Duration::ZERO, secs(4));
    w.compute_due(secs(4));
    assert_eq!(computed(&w), [81.225]);
    // Every probe passes again: back to the base in one step.
    probes(&mut w, 1, 10, 10, Duration::from_millis(1), secs(5));
    w.compute_due(secs(5));
    assert_eq!(computed(&w), [100.0]);
}

#[test]
fn a_change_within_tolerance_rebuilds_no_table() {
    let mut p = params();
    p.tolerance = 0.1;
    p.window = Duration::from_millis(500);
    let mut w = engine(p, &[100, 100]);
    // 1 passes 9 probes of 10: W = 98, 2 % off the 100 given: no rebuild.
    probes(&mut w, 1, 10, 9, Duration::from_millis(1), secs(1));
    probes(&mut w, 2, 10, 10, Duration::from_millis(1), secs(1));
    assert!(w.compute_due(secs(1)).is_empty());
    assert_eq!(computed(&w), [98.0, 100.0]);
    assert_eq!(table(&w), [100, 100]);
    let b = &w.pool("p").unwrap().backends[0];
    assert_eq!((b.given, b.changed_at), (100.0, None));
    // Every probe of 1 fails: W = 80 (latency neutral), 20 % off: rebuilt, both take theirs.
    probes(&mut w, 1, 10, 0, Duration::from_millis(1), secs(2));
    probes(&mut w, 2, 10, 10, Duration::from_millis(1), secs(2));
    assert_eq!(w.compute_due(secs(2)), ["p"]);
    assert_eq!(table(&w), [80, 100]);
    assert_eq!(w.pool("p").unwrap().backends[0].changed_at, Some(secs(2)));
    assert_eq!(w.pool("p").unwrap().backends[1].changed_at, None);
}

#[test]
fn computations_follow_the_interval() {
    let mut p = params();
    p.interval = secs(15);
    let mut w = engine(p, &[100]);
    assert_eq!(w.next_due(), Some(secs(15)));
    probes(&mut w, 1, 10, 0, Duration::ZERO, secs(1));
    assert!(w.compute_due(secs(14)).is_empty());
    assert_eq!(computed(&w), [100.0]);
    assert_eq!(w.compute_due(secs(15)), ["p"]);
    assert_eq!(w.next_due(), Some(secs(30)));
    // A new configuration keeps the schedule and the backend's state; a new base scales it.
    let mut p = params();
    p.interval = secs(15);
    w.configure(&[pool(p, &[200, 100])], secs(20));
    assert_eq!(w.next_due(), Some(secs(30)));
    assert_eq!(computed(&w), [160.0, 100.0]);
    // A config without adaptive weights forgets the pool.
    let mut plain = pool(params(), &[100]);
    plain.adaptive = None;
    w.configure(&[plain], secs(21));
    assert_eq!(w.next_due(), None);
    assert!(w.table_weights("p").is_none());
}

#[test]
fn the_integer_weight_is_at_least_one_unless_the_base_is_zero() {
    let mut w = engine(params(), &[1, 0]);
    probes(&mut w, 1, 10, 0, Duration::ZERO, secs(1));
    w.compute_due(secs(1));
    assert_eq!(computed(&w), [0.8, 0.0]);
    assert_eq!(table(&w), [1, 0]);
}

#[test]
fn the_agents_percentage_scales_its_share_and_drain_takes_the_backend_out_at_once() {
    let mut p = params();
    p.alpha = 0.4;
    p.delta = 0.2;
    p.agent_check = Some(AgentCheck {
        port: 8500,
        interval: secs(1),
        timeout: secs(1),
    });
    let mut w = engine(p, &[100, 100]);
    let a = ip(1);
    // A percentage waits for the next computation.
    assert!(!w.record_agent("p", a, Ok(b"50%\n".to_vec()), secs(1)));
    assert_eq!(table(&w), [100, 100]);
    w.compute_due(secs(1));
    // 100·(0.4 + 0.2 + 0.2 + 0.2·0.5).
    assert_eq!(table(&w), [90, 100]);
    // drain: weight 0 now; the score stands.
    assert!(w.record_agent("p", a, Ok(b"drain".to_vec()), secs(2)));
    assert_eq!(table(&w), [0, 100]);
    let agent = &w.pool("p").unwrap().backends[0].agent;
    assert_eq!((agent.admin, agent.score), (Admin::Drain, Some(0.5)));
    // A failed connection and a garbled line leave the drain, with why.
    assert!(!w.record_agent("p", a, Err("connection refused".into()), secs(3)));
    assert!(!w.record_agent("p", a, Ok(b"ready?!\n".to_vec()), secs(4)));
    let agent = &w.pool("p").unwrap().backends[0].agent;
    assert_eq!(agent.admin, Admin::Drain);
    assert_eq!(
        agent.error.as_deref(),
        Some("unknown word \"ready?!\" in the answer: \"ready?!\"")
    );
    assert_eq!(table(&w), [0, 100]);
    // ready, 100%: back at once at its computed weight, then 100 at the next computation.
    assert!(w.record_agent("p", a, Ok(b"ready 100%".to_vec()), secs(5)));
    assert_eq!(table(&w), [90, 100]);
    assert_eq!(w.pool("p").unwrap().backends[0].agent.error, None);
    w.compute_due(secs(5));
    assert_eq!(table(&w), [100, 100]);
    // maint and down hold it out too; up clears down only.
    assert!(w.record_agent("p", a, Ok(b"down".to_vec()), secs(6)));
    assert!(!w.record_agent("p", a, Ok(b"maint".to_vec()), secs(6)));
    assert!(!w.record_agent("p", a, Ok(b"up".to_vec()), secs(7)));
    assert_eq!(table(&w), [0, 100]);
    assert!(w.record_agent("p", a, Ok(b"ready".to_vec()), secs(8)));
    assert_eq!(table(&w), [100, 100]);
    assert_eq!(w.pool("p").unwrap().backends[0].changed_at, Some(secs(8)));
}

#[test]
fn samples_for_unknown_pools_and_backends_are_ignored() {
    let mut w = engine(params(), &[100]);
    w.record_probe("q", ip(1), false, Duration::ZERO, secs(1));
    w.record_probe("p", ip(9), false, Duration::ZERO, secs(1));
    assert!(!w.record_agent("p", ip(9), Ok(b"drain".to_vec()), secs(1)));
    w.compute_due(secs(1));
    assert_eq!(computed(&w), [100.0]);
}
