//! The switching policy with an injected clock: adoption, `stable_for`, cooldown, the emergency
//! exit, failback, require vetoes, the automatic gate, no match, relabelling and resume.

mod engine_support;

use engine_support::{Harness, ms, pool, reference_policy, rule, three_rules};
use rules::engine::{
    Action, AuditKind, By, EngineError, Group, GroupConfig, Input, SwitchKind, SwitchPolicy, Wait,
};

/// Primary active since 0 ms, with the last switch long enough ago that cooldown is over.
fn settled_on_primary() -> Harness {
    let mut h = Harness::new(three_rules(reference_policy()));
    h.truths(&[true, true, true]);
    h.at(0);
    h
}

#[test]
fn first_evaluation_adopts_the_candidate_at_once() {
    let mut h = Harness::new(three_rules(reference_policy()));
    h.truths(&[false, true, true]);
    let d = h.at(0);
    let switch = d.switched.expect("adopted");
    assert_eq!(switch.kind, SwitchKind::Adopt);
    assert_eq!(switch.from, None);
    assert_eq!(switch.to, pool("dc2"));
    assert_eq!(switch.by, By::Rule("secondary".into()));
    assert_eq!(d.next_deadline, None);
    assert_eq!(d.audit.len(), 1);
}

#[test]
fn a_flap_shorter_than_stable_for_never_switches() {
    let mut h = settled_on_primary();
    h.truths(&[false, true, true]);
    let d = h.at(10_000);
    assert_eq!(d.wait, Some(Wait::StableFor { until: ms(10_050) }));
    assert_eq!(d.next_deadline, Some(ms(10_050)));
    h.truths(&[true, true, true]);
    let d = h.at(10_049);
    assert_eq!(d.wait, None);
    assert_eq!(d.next_deadline, None);
    // The stale timer fires anyway: nothing happens.
    let d = h.at(10_050);
    assert!(d.switched.is_none());
    // A second flap starts its own clock from zero.
    h.truths(&[false, true, true]);
    assert!(h.at(10_060).switched.is_none());
    assert!(h.at(10_109).switched.is_none());
    assert_eq!(h.active(), pool("dc1"));
}

#[test]
fn a_candidate_that_holds_for_stable_for_switches_at_the_deadline() {
    let mut h = settled_on_primary();
    h.truths(&[false, true, true]);
    assert!(h.at(10_000).switched.is_none());
    assert!(h.at(10_049).switched.is_none());
    let d = h.at(10_050);
    let switch = d.switched.expect("switched");
    assert_eq!(switch.kind, SwitchKind::Failover);
    assert_eq!(switch.from, Some(pool("dc1")));
    assert_eq!(switch.to, pool("dc2"));
    assert_eq!(switch.cause, "test");
    assert_eq!(d.next_deadline, None);
}

#[test]
fn changing_candidate_restarts_the_stable_for_clock() {
    let mut h = settled_on_primary();
    h.truths(&[false, true, true]);
    h.at(10_000);
    h.truths(&[false, false, true]);
    let d = h.at(10_040);
    assert_eq!(d.wait, Some(Wait::StableFor { until: ms(10_090) }));
    assert!(h.at(10_050).switched.is_none());
    assert_eq!(h.at(10_090).switched.expect("switched").to, pool("dc3"));
}

#[test]
fn cooldown_holds_a_second_switch_until_it_ends() {
    let mut h = settled_on_primary();
    h.truths(&[false, true, true]);
    h.at(10_000);
    assert!(h.at(10_050).switched.is_some());
    h.truths(&[false, false, true]);
    // stable_for would be over at 10.150 s; the cooldown, later, is what holds the switch.
    let d = h.at(10_100);
    assert_eq!(d.wait, Some(Wait::Cooldown { until: ms(13_050) }));
    let d = h.at(10_150);
    assert!(d.switched.is_none());
    assert_eq!(d.wait, Some(Wait::Cooldown { until: ms(13_050) }));
    assert_eq!(d.next_deadline, Some(ms(13_050)));
    assert!(h.at(13_049).switched.is_none());
    let d = h.at(13_050);
    assert_eq!(d.switched.expect("switched after cooldown").to, pool("dc3"));
}

