//! State variables, decision groups and `decide` targets: what converts, and every broken file
//! reported with its file, line and key path (expression errors with their caret).

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

/// `POOLS` plus `rest`, loaded; the problems one per line (expression carets included).
fn problems(rest: &str) -> String {
    match load_files(&[("x.yaml".into(), format!("{POOLS}{rest}"))]) {
        Ok(_) => panic!("expected problems in:\n{rest}"),
        Err(e) => e.to_string(),
    }
}

const GROUP: &str = "\
decisions:
  - name: wf
    rules:
      - { id: primary, priority: 100, when: up, then: { pool: dc1 } }
      - { id: failover, priority: 90, when: NOT up, then: { pool: dc2 } }
    default: { pool: dc1 }
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
    let e = load_files(&[("x.yaml".into(), "pools: [ { name: p, backends: [ { address: 198.18.3.11 } ], health_check: { exec: { command: [] } } } ]\n".into())]);
    assert!(e.is_err_and(|e| e.to_string().starts_with(
        "x.yaml:1 pools[0].health_check.exec.command: command needs a program to run"
    )));
}

#[test]
fn a_syntax_error_in_a_rule_is_located_with_a_caret() {
    let out = problems(&format!(
        "state: {{ up: {{ push: {{ default: true }} }} }}\n{}",
        GROUP.replace("when: up,", "when: \"up AND (pool.dc1.healthy\",")
    ));
    assert_eq!(
        out,
        "x.yaml:10 decisions[0].rules[0].when: invalid expression: expected a comparison, in, AND, \
         OR or ')', found end of input at 1:25\n  up AND (pool.dc1.healthy\n                          ^"
    );
}

#[test]
fn a_type_error_and_a_push_default_of_the_wrong_type() {
    let out = problems(&format!(
        "state: {{ up: {{ push: {{ default: \"yes\" }} }} }}\n{GROUP}"
    ));
    assert_eq!(
        out,
        "x.yaml:10 decisions[0].rules[0].when: invalid expression: an expression must be bool \
         (true or false), found string at 1:1\n  up\n  ^^\n\
         x.yaml:11 decisions[0].rules[1].when: invalid expression: NOT needs bool operands, found \
         string at 1:5\n  NOT up\n      ^^"
    );
    let out = problems(&format!(
        "state: {{ up: {{ push: {{ default: yes }} }} }}\n{GROUP}"
    ));
    assert!(
        out.starts_with(
            "x.yaml:6 state.up.push.default: ambiguous default \"yes\"; write true or false"
        ),
        "{out}"
    );
    let out = problems(&format!("state: {{ up: {{ push: {{}} }} }}\n{GROUP}"));
    assert!(
        out.starts_with("x.yaml:6 state.up.push: missing required key \"default\""),
        "{out}"
    );
}

#[test]
fn an_unknown_name_suggests_the_nearest() {
    let out = problems(&format!(
        "state: {{ up: {{ push: {{ default: true }} }} }}\n{}",
        GROUP.replace("when: up,", "when: pool.dc1.healty,")
    ));
    assert_eq!(
        out,
        "x.yaml:10 decisions[0].rules[0].when: invalid expression: unknown name \
         \"pool.dc1.healty\"; did you mean \"pool.dc1.healthy\"? at 1:1\n  pool.dc1.healty\n  ^^^^^^^^^^^^^^^"
    );
}

#[test]
fn derived_variable_cycles_are_rejected_with_their_path() {
    let out = problems(&format!(
        "state:\n  a: {{ expr: \"b AND up\" }}\n  b: {{ expr: c }}\n  c: {{ expr: a }}\n  up: {{ push: {{ default: true }} }}\n{GROUP}"
    ));
    assert_eq!(
        out,
        "x.yaml:7 state.a.expr: derived variables form a cycle: a → b → c → a; an expr may not \
         read itself, directly or through others"
    );
}

