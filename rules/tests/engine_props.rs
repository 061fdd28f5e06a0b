//! Property tests over random input sequences: equal inputs give equal decisions, and every
//! switch the engine makes obeys the policy (`stable_for`, cooldown, `failback_after`, the
//! emergency exit, the gate, overrides).

use std::time::Duration;

use proptest::prelude::*;
use rules::engine::{
    Action, By, Decision, EngineError, Facts, FixedFacts, Group, GroupConfig, Input,
    OverrideRequest, Rule, SwitchKind, SwitchPolicy, Wait,
};

const POOLS: [&str; 4] = ["dc1", "dc2", "dc3", "dr"];

fn actions() -> Vec<Action> {
    let mut all: Vec<Action> = POOLS.iter().map(|p| Action::pool(*p)).collect();
    all.push(Action::Split(vec![("dc1".into(), 50), ("dc2".into(), 50)]));
    all
}

/// One change of input, or a timer.
#[derive(Clone, Debug)]
enum Op {
    /// Time passes by this many ms; the engine is evaluated at every deadline on the way.
    Advance(u64),
    Truth(usize, bool),
    Gate(bool),
    Healthy(usize, bool),
    Veto(usize, bool),
    SetOverride {
        action: usize,
        ttl: Option<u64>,
        force: bool,
        blank: bool,
    },
    ClearOverride,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..3_000).prop_map(Op::Advance),
        4 => (0usize..4, any::<bool>()).prop_map(|(i, v)| Op::Truth(i, v)),
        1 => any::<bool>().prop_map(Op::Gate),
        2 => (0usize..4, any::<bool>()).prop_map(|(i, v)| Op::Healthy(i, v)),
        1 => (0usize..5, any::<bool>()).prop_map(|(i, v)| Op::Veto(i, v)),
        1 => (0usize..5, proptest::option::of(1u64..5_000), any::<bool>(), any::<bool>())
            .prop_map(|(action, ttl, force, blank)| Op::SetOverride { action, ttl, force, blank }),
        1 => Just(Op::ClearOverride),
    ]
}

fn config(policy: (u64, u64, u64), with_default: bool) -> GroupConfig {
    let a = actions();
    let rule = |id: &str, priority, action: &Action| Rule {
        id: id.into(),
        priority,
        action: action.clone(),
    };
    GroupConfig {
        name: "g".into(),
        rules: vec![
            rule("canary", 110, &a[4]),
            rule("primary", 100, &a[0]),
            rule("secondary", 90, &a[1]),
            rule("also-90", 90, &a[2]),
        ],
        default: with_default.then(|| a[3].clone()),
        policy: SwitchPolicy {
            stable_for: Duration::from_millis(policy.0),
            cooldown: Duration::from_millis(policy.1),
            failback_after: Duration::from_millis(policy.2),
        },
        canary: None,
    }
}

/// The world the engine sees.
struct World {
    group: Group,
    now: Duration,
    truths: Vec<bool>,
    facts: FixedFacts,
    automatic: bool,
    next_deadline: Option<Duration>,
}

/// One evaluation (or override command) and the inputs it saw.
#[derive(Debug, PartialEq)]
struct Step {
    outcome: Result<Decision, EngineError>,
    facts: FixedFacts,
    automatic: bool,
}

impl World {
    fn record(&mut self, outcome: Result<Decision, EngineError>, out: &mut Vec<Step>) {
        if let Ok(d) = &outcome {
            self.next_deadline = d.next_deadline;
        }
        let (facts, automatic) = (self.facts.clone(), self.automatic);
        out.push(Step {
            outcome,
            facts,
            automatic,
        });
    }

    fn evaluate(&mut self, out: &mut Vec<Step>) {
        let input = Input::new(self.now, &self.truths, &self.facts).automatic(self.automatic);
        let outcome = self.group.evaluate(&input);
        self.record(outcome, out);
    }

    fn apply(&mut self, op: &Op, out: &mut Vec<Step>) {
        match *op {
            Op::Advance(ms) => {
                let target = self.now + Duration::from_millis(ms);
                while let Some(due) = self.next_deadline.filter(|d| *d <= target && *d > self.now) {
                    self.now = due;
                    self.evaluate(out);
                }
                self.now = target;
            }
            Op::Truth(i, v) => self.truths[i] = v,
            Op::Gate(v) => self.automatic = v,
            Op::Healthy(i, true) => drop(self.facts.dead_pools.remove(POOLS[i])),
            Op::Healthy(i, false) => drop(self.facts.dead_pools.insert(POOLS[i].into())),
            Op::Veto(i, true) => drop(self.facts.vetoed.insert(actions()[i].clone())),
            Op::Veto(i, false) => drop(self.facts.vetoed.remove(&actions()[i])),
            Op::SetOverride {
                action,
                ttl,
                force,
                blank,
            } => {
                let reason = if blank { " " } else { "because" };
                let mut request = OverrideRequest::new(actions()[action].clone(), reason);
                request.ttl = ttl.map(Duration::from_millis);
                request.force = force;
                let input =
                    Input::new(self.now, &self.truths, &self.facts).automatic(self.automatic);
                let outcome = self.group.set_override(request, &input);
                return self.record(outcome, out);
            }
            Op::ClearOverride => {
                let input =
                    Input::new(self.now, &self.truths, &self.facts).automatic(self.automatic);
                let outcome = self.group.clear_override(&input);
                return self.record(outcome, out);
            }
        }
        self.evaluate(out);
    }
}

