//! State variables, decision groups and `decide` targets: what converts into the model, exec
//! health checks, and the lint warnings of a group. (Their refused configs are cases of
//! [`crate::invalid`].)

use std::{net::IpAddr, time::Duration};

use rules::engine::Action;
use switchyard::config::{
    CheckKind, Target, lint, load_files,
    model::{DecisionRule, MetricSpec, PushValue, StateSource, SwitchPolicy},
};

const POOLS: &str = "\
services:
  - { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, forward: dsr-l2, to: { decide: wf } }
pools:
  - { name: dc1, backends: [ { address: 198.18.1.11 } ] }
  - { name: dc2, backends: [ { address: 198.18.2.11 } ] }
";

#[test]
fn state_decisions_and_decide_convert_into_the_model() {
    let text = format!(
        "{POOLS}\
state:
  up: {{ probe: {{ http: \"http://198.18.1.11:8080/health\", interval: 100ms, timeout: 200ms }} }}
  db: {{ probe: {{ tcp: \"[2001:db8::50]:5432\" }} }}
  script: {{ probe: {{ exec: {{ command: [/bin/true] }}, interval: 2s }} }}
  maint: {{ push: {{ default: false }} }}
  label: {{ push: {{ default: \"false\" }} }}
  level: {{ push: {{ default: 3 }} }}
  ready: {{ expr: \"pool.dc2.healthy_count >= 1 AND up\" }}
  flood: {{ metric: {{ of: service.web.packets_per_second, above: 500000, below: 200000, for: 5s }} }}
decisions:
  - name: wf
    rules:
      - {{ id: canary, priority: 110, when: up AND maint, then: {{ split: [ {{ pool: dc1, weight: 95 }}, {{ pool: dc2, weight: 5 }} ] }} }}
      - {{ id: primary, when: up, then: {{ pool: dc1 }} }}
    switch: {{ stable_for: 50ms, cooldown: 3s, failback_after: 0s }}
    require: target.healthy_count >= 1
    automatic: maint
agent: {{ state_dir: /srv/switchyard }}
"
    );
    let cfg = load_files(&[("x.yaml".into(), text)]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.agent.state_dir.to_str(), Some("/srv/switchyard"));
    assert_eq!(cfg.services[0].to, Target::Decide("wf".into()));
    let by = |n: &str| &cfg.state.iter().find(|v| v.name == n).expect(n).source;
    let StateSource::Probe(up) = by("up") else {
        panic!()
    };
    assert_eq!(up.address, Some(IpAddr::from([198, 18, 1, 11])));
    assert_eq!(
        up.check.kind,
        CheckKind::Http {
            port: 8080,
            path: "/health".into(),
            expect: vec![200]
        }
    );
    assert_eq!(up.check.timeout, Duration::from_millis(200));
    let StateSource::Probe(db) = by("db") else {
        panic!()
    };
    assert_eq!(db.check.kind, CheckKind::Tcp { port: 5432 });
    let StateSource::Probe(script) = by("script") else {
        panic!()
    };
    assert_eq!(
        script.check.kind,
        CheckKind::Exec {
            command: vec!["/bin/true".into()]
        }
    );
    assert_eq!(by("maint"), &StateSource::Push(PushValue::Bool(false)));
    assert_eq!(
        by("label"),
        &StateSource::Push(PushValue::String("false".into()))
    );
    assert_eq!(by("level"), &StateSource::Push(PushValue::Number(3.0)));
    assert!(matches!(by("ready"), StateSource::Expr(e) if e.contains("healthy_count")));
    assert_eq!(
        by("flood"),
        &StateSource::Metric(MetricSpec {
            of: "service.web.packets_per_second".into(),
            above: 500_000.0,
            below: 200_000.0,
            hold: Duration::from_secs(5),
        })
    );
    let g = &cfg.decisions[0];
    assert_eq!(
        g.rules[1],
        DecisionRule {
            id: "primary".into(),
            priority: 0,
            when: "up".into(),
            then: Action::pool("dc1"),
        }
    );
    assert_eq!(
        g.rules[0].then,
        Action::Split(vec![("dc1".into(), 95), ("dc2".into(), 5)])
    );
    assert_eq!(g.default, None);
    assert_eq!(
        g.switch,
        SwitchPolicy {
            stable_for: Duration::from_millis(50),
            cooldown: Duration::from_secs(3),
            failback_after: Duration::ZERO,
        }
    );
    assert_eq!(g.automatic.as_deref(), Some("maint"));
    assert!(switchyard::config::schema::build(&cfg).is_ok());
}

#[test]
fn exec_health_checks_are_supported_for_pools() {
    let text = "pools: [ { name: p, backends: [ { address: 198.18.3.11 } ], \
                health_check: { exec: { command: [/usr/local/bin/check-dns, \"{address}\"] } } } ]\n";
    let cfg = load_files(&[("x.yaml".into(), text.into())]).unwrap_or_else(|e| panic!("{e}"));
    let hc = cfg.pools[0].health_check.as_ref().expect("health check");
    assert_eq!(
        hc.kind,
        CheckKind::Exec {
            command: vec!["/usr/local/bin/check-dns".into(), "{address}".into()]
        }
    );
    // Without a command: the case `exec_check_without_a_command` of [`crate::invalid`].
}

#[test]
fn lint_warns_about_shadowed_rules_uncovered_states_and_overlaps() {
    let text = format!(
        "{POOLS}state: {{ up: {{ push: {{ default: true }} }}, maint: {{ push: {{ default: false }} }} }}
decisions:
  - name: wf
    rules:
      - {{ id: primary, priority: 100, when: up, then: {{ pool: dc1 }} }}
      - {{ id: narrow, priority: 90, when: up AND NOT maint, then: {{ pool: dc2 }} }}
      - {{ id: m1, priority: 50, when: maint, then: {{ pool: dc2 }} }}
      - {{ id: m2, priority: 50, when: maint, then: {{ pool: dc1 }} }}
"
    );
    let cfg = load_files(&[("x.yaml".into(), text)]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        lint(&cfg),
        [
            "decisions[wf]: rule \"narrow\" can never fire: \"primary\" (ahead of it) is true \
             whenever it is",
            "decisions[wf]: rule \"m2\" can never fire: \"m1\" (ahead of it) is true whenever it is",
            "decisions[wf]: no rule matches 1 of 4 state combinations and there is no default \
             (the current action stays); for example up=false, maint=false",
            "decisions[wf]: rules \"m1\" and \"m2\" have equal priority and can both be true \
             (declaration order picks \"m1\"); for example maint=true",
        ]
    );
}
