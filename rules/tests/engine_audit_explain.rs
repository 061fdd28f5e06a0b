//! Audit records (fields, ring, JSON lines) and explanations.

mod engine_support;

use engine_support::{Harness, ms, pool, reference_policy, three_rules};
use rules::engine::{
    Action, AuditKind, AuditLog, AuditRecord, By, OverrideRequest, RuleStatus, SwitchKind, Wait,
};

/// A switch record made by a real evaluation: dc1 → dc2 by `secondary` at 10.050 s.
fn switch_record() -> AuditRecord {
    let mut h = Harness::new(three_rules(reference_policy()));
    h.truths(&[true, true, true]);
    h.at(0);
    h.truths(&[false, true, true]);
    h.at(10_000);
    let d = h.at(10_050);
    d.audit.into_iter().next().expect("one record")
}

#[test]
fn a_switch_record_has_time_group_from_to_rule_and_cause() {
    let r = switch_record();
    assert_eq!(r.at, ms(10_050));
    assert_eq!(r.group, "web-failover");
    assert_eq!(r.kind, AuditKind::Switch);
    assert_eq!(r.switch, Some(SwitchKind::Failover));
    assert_eq!(r.from, Some(pool("dc1")));
    assert_eq!(r.to, Some(pool("dc2")));
    assert_eq!(r.by, Some(By::Rule("secondary".into())));
    assert_eq!(r.cause, "test");
    assert_eq!(r.latency_us, None);
}

#[test]
fn the_ring_keeps_the_newest_records_up_to_its_capacity() {
    let mut log = AuditLog::new(2);
    let seqs: Vec<u64> = (0..3).map(|_| log.push(switch_record())).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!((log.len(), log.capacity(), log.evicted()), (2, 2, 1));
    assert!(log.get(1).is_none());
    let held: Vec<u64> = log.iter().map(|r| r.seq).collect();
    assert_eq!(held, [2, 3]);
    let mut none = AuditLog::new(0);
    assert_eq!(none.push(switch_record()), 1);
    assert!(none.is_empty());
}

#[test]
fn the_caller_fills_the_latency_and_values_later() {
    let mut log = AuditLog::new(8);
    let seq = log.push(switch_record());
    assert!(log.set_latency(seq, 42));
    log.get_mut(seq)
        .expect("held")
        .values
        .insert("dc1_api_healthy".into(), "false".into());
    assert!(!log.set_latency(seq + 1, 7));
    let r = log.get(seq).expect("held");
    assert_eq!(r.latency_us, Some(42));
    assert_eq!(r.values["dc1_api_healthy"], "false");
}

#[test]
fn a_record_is_one_json_line_and_reads_back() {
    let mut r = switch_record();
    r.seq = 7;
    r.latency_us = Some(31);
    r.to = Some(Action::Split(vec![
        ("dc2".into(), 95),
        ("dc2-canary".into(), 5),
    ]));
    let line = r.to_json_line().expect("serializes");
    assert!(!line.contains('\n'));
    let json: serde_json::Value = serde_json::from_str(&line).expect("json");
    assert_eq!(json["at_us"], 10_050_000);
    assert_eq!(json["kind"], "switch");
    assert_eq!(json["switch"], "failover");
    assert_eq!(json["from"], serde_json::json!({"pool": "dc1"}));
    assert_eq!(
        json["to"],
        serde_json::json!({"split": [["dc2", 95], ["dc2-canary", 5]]})
    );
    assert_eq!(json["by"], serde_json::json!({"rule": "secondary"}));
    assert_eq!(json["latency_us"], 31);
    assert_eq!(AuditRecord::from_json_line(&line).expect("reads back"), r);
}

