//! The engine driver: one [`rules::engine::Group`] per decision group, fed from the [`Store`].
//!
//! Truths come from each rule's compiled `when`; [`Facts`] from pool health and the compiled
//! `require` (evaluated with `target.healthy_count`/`target.healthy_ratio` bound to the
//! candidate's pools); the gate from the `automatic` variable. Event-driven: a change of state
//! re-evaluates only the groups whose rules, `require` or gate read a changed slot; the caller
//! sleeps until [`Driver::next_deadline`] for pending switches and expiring overrides. A switch
//! is one decision-word write; its audit record gets the values the winning rule read and the
//! microseconds from the triggering event to the completed write.

mod audit;

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use rules::{
    Compiled, Slot, State, Value,
    engine::{
        Action, AuditLog, AuditRecord, By, Decision, EngineError, Explanation, Facts, Group,
        GroupConfig, Input, OverrideRequest, Rule, SwitchPolicy,
    },
};
use serde::Serialize;

pub use audit::AuditFile;

use crate::{
    config::{Config, schema},
    dataplane::Dataplane,
    publish::{PublishError, Publisher},
    state::Store,
};

/// Audit records kept in memory.
pub const AUDIT_CAPACITY: usize = 1024;

/// Why a driver operation failed; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// No such group.
    #[error("no decision group {0:?}")]
    UnknownGroup(String),
    /// The engine refused (override vetoed, missing reason, …).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// An expression of the config did not compile.
    #[error("decision group {group}: {message}")]
    Compile {
        /// The group.
        group: String,
        /// What failed.
        message: String,
    },
    /// The map write failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// A what-if value is invalid.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
}

struct Compiledgroup {
    group: Group,
    whens: Vec<Compiled>,
    require: Option<Compiled>,
    automatic: Option<Slot>,
    reads: BTreeSet<Slot>,
    deadline: Option<Duration>,
}

/// Pool health and `require`, for one evaluation.
struct StoreFacts<'a> {
    publisher: &'a Publisher,
    require: Option<&'a Compiled>,
    scratch: RefCell<State>,
    count: Option<Slot>,
    ratio: Option<Slot>,
}

impl Facts for StoreFacts<'_> {
    fn passes_require(&self, action: &Action) -> bool {
        let Some(require) = self.require else {
            return true;
        };
        let (mut up, mut total) = (0usize, 0usize);
        for p in action.live_pools() {
            if let Some(pool) = self.publisher.pools().get(p) {
                up += pool.healthy_count();
                total += pool.backends.len();
            }
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
        self.publisher
            .pools()
            .get(pool)
            .is_some_and(|p| p.healthy_count() > 0)
    }
}

fn facts<'a>(
    require: Option<&'a Compiled>,
    (count, ratio): (Option<Slot>, Option<Slot>),
    state: &State,
    publisher: &'a Publisher,
) -> StoreFacts<'a> {
    StoreFacts {
        publisher,
        require,
        scratch: RefCell::new(state.clone()),
        count,
        ratio,
    }
}

/// One switch the driver published.
#[derive(Clone, Debug, Serialize)]
pub struct Published {
    /// The group.
    pub group: String,
    /// The new action.
    pub to: Action,
    /// The word written.
    pub word: u64,
    /// Event to completed write, µs.
    pub latency_us: u64,
}

/// A group's explanation with the values each expression read.
#[derive(Clone, Debug, Serialize)]
pub struct GroupExplanation {
    /// The engine's explanation.
    pub explanation: Explanation,
    /// For each rule (declaration order): id, expression, values read.
    pub conditions: Vec<Condition>,
    /// The text form.
    pub text: String,
}

/// One rule's expression and the values it read.
#[derive(Clone, Debug, Serialize)]
pub struct Condition {
    /// Rule id (or `require`, `automatic`).
    pub id: String,
    /// Its expression.
    pub expr: String,
    /// `name = value` of every variable it reads.
    pub values: BTreeMap<String, String>,
    /// Its truth value.
    pub truth: bool,
}

/// Every decision group of a config, its switching state and the audit trail.
pub struct Driver {
    groups: Vec<Compiledgroup>,
    count: Option<Slot>,
    ratio: Option<Slot>,
    /// The in-memory audit ring.
    pub audit: AuditLog,
    file: Option<AuditFile>,
    /// Evaluation time of the last evaluations, for metrics: (group, seconds).
    pub evaluations: Vec<(String, f64)>,
}

fn explain_values(expr: &Compiled, state: &State) -> BTreeMap<String, String> {
    expr.explain(state)
        .values
        .iter()
        .map(|r| (r.name.to_owned(), r.value.to_string()))
        .collect()
}