#[test]
fn a_pool_with_no_healthy_backend_is_left_at_once_even_in_cooldown() {
    let mut h = settled_on_primary();
    h.truths(&[false, true, true]);
    h.at(10_000);
    assert!(h.at(10_050).switched.is_some());
    // dc2 dies 10 ms after the switch: cooldown runs until 13.050 s and dc3 is brand new.
    h.facts = h.facts.clone().dead("dc2");
    h.truths(&[false, false, true]);
    let d = h.at(10_060);
    let switch = d.switched.expect("left at once");
    assert_eq!(switch.kind, SwitchKind::Emergency);
    assert_eq!((switch.from, switch.to), (Some(pool("dc2")), pool("dc3")));
}

#[test]
fn the_emergency_exit_skips_failback_after_too() {
    let mut h = settled_on_primary();
    h.truths(&[false, true, true]);
    h.at(10_000);
    h.at(10_050);
    // dc2 dies; the candidate is the higher-ranked primary again.
    h.facts = h.facts.clone().dead("dc2");
    h.truths(&[true, false, false]);
    let switch = h.at(10_070).switched.expect("left at once");
    assert_eq!(switch.kind, SwitchKind::Emergency);
    assert_eq!(switch.to, pool("dc1"));
}

#[test]
fn moving_from_a_dead_target_to_a_dead_target_follows_the_policy() {
    let mut h = settled_on_primary();
    h.facts = h.facts.clone().dead("dc1").dead("dc2");
    h.truths(&[false, true, true]);
    let d = h.at(10_000);
    assert!(d.switched.is_none());
    assert_eq!(d.wait, Some(Wait::StableFor { until: ms(10_050) }));
}

#[test]
fn a_split_is_dead_when_a_weighted_pool_is_dead_but_not_a_zero_weight_one() {
    let split = Action::Split(vec![("dc1".into(), 95), ("canary".into(), 5)]);
    let drained = Action::Split(vec![("dc1".into(), 100), ("canary".into(), 0)]);
    let facts = rules::engine::FixedFacts::new().dead("canary");
    assert!(!split.is_alive(&facts));
    assert!(drained.is_alive(&facts));
    assert_eq!(split.to_string(), "split=dc1:95,canary:5");
}

#[test]
fn failback_waits_failback_after() {
    let mut h = settled_on_primary();
    h.truths(&[false, true, true]);
    h.at(10_000);
    h.at(10_050);
    h.truths(&[true, true, true]);
    let d = h.at(20_000);
    assert_eq!(d.wait, Some(Wait::Failback { until: ms(50_000) }));
    assert_eq!(d.next_deadline, Some(ms(50_000)));
    assert!(h.at(49_999).switched.is_none());
    let switch = h.at(50_000).switched.expect("failed back");
    assert_eq!(switch.kind, SwitchKind::Failback);
    assert_eq!(switch.to, pool("dc1"));
}

#[test]
fn a_flap_during_the_failback_wait_restarts_it() {
    let mut h = settled_on_primary();
    h.truths(&[false, true, true]);
    h.at(10_000);
    h.at(10_050);
    h.truths(&[true, true, true]);
    h.at(20_000);
    h.truths(&[false, true, true]);
    assert_eq!(h.at(45_000).wait, None);
    h.truths(&[true, true, true]);
    let d = h.at(45_001);
    assert_eq!(d.wait, Some(Wait::Failback { until: ms(75_001) }));
    assert!(h.at(50_000).switched.is_none());
    assert!(h.at(75_000).switched.is_none());
    assert_eq!(h.at(75_001).switched.expect("failed back").to, pool("dc1"));
}

#[test]
fn leaving_the_default_for_a_rule_is_a_failback() {
    let mut config = three_rules(reference_policy());
    config.default = Some(pool("dr"));
    let mut h = Harness::new(config);
    h.at(0);
    assert_eq!(h.group.active().expect("default").by, By::Default);
    h.truths(&[false, false, true]);
    let d = h.at(10_000);
    assert_eq!(d.wait, Some(Wait::Failback { until: ms(40_000) }));
    assert_eq!(
        h.at(40_000).switched.expect("switch").kind,
        SwitchKind::Failback
    );
}

