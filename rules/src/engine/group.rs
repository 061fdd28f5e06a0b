//! A decision group: its configuration, its inputs, its decisions and its state.

use std::time::Duration;

use serde::Serialize;

use super::EngineError;
use super::action::{Action, By, Facts};
use super::audit::AuditRecord;
use super::canary::{Canary, Note, Ramp};
use super::overrides::Override;
use super::time::{Time, opt_us, us};

/// One `when EXPR then ACTION` rule; the expression itself lives with the caller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rule {
    /// The rule's id, unique in its group.
    pub id: String,
    /// Higher priorities are considered first; equal priorities keep declaration order.
    pub priority: i64,
    /// What the group publishes while this rule wins.
    pub action: Action,
}

/// The switching policy of a group (`switch:` in the configuration). All zero by default:
/// every switch is immediate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SwitchPolicy {
    /// How long a new candidate must hold, continuously, before the group switches to it.
    #[serde(rename = "stable_for_us", with = "us")]
    pub stable_for: Duration,
    /// The minimum time between two switches.
    #[serde(rename = "cooldown_us", with = "us")]
    pub cooldown: Duration,
    /// How long a candidate ranked above the active action's rule must hold (failback).
    #[serde(rename = "failback_after_us", with = "us")]
    pub failback_after: Duration,
}

/// A decision group as configured. `require` and `automatic` are not here: their values come
/// with each evaluation, through [`Facts::passes_require`] and [`Input::automatic`] (a group
/// without them answers `true`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupConfig {
    /// The group's name.
    pub name: String,
    /// The rules, in declaration order.
    pub rules: Vec<Rule>,
    /// The action when no rule is true (and passes `require`).
    pub default: Option<Action>,
    /// `stable_for`, `cooldown`, `failback_after`.
    pub policy: SwitchPolicy,
    /// The canary ramp (`canary:`), if any: what share of the rules' choice goes to the canary
    /// pool ([`crate::engine::canary`]).
    pub canary: Option<Canary>,
}

/// Everything one evaluation reads.
#[derive(Clone, Copy)]
pub struct Input<'a> {
    /// The time of the evaluation.
    pub now: Time,
    /// The truth value of each rule's condition, in declaration order.
    pub truths: &'a [bool],
    /// What the caller knows about targets (`require`, healthy backends).
    pub facts: &'a dyn Facts,
    /// The value of the group's `automatic` gate; `false` freezes automatic switching.
    pub automatic: bool,
    /// What triggered the evaluation (a variable that changed, `timer`, `override set`), copied
    /// into audit records.
    pub cause: &'a str,
    /// The value of the canary ramp's `rollback_when` (false without one).
    pub rollback: bool,
}

impl<'a> Input<'a> {
    /// An input with the gate open and an empty cause.
    pub fn new(now: Time, truths: &'a [bool], facts: &'a dyn Facts) -> Self {
        Self {
            now,
            truths,
            facts,
            automatic: true,
            cause: "",
            rollback: false,
        }
    }

    /// Sets the value of the canary ramp's `rollback_when`.
    #[must_use]
    pub fn rollback(mut self, rollback: bool) -> Self {
        self.rollback = rollback;
        self
    }

    /// Sets the value of the `automatic` gate.
    #[must_use]
    pub fn automatic(mut self, automatic: bool) -> Self {
        self.automatic = automatic;
        self
    }

    /// Sets the cause copied into audit records.
    #[must_use]
    pub fn cause(mut self, cause: &'a str) -> Self {
        self.cause = cause;
        self
    }
}

/// The action a group publishes and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Active {
    /// The published action.
    pub action: Action,
    /// The rule, default or override that chose it (or [`By::Kept`]).
    pub by: By,
    /// When it became active.
    #[serde(rename = "since_us", with = "us")]
    pub since: Time,
}