#[test]
fn unknown_pools_groups_and_gate_variables_are_located() {
    let state = "state: { up: { push: { default: true } }, n: { push: { default: 1 } } }\n";
    let group = GROUP
        .replace("then: { pool: dc2 }", "then: { pool: dc3 }")
        .replace(
            "default: { pool: dc1 }",
            "default: { pool: dc1 }\n    automatic: n",
        );
    let out = problems(&format!(
        "{state}{}",
        group.replace("name: wf", "name: wf2")
    ));
    assert_eq!(
        out,
        "x.yaml:2 services[0].to.decide: unknown decision group \"wf\"; did you mean \"wf2\"?\n\
         x.yaml:11 decisions[0].rules[1].then.pool: unknown pool \"dc3\"; did you mean \"dc1\"?\n\
         x.yaml:13 decisions[0].automatic: automatic must name a bool variable; \"n\" is number"
    );
}

#[test]
fn rule_ids_are_unique_splits_have_two_pools_and_target_is_for_require_only() {
    let state = "state: { up: { push: { default: true } } }\n";
    let group = "\
decisions:
  - name: wf
    rules:
      - { id: r, when: up, then: { split: [ { pool: dc1, weight: 1 }, { pool: dc1, weight: 1 } ] } }
      - { id: r, when: target.healthy_count >= 1, then: { pool: dc2 } }
    require: target.healthy_count >= 1 AND up
";
    let out = problems(&format!("{state}{group}"));
    assert_eq!(
        out,
        "x.yaml:10 decisions[0].rules[0].then.split[1].pool: pool \"dc1\" is in the split twice; \
         split between two different pools\n\
         x.yaml:11 decisions[0].rules[1].id: duplicate rule id \"r\" in this group; first used at x.yaml:10\n\
         x.yaml:11 decisions[0].rules[1].when: target.healthy_count can be read only in \
         `require`; `target` is the pool a switch would go to"
    );
}

#[test]
fn state_names_metrics_and_probes_are_checked() {
    let out = problems(&format!(
        "state:\n  pool.x: {{ push: {{ default: true }} }}\n  and: {{ push: {{ default: true }} }}\n  \
         up: {{ metric: {{ of: service.wbe.packets_per_second, above: 10, below: 20 }} }}\n  \
         p: {{ probe: {{ http: \"https://198.18.1.11/\" }} }}\n  q: {{ probe: {{ tcp: x, exec: {{ command: [/bin/true] }} }} }}\n{GROUP}"
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert!(lines[0].starts_with(
        "x.yaml:7 state.pool.x: \"pool.x\" is in the namespace of the built-ins `pool.*`"
    ));
    assert!(lines[1].starts_with("x.yaml:8 state.and: \"and\" cannot be used in an expression"));
    assert!(lines[2].starts_with("x.yaml:9 state.up.metric.of: \"service.wbe.packets_per_second\" names unknown service \"wbe\"; did you mean \"web\"?"));
    assert!(
        lines[3]
            .starts_with("x.yaml:9 state.up.metric.below: below (20) must not exceed above (10)")
    );
    assert!(lines[4].starts_with("x.yaml:10 state.p.probe.http: https probes are not supported"));
    assert!(
        lines[5].starts_with("x.yaml:11 state.q.probe: probe has tcp and exec: give exactly one")
    );
}

#[test]
fn a_group_shared_by_both_families_or_with_pools_of_another_family_is_rejected() {
    let text = "\
services:
  - { name: web6, vip: 2001:db8::10, port: 80, protocol: tcp, forward: dsr-l2, to: { decide: wf } }
pools:
  - { name: dc1, backends: [ { address: 198.18.1.11 } ] }
state: { up: { push: { default: true } } }
decisions: [ { name: wf, rules: [ { id: r, when: up, then: { pool: dc1 } } ] } ]
";
    let e = load_files(&[("x.yaml".into(), text.into())])
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some(
            "x.yaml:6 decisions[0].name: pools dc1 have backends that are not IPv6 like service \
              \"web6\" (2001:db8::10) that uses this group; service \"web6\" is at x.yaml:2"
        )
    );
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
