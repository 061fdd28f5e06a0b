//! Property: for random well-typed expressions and random states (unset and NaN values
//! included), the compiled program gives the same answer as a plain tree-walking interpreter
//! written here from the documented semantics. The expression reaches the compiler as text
//! printed with random operator spellings and the fewest parentheses precedence allows, so the
//! parser's precedence and associativity are under test too.

use proptest::prelude::*;
use rules::syntax::{CmpOp, Expr, ExprKind, escape};
use rules::{Schema, Span, State, Type, Value, compile};

const BOOLS: [&str; 4] = ["b0", "pool.dc1.healthy", "backend.10.0.1.11.healthy", "b-3"];
const NUMBERS: [&str; 3] = [
    "n0",
    "pool.dc1.healthy_ratio",
    "backend.10.0.1.11.rtt_p99_ms",
];
const STRINGS: [&str; 2] = ["s0", "region.mode"];
const NUMBER_VALUES: [f64; 5] = [-1.5, 0.0, 0.5, 1.0, 3.0];
const STRING_VALUES: [&str; 4] = ["", "a", "b c", "q\"\\x"];

fn schema() -> Schema {
    let mut s = Schema::new();
    let typed = BOOLS
        .iter()
        .map(|n| (n, Type::Bool))
        .chain(NUMBERS.iter().map(|n| (n, Type::Number)))
        .chain(STRINGS.iter().map(|n| (n, Type::String)));
    for (name, ty) in typed {
        s.define(name, ty).expect("valid name");
    }
    s
}

fn node(kind: ExprKind) -> Expr {
    Expr::new(kind, Span::default())
}

fn name(n: &str) -> Expr {
    node(ExprKind::Name(n.to_owned()))
}

fn bool_atom() -> impl Strategy<Value = Expr> {
    prop_oneof![
        any::<bool>().prop_map(|b| node(ExprKind::Bool(b))),
        prop::sample::select(&BOOLS[..]).prop_map(name),
    ]
}

fn number_atom() -> impl Strategy<Value = Expr> {
    prop_oneof![
        prop::sample::select(&NUMBER_VALUES[..]).prop_map(|n| node(ExprKind::Number(n))),
        prop::sample::select(&NUMBERS[..]).prop_map(name),
    ]
}

fn string_atom() -> impl Strategy<Value = Expr> {
    prop_oneof![
        prop::sample::select(&STRING_VALUES[..]).prop_map(|s| node(ExprKind::Str(s.to_owned()))),
        prop::sample::select(&STRINGS[..]).prop_map(name),
    ]
}

fn cmp(op: CmpOp, lhs: Expr, rhs: Expr) -> Expr {
    node(ExprKind::Compare {
        op,
        op_span: Span::default(),
        lhs: Box::new(lhs),
        rhs: Box::new(rhs),
    })
}

fn is_in(lhs: Expr, items: Vec<Expr>) -> Expr {
    node(ExprKind::In {
        lhs: Box::new(lhs),
        items,
    })
}

fn equality() -> impl Strategy<Value = CmpOp> {
    prop::sample::select(&[CmpOp::Eq, CmpOp::Ne][..])
}

/// A well-typed bool expression.
fn bool_expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        3 => bool_atom(),
        2 => (prop::sample::select(&CmpOp::ALL[..]), number_atom(), number_atom())
            .prop_map(|(op, l, r)| cmp(op, l, r)),
        1 => (equality(), string_atom(), string_atom()).prop_map(|(op, l, r)| cmp(op, l, r)),
        1 => (equality(), bool_atom(), bool_atom()).prop_map(|(op, l, r)| cmp(op, l, r)),
        1 => (number_atom(), prop::collection::vec(number_atom(), 1..4))
            .prop_map(|(l, items)| is_in(l, items)),
        1 => (string_atom(), prop::collection::vec(string_atom(), 1..3))
            .prop_map(|(l, items)| is_in(l, items)),
    ];
    leaf.prop_recursive(6, 48, 2, |inner| {
        prop_oneof![
            // At most two NOTs in a row: the parser refuses more than four (MAX_NOTS).
            2 => inner.clone().prop_map(|e| match &e.kind {
                ExprKind::Not(inside) if matches!(inside.kind, ExprKind::Not(_)) => e,
                _ => node(ExprKind::Not(Box::new(e))),
            }),
            3 => prop::collection::vec(inner.clone(), 2..4)
                .prop_map(|operands| node(ExprKind::And(operands))),
            3 => prop::collection::vec(inner.clone(), 2..4)
                .prop_map(|operands| node(ExprKind::Or(operands))),
            1 => (equality(), inner.clone(), inner.clone()).prop_map(|(op, l, r)| cmp(op, l, r)),
            1 => (equality(), inner.clone(), bool_atom()).prop_map(|(op, l, r)| cmp(op, l, r)),
            1 => (inner.clone(), prop::collection::vec(bool_atom(), 1..3))
                .prop_map(|(l, items)| is_in(l, items)),
        ]
    })
}