/// The action the rules choose now (after `require` vetoes), active or not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// The chosen action.
    pub action: Action,
    /// The rule or default that chose it.
    pub by: By,
    /// Since when this action has been the candidate, continuously.
    #[serde(rename = "since_us", with = "us")]
    pub since: Time,
}

/// Why the candidate is not the active action yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "wait")]
pub enum Wait {
    /// The candidate has not held for `stable_for` yet; it will at `until`.
    StableFor {
        /// When the switch is due, if nothing changes.
        #[serde(rename = "until_us", with = "us")]
        until: Time,
    },
    /// The previous switch was less than `cooldown` ago; the gap is over at `until`.
    Cooldown {
        /// When the switch is due, if nothing changes.
        #[serde(rename = "until_us", with = "us")]
        until: Time,
    },
    /// A failback that has not held for `failback_after` yet; it will at `until`.
    Failback {
        /// When the switch is due, if nothing changes.
        #[serde(rename = "until_us", with = "us")]
        until: Time,
    },
    /// The `automatic` gate is false.
    Frozen,
    /// A manual override is active, until `until` (or until cleared, if `None`).
    Overridden {
        /// When the override expires.
        #[serde(rename = "until_us", with = "opt_us")]
        until: Option<Time>,
    },
}

/// The kind of a switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchKind {
    /// The group's first action (nothing was active).
    Adopt,
    /// To a candidate ranked at or below the active action's rule, after `stable_for` and
    /// `cooldown`.
    Failover,
    /// To a candidate ranked above the active action's rule, after `failback_after`.
    Failback,
    /// Away from an action with a pool that has no healthy backend, at once.
    Emergency,
    /// From a kept action (an ended override, a resumed run) to the candidate.
    Resume,
    /// To a manual override's action.
    Override,
    /// The canary ramp's share changed (a step, a rollback, an abort), or the ramp applied to
    /// an action again (an ended override): the rules' choice is the same.
    Canary,
}

/// A change of the published action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Switch {
    /// The action before (`None` on adoption).
    pub from: Option<Action>,
    /// The action now.
    pub to: Action,
    /// What chose the new action.
    pub by: By,
    /// What kind of switch this is.
    pub kind: SwitchKind,
    /// The triggering event, from [`Input::cause`].
    pub cause: String,
}

/// The result of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// The group.
    pub group: String,
    /// The time of the evaluation.
    #[serde(rename = "now_us", with = "us")]
    pub now: Time,
    /// The action the rules (or an override) chose (`None` only before the group ever had a
    /// candidate).
    pub active: Option<Active>,
    /// What the group publishes: `active`'s action with the canary ramp's share applied
    /// (the same action without a ramp).
    pub published: Option<Action>,
    /// The switch this evaluation made, if any: the caller writes the map.
    pub switched: Option<Switch>,
    /// The action the rules choose (after vetoes), whether or not it is active.
    pub candidate: Option<Candidate>,
    /// Why `candidate` is not active; `None` when it is (or there is none).
    pub wait: Option<Wait>,
    /// True rules (and the default) above the candidate skipped because their action fails
    /// `require`, in evaluation order.
    pub vetoed: Vec<By>,
    /// No true rule and no default (or all of them vetoed): the active action is kept. The caller
    /// raises a metric and logs a line. Reported under an override too, where it changes nothing.
    pub no_match: bool,
    /// When to evaluate again even if no input changes (a pending switch, the freeze audit of a
    /// pending switch, an override's expiry); `None` if nothing is pending.
    #[serde(rename = "next_deadline_us", with = "opt_us")]
    pub next_deadline: Option<Time>,
    /// The audit records of this evaluation, for [`AuditLog::push`](super::AuditLog::push).
    pub audit: Vec<AuditRecord>,
}