impl Driver {
    /// The groups of `cfg` over `store`'s schema, nothing active yet; `file` receives audit
    /// lines (and seeds the ring with the records a previous run left there).
    pub fn new(cfg: &Config, store: &Store, file: Option<AuditFile>) -> Result<Self, DriverError> {
        let schema = store.schema();
        let mut groups = Vec::new();
        for g in &cfg.decisions {
            let compile = |text: &str| {
                rules::compile(text, schema).map_err(|e| DriverError::Compile {
                    group: g.name.clone(),
                    message: format!("{text}: {e}"),
                })
            };
            let whens = g
                .rules
                .iter()
                .map(|r| compile(&r.when))
                .collect::<Result<Vec<_>, _>>()?;
            let require = g.require.as_deref().map(compile).transpose()?;
            let automatic =
                match &g.automatic {
                    Some(name) => Some(schema.get(name).map(|(s, _)| s).ok_or_else(|| {
                        DriverError::Compile {
                            group: g.name.clone(),
                            message: format!("unknown automatic variable {name}"),
                        }
                    })?),
                    None => None,
                };
            let mut reads: BTreeSet<Slot> = whens
                .iter()
                .flat_map(|w| w.reads().iter().copied())
                .collect();
            reads.extend(require.iter().flat_map(|r| r.reads().iter().copied()));
            reads.extend(automatic);
            // Pool health feeds the emergency exit and require: any pool built-in of the
            // group's pools is an input.
            let mut pools: BTreeSet<&str> =
                g.rules.iter().flat_map(|r| r.then.live_pools()).collect();
            pools.extend(g.default.iter().flat_map(Action::live_pools));
            for p in pools {
                for what in ["healthy", "healthy_count"] {
                    if let Some((s, _)) = schema.get(&schema::pool_name(p, what)) {
                        reads.insert(s);
                    }
                }
            }
            let config = GroupConfig {
                name: g.name.clone(),
                rules: g
                    .rules
                    .iter()
                    .map(|r| Rule {
                        id: r.id.clone(),
                        priority: r.priority,
                        action: r.then.clone(),
                    })
                    .collect(),
                default: g.default.clone(),
                policy: SwitchPolicy {
                    stable_for: g.switch.stable_for,
                    cooldown: g.switch.cooldown,
                    failback_after: g.switch.failback_after,
                },
            };
            groups.push(Compiledgroup {
                group: Group::new(config)?,
                whens,
                require,
                automatic,
                reads,
                deadline: None,
            });
        }
        let mut audit = AuditLog::new(AUDIT_CAPACITY);
        if let Some(f) = &file {
            for r in f.read_tail(AUDIT_CAPACITY) {
                audit.push(r);
            }
        }
        Ok(Self {
            groups,
            count: schema.get(schema::TARGET_HEALTHY_COUNT).map(|(s, _)| s),
            ratio: schema.get(schema::TARGET_HEALTHY_RATIO).map(|(s, _)| s),
            audit,
            file,
            evaluations: Vec::new(),
        })
    }

    /// Group names.
    pub fn group_names(&self) -> impl Iterator<Item = &str> {
        self.groups.iter().map(|g| g.group.name())
    }

    /// The engine state of `name`.
    pub fn group(&self, name: &str) -> Option<&Group> {
        self.groups
            .iter()
            .find(|g| g.group.name() == name)
            .map(|g| &g.group)
    }

