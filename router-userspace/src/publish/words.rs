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
//!
//! A group that acts per client class (`DecisionGroup::uses_classes`) also has a word per
//! class id in `CLASS_DECISIONS` beside its slot: class `c`'s action's word (a class the action
//! does not name, and every action that is not `by_class`, gives the `default`'s), with the same
//! fallback. They are written before the slot's `DECISIONS` word, and before any service of the
//! group gets `SVC_F_CLASSES` (an unwritten word would be pool 0): decision 0037.

use router_common::{Decision, MAX_CLASSES, NO_POOL, SPLIT_SCALE};
use rules::engine::{Action, DEFAULT_CLASS};

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
    /// The words of class ids 1..=`MAX_CLASSES` in `CLASS_DECISIONS` (`None`: none written by
    /// this process; its services do not look classes up until they are).
    pub class_words: Option<ClassWords>,
}

/// The `CLASS_DECISIONS` words of one decision slot: index `c - 1` holds class `c`'s.
pub type ClassWords = [u64; MAX_CLASSES as usize];

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
        let action = action.map(|a| a.for_class(DEFAULT_CLASS));
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

    /// The class words of `action` with `fallback` ([`ClassWords`]): each class id's action's
    /// word, the `default`'s for an id no configured class has.
    #[must_use]
    pub fn class_words(&self, action: Option<&Action>, fallback: Option<&str>) -> ClassWords {
        std::array::from_fn(|i| {
            let class = self.classes.get(i).map_or(DEFAULT_CLASS, String::as_str);
            self.action_word(action.map(|a| a.for_class(class)), fallback)
        })
    }

    /// Writes the class words of group `name` at `slot` when its services look classes up and
    /// `words` differ from what `written` says the map holds. Returns what the map holds now.
    fn write_class_words(
        &self,
        dp: &mut dyn Dataplane,
        name: &str,
        slot: u32,
        words: ClassWords,
        written: Option<ClassWords>,
    ) -> Result<Option<ClassWords>, PublishError> {
        if !self.class_groups.contains(name) || written == Some(words) {
            return Ok(written);
        }
        super::classes::write_class_words(dp, slot, &words)?;
        Ok(Some(words))
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
        let class_words = self.class_words(Some(action), fallback.as_deref());
        let written = g.class_words;
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
        // Every class's word, then the default's: a client of a class never meets the new
        // default beside its class's old word for longer than the writes between them.
        let class_words = self.write_class_words(dp, group, slot, class_words, written);
        if let Some(g) = self.groups.get_mut(group) {
            // After a failed write some words are unknown: the next write sends them all.
            g.class_words = class_words.as_ref().ok().copied().flatten();
        }
        class_words?;
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
                    class_words: None,
                },
            };
            if let Some(a) = decided.get(name)
                && g.action.as_ref() != Some(a)
            {
                g.fallback = self.next_fallback(g.action.as_ref(), a, g.fallback.as_deref());
                g.action = Some(a.clone());
            }
            let word = self.action_word(g.action.as_ref(), g.fallback.as_deref());
            let class_words = self.class_words(g.action.as_ref(), g.fallback.as_deref());
            match self.write_class_words(dp, name, g.slot, class_words, g.class_words) {
                Ok(w) => g.class_words = w,
                Err(e) => {
                    // A failed write leaves some words unknown: the next apply writes them all.
                    g.class_words = None;
                    self.groups.insert(name.clone(), g);
                    self.groups.extend(old);
                    return Err(e);
                }
            }
            if word != g.word {
                dp.set_decision(g.slot, word)?;
                g.word = word;
            }
            self.groups.insert(name.clone(), g);
        }
        Ok(old.into_values().collect())
    }
}