fn run(config: &GroupConfig, ops: &[Op]) -> Vec<Step> {
    let mut world = World {
        group: Group::new(config.clone()).expect("valid"),
        now: Duration::ZERO,
        truths: vec![false; config.rules.len()],
        facts: FixedFacts::new(),
        automatic: true,
        next_deadline: None,
    };
    let mut out = Vec::new();
    world.evaluate(&mut out);
    for op in ops {
        world.apply(op, &mut out);
    }
    out
}

/// The rank of a source, computed independently of the engine: rules by priority descending
/// then declaration order, the default last; an override or a kept action has none.
fn rank(config: &GroupConfig, by: &By) -> Option<usize> {
    let mut order: Vec<(i64, usize)> = config
        .rules
        .iter()
        .enumerate()
        .map(|(i, r)| (-r.priority, i))
        .collect();
    order.sort_unstable();
    match by {
        By::Rule(id) => order.iter().position(|&(_, i)| config.rules[i].id == *id),
        By::Default => Some(order.len()),
        By::Override | By::Kept => None,
    }
}

fn scenario() -> impl Strategy<Value = (GroupConfig, Vec<Op>)> {
    let policy = (0u64..200, 0u64..2_000, 0u64..4_000);
    (
        policy,
        any::<bool>(),
        proptest::collection::vec(op(), 0..80),
    )
        .prop_map(|(policy, with_default, ops)| (config(policy, with_default), ops))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_same_input_sequence_twice_gives_the_same_decisions((config, ops) in scenario()) {
        let first = run(&config, &ops);
        let second = run(&config, &ops);
        prop_assert_eq!(first, second);
    }

    #[test]
    fn every_switch_obeys_the_policy((config, ops) in scenario()) {
        let policy = config.policy;
        let mut last_switch: Option<Duration> = None;
        let mut previous_by: Option<By> = None;
        for step in run(&config, &ops) {
            let Ok(d) = step.outcome else { continue };
            let before = std::mem::replace(&mut previous_by, d.active.as_ref().map(|a| a.by.clone()));
            if let Some(deadline) = d.next_deadline {
                prop_assert!(deadline > d.now, "deadline {deadline:?} not after {:?}", d.now);
            }
            if let (None, Some(c), Some(a)) = (&d.wait, &d.candidate, &d.active) {
                prop_assert_eq!(&c.action, &a.action, "no wait, yet the candidate is not active");
            }
            if let Some(Wait::Overridden { .. }) = d.wait {
                prop_assert_eq!(&d.active.as_ref().expect("active").by, &By::Override);
            }
            let Some(switch) = &d.switched else { continue };
            let held = d.candidate.as_ref().map(|c| d.now.saturating_sub(c.since));
            let since_last = last_switch.map(|t| d.now.checked_sub(t).expect("time runs forward"));
            match switch.kind {
                SwitchKind::Adopt => prop_assert!(switch.from.is_none()),
                SwitchKind::Canary => prop_assert!(false, "a canary switch without a ramp"),
                SwitchKind::Override => {}
                SwitchKind::Emergency => {
                    prop_assert!(step.automatic, "emergency exit while frozen");
                    let from = switch.from.as_ref().expect("from");
                    prop_assert!(!from.is_alive(&step.facts) && switch.to.is_alive(&step.facts));
                }
                SwitchKind::Resume => {
                    prop_assert!(step.automatic, "resume while frozen");
                    prop_assert!(held >= Some(policy.stable_for));
                }
                SwitchKind::Failover | SwitchKind::Failback => {
                    let outranks = match (rank(&config, &switch.by), before.as_ref().and_then(|b| rank(&config, b))) {
                        (Some(to), Some(from)) => to < from,
                        _ => false,
                    };
                    prop_assert_eq!(switch.kind == SwitchKind::Failback, outranks, "failback is a move up");
                    prop_assert!(step.automatic, "automatic switch while frozen");
                    let hold = if switch.kind == SwitchKind::Failback {
                        policy.stable_for.max(policy.failback_after)
                    } else {
                        policy.stable_for
                    };
                    prop_assert!(held >= Some(hold), "held {held:?} < {hold:?}");
                    prop_assert!(since_last.is_none_or(|gap| gap >= policy.cooldown));
                }
            }
            if switch.kind != SwitchKind::Override {
                prop_assert!(step.facts.passes_require(&switch.to));
            }
            last_switch = Some(d.now);
        }
    }
}
