//! Explain: for a group, each rule with its truth value, which one wins, and why the active
//! action is or is not the winner's (pending `stable_for`, cooldown or failback with its
//! deadline, override, veto, freeze).
//!
//! [`Group::explain`] evaluates a copy of the group, so it changes nothing and shows the state
//! the group is in at `now` (a deadline that has passed is applied, as the real evaluation
//! would). It serializes to JSON for the local API and renders as text for the CLI.

use std::fmt;

use serde::Serialize;

use super::EngineError;
use super::action::{Action, By};
use super::canary::RampStatus;
use super::group::{Active, Candidate, Group, Input, Wait};
use super::overrides::Override;
use super::time::{Time, opt_us, show, us};

/// Where a rule (or the default) stands in an evaluation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum RuleStatus {
    /// Its condition is false.
    False,
    /// Its condition is true but its action fails `require`; the next true rule was considered.
    Vetoed,
    /// Its condition is true (or, for the default, it is not needed) but `by` ranks above it.
    Shadowed {
        /// The winning rule.
        by: By,
    },
    /// It is the winner and its action is the active one.
    Active,
    /// It is the winner but its action is not active yet, and why.
    Waiting(Wait),
}

/// One rule in an explanation, in evaluation order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleExplanation {
    /// The rule's id.
    pub id: String,
    /// Its priority.
    pub priority: i64,
    /// Its action.
    pub action: Action,
    /// The truth value of its condition.
    pub truth: bool,
    /// Whether it is the candidate: the first true rule passing `require`.
    pub winner: bool,
    /// Where it stands (JSON: flattened into the rule, `"status": "waiting", "wait": …`).
    #[serde(flatten)]
    pub status: RuleStatus,
}

/// The default in an explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DefaultExplanation {
    /// The default action.
    pub action: Action,
    /// Whether the default is the candidate (no true rule passes `require`).
    pub winner: bool,
    /// Where it stands ([`RuleStatus::False`] never occurs; flattened in JSON).
    #[serde(flatten)]
    pub status: RuleStatus,
}

/// A structured explanation of a group's decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// The group.
    pub group: String,
    /// The time of the explanation.
    #[serde(rename = "now_us", with = "us")]
    pub now: Time,
    /// The value of the `automatic` gate.
    pub automatic: bool,
    /// The action the rules (or an override) chose and its source.
    pub active: Option<Active>,
    /// What the group publishes: `active` with the canary ramp's share applied.
    pub published: Option<Action>,
    /// The canary ramp, if the group has one.
    pub canary: Option<RampStatus>,
    /// The override in force.
    #[serde(rename = "override")]
    pub overriding: Option<Override>,
    /// The rules' choice.
    pub candidate: Option<Candidate>,
    /// Why the candidate is not active.
    pub wait: Option<Wait>,
    /// No candidate: the active action is kept.
    pub no_match: bool,
    /// When the group is due for evaluation without input changes.
    #[serde(rename = "next_deadline_us", with = "opt_us")]
    pub next_deadline: Option<Time>,
    /// Every rule, in evaluation order.
    pub rules: Vec<RuleExplanation>,
    /// The default, if the group has one.
    pub default: Option<DefaultExplanation>,
}

