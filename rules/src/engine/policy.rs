//! The switching policy: one evaluation step of a group (see the module docs of
//! [`crate::engine`] for the rules it implements).

use super::action::{Action, By};
use super::audit::{AuditKind, AuditRecord};
use super::group::{Active, Candidate, Decision, Group, Input, Switch, SwitchKind, Wait};
use super::time::Time;

/// The rules' choice: an action, where it came from, and its rank.
struct Choice {
    action: Action,
    by: By,
    rank: usize,
}

/// What to do about a candidate that differs from the active action.
enum Plan {
    /// Switch now.
    Switch(SwitchKind),
    /// Not yet; `Some` deadline to evaluate again.
    Wait(Wait, Option<Time>),
}

impl Group {
    /// One evaluation. `audit` holds records made before it (override set or cleared). The
    /// caller has checked the number of truth values.
    pub(super) fn step(&mut self, input: &Input<'_>, mut audit: Vec<AuditRecord>) -> Decision {
        let now = input.now;
        let expired = self
            .overriding
            .take_if(|o| o.expires_at.is_some_and(|t| t <= now));
        if let Some(ended) = expired {
            audit.push(self.override_ended(ended, AuditKind::OverrideExpired, input));
        }
        // The ramp first: a switch of this evaluation publishes at the ramp's new share.
        self.advance_ramp(input);

        let (choice, vetoed) = self.choose(input);
        self.note_vetoes(&vetoed, input, &mut audit);
        self.track(choice, now);
        let same_as_noted = match (&self.freeze_noted, &self.tracked) {
            (Some(noted), Some((cand, _))) => *noted == cand.action,
            _ => false,
        };
        if input.automatic || !same_as_noted {
            self.freeze_noted = None;
        }

        let mut switched = None;
        let mut wait = None;
        let mut deadline = None;
        if let Some(forced) = self.overriding.clone() {
            deadline = forced.expires_at;
            if self.active_action() != Some(&forced.action) {
                let to = forced.action.clone();
                let kind = SwitchKind::Override;
                switched = Some(self.switch(to, By::Override, None, kind, input, &mut audit));
            } else if let Some(active) = self.active.as_mut() {
                active.by = By::Override;
                self.active_rank = None;
            }
            if self
                .tracked
                .as_ref()
                .is_some_and(|(c, _)| c.action != forced.action)
            {
                wait = Some(Wait::Overridden {
                    until: forced.expires_at,
                });
            }
        } else if let Some((cand, rank)) = self.tracked.clone() {
            match self.active.as_mut() {
                None => {
                    let kind = SwitchKind::Adopt;
                    let to = cand.action;
                    switched = Some(self.switch(to, cand.by, Some(rank), kind, input, &mut audit));
                }
                Some(active) if active.action == cand.action => {
                    // Same action from another source: relabel, no switch.
                    active.by = cand.by;
                    self.active_rank = Some(rank);
                }
                Some(_) => match self.plan(&cand, rank, input, &mut audit) {
                    Plan::Switch(kind) => {
                        let to = cand.action;
                        switched =
                            Some(self.switch(to, cand.by, Some(rank), kind, input, &mut audit));
                    }
                    Plan::Wait(why, due) => {
                        wait = Some(why);
                        deadline = due;
                    }
                },
            }
        }

        let note = self.ramp_note.take();
        let published = self.active.as_ref().map(|a| self.publish_form(a));
        if switched.is_none()
            && let Some(to) = published.filter(|p| Some(p) != self.published.as_ref())
        {
            switched = Some(self.republish(to, note, input, &mut audit));
        } else if let Some(note) = note {
            audit.push(self.ramp_record(note, input));
        }
        let ramp_due = self.ramp_deadline(input.automatic);
        deadline = match (deadline, ramp_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };

        Decision {
            group: self.config.name.clone(),
            now,
            active: self.active.clone(),
            published: self.published.clone(),
            switched,
            candidate: self.tracked.as_ref().map(|(c, _)| c.clone()),
            wait,
            vetoed: self.vetoed.clone(),
            no_match: self.tracked.is_none(),
            next_deadline: deadline,
            audit,
        }
    }

    /// The first true rule whose action passes `require`, else the default if it passes; and
    /// every true rule (and default) skipped for failing `require` on the way, in order.
    fn choose(&self, input: &Input<'_>) -> (Option<Choice>, Vec<(By, Action)>) {
        let mut vetoed = Vec::new();
        for (rank, &i) in self.order.iter().enumerate() {
            let rule = &self.config.rules[i];
            if !input.truths.get(i).copied().unwrap_or(false) {
                continue;
            }
            let by = By::Rule(rule.id.clone());
            if input.facts.passes_require(&rule.action) {
                let action = rule.action.clone();
                return (Some(Choice { action, by, rank }), vetoed);
            }
            vetoed.push((by, rule.action.clone()));
        }
        if let Some(default) = &self.config.default {
            if input.facts.passes_require(default) {
                let (action, by, rank) = (default.clone(), By::Default, self.order.len());
                return (Some(Choice { action, by, rank }), vetoed);
            }
            vetoed.push((By::Default, default.clone()));
        }
        (None, vetoed)
    }

