//! A configuration's expressions, compiled once, at the end of validation, into what the state
//! store and the decision driver run: the [`Schema`] of every name, each state variable with its
//! slot (derived ones compiled and in dependency order), and each decision group's compiled
//! `when`s, `require` and gate with the slots it reads.
//!
//! Validation compiles every expression once, to report its problems with file, line and path;
//! the rules are assembled from what it compiled ([`from_checked`]). A failure there is a
//! problem of validation itself, reported like any other config problem; nothing after
//! validation has an error path for the rules.

use std::collections::BTreeSet;

use rules::{Compiled, Schema, Slot, Value, engine::GroupConfig};

use super::{
    model::{Config, PushValue, StateSource},
    schema,
};

/// How a state variable gets its value.
#[derive(Clone, Debug)]
pub enum VarKind {
    /// A `probe:` verdict (starts true).
    Probe,
    /// `push:`, starting at its default.
    Push(Value),
    /// `expr:`, recomputed when a slot it reads changes.
    Expr(Compiled),
    /// `metric:`, a hysteresis over a counter rate (starts false).
    Metric {
        /// The rate's name.
        of: String,
        /// Turns true above this rate (per second) …
        above: f64,
        /// … false below this one …
        below: f64,
        /// … once the rate stayed past the threshold this long.
        hold: std::time::Duration,
    },
}

/// One state variable.
#[derive(Clone, Debug)]
pub struct Var {
    /// Its name.
    pub name: String,
    /// Its slot in the schema.
    pub slot: Slot,
    /// Its source.
    pub kind: VarKind,
}

/// One decision group, compiled.
#[derive(Clone, Debug)]
pub struct Group {
    /// The engine's view of the group: rules with their actions, default, switch policy.
    pub config: GroupConfig,
    /// The engine's group, nothing active yet: what a decision driver starts from.
    pub engine: rules::engine::Group,
    /// Each rule's `when`, in declaration order.
    pub whens: Vec<Compiled>,
    /// `require`.
    pub require: Option<Compiled>,
    /// The slot of `automatic`.
    pub automatic: Option<Slot>,
    /// The canary ramp's `rollback_when`.
    pub rollback: Option<Compiled>,
    /// Every slot whose change can change the group's decision: what its expressions and
    /// gate read, and the pool built-ins of every pool its actions name (pool health feeds
    /// the emergency exit and `require`).
    pub reads: BTreeSet<Slot>,
}

/// Everything compiled of one configuration.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    /// Every name: state variables first, then built-ins.
    pub schema: Schema,
    /// State variables in declaration order.
    pub vars: Vec<Var>,
    /// Indices into `vars` of the derived variables, each after those it reads.
    pub derived_order: Vec<usize>,
    /// Decision groups in declaration order.
    pub groups: Vec<Group>,
    /// `target.healthy_count`, bound per candidate while `require` is evaluated.
    pub target_count: Option<Slot>,
    /// `target.healthy_ratio`, likewise.
    pub target_ratio: Option<Slot>,
}