#[test]
fn require_vetoes_and_the_engine_falls_to_the_next_true_rule() {
    let mut h = settled_on_primary();
    h.facts = h.facts.clone().veto(pool("dc1"));
    let d = h.at(10_000);
    assert_eq!(d.vetoed, vec![By::Rule("primary".into())]);
    let candidate = d.candidate.expect("candidate");
    assert_eq!(
        (candidate.action, candidate.by),
        (pool("dc2"), By::Rule("secondary".into()))
    );
    let vetoes: Vec<_> = d
        .audit
        .iter()
        .filter(|r| r.kind == AuditKind::Veto)
        .collect();
    assert_eq!(vetoes.len(), 1);
    assert_eq!(vetoes[0].to, Some(pool("dc1")));
    assert_eq!(vetoes[0].by, Some(By::Rule("primary".into())));
    // Audited once while the veto lasts; the switch follows the policy.
    let d = h.at(10_050);
    assert!(d.audit.iter().all(|r| r.kind != AuditKind::Veto));
    assert_eq!(d.switched.expect("switched").to, pool("dc2"));
}

#[test]
fn a_vetoed_default_leaves_no_candidate_and_keeps_the_action() {
    let mut config = three_rules(reference_policy());
    config.default = Some(pool("dr"));
    let mut h = Harness::new(config);
    h.truths(&[true, false, false]);
    h.at(0);
    h.truths(&[false, false, false]);
    h.facts = h.facts.clone().veto(pool("dr"));
    let d = h.at(10_000);
    assert!(d.no_match);
    assert_eq!(d.vetoed, vec![By::Default]);
    assert_eq!(d.active.expect("kept").action, pool("dc1"));
}

#[test]
fn the_gate_freezes_automatic_switching_and_audits_it_once() {
    let mut h = settled_on_primary();
    h.automatic = false;
    h.truths(&[false, true, true]);
    let d = h.at(10_000);
    assert_eq!(d.wait, Some(Wait::Frozen));
    // The deadline brings the engine back to audit the freeze when the switch would be due.
    assert_eq!(d.next_deadline, Some(ms(10_050)));
    let d = h.at(10_050);
    assert!(d.switched.is_none());
    assert_eq!(d.next_deadline, None);
    assert_eq!(d.audit.len(), 1);
    assert_eq!(d.audit[0].kind, AuditKind::Freeze);
    assert_eq!(d.audit[0].to, Some(pool("dc2")));
    assert!(h.at(60_000).audit.is_empty());
    assert_eq!(h.active(), pool("dc1"));
}

#[test]
fn the_gate_blocks_the_emergency_exit_too() {
    let mut h = settled_on_primary();
    h.automatic = false;
    h.facts = h.facts.clone().dead("dc1");
    h.truths(&[false, true, true]);
    let d = h.at(10_000);
    assert!(d.switched.is_none());
    assert_eq!(d.wait, Some(Wait::Frozen));
    assert_eq!(d.audit[0].kind, AuditKind::Freeze);
    assert_eq!(h.active(), pool("dc1"));
}

#[test]
fn a_candidate_that_held_during_a_freeze_switches_when_the_gate_opens() {
    let mut h = settled_on_primary();
    h.automatic = false;
    h.truths(&[false, true, true]);
    h.at(10_000);
    h.automatic = true;
    let switch = h.at(20_000).switched.expect("switched");
    assert_eq!(switch.to, pool("dc2"));
}

#[test]
fn no_true_rule_and_no_default_keeps_the_current_action() {
    let mut h = settled_on_primary();
    h.truths(&[false, false, false]);
    let d = h.at(10_000);
    assert!(d.no_match);
    assert!(d.switched.is_none());
    assert_eq!(d.candidate, None);
    let active = d.active.expect("kept");
    assert_eq!(
        (active.action, active.by),
        (pool("dc1"), By::Rule("primary".into()))
    );
}

#[test]
fn no_true_rule_at_start_publishes_nothing() {
    let mut h = Harness::new(three_rules(reference_policy()));
    let d = h.at(0);
    assert!(d.no_match);
    assert_eq!(d.active, None);
}

#[test]
fn the_same_action_from_another_rule_is_relabelled_without_a_switch() {
    let mut config = three_rules(reference_policy());
    config.rules[2].action = pool("dc1");
    let mut h = Harness::new(config);
    h.truths(&[true, true, true]);
    h.at(0);
    h.truths(&[false, false, true]);
    let d = h.at(10_000);
    assert!(d.switched.is_none());
    assert_eq!(d.active.expect("active").by, By::Rule("tertiary".into()));
}

