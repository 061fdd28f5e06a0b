//! The live state: every `state:` variable and built-in of `config::schema::build(&cfg)` in one
//! [`rules::State`], and the rules that keep it current.
//!
//! The [`Store`] is a pure core: each input (a pushed value, a probe verdict, a backend's health
//! or probe latency, a sample of counter rates) is a method call that takes `now` where time
//! matters and returns the slots whose value really changed — derived (`expr`) variables
//! included, recomputed in dependency order. Only those are events for the engine driver. The
//! thin tokio shell (probe tasks, the one-second counter sampler) lives in `agent`.

mod metric;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::IpAddr,
    time::Duration,
};

use rules::{Compiled, Schema, Slot, State, Type, Value};

pub use metric::Hysteresis;

use crate::config::{
    Config,
    model::{PushValue, StateSource},
    schema::{self, backend_name, pool_name},
};

/// Probe latencies kept per backend for `backend.<address>.rtt_p99_ms`.
pub const RTT_WINDOW: usize = 64;

/// Why a state operation was refused; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The name is neither a state variable nor a built-in.
    #[error("unknown state variable {name:?}{}", hint.as_ref().map(|h| format!("; did you mean {h:?}?")).unwrap_or_default())]
    Unknown {
        /// The name given.
        name: String,
        /// The nearest known name.
        hint: Option<String>,
    },
    /// `set` on a variable that is not `push`.
    #[error("{name} is a {kind} variable; only push variables can be set")]
    NotPush {
        /// The variable.
        name: String,
        /// Its source: probe, expr, metric or built-in.
        kind: &'static str,
    },
    /// The value does not parse as the variable's type.
    #[error("{name} is a {ty}; {value:?} is not a {ty}")]
    WrongType {
        /// The variable.
        name: String,
        /// Its type.
        ty: Type,
        /// The value given.
        value: String,
    },
    /// The configuration's names or expressions do not compile (validation should have caught it).
    #[error("state: {0}")]
    Config(String),
}

#[derive(Clone, Debug)]
enum Kind {
    Probe,
    Push,
    Expr(Compiled),
    Metric { of: String, hysteresis: Hysteresis },
}

#[derive(Clone, Debug)]
struct Var {
    name: String,
    slot: Slot,
    kind: Kind,
}

/// The live state of one configuration.
#[derive(Clone, Debug)]
pub struct Store {
    schema: Schema,
    state: State,
    vars: Vec<Var>,
    /// Indices into `vars` of the `expr` variables, in dependency order.
    expr_order: Vec<usize>,
    /// Backends of each pool, with their health.
    pools: BTreeMap<String, Vec<(IpAddr, bool)>>,
    rtt: HashMap<IpAddr, VecDeque<f64>>,
}

impl Store {
    /// The state of `cfg`: push variables at their defaults, every backend healthy (as the
    /// publisher starts them), probe variables true (healthy, like backends) and metric
    /// variables false until their first result,
    /// derived variables computed.
    pub fn new(cfg: &Config) -> Result<Self, StateError> {
        let schema = schema::build(cfg).map_err(|e| StateError::Config(e.to_string()))?;
        let mut vars = Vec::new();
        for v in &cfg.state {
            let (slot, _) = schema
                .get(&v.name)
                .ok_or_else(|| StateError::Config(format!("{} missing from schema", v.name)))?;
            let kind = match &v.source {
                StateSource::Probe(_) => Kind::Probe,
                StateSource::Push(_) => Kind::Push,
                StateSource::Expr(text) => Kind::Expr(
                    rules::compile(text, &schema)
                        .map_err(|e| StateError::Config(format!("{}: {e}", v.name)))?,
                ),
                StateSource::Metric(m) => Kind::Metric {
                    of: m.of.clone(),
                    hysteresis: Hysteresis::new(m.above, m.below, m.hold),
                },
            };
            vars.push(Var {
                name: v.name.clone(),
                slot,
                kind,
            });
        }
        let expr_order = dependency_order(&vars)?;
        let pools = cfg
            .pools
            .iter()
            .map(|p| {
                let backends = p.backends.iter().map(|b| (b.address, true)).collect();
                (p.name.clone(), backends)
            })
            .collect();
        let mut store = Self {
            state: State::for_schema(&schema),
            schema,
            vars,
            expr_order,
            pools,
            rtt: HashMap::new(),
        };
        for v in &cfg.state {
            let Some((slot, _)) = store.schema.get(&v.name) else {
                continue;
            };
            match &v.source {
                StateSource::Push(value) => {
                    store.state.set(slot, push_value(value));
                }
                // A probe starts healthy, as a pool's backends do (keepalived's default): its
                // health state needs `unhealthy_threshold` failures to turn false. Left unset,
                // `NOT probe_var` would read true and fail a group over at every start.
                StateSource::Probe(_) => {
                    store.state.set(slot, true);
                }
                // A rate not measured yet is below every threshold.
                StateSource::Metric(_) => {
                    store.state.set(slot, false);
                }
                StateSource::Expr(_) => {}
            }
        }
        let names: Vec<String> = store.pools.keys().cloned().collect();
        let mut changed = Vec::new();
        for p in names {
            store.pool_builtins(&p, None, &mut changed);
        }
        store.recompute(&mut changed);
        Ok(store)
    }

