//! Lint for a decision group: rules that can never fire, state combinations no rule covers,
//! and equal-priority rules that can both be true. Pure; run by `switchyard validate`.
//!
//! Each rule is reduced to boolean logic over *atoms*: every bool name (a state variable or a
//! built-in such as `pool.dc1.healthy`) is one atom, and so is every comparison or `in`
//! (`pool.dc1.healthy_ratio >= 0.5`), identified by its text. Atoms are treated as independent:
//! a derived variable is not expanded into its expression, and two comparisons of one number
//! (`x > 1`, `x > 2`) are not known to be related. Within that model every check is exact by
//! enumeration when it involves at most [`MAX_EXACT_ATOMS`] atoms; a check over more is skipped
//! and the report says so ([`Lint::partial`]). Because atoms are independent, an "uncovered" or
//! "overlap" example may be a combination the real state cannot reach, and shadowing through a
//! relation between atoms is not seen; [`Lint::notes`] says when comparisons were involved.

use std::fmt;

use crate::check::{Schema, Type, type_of};
use crate::syntax::{Expr, ExprKind, parse};

/// Most atoms a check enumerates (2^20 states).
pub const MAX_EXACT_ATOMS: usize = 20;

/// One rule of a group, as the lint needs it.
#[derive(Clone, Copy, Debug)]
pub struct LintRule<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its priority (higher first; equal priorities in declaration order).
    pub priority: i64,
    /// Its `when` expression.
    pub when: &'a str,
}

/// Something suspicious about a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The rule's condition is never true.
    NeverTrue {
        /// The rule.
        rule: String,
    },
    /// Whenever the rule is true, a rule ahead of it is true too, so it never fires.
    Shadowed {
        /// The rule.
        rule: String,
        /// The rules ahead of it that are true whenever it is (one, when one alone covers it).
        by: Vec<String>,
    },
    /// With no default, some states match no rule.
    Uncovered {
        /// How many of the enumerated states match no rule.
        count: u64,
        /// How many states were enumerated.
        total: u64,
        /// One such state: each atom and its value.
        example: Vec<(String, bool)>,
    },
    /// Two rules of equal priority can both be true (declaration order decides).
    Overlap {
        /// The rule declared first.
        first: String,
        /// The other.
        second: String,
        /// A state where both are true.
        example: Vec<(String, bool)>,
    },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = |e: &[(String, bool)]| {
            e.iter()
                .map(|(a, v)| format!("{a}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Finding::NeverTrue { rule } => {
                write!(
                    f,
                    "rule {rule:?} can never fire: its condition is never true"
                )
            }
            Finding::Shadowed { rule, by } => write!(
                f,
                "rule {rule:?} can never fire: {} {} true whenever it is",
                by.iter()
                    .map(|b| format!("{b:?}"))
                    .collect::<Vec<_>>()
                    .join(" or "),
                if by.len() == 1 {
                    "(ahead of it) is"
                } else {
                    "(ahead of it) are"
                },
            ),
            Finding::Uncovered {
                count,
                total,
                example,
            } => write!(
                f,
                "no rule matches {count} of {total} state combinations and there is no default \
                 (the current action stays); for example {}",
                state(example)
            ),
            Finding::Overlap {
                first,
                second,
                example,
            } => write!(
                f,
                "rules {first:?} and {second:?} have equal priority and can both be true \
                 (declaration order picks {first:?}); for example {}",
                state(example)
            ),
        }
    }
}

/// What the lint found for one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lint {
    /// The findings, in rule order.
    pub findings: Vec<Finding>,
    /// Checks skipped because they involve more than [`MAX_EXACT_ATOMS`] atoms; empty when the
    /// lint was exact.
    pub partial: Vec<String>,
    /// Caveats about the model (comparisons treated as independent atoms).
    pub notes: Vec<String>,
}

/// Boolean logic over atoms.
#[derive(Clone, Debug)]
enum Formula {
    Const(bool),
    Atom(usize),
    Not(Box<Formula>),
    And(Vec<Formula>),
    Or(Vec<Formula>),
}

impl Formula {
    fn eval(&self, v: &[bool]) -> bool {
        match self {
            Formula::Const(b) => *b,
            Formula::Atom(i) => v.get(*i).copied().unwrap_or(false),
            Formula::Not(f) => !f.eval(v),
            Formula::And(fs) => fs.iter().all(|f| f.eval(v)),
            Formula::Or(fs) => fs.iter().any(|f| f.eval(v)),
        }
    }

