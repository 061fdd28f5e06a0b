use std::time::Duration;

use rules::Value;

use super::*;
use crate::config::{
    Agent, Backend, Conntrack, Forward, HashMode, HealthCheck, Pool, Protocol, Service, Target,
    WhenAllDown,
    model::{DecisionGroup, DecisionRule, MetricSpec, StateProbe, StateVar, SwitchPolicy},
    model::{PushValue, StateSource},
};
use crate::health::Health;

fn check() -> HealthCheck {
    HealthCheck {
        kind: crate::config::CheckKind::Tcp { port: 80 },
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(50),
        unhealthy_threshold: 1,
        healthy_threshold: 1,
        backoff: crate::config::Backoff {
            factor: 1.0,
            max: Duration::from_millis(100),
        },
    }
}

fn pool(name: &str, addrs: &[&str]) -> Pool {
    Pool {
        name: name.into(),
        backends: addrs
            .iter()
            .map(|a| Backend {
                address: a.parse().expect("address"),
                weight: 100,
            })
            .collect(),
        health_check: Some(check()),
        when_all_down: WhenAllDown::Drop,
        slow_start: None,
        breaker: None,
        adaptive: None,
        on_backend_down: crate::config::FlowPolicy::Keep,
    }
}

fn service(name: &str, port: u16, to: Target) -> Service {
    Service {
        name: name.into(),
        vip: "198.18.0.10".parse().expect("vip"),
        port,
        protocol: Protocol::Tcp,
        forward: Forward::DsrL2,
        hash: HashMode::FiveTuple,
        to,
    }
}

fn var(name: &str, source: StateSource) -> StateVar {
    StateVar {
        name: name.into(),
        source,
    }
}

/// The web-failover shape of reference.yaml: dc1/dc2, two services on one group, probe, push,
/// expr and metric variables.
pub(crate) fn web_failover(switch: SwitchPolicy) -> Config {
    use rules::engine::Action;
    Config {
        agent: Agent::default(),
        fleet: None,
        conntrack: Conntrack::default(),
        announce: None,
        hooks: Vec::new(),
        vips: vec![],
        services: vec![
            service("web", 80, Target::Decide("web-failover".into())),
            service("web2", 81, Target::Decide("web-failover".into())),
            service("static", 82, Target::Pool("dc2".into())),
        ],
        pools: vec![
            pool("dc1", &["198.18.1.11", "198.18.1.12"]),
            pool("dc2", &["198.18.2.11", "198.18.2.12"]),
        ],
        state: vec![
            var(
                "dc1_api_healthy",
                StateSource::Probe(StateProbe {
                    address: Some("198.18.1.11".parse().expect("address")),
                    check: check(),
                }),
            ),
            var(
                "dc2_ready",
                StateSource::Expr("pool.dc2.healthy_count >= 1".into()),
            ),
            var(
                "dc1_capacity_ok",
                StateSource::Expr("pool.dc1.healthy_ratio >= 0.5".into()),
            ),
            var(
                "dc1_ok",
                StateSource::Expr(
                    "dc1_api_healthy AND dc1_capacity_ok AND NOT maintenance_mode".into(),
                ),
            ),
            var(
                "maintenance_mode",
                StateSource::Push(PushValue::Bool(false)),
            ),
            var(
                "automation_enabled",
                StateSource::Push(PushValue::Bool(true)),
            ),
            var("region", StateSource::Push(PushValue::String("eu".into()))),
            var(
                "web_flood",
                StateSource::Metric(MetricSpec {
                    of: "service.web.packets_per_second".into(),
                    above: 500.0,
                    below: 200.0,
                    hold: Duration::from_secs(5),
                }),
            ),
        ],
        decisions: vec![DecisionGroup {
            name: "web-failover".into(),
            rules: vec![
                DecisionRule {
                    id: "dc1-primary".into(),
                    priority: 100,
                    when: "dc1_ok".into(),
                    then: Action::pool("dc1"),
                },
                DecisionRule {
                    id: "failover-dc2".into(),
                    priority: 90,
                    when: "NOT dc1_ok AND dc2_ready".into(),
                    then: Action::pool("dc2"),
                },
            ],
            default: Some(Action::pool("dc1")),
            switch,
            require: Some("target.healthy_count >= 1".into()),
            automatic: Some("automation_enabled".into()),
            on_failback: crate::config::FlowPolicy::Keep,
            canary: None,
            split_by: crate::config::SplitBy::Flow,
        }],
        classes: Vec::new(),
        rules: std::sync::Arc::default(),
    }
    .compiled()
    .expect("rules")
}

/// The store of `cfg` over a health table with every backend up.
fn store(cfg: &Config) -> Store {
    let mut health = Health::new();
    health.configure(cfg);
    Store::new(cfg, &health)
}

fn slot(s: &Store, name: &str) -> Slot {
    s.schema().get(name).expect("name").0
}