/// A decision group and its switching state. Cloning gives an independent copy (what-if).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub(super) config: GroupConfig,
    /// Declaration indices in evaluation order: priority descending, then declaration order.
    pub(super) order: Vec<usize>,
    pub(super) active: Option<Active>,
    /// The rank of the rule (or default) that chose the active action; `None` when kept.
    pub(super) active_rank: Option<usize>,
    pub(super) last_switch: Option<Time>,
    /// The current candidate and its rank.
    pub(super) tracked: Option<(Candidate, usize)>,
    pub(super) overriding: Option<Override>,
    /// The vetoes of the last evaluation, to audit each veto once when it starts.
    pub(super) vetoed: Vec<By>,
    /// The candidate whose blocked switch was audited as a freeze, to audit it once.
    pub(super) freeze_noted: Option<Action>,
    /// The canary ramp's state (unused without `canary:`).
    pub(super) ramp: Ramp,
    /// What the group last published: the active action in its published form.
    pub(super) published: Option<Action>,
    /// A ramp transition of the evaluation under way, to audit.
    pub(super) ramp_note: Option<Note>,
}

impl Group {
    /// A group with nothing active yet; its first evaluation adopts the candidate.
    ///
    /// # Errors
    ///
    /// When `config` is invalid: [`EngineError::EmptyGroupName`],
    /// [`EngineError::NothingToDecide`] (no rule and no default), [`EngineError::EmptyRuleId`],
    /// [`EngineError::DuplicateRuleId`], or [`EngineError::InvalidAction`] for a rule's or the
    /// default's action ([`Action::problem`]) or the canary ramp ([`Canary::problem`]).
    pub fn new(config: GroupConfig) -> Result<Self, EngineError> {
        validate(&config)?;
        let mut order: Vec<usize> = (0..config.rules.len()).collect();
        // A stable sort keeps declaration order among equal priorities.
        order.sort_by_key(|&i| std::cmp::Reverse(config.rules[i].priority));
        Ok(Self {
            config,
            order,
            active: None,
            active_rank: None,
            last_switch: None,
            tracked: None,
            overriding: None,
            vetoed: Vec::new(),
            freeze_noted: None,
            ramp: Ramp::default(),
            published: None,
            ramp_note: None,
        })
    }

    /// A group that starts from `action`, published by a previous run (an agent restart): the
    /// action is kept ([`By::Kept`]) until a candidate that differs holds for `stable_for`, so a
    /// restart does not switch on its own. No cooldown is counted from `now`.
    ///
    /// # Errors
    ///
    /// [`EngineError::InvalidAction`] when `action` is malformed ([`Action::problem`]), and
    /// the errors of [`Group::new`].
    pub fn resume(config: GroupConfig, action: Action, now: Time) -> Result<Self, EngineError> {
        if let Some(problem) = action.problem() {
            return Err(invalid(&config.name, "resumed action", problem));
        }
        let mut group = Self::new(config)?;
        let active = Active {
            action,
            by: By::Kept,
            since: now,
        };
        group.published = Some(group.publish_form(&active));
        group.active = Some(active);
        Ok(group)
    }

    /// Makes `action` active as another evaluator (a fleet's leader) decided it: chosen `by`
    /// (a rule, the default, an override or kept), switched to at `switched_at` (engine time;
    /// `None` when unknown). The group then goes on from there as if it had made that switch
    /// itself: a rule's or the default's action keeps its rank, so the cooldown counts from
    /// `switched_at`, and a different candidate must hold for `stable_for` from `now` before the
    /// group switches away. An override in force is kept. Nothing is audited.
    ///
    /// # Errors
    ///
    /// [`EngineError::InvalidAction`] when `action` is malformed ([`Action::problem`]); nothing
    /// changes.
    pub fn follow(
        &mut self,
        action: Action,
        by: By,
        switched_at: Option<Time>,
        now: Time,
    ) -> Result<(), EngineError> {
        if let Some(problem) = action.problem() {
            return Err(invalid(&self.config.name, "followed action", problem));
        }
        let rank = match &by {
            By::Rule(id) => self
                .order
                .iter()
                .position(|&i| &self.config.rules[i].id == id),
            By::Default if self.config.default.is_some() => Some(self.order.len()),
            _ => None,
        };
        self.active_rank = rank;
        self.last_switch = switched_at.map(|t| t.min(now));
        // What the leader published is what this node's maps hold, ramp included.
        self.published = Some(action.clone());
        self.active = Some(Active {
            action,
            by,
            since: switched_at.map_or(now, |t| t.min(now)),
        });
        self.tracked = None;
        self.freeze_noted = None;
        Ok(())
    }

