//! The event loop's side of `switchyard ctl classes` and of the class metrics: the classes of
//! the running config, named, with the program's `CLASS_STATS`.

use router_common::{
    CLASS_STAT_ANSWER, CLASS_STAT_UNKNOWN, Decision, MAX_CLASSES, NO_POOL, Traffic,
    class_stat_index,
};

use super::runtime::Runtime;
use crate::{
    api::classes::{ClassView, ClassesView},
    dataplane::counters,
};

impl Runtime {
    /// `CLASS_STATS`, summed over CPUs (zeros for maps without it).
    fn class_stats(&self) -> Vec<Traffic> {
        (0..router_common::CLASS_STATS_ENTRIES)
            .map(|i| counters::sum(&self.maps.class_stats, i))
            .collect()
    }

    /// Every class (id 0, `none`, first) with its new flows by side of its word, from `stats`
    /// (`CLASS_STATS` summed).
    pub(super) fn class_rows(&self, stats: &[Traffic]) -> Vec<ClassView> {
        let cfg = &self.config;
        let none = (String::from("none"), 0usize, None);
        let named = cfg
            .classes
            .iter()
            .map(|c| (c.name.clone(), c.prefixes.len(), c.precedence));
        std::iter::once(none)
            .chain(named)
            .zip(0u32..=MAX_CLASSES)
            .map(|((name, prefixes, precedence), id)| {
                let count = |side| {
                    let i = usize::try_from(class_stat_index(id, side)).unwrap_or(usize::MAX);
                    stats.get(i).map_or(0, |t| t.packets)
                };
                ClassView {
                    name,
                    id,
                    prefixes,
                    precedence,
                    sides: [
                        (self.side_pool(id, 0), count(0)),
                        (self.side_pool(id, 1), count(1)),
                    ],
                }
            })
            .collect()
    }

    /// The pool on side `side` (0: A, 1: B) of class `id`'s word: its name when every
    /// published group that acts per class has that one there, else `A` or `B`.
    fn side_pool(&self, id: u32, side: u32) -> String {
        let groups = self.publisher.groups();
        let mut names: Vec<String> = Vec::new();
        for g in self.config.decisions.iter().filter(|g| g.uses_classes()) {
            let Some(state) = groups.get(&g.name) else {
                continue;
            };
            let word = match id.checked_sub(1) {
                None => Some(state.word),
                Some(i) => state
                    .class_words
                    .and_then(|w| w.get(usize::try_from(i).ok()?).copied()),
            };
            let Some(word) = word else { continue };
            let d = Decision::decode(word);
            let slot = if side == 0 { d.pool_a } else { d.pool_b };
            let name = if slot == NO_POOL {
                "-".to_owned()
            } else {
                self.publisher
                    .pools()
                    .iter()
                    .find(|(_, p)| p.slot == u32::from(slot))
                    .map_or_else(|| format!("slot {slot}"), |(n, _)| n.clone())
            };
            if !names.contains(&name) {
                names.push(name);
            }
        }
        match names.as_slice() {
            [one] => one.clone(),
            _ if side == 0 => "A".to_owned(),
            _ => "B".to_owned(),
        }
    }

    /// The answer of `GET /classes`.
    pub(super) fn classes_view(&self) -> ClassesView {
        let stats = self.class_stats();
        let at = |i: u32| {
            usize::try_from(i)
                .ok()
                .and_then(|i| stats.get(i))
                .map_or(0, |t| t.packets)
        };
        ClassesView {
            classes: self.class_rows(&stats),
            answered: at(CLASS_STAT_ANSWER),
            unknown: at(CLASS_STAT_UNKNOWN),
        }
    }
}
