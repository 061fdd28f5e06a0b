//! Checking `classes:` (client classes by source prefix) on their own, then with the decision
//! groups that name them in `by_class`: names known, at most [`MAX_CLASSES`] classes and
//! [`MAX_CLASS_PREFIXES`] prefixes, no prefix in two classes, and no nested prefixes of two
//! classes one group uses unless their `precedence` says which wins (decision 0037).

use std::collections::HashMap;

use rules::engine::DEFAULT_CLASS;

use super::{decisions, missing};
use crate::config::{
    load::Parsed,
    model::{ClientClass, MAX_CLASS_PREFIXES, MAX_CLASSES, SourceRange},
    report::{Item, Report, index_path},
    spec::ClassSpec,
    values::{self, did_you_mean},
};

/// Largest `precedence`.
const MAX_PRECEDENCE: u32 = 1_000_000;

/// What could be read of one class.
pub(super) struct Draft {
    /// Its name, when it is a valid one.
    pub name: Option<String>,
    /// Its prefixes that could be read, with their index in `prefixes`.
    pub prefixes: Vec<(usize, SourceRange)>,
    /// Its precedence (0 when absent), when it could be read.
    pub precedence: Option<u32>,
    /// The class, when every key of it is right.
    pub value: Option<ClientClass>,
}

/// Checks one `classes.<name>` entry on its own.
pub(super) fn class(name: &str, it: &Item<ClassSpec>, report: &mut Report) -> Draft {
    let c = &it.spec;
    let name = match values::name(name) {
        Ok(_) if name == DEFAULT_CLASS => {
            let message = format!("a class may not be named {DEFAULT_CLASS:?}");
            let hint = Some(format!(
                "{DEFAULT_CLASS:?} in by_class is the action of clients of no class"
            ));
            it.err(report, "", message, hint);
            None
        }
        Ok(n) => Some(n),
        Err((message, hint)) => {
            it.err(report, "", message, hint);
            None
        }
    };
    let mut prefixes = Vec::new();
    let mut ok = true;
    match &c.prefixes {
        _ if it.is_broken("prefixes") => ok = false,
        None => {
            missing(it, report, "", "prefixes");
            ok = false;
        }
        Some(list) if list.is_empty() => {
            let message = "a class needs at least one prefix".to_owned();
            it.err(report, "prefixes", message, None);
            ok = false;
        }
        Some(list) => {
            for (i, text) in list.iter().enumerate() {
                let rel = index_path("prefixes", i);
                match super::leaf(it, report, Some(text), &rel, values::range) {
                    super::Field::Ok((network, prefix)) => {
                        let range = SourceRange { network, prefix };
                        if let Some(&(j, _)) = prefixes.iter().find(|(_, p)| *p == range) {
                            let first = it.location(report, &index_path("prefixes", j));
                            let message = format!("prefix {range} is listed twice");
                            it.err(report, &rel, message, Some(format!("first at {first}")));
                            ok = false;
                        } else {
                            prefixes.push((i, range));
                        }
                    }
                    _ => ok = false,
                }
            }
        }
    }
    let precedence = super::leaf(it, report, c.precedence.as_deref(), "precedence", |v| {
        values::number(v, "precedence", 0, MAX_PRECEDENCE)
    });
    let precedence_value = match precedence {
        super::Field::Ok(p) => Some(Some(p)),
        super::Field::Absent => Some(None),
        super::Field::Bad => None,
    };
    let value = (|| {
        ok.then_some(())?;
        Some(ClientClass {
            name: name.clone()?,
            prefixes: prefixes.iter().map(|(_, p)| *p).collect(),
            precedence: precedence_value?,
        })
    })();
    Draft {
        name,
        prefixes,
        precedence: precedence_value.map(|p| p.unwrap_or(0)),
        value,
    }
}

