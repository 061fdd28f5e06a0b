//! The driver: evaluates decision groups over a [`View`] of the live state and returns what
//! they decided. It writes nothing.

use std::{
    cell::RefCell,
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use rules::{
    Compiled, Slot, State, Value,
    engine::{
        Action, AuditKind, AuditRecord, By, CanaryOp, Decision, EngineError, Facts, Group, Input,
        OverrideRequest, RampStatus, Switch, SwitchKind,
    },
};

use crate::{
    config::{Config, compiled::Rules},
    health::Health,
    publish::Publisher,
};

/// The cause of an evaluation a group's passed deadline made (`stable_for`, `cooldown`,
/// `failback_after` or an override's TTL ending), as the audit records it.
pub const TIMER: &str = "timer";

/// Why a driver operation failed; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// No such group.
    #[error("no decision group {0:?}")]
    UnknownGroup(String),
    /// The engine refused (override vetoed, missing reason, …).
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What the driver reads for one evaluation.
#[derive(Clone, Copy)]
pub struct View<'a> {
    /// The state variables and built-ins.
    pub state: &'a State,
    /// Backend health, for `require` and the emergency exit.
    pub health: &'a Health,
    /// Engine time.
    pub now: Duration,
}

/// What one group decided in one evaluation.
#[derive(Clone, Debug)]
pub struct Decided {
    /// The group.
    pub group: String,
    /// The action to publish, when the group switched.
    pub switch_to: Option<Action>,
    /// How it switched (from, to, by what, what kind, the cause), when it did.
    pub switched: Option<Switch>,
    /// Its audit records (a switch record's latency is filled in by whoever writes the word).
    pub records: Vec<AuditRecord>,
    /// How long the evaluation took.
    pub took: Duration,
}

struct Running {
    group: Group,
    deadline: Option<Duration>,
    /// The group's decisions are made elsewhere (a fleet's leader) and handed in with
    /// [`Driver::follow`]: it is not evaluated on changes nor on deadlines.
    following: bool,
}

enum Op {
    Evaluate,
    Set(OverrideRequest),
    Clear,
    Canary(CanaryOp),
}

/// Every decision group of a configuration and its switching state.
pub struct Driver {
    rules: Arc<Rules>,
    groups: Vec<Running>,
}

/// Pool health and `require`, for one evaluation.
pub(super) struct HealthFacts<'a> {
    health: &'a Health,
    require: Option<&'a Compiled>,
    scratch: RefCell<State>,
    count: Option<Slot>,
    ratio: Option<Slot>,
}

impl Facts for HealthFacts<'_> {
    #[expect(
        clippy::cast_precision_loss,
        reason = "backend counts, at most MAX_BACKENDS, as the numbers `require` reads"
    )]
    fn passes_require(&self, action: &Action) -> bool {
        let Some(require) = self.require else {
            return true;
        };
        let (mut up, mut total) = (0usize, 0usize);
        for p in action.live_pools() {
            let (u, t) = self.health.counts(p);
            up += u;
            total += t;
        }
        let mut state = self.scratch.borrow_mut();
        if let Some(s) = self.count {
            state.set(s, up as f64);
        }
        if let Some(s) = self.ratio {
            state.set(
                s,
                if total == 0 {
                    0.0
                } else {
                    up as f64 / total as f64
                },
            );
        }
        require.eval(&state)
    }

    fn pool_healthy(&self, pool: &str) -> bool {
        self.health.counts(pool).0 > 0
    }
}

pub(super) fn explain_values(expr: &Compiled, state: &State) -> BTreeMap<String, String> {
    expr.explain(state)
        .values
        .iter()
        .map(|r| (r.name.to_owned(), r.value.to_string()))
        .collect()
}

impl Driver {
    /// The groups of `cfg` (its compiled rules), nothing active yet.
    #[must_use]
    pub fn new(cfg: &Config) -> Self {
        let groups = cfg
            .rules
            .groups
            .iter()
            .map(|g| Running {
                group: g.engine.clone(),
                deadline: None,
                following: false,
            })
            .collect();
        Self {
            rules: cfg.rules.clone(),
            groups,
        }
    }

    /// The earliest pending deadline of any group.
    #[must_use]
    pub fn next_deadline(&self) -> Option<Duration> {
        self.groups
            .iter()
            .filter(|g| !g.following)
            .filter_map(|g| g.deadline)
            .min()
    }

    /// Makes every group a follower except those named in `leading`: a fleet member decides
    /// only the groups it leads.
    pub fn follow_all_but(&mut self, leading: &[String]) {
        for g in &mut self.groups {
            g.following = !leading.iter().any(|l| l == g.group.name());
            if g.following {
                g.deadline = None;
            }
        }
    }

