//! Manual overrides: an action forced by an operator, with a reason and an optional TTL.
//!
//! An override beats every rule, the switching policy and the `automatic` gate. It is refused —
//! with an error, and nothing changes — without a reason, with a zero TTL, with a malformed
//! action, or (unless forced) when its action fails the group's `require`.

use std::time::Duration;

use serde::Serialize;

use super::EngineError;
use super::action::{Action, By};
use super::audit::{AuditKind, AuditRecord};
use super::group::{Decision, Group, Input, invalid};
use super::time::{Time, opt_us, us};

/// An operator's request for an override (`switchyard ctl override set`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideRequest {
    /// The action to force.
    pub action: Action,
    /// Why; required, not blank.
    pub reason: String,
    /// How long the override lasts; `None` until cleared.
    pub ttl: Option<Duration>,
    /// Bypass `require`.
    pub force: bool,
}

impl OverrideRequest {
    /// An override to `action` without TTL or force.
    pub fn new(action: Action, reason: impl Into<String>) -> Self {
        Self {
            action,
            reason: reason.into(),
            ttl: None,
            force: false,
        }
    }

    /// Sets the TTL.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets force: `require` is not checked.
    #[must_use]
    pub fn force(mut self) -> Self {
        self.force = true;
        self
    }
}

/// An override in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Override {
    /// The forced action.
    pub action: Action,
    /// The operator's reason.
    pub reason: String,
    /// When it was set.
    #[serde(rename = "set_at_us", with = "us")]
    pub set_at: Time,
    /// When it expires; `None` until cleared.
    #[serde(rename = "expires_at_us", with = "opt_us")]
    pub expires_at: Option<Time>,
    /// Whether it was forced past `require`.
    pub forced: bool,
}

impl Group {
    /// Sets (or replaces) the override and evaluates the group at `input.now`: the override's
    /// action becomes active at once. Errors leave the group unchanged.
    ///
    /// # Errors
    ///
    /// In this order: [`EngineError::TruthCount`] (as [`Group::evaluate`]),
    /// [`EngineError::MissingReason`] for a blank reason, [`EngineError::InvalidAction`] for a
    /// malformed action, [`EngineError::ZeroTtl`], and, unless `request.force`,
    /// [`EngineError::OverrideVetoed`] when the action fails the group's `require`.
    pub fn set_override(
        &mut self,
        request: OverrideRequest,
        input: &Input<'_>,
    ) -> Result<Decision, EngineError> {
        self.check_truths(input)?;
        let group = &self.config.name;
        if request.reason.trim().is_empty() {
            return Err(EngineError::MissingReason {
                group: group.clone(),
            });
        }
        if let Some(problem) = request.action.problem() {
            return Err(invalid(group, "override", problem));
        }
        if request.ttl == Some(Duration::ZERO) {
            return Err(EngineError::ZeroTtl {
                group: group.clone(),
            });
        }
        if !request.force && !input.facts.passes_require(&request.action) {
            return Err(EngineError::OverrideVetoed {
                group: group.clone(),
                target: request.action,
            });
        }
        let mut record = AuditRecord::new(input.now, group, AuditKind::OverrideSet, input.cause)
            .moving(self.active_action(), &request.action, By::Override);
        record.reason = Some(request.reason.clone());
        self.overriding = Some(Override {
            action: request.action,
            reason: request.reason,
            set_at: input.now,
            expires_at: request.ttl.map(|ttl| input.now.saturating_add(ttl)),
            forced: request.force,
        });
        Ok(self.step(input, vec![record]))
    }

    /// Clears the override and evaluates the group at `input.now`. Its action stays active,
    /// kept, until the candidate takes over (see the module docs). Fails when there is none.
    ///
    /// # Errors
    ///
    /// [`EngineError::TruthCount`] (as [`Group::evaluate`]), then [`EngineError::NoOverride`]
    /// when no override is set; either leaves the group unchanged.
    pub fn clear_override(&mut self, input: &Input<'_>) -> Result<Decision, EngineError> {
        self.check_truths(input)?;
        let Some(ended) = self.overriding.take() else {
            return Err(EngineError::NoOverride {
                group: self.config.name.clone(),
            });
        };
        let record = self.override_ended(ended, AuditKind::OverrideCleared, input);
        Ok(self.step(input, vec![record]))
    }

    /// The override in force, if any (one past its expiry stays until the next evaluation).
    #[must_use]
    pub fn current_override(&self) -> Option<&Override> {
        self.overriding.as_ref()
    }

    /// Ends `ended` (already taken out of the group): its action, if active, becomes kept.
    pub(super) fn override_ended(
        &mut self,
        ended: Override,
        kind: AuditKind,
        input: &Input<'_>,
    ) -> AuditRecord {
        let mut record = AuditRecord::new(input.now, &self.config.name, kind, input.cause);
        record.from = self.active_action().cloned();
        record.by = Some(By::Override);
        record.reason = Some(ended.reason);
        if let Some(active) = self.active.as_mut().filter(|a| a.by == By::Override) {
            active.by = By::Kept;
            self.active_rank = None;
        }
        record
    }

    pub(super) fn active_action(&self) -> Option<&Action> {
        self.active.as_ref().map(|a| &a.action)
    }
}
