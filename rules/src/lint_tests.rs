use super::*;

fn schema(bools: &[&str]) -> Schema {
    let mut s = Schema::new();
    for b in bools {
        assert!(s.define(b, Type::Bool).is_ok());
    }
    assert!(s.define("ratio", Type::Number).is_ok());
    s
}

fn rule<'a>(id: &'a str, priority: i64, when: &'a str) -> LintRule<'a> {
    LintRule { id, priority, when }
}

#[test]
fn a_rule_implied_by_a_higher_one_is_shadowed() {
    let s = schema(&["a", "b"]);
    let l = lint(
        &[rule("wide", 100, "a"), rule("narrow", 90, "a AND b")],
        true,
        &s,
    );
    assert_eq!(
        l.findings,
        [Finding::Shadowed {
            rule: "narrow".into(),
            by: vec!["wide".into()]
        }]
    );
    assert!(l.partial.is_empty());
    assert_eq!(
        l.findings[0].to_string(),
        "rule \"narrow\" can never fire: \"wide\" (ahead of it) is true whenever it is"
    );
}

#[test]
fn two_higher_rules_together_can_shadow_one() {
    let s = schema(&["a", "b"]);
    let l = lint(
        &[rule("x", 3, "a"), rule("y", 2, "NOT a"), rule("z", 1, "b")],
        true,
        &s,
    );
    assert_eq!(
        l.findings,
        [Finding::Shadowed {
            rule: "z".into(),
            by: vec!["x".into(), "y".into()]
        }]
    );
}

#[test]
fn a_contradiction_never_fires() {
    let s = schema(&["a"]);
    let l = lint(&[rule("r", 1, "a AND NOT a")], true, &s);
    assert_eq!(l.findings, [Finding::NeverTrue { rule: "r".into() }]);
}

#[test]
fn uncovered_states_are_reported_only_without_a_default() {
    let s = schema(&["a", "b"]);
    let rules = [rule("r1", 2, "a AND b"), rule("r2", 1, "NOT a")];
    let l = lint(&rules, false, &s);
    assert_eq!(
        l.findings,
        [Finding::Uncovered {
            count: 1,
            total: 4,
            example: vec![("a".into(), true), ("b".into(), false)]
        }]
    );
    assert!(lint(&rules, true, &s).findings.is_empty());
    assert!(
        lint(&[rule("r", 1, "a OR NOT a")], false, &s)
            .findings
            .is_empty()
    );
}

#[test]
fn equal_priority_rules_that_can_both_be_true_overlap() {
    let s = schema(&["a", "b"]);
    let l = lint(
        &[rule("p", 5, "a"), rule("q", 5, "b"), rule("r", 4, "a")],
        true,
        &s,
    );
    assert_eq!(
        l.findings,
        [
            Finding::Shadowed {
                rule: "r".into(),
                by: vec!["p".into()]
            },
            Finding::Overlap {
                first: "p".into(),
                second: "q".into(),
                example: vec![("a".into(), true), ("b".into(), true)]
            }
        ]
    );
    // Disjoint equal-priority rules are fine.
    assert!(
        lint(&[rule("p", 5, "a"), rule("q", 5, "NOT a")], true, &s)
            .findings
            .is_empty()
    );
}

#[test]
fn comparisons_are_opaque_atoms_and_say_so() {
    let s = schema(&["a"]);
    let l = lint(
        &[
            rule("p", 2, "ratio >= 0.5"),
            rule("q", 1, "a AND ratio >= 0.5"),
        ],
        true,
        &s,
    );
    assert_eq!(
        l.findings,
        [Finding::Shadowed {
            rule: "q".into(),
            by: vec!["p".into()]
        }]
    );
    assert_eq!(l.notes.len(), 1);
    assert!(l.notes[0].contains("(ratio >= 0.5)"), "{:?}", l.notes);
}

#[test]
fn more_than_twenty_atoms_make_the_report_partial() {
    let names: Vec<String> = (0..21).map(|i| format!("v{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let s = schema(&refs);
    let all = names.join(" AND ");
    let l = lint(&[rule("big", 1, &all)], false, &s);
    assert!(l.findings.is_empty());
    assert_eq!(l.partial.len(), 2, "{:?}", l.partial);
    assert!(l.partial.iter().all(|p| p.contains("21 atoms")));
    // Twenty is still exact.
    let twenty = names[..20].join(" AND ");
    let l = lint(&[rule("big", 1, &twenty)], true, &s);
    assert!(l.partial.is_empty() && l.findings.is_empty());
}

#[test]
fn rules_that_do_not_check_are_left_out() {
    let s = schema(&["a"]);
    let l = lint(
        &[
            rule("bad", 2, "a AND"),
            rule("typed", 2, "ratio"),
            rule("ok", 1, "a"),
        ],
        true,
        &s,
    );
    assert!(l.findings.is_empty(), "{:?}", l.findings);
}