/// The checks of classes with each other and with the decision groups.
pub(super) fn check(
    parsed: &Parsed,
    drafts: &[Draft],
    groups: &[decisions::Draft],
    report: &mut Report,
) {
    let items: Vec<&Item<ClassSpec>> = parsed.classes.iter().map(|(_, it)| it).collect();
    // One name, one class (two files may not both define it).
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, d) in drafts.iter().enumerate() {
        let (Some(name), Some(it)) = (d.name.as_deref(), items.get(i)) else {
            continue;
        };
        match by_name.get(name).and_then(|&j| items.get(j)) {
            Some(first) => {
                let hint = format!("first defined at {}", first.location(report, ""));
                it.err(report, "", format!("duplicate class {name:?}"), Some(hint));
            }
            None => {
                by_name.insert(name, i);
            }
        }
    }
    if let Some(it) = items.get(MAX_CLASSES) {
        let message = format!(
            "{} classes: the data plane holds at most {MAX_CLASSES}",
            items.len()
        );
        let hint = Some("merge classes that always share an action".to_owned());
        it.err(report, "", message, hint);
    }
    let total: usize = drafts.iter().map(|d| d.prefixes.len()).sum();
    if total > MAX_CLASS_PREFIXES
        && let Some(it) = items.first()
    {
        let message = format!(
            "the classes have {total} prefixes: the data plane holds at most {MAX_CLASS_PREFIXES}"
        );
        it.err(report, "prefixes", message, None);
    }
    same_prefix(&items, drafts, report);
    let names: Vec<&str> = by_name.keys().copied().collect();
    for (it, g) in parsed.decisions.iter().zip(groups) {
        for (rel, class) in &g.classes {
            if !by_name.contains_key(class.as_str()) {
                let mut sorted = names.clone();
                sorted.sort_unstable();
                let hint = did_you_mean(class, &sorted).or_else(|| {
                    Some(format!(
                        "define it under classes:, or use {DEFAULT_CLASS:?} for every other client"
                    ))
                });
                it.err(report, rel, format!("unknown class {class:?}"), hint);
            }
        }
        nested(it, g, &items, drafts, &by_name, report);
    }
}

/// Reports a prefix that is in two classes: the trie holds one class per prefix.
fn same_prefix(items: &[&Item<ClassSpec>], drafts: &[Draft], report: &mut Report) {
    let mut seen: HashMap<SourceRange, (usize, usize)> = HashMap::new();
    for (c, d) in drafts.iter().enumerate() {
        for &(i, p) in &d.prefixes {
            match seen.get(&p) {
                Some(&(fc, fi)) if fc != c => {
                    let (Some(it), Some(first)) = (items.get(c), items.get(fc)) else {
                        continue;
                    };
                    let other = drafts
                        .get(fc)
                        .and_then(|f| f.name.as_deref())
                        .unwrap_or("?");
                    let at = first.location(report, &index_path("prefixes", fi));
                    let message = format!("prefix {p} is already in class {other:?}");
                    let hint = Some(format!(
                        "a client prefix belongs to one class (class {other:?} has it at {at})"
                    ));
                    it.err(report, &index_path("prefixes", i), message, hint);
                }
                Some(_) => {}
                None => {
                    seen.insert(p, (c, i));
                }
            }
        }
    }
}

