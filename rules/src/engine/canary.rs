//! The canary ramp of a group: the share of new flows sent to a canary pool, raised step by step
//! after each `hold`, dropped to zero at once when `rollback_when` turns true.
//!
//! The ramp is part of a group's evaluation, so a step is a switch like any other: the engine
//! decides it, the caller writes it, it is audited (kind `switch`, switch kind
//! [`SwitchKind::Canary`](super::SwitchKind::Canary), cause `canary`), and `explain` shows it.
//!
//! # Semantics
//!
//! - **What is published.** The group's rules choose an action as they always do; the group
//!   publishes that action with the ramp's share applied ([`Canary::apply`]): a rule's (or the
//!   default's, or a kept) pool `P` becomes a split of `P` and the canary pool at the current
//!   share (the canary pool alone at 100 %). An action that already names the canary pool is
//!   left alone, and so is a split (a decision word carries two pools, and it has them). A
//!   `by_class` action gets the share on its `default` entry alone; each class it names keeps
//!   its action. An
//!   override's action is published as the operator gave it; the ramp goes on meanwhile.
//! - **Start.** The ramp starts at its first step at the group's first evaluation.
//! - **Steps.** While `ramping`, the next step is due `hold` after the current one began; the
//!   last step makes the ramp `done` (its share stays).
//! - **Rollback.** While `ramping` or `paused`, an evaluation whose `rollback_when` is true
//!   drops the share to zero and stops the ramp (`rolled_back`). `rollback_when` is no longer
//!   watched once the ramp is `done`.
//! - **Gate.** While the `automatic` gate is false the ramp neither steps nor rolls back (the
//!   freeze semantics of the module docs of [`crate::engine`]); a step that fell due meanwhile
//!   happens at the first evaluation with the gate open.
//! - **Operator.** `pause` freezes the step and what is left of its hold; `resume` goes on with
//!   what was left; `abort` (with a reason) drops the share to zero and stops (`aborted`).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::EngineError;
use super::action::{Action, By, DEFAULT_CLASS};
use super::audit::{AuditKind, AuditRecord};
use super::group::{Decision, Group, Input};
use super::time::{Time, opt_us, show, us};

/// Shares are in units of 1/`SHARE_SCALE` (basis points): the decision word's split scale.
pub const SHARE_SCALE: u32 = 10_000;

/// A group's `canary:` block, as the engine needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Canary {
    /// The canary pool.
    pub pool: String,
    /// The shares of the steps, in units of 1/[`SHARE_SCALE`]: increasing, each in
    /// `1..=SHARE_SCALE`.
    pub steps: Vec<u32>,
    /// How long each step holds before the next.
    #[serde(rename = "hold_us", with = "us")]
    pub hold: Duration,
    /// The text of `rollback_when` (evaluated by the caller, handed in as
    /// [`Input::rollback`]); empty when the group has none.
    pub rollback_when: String,
}

impl Canary {
    /// Why this ramp cannot run: no step, a step outside `1..=SHARE_SCALE`, steps not
    /// increasing, an empty pool name, or a zero hold.
    #[must_use]
    pub fn problem(&self) -> Option<String> {
        if self.pool.is_empty() {
            return Some("empty canary pool name".into());
        }
        if self.steps.is_empty() {
            return Some("a canary ramp needs at least one step".into());
        }
        if let Some(s) = self.steps.iter().find(|&&s| s == 0 || s > SHARE_SCALE) {
            return Some(format!("canary step {} is outside (0, 100%]", Percent(*s)));
        }
        if self.steps.windows(2).any(|w| w[0] >= w[1]) {
            return Some("canary steps must increase".into());
        }
        if self.hold.is_zero() {
            return Some("canary hold must be longer than zero".into());
        }
        None
    }

    /// `action` with `share` (1/[`SHARE_SCALE`]) of its new flows sent to the canary pool.
    ///
    /// Left alone: a zero share, an action that names the canary pool (its rule routes the
    /// canary itself), and a split (the decision word carries two pools, and a split has
    /// them). A pool `P` becomes `split=P:100-s,canary:s` in whole percent when the share is
    /// one, else in basis points, and the canary pool alone at 100 %.
    #[must_use]
    pub fn apply(&self, action: &Action, share: u32) -> Action {
        let names_canary = match action {
            Action::Pool(p) => *p == self.pool,
            Action::Split(shares) => shares.iter().any(|(p, _)| *p == self.pool),
            // Per class, the ramp applies to the `default` entry alone: a class the action
            // names keeps its pool, and a class sent to the canary on purpose
            // (`trial: { pool: canary }`) does not stop the ramp.
            Action::ByClass(classes) => {
                let mut out = classes.clone();
                if let Some(default) = classes.get(DEFAULT_CLASS) {
                    out.insert(DEFAULT_CLASS.to_owned(), self.apply(default, share));
                }
                return Action::ByClass(out);
            }
        };
        if share == 0 || names_canary {
            return action.clone();
        }
        match action {
            Action::Pool(_) if share >= SHARE_SCALE => Action::Pool(self.pool.clone()),
            Action::Pool(p) => {
                let (rest, canary) = if share.is_multiple_of(100) {
                    (100 - share / 100, share / 100)
                } else {
                    (SHARE_SCALE - share, share)
                };
                Action::Split(vec![(p.clone(), rest), (self.pool.clone(), canary)])
            }
            Action::Split(_) | Action::ByClass(_) => action.clone(),
        }
    }
}

