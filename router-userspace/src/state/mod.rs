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
    collections::{HashMap, VecDeque},
    net::IpAddr,
    time::Duration,
};

use rules::{Compiled, Schema, Slot, State, Type, Value};

pub use metric::Hysteresis;

use crate::{
    config::{
        Config,
        compiled::VarKind,
        schema::{backend_name, pool_name},
    },
    health::Health,
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
    #[error("{name} is a {ty}; {value:?} is not a {ty} ({})", spellings(*ty))]
    WrongType {
        /// The variable.
        name: String,
        /// Its type.
        ty: Type,
        /// The value given.
        value: String,
    },
}

/// How a value of `ty` is written, for an error that refuses one.
const fn spellings(ty: Type) -> &'static str {
    match ty {
        Type::Bool => "true or false; TRUE and FALSE as in rules",
        Type::Number => "a finite number",
        Type::String => "any text",
    }
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
    /// Pool names, for the built-ins of every pool.
    pools: Vec<String>,
    rtt: HashMap<IpAddr, VecDeque<f64>>,
}

impl Store {
    /// The state of `cfg` over its compiled rules: push variables at their defaults, probe
    /// variables true (healthy, like backends) and metric variables false until their first
    /// result, pool and backend built-ins from `health`, derived variables computed.
    #[must_use]
    pub fn new(cfg: &Config, health: &Health) -> Self {
        let rules = &cfg.rules;
        let vars = rules
            .vars
            .iter()
            .map(|v| Var {
                name: v.name.clone(),
                slot: v.slot,
                kind: match &v.kind {
                    VarKind::Probe => Kind::Probe,
                    VarKind::Push(_) => Kind::Push,
                    VarKind::Expr(e) => Kind::Expr(e.clone()),
                    VarKind::Metric {
                        of,
                        above,
                        below,
                        hold,
                    } => Kind::Metric {
                        of: of.clone(),
                        hysteresis: Hysteresis::new(*above, *below, *hold),
                    },
                },
            })
            .collect();
        let mut store = Self {
            state: State::for_schema(&rules.schema),
            schema: rules.schema.clone(),
            vars,
            expr_order: rules.derived_order.clone(),
            pools: cfg.pools.iter().map(|p| p.name.clone()).collect(),
            rtt: HashMap::new(),
        };
        for v in &rules.vars {
            match &v.kind {
                VarKind::Push(value) => {
                    store.state.set(v.slot, value.clone());
                }
                // A probe starts healthy, as a pool's backends do (keepalived's default): its
                // health state needs `unhealthy_threshold` failures to turn false. Left unset,
                // `NOT probe_var` would read true and fail a group over at every start.
                VarKind::Probe => {
                    store.state.set(v.slot, true);
                }
                // A rate not measured yet is below every threshold.
                VarKind::Metric { .. } => {
                    store.state.set(v.slot, false);
                }
                VarKind::Expr(_) => {}
            }
        }
        let pools = store.pools.clone();
        let mut changed = store.refresh_health(health, &pools);
        store.recompute(&mut changed);
        store
    }

    /// The names and types.
    #[must_use]
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The current values.
    #[must_use]
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The value of `name`.
    #[must_use]
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
    #[must_use]
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
    ///
    /// # Errors
    ///
    /// [`StateError::Unknown`] when `name` is neither a state variable nor a built-in;
    /// [`StateError::WrongType`] when `text` is not a value of its type (a bool is `true` or
    /// `false`, either in lower or upper case; a number must be finite).
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
    ///
    /// # Errors
    ///
    /// Nothing is set when it fails: [`StateError::Unknown`] for a name that is not defined,
    /// [`StateError::NotPush`] for a variable of another source (or a built-in),
    /// [`StateError::WrongType`] for a value not of its type.
    pub fn set_push(&mut self, name: &str, text: &str) -> Result<Vec<Slot>, StateError> {
        self.check_push(name, text)?;
        let (slot, _) = self.lookup(name)?;
        let value = self.parse_value(name, text)?;
        Ok(self.set_and_derive(slot, value))
    }

    /// Whether [`Store::set_push`] would take `text` for `name`; changes nothing.
    ///
    /// # Errors
    ///
    /// As [`Store::set_push`].
    pub fn check_push(&self, name: &str, text: &str) -> Result<(), StateError> {
        self.lookup(name)?;
        let kind = self.source_of(name);
        if kind != "push" {
            return Err(StateError::NotPush {
                name: name.to_owned(),
                kind,
            });
        }
        self.parse_value(name, text)?;
        Ok(())
    }

    /// Takes over from `old` (the store of the configuration being replaced) the values that
    /// do not come from the configuration: pushed values (`ctl state set`) and state probes'
    /// last verdicts, for each variable that keeps its name, source and type. A reload must
    /// not reset `maintenance_mode` or forget that a probe failed.
    pub fn carry_over(&mut self, old: &Store) {
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

    /// The built-ins of `pools` after their backends' health changed in `health`:
    /// `pool.<pool>.*`, and `backend.<address>.healthy` (usable in any pool) of their backends.
    /// Returns the slots that changed, derived variables included. Linear in the backends of
    /// all pools.
    #[expect(
        clippy::cast_precision_loss,
        reason = "backend counts, at most MAX_BACKENDS, as the numbers the rules read"
    )]
    pub fn refresh_health(&mut self, health: &Health, pools: &[String]) -> Vec<Slot> {
        let mut changed = Vec::new();
        if pools.is_empty() {
            return changed;
        }
        let usable = health.usable_addresses();
        for pool in pools {
            let (up, total) = health.counts(pool);
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
            for b in health.pool(pool) {
                let any = usable.contains(&b.address);
                sets.push((backend_name(b.address, "healthy"), Value::Bool(any)));
                let open = health.breaker_open(b.address);
                sets.push((backend_name(b.address, "breaker_open"), Value::Bool(open)));
            }
            for (name, value) in sets {
                if let Some((slot, _)) = self.schema.get(&name)
                    && self.state.set(slot, value)
                {
                    changed.push(slot);
                }
            }
        }
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
    ///
    /// # Errors
    ///
    /// For the first setting of `sets` that is wrong: [`StateError::Unknown`] for a name that
    /// is not defined, [`StateError::WrongType`] for a value not of its type.
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

/// The 99th percentile (nearest rank) of the window, ms.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the rank in a window of at most RTT_WINDOW samples: ceil(len · 0.99) lies in \
              0..=len"
)]
fn p99(window: &VecDeque<f64>) -> f64 {
    let mut v: Vec<f64> = window.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    let rank = ((v.len() as f64) * 0.99).ceil() as usize;
    v.get(rank.saturating_sub(1)).copied().unwrap_or(0.0)
}

#[cfg(test)]
pub(crate) mod tests;