#[test]
fn explain_shows_each_rule_its_truth_the_winner_and_the_pending_failback() {
    let mut h = Harness::new(three_rules(reference_policy()));
    h.truths(&[true, true, true]);
    h.at(0);
    h.truths(&[false, true, true]);
    h.at(10_000);
    h.at(10_050);
    h.truths(&[true, true, false]);
    h.at(20_000);
    let e = h.group.explain(&h.input(21_000)).expect("explain");
    let rows: Vec<_> = e
        .rules
        .iter()
        .map(|r| (r.id.as_str(), r.truth, r.winner))
        .collect();
    assert_eq!(
        rows,
        [
            ("primary", true, true),
            ("secondary", true, false),
            ("tertiary", false, false)
        ]
    );
    assert_eq!(
        e.rules[0].status,
        RuleStatus::Waiting(Wait::Failback { until: ms(50_000) })
    );
    assert_eq!(
        e.rules[1].status,
        RuleStatus::Shadowed {
            by: By::Rule("primary".into())
        }
    );
    assert_eq!(e.rules[2].status, RuleStatus::False);
    assert_eq!(e.active.as_ref().expect("active").action, pool("dc2"));
    assert_eq!(e.next_deadline, Some(ms(50_000)));
    let text = e.to_string();
    assert!(text.contains("failback pending until 50.000s"), "{text}");
    let json = serde_json::to_value(&e).expect("json");
    assert_eq!(json["rules"][0]["status"], "waiting");
    assert_eq!(json["rules"][0]["wait"], "failback");
    assert_eq!(json["rules"][0]["until_us"], 50_000_000);
}

#[test]
fn explain_shows_vetoes_freezes_and_overrides() {
    let mut h = Harness::new(three_rules(reference_policy()));
    h.truths(&[true, true, false]);
    h.at(0);
    h.facts = h.facts.clone().veto(pool("dc1"));
    h.automatic = false;
    let e = h.group.explain(&h.input(1_000)).expect("explain");
    assert_eq!(e.rules[0].status, RuleStatus::Vetoed);
    assert_eq!(e.rules[1].status, RuleStatus::Waiting(Wait::Frozen));
    assert!(e.to_string().contains("frozen"));

    h.automatic = true;
    h.set_override(
        2_000,
        OverrideRequest::new(pool("dc3"), "drill").ttl(ms(60_000)),
    )
    .expect("set");
    let e = h.group.explain(&h.input(3_000)).expect("explain");
    let until = Some(ms(62_000));
    assert_eq!(
        e.rules[1].status,
        RuleStatus::Waiting(Wait::Overridden { until })
    );
    assert_eq!(e.overriding.as_ref().expect("override").reason, "drill");
    assert!(
        e.to_string()
            .contains("override pool=dc3 until 62.000s: \"drill\"")
    );
}

#[test]
fn explain_changes_nothing() {
    let mut h = Harness::new(three_rules(reference_policy()));
    h.truths(&[false, true, false]);
    h.at(0);
    h.truths(&[false, false, true]);
    h.at(10_000);
    let before = h.group.clone();
    // At 20 s the pending switch is due: explain shows it done, the group stays as it was.
    let e = h.group.explain(&h.input(20_000)).expect("explain");
    assert_eq!(e.active.expect("active").action, pool("dc3"));
    assert_eq!(h.group, before);
    let d = h.group.what_if(&h.input(20_000)).expect("what-if");
    assert!(d.switched.is_some());
    assert_eq!(h.group, before);
}

#[test]
fn explain_reports_the_default_and_no_match() {
    let mut config = three_rules(reference_policy());
    config.default = Some(pool("dr"));
    let mut h = Harness::new(config);
    h.at(0);
    let e = h.group.explain(&h.input(10)).expect("explain");
    let default = e.default.expect("default");
    assert!(default.winner);
    assert_eq!(default.status, RuleStatus::Active);

    let mut h = Harness::new(three_rules(reference_policy()));
    let e = h.group.explain(&h.input(0)).expect("explain");
    assert!(e.no_match);
    assert!(e.to_string().contains("no rule matches"));
    h.at(0);
}