/// Where a ramp is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RampPhase {
    /// Not started: the group has not been evaluated yet.
    Pending,
    /// Holding a step; the next is due at a deadline.
    Ramping,
    /// Held by an operator: the step and what is left of its hold are frozen.
    Paused,
    /// At its last step, for good.
    Done,
    /// `rollback_when` turned true: share zero, stopped.
    RolledBack,
    /// An operator aborted it: share zero, stopped.
    Aborted,
}

impl RampPhase {
    /// Every phase, in the order of the enum (for a metric per phase).
    pub const ALL: [Self; 6] = [
        Self::Pending,
        Self::Ramping,
        Self::Paused,
        Self::Done,
        Self::RolledBack,
        Self::Aborted,
    ];

    /// The phase as the API and metrics name it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ramping => "ramping",
            Self::Paused => "paused",
            Self::Done => "done",
            Self::RolledBack => "rolled_back",
            Self::Aborted => "aborted",
        }
    }

    /// Whether the ramp has stopped with share zero.
    #[must_use]
    pub fn stopped(self) -> bool {
        matches!(self, Self::RolledBack | Self::Aborted)
    }
}

impl fmt::Display for RampPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The state of a ramp: what an apply that keeps the `canary:` block carries over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ramp {
    pub(super) phase: RampPhase,
    /// The index of the current step.
    pub(super) step: usize,
    /// While ramping: when the next step is due.
    pub(super) next_at: Option<Time>,
    /// While paused: what was left of the hold.
    pub(super) left: Option<Duration>,
}

impl Default for Ramp {
    fn default() -> Self {
        Self {
            phase: RampPhase::Pending,
            step: 0,
            next_at: None,
            left: None,
        }
    }
}

/// An operator's request about a ramp (`switchyard ctl canary …`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanaryOp {
    /// Freeze the step and its hold.
    Pause,
    /// Go on from a pause.
    Resume,
    /// Share zero and stop, for this reason (required).
    Abort(String),
}

/// A share in units of 1/[`SHARE_SCALE`]; JSON and text show it in percent (`25`, `25%`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Percent(pub u32);

impl Serialize for Percent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(percent(self.0))
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", percent(self.0))
    }
}

/// A ramp as `status` and `explain` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RampStatus {
    /// The canary pool.
    pub pool: String,
    /// Where the ramp is.
    pub state: RampPhase,
    /// The current step, from 1 (0 before the ramp starts).
    pub step: usize,
    /// The steps' shares (JSON: percent).
    pub steps: Vec<Percent>,
    /// The share of new flows sent to the canary pool now (JSON: percent).
    pub share: Percent,
    /// How long each step holds.
    #[serde(rename = "hold_us", with = "us")]
    pub hold: Duration,
    /// While ramping: when the next step is due (engine time).
    #[serde(rename = "next_step_at_us", with = "opt_us")]
    pub next_step_at: Option<Time>,
    /// While paused: what is left of the hold.
    #[serde(rename = "hold_left_us", with = "opt_us")]
    pub hold_left: Option<Duration>,
    /// The group's `rollback_when` (empty: none).
    pub rollback_when: String,
}

impl fmt::Display for RampStatus {
    /// `canary pool canary: ramping, step 2 of 4 (25%), next step at 12.000s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "canary pool {}: {}, step {} of {} ({})",
            self.pool,
            self.state,
            self.step,
            self.steps.len(),
            self.share
        )?;
        if let Some(t) = self.next_step_at {
            write!(f, ", next step at {}", show(t))?;
        }
        if let Some(left) = self.hold_left {
            write!(f, ", {} of its hold left", show(left))?;
        }
        Ok(())
    }
}

/// A share (1/[`SHARE_SCALE`]) as percent.
#[must_use]
pub fn percent(share: u32) -> f64 {
    f64::from(share) / 100.0
}

