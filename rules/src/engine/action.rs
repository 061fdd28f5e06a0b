//! Actions (what a group publishes), their sources, and the facts the caller supplies about them.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// What a decision group publishes: one pool, or a weighted split of pools.
///
/// JSON: `{"pool":"dc1"}` or `{"split":[["dc1",95],["dc1-canary",5]]}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Every new flow goes to this pool.
    Pool(String),
    /// New flows are spread over these pools in proportion to the weights.
    Split(Vec<(String, u32)>),
}

impl Action {
    /// A one-pool action.
    pub fn pool(name: impl Into<String>) -> Self {
        Self::Pool(name.into())
    }

    /// The pools that receive traffic: every pool of a split whose weight is above zero.
    pub fn live_pools(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match self {
            Self::Pool(p) => (Some(p.as_str()), &[][..]),
            Self::Split(shares) => (None, shares.as_slice()),
        };
        one.into_iter()
            .chain(many.iter().filter(|(_, w)| *w > 0).map(|(p, _)| p.as_str()))
    }

    /// Whether every pool that receives traffic has at least one healthy backend.
    pub fn is_alive(&self, facts: &dyn Facts) -> bool {
        self.live_pools().all(|p| facts.pool_healthy(p))
    }

    /// Why this action cannot be published, if it cannot: an empty pool name, an empty split,
    /// a pool repeated in a split, or a split whose weights add up to zero.
    #[must_use]
    pub fn problem(&self) -> Option<String> {
        match self {
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
    /// `pool=dc1` or `split=dc1:95,dc1-canary:5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
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