    /// The groups this driver decides (all of them outside a fleet).
    #[must_use]
    pub fn leading(&self) -> Vec<String> {
        self.groups
            .iter()
            .filter(|g| !g.following)
            .map(|g| g.group.name().to_owned())
            .collect()
    }

    /// Whether `group` is decided here (not following a fleet's leader); `false` for an
    /// unknown group.
    #[must_use]
    pub fn leads(&self, group: &str) -> bool {
        self.groups
            .iter()
            .any(|g| !g.following && g.group.name() == group)
    }

    /// The active action of `group` (`None` for an unknown group or before its first
    /// decision).
    #[must_use]
    pub fn active(&self, group: &str) -> Option<&rules::engine::Active> {
        self.groups
            .iter()
            .find(|g| g.group.name() == group)?
            .group
            .active()
    }

    /// What `group` publishes: its active action at its canary ramp's share (`None` for an
    /// unknown group or before its first decision).
    #[must_use]
    pub fn published(&self, group: &str) -> Option<&Action> {
        self.groups
            .iter()
            .find(|g| g.group.name() == group)?
            .group
            .published()
    }

    /// Starts (`true`) or stops deciding `group` here. A group that starts leading goes on
    /// from the action it follows (its hysteresis and cooldown as [`Driver::follow`] set
    /// them); the caller evaluates it next. Returns whether the group is known.
    pub fn set_leading(&mut self, group: &str, lead: bool) -> bool {
        let Some(g) = self.groups.iter_mut().find(|g| g.group.name() == group) else {
            return false;
        };
        g.following = !lead;
        if !lead {
            g.deadline = None;
        }
        true
    }

    /// Makes `action` the active action of `group`, as a fleet's leader decided it (see
    /// [`Group::follow`]), when every pool it names is in the running config.
    ///
    /// # Errors
    ///
    /// [`DriverError::UnknownGroup`], or the engine's refusal of a malformed action.
    pub fn follow(
        &mut self,
        group: &str,
        action: Action,
        by: By,
        switched_at: Option<Duration>,
        now: Duration,
    ) -> Result<(), DriverError> {
        let i = self.index(group)?;
        self.groups[i].group.follow(action, by, switched_at, now)?;
        Ok(())
    }