    /// The names and types.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The current values.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.schema.get(name).map(|(slot, _)| self.state.get(slot))
    }

    /// Every name (state variables first, then built-ins) with its value.
    pub fn values(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.schema
            .iter()
            .map(|(name, slot, _)| (name, self.state.get(slot)))
    }

    /// The source of a state variable (`probe`, `push`, `expr`, `metric`), or `built-in`.
    pub fn source_of(&self, name: &str) -> &'static str {
        match self.vars.iter().find(|v| v.name == name).map(|v| &v.kind) {
            Some(Kind::Probe) => "probe",
            Some(Kind::Push) => "push",
            Some(Kind::Expr(_)) => "expr",
            Some(Kind::Metric { .. }) => "metric",
            None => "built-in",
        }
    }

    /// Parses `text` as a value of `name`'s type: `true`/`false`, a number, or a string (quotes
    /// optional).
    pub fn parse_value(&self, name: &str, text: &str) -> Result<Value, StateError> {
        let (_, ty) = self.lookup(name)?;
        let wrong = || StateError::WrongType {
            name: name.to_owned(),
            ty,
            value: text.to_owned(),
        };
        match ty {
            Type::Bool => match text.trim() {
                "true" | "TRUE" => Ok(Value::Bool(true)),
                "false" | "FALSE" => Ok(Value::Bool(false)),
                _ => Err(wrong()),
            },
            Type::Number => text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .map(Value::Number)
                .ok_or_else(wrong),
            Type::String => {
                let t = text.trim();
                let unquoted = t
                    .strip_prefix('"')
                    .and_then(|s| s.strip_suffix('"'))
                    .unwrap_or(t);
                Ok(Value::String(unquoted.into()))
            }
        }
    }

    /// `state set NAME=VALUE`: only push variables, only values of their type. Returns the
    /// slots that changed (none if the value is the same).
    pub fn set_push(&mut self, name: &str, text: &str) -> Result<Vec<Slot>, StateError> {
        let (slot, _) = self.lookup(name)?;
        let kind = self.source_of(name);
        if kind != "push" {
            return Err(StateError::NotPush {
                name: name.to_owned(),
                kind,
            });
        }
        let value = self.parse_value(name, text)?;
        Ok(self.set_and_derive(slot, value))
    }

    /// Takes over from `old` (the store of the config being replaced) the values that do not
    /// come from the config: pushed values (`ctl state set`) and state probes' last verdicts,
    /// for each variable that keeps its name, source and type; and the backend health the
    /// publisher has, for the pools of `cfg` that stay and still have a health check (a pool
    /// without one has every backend up, as the publisher makes it). A reload must not reset
    /// `maintenance_mode` or forget that a probe failed.
    pub fn carry_over(
        &mut self,
        old: &Store,
        publisher: &crate::publish::Publisher,
        cfg: &crate::config::Config,
    ) {
        let kept: Vec<(Slot, Value)> = self
            .vars
            .iter()
            .filter(|v| matches!(v.kind, Kind::Push | Kind::Probe))
            .filter_map(|v| {
                let before = old.vars.iter().find(|o| o.name == v.name)?;
                let same_source =
                    std::mem::discriminant(&before.kind) == std::mem::discriminant(&v.kind);
                let (_, ty) = self.schema.get(&v.name)?;
                let (_, old_ty) = old.schema.get(&v.name)?;
                let value = old.state.get(before.slot);
                (same_source && ty == old_ty && *value != Value::Unset)
                    .then(|| (v.slot, value.clone()))
            })
            .collect();
        for (slot, value) in kept {
            self.set_and_derive(slot, value);
        }
        let checked = |pool: &str| {
            cfg.pools
                .iter()
                .any(|p| p.name == pool && p.health_check.is_some())
        };
        // A backend is healthy to the rules when it takes new flows: it passes its check (a
        // pool without one has none to fail) and its next hop is resolved.
        for (pool, state) in publisher.pools() {
            for b in &state.backends {
                if !b.reachable || (!b.healthy && checked(pool)) {
                    self.set_backend_health(pool, b.address, false);
                }
            }
        }
    }

    /// A state probe's verdict. Unknown or non-probe names are ignored.
    pub fn set_probe(&mut self, name: &str, healthy: bool) -> Vec<Slot> {
        match self.vars.iter().find(|v| v.name == name) {
            Some(Var {
                slot,
                kind: Kind::Probe,
                ..
            }) => {
                let slot = *slot;
                self.set_and_derive(slot, Value::Bool(healthy))
            }
            _ => Vec::new(),
        }
    }

    /// A backend's health in `pool` (as the publisher has it): updates `pool.<pool>.*` and
    /// `backend.<address>.healthy` (healthy in any pool).
    pub fn set_backend_health(&mut self, pool: &str, address: IpAddr, healthy: bool) -> Vec<Slot> {
        let Some(backends) = self.pools.get_mut(pool) else {
            return Vec::new();
        };
        let Some(b) = backends.iter_mut().find(|(a, _)| *a == address) else {
            return Vec::new();
        };
        if b.1 == healthy {
            return Vec::new();
        }
        b.1 = healthy;
        let mut changed = Vec::new();
        self.pool_builtins(pool, Some(address), &mut changed);
        self.recompute(&mut changed);
        changed
    }

    /// One probe latency of a backend: `backend.<address>.rtt_p99_ms` over the last
    /// [`RTT_WINDOW`] probes.
    pub fn record_rtt(&mut self, address: IpAddr, latency: Duration) -> Vec<Slot> {
        let window = self.rtt.entry(address).or_default();
        if window.len() == RTT_WINDOW {
            window.pop_front();
        }
        window.push_back(latency.as_secs_f64() * 1000.0);
        let p99 = p99(window);
        match self.schema.get(&backend_name(address, "rtt_p99_ms")) {
            Some((slot, _)) => self.set_and_derive(slot, Value::Number(p99)),
            None => Vec::new(),
        }
    }

    /// One sample of counter rates (per second) by name (`service.web.packets_per_second`,
    /// `backend.198.18.1.11.packets_per_second`) at `now`: sets the built-ins the schema has
    /// and steps every metric variable's hysteresis.
    pub fn observe_rates(&mut self, now: Duration, rates: &HashMap<String, f64>) -> Vec<Slot> {
        let mut changed = Vec::new();
        for (name, rate) in rates {
            if let Some((slot, Type::Number)) = self.schema.get(name)
                && self.state.set(slot, *rate)
            {
                changed.push(slot);
            }
        }
        for v in &mut self.vars {
            if let Kind::Metric { of, hysteresis } = &mut v.kind {
                let Some(rate) = rates.get(of.as_str()) else {
                    continue;
                };
                let value = hysteresis.observe(now, *rate);
                if self.state.set(v.slot, value) {
                    changed.push(v.slot);
                }
            }
        }
        self.recompute(&mut changed);
        changed
    }

    /// A copy of the state with `sets` applied (any variable, typed) and derived variables
    /// recomputed: for what-if. Changes nothing.
    pub fn hypothetical(&self, sets: &[(String, String)]) -> Result<State, StateError> {
        let mut copy = self.clone();
        let mut changed = Vec::new();
        for (name, text) in sets {
            let value = self.parse_value(name, text)?;
            let (slot, _) = self.lookup(name)?;
            if copy.state.set(slot, value) {
                changed.push(slot);
            }
        }
        // A hypothetical value of a derived variable wins over its expression.
        let pinned: Vec<Slot> = changed.clone();
        copy.recompute_except(&mut changed, &pinned);
        Ok(copy.state)
    }

    fn lookup(&self, name: &str) -> Result<(Slot, Type), StateError> {
        self.schema.get(name).ok_or_else(|| StateError::Unknown {
            name: name.to_owned(),
            hint: self.schema.closest(name).map(str::to_owned),
        })
    }

    fn set_and_derive(&mut self, slot: Slot, value: Value) -> Vec<Slot> {
        let mut changed = Vec::new();
        if self.state.set(slot, value) {
            changed.push(slot);
            self.recompute(&mut changed);
        }
        changed
    }

    /// Recomputes `pool.<pool>.*` and `backend.<address>.healthy` of `only` (one backend whose
    /// health changed) or of every backend of the pool (`None`).
    fn pool_builtins(&mut self, pool: &str, only: Option<IpAddr>, changed: &mut Vec<Slot>) {
        let Some(backends) = self.pools.get(pool) else {
            return;
        };
        let total = backends.len();
        let up = backends.iter().filter(|(_, h)| *h).count();
        let ratio = if total == 0 {
            0.0
        } else {
            up as f64 / total as f64
        };
        let mut sets = vec![
            (pool_name(pool, "healthy"), Value::Bool(up > 0)),
            (pool_name(pool, "healthy_count"), Value::Number(up as f64)),
            (pool_name(pool, "healthy_ratio"), Value::Number(ratio)),
        ];
        // `backend.A.healthy` is "healthy in any pool". One backend changed: scan for it alone
        // (one pass over all backends). Every backend (the first state): one set of the
        // healthy addresses, so building a store stays linear in backends (it was quadratic:
        // 20 ms at 5,000 backends).
        match only {
            Some(address) => {
                let any = self
                    .pools
                    .values()
                    .flatten()
                    .any(|(a, h)| *a == address && *h);
                sets.push((backend_name(address, "healthy"), Value::Bool(any)));
            }
            None => {
                let healthy: std::collections::HashSet<IpAddr> = self
                    .pools
                    .values()
                    .flatten()
                    .filter(|(_, h)| *h)
                    .map(|(a, _)| *a)
                    .collect();
                for (address, _) in backends {
                    let any = healthy.contains(address);
                    sets.push((backend_name(*address, "healthy"), Value::Bool(any)));
                }
            }
        }
        for (name, value) in sets {
            if let Some((slot, _)) = self.schema.get(&name)
                && self.state.set(slot, value)
            {
                changed.push(slot);
            }
        }
    }

    /// Recomputes, in dependency order, every derived variable that reads a changed slot,
    /// appending those whose value changed.
    fn recompute(&mut self, changed: &mut Vec<Slot>) {
        self.recompute_except(changed, &[]);
    }

    fn recompute_except(&mut self, changed: &mut Vec<Slot>, pinned: &[Slot]) {
        for &i in &self.expr_order {
            let Some(Var {
                slot,
                kind: Kind::Expr(expr),
                ..
            }) = self.vars.get(i)
            else {
                continue;
            };
            if pinned.contains(slot) {
                continue;
            }
            // Before anything changed (start), every derived variable is computed.
            let stale = self.state.get(*slot).is_unset()
                || expr.reads().iter().any(|r| changed.contains(r));
            if stale {
                let value = expr.eval(&self.state);
                if self.state.set(*slot, value) {
                    changed.push(*slot);
                }
            }
        }
    }
}

