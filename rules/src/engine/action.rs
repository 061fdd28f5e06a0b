//! Actions (what a group publishes), their sources, and the facts the caller supplies about them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// What a decision group publishes: one pool, a weighted split of pools, or one of those per
/// client class.
///
/// JSON: `{"pool":"dc1"}`, `{"split":[["dc1",95],["dc1-canary",5]]}`, or
/// `{"by_class":{"vip":{"pool":"stable"},"default":{"split":[["stable",80],["canary",20]]}}}`
/// (class name → a pool or split action; `default` is the action of clients of no class named).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Every new flow goes to this pool.
    Pool(String),
    /// New flows are spread over these pools in proportion to the weights.
    Split(Vec<(String, u32)>),
    /// The action of a new flow depends on its client's class: class name → a [`Action::Pool`]
    /// or [`Action::Split`], and [`DEFAULT_CLASS`] (required) for every client of a class not
    /// named, or of none. The engine treats it as one opaque value like the others: a change of
    /// any class's action is a switch.
    ByClass(BTreeMap<String, Action>),
}

/// The key of [`Action::ByClass`] that holds the action of clients of no class named.
pub const DEFAULT_CLASS: &str = "default";

impl Action {
    /// A one-pool action.
    pub fn pool(name: impl Into<String>) -> Self {
        Self::Pool(name.into())
    }

    /// The pools that receive traffic: every pool of a split whose weight is above zero; for
    /// [`Action::ByClass`], those of every class's action, each once, in class order (the
    /// `default`'s in its place by name).
    pub fn live_pools(&self) -> impl Iterator<Item = &str> {
        let mut out: Vec<&str> = Vec::new();
        self.push_live(&mut out);
        out.into_iter()
    }

    fn push_live<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Self::Pool(p) => {
                if !out.contains(&p.as_str()) {
                    out.push(p);
                }
            }
            Self::Split(shares) => {
                for (p, _) in shares.iter().filter(|(_, w)| *w > 0) {
                    if !out.contains(&p.as_str()) {
                        out.push(p);
                    }
                }
            }
            Self::ByClass(classes) => {
                for a in classes.values() {
                    a.push_live(out);
                }
            }
        }
    }

    /// The action of class `class` of a [`Action::ByClass`] (its `default`'s for a class it
    /// does not name); `self` for any other action, whatever the class.
    #[must_use]
    pub fn for_class(&self, class: &str) -> &Action {
        match self {
            Self::ByClass(classes) => classes
                .get(class)
                .or_else(|| classes.get(DEFAULT_CLASS))
                .unwrap_or(self),
            other => other,
        }
    }

    /// Whether every pool that receives traffic (of every class) has at least one healthy
    /// backend.
    pub fn is_alive(&self, facts: &dyn Facts) -> bool {
        self.live_pools().all(|p| facts.pool_healthy(p))
    }

    /// Why this action cannot be published, if it cannot: an empty pool name, an empty split,
    /// a pool repeated in a split, or a split whose weights add up to zero; for
    /// [`Action::ByClass`], no `default`, an empty class name, a class whose action is itself by
    /// class, or a class's problem.
    #[must_use]
    pub fn problem(&self) -> Option<String> {
        match self {
            Self::ByClass(classes) => {
                if !classes.contains_key(DEFAULT_CLASS) {
                    return Some("by_class has no default".into());
                }
                classes.iter().find_map(|(class, a)| match a {
                    _ if class.is_empty() => Some("empty class name in by_class".into()),
                    Self::ByClass(_) => Some(format!("class {class:?}: by_class within by_class")),
                    a => a.problem().map(|p| format!("class {class:?}: {p}")),
                })
            }
            Self::Pool(p) if p.is_empty() => Some("empty pool name".into()),
            Self::Pool(_) => None,
            Self::Split(shares) if shares.is_empty() => Some("empty split".into()),
            Self::Split(shares) => {
                let mut seen = BTreeSet::new();
                for (pool, _) in shares {
                    if pool.is_empty() {
                        return Some("empty pool name in split".into());
                    }
                    if !seen.insert(pool.as_str()) {
                        return Some(format!("pool {pool:?} appears twice in the split"));
                    }
                }
                let total: u64 = shares.iter().map(|(_, w)| u64::from(*w)).sum();
                (total == 0).then(|| "split weights add up to zero".into())
            }
        }
    }
}

impl fmt::Display for Action {
    /// `pool=dc1`, `split=dc1:95,dc1-canary:5`, or
    /// `by_class(trial:pool=canary; vip:pool=stable; default:split=stable:80,canary:20)`: the
    /// classes by name, the `default` last.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ByClass(classes) => {
                f.write_str("by_class(")?;
                let named = classes.iter().filter(|(c, _)| c.as_str() != DEFAULT_CLASS);
                let default = classes.get_key_value(DEFAULT_CLASS);
                for (i, (class, a)) in named.chain(default).enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    write!(f, "{sep}{class}:{a}")?;
                }
                f.write_str(")")
            }
            Self::Pool(p) => write!(f, "pool={p}"),
            Self::Split(shares) => {
                f.write_str("split=")?;
                for (i, (pool, weight)) in shares.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    write!(f, "{sep}{pool}:{weight}")?;
                }
                Ok(())
            }
        }
    }
}