/// A random value for every slot of the schema (or unset, or NaN for a number).
fn state() -> impl Strategy<Value = Vec<Value>> {
    let b = prop_oneof![Just(Value::Unset), any::<bool>().prop_map(Value::Bool)];
    let n = prop_oneof![
        1 => Just(Value::Unset),
        1 => Just(Value::Number(f64::NAN)),
        6 => prop::sample::select(&NUMBER_VALUES[..]).prop_map(Value::Number),
    ];
    let s = prop_oneof![
        Just(Value::Unset),
        prop::sample::select(&STRING_VALUES[..]).prop_map(Value::from),
    ];
    (
        prop::collection::vec(b, BOOLS.len()),
        prop::collection::vec(n, NUMBERS.len()),
        prop::collection::vec(s, STRINGS.len()),
    )
        .prop_map(|(b, n, s)| b.into_iter().chain(n).chain(s).collect())
}

// --- The reference interpreter: a direct reading of docs/rules.md, "Unset values". ---

#[derive(Debug, PartialEq)]
enum V<'a> {
    Unset,
    B(bool),
    N(f64),
    S(&'a str),
}

struct Interp<'a> {
    schema: &'a Schema,
    values: &'a [Value],
}

impl<'a> Interp<'a> {
    fn lookup(&self, n: &str) -> V<'a> {
        let slot = self.schema.get(n).map(|(s, _)| s.index());
        match slot.and_then(|i| self.values.get(i)) {
            Some(Value::Bool(b)) => V::B(*b),
            Some(Value::Number(x)) if !x.is_nan() => V::N(*x),
            Some(Value::String(s)) => V::S(s),
            _ => V::Unset,
        }
    }

    fn value<'e: 'a>(&self, e: &'e Expr) -> V<'a> {
        match &e.kind {
            ExprKind::Bool(b) => V::B(*b),
            ExprKind::Number(x) => V::N(*x),
            ExprKind::Str(s) => V::S(s),
            ExprKind::Name(n) => self.lookup(n),
            _ => V::B(self.truth(e)),
        }
    }

    #[expect(
        clippy::float_cmp,
        reason = "the reference interpreter compares numbers exactly, as the language does"
    )]
    fn compare(op: CmpOp, l: V<'_>, r: V<'_>) -> bool {
        match (l, r) {
            (V::Unset, _) | (_, V::Unset) => false,
            (V::N(a), V::N(b)) => match op {
                CmpOp::Eq => a == b,
                CmpOp::Ne => a != b,
                CmpOp::Lt => a < b,
                CmpOp::Le => a <= b,
                CmpOp::Gt => a > b,
                CmpOp::Ge => a >= b,
            },
            (l, r) => match op {
                CmpOp::Eq => l == r,
                CmpOp::Ne => l != r,
                _ => unreachable!("ordering on non-numbers is a type error"),
            },
        }
    }

    fn truth<'e: 'a>(&self, e: &'e Expr) -> bool {
        match &e.kind {
            ExprKind::Bool(b) => *b,
            ExprKind::Name(n) => self.lookup(n) == V::B(true),
            ExprKind::Not(a) => !self.truth(a),
            ExprKind::And(operands) => operands.iter().all(|e| self.truth(e)),
            ExprKind::Or(operands) => operands.iter().any(|e| self.truth(e)),
            ExprKind::Compare { op, lhs, rhs, .. } => {
                Self::compare(*op, self.value(lhs), self.value(rhs))
            }
            ExprKind::In { lhs, items } => items
                .iter()
                .any(|i| Self::compare(CmpOp::Eq, self.value(lhs), self.value(i))),
            ExprKind::Number(_) | ExprKind::Str(_) => unreachable!("not bool"),
        }
    }
}