    fn atoms(&self, out: &mut Vec<usize>) {
        match self {
            Formula::Const(_) => {}
            Formula::Atom(i) => {
                if !out.contains(i) {
                    out.push(*i);
                }
            }
            Formula::Not(f) => f.atoms(out),
            Formula::And(fs) | Formula::Or(fs) => fs.iter().for_each(|f| f.atoms(out)),
        }
    }
}

/// Atoms by name, and whether any is a comparison.
#[derive(Default)]
struct Atoms {
    names: Vec<String>,
    opaque: Vec<String>,
}

impl Atoms {
    fn of(&mut self, name: String) -> usize {
        if let Some(i) = self.names.iter().position(|n| *n == name) {
            return i;
        }
        self.names.push(name);
        self.names.len() - 1
    }

    fn formula(&mut self, e: &Expr) -> Formula {
        match &e.kind {
            ExprKind::Bool(b) => Formula::Const(*b),
            ExprKind::Name(n) => Formula::Atom(self.of(n.clone())),
            ExprKind::Not(inner) => Formula::Not(Box::new(self.formula(inner))),
            ExprKind::And(es) => Formula::And(es.iter().map(|e| self.formula(e)).collect()),
            ExprKind::Or(es) => Formula::Or(es.iter().map(|e| self.formula(e)).collect()),
            _ => {
                let text = e.to_string();
                if !self.opaque.contains(&text) {
                    self.opaque.push(text.clone());
                }
                Formula::Atom(self.of(text))
            }
        }
    }
}

/// Lints one group: its rules (in declaration order) and whether it has a default. Rules
/// whose `when` does not parse or type-check against `schema` are left out (validation
/// reports them).
#[must_use]
pub fn lint(rules: &[LintRule<'_>], has_default: bool, schema: &Schema) -> Lint {
    let mut atoms = Atoms::default();
    let mut order: Vec<Ordered<'_, '_>> = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let Ok(e) = parse(r.when) else { continue };
        if type_of(&e, schema) != Ok(Type::Bool) {
            continue;
        }
        order.push((i, r, atoms.formula(&e)));
    }
    // Evaluation order: priority (higher first), then declaration order.
    order.sort_by_key(|(i, r, _)| (std::cmp::Reverse(r.priority), *i));
    let mut out = Lint::default();
    unreachable_rules(&order, &atoms, &mut out);
    if !has_default && !order.is_empty() {
        uncovered(&order, &atoms, &mut out);
    }
    overlaps(&order, &atoms, &mut out);
    if !atoms.opaque.is_empty() {
        out.notes.push(format!(
            "comparisons are treated as independent true/false atoms: {}",
            atoms.opaque.join(", ")
        ));
    }
    out
}

/// A rule that parsed and type-checked: its declaration index, the rule, its formula.
type Ordered<'r, 'a> = (usize, &'r LintRule<'a>, Formula);

/// An assignment of atoms as the names and values a finding shows.
fn example(atoms: &Atoms, assign: &[(usize, bool)]) -> Vec<(String, bool)> {
    assign
        .iter()
        .map(|(a, v)| (atoms.names.get(*a).cloned().unwrap_or_default(), *v))
        .collect()
}