#[test]
fn higher_priority_first_then_declaration_order() {
    let config = GroupConfig {
        name: "g".into(),
        rules: vec![
            rule("low", 1, pool("a")),
            rule("high-first", 5, pool("b")),
            rule("high-second", 5, pool("c")),
        ],
        default: None,
        policy: SwitchPolicy::default(),
        canary: None,
    };
    let group = Group::new(config.clone()).expect("valid");
    let ids: Vec<_> = group.rules_in_order().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["high-first", "high-second", "low"]);
    let mut h = Harness::new(config);
    h.truths(&[true, true, true]);
    assert_eq!(h.at(0).switched.expect("adopt").to, pool("b"));
}

#[test]
fn resume_keeps_the_previous_action_until_a_candidate_holds() {
    let config = three_rules(reference_policy());
    let group = Group::resume(config, pool("dc2"), ms(0)).expect("valid");
    let mut h = Harness::new(three_rules(reference_policy()));
    h.group = group;
    h.truths(&[true, true, true]);
    let d = h.at(0);
    assert!(d.switched.is_none());
    assert_eq!(d.wait, Some(Wait::StableFor { until: ms(50) }));
    assert_eq!(h.at(50).switched.expect("resumed").kind, SwitchKind::Resume);
}

#[test]
fn a_wrong_truth_count_is_an_error_and_changes_nothing() {
    let mut h = settled_on_primary();
    let before = h.group.clone();
    let facts = h.facts.clone();
    let err = h
        .group
        .evaluate(&Input::new(ms(5), &[true], &facts))
        .unwrap_err();
    assert_eq!(
        err,
        EngineError::TruthCount {
            group: "web-failover".into(),
            expected: 3,
            got: 1
        }
    );
    assert_eq!(h.group, before);
}

#[test]
fn malformed_groups_are_rejected() {
    let base = three_rules(SwitchPolicy::default());
    let mut dup = base.clone();
    dup.rules[1].id = "primary".into();
    assert!(matches!(
        Group::new(dup),
        Err(EngineError::DuplicateRuleId { .. })
    ));
    let mut empty_split = base.clone();
    empty_split.rules[0].action = Action::Split(vec![]);
    assert!(matches!(
        Group::new(empty_split),
        Err(EngineError::InvalidAction { .. })
    ));
    let mut zero = base.clone();
    zero.default = Some(Action::Split(vec![("a".into(), 0), ("b".into(), 0)]));
    assert!(matches!(
        Group::new(zero),
        Err(EngineError::InvalidAction { .. })
    ));
    let mut twice = base.clone();
    twice.rules[0].action = Action::Split(vec![("a".into(), 1), ("a".into(), 2)]);
    assert!(matches!(
        Group::new(twice),
        Err(EngineError::InvalidAction { .. })
    ));
    let mut nothing = base;
    nothing.rules.clear();
    assert!(matches!(
        Group::new(nothing),
        Err(EngineError::NothingToDecide { .. })
    ));
}

#[test]
fn a_followed_action_keeps_its_rank_and_the_cooldown_from_its_switch() {
    let mut h = Harness::new(three_rules(reference_policy()));
    h.truths(&[true, true, true]);
    // Another evaluator (a fleet's leader) switched to dc1 by `primary` at 1 s.
    h.group
        .follow(
            pool("dc1"),
            By::Rule("primary".into()),
            Some(ms(1_000)),
            ms(1_000),
        )
        .expect("valid");
    assert_eq!(h.active(), pool("dc1"));
    assert!(h.at(1_000).switched.is_none(), "the followed action holds");
    // The secondary holds past stable_for, but the cooldown counts from the leader's switch.
    h.truths(&[false, true, true]);
    assert!(h.at(1_010).switched.is_none());
    assert!(h.at(1_100).switched.is_none(), "cooldown until 4 s");
    let d = h.at(4_000);
    assert_eq!(d.switched.expect("after the cooldown").to, pool("dc2"));
}

#[test]
fn following_keeps_an_override_in_force() {
    let mut h = settled_on_primary();
    h.set_override(10, rules::engine::OverrideRequest::new(pool("dc3"), "test"))
        .expect("override");
    h.group
        .follow(pool("dc3"), By::Override, Some(ms(10)), ms(20))
        .expect("valid");
    assert!(h.group.current_override().is_some());
    assert!(h.at(30).switched.is_none());
    assert_eq!(h.active(), pool("dc3"));
}
