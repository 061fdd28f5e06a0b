//! State change → decision map write complete, in process (target p99 < 100 µs).
//!
//! The real [`Driver`] and [`Publisher`] against the in-memory dataplane
//! (`switchyard::dataplane::memory`), with the `web-failover` group of the failover test
//! (`tests/tests/failover.rs`) and `switch: { stable_for: 0s, cooldown: 0s, failback_after: 0s }`
//! so that every change switches. One iteration: take the event time, set the push variable
//! `maintenance_mode` (alternately true and false; `Store::set_push`, which also recomputes the
//! derived variables), `Driver::on_change` with the changed slots (finds the group that reads
//! them, evaluates its rules, `require` and switch policy), `Publisher::publish_decision` writes
//! the word, and the audit record is kept, as the agent's runtime does, stop the clock. Every iteration must publish exactly one
//! switch, to the expected pool.
//!
//! Two groups: the two-rule `web-failover`, and the same two rules on top of 998 filler rules
//! over 200 push variables (each reads 5 of them; all false), so the group that re-evaluates has
//! 1,000 rules. The driver evaluates every rule of a group it re-evaluates.
//!
//! Not criterion: the target is a tail (p99), so the bench times each iteration itself and sorts.
//! Run: `cargo bench -p router-userspace --bench decision` (`-- --iters N`, default 100,000).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rules::engine::Action;
use switchyard::{
    config::load_files,
    dataplane::memory::MemoryDataplane,
    decision::{AUDIT_CAPACITY, Audit, Driver, View},
    publish::Publisher,
    state::Store,
};

const GROUP: &str = "web-failover";

fn yaml(fillers: usize) -> String {
    let mut rules = String::from(
        "      - { id: dc1-primary, priority: 5000, when: \"dc1_api_healthy AND NOT maintenance_mode\", then: { pool: dc1 } }\n\
         \x20     - { id: failover-dc2, priority: 4999, when: \"(NOT dc1_api_healthy OR maintenance_mode) AND dc2_ready\", then: { pool: dc2 } }\n",
    );
    let mut state = String::new();
    let vars = if fillers > 0 { 200 } else { 0 };
    for v in 0..vars {
        let _ = writeln!(state, "  f{v}: {{ push: {{ default: false }} }}");
    }
    for r in 0..fillers {
        let pick = |k: usize| (r * 7 + k * 41) % vars;
        let when = format!(
            "f{} AND (f{} OR NOT f{}) AND NOT f{} AND f{}",
            pick(0),
            pick(1),
            pick(2),
            pick(3),
            pick(4)
        );
        let pool = if r % 2 == 0 { "dc1" } else { "dc2" };
        let _ = writeln!(
            rules,
            "      - {{ id: filler-{r}, priority: {}, when: \"{when}\", then: {{ pool: {pool} }} }}",
            4000 - r
        );
    }
    format!(
        r#"services:
  - {{ name: web, vip: "203.0.113.10", port: 80, protocol: tcp, forward: dsr-l2, to: {{ decide: {GROUP} }} }}
pools:
  - name: dc1
    backends:
      - {{ address: "198.18.1.11", weight: 100 }}
      - {{ address: "198.18.1.12", weight: 100 }}
  - name: dc2
    backends:
      - {{ address: "198.18.2.11", weight: 100 }}
      - {{ address: "198.18.2.12", weight: 100 }}
state:
  dc1_api_healthy:
    probe: {{ http: "http://198.18.1.11:8080/health", interval: 100ms, timeout: 200ms }}
  maintenance_mode: {{ push: {{ default: false }} }}
  dc2_ready: {{ expr: "pool.dc2.healthy_count >= 1" }}
{state}decisions:
  - name: {GROUP}
    rules:
{rules}    default: {{ pool: dc1 }}
    switch: {{ stable_for: 0s, cooldown: 0s, failback_after: 0s }}
    require: "target.healthy_count >= 1"
"#
    )
}