    /// The earliest pending deadline of any group.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.groups.iter().filter_map(|g| g.deadline).min()
    }

    /// Resumes each group from the action `publisher` has in the maps for it (an agent
    /// restart that restored the maps, or a reload), so neither switches by itself: the group
    /// keeps that action until a different candidate holds for `stable_for` (see
    /// [`Group::resume`]). The published action is matched to the rule or default action of
    /// `cfg` that gives the same decision word (a word read back from the maps carries pool
    /// slots and a split, not the configured weights); a group whose published pools are not all
    /// in `cfg` starts fresh. Returns the groups resumed.
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
            let candidate = config
                .rules
                .iter()
                .map(|r| &r.action)
                .chain(config.default.iter())
                .find(|a| publisher.action_word(Some(a), None) == word)
                .cloned()
                .unwrap_or(published);
            let known = candidate
                .live_pools()
                .all(|p| cfg.pools.iter().any(|q| q.name == p));
            if !known {
                continue;
            }
            if let Ok(group) = Group::resume(config, candidate, now) {
                g.group = group;
                resumed.push(name);
            }
        }
        resumed
    }

    /// The first decision of every group not resumed, before the first apply: what each would
    /// adopt now (evaluated on copies; nothing changes).
    pub fn initial_actions(
        &self,
        store: &Store,
        publisher: &Publisher,
        now: Duration,
    ) -> BTreeMap<String, Action> {
        self.groups
            .iter()
            .filter(|g| g.group.active().is_none())
            .filter_map(|g| {
                let truths: Vec<bool> = g.whens.iter().map(|w| w.eval(store.state())).collect();
                let facts = self.facts(g, store.state(), publisher);
                let input = Input::new(now, &truths, &facts).automatic(gate(g, store.state()));
                let d = g.group.what_if(&input).ok()?;
                Some((g.group.name().to_owned(), d.active?.action))
            })
            .collect()
    }

    fn facts<'a>(
        &self,
        g: &'a Compiledgroup,
        state: &State,
        publisher: &'a Publisher,
    ) -> StoreFacts<'a> {
        facts(
            g.require.as_ref(),
            (self.count, self.ratio),
            state,
            publisher,
        )
    }

    /// Re-evaluates the groups that read any of `changed` (all groups if `changed` is empty and
    /// `all`), publishing every switch. `event` is when the triggering event happened.
    #[allow(clippy::too_many_arguments)]
    pub fn on_change(
        &mut self,
        changed: &[Slot],
        all: bool,
        store: &Store,
        publisher: &mut Publisher,
        dp: &mut dyn Dataplane,
        now: Duration,
        cause: &str,
        event: Instant,
    ) -> Vec<Published> {
        let due: Vec<usize> = (0..self.groups.len())
            .filter(|&i| {
                let g = &self.groups[i];
                all || changed.iter().any(|s| g.reads.contains(s))
                    || g.deadline.is_some_and(|d| d <= now)
            })
            .collect();
        let mut out = Vec::new();
        for i in due {
            match self.evaluate(i, store, publisher, dp, now, cause, event, None) {
                Ok(Some(p)) => out.push(p),
                Ok(None) => {}
                Err(e) => log::error!("decision group {}: {e}", self.groups[i].group.name()),
            }
        }
        out
    }

    /// Evaluates the groups whose deadline has passed.
    pub fn on_timer(
        &mut self,
        store: &Store,
        publisher: &mut Publisher,
        dp: &mut dyn Dataplane,
        now: Duration,
    ) -> Vec<Published> {
        self.on_change(
            &[],
            false,
            store,
            publisher,
            dp,
            now,
            "timer",
            Instant::now(),
        )
    }

    /// Sets (`Some`) or clears (`None`) the override of `group`, publishing at once.
    #[allow(clippy::too_many_arguments)]
    pub fn set_override(
        &mut self,
        group: &str,
        request: Option<OverrideRequest>,
        store: &Store,
        publisher: &mut Publisher,
        dp: &mut dyn Dataplane,
        now: Duration,
        cause: &str,
    ) -> Result<Option<Published>, DriverError> {
        let i = self.index(group)?;
        let op = Some(request.ok_or(()));
        self.evaluate(i, store, publisher, dp, now, cause, Instant::now(), op)
    }

    fn index(&self, group: &str) -> Result<usize, DriverError> {
        self.groups
            .iter()
            .position(|g| g.group.name() == group)
            .ok_or_else(|| DriverError::UnknownGroup(group.to_owned()))
    }

    #[allow(clippy::too_many_arguments)]
    fn evaluate(
        &mut self,
        i: usize,
        store: &Store,
        publisher: &mut Publisher,
        dp: &mut dyn Dataplane,
        now: Duration,
        cause: &str,
        event: Instant,
        op: Option<Result<OverrideRequest, ()>>,
    ) -> Result<Option<Published>, DriverError> {
        let started = Instant::now();
        let state = store.state();
        let targets = (self.count, self.ratio);
        let g = &mut self.groups[i];
        let truths: Vec<bool> = g.whens.iter().map(|w| w.eval(state)).collect();
        let open = gate(g, state);
        let facts = facts(g.require.as_ref(), targets, state, publisher);
        let input = Input::new(now, &truths, &facts)
            .automatic(open)
            .cause(cause);
        let decision: Decision = match op {
            None => g.group.evaluate(&input)?,
            Some(Ok(request)) => g.group.set_override(request, &input)?,
            Some(Err(())) => g.group.clear_override(&input)?,
        };
        drop(facts);
        g.deadline = decision.next_deadline;
        let name = g.group.name().to_owned();
        self.evaluations
            .push((name.clone(), started.elapsed().as_secs_f64()));
        if decision.no_match {
            log::warn!(
                "decision group {name}: no rule matches and no default; the active action is kept"
            );
        }
        let mut published = None;
        if let (Some(switch), Some(active)) = (&decision.switched, &decision.active) {
            let written = publisher.publish_decision(dp, &name, &active.action)?;
            let latency_us = u64::try_from(event.elapsed().as_micros()).unwrap_or(u64::MAX);
            log::info!(
                "decision group {name}: {} → {} ({}, {:?}; cause {}) written in {latency_us} µs",
                switch
                    .from
                    .as_ref()
                    .map_or("nothing".to_owned(), ToString::to_string),
                switch.to,
                switch.by,
                switch.kind,
                switch.cause
            );
            published = written.map(|word| Published {
                group: name.clone(),
                to: active.action.clone(),
                word,
                latency_us,
            });
        }
        let g = &self.groups[i];
        let mut records = Vec::new();
        for mut record in decision.audit {
            if record.kind == rules::engine::AuditKind::Switch {
                record.latency_us = published.as_ref().map(|p| p.latency_us);
            }
            if let Some(By::Rule(id)) = &record.by
                && let Some(pos) = g.group.config().rules.iter().position(|r| &r.id == id)
                && let Some(expr) = g.whens.get(pos)
            {
                record.values = explain_values(expr, state);
            }
            records.push(record);
        }
        for record in records {
            self.record(record);
        }
        Ok(published)
    }

    fn record(&mut self, mut record: AuditRecord) {
        record.at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let seq = self.audit.push(record);
        if let (Some(f), Some(r)) = (&mut self.file, self.audit.get(seq)) {
            f.append(r);
        }
    }

    /// Explains `group` over `state` (the live one, or a what-if copy) at `now`; changes nothing.
    pub fn explain(
        &self,
        group: &str,
        state: &State,
        publisher: &Publisher,
        now: Duration,
    ) -> Result<GroupExplanation, DriverError> {
        let g = &self.groups[self.index(group)?];
        let truths: Vec<bool> = g.whens.iter().map(|w| w.eval(state)).collect();
        let facts = self.facts(g, state, publisher);
        let input = Input::new(now, &truths, &facts).automatic(gate(g, state));
        let explanation = g.group.explain(&input)?;
        let mut conditions: Vec<Condition> = g
            .group
            .config()
            .rules
            .iter()
            .zip(&g.whens)
            .map(|(r, w)| Condition {
                id: r.id.clone(),
                expr: w.source().to_owned(),
                values: explain_values(w, state),
                truth: w.eval(state),
            })
            .collect();
        if let Some(slot) = g.automatic {
            let name = store_name(g, slot, state);
            conditions.push(Condition {
                id: "automatic".into(),
                expr: name.0.clone(),
                values: BTreeMap::from([name]),
                truth: gate(g, state),
            });
        }
        let mut text = explanation.to_string();
        for c in &conditions {
            let values: Vec<String> = c.values.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            text.push_str(&format!(
                "  {}: {} → {} ({})\n",
                c.id,
                c.expr,
                c.truth,
                values.join(", ")
            ));
        }
        Ok(GroupExplanation {
            explanation,
            conditions,
            text,
        })
    }

    /// Every override in force, by group, as the request that would set it again at `now`
    /// (the TTL left; `None` for an override that has expired but not yet been evaluated).
    pub fn override_requests(&self, now: Duration) -> Vec<(String, OverrideRequest)> {
        self.groups
            .iter()
            .filter_map(|g| {
                let o = g.group.current_override()?;
                let ttl = match o.expires_at {
                    Some(at) if at <= now => return None,
                    Some(at) => Some(at - now),
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
    pub fn active_overrides(&self) -> usize {
        self.groups
            .iter()
            .filter(|g| g.group.current_override().is_some())
            .count()
    }
}

fn store_name(g: &Compiledgroup, slot: Slot, state: &State) -> (String, String) {
    let name = g
        .whens
        .iter()
        .chain(g.require.iter())
        .flat_map(|w| w.read_names())
        .find(|(_, s)| *s == slot)
        .map_or_else(|| format!("slot {}", slot.index()), |(n, _)| n.to_owned());
    (name, state.get(slot).to_string())
}

/// The gate: true without `automatic`; an unset gate reads as open.
fn gate(g: &Compiledgroup, state: &State) -> bool {
    match g.automatic.map(|s| state.get(s)) {
        Some(Value::Bool(b)) => *b,
        _ => true,
    }
}

#[cfg(test)]
mod tests;
