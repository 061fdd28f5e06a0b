//! Shared fixtures for the decision-engine tests: a group like reference.yaml's web-failover and
//! a harness that holds its inputs and an injected clock (milliseconds since zero).
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the fixtures"
)]

use std::time::Duration;

use rules::engine::{
    Action, Decision, FixedFacts, Group, GroupConfig, Input, OverrideRequest, Rule, SwitchPolicy,
};

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The reference policy: `stable_for` 50ms, cooldown 3s, `failback_after` 30s.
pub fn reference_policy() -> SwitchPolicy {
    SwitchPolicy {
        stable_for: ms(50),
        cooldown: ms(3_000),
        failback_after: ms(30_000),
    }
}

/// A rule.
pub fn rule(id: &str, priority: i64, action: Action) -> Rule {
    Rule {
        id: id.into(),
        priority,
        action,
    }
}

/// `pool=NAME`.
pub fn pool(name: &str) -> Action {
    Action::pool(name)
}

/// Rules in declaration order: `primary` (100, dc1), `secondary` (90, dc2), `tertiary` (80,
/// dc3); no default.
pub fn three_rules(policy: SwitchPolicy) -> GroupConfig {
    GroupConfig {
        name: "web-failover".into(),
        rules: vec![
            rule("primary", 100, pool("dc1")),
            rule("secondary", 90, pool("dc2")),
            rule("tertiary", 80, pool("dc3")),
        ],
        default: None,
        policy,
        canary: None,
    }
}

/// A group, its inputs and an injected clock.
pub struct Harness {
    /// The group under test.
    pub group: Group,
    /// Truth values in declaration order.
    pub truths: Vec<bool>,
    /// `require` vetoes and dead pools.
    pub facts: FixedFacts,
    /// The `automatic` gate.
    pub automatic: bool,
}

impl Harness {
    /// A harness over `config` with every rule false, everything healthy, the gate open.
    pub fn new(config: GroupConfig) -> Self {
        let truths = vec![false; config.rules.len()];
        Self {
            group: Group::new(config).expect("valid group"),
            truths,
            facts: FixedFacts::new(),
            automatic: true,
        }
    }

    /// Sets the truth values in declaration order.
    pub fn truths(&mut self, truths: &[bool]) -> &mut Self {
        self.truths = truths.to_vec();
        self
    }

    /// The input at `t` milliseconds.
    pub fn input(&self, t: u64) -> Input<'_> {
        Input::new(ms(t), &self.truths, &self.facts)
            .automatic(self.automatic)
            .cause("test")
    }

    /// Evaluates at `t` milliseconds.
    pub fn at(&mut self, t: u64) -> Decision {
        let input = Input::new(ms(t), &self.truths, &self.facts)
            .automatic(self.automatic)
            .cause("test");
        self.group.evaluate(&input).expect("evaluate")
    }

    /// Sets an override at `t` milliseconds.
    pub fn set_override(
        &mut self,
        t: u64,
        request: OverrideRequest,
    ) -> Result<Decision, rules::engine::EngineError> {
        let input = Input::new(ms(t), &self.truths, &self.facts)
            .automatic(self.automatic)
            .cause("override set");
        self.group.set_override(request, &input)
    }

    /// Clears the override at `t` milliseconds.
    pub fn clear_override(&mut self, t: u64) -> Result<Decision, rules::engine::EngineError> {
        let input = Input::new(ms(t), &self.truths, &self.facts)
            .automatic(self.automatic)
            .cause("override clear");
        self.group.clear_override(&input)
    }

    /// The active action.
    pub fn active(&self) -> Action {
        self.group
            .active()
            .expect("an active action")
            .action
            .clone()
    }
}