/// Rules are a function of the rest of the configuration: two configurations that are equal
/// otherwise compile alike.
impl PartialEq for Rules {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Compiles `cfg`'s expressions, for a configuration built without validation (tests).
///
/// # Errors
///
/// A message naming the variable or decision group: a schema that cannot be built
/// ([`schema::build`]), an expression that does not compile, a name missing from the schema,
/// derived variables that depend on each other in a cycle, or a group the engine refuses.
pub fn compile(cfg: &Config) -> Result<Rules, String> {
    let schema = schema::build(cfg).map_err(|e| e.to_string())?;
    let compile = |text: &str| rules::compile(text, &schema).map_err(|e| e.to_string());
    let rules = assemble(cfg, &schema, compile)?;
    Ok(Rules { schema, ..rules })
}

/// The rules of `cfg` from what validation compiled: every expression was compiled once, there,
/// against the schema of the finished configuration.
///
/// # Errors
///
/// As [`compile`], and an expression validation did not compile: each is a problem of
/// validation itself.
pub(crate) fn from_checked(
    cfg: &Config,
    checked: super::validate::Checked,
) -> Result<Rules, String> {
    let super::validate::Checked { schema, exprs } = checked;
    // One text may stand in several places (two rules with the same `when`): each gets a copy.
    let compiled = |text: &str| {
        exprs
            .get(text)
            .cloned()
            .ok_or_else(|| format!("{text:?} was not compiled by validation"))
    };
    let rules = assemble(cfg, &schema, compiled)?;
    Ok(Rules { schema, ..rules })
}

/// `cfg`'s rules over `schema`, each expression's compiled form from `expr` (the returned
/// rules' schema is left empty: the caller moves its own in).
#[expect(
    clippy::too_many_lines,
    reason = "the state variables, then each group's parts in turn: whens, require, gate, \
              rollback_when, the slots it reads, its engine config"
)]
fn assemble(
    cfg: &Config,
    schema: &Schema,
    mut expr: impl FnMut(&str) -> Result<Compiled, String>,
) -> Result<Rules, String> {
    let slot = |name: &str| {
        schema
            .get(name)
            .map(|(s, _)| s)
            .ok_or_else(|| format!("{name} is missing from the schema"))
    };
    let mut vars = Vec::with_capacity(cfg.state.len());
    for v in &cfg.state {
        let kind = match &v.source {
            StateSource::Probe(_) => VarKind::Probe,
            StateSource::Push(value) => VarKind::Push(push_value(value)),
            StateSource::Expr(text) => {
                VarKind::Expr(expr(text).map_err(|e| format!("state {}: {e}", v.name))?)
            }
            StateSource::Metric(m) => VarKind::Metric {
                of: m.of.clone(),
                above: m.above,
                below: m.below,
                hold: m.hold,
            },
        };
        vars.push(Var {
            name: v.name.clone(),
            slot: slot(&v.name)?,
            kind,
        });
    }
    let derived_order = dependency_order(&vars)?;
    let mut groups = Vec::with_capacity(cfg.decisions.len());
    for g in &cfg.decisions {
        let mut compile =
            |text: &str| expr(text).map_err(|e| format!("decision group {}: {e}", g.name));
        let whens = g
            .rules
            .iter()
            .map(|r| compile(&r.when))
            .collect::<Result<Vec<_>, _>>()?;
        let require = g.require.as_deref().map(&mut compile).transpose()?;
        let automatic = g.automatic.as_deref().map(slot).transpose()?;
        let rollback = g
            .canary
            .as_ref()
            .and_then(|c| c.rollback_when.as_deref())
            .map(&mut compile)
            .transpose()?;
        let mut reads: BTreeSet<Slot> = whens
            .iter()
            .chain(require.iter())
            .chain(rollback.iter())
            .flat_map(|w| w.reads().iter().copied())
            .collect();
        reads.extend(automatic);
        let pools: BTreeSet<&str> = g
            .rules
            .iter()
            .flat_map(|r| r.then.live_pools())
            .chain(g.default.iter().flat_map(rules::engine::Action::live_pools))
            .chain(g.canary.iter().map(|c| c.pool.as_str()))
            .collect();
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
                .map(|r| rules::engine::Rule {
                    id: r.id.clone(),
                    priority: r.priority,
                    action: r.then.clone(),
                })
                .collect(),
            default: g.default.clone(),
            policy: rules::engine::SwitchPolicy {
                stable_for: g.switch.stable_for,
                cooldown: g.switch.cooldown,
                failback_after: g.switch.failback_after,
            },
            canary: g.canary.as_ref().map(|c| rules::engine::Canary {
                pool: c.pool.clone(),
                steps: c.steps.clone(),
                hold: c.hold,
                rollback_when: c.rollback_when.clone().unwrap_or_default(),
            }),
        };
        // The engine's own checks (a rule's action, the policy) run here, once.
        let engine = rules::engine::Group::new(config.clone()).map_err(|e| e.to_string())?;
        groups.push(Group {
            config,
            engine,
            whens,
            require,
            automatic,
            rollback,
            reads,
        });
    }
    Ok(Rules {
        target_count: schema.get(schema::TARGET_HEALTHY_COUNT).map(|(s, _)| s),
        target_ratio: schema.get(schema::TARGET_HEALTHY_RATIO).map(|(s, _)| s),
        schema: Schema::default(),
        vars,
        derived_order,
        groups,
    })
}

fn push_value(v: &PushValue) -> Value {
    match v {
        PushValue::Bool(b) => Value::Bool(*b),
        PushValue::Number(n) => Value::Number(*n),
        PushValue::String(s) => Value::String(s.as_str().into()),
    }
}

/// The derived variables ordered so each comes after the derived variables it reads.
fn dependency_order(vars: &[Var]) -> Result<Vec<usize>, String> {
    let derived: Vec<usize> = (0..vars.len())
        .filter(|&i| matches!(vars[i].kind, VarKind::Expr(_)))
        .collect();
    let mut done: Vec<usize> = Vec::new();
    let mut pending = derived.clone();
    while !pending.is_empty() {
        let before = pending.len();
        pending.retain(|&i| {
            let VarKind::Expr(e) = &vars[i].kind else {
                return false;
            };
            let ready = e.reads().iter().all(|r| {
                derived
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
            return Err(format!(
                "derived variables form a cycle: {}",
                names.join(", ")
            ));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_files;

    /// Two rules with the same `when`, a derived variable and `require`: the rules validation
    /// assembled read what a fresh compile reads.
    #[test]
    fn validation_compiles_each_expression_once_and_the_rules_match_a_fresh_compile() {
        let text = r#"services:
  - { name: web, vip: "203.0.113.10", port: 80, protocol: tcp, forward: dsr-l2, to: { decide: g } }
pools:
  - { name: dc1, backends: [ { address: "198.18.1.11" } ] }
  - { name: dc2, backends: [ { address: "198.18.2.11" } ] }
state:
  maint: { push: { default: false } }
  ok: { expr: "NOT maint AND pool.dc1.healthy" }
decisions:
  - name: g
    rules:
      - { id: a, priority: 2, when: "ok", then: { pool: dc1 } }
      - { id: b, priority: 1, when: "ok", then: { pool: dc2 } }
    default: { pool: dc2 }
    require: "target.healthy_count >= 1"
"#;
        let cfg = load_files(&[("g.yaml".into(), text.into())]).expect("config");
        let fresh = compile(&cfg).expect("compile");
        let reads = |r: &Rules| -> Vec<Vec<Slot>> {
            r.groups[0]
                .whens
                .iter()
                .chain(r.groups[0].require.iter())
                .map(|c| c.reads().to_vec())
                .collect()
        };
        assert_eq!(cfg.rules.groups[0].whens.len(), 2);
        assert_eq!(reads(&cfg.rules), reads(&fresh));
        assert_eq!(cfg.rules.groups[0].reads, fresh.groups[0].reads);
        assert_eq!(cfg.rules.derived_order, fresh.derived_order);
    }
}