/// A ramp transition that the evaluation audits: its cause and the operator's reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Note {
    pub(super) cause: String,
    pub(super) reason: Option<String>,
}

/// The cause of the audit records of the ramp's own transitions.
pub const CANARY: &str = "canary";

impl Group {
    /// The share (1/[`SHARE_SCALE`]) the ramp sends to its canary pool now (0 without a ramp).
    #[must_use]
    pub fn canary_share(&self) -> u32 {
        let Some(c) = &self.config.canary else {
            return 0;
        };
        match self.ramp.phase {
            RampPhase::RolledBack | RampPhase::Aborted => 0,
            _ => c.steps.get(self.ramp.step).copied().unwrap_or(0),
        }
    }

    /// The ramp as `status` shows it (`None` without `canary:`).
    #[must_use]
    pub fn canary_status(&self) -> Option<RampStatus> {
        let c = self.config.canary.as_ref()?;
        let started = self.ramp.phase != RampPhase::Pending;
        Some(RampStatus {
            pool: c.pool.clone(),
            state: self.ramp.phase,
            step: if started { self.ramp.step + 1 } else { 0 },
            steps: c.steps.iter().map(|s| Percent(*s)).collect(),
            share: Percent(if started { self.canary_share() } else { 0 }),
            hold: c.hold,
            next_step_at: self.ramp.next_at,
            hold_left: self.ramp.left,
            rollback_when: c.rollback_when.clone(),
        })
    }

    /// The ramp's state, to carry over to a group built again with the same `canary:` block.
    #[must_use]
    pub fn ramp(&self) -> &Ramp {
        &self.ramp
    }

    /// Puts back a ramp taken with [`Group::ramp`] from a group with the same `canary:` block
    /// (an apply that did not change it, an agent resuming its maps). The published action is
    /// the active one at that ramp's share. Ignored without `canary:`.
    pub fn restore_ramp(&mut self, ramp: Ramp) {
        if self.config.canary.is_none() {
            return;
        }
        self.ramp = ramp;
        self.published = self.active.as_ref().map(|a| self.publish_form(a));
    }

    /// Records that the maps hold `action` for this group (what a previous run or config
    /// published), when it differs from what the group would publish now: the next evaluation
    /// then writes the group's own published form (a ramp's share), as a switch.
    pub fn published_as(&mut self, action: Action) {
        self.published = Some(action);
    }

    /// Pauses, resumes or aborts the ramp, then evaluates the group at `input.now` (an abort
    /// publishes the rules' action without the canary at once). Errors change nothing.
    ///
    /// # Errors
    ///
    /// [`EngineError::TruthCount`] (as [`Group::evaluate`]), [`EngineError::NoCanary`] for a
    /// group without `canary:`, [`EngineError::MissingReason`] for an abort without a reason,
    /// and [`EngineError::CanaryState`] for a pause of a ramp that is not ramping, a resume of
    /// one that is not paused, and an abort of one that has stopped.
    pub fn canary_op(&mut self, op: &CanaryOp, input: &Input<'_>) -> Result<Decision, EngineError> {
        self.check_truths(input)?;
        let group = self.config.name.clone();
        if self.config.canary.is_none() {
            return Err(EngineError::NoCanary { group });
        }
        // A pending ramp starts with this evaluation: the operation applies to it as started.
        let one_step = self
            .config
            .canary
            .as_ref()
            .is_some_and(|c| c.steps.len() == 1);
        let phase = match self.ramp.phase {
            RampPhase::Pending if one_step => RampPhase::Done,
            RampPhase::Pending => RampPhase::Ramping,
            p => p,
        };
        let refuse = |what: &str| EngineError::CanaryState {
            group: group.clone(),
            op: what.to_owned(),
            state: phase,
        };
        let (cause, reason) = match op {
            CanaryOp::Pause if phase != RampPhase::Ramping => return Err(refuse("pause")),
            CanaryOp::Resume if phase != RampPhase::Paused => return Err(refuse("resume")),
            CanaryOp::Abort(_) if phase.stopped() => return Err(refuse("abort")),
            CanaryOp::Abort(reason) if reason.trim().is_empty() => {
                return Err(EngineError::MissingReason {
                    group: group.clone(),
                });
            }
            CanaryOp::Pause => ("canary pause", None),
            CanaryOp::Resume => ("canary resume", None),
            CanaryOp::Abort(reason) => ("canary abort", Some(reason.clone())),
        };
        if self.ramp.phase == RampPhase::Pending {
            self.start_ramp(input.now);
        }
        let now = input.now;
        match op {
            CanaryOp::Pause => {
                self.ramp.phase = RampPhase::Paused;
                self.ramp.left = self.ramp.next_at.take().map(|at| at.saturating_sub(now));
            }
            CanaryOp::Resume => {
                self.ramp.phase = RampPhase::Ramping;
                let left = self.ramp.left.take().unwrap_or_default();
                self.ramp.next_at = Some(now.saturating_add(left));
            }
            CanaryOp::Abort(_) => self.stop_ramp(RampPhase::Aborted),
        }
        self.ramp_note = Some(Note {
            cause: cause.to_owned(),
            reason,
        });
        Ok(self.step(input, Vec::new()))
    }