    /// Audits the vetoes that were not there at the previous evaluation and remembers them all.
    fn note_vetoes(
        &mut self,
        vetoed: &[(By, Action)],
        input: &Input<'_>,
        audit: &mut Vec<AuditRecord>,
    ) {
        for (by, action) in vetoed {
            if !self.vetoed.contains(by) {
                let record =
                    AuditRecord::new(input.now, &self.config.name, AuditKind::Veto, input.cause);
                audit.push(record.moving(self.active_action(), action, by.clone()));
            }
        }
        self.vetoed = vetoed.iter().map(|(by, _)| by.clone()).collect();
    }

    /// Makes `choice` the tracked candidate; its clock keeps running while its action stays.
    fn track(&mut self, choice: Option<Choice>, now: Time) {
        self.tracked = choice.map(|Choice { action, by, rank }| {
            let since = match &self.tracked {
                Some((held, _)) if held.action == action => held.since,
                _ => now,
            };
            (Candidate { action, by, since }, rank)
        });
    }

    /// Applies `stable_for`, `cooldown`, `failback_after`, the emergency exit and the gate to a
    /// candidate that differs from the active action.
    fn plan(
        &mut self,
        cand: &Candidate,
        rank: usize,
        input: &Input<'_>,
        audit: &mut Vec<AuditRecord>,
    ) -> Plan {
        let now = input.now;
        let policy = self.config.policy;
        let Some(active) = self.active.as_ref() else {
            return Plan::Switch(SwitchKind::Adopt);
        };
        let emergency = !active.action.is_alive(input.facts) && cand.action.is_alive(input.facts);
        let failback = self.active_rank.is_some_and(|r| rank < r);
        let hold = if failback {
            policy.stable_for.max(policy.failback_after)
        } else {
            policy.stable_for
        };
        let stable_at = cand.since.saturating_add(hold);
        // A kept action (ended override, resumed run) is left without cooldown.
        let cooldown_at = match (self.active_rank, self.last_switch) {
            (Some(_), Some(last)) => Some(last.saturating_add(policy.cooldown)),
            _ => None,
        };
        let ready_at = cooldown_at.map_or(stable_at, |c| c.max(stable_at));
        let due = emergency || ready_at <= now;

        if !input.automatic {
            if !due {
                // Come back when the switch would be due, to audit the freeze on time.
                return Plan::Wait(Wait::Frozen, Some(ready_at));
            }
            if self.freeze_noted.as_ref() != Some(&cand.action) {
                let record =
                    AuditRecord::new(now, &self.config.name, AuditKind::Freeze, input.cause);
                audit.push(record.moving(Some(&active.action), &cand.action, cand.by.clone()));
                self.freeze_noted = Some(cand.action.clone());
            }
            return Plan::Wait(Wait::Frozen, None);
        }
        if due {
            return Plan::Switch(if emergency {
                SwitchKind::Emergency
            } else if self.active_rank.is_none() {
                SwitchKind::Resume
            } else if failback {
                SwitchKind::Failback
            } else {
                SwitchKind::Failover
            });
        }
        let why = match cooldown_at {
            Some(until) if until > stable_at => Wait::Cooldown { until },
            _ if failback => Wait::Failback { until: stable_at },
            _ => Wait::StableFor { until: stable_at },
        };
        Plan::Wait(why, Some(ready_at))
    }

    /// Makes `to` the active action and audits the switch.
    fn switch(
        &mut self,
        to: Action,
        by: By,
        rank: Option<usize>,
        kind: SwitchKind,
        input: &Input<'_>,
        audit: &mut Vec<AuditRecord>,
    ) -> Switch {
        let now = input.now;
        // From and to are what the maps held and will hold: the published forms.
        let from = self.published.take();
        let active = Active {
            action: to,
            by: by.clone(),
            since: now,
        };
        let to = self.publish_form(&active);
        let mut record = AuditRecord::new(now, &self.config.name, AuditKind::Switch, input.cause)
            .moving(from.as_ref(), &to, by.clone());
        record.switch = Some(kind);
        audit.push(record);
        self.active = Some(active);
        self.published = Some(to.clone());
        self.active_rank = rank;
        self.last_switch = Some(now);
        Switch {
            from,
            to,
            by,
            kind,
            cause: input.cause.to_owned(),
        }
    }

    /// Publishes `to`, the active action in a new published form, when the rules' choice
    /// stayed: a canary ramp's transition (`note`: its cause and reason), or an action that
    /// is the ramp's again (an ended override) or no longer (an override to the active
    /// action). Not a switch of the policy's: no cooldown starts.
    fn republish(
        &mut self,
        to: Action,
        note: Option<super::canary::Note>,
        input: &Input<'_>,
        audit: &mut Vec<AuditRecord>,
    ) -> Switch {
        let by = self.active.as_ref().map_or(By::Kept, |a| a.by.clone());
        let kind = if by == By::Override {
            SwitchKind::Override
        } else {
            SwitchKind::Canary
        };
        let (cause, reason) = match note {
            Some(n) => (n.cause, n.reason),
            None => (input.cause.to_owned(), None),
        };
        let from = self.published.take();
        let mut record = AuditRecord::new(input.now, &self.config.name, AuditKind::Switch, &cause)
            .moving(from.as_ref(), &to, by.clone());
        record.switch = Some(kind);
        record.reason = reason;
        self.ramp_values(&mut record);
        audit.push(record);
        self.published = Some(to.clone());
        Switch {
            from,
            to,
            by,
            kind,
            cause,
        }
    }
}