    /// Resumes each group from the action `publisher` has in the maps for it (an agent
    /// restart that restored the maps, or a reload), so neither switches by itself: the group
    /// keeps that action until a different candidate holds for `stable_for` (see
    /// [`Group::resume`]). The published action is matched to the rule or default action of
    /// `cfg` that gives the same decision word (a word read back from the maps carries pool
    /// slots and a split, not the configured weights); a group whose published pools are not all
    /// in `cfg` starts fresh. Returns the groups resumed.
    #[expect(
        clippy::similar_names,
        reason = "`published` is the action `publisher` published for the group"
    )]
    pub fn resume(&mut self, cfg: &Config, publisher: &Publisher, now: Duration) -> Vec<String> {
        let mut resumed = Vec::new();
        for g in &mut self.groups {
            let name = g.group.name().to_owned();
            let Some(published) = publisher.groups().get(&name).and_then(|p| p.action.clone())
            else {
                continue;
            };
            let word = publisher.action_word(Some(&published), None);
            let config = g.group.config().clone();
            // With a canary ramp, the maps hold a rule's action at the ramp's share.
            let ramp = g.group.ramp().clone();
            let share = g.group.canary_share();
            let ramped = |a: &Action| match &config.canary {
                Some(c) => c.apply(a, share),
                None => a.clone(),
            };
            let matched = config
                .rules
                .iter()
                .map(|r| &r.action)
                .chain(config.default.iter())
                .find(|a| publisher.action_word(Some(&ramped(a)), None) == word)
                .cloned();
            // What the maps hold, in the config's form when it matched.
            let holds = matched.as_ref().map_or_else(|| published.clone(), &ramped);
            let candidate = matched.unwrap_or(published);
            let known = candidate
                .live_pools()
                .all(|p| cfg.pools.iter().any(|q| q.name == p));
            if !known {
                continue;
            }
            if let Ok(mut group) = Group::resume(config, candidate, now) {
                group.restore_ramp(ramp);
                group.published_as(holds);
                g.group = group;
                resumed.push(name);
            }
        }
        resumed
    }

    /// The first decision of every group not resumed, before the first apply: what each would
    /// adopt now (evaluated on copies; nothing changes).
    #[must_use]
    pub fn initial_actions(&self, view: View<'_>) -> BTreeMap<String, Action> {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.group.active().is_none())
            .filter_map(|(i, g)| {
                let (truths, facts, open) = inputs(&self.rules, i, view);
                let input = Input::new(view.now, &truths, &facts)
                    .automatic(open)
                    .rollback(rollback(&self.rules, i, view));
                let d = g.group.what_if(&input).ok()?;
                Some((g.group.name().to_owned(), d.published?))
            })
            .collect()
    }

    /// Re-evaluates the groups that read any of `changed` (every group if `all`), and those
    /// whose deadline (`stable_for`, cooldown, failback, override TTL) has passed.
    pub fn on_change(
        &mut self,
        changed: &[Slot],
        all: bool,
        view: View<'_>,
        cause: &str,
    ) -> Vec<Decided> {
        let rules = self.rules.clone();
        // A group due only because its deadline passed is evaluated for its timer, whatever
        // change made this evaluation happen: the audit names the timer as its cause.
        let due: Vec<(usize, &str)> = (0..self.groups.len())
            .filter(|&i| !self.groups[i].following)
            .filter_map(|i| {
                let reads = &rules.groups[i].reads;
                if all || changed.iter().any(|s| reads.contains(s)) {
                    Some((i, cause))
                } else if self.groups[i].deadline.is_some_and(|d| d <= view.now) {
                    Some((i, TIMER))
                } else {
                    None
                }
            })
            .collect();
        let mut out = Vec::new();
        for (i, cause) in due {
            match self.evaluate(i, view, cause, Op::Evaluate) {
                Ok(d) => out.push(d),
                Err(e) => log::error!("decision group {}: {e}", self.groups[i].group.name()),
            }
        }
        out
    }

    /// Sets (`Some`) or clears (`None`) the override of `group`.
    ///
    /// # Errors
    ///
    /// [`DriverError`] for an unknown group or an override the engine refuses.
    pub fn set_override(
        &mut self,
        group: &str,
        request: Option<OverrideRequest>,
        view: View<'_>,
        cause: &str,
    ) -> Result<Decided, DriverError> {
        let i = self.index(group)?;
        let op = request.map_or(Op::Clear, Op::Set);
        self.evaluate(i, view, cause, op)
    }

    /// Pauses, resumes or aborts the canary ramp of `group` (`ctl canary`), evaluating it.
    ///
    /// # Errors
    ///
    /// [`DriverError`] for an unknown group, or what the engine refuses (no ramp, a ramp in
    /// the wrong state, an abort without a reason).
    pub fn canary_op(
        &mut self,
        group: &str,
        op: CanaryOp,
        view: View<'_>,
        cause: &str,
    ) -> Result<Decided, DriverError> {
        let i = self.index(group)?;
        self.evaluate(i, view, cause, Op::Canary(op))
    }

    /// The canary ramp of `group` (`ctl canary status`).
    ///
    /// # Errors
    ///
    /// [`DriverError::UnknownGroup`]; [`DriverError::Engine`] with
    /// [`EngineError::NoCanary`] for a group without `canary:`.
    pub fn canary_status(&self, group: &str) -> Result<RampStatus, DriverError> {
        let i = self.index(group)?;
        self.groups[i].group.canary_status().ok_or_else(|| {
            DriverError::Engine(EngineError::NoCanary {
                group: group.into(),
            })
        })
    }

    /// Every ramp, by group in declaration order, for the metrics.
    #[must_use]
    pub fn canaries(&self) -> Vec<(String, RampStatus)> {
        self.groups
            .iter()
            .filter_map(|g| Some((g.group.name().to_owned(), g.group.canary_status()?)))
            .collect()
    }

    /// Takes over the ramps of `old` (the driver of the config before an apply) for each
    /// group whose `canary:` block is the same in both: an apply that does not change it keeps
    /// its ramp where it is; one that changes it (or adds it) starts the ramp over. Call before
    /// [`Driver::resume`], which matches the maps' words at the ramps' shares.
    pub fn carry_ramps(&mut self, old: &Self) {
        for g in &mut self.groups {
            let Some(canary) = g.group.config().canary.clone() else {
                continue;
            };
            let same = old.groups.iter().find(|o| {
                o.group.name() == g.group.name()
                    && o.group.config().canary.as_ref() == Some(&canary)
            });
            if let Some(o) = same {
                g.group.restore_ramp(o.group.ramp().clone());
            }
        }
    }

    pub(crate) fn index(&self, group: &str) -> Result<usize, DriverError> {
        self.groups
            .iter()
            .position(|g| g.group.name() == group)
            .ok_or_else(|| DriverError::UnknownGroup(group.to_owned()))
    }

    pub(super) fn rules(&self) -> &Rules {
        &self.rules
    }

    fn evaluate(
        &mut self,
        i: usize,
        view: View<'_>,
        cause: &str,
        op: Op,
    ) -> Result<Decided, DriverError> {
        let started = Instant::now();
        let rules = self.rules.clone();
        let decision: Decision = {
            let (truths, facts, open) = inputs(&rules, i, view);
            let input = Input::new(view.now, &truths, &facts)
                .automatic(open)
                .cause(cause)
                .rollback(rollback(&rules, i, view));
            let group = &mut self.groups[i].group;
            match op {
                Op::Evaluate => group.evaluate(&input)?,
                Op::Set(request) => group.set_override(request, &input)?,
                Op::Clear => group.clear_override(&input)?,
                Op::Canary(op) => group.canary_op(&op, &input)?,
            }
        };
        self.groups[i].deadline = decision.next_deadline;
        let name = self.groups[i].group.name().to_owned();
        if decision.no_match && decision.vetoed.is_empty() {
            log::warn!(
                "decision group {name}: no rule matches and no default; the active action is kept"
            );
        } else if decision.no_match {
            let vetoed: Vec<String> = decision.vetoed.iter().map(ToString::to_string).collect();
            log::warn!(
                "decision group {name}: `require` vetoes every candidate ({}); the active action \
                 is kept",
                vetoed.join(", ")
            );
        }
        // What the maps get: the switch's published form (a ramp's share applied).
        let switch_to = decision.switched.as_ref().map(|s| s.to.clone());
        let g = &rules.groups[i];
        let records = decision
            .audit
            .into_iter()
            .map(|mut record| {
                let canary =
                    record.kind == AuditKind::Canary || record.switch == Some(SwitchKind::Canary);
                if canary {
                    // A ramp's record: the values `rollback_when` read, next to the ramp's.
                    if let Some(expr) = &g.rollback {
                        record.values.extend(explain_values(expr, view.state));
                    }
                } else if let Some(By::Rule(id)) = &record.by
                    && let Some(pos) = g.config.rules.iter().position(|r| &r.id == id)
                    && let Some(expr) = g.whens.get(pos)
                {
                    record.values = explain_values(expr, view.state);
                }
                record
            })
            .collect();
        Ok(Decided {
            group: name,
            switch_to,
            switched: decision.switched,
            records,
            took: started.elapsed(),
        })
    }

    /// Every override in force, by group, as the request that would set it again at `now`
    /// (the TTL left; `None` for an override that has expired but not yet been evaluated).
    #[must_use]
    pub fn override_requests(&self, now: Duration) -> Vec<(String, OverrideRequest)> {
        self.groups
            .iter()
            .filter_map(|g| {
                let o = g.group.current_override()?;
                let ttl = match o.expires_at {
                    Some(at) if at <= now => return None,
                    Some(at) => Some(at.saturating_sub(now)),
                    None => None,
                };
                Some((
                    g.group.name().to_owned(),
                    OverrideRequest {
                        action: o.action.clone(),
                        reason: o.reason.clone(),
                        ttl,
                        force: o.forced,
                    },
                ))
            })
            .collect()
    }

    /// Active overrides.
    #[must_use]
    pub fn active_overrides(&self) -> usize {
        self.groups
            .iter()
            .filter(|g| g.group.current_override().is_some())
            .count()
    }

    pub(super) fn engine_group(&self, i: usize) -> &Group {
        &self.groups[i].group
    }
}

/// The truths of group `i`'s rules, its facts and its gate over `view`.
pub(super) fn inputs<'a>(
    rules: &'a Rules,
    i: usize,
    view: View<'a>,
) -> (Vec<bool>, HealthFacts<'a>, bool) {
    let g = &rules.groups[i];
    let truths = g.whens.iter().map(|w| w.eval(view.state)).collect();
    let facts = HealthFacts {
        health: view.health,
        require: g.require.as_ref(),
        scratch: RefCell::new(view.state.clone()),
        count: rules.target_count,
        ratio: rules.target_ratio,
    };
    (truths, facts, gate(g.automatic, view.state))
}

/// The value of group `i`'s `rollback_when` over `view` (false without one).
pub(super) fn rollback(rules: &Rules, i: usize, view: View<'_>) -> bool {
    rules.groups[i]
        .rollback
        .as_ref()
        .is_some_and(|r| r.eval(view.state))
}

/// The gate: true without `automatic`; an unset gate reads as open.
pub(super) fn gate(automatic: Option<Slot>, state: &State) -> bool {
    match automatic.map(|s| state.get(s)) {
        Some(Value::Bool(b)) => *b,
        _ => true,
    }
}