    fn start_ramp(&mut self, now: Time) {
        let hold = self
            .config
            .canary
            .as_ref()
            .map_or(Duration::ZERO, |c| c.hold);
        let last = self
            .config
            .canary
            .as_ref()
            .is_some_and(|c| c.steps.len() == 1);
        self.ramp = Ramp {
            phase: if last {
                RampPhase::Done
            } else {
                RampPhase::Ramping
            },
            step: 0,
            next_at: (!last).then(|| now.saturating_add(hold)),
            left: None,
        };
    }

    fn stop_ramp(&mut self, phase: RampPhase) {
        self.ramp.phase = phase;
        self.ramp.next_at = None;
        self.ramp.left = None;
    }

    /// The ramp's part of an evaluation, before the switching policy: start, rollback, the
    /// next step. Notes a transition for the audit.
    pub(super) fn advance_ramp(&mut self, input: &Input<'_>) {
        let Some(canary) = self.config.canary.as_ref() else {
            return;
        };
        let (hold, steps) = (canary.hold, canary.steps.len());
        let now = input.now;
        let mut moved = false;
        if self.ramp.phase == RampPhase::Pending {
            self.start_ramp(now);
            moved = true;
        }
        let watching = matches!(self.ramp.phase, RampPhase::Ramping | RampPhase::Paused);
        if input.automatic && watching && input.rollback {
            self.stop_ramp(RampPhase::RolledBack);
            moved = true;
        } else if input.automatic
            && self.ramp.phase == RampPhase::Ramping
            && self.ramp.next_at.is_some_and(|at| at <= now)
        {
            self.ramp.step += 1;
            if self.ramp.step + 1 >= steps {
                self.stop_ramp(RampPhase::Done);
            } else {
                self.ramp.next_at = Some(now.saturating_add(hold));
            }
            moved = true;
        }
        if moved && self.ramp_note.is_none() {
            self.ramp_note = Some(Note {
                cause: CANARY.to_owned(),
                reason: None,
            });
        }
    }

    /// When the ramp wants the next evaluation: its next step, while ramping with the gate
    /// open (a closed gate's opening is an input change).
    pub(super) fn ramp_deadline(&self, automatic: bool) -> Option<Time> {
        (automatic && self.ramp.phase == RampPhase::Ramping)
            .then_some(self.ramp.next_at)
            .flatten()
    }

    /// What the group publishes for `active`: an override's action as given, any other with
    /// the ramp's share applied.
    pub(super) fn publish_form(&self, active: &super::group::Active) -> Action {
        match (&self.config.canary, &active.by) {
            (Some(c), By::Rule(_) | By::Default | By::Kept) => {
                c.apply(&active.action, self.canary_share())
            }
            _ => active.action.clone(),
        }
    }

    /// The audit record of a ramp transition noted in this evaluation, when the published
    /// action did not change with it (a pause, a resume, a step hidden by an override).
    pub(super) fn ramp_record(&self, note: Note, input: &Input<'_>) -> AuditRecord {
        let mut record =
            AuditRecord::new(input.now, &self.config.name, AuditKind::Canary, &note.cause);
        record.from.clone_from(&self.published);
        record.to.clone_from(&self.published);
        record.by = self.active.as_ref().map(|a| a.by.clone());
        record.reason = note.reason;
        self.ramp_values(&mut record);
        record
    }

    /// Adds the ramp's state to `record`'s values: `canary.state`, `canary.step`,
    /// `canary.share`.
    pub(super) fn ramp_values(&self, record: &mut AuditRecord) {
        let Some(status) = self.canary_status() else {
            return;
        };
        let values = [
            ("canary.state", status.state.name().to_owned()),
            (
                "canary.step",
                format!("{}/{}", status.step, status.steps.len()),
            ),
            ("canary.share", status.share.to_string()),
        ];
        for (k, v) in values {
            record.values.insert(k.to_owned(), v);
        }
    }
}