impl Group {
    /// Explains the decision the group makes at `input.now`, without changing the group. Use
    /// the current inputs to explain the present, or hypothetical ones for what-if.
    ///
    /// # Errors
    ///
    /// [`EngineError::TruthCount`] when `input` has a truth value count other than the
    /// group's rule count, as [`Group::evaluate`].
    pub fn explain(&self, input: &Input<'_>) -> Result<Explanation, EngineError> {
        let mut group = self.clone();
        let decision = group.evaluate(input)?;
        let winner = decision.candidate.as_ref().map(|c| &c.by);
        let status_of = |by: &By, truth: bool| -> RuleStatus {
            if Some(by) == winner {
                // Without a wait the candidate is the active action (adopted, switched to,
                // relabelled, or equal to the override's).
                match &decision.wait {
                    Some(wait) => RuleStatus::Waiting(wait.clone()),
                    None => RuleStatus::Active,
                }
            } else if !truth {
                RuleStatus::False
            } else if decision.vetoed.contains(by) {
                RuleStatus::Vetoed
            } else {
                match winner {
                    Some(w) => RuleStatus::Shadowed { by: w.clone() },
                    None => RuleStatus::Vetoed,
                }
            }
        };
        let rules = group
            .order
            .iter()
            .map(|&i| {
                let rule = &group.config.rules[i];
                let by = By::Rule(rule.id.clone());
                let truth = input.truths.get(i).copied().unwrap_or(false);
                RuleExplanation {
                    id: rule.id.clone(),
                    priority: rule.priority,
                    action: rule.action.clone(),
                    truth,
                    winner: Some(&by) == winner,
                    status: status_of(&by, truth),
                }
            })
            .collect();
        let default = group
            .config
            .default
            .as_ref()
            .map(|action| DefaultExplanation {
                action: action.clone(),
                winner: winner == Some(&By::Default),
                status: status_of(&By::Default, true),
            });
        Ok(Explanation {
            group: decision.group.clone(),
            now: input.now,
            automatic: input.automatic,
            active: decision.active.clone(),
            published: decision.published.clone(),
            canary: group.canary_status(),
            overriding: group.overriding.clone(),
            candidate: decision.candidate.clone(),
            wait: decision.wait.clone(),
            no_match: decision.no_match,
            next_deadline: decision.next_deadline,
            rules,
            default,
        })
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StableFor { until } => write!(f, "pending stable_for until {}", show(*until)),
            Self::Cooldown { until } => write!(f, "pending cooldown until {}", show(*until)),
            Self::Failback { until } => write!(f, "failback pending until {}", show(*until)),
            Self::Frozen => f.write_str("frozen: the automatic gate is off"),
            Self::Overridden { until: Some(t) } => write!(f, "overridden until {}", show(*t)),
            Self::Overridden { until: None } => f.write_str("overridden until cleared"),
        }
    }
}

impl fmt::Display for RuleStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::False => f.write_str("false"),
            Self::Vetoed => f.write_str("true, vetoed by require"),
            Self::Shadowed { by } => write!(f, "not used: {by} wins"),
            Self::Active => f.write_str("WINS, active"),
            Self::Waiting(wait) => write!(f, "WINS, not active: {wait}"),
        }
    }
}

impl fmt::Display for Explanation {
    /// The text form `switchyard ctl explain` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gate = if self.automatic { "on" } else { "OFF (frozen)" };
        write!(f, "group {} at {}: ", self.group, show(self.now))?;
        match &self.active {
            Some(a) => write!(f, "active {} ({}, since {})", a.action, a.by, show(a.since))?,
            None => f.write_str("nothing active")?,
        }
        writeln!(f, "; automatic {gate}")?;
        if let Some(c) = &self.canary {
            let published = self
                .published
                .as_ref()
                .map_or("nothing".to_owned(), ToString::to_string);
            writeln!(f, "  {c}; publishes {published}")?;
        }
        if let Some(o) = &self.overriding {
            let until = o.expires_at.map_or("cleared".to_owned(), show);
            let forced = if o.forced { ", forced" } else { "" };
            writeln!(
                f,
                "  override {} until {until}{forced}: {:?}",
                o.action, o.reason
            )?;
        }
        let width = self.rules.iter().map(|r| r.id.len()).max().unwrap_or(0);
        let actions: Vec<String> = self.rules.iter().map(|r| r.action.to_string()).collect();
        let action_width = actions.iter().map(String::len).max().unwrap_or(0);
        for (r, action) in self.rules.iter().zip(&actions) {
            let truth = if r.truth { "true " } else { "false" };
            let (prio, id, status) = (r.priority, &r.id, &r.status);
            writeln!(
                f,
                "  {prio:>5} {id:<width$}  {truth}  {action:<action_width$}  {status}"
            )?;
        }
        if let Some(d) = &self.default {
            writeln!(f, "  default  {}  {}", d.action, d.status)?;
        }
        if self.no_match {
            writeln!(
                f,
                "  no rule matches and no default applies: the active action is kept"
            )?;
        }
        match self.next_deadline {
            Some(t) => writeln!(f, "  next evaluation at {}", show(t)),
            None => writeln!(f, "  nothing pending"),
        }
    }
}