// --- Printing with the fewest parentheses and random spellings. ---

struct Printer {
    seed: u64,
}

impl Printer {
    fn pick<'s>(&mut self, options: &[&'s str]) -> &'s str {
        // xorshift64: cheap, deterministic from the proptest-chosen seed.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let i = self.seed % options.len() as u64;
        options[usize::try_from(i).expect("below options.len()")]
    }

    fn precedence(e: &Expr) -> u8 {
        match e.kind {
            ExprKind::Or(..) => 1,
            ExprKind::And(..) => 2,
            ExprKind::Not(_) => 3,
            ExprKind::Compare { .. } | ExprKind::In { .. } => 4,
            _ => 5,
        }
    }

    /// `e`, parenthesized if its precedence is below `min` (or, sometimes, needlessly).
    fn print(&mut self, e: &Expr, min: u8) -> String {
        let inner = self.bare(e);
        if Self::precedence(e) < min || self.pick(&["", "", "", "", "", "", "", "("]) == "(" {
            format!("({inner})")
        } else {
            inner
        }
    }

    /// `e` without parentheses around it.
    fn bare(&mut self, e: &Expr) -> String {
        match &e.kind {
            ExprKind::Bool(b) => self
                .pick(if *b {
                    &["true", "TRUE"]
                } else {
                    &["false", "FALSE"]
                })
                .to_owned(),
            ExprKind::Number(x) => format!("{x}"),
            ExprKind::Str(s) => format!("\"{}\"", escape(s)),
            ExprKind::Name(n) => n.clone(),
            ExprKind::Not(a) => {
                let op = self.pick(&["NOT ", "not ", "!", "! "]);
                format!("{op}{}", self.print(a, 3))
            }
            ExprKind::And(operands) => {
                // An operand that is itself a chain needs parentheses, or it would join this one.
                let mut out = String::new();
                for (i, e) in operands.iter().enumerate() {
                    if i > 0 {
                        let op = self.pick(&["AND", "and", "&&"]);
                        let space = self.pick(&[" ", "\n  "]);
                        out += " ";
                        out += op;
                        out += space;
                    }
                    out += &self.print(e, 3);
                }
                out
            }
            ExprKind::Or(operands) => {
                let mut out = String::new();
                for (i, e) in operands.iter().enumerate() {
                    if i > 0 {
                        out += " ";
                        out += self.pick(&["OR", "or", "||"]);
                        out += " ";
                    }
                    out += &self.print(e, 2);
                }
                out
            }
            ExprKind::Compare { op, lhs, rhs, .. } => {
                format!("{} {op} {}", self.print(lhs, 5), self.print(rhs, 5))
            }
            ExprKind::In { lhs, items } => {
                // List items are literals and names: never parenthesized.
                let items: Vec<String> = items.iter().map(|i| self.bare(i)).collect();
                let op = self.pick(&["in", "IN"]);
                format!("{} {op} [{}]", self.print(lhs, 5), items.join(", "))
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn compiled_evaluator_agrees_with_the_interpreter(
        expr in bool_expr(),
        values in prop::collection::vec(state(), 1..6),
        seed in 1u64..,
    ) {
        let schema = schema();
        let src = Printer { seed }.print(&expr, 0);
        let compiled = compile(&src, &schema)
            .map_err(|e| TestCaseError::fail(format!("{src}\n{e}")))?;
        // The parser rebuilt the generated tree (spans aside).
        let reparsed = rules::syntax::parse(&src).map(|e| e.to_string()).ok();
        prop_assert_eq!(reparsed, Some(expr.to_string()), "{}", src);
        for values in values {
            let mut state = State::for_schema(&schema);
            for (i, v) in values.iter().enumerate() {
                state.set(rules::Slot::new(u32::try_from(i).unwrap_or(u32::MAX)), v.clone());
            }
            let want = Interp { schema: &schema, values: &values }.truth(&expr);
            prop_assert_eq!(compiled.eval(&state), want, "{}\n{:?}", src, values);
        }
    }
}