/// Reports two classes that `g` names whose prefixes nest (one holds the other) with the same
/// precedence: which class such a client has would be the trie's longest match, not a choice
/// the operator wrote.
fn nested(
    it: &Item<crate::config::spec::DecisionGroupSpec>,
    g: &decisions::Draft,
    items: &[&Item<ClassSpec>],
    drafts: &[Draft],
    by_name: &HashMap<&str, usize>,
    report: &mut Report,
) {
    let mut used: Vec<(&str, &str, usize)> = Vec::new();
    for (rel, class) in &g.classes {
        if let Some(&c) = by_name.get(class.as_str())
            && used.iter().all(|u| u.1 != class.as_str())
        {
            used.push((rel.as_str(), class.as_str(), c));
        }
    }
    for (x, &(_, a_name, a)) in used.iter().enumerate() {
        for &(rel, b_name, b) in used.iter().skip(x + 1) {
            let (Some(da), Some(db)) = (drafts.get(a), drafts.get(b)) else {
                continue;
            };
            let (Some(pa), Some(pb)) = (da.precedence, db.precedence) else {
                continue;
            };
            if pa != pb {
                continue;
            }
            let clash = da.prefixes.iter().find_map(|&(_, p)| {
                db.prefixes
                    .iter()
                    .find(|(_, q)| p.contains_range(*q) || q.contains_range(p))
                    .map(|&(j, q)| (p, q, j))
            });
            let Some((p, q, j)) = clash else {
                continue;
            };
            let at = items
                .get(b)
                .map(|i| i.location(report, &index_path("prefixes", j)))
                .unwrap_or_default();
            let message = format!(
                "classes {a_name:?} ({p}) and {b_name:?} ({q}, at {at}) have nested prefixes \
                 and the same precedence, and this group uses both"
            );
            let hint = Some(format!(
                "give the class that is to win a higher precedence (`classes.{a_name}.precedence: \
                 10`); without one the longest prefix would decide"
            ));
            it.err(report, rel, message, hint);
        }
    }
}

/// The classes, sorted by name (their ids in the maps follow this order).
pub(super) fn finish(drafts: Vec<Draft>) -> Option<Vec<ClientClass>> {
    let mut classes: Vec<ClientClass> =
        drafts.into_iter().map(|d| d.value).collect::<Option<_>>()?;
    classes.sort_by(|a, b| a.name.cmp(&b.name));
    Some(classes)
}

#[cfg(test)]
mod tests {
    use crate::config::load_files;

    fn load(text: &str) -> Result<crate::config::Config, String> {
        load_files(&[("a.yaml".into(), text.into())]).map_err(|e| e.to_string())
    }

    const BASE: &str = "services: [ { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, \
                        forward: dsr-l2, to: { decide: web } } ]\n\
                        pools: [ { name: stable, backends: [ { address: 198.18.1.11 } ] },\n\
                                 { name: canary, backends: [ { address: 198.18.1.12 } ] },\n                                 { name: six, backends: [ { address: \"2001:db8:1::11\" } ] } ]\n";

    fn group(by_class: &str) -> String {
        format!(
            "{BASE}decisions: [ {{ name: web, split_by: client, rules: [ {{ id: r, when: \"true\", \
             then: {{ by_class: {by_class} }} }} ] }} ]\n"
        )
    }

    #[test]
    fn classes_get_ids_by_name_and_a_group_its_by_class_action() {
        let text = format!(
            "classes:\n  vip: {{ prefixes: [198.18.5.0/24] }}\n  trial: {{ prefixes: [198.18.6.0/24, \"2001:db8:6::/48\"] }}\n{}",
            group(
                "{ vip: { pool: stable }, trial: { pool: canary }, default: { split: [ { pool: \
                 stable, weight: 80 }, { pool: canary, weight: 20 } ] } }"
            )
        );
        let cfg = load(&text).unwrap();
        assert_eq!(cfg.class_id("trial"), Some(1));
        assert_eq!(cfg.class_id("vip"), Some(2));
        assert_eq!(cfg.class_id("default"), None);
        let g = &cfg.decisions[0];
        assert_eq!(g.split_by, crate::config::SplitBy::Client);
        assert_eq!(
            g.rules[0].then.to_string(),
            "by_class(trial:pool=canary; vip:pool=stable; default:split=stable:80,canary:20)"
        );
        assert_eq!(cfg.class_prefixes().len(), 3);
    }