#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "an index into the sorted samples: (len − 1) · q rounded, for q in 0..=1"
)]
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[expect(
    clippy::too_many_lines,
    reason = "one measurement: setup, the timed loop as the agent's runtime runs it, the report"
)]
fn run(label: &str, fillers: usize, iters: usize) {
    let cfg = load_files(&[("10-web.yaml".into(), yaml(fillers))]).expect("config");
    let mut publisher = Publisher::new();
    let mut health = publisher.health().clone();
    health.configure(&cfg);
    let mut store = Store::new(&cfg, &health);
    store.set_probe("dc1_api_healthy", true);
    let mut dp = MemoryDataplane::default();
    let mut driver = Driver::new(&cfg);
    let mut audit = Audit::new(AUDIT_CAPACITY, None);
    let first = driver.initial_actions(View {
        state: store.state(),
        health: &health,
        now: Duration::ZERO,
    });
    publisher
        .apply_decided(&mut dp, &cfg, &first)
        .expect("apply");
    let view = View {
        state: store.state(),
        health: publisher.health(),
        now: Duration::ZERO,
    };
    for d in driver.on_change(&[], true, view, "start") {
        if let Some(to) = &d.switch_to {
            publisher
                .publish_decision(&mut dp, &d.group, to)
                .expect("write");
        }
    }
    let slot = publisher.groups()[GROUP].slot;
    let words: BTreeMap<bool, u64> = [
        (
            true,
            publisher.action_word(Some(&Action::pool("dc2")), Some("dc1")),
        ),
        (
            false,
            publisher.action_word(Some(&Action::pool("dc1")), Some("dc2")),
        ),
    ]
    .into();

    let warmup = iters / 10;
    let mut times = Vec::with_capacity(iters);
    let mut reported = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let maintenance = i % 2 == 0;
        let now = Duration::from_millis(1 + i as u64);
        let event = Instant::now();
        let changed = store
            .set_push(
                "maintenance_mode",
                if maintenance { "true" } else { "false" },
            )
            .expect("set");
        // As the agent's runtime does: the pure driver decides, the publisher writes the
        // word, the audit trail keeps the records with the latency.
        let view = View {
            state: store.state(),
            health: publisher.health(),
            now,
        };
        let decided = driver.on_change(&changed, false, view, "bench");
        let mut out = Vec::new();
        for d in decided {
            let Some(to) = &d.switch_to else { continue };
            if let Some(word) = publisher
                .publish_decision(&mut dp, &d.group, to)
                .expect("write")
            {
                let latency_us = u64::try_from(event.elapsed().as_micros()).unwrap_or(u64::MAX);
                out.push((word, latency_us));
                for mut r in d.records {
                    r.latency_us = Some(latency_us);
                    audit.push(r);
                }
            }
        }
        let took = event.elapsed();
        assert_eq!(out.len(), 1, "iteration {i}: {out:?}");
        assert_eq!(dp.decisions[&slot], words[&maintenance], "iteration {i}");
        if i >= warmup {
            times.push(took);
            reported.push(out[0].1);
        }
        // Keep the in-memory write log from growing the measurement.
        dp.log.clear();
    }
    times.sort();
    reported.sort_unstable();
    let mean = times.iter().sum::<Duration>()
        / u32::try_from(times.len()).expect("an iteration count that fits a u32");
    println!(
        "{label}: {iters} switches; state change → decision word written: p50 {:.2} µs, p90 {:.2} µs, \
         p99 {:.2} µs, p99.9 {:.2} µs, max {:.2} µs, mean {:.2} µs; driver-reported latency_us p99 {} \
         (target p99 < 100 µs: {})",
        us(quantile(&times, 0.5)),
        us(quantile(&times, 0.9)),
        us(quantile(&times, 0.99)),
        us(quantile(&times, 0.999)),
        us(times[times.len() - 1]),
        us(mean),
        reported[(reported.len() - 1) * 99 / 100],
        if quantile(&times, 0.99) < Duration::from_micros(100) {
            "met"
        } else {
            "NOT met"
        }
    );
}

fn main() {
    let mut iters = 100_000;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--iters" {
            iters = args.next().and_then(|n| n.parse().ok()).expect("--iters N");
        }
        // cargo bench passes `--bench`; ignore anything else.
    }
    run("web-failover (2 rules)", 0, iters);
    run(
        "web-failover + 998 filler rules (1,000 rules, 203 variables)",
        998,
        iters,
    );
}
