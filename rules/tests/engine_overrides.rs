//! Manual overrides with an injected clock: they win at once, need a reason, expire at their
//! TTL, respect `require` unless forced, and hand control back on clear.

mod engine_support;

use engine_support::{Harness, ms, pool, reference_policy, three_rules};
use rules::engine::{AuditKind, By, EngineError, OverrideRequest, SwitchKind, Wait};

/// Primary (dc1) active since 0 ms.
fn on_primary() -> Harness {
    let mut h = Harness::new(three_rules(reference_policy()));
    h.truths(&[true, true, true]);
    h.at(0);
    h
}

#[test]
fn an_override_wins_over_every_rule_at_once_even_in_cooldown_and_frozen() {
    let mut h = on_primary();
    h.automatic = false;
    let d = h
        .set_override(10, OverrideRequest::new(pool("dc3"), "drain dc1"))
        .expect("set");
    let switch = d.switched.expect("switched at once");
    assert_eq!(switch.kind, SwitchKind::Override);
    assert_eq!((switch.from, switch.to), (Some(pool("dc1")), pool("dc3")));
    assert_eq!(switch.by, By::Override);
    assert_eq!(d.wait, Some(Wait::Overridden { until: None }));
    let kinds: Vec<_> = d.audit.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [AuditKind::OverrideSet, AuditKind::Switch]);
    assert_eq!(d.audit[0].reason.as_deref(), Some("drain dc1"));
    // Rules changing do not move it.
    h.automatic = true;
    h.truths(&[false, true, false]);
    assert!(h.at(60_000).switched.is_none());
    assert_eq!(h.active(), pool("dc3"));
}

#[test]
fn an_override_requires_a_reason_and_nothing_changes_without_one() {
    let mut h = on_primary();
    let before = h.group.clone();
    for reason in ["", "   "] {
        let err = h
            .set_override(10, OverrideRequest::new(pool("dc2"), reason))
            .unwrap_err();
        assert_eq!(
            err,
            EngineError::MissingReason {
                group: "web-failover".into()
            }
        );
    }
    assert_eq!(h.group, before);
}

#[test]
fn an_override_expires_at_its_ttl() {
    let mut h = on_primary();
    let request = OverrideRequest::new(pool("dc2"), "test dc2").ttl(ms(600_000));
    let d = h.set_override(1_000, request).expect("set");
    assert_eq!(d.next_deadline, Some(ms(601_000)));
    assert_eq!(
        d.wait,
        Some(Wait::Overridden {
            until: Some(ms(601_000))
        })
    );
    let o = h.group.current_override().expect("in force");
    assert_eq!(o.expires_at, Some(ms(601_000)));
    assert!(h.at(600_999).switched.is_none());
    assert_eq!(h.active(), pool("dc2"));
    let d = h.at(601_000);
    let kinds: Vec<_> = d.audit.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [AuditKind::OverrideExpired, AuditKind::Switch]);
    // The primary held all along: the return is immediate, with no cooldown or failback.
    let switch = d.switched.expect("returned to the rules");
    assert_eq!(switch.kind, SwitchKind::Resume);
    assert_eq!(switch.to, pool("dc1"));
    assert!(h.group.current_override().is_none());
}

#[test]
fn an_override_to_a_target_failing_require_is_refused_without_force() {
    let mut h = on_primary();
    h.facts = h.facts.clone().veto(pool("dc2"));
    let before = h.group.clone();
    let err = h
        .set_override(10, OverrideRequest::new(pool("dc2"), "try dc2"))
        .unwrap_err();
    assert_eq!(
        err,
        EngineError::OverrideVetoed {
            group: "web-failover".into(),
            target: pool("dc2")
        }
    );
    assert_eq!(h.group, before);
    let d = h
        .set_override(10, OverrideRequest::new(pool("dc2"), "try dc2").force())
        .expect("forced");
    assert_eq!(d.active.expect("active").action, pool("dc2"));
    assert!(h.group.current_override().expect("in force").forced);
}

#[test]
fn zero_ttl_and_malformed_actions_are_refused() {
    let mut h = on_primary();
    let zero = OverrideRequest::new(pool("dc2"), "r").ttl(ms(0));
    assert!(matches!(
        h.set_override(10, zero),
        Err(EngineError::ZeroTtl { .. })
    ));
    let bad = OverrideRequest::new(pool(""), "r");
    assert!(matches!(
        h.set_override(10, bad),
        Err(EngineError::InvalidAction { .. })
    ));
    assert!(h.group.current_override().is_none());
}

#[test]
fn clearing_hands_control_back_after_stable_for_only() {
    let mut h = on_primary();
    h.set_override(10_000, OverrideRequest::new(pool("dc2"), "r"))
        .expect("set");
    // The tertiary becomes the candidate just before the clear: it must hold for stable_for,
    // but neither cooldown (the override switched 10 ms ago) nor failback applies.
    h.truths(&[false, false, true]);
    h.at(10_000);
    let d = h.clear_override(10_010).expect("cleared");
    assert_eq!(d.audit[0].kind, AuditKind::OverrideCleared);
    assert_eq!(d.active.clone().expect("kept").by, By::Kept);
    assert_eq!(d.wait, Some(Wait::StableFor { until: ms(10_050) }));
    let switch = h.at(10_050).switched.expect("resumed");
    assert_eq!((switch.kind, switch.to), (SwitchKind::Resume, pool("dc3")));
}

#[test]
fn clearing_while_frozen_keeps_the_override_action() {
    let mut h = on_primary();
    h.set_override(10, OverrideRequest::new(pool("dc2"), "r"))
        .expect("set");
    h.automatic = false;
    let d = h.clear_override(20_000).expect("cleared");
    assert!(d.switched.is_none());
    assert_eq!(d.wait, Some(Wait::Frozen));
    assert_eq!(h.active(), pool("dc2"));
}

#[test]
fn clearing_without_an_override_is_an_error() {
    let mut h = on_primary();
    let err = h.clear_override(10).unwrap_err();
    assert_eq!(
        err,
        EngineError::NoOverride {
            group: "web-failover".into()
        }
    );
}

#[test]
fn an_override_target_with_no_healthy_backend_is_not_left() {
    let mut h = on_primary();
    h.set_override(10, OverrideRequest::new(pool("dc2"), "r"))
        .expect("set");
    h.facts = h.facts.clone().dead("dc2");
    assert!(h.at(20).switched.is_none());
    assert_eq!(h.active(), pool("dc2"));
}

#[test]
fn an_override_equal_to_the_active_action_switches_nothing() {
    let mut h = on_primary();
    let d = h
        .set_override(10, OverrideRequest::new(pool("dc1"), "pin dc1"))
        .expect("set");
    assert!(d.switched.is_none());
    assert_eq!(d.active.expect("active").by, By::Override);
    assert_eq!(d.audit.len(), 1);
}