/// Where an action came from.
///
/// JSON: `{"rule":"dc1-primary"}`, `"default"`, `"override"` or `"kept"`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The rule with this id.
    Rule(String),
    /// The group's default.
    Default,
    /// A manual override.
    Override,
    /// Kept from before: an override that ended, or the action a previous run published
    /// ([`Group::resume`](super::Group::resume)), until the rules take over.
    Kept,
}

impl fmt::Display for By {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rule(id) => write!(f, "rule {id}"),
            Self::Default => f.write_str("default"),
            Self::Override => f.write_str("override"),
            Self::Kept => f.write_str("kept"),
        }
    }
}

/// What the caller knows about targets at the time of an evaluation.
///
/// Both answers must depend only on the caller's current state, so that equal inputs give
/// equal decisions.
pub trait Facts {
    /// Whether `action` passes the group's `require` safety rule (`true` when the group has
    /// none). For a split, the caller decides what `target` means; the agent evaluates `require`
    /// for every pool of the split and needs all of them to pass.
    fn passes_require(&self, action: &Action) -> bool;

    /// Whether `pool` has at least one healthy backend.
    fn pool_healthy(&self, pool: &str) -> bool;
}

/// [`Facts`] from two explicit lists, for tests and what-if: everything passes `require` and
/// every pool is healthy, except what is listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FixedFacts {
    /// Actions that fail `require`.
    pub vetoed: BTreeSet<Action>,
    /// Pools with no healthy backend.
    pub dead_pools: BTreeSet<String>,
}

impl FixedFacts {
    /// Everything passes `require`; every pool is healthy.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `action` as failing `require`.
    #[must_use]
    pub fn veto(mut self, action: Action) -> Self {
        self.vetoed.insert(action);
        self
    }

    /// Marks `pool` as having no healthy backend.
    #[must_use]
    pub fn dead(mut self, pool: impl Into<String>) -> Self {
        self.dead_pools.insert(pool.into());
        self
    }
}

impl Facts for FixedFacts {
    fn passes_require(&self, action: &Action) -> bool {
        !self.vetoed.contains(action)
    }

    fn pool_healthy(&self, pool: &str) -> bool {
        !self.dead_pools.contains(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_class() -> Action {
        Action::ByClass(BTreeMap::from([
            ("vip".to_owned(), Action::pool("stable")),
            ("trial".to_owned(), Action::pool("canary")),
            (
                DEFAULT_CLASS.to_owned(),
                Action::Split(vec![("stable".into(), 80), ("canary".into(), 20)]),
            ),
        ]))
    }

    #[test]
    fn a_by_class_action_reads_with_its_default_last_and_round_trips_as_json() {
        let a = by_class();
        assert_eq!(
            a.to_string(),
            "by_class(trial:pool=canary; vip:pool=stable; default:split=stable:80,canary:20)"
        );
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(
            json,
            r#"{"by_class":{"default":{"split":[["stable",80],["canary",20]]},"trial":{"pool":"canary"},"vip":{"pool":"stable"}}}"#
        );
        assert_eq!(serde_json::from_str::<Action>(&json).unwrap(), a);
    }

    #[test]
    fn a_by_class_action_lives_on_every_class_s_pools() {
        let a = by_class();
        assert_eq!(a.live_pools().collect::<Vec<_>>(), ["stable", "canary"]);
        assert!(a.is_alive(&FixedFacts::new()));
        assert!(!a.is_alive(&FixedFacts::new().dead("canary")));
        assert_eq!(a.for_class("vip"), &Action::pool("stable"));
        assert_eq!(a.for_class("other"), a.for_class(DEFAULT_CLASS));
        assert_eq!(Action::pool("x").for_class("vip"), &Action::pool("x"));
        assert_eq!(a.problem(), None);
    }

    #[test]
    fn a_by_class_action_needs_a_default_and_flat_valid_classes() {
        let mut classes = BTreeMap::from([("vip".to_owned(), Action::pool("stable"))]);
        assert_eq!(
            Action::ByClass(classes.clone()).problem().as_deref(),
            Some("by_class has no default")
        );
        classes.insert(DEFAULT_CLASS.into(), Action::Split(vec![]));
        assert_eq!(
            Action::ByClass(classes.clone()).problem().as_deref(),
            Some("class \"default\": empty split")
        );
        classes.insert(DEFAULT_CLASS.into(), by_class());
        assert!(
            Action::ByClass(classes)
                .problem()
                .is_some_and(|p| p.contains("by_class within by_class"))
        );
    }
}