/// Finds the rules of `order` (evaluation order) that are never true, or never true while
/// every rule ahead of them is false.
fn unreachable_rules(order: &[Ordered<'_, '_>], atoms: &Atoms, out: &mut Lint) {
    for k in 0..order.len() {
        let Some((_, rule, f)) = order.get(k) else {
            continue;
        };
        let ahead = order.get(..k).unwrap_or(&[]);
        let mut used = Vec::new();
        for (_, _, g) in ahead.iter().chain(std::iter::once(&order[k])) {
            g.atoms(&mut used);
        }
        if used.len() > MAX_EXACT_ATOMS {
            out.partial.push(format!(
                "whether rule {:?} can fire was not checked: it and the rules ahead of it read {} \
                 atoms (more than {MAX_EXACT_ATOMS})",
                rule.id,
                used.len()
            ));
            continue;
        }
        let (mut fires, mut ever) = (false, false);
        let mut always: Vec<bool> = vec![true; ahead.len()];
        let mut sometimes: Vec<bool> = vec![false; ahead.len()];
        enumerate(&used, atoms.names.len(), |v, _| {
            if !f.eval(v) {
                return true;
            }
            ever = true;
            let mut any = false;
            for (j, (_, _, g)) in ahead.iter().enumerate() {
                let t = g.eval(v);
                any |= t;
                if let Some(s) = sometimes.get_mut(j) {
                    *s |= t;
                }
                if let Some(a) = always.get_mut(j) {
                    *a &= t;
                }
            }
            fires |= !any;
            !fires
        });
        if !ever {
            out.findings.push(Finding::NeverTrue {
                rule: rule.id.to_owned(),
            });
        } else if !fires {
            let pick = |flags: &[bool]| -> Vec<String> {
                ahead
                    .iter()
                    .zip(flags)
                    .filter(|(_, f)| **f)
                    .map(|((_, r, _), _)| r.id.to_owned())
                    .collect()
            };
            let alone = pick(&always);
            let by = match alone.first() {
                Some(one) => vec![one.clone()],
                None => pick(&sometimes),
            };
            out.findings.push(Finding::Shadowed {
                rule: rule.id.to_owned(),
                by,
            });
        }
    }
}

/// Counts the states in which no rule of `order` is true (for a group without a default).
fn uncovered(order: &[Ordered<'_, '_>], atoms: &Atoms, out: &mut Lint) {
    let mut used = Vec::new();
    for (_, _, g) in order {
        g.atoms(&mut used);
    }
    if used.len() > MAX_EXACT_ATOMS {
        out.partial.push(format!(
            "coverage without a default was not checked: the rules read {} atoms (more than \
             {MAX_EXACT_ATOMS})",
            used.len()
        ));
        return;
    }
    let (mut count, mut total, mut first) = (0u64, 0u64, None);
    enumerate(&used, atoms.names.len(), |v, assign| {
        total += 1;
        if !order.iter().any(|(_, _, g)| g.eval(v)) {
            count += 1;
            first.get_or_insert_with(|| example(atoms, assign));
        }
        true
    });
    if let Some(example) = first {
        out.findings.push(Finding::Uncovered {
            count,
            total,
            example,
        });
    }
}

/// Finds the pairs of equal-priority rules of `order` that can both be true.
fn overlaps(order: &[Ordered<'_, '_>], atoms: &Atoms, out: &mut Lint) {
    for (k, (_, a, fa)) in order.iter().enumerate() {
        for (_, b, fb) in order
            .iter()
            .skip(k + 1)
            .filter(|(_, b, _)| b.priority == a.priority)
        {
            let mut used = Vec::new();
            fa.atoms(&mut used);
            fb.atoms(&mut used);
            if used.len() > MAX_EXACT_ATOMS {
                out.partial.push(format!(
                    "whether rules {:?} and {:?} overlap was not checked: they read {} atoms",
                    a.id,
                    b.id,
                    used.len()
                ));
                continue;
            }
            let mut hit = None;
            enumerate(&used, atoms.names.len(), |v, assign| {
                if fa.eval(v) && fb.eval(v) {
                    hit = Some(example(atoms, assign));
                }
                hit.is_none()
            });
            if let Some(example) = hit {
                out.findings.push(Finding::Overlap {
                    first: a.id.to_owned(),
                    second: b.id.to_owned(),
                    example,
                });
            }
        }
    }
}

/// Calls `visit(values, assignment)` for every assignment of `used` (the other atoms false)
/// until it returns false.
fn enumerate(used: &[usize], n: usize, mut visit: impl FnMut(&[bool], &[(usize, bool)]) -> bool) {
    let mut values = vec![false; n];
    let mut assign: Vec<(usize, bool)> = used.iter().map(|&a| (a, false)).collect();
    for mask in 0u64..(1u64 << used.len()) {
        for (bit, (a, v)) in assign.iter_mut().enumerate() {
            *v = mask & (1 << bit) != 0;
            if let Some(slot) = values.get_mut(*a) {
                *slot = *v;
            }
        }
        if !visit(&values, &assign) {
            return;
        }
    }
}

#[cfg(test)]
#[path = "lint_tests.rs"]
mod tests;