    /// The group's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The group's configuration.
    #[must_use]
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// The rules in evaluation order (priority descending, then declaration order).
    pub fn rules_in_order(&self) -> impl Iterator<Item = &Rule> {
        self.order.iter().map(|&i| &self.config.rules[i])
    }

    /// The published action, if any.
    #[must_use]
    pub fn active(&self) -> Option<&Active> {
        self.active.as_ref()
    }

    /// What the group publishes: the active action with the canary ramp's share applied.
    #[must_use]
    pub fn published(&self) -> Option<&Action> {
        self.published.as_ref()
    }

    /// The time of the last switch, if any.
    #[must_use]
    pub fn last_switch(&self) -> Option<Time> {
        self.last_switch
    }

    /// Evaluates the group at `input.now` and advances its state. Fails only when the number
    /// of truth values differs from the number of rules; then nothing changes.
    ///
    /// # Errors
    ///
    /// [`EngineError::TruthCount`] when `input.truths` does not have one value per rule.
    pub fn evaluate(&mut self, input: &Input<'_>) -> Result<Decision, EngineError> {
        self.check_truths(input)?;
        Ok(self.step(input, Vec::new()))
    }

    /// The decision [`evaluate`](Self::evaluate) would make, without changing the group.
    ///
    /// # Errors
    ///
    /// As [`evaluate`](Self::evaluate): [`EngineError::TruthCount`].
    pub fn what_if(&self, input: &Input<'_>) -> Result<Decision, EngineError> {
        self.clone().evaluate(input)
    }

    pub(super) fn check_truths(&self, input: &Input<'_>) -> Result<(), EngineError> {
        let expected = self.config.rules.len();
        if input.truths.len() == expected {
            Ok(())
        } else {
            Err(EngineError::TruthCount {
                group: self.config.name.clone(),
                expected,
                got: input.truths.len(),
            })
        }
    }
}

pub(super) fn invalid(group: &str, place: &str, problem: String) -> EngineError {
    EngineError::InvalidAction {
        group: group.to_owned(),
        place: place.to_owned(),
        problem,
    }
}

fn validate(config: &GroupConfig) -> Result<(), EngineError> {
    let group = &config.name;
    if group.is_empty() {
        return Err(EngineError::EmptyGroupName);
    }
    if config.rules.is_empty() && config.default.is_none() {
        return Err(EngineError::NothingToDecide {
            group: group.clone(),
        });
    }
    let mut ids = std::collections::BTreeSet::new();
    for (index, rule) in config.rules.iter().enumerate() {
        if rule.id.is_empty() {
            return Err(EngineError::EmptyRuleId {
                group: group.clone(),
                index,
            });
        }
        if !ids.insert(rule.id.as_str()) {
            return Err(EngineError::DuplicateRuleId {
                group: group.clone(),
                id: rule.id.clone(),
            });
        }
        if let Some(problem) = rule.action.problem() {
            return Err(invalid(group, &format!("rule {}", rule.id), problem));
        }
    }
    if let Some(problem) = config.default.as_ref().and_then(Action::problem) {
        return Err(invalid(group, "default", problem));
    }
    match config.canary.as_ref().and_then(Canary::problem) {
        Some(problem) => Err(invalid(group, "canary", problem)),
        None => Ok(()),
    }
}