    #[test]
    fn a_higher_precedence_wins_over_a_longer_prefix() {
        let text = format!(
            "classes:\n  wide: {{ prefixes: [198.18.0.0/16], precedence: 10 }}\n  \
             narrow: {{ prefixes: [198.18.6.0/24] }}\n  deep: {{ prefixes: [198.18.6.128/25], precedence: 20 }}\n{}",
            group(
                "{ wide: { pool: stable }, narrow: { pool: canary }, deep: { pool: canary }, default: { pool: stable } }"
            )
        );
        let cfg = load(&text).unwrap();
        let ids: Vec<(String, u32)> = cfg
            .class_prefixes()
            .into_iter()
            .map(|(p, id)| (p.to_string(), id))
            .collect();
        // Ids by name: deep 1, narrow 2, wide 3.
        let (deep, wide) = (1, 3);
        assert_eq!(
            ids,
            [
                ("198.18.0.0/16".to_owned(), wide),
                ("198.18.6.0/24".to_owned(), wide),
                ("198.18.6.128/25".to_owned(), deep),
            ]
        );
    }

    #[test]
    fn every_class_problem_is_reported_with_its_place() {
        let text = format!(
            "classes:\n  vip: {{ prefixes: [198.18.5.1/24, 198.18.0.0/16] }}\n  \
             trial: {{ prefixes: [198.18.0.0/16, nonsense] }}\n  default: {{ prefixes: [198.18.9.0/24] }}\n{}",
            group("{ vip: { pool: stable }, trail: { pool: canary } }")
        );
        let e = load(&text).unwrap_err();
        for want in [
            "a.yaml:2 classes.vip.prefixes[0]: \"198.18.5.1/24\" has host bits set",
            "a.yaml:3 classes.trial.prefixes[0]: prefix 198.18.0.0/16 is already in class \"vip\"",
            "a.yaml:3 classes.trial.prefixes[1]:",
            "a.yaml:4 classes.default: a class may not be named \"default\"",
            "decisions[0].rules[0].then.by_class: by_class needs a default",
            "decisions[0].rules[0].then.by_class.trail: unknown class \"trail\"; did you mean \"trial\"?",
        ] {
            assert!(e.contains(want), "{want:?} not in\n{e}");
        }
    }

    #[test]
    fn nested_prefixes_of_two_classes_one_group_uses_need_a_precedence() {
        let classes = "classes:\n  vip: { prefixes: [198.18.0.0/16] }\n  trial: { prefixes: [198.18.6.0/24] }\n";
        let by_class =
            "{ vip: { pool: stable }, trial: { pool: canary }, default: { pool: stable } }";
        let e = load(&format!("{classes}{}", group(by_class))).unwrap_err();
        assert!(
            e.contains("have nested prefixes and the same precedence, and this group uses both"),
            "{e}"
        );
        assert!(e.contains("decisions[0].rules[0].then.by_class.vip"), "{e}");
        // With a precedence it loads; so it does when the group uses one of them only.
        let with = classes.replace("[198.18.6.0/24] }", "[198.18.6.0/24], precedence: 5 }");
        load(&format!("{with}{}", group(by_class))).unwrap();
        load(&format!(
            "{classes}{}",
            group("{ vip: { pool: stable }, default: { pool: canary } }")
        ))
        .unwrap();
    }

    #[test]
    fn at_most_fifteen_classes() {
        use std::fmt::Write as _;
        let mut text = "classes:\n".to_owned();
        for i in 0..16 {
            let _ = writeln!(text, "  c{i:02}: {{ prefixes: [198.18.{i}.0/24] }}");
        }
        let e = load(&text).unwrap_err();
        assert!(
            e.contains("16 classes: the data plane holds at most 15"),
            "{e}"
        );
    }

    #[test]
    fn a_by_class_pool_has_the_family_of_the_group_s_services() {
        let text = format!(
            "{}classes:\n  vip: {{ prefixes: [198.18.5.0/24] }}\n",
            group("{ vip: { pool: six }, default: { pool: stable } }")
        );
        let e = load(&text).unwrap_err();
        assert!(
            e.contains("pools six have backends that are not IPv4"),
            "{e}"
        );
    }
}
