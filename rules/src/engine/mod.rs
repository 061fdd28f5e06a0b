//! The decision engine: which action a decision group publishes, as a pure state machine.
//!
//! The engine owns the switching policy of ARCHITECTURE.md ("The control path" → Decisions). It
//! does not evaluate expressions: the caller computes the truth value of every rule's `when`,
//! answers questions about targets through [`Facts`] (does an action pass the group's `require`,
//! does a pool have a healthy backend) and passes the value of the `automatic` gate. No clock,
//! no randomness, no I/O: equal inputs give equal decisions.
//!
//! # Time
//!
//! Time is a [`Time`], a [`Duration`](std::time::Duration) since an epoch the caller chooses
//! (the agent reads a monotonic clock as the time since it started; tests start at zero). `now`
//! should never decrease; if it does, every elapsed time is computed with saturating arithmetic,
//! so a step back only delays pending switches. Audit records carry the same engine time; a
//! caller that wants wall-clock time in its log rewrites [`AuditRecord::at`].
//!
//! The engine is event-driven: the caller evaluates a group whenever an input changes (a rule's
//! truth, a fact, the gate) and again at [`Decision::next_deadline`]. A flap that starts and ends
//! between two evaluations is invisible, so every change must be evaluated.
//!
//! # Semantics
//!
//! - **Order.** Rules are ordered by priority, higher first, then by declaration order. Truth
//!   values are given in declaration order. The *rank* of a rule is its place in that order; the
//!   default ranks below every rule.
//! - **Candidate.** The first true rule whose action passes `require` is the candidate; a true
//!   rule whose action fails `require` is skipped (reported in [`Decision::vetoed`] and audited
//!   once when the veto starts) and the next true rule is considered. No true rule passing
//!   `require` → the default (which `require` also vetoes). No candidate at all → the active
//!   action is kept and [`Decision::no_match`] is set, so the caller raises a metric and logs.
//! - **Adoption.** The first candidate of a group with no active action is adopted at once:
//!   nothing is being switched away from, so neither the policy nor the gate applies.
//! - **`stable_for`.** A candidate that differs from the active action must stay the candidate
//!   continuously for `stable_for` (measured from the evaluation where it became the candidate).
//!   Any change of candidate restarts the clock.
//! - **`cooldown`.** An automatic switch waits until `cooldown` after the previous switch.
//! - **`failback_after`.** A candidate ranked above the rule (or default) that chose the active
//!   action is a failback: it must hold for `max(stable_for, failback_after)`; a flap during the
//!   wait restarts it. Moving from the default to any rule is a failback.
//! - **Emergency exit.** If a pool of the active action (with weight > 0) has no healthy backend
//!   and the candidate's pools all have one, the switch happens at once: no `stable_for`, no
//!   `cooldown`, no `failback_after`. Moving from one dead target to another follows the policy.
//! - **Gate.** While `automatic` is false nothing switches automatically — the emergency exit
//!   included. This is *freeze* semantics: an operator turns automation off exactly when the
//!   signals that drive it (probes included) are not to be trusted, for instance during work on
//!   the health-check network, and "no healthy backend" is one of those signals. Traffic is not
//!   dropped meanwhile: the data plane falls back to the last-known-good pool when the active
//!   pool has no usable backend, an override still moves traffic at once, and a switch the gate
//!   blocks is audited ([`AuditKind::Freeze`]) and reported ([`Wait::Frozen`]). Candidates keep
//!   being tracked while frozen, so one that held long enough switches as soon as the gate opens.
//! - **Overrides.** An override beats every rule, the policy and the gate; it needs a non-empty
//!   reason, may carry a TTL (it expires at `set time + ttl`, a deadline) and is refused when its
//!   action fails `require` unless forced (an error; nothing changes, nothing is audited). An
//!   override's target is never left automatically, even with no healthy backend. When an
//!   override ends (cleared or expired) its action stays active, *kept*, until the candidate takes
//!   over: that needs `stable_for` (and an open gate) but not `cooldown` or `failback_after`,
//!   because clearing an override, or choosing its TTL, is the operator handing control back.
//! - **Resume.** [`Group::resume`] starts a group from an action published by a previous run; it
//!   is kept in the same way.
//! - **Canary ramp.** A group with `canary:` publishes its rules' choice with a share of new
//!   flows sent to a canary pool, raised step by step and dropped to zero when `rollback_when`
//!   turns true; each change of the share is a switch of kind `canary` ([`canary`]).
//! - **Identity.** Switching means the action changes. If a different rule (or the default) with
//!   the same action becomes the candidate, the active action is relabelled without a switch.