#[test]
fn starts_with_defaults_builtins_and_derived_values() {
    let s = store(&web_failover(SwitchPolicy::default()));
    assert_eq!(s.get("maintenance_mode"), Some(&Value::Bool(false)));
    assert_eq!(s.get("region"), Some(&Value::String("eu".into())));
    assert_eq!(s.get("pool.dc1.healthy_count"), Some(&Value::Number(2.0)));
    assert_eq!(s.get("dc2_ready"), Some(&Value::Bool(true)));
    // Probe variables start healthy, as backends do (so `NOT probe` does not fail a group
    // over at every start); metric variables start below their threshold.
    assert_eq!(s.get("dc1_api_healthy"), Some(&Value::Bool(true)));
    assert_eq!(s.get("dc1_ok"), Some(&Value::Bool(true)));
    assert_eq!(s.get("web_flood"), Some(&Value::Bool(false)));
}

#[test]
fn set_is_typed_push_only_and_reports_only_real_changes() {
    let mut s = store(&web_failover(SwitchPolicy::default()));
    s.set_probe("dc1_api_healthy", true);
    let changed = s.set_push("maintenance_mode", "true").expect("set");
    assert_eq!(
        changed,
        vec![slot(&s, "maintenance_mode"), slot(&s, "dc1_ok")]
    );
    assert_eq!(s.set_push("maintenance_mode", "true"), Ok(vec![]));
    assert!(matches!(
        s.set_push("maintenance_mode", "yes"),
        Err(StateError::WrongType { .. })
    ));
    assert_eq!(
        s.set_push("maintenance_mode", "True")
            .unwrap_err()
            .to_string(),
        "maintenance_mode is a bool; \"True\" is not a bool (true or false; TRUE and FALSE as \
         in rules)"
    );
    assert!(matches!(
        s.set_push("dc1_api_healthy", "false"),
        Err(StateError::NotPush { kind: "probe", .. })
    ));
    assert!(matches!(
        s.set_push("dc2_ready", "false"),
        Err(StateError::NotPush { kind: "expr", .. })
    ));
    assert!(matches!(
        s.set_push("pool.dc1.healthy", "false"),
        Err(StateError::NotPush { .. })
    ));
    let e = s.set_push("maintenance_mod", "true").expect_err("unknown");
    assert!(
        e.to_string().contains("did you mean \"maintenance_mode\""),
        "{e}"
    );
    assert_eq!(s.get("maintenance_mode"), Some(&Value::Bool(true)));
    s.set_push("region", "\"us\"").expect("string");
    assert_eq!(s.get("region"), Some(&Value::String("us".into())));
}

#[test]
fn backend_health_drives_pool_builtins_and_derived_variables_in_order() {
    let mut s = store(&web_failover(SwitchPolicy::default()));
    s.set_probe("dc1_api_healthy", true);
    assert_eq!(s.get("dc1_ok"), Some(&Value::Bool(true)));
    let a = "198.18.1.11".parse().expect("a");
    let b = "198.18.1.12".parse().expect("b");
    let mut health = Health::new();
    health.configure(&web_failover(SwitchPolicy::default()));
    let mut set = |s: &mut Store, address, healthy| {
        health.set_check("dc1", address, healthy);
        s.refresh_health(&health, &["dc1".to_owned()])
    };
    let changed = set(&mut s, a, false);
    assert!(changed.contains(&slot(&s, "pool.dc1.healthy_ratio")));
    assert!(changed.contains(&slot(&s, "backend.198.18.1.11.healthy")));
    // 1/2 is still >= 0.5: the derived variables did not change.
    assert!(!changed.contains(&slot(&s, "dc1_capacity_ok")));
    let changed = set(&mut s, b, false);
    assert!(changed.contains(&slot(&s, "dc1_capacity_ok")));
    assert!(changed.contains(&slot(&s, "dc1_ok")));
    assert_eq!(s.get("pool.dc1.healthy"), Some(&Value::Bool(false)));
    assert_eq!(set(&mut s, b, false), vec![]);
}

#[test]
fn rtt_p99_over_a_window_and_metric_hysteresis_over_rates() {
    let mut s = store(&web_failover(SwitchPolicy::default()));
    let a = "198.18.2.11".parse().expect("a");
    for ms in 1..=100u64 {
        s.record_rtt(a, Duration::from_millis(ms));
    }
    // The window keeps the last 64 (37..=100): p99 is 100.
    assert_eq!(
        s.get("backend.198.18.2.11.rtt_p99_ms"),
        Some(&Value::Number(100.0))
    );
    let rates = |r: f64| HashMap::from([("service.web.packets_per_second".to_owned(), r)]);
    let t = Duration::from_secs;
    s.observe_rates(t(0), &rates(600.0));
    assert_eq!(s.get("web_flood"), Some(&Value::Bool(false)));
    let changed = s.observe_rates(t(5), &rates(600.0));
    assert!(changed.contains(&slot(&s, "web_flood")));
    assert_eq!(
        s.get("service.web.packets_per_second"),
        Some(&Value::Number(600.0))
    );
}

#[test]
fn hypothetical_changes_nothing_and_recomputes_derived_values() {
    let s = store(&web_failover(SwitchPolicy::default()));
    let h = s
        .hypothetical(&[("dc1_api_healthy".into(), "false".into())])
        .expect("what-if");
    assert_eq!(h.get(slot(&s, "dc1_ok")), &Value::Bool(false));
    assert_eq!(s.get("dc1_ok"), Some(&Value::Bool(true)));
    assert!(s.hypothetical(&[("nope".into(), "1".into())]).is_err());
}
