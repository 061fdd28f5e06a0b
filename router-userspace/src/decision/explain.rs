//! `ctl explain` and `ctl what-if`: a group's explanation with the values each expression read.

use std::{collections::BTreeMap, fmt::Write as _};

use rules::{
    Slot, State,
    engine::{Explanation, Input},
};
use serde::Serialize;

use super::driver::{Driver, DriverError, View, explain_values, gate, inputs, rollback};
use crate::config::compiled::Group;

/// A group's explanation with the values each expression read.
#[derive(Clone, Debug, Serialize)]
pub struct GroupExplanation {
    /// The engine's explanation.
    pub explanation: Explanation,
    /// For each rule (declaration order): id, expression, values read.
    pub conditions: Vec<Condition>,
    /// The text form.
    pub text: String,
    /// In a fleet: `leader` when this node decides the group, `follower` when it applies its
    /// leader's decisions (the explanation then is this node's own evaluation, not what its
    /// maps hold); `None` outside a fleet.
    pub fleet_role: Option<String>,
}

/// One rule's expression and the values it read.
#[derive(Clone, Debug, Serialize)]
pub struct Condition {
    /// Rule id (or `rollback_when`, `automatic`).
    pub id: String,
    /// Its expression.
    pub expr: String,
    /// `name = value` of every variable it reads.
    pub values: BTreeMap<String, String>,
    /// Its truth value.
    pub truth: bool,
}

impl Driver {
    /// Explains `group` over `view` (the live state, or a what-if copy); changes nothing.
    ///
    /// # Errors
    ///
    /// [`DriverError`] for an unknown group.
    pub fn explain(&self, group: &str, view: View<'_>) -> Result<GroupExplanation, DriverError> {
        let i = self.index(group)?;
        let g = &self.rules().groups[i];
        let (truths, facts, open) = inputs(self.rules(), i, view);
        let input = Input::new(view.now, &truths, &facts)
            .automatic(open)
            .rollback(rollback(self.rules(), i, view));
        let explanation = self.engine_group(i).explain(&input)?;
        let state = view.state;
        let mut conditions: Vec<Condition> = g
            .config
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
        if let Some(r) = &g.rollback {
            conditions.push(Condition {
                id: "rollback_when".into(),
                expr: r.source().to_owned(),
                values: explain_values(r, state),
                truth: r.eval(state),
            });
        }
        if let Some(slot) = g.automatic {
            let name = store_name(g, slot, state);
            conditions.push(Condition {
                id: "automatic".into(),
                expr: name.0.clone(),
                values: BTreeMap::from([name]),
                truth: gate(g.automatic, state),
            });
        }
        let mut text = explanation.to_string();
        for c in &conditions {
            let values: Vec<String> = c.values.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            let _ = writeln!(
                text,
                "  {}: {} → {} ({})",
                c.id,
                c.expr,
                c.truth,
                values.join(", ")
            );
        }
        Ok(GroupExplanation {
            explanation,
            conditions,
            text,
            fleet_role: None,
        })
    }
}

fn store_name(g: &Group, slot: Slot, state: &State) -> (String, String) {
    let name = g
        .whens
        .iter()
        .chain(g.require.iter())
        .flat_map(rules::Compiled::read_names)
        .find(|(_, s)| *s == slot)
        .map_or_else(|| format!("slot {}", slot.index()), |(n, _)| n.to_owned());
    (name, state.get(slot).to_string())
}
