//! Decision words: the one encoder of an action into the 8-byte word the program reads
//! ([`Publisher::action_word`]), used for static targets and decision groups alike; and
//! decision groups in the maps: each group owns ONE decision slot, and every service with
//! `to: { decide: G }` points its `decision` at it, so one 8-byte write switches them all.
//!
//! A group's slot comes from the service slot space (decision slots and service slots share
//! `0..MAX_DECISIONS`; a slot a group holds is never a service's id, so no static word lands
//! there). The word carries the action's pool(s) and split, and `fallback`: the last-known-good
//! pool — the previous action's first pool that had a healthy backend when it was left (or the
//! fallback before it), never a pool of the action itself.

use router_common::{Decision, NO_POOL, SPLIT_SCALE};
use rules::engine::Action;

use super::{PublishError, Publisher};
use crate::dataplane::Dataplane;

/// One decision group, as published.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupState {
    /// Its decision slot.
    pub slot: u32,
    /// The published action (`None` before the first decision: the word sends nothing).
    pub action: Option<Action>,
    /// The last-known-good pool carried as the word's fallback.
    pub fallback: Option<String>,
    /// The word in the map.
    pub word: u64,
}

impl Publisher {
    /// Published decision groups by name.
    #[must_use]
    pub fn groups(&self) -> &std::collections::BTreeMap<String, GroupState> {
        &self.groups
    }

    /// The word of a service's static target: a `decide` target is published through its
    /// group's slot, never here, so it gets a word with no pool.
    pub(super) fn target_word(&self, to: &crate::config::Target) -> u64 {
        use crate::config::Target;
        let action = match to {
            Target::Decide(_) => None,
            Target::Pool(p) => Some(Action::Pool(p.clone())),
            Target::Split(shares) => Some(Action::Split(
                shares.iter().map(|s| (s.pool.clone(), s.weight)).collect(),
            )),
        };
        self.action_word(action.as_ref(), None)
    }

    /// The word of `action` with `fallback`, from the published pool slots. A split's shares
    /// of weight zero are left out; a split with one live share is that pool.
    #[must_use]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a pool slot is below MAX_POOLS and `split_b` at most SPLIT_SCALE: both fit \
                  the word's u16 fields"
    )]
    pub fn action_word(&self, action: Option<&Action>, fallback: Option<&str>) -> u64 {
        // A `by_class` action's word for clients of no class is its `default`'s.
        let action = action.map(|a| a.for_class(rules::engine::DEFAULT_CLASS));
        let slot = |name: &str| self.pools.get(name).map_or(NO_POOL, |p| p.slot as u16);
        let fallback = fallback.map_or(NO_POOL, slot);
        let mut d = match action {
            // A `by_class` without a default (never valid) sends nothing.
            None | Some(Action::ByClass(_)) => Decision::pool(NO_POOL),
            Some(Action::Pool(p)) => Decision::pool(slot(p)),
            Some(Action::Split(shares)) => {
                let live: Vec<&(String, u32)> = shares.iter().filter(|(_, w)| *w > 0).collect();
                match live.as_slice() {
                    [] => Decision::pool(NO_POOL),
                    [a] => Decision::pool(slot(&a.0)),
                    [a, b, ..] => {
                        let total = u64::from(a.1) + u64::from(b.1);
                        let split_b = (u64::from(b.1) * u64::from(SPLIT_SCALE))
                            .checked_div(total)
                            .unwrap_or(0) as u16;
                        Decision {
                            pool_a: slot(&a.0),
                            pool_b: slot(&b.0),
                            split_b,
                            fallback: NO_POOL,
                        }
                    }
                }
            }
        };
        d.fallback = fallback;
        d.encode()
    }

    /// The fallback after switching `from` → `to`: the first pool of `from` (not in `to`) with a
    /// healthy backend, else the previous fallback if it is not in `to`.
    fn next_fallback(
        &self,
        from: Option<&Action>,
        to: &Action,
        previous: Option<&str>,
    ) -> Option<String> {
        let in_to = |p: &str| to.live_pools().any(|q| q == p);
        let healthy = |p: &str| self.health.counts(p).0 > 0;
        from.into_iter()
            .flat_map(Action::live_pools)
            .find(|p| !in_to(p) && healthy(p))
            .or(previous.filter(|p| !in_to(p)))
            .map(str::to_owned)
    }

    /// Publishes `action` for `group` with one decision-word write. Returns the word written, or
    /// `None` when the group is unknown or its word is unchanged (nothing written).
    ///
    /// # Errors
    ///
    /// [`PublishError::Dataplane`] when the decision word cannot be written; nothing of the
    /// group's published state changes then.
    pub fn publish_decision(
        &mut self,
        dp: &mut dyn Dataplane,
        group: &str,
        action: &Action,
    ) -> Result<Option<u64>, PublishError> {
        let Some(g) = self.groups.get(group) else {
            return Ok(None);
        };
        let fallback = if g.action.as_ref() == Some(action) {
            g.fallback.clone()
        } else {
            self.next_fallback(g.action.as_ref(), action, g.fallback.as_deref())
        };
        let word = self.action_word(Some(action), fallback.as_deref());
        let slot = g.slot;
        if word == g.word && g.action.as_ref() == Some(action) {
            return Ok(None);
        }
        // A switch away from a pool that still serves (it is the new fallback): the flows that
        // began there get their second chance, flagged before the word that leaves it.
        let left = fallback.as_deref().filter(|f| {
            g.action
                .as_ref()
                .is_some_and(|from| from != action && from.live_pools().any(|p| p == *f))
        });
        if let Some(pool) = left.and_then(|f| self.pools.get_mut(f))
            && !pool.second_chance.is_zero()
        {
            let until = self.now.saturating_add(pool.second_chance);
            super::tables::set_left_chance(dp, pool, Some(until))?;
        }
        dp.set_decision(slot, word)?;
        let word_changed = self.groups.get_mut(group).map(|g| {
            g.action = Some(action.clone());
            g.fallback = fallback;
            g.word = word;
        });
        debug_assert!(word_changed.is_some());
        for s in self.services.values_mut() {
            if s.value.decision == slot {
                s.word = word;
            }
        }
        Ok(Some(word))
    }

    /// Step 3 of an apply for groups: keeps the slot of every group that stays, takes one for
    /// each new group, and writes the word of each group whose action (from `decided`, or kept)
    /// or pool slots changed. Returns the groups no longer configured (freed after services).
    pub(super) fn apply_groups(
        &mut self,
        dp: &mut dyn Dataplane,
        names: &[String],
        decided: &std::collections::BTreeMap<String, Action>,
    ) -> Result<Vec<GroupState>, PublishError> {
        let mut old = std::mem::take(&mut self.groups);
        for name in names {
            let mut g = match old.remove(name) {
                Some(g) => g,
                None => GroupState {
                    slot: self.service_slots.take("decision")?,
                    action: None,
                    fallback: None,
                    word: u64::MAX,
                },
            };
            if let Some(a) = decided.get(name)
                && g.action.as_ref() != Some(a)
            {
                g.fallback = self.next_fallback(g.action.as_ref(), a, g.fallback.as_deref());
                g.action = Some(a.clone());
            }
            let word = self.action_word(g.action.as_ref(), g.fallback.as_deref());
            if word != g.word {
                dp.set_decision(g.slot, word)?;
                g.word = word;
            }
            self.groups.insert(name.clone(), g);
        }
        Ok(old.into_values().collect())
    }
}
