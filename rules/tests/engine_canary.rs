//! The canary ramp of a decision group, with an injected clock (milliseconds since zero): steps
//! on schedule and not before `hold`, a rollback within the evaluation that sees
//! `rollback_when` true, pause, resume and abort, how it composes with rules, overrides and the
//! gate, and a ramp carried over to a group built again.

use std::time::Duration;

use rules::engine::{
    Action, AuditKind, By, Canary, CanaryOp, Decision, EngineError, FixedFacts, Group, GroupConfig,
    Input, OverrideRequest, RampPhase, Rule, SwitchKind, SwitchPolicy,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn pool(name: &str) -> Action {
    Action::pool(name)
}

fn split(a: &str, wa: u32, b: &str, wb: u32) -> Action {
    Action::Split(vec![(a.into(), wa), (b.into(), wb)])
}

/// `stable` while `primary` is true, `other` while `secondary` is, ramping onto `canary` by
/// 5, 25, 50 and 100 % with a hold of 10 s.
fn config() -> GroupConfig {
    let rule = |id: &str, priority, action| Rule {
        id: id.into(),
        priority,
        action,
    };
    GroupConfig {
        name: "web".into(),
        rules: vec![
            rule("primary", 100, pool("stable")),
            rule("secondary", 90, pool("other")),
            rule("canary-itself", 80, pool("canary")),
        ],
        default: None,
        policy: SwitchPolicy::default(),
        canary: Some(Canary {
            pool: "canary".into(),
            steps: vec![500, 2_500, 5_000, 10_000],
            hold: ms(10_000),
            rollback_when: "pool.canary.healthy_ratio < 0.9".into(),
        }),
    }
}

/// A group, its inputs and the clock.
struct Ramp {
    group: Group,
    truths: Vec<bool>,
    facts: FixedFacts,
    automatic: bool,
    rollback: bool,
}

impl Ramp {
    fn new() -> Self {
        Self {
            group: Group::new(config()).expect("valid group"),
            truths: vec![true, false, false],
            facts: FixedFacts::new(),
            automatic: true,
            rollback: false,
        }
    }

    fn input(&self, t: u64, cause: &'static str) -> Input<'_> {
        Input::new(ms(t), &self.truths, &self.facts)
            .automatic(self.automatic)
            .rollback(self.rollback)
            .cause(cause)
    }

    fn set_override(&mut self, t: u64, request: OverrideRequest) -> Decision {
        let input = Input::new(ms(t), &self.truths, &self.facts).cause("override set");
        self.group.set_override(request, &input).expect("override")
    }

    fn clear_override(&mut self, t: u64) -> Decision {
        let input = Input::new(ms(t), &self.truths, &self.facts).cause("override clear");
        self.group.clear_override(&input).expect("clear")
    }

    fn at(&mut self, t: u64) -> Decision {
        let input = Input::new(ms(t), &self.truths, &self.facts)
            .automatic(self.automatic)
            .rollback(self.rollback)
            .cause("timer");
        self.group.evaluate(&input).expect("evaluate")
    }

    fn op(&mut self, t: u64, op: &CanaryOp) -> Result<Decision, EngineError> {
        let input = Input::new(ms(t), &self.truths, &self.facts)
            .automatic(self.automatic)
            .rollback(self.rollback)
            .cause("canary op");
        self.group.canary_op(op, &input)
    }

    fn state(&self) -> RampPhase {
        self.group.canary_status().expect("a ramp").state
    }

    fn published(&self) -> Action {
        self.group.published().expect("published").clone()
    }
}

/// The one switch of `d`, which must be the ramp's.
fn canary_switch(d: &Decision) -> &rules::engine::Switch {
    let s = d.switched.as_ref().expect("a switch");
    assert_eq!(s.kind, SwitchKind::Canary, "{d:#?}");
    s
}

#[test]
fn the_ramp_steps_up_after_each_hold_and_not_before() {
    let mut r = Ramp::new();
    let d = r.at(0);
    let adopt = d.switched.as_ref().expect("adoption");
    assert_eq!(adopt.kind, SwitchKind::Adopt);
    assert_eq!(adopt.to, split("stable", 95, "canary", 5));
    assert_eq!(d.active.as_ref().expect("active").action, pool("stable"));
    assert_eq!(d.next_deadline, Some(ms(10_000)));
    assert_eq!(r.state(), RampPhase::Ramping);

    let d = r.at(9_999);
    assert!(d.switched.is_none(), "a step before its hold: {d:#?}");
    assert_eq!(r.published(), split("stable", 95, "canary", 5));
    assert_eq!(d.next_deadline, Some(ms(10_000)));

    let d = r.at(10_000);
    let s = canary_switch(&d);
    assert_eq!(s.from, Some(split("stable", 95, "canary", 5)));
    assert_eq!(s.to, split("stable", 75, "canary", 25));
    assert_eq!(s.cause, "canary");
    assert_eq!(s.by, By::Rule("primary".into()));
    let record = d.audit.last().expect("a record");
    assert_eq!(record.kind, AuditKind::Switch);
    assert_eq!(record.switch, Some(SwitchKind::Canary));
    assert_eq!(record.cause, "canary");
    assert_eq!(record.values["canary.step"], "2/4");
    assert_eq!(record.values["canary.share"], "25%");
    assert_eq!(d.next_deadline, Some(ms(20_000)));

    let d = r.at(20_000);
    assert_eq!(canary_switch(&d).to, split("stable", 50, "canary", 50));
    let d = r.at(30_000);
    assert_eq!(canary_switch(&d).to, pool("canary"));
    assert_eq!(r.state(), RampPhase::Done);
    assert_eq!(d.next_deadline, None);
    // Done is for good: the rules' choice is still `stable`, published as the canary.
    let d = r.at(90_000);
    assert!(d.switched.is_none());
    assert_eq!(r.published(), pool("canary"));
    assert_eq!(d.active.expect("active").action, pool("stable"));
}

#[test]
fn a_late_evaluation_takes_one_step_and_holds_it_from_then() {
    let mut r = Ramp::new();
    r.at(0);
    let d = r.at(35_000);
    assert_eq!(canary_switch(&d).to, split("stable", 75, "canary", 25));
    assert_eq!(d.next_deadline, Some(ms(45_000)));
}

#[test]
fn rollback_when_drops_the_share_to_zero_in_the_evaluation_that_sees_it_and_stops() {
    let mut r = Ramp::new();
    r.at(0);
    r.at(10_000);
    r.rollback = true;
    let d = r.at(12_000);
    let s = canary_switch(&d);
    assert_eq!(s.from, Some(split("stable", 75, "canary", 25)));
    assert_eq!(s.to, pool("stable"));
    assert_eq!(r.state(), RampPhase::RolledBack);
    let record = d.audit.last().expect("a record");
    assert_eq!(record.values["canary.state"], "rolled_back");
    assert_eq!(record.values["canary.share"], "0%");
    assert_eq!(d.next_deadline, None);
    // Stopped: the condition turning false again and time passing change nothing.
    r.rollback = false;
    for t in [12_001, 22_000, 100_000] {
        let d = r.at(t);
        assert!(d.switched.is_none() && d.audit.is_empty(), "{d:#?}");
    }
    assert_eq!(r.published(), pool("stable"));
    assert_eq!(r.group.canary_share(), 0);
}

#[test]
fn a_rollback_condition_true_from_the_start_never_sends_a_flow_to_the_canary() {
    let mut r = Ramp::new();
    r.rollback = true;
    let d = r.at(0);
    assert_eq!(d.switched.expect("adoption").to, pool("stable"));
    assert_eq!(r.state(), RampPhase::RolledBack);
}

#[test]
fn pause_freezes_the_step_and_its_hold_and_resume_goes_on_with_what_was_left() {
    let mut r = Ramp::new();
    r.at(0);
    let d = r.op(4_000, &CanaryOp::Pause).expect("pause");
    assert!(d.switched.is_none());
    assert_eq!(d.next_deadline, None);
    let record = d.audit.last().expect("a record");
    assert_eq!(record.kind, AuditKind::Canary);
    assert_eq!(record.cause, "canary pause");
    assert_eq!(record.values["canary.state"], "paused");
    let status = r.group.canary_status().expect("ramp");
    assert_eq!(status.hold_left, Some(ms(6_000)));
    assert!(r.at(50_000).switched.is_none(), "a paused ramp stepped");
    assert!(matches!(
        r.op(50_000, &CanaryOp::Pause),
        Err(EngineError::CanaryState { .. })
    ));

    let d = r.op(50_000, &CanaryOp::Resume).expect("resume");
    assert!(d.switched.is_none());
    assert_eq!(d.next_deadline, Some(ms(56_000)));
    assert!(r.at(55_999).switched.is_none());
    assert_eq!(
        canary_switch(&r.at(56_000)).to,
        split("stable", 75, "canary", 25)
    );
    assert!(matches!(
        r.op(56_001, &CanaryOp::Resume),
        Err(EngineError::CanaryState { .. })
    ));
}

#[test]
fn a_paused_ramp_still_rolls_back() {
    let mut r = Ramp::new();
    r.at(0);
    r.op(1_000, &CanaryOp::Pause).expect("pause");
    r.rollback = true;
    assert_eq!(canary_switch(&r.at(2_000)).to, pool("stable"));
    assert_eq!(r.state(), RampPhase::RolledBack);
}

#[test]
fn abort_needs_a_reason_drops_the_share_at_once_and_stops() {
    let mut r = Ramp::new();
    r.at(0);
    r.at(10_000);
    assert!(matches!(
        r.op(11_000, &CanaryOp::Abort("  ".into())),
        Err(EngineError::MissingReason { .. })
    ));
    assert_eq!(
        r.state(),
        RampPhase::Ramping,
        "a refused abort changed the ramp"
    );
    let d = r
        .op(11_000, &CanaryOp::Abort("error budget spent".into()))
        .expect("abort");
    let s = canary_switch(&d);
    assert_eq!(s.to, pool("stable"));
    assert_eq!(s.cause, "canary abort");
    let record = d.audit.last().expect("a record");
    assert_eq!(record.reason.as_deref(), Some("error budget spent"));
    assert_eq!(record.values["canary.state"], "aborted");
    assert_eq!(r.state(), RampPhase::Aborted);
    assert!(r.at(40_000).switched.is_none());
    for op in [
        CanaryOp::Pause,
        CanaryOp::Resume,
        CanaryOp::Abort("again".into()),
    ] {
        assert!(matches!(
            r.op(40_000, &op),
            Err(EngineError::CanaryState { .. })
        ));
    }
}

#[test]
fn a_group_without_a_ramp_refuses_canary_operations() {
    let mut c = config();
    c.canary = None;
    let mut g = Group::new(c).expect("valid");
    let facts = FixedFacts::new();
    let truths = [true, false, false];
    let input = Input::new(ms(0), &truths, &facts);
    assert!(matches!(
        g.canary_op(&CanaryOp::Pause, &input),
        Err(EngineError::NoCanary { .. })
    ));
    assert!(g.canary_status().is_none());
}

#[test]
fn a_malformed_ramp_is_refused() {
    for (steps, hold) in [
        (vec![], 1),
        (vec![0, 500], 1),
        (vec![500, 10_001], 1),
        (vec![2_500, 500], 1),
        (vec![500, 500], 1),
        (vec![500], 0),
    ] {
        let mut c = config();
        c.canary = Some(Canary {
            pool: "canary".into(),
            steps: steps.clone(),
            hold: ms(hold),
            rollback_when: String::new(),
        });
        assert!(
            matches!(Group::new(c), Err(EngineError::InvalidAction { .. })),
            "{steps:?} hold {hold}"
        );
    }
}

#[test]
fn a_rule_that_names_the_canary_pool_is_left_alone_and_a_switch_publishes_at_the_share() {
    let mut r = Ramp::new();
    r.at(0);
    r.at(10_000);
    // The rules move to `other`: the switch publishes it at the ramp's share.
    r.truths = vec![false, true, false];
    let d = r.at(11_000);
    let s = d.switched.as_ref().expect("failover");
    assert_eq!(s.kind, SwitchKind::Failover);
    assert_eq!(s.from, Some(split("stable", 75, "canary", 25)));
    assert_eq!(s.to, split("other", 75, "canary", 25));
    // A rule that routes the canary itself.
    r.truths = vec![false, false, true];
    let d = r.at(12_000);
    assert_eq!(d.switched.expect("failover").to, pool("canary"));
    // The ramp goes on underneath: its step changes nothing published, but it is audited.
    let d = r.at(20_000);
    assert!(d.switched.is_none());
    let record = d.audit.last().expect("a record");
    assert_eq!(record.kind, AuditKind::Canary);
    assert_eq!(record.values["canary.share"], "50%");
}

#[test]
fn a_split_rule_is_left_alone() {
    let c = Canary {
        pool: "canary".into(),
        steps: vec![500],
        hold: ms(1),
        rollback_when: String::new(),
    };
    let s = split("a", 50, "b", 50);
    assert_eq!(c.apply(&s, 2_500), s);
    assert_eq!(c.apply(&pool("a"), 0), pool("a"));
    assert_eq!(c.apply(&pool("a"), 50), split("a", 9_950, "canary", 50));
}

#[test]
fn an_override_is_published_as_given_and_the_ramp_applies_again_when_it_ends() {
    let mut r = Ramp::new();
    r.at(0);
    // The rules choose the override's action too, so that clearing it switches nothing.
    r.truths = vec![false, true, false];
    let d = r.set_override(1_000, OverrideRequest::new(pool("other"), "maintenance"));
    assert_eq!(d.switched.expect("override").to, pool("other"));
    // A step during the override: audited, nothing published.
    let d = r.at(10_000);
    assert!(d.switched.is_none());
    assert_eq!(d.audit.last().expect("a record").kind, AuditKind::Canary);
    let d = r.clear_override(11_000);
    // The rules' action is the override's: the ramp applies to it again at once.
    let s = d.switched.as_ref().expect("the ramp applies again");
    assert_eq!(s.kind, SwitchKind::Canary);
    assert_eq!(s.to, split("other", 75, "canary", 25));
    assert_eq!(s.cause, "override clear");
}

#[test]
fn an_override_to_the_active_action_publishes_it_without_the_canary() {
    let mut r = Ramp::new();
    r.at(0);
    let d = r.set_override(1_000, OverrideRequest::new(pool("stable"), "hold still"));
    let s = d.switched.expect("republished");
    assert_eq!(s.kind, SwitchKind::Override);
    assert_eq!(s.to, pool("stable"));
}

#[test]
fn a_closed_gate_holds_the_ramp_and_it_steps_when_the_gate_opens() {
    let mut r = Ramp::new();
    r.at(0);
    r.automatic = false;
    let d = r.at(10_000);
    assert!(d.switched.is_none());
    assert_eq!(d.next_deadline, None);
    r.rollback = true;
    assert!(r.at(11_000).switched.is_none(), "a frozen ramp rolled back");
    r.rollback = false;
    r.automatic = true;
    assert_eq!(
        canary_switch(&r.at(12_000)).to,
        split("stable", 75, "canary", 25)
    );
}

#[test]
fn a_ramp_restored_into_a_group_built_again_goes_on_where_it_was() {
    let mut r = Ramp::new();
    r.at(0);
    r.at(10_000);
    // An apply that keeps the block: the group resumes the published rule action with the
    // ramp it had; nothing switches and the next step keeps its deadline.
    let mut again = Group::resume(config(), pool("stable"), ms(12_000)).expect("resume");
    again.restore_ramp(r.group.ramp().clone());
    assert_eq!(again.published(), Some(&split("stable", 75, "canary", 25)));
    let (truths, facts) = (vec![true, false, false], FixedFacts::new());
    let d = again
        .evaluate(&Input::new(ms(12_000), &truths, &facts).cause("apply"))
        .expect("evaluate");
    assert!(d.switched.is_none(), "{d:#?}");
    assert_eq!(d.next_deadline, Some(ms(20_000)));
    // One that changed it starts over: the maps' split matches no rule at the first step's
    // share, so it is kept, and the rules' choice takes over at the first step.
    let kept = split("stable", 75, "canary", 25);
    let mut fresh = Group::resume(config(), kept, ms(12_000)).expect("resume");
    let d = fresh
        .evaluate(&Input::new(ms(12_000), &truths, &facts).cause("apply"))
        .expect("evaluate");
    let s = d.switched.as_ref().expect("the ramp starts over");
    assert_eq!(s.kind, SwitchKind::Resume);
    assert_eq!(s.to, split("stable", 95, "canary", 5));
    assert_eq!(d.next_deadline, Some(ms(22_000)));
}

#[test]
fn explain_shows_the_ramp_and_what_the_group_publishes() {
    let mut r = Ramp::new();
    r.at(0);
    let input = r.input(1_000, "explain");
    let e = r.group.explain(&input).expect("explain");
    let text = e.to_string();
    assert!(
        text.contains("canary pool canary: ramping, step 1 of 4 (5%), next step at 10.000s"),
        "{text}"
    );
    assert!(
        text.contains("publishes split=stable:95,canary:5"),
        "{text}"
    );
    let json = serde_json::to_value(&e).expect("json");
    assert_eq!(json["canary"]["share"], 5.0);
    assert_eq!(json["canary"]["state"], "ramping");
}

#[test]
fn per_class_the_ramp_applies_to_the_default_entry_alone() {
    let c = config().canary.expect("a ramp");
    let by_class = |default: Action| {
        Action::ByClass(
            [
                ("vip".to_owned(), pool("stable")),
                ("trial".to_owned(), pool("canary")),
                (rules::engine::DEFAULT_CLASS.to_owned(), default),
            ]
            .into_iter()
            .collect(),
        )
    };
    // The trial class names the canary pool on purpose; the ramp still shares the default.
    assert_eq!(
        c.apply(&by_class(pool("stable")), 2_500),
        by_class(split("stable", 75, "canary", 25))
    );
    assert_eq!(
        c.apply(&by_class(pool("stable")), 10_000),
        by_class(pool("canary"))
    );
    assert_eq!(
        c.apply(&by_class(pool("stable")), 0),
        by_class(pool("stable"))
    );
}