mod action;
mod audit;
pub mod canary;
mod explain;
mod group;
mod overrides;
mod policy;
mod time;

pub use action::{Action, By, DEFAULT_CLASS, Facts, FixedFacts};
pub use audit::{AuditKind, AuditLog, AuditRecord};
pub use canary::{Canary, CanaryOp, Percent, Ramp, RampPhase, RampStatus, SHARE_SCALE};
pub use explain::{DefaultExplanation, Explanation, RuleExplanation, RuleStatus};
pub use group::{
    Active, Candidate, Decision, Group, GroupConfig, Input, Rule, Switch, SwitchKind, SwitchPolicy,
    Wait,
};
pub use overrides::{Override, OverrideRequest};
pub use time::Time;

/// Why a group could not be built, evaluated, or given an override. Nothing changes on error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The group has an empty name.
    #[error("a decision group needs a name")]
    EmptyGroupName,
    /// The group has no rule and no default.
    #[error("decision group {group}: no rule and no default, nothing to decide")]
    NothingToDecide {
        /// The group.
        group: String,
    },
    /// A rule has an empty id.
    #[error("decision group {group}: rule {index} has an empty id")]
    EmptyRuleId {
        /// The group.
        group: String,
        /// The rule's position in declaration order.
        index: usize,
    },
    /// Two rules share an id.
    #[error("decision group {group}: duplicate rule id {id:?}")]
    DuplicateRuleId {
        /// The group.
        group: String,
        /// The repeated id.
        id: String,
    },
    /// An action is malformed (empty pool name, empty split, repeated pool, zero total weight).
    #[error("decision group {group}: invalid action in {place}: {problem}")]
    InvalidAction {
        /// The group.
        group: String,
        /// Where: `rule ID`, `default` or `override`.
        place: String,
        /// What is wrong.
        problem: String,
    },
    /// The caller gave a truth value count different from the group's rule count.
    #[error("decision group {group}: {got} truth values given for {expected} rules")]
    TruthCount {
        /// The group.
        group: String,
        /// The number of rules.
        expected: usize,
        /// The number of truth values given.
        got: usize,
    },
    /// An override without a reason (empty or only whitespace).
    #[error("decision group {group}: an override needs a reason")]
    MissingReason {
        /// The group.
        group: String,
    },
    /// An override with a TTL of zero.
    #[error("decision group {group}: an override TTL must be longer than zero")]
    ZeroTtl {
        /// The group.
        group: String,
    },
    /// An override, without force, to an action that fails the group's `require`.
    #[error(
        "decision group {group}: override to {target} vetoed: it fails the group's require \
         (force to override anyway)"
    )]
    OverrideVetoed {
        /// The group.
        group: String,
        /// The refused action.
        target: Action,
    },
    /// `clear` on a group without an override.
    #[error("decision group {group}: no override to clear")]
    NoOverride {
        /// The group.
        group: String,
    },
    /// A canary operation on a group without `canary:`.
    #[error("decision group {group} has no canary ramp")]
    NoCanary {
        /// The group.
        group: String,
    },
    /// A canary operation the ramp's state does not allow (pause when not ramping, resume
    /// when not paused, abort once stopped).
    #[error("decision group {group}: cannot {op} a canary ramp that is {state}")]
    CanaryState {
        /// The group.
        group: String,
        /// `pause`, `resume` or `abort`.
        op: String,
        /// Where the ramp is.
        state: RampPhase,
    },
}