fn push_value(v: &PushValue) -> Value {
    match v {
        PushValue::Bool(b) => Value::Bool(*b),
        PushValue::Number(n) => Value::Number(*n),
        PushValue::String(s) => Value::String(s.as_str().into()),
    }
}

/// The `expr` variables ordered so each comes after the variables it reads.
fn dependency_order(vars: &[Var]) -> Result<Vec<usize>, StateError> {
    let exprs: Vec<usize> = (0..vars.len())
        .filter(|&i| matches!(vars[i].kind, Kind::Expr(_)))
        .collect();
    let mut done: Vec<usize> = Vec::new();
    let mut pending = exprs.clone();
    while !pending.is_empty() {
        let before = pending.len();
        pending.retain(|&i| {
            let Kind::Expr(e) = &vars[i].kind else {
                return false;
            };
            let ready = e.reads().iter().all(|r| {
                exprs
                    .iter()
                    .filter(|&&j| vars[j].slot == *r)
                    .all(|j| done.contains(j))
            });
            if ready {
                done.push(i);
            }
            !ready
        });
        if pending.len() == before {
            let names: Vec<&str> = pending.iter().map(|&i| vars[i].name.as_str()).collect();
            return Err(StateError::Config(format!(
                "derived variables form a cycle: {}",
                names.join(", ")
            )));
        }
    }
    Ok(done)
}

/// The 99th percentile (nearest rank) of the window, ms.
fn p99(window: &VecDeque<f64>) -> f64 {
    let mut v: Vec<f64> = window.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    let rank = ((v.len() as f64) * 0.99).ceil() as usize;
    v.get(rank.saturating_sub(1)).copied().unwrap_or(0.0)
}

#[cfg(test)]
pub(crate) mod tests;
