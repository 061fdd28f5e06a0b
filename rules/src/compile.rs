//! Compilation: a checked expression → a [`Compiled`] program, a flat list of instructions
//! with every name resolved to its [`Slot`] and every literal in a constant table.
//!
//! The program works on one bool accumulator, so boolean logic needs no stack:
//!
//! ```text
//! a AND NOT b AND x >= 0.5          0 load a             (acc = a)
//!                                   1 jump-if-false 6    (AND: stop at the first false)
//!                                   2 load b
//!                                   3 not
//!                                   4 jump-if-false 6
//!                                   5 cmp x >= #0        (#0 is the constant 0.5)
//!                                   6 (end: the result is acc)
//! ```
//!
//! A comparison is one instruction reading two operands: a slot, a constant, or — when an
//! operand is a parenthesized bool expression — the accumulator. Only when *both* sides are
//! parenthesized expressions is the left one saved on a 64-bit bit stack; every value pushed
//! and not yet popped belongs to an enclosing pair of parentheses, and the parser allows at
//! most [`MAX_NESTING`] of those, so the stack cannot overflow. Evaluation (in
//! [`crate::eval`]) walks the list once with a program counter: no recursion, no allocation,
//! no calls.

use crate::check::{Schema, Slot, check};
use crate::error::{Error, ErrorKind, Span};
use crate::eval::Value;
use crate::syntax::{CmpOp, Expr, ExprKind, MAX_NESTING, parse};

// The bit stack holds 64 values; pushes outstanding ≤ parenthesis nesting ≤ MAX_NESTING.
const _: () = assert!(MAX_NESTING <= 64);

/// Where a comparison reads an operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    /// A state value.
    Slot(Slot),
    /// An entry of the constant table.
    Const(u32),
    /// The accumulator: the bool the preceding instructions computed.
    Acc,
    /// The bool most recently pushed by [`Op::Push`] (popped by reading it).
    Pop,
}

/// One instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Op {
    /// `acc = b`.
    Const(bool),
    /// `acc = ` the bool in the slot; unset (or not a bool) reads as false.
    Load(Slot),
    /// `acc = !acc`.
    Not,
    /// Jump to the instruction if `acc` is false (the rest of an `AND` chain is skipped).
    JumpIfFalse(u32),
    /// Jump to the instruction if `acc` is true (the rest of an `OR` chain is skipped).
    JumpIfTrue(u32),
    /// Save `acc` on the bit stack.
    Push,
    /// `acc = lhs op rhs`; false if either is unset.
    Cmp {
        /// The comparison.
        op: CmpOp,
        /// Left operand.
        lhs: Operand,
        /// Right operand.
        rhs: Operand,
    },
    /// `acc = lhs in items[start..start + len]`; items are slots or constants.
    In {
        /// The value looked for.
        lhs: Operand,
        /// First item in the item table.
        start: u32,
        /// How many items.
        len: u32,
    },
}

/// A compiled expression: evaluate it with [`Compiled::eval`]. Built by [`compile`].
#[derive(Clone, Debug)]
pub struct Compiled {
    pub(crate) source: String,
    pub(crate) ops: Box<[Op]>,
    pub(crate) consts: Box<[Value]>,
    pub(crate) items: Box<[Operand]>,
    /// Sorted, without duplicates.
    pub(crate) reads: Box<[Slot]>,
    /// `names[i]` is the name of `reads[i]`.
    pub(crate) names: Box<[String]>,
}

impl Compiled {
    /// The expression's source text.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The slots the expression reads, in slot order, each once: re-evaluate it when one of
    /// them changes, and only then.
    #[must_use]
    pub fn reads(&self) -> &[Slot] {
        &self.reads
    }

    /// The names the expression reads with their slots, in slot order.
    pub fn read_names(&self) -> impl Iterator<Item = (&str, Slot)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.reads.iter().copied())
    }

    /// How many instructions the program has (its size, for tests and statistics).
    #[must_use]
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the program is empty (never: every expression compiles to one instruction at
    /// least).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Parses `source`, checks it against `schema` and compiles it.
///
/// # Errors
///
/// The first problem, placed in `source`: a syntax error of [`parse`], then a type or name
/// error of [`check`], then [`ErrorKind::TooLarge`] from [`compile_expr`].
pub fn compile(source: &str, schema: &Schema) -> Result<Compiled, Error> {
    let expr = parse(source)?;
    compile_expr(&expr, schema, source)
}

/// Checks and compiles an already parsed `expr` (parsed from `source`, for error positions).
///
/// # Errors
///
/// The errors of [`check`], and [`ErrorKind::TooLarge`] for a program with more instructions,
/// constants or list items than a `u32` indexes.
pub fn compile_expr(expr: &Expr, schema: &Schema, source: &str) -> Result<Compiled, Error> {
    check(expr, schema, source)?;
    let mut b = Builder {
        schema,
        ops: Vec::new(),
        consts: Vec::new(),
        items: Vec::new(),
        reads: Vec::new(),
    };
    b.code(expr)
        .map_err(|(kind, span)| Error::new(kind, span, source))?;
    let mut reads = b.reads;
    reads.sort_unstable();
    reads.dedup();
    let names = reads
        .iter()
        .map(|&s| schema.name(s).unwrap_or_default().to_owned())
        .collect();
    Ok(Compiled {
        source: source.to_owned(),
        ops: b.ops.into(),
        consts: b.consts.into(),
        items: b.items.into(),
        reads: reads.into(),
        names,
    })
}

type Fail = (ErrorKind, Span);

struct Builder<'a> {
    schema: &'a Schema,
    ops: Vec<Op>,
    consts: Vec<Value>,
    items: Vec<Operand>,
    reads: Vec<Slot>,
}

impl Builder<'_> {
    fn index(n: usize, span: Span) -> Result<u32, Fail> {
        u32::try_from(n).map_err(|_| (ErrorKind::TooLarge, span))
    }

    fn slot(&mut self, name: &str, span: Span) -> Result<Slot, Fail> {
        let (slot, _) = self.schema.get(name).ok_or_else(|| {
            let kind = ErrorKind::UnknownName {
                name: name.to_owned(),
                suggestion: None,
            };
            (kind, span)
        })?;
        self.reads.push(slot);
        Ok(slot)
    }

    /// The operand for a literal or name; `None` for an expression that needs code.
    fn simple(&mut self, e: &Expr) -> Result<Option<Operand>, Fail> {
        let value = match &e.kind {
            ExprKind::Name(n) => return self.slot(n, e.span).map(|s| Some(Operand::Slot(s))),
            ExprKind::Bool(b) => Value::Bool(*b),
            ExprKind::Number(n) => Value::Number(*n),
            ExprKind::Str(s) => Value::String(s.as_str().into()),
            _ => return Ok(None),
        };
        let index = if let Some(i) = self.consts.iter().position(|c| *c == value) {
            i
        } else {
            self.consts.push(value);
            self.consts.len() - 1
        };
        Ok(Some(Operand::Const(Self::index(index, e.span)?)))
    }

    /// The operand for `e`, emitting its code first if it is not a literal or name.
    fn operand(&mut self, e: &Expr) -> Result<Operand, Fail> {
        match self.simple(e)? {
            Some(o) => Ok(o),
            None => self.code(e).map(|()| Operand::Acc),
        }
    }

    /// Emits code leaving the value of bool expression `e` in the accumulator.
    fn code(&mut self, e: &Expr) -> Result<(), Fail> {
        match &e.kind {
            ExprKind::Bool(b) => self.ops.push(Op::Const(*b)),
            ExprKind::Name(n) => {
                let slot = self.slot(n, e.span)?;
                self.ops.push(Op::Load(slot));
            }
            ExprKind::Number(_) | ExprKind::Str(_) => {
                // Unreachable after `check`; compile to false rather than panic.
                self.ops.push(Op::Const(false));
            }
            ExprKind::Not(inner) => {
                self.code(inner)?;
                self.ops.push(Op::Not);
            }
            ExprKind::And(operands) => self.chain(operands, true, e.span)?,
            ExprKind::Or(operands) => self.chain(operands, false, e.span)?,
            ExprKind::Compare { op, lhs, rhs, .. } => {
                let (l, r) = match (self.simple(lhs)?, self.simple(rhs)?) {
                    (Some(l), Some(r)) => (l, r),
                    (None, Some(r)) => (self.operand(lhs)?, r),
                    (Some(l), None) => (l, self.operand(rhs)?),
                    (None, None) => {
                        self.code(lhs)?;
                        self.ops.push(Op::Push);
                        self.code(rhs)?;
                        (Operand::Pop, Operand::Acc)
                    }
                };
                self.ops.push(Op::Cmp {
                    op: *op,
                    lhs: l,
                    rhs: r,
                });
            }
            ExprKind::In { lhs, items } => {
                let lhs = self.operand(lhs)?;
                let start = Self::index(self.items.len(), e.span)?;
                for item in items {
                    let o = match self.simple(item)? {
                        Some(o) => o,
                        // The parser admits only literals and names as items.
                        None => Operand::Const(u32::MAX),
                    };
                    self.items.push(o);
                }
                let len = Self::index(items.len(), e.span)?;
                self.ops.push(Op::In { lhs, start, len });
            }
        }
        Ok(())
    }

    /// `a AND b AND c` (`and`) or `a OR b OR c`: each operand, then a jump past the rest
    /// when the accumulator already decides the chain.
    fn chain(&mut self, operands: &[Expr], and: bool, span: Span) -> Result<(), Fail> {
        let mut jumps = Vec::with_capacity(operands.len());
        for (i, operand) in operands.iter().enumerate() {
            self.code(operand)?;
            if i + 1 < operands.len() {
                jumps.push(self.ops.len());
                self.ops.push(if and {
                    Op::JumpIfFalse(0)
                } else {
                    Op::JumpIfTrue(0)
                });
            }
        }
        let end = Self::index(self.ops.len(), span)?;
        for j in jumps {
            if let Some(Op::JumpIfFalse(t) | Op::JumpIfTrue(t)) = self.ops.get_mut(j) {
                *t = end;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Type;

    fn schema() -> Schema {
        let mut s = Schema::new();
        for (n, t) in [("a", Type::Bool), ("b", Type::Bool), ("x", Type::Number)] {
            assert!(s.define(n, t).is_ok());
        }
        s
    }

    #[test]
    fn chains_jump_to_their_end() {
        let c = compile("a AND NOT b AND x >= 0.5", &schema());
        let ops = c.map(|c| c.ops.to_vec()).unwrap_or_default();
        let (a, b, x) = (Slot::new(0), Slot::new(1), Slot::new(2));
        assert_eq!(
            ops,
            vec![
                Op::Load(a),
                Op::JumpIfFalse(6),
                Op::Load(b),
                Op::Not,
                Op::JumpIfFalse(6),
                Op::Cmp {
                    op: CmpOp::Ge,
                    lhs: Operand::Slot(x),
                    rhs: Operand::Const(0)
                },
            ]
        );
    }

    #[test]
    fn reads_are_sorted_and_unique() {
        let c = compile("x > 1 OR (b AND x < 3) OR b", &schema());
        assert_eq!(
            c.as_ref().map(|c| c.reads().to_vec()).unwrap_or_default(),
            vec![Slot::new(1), Slot::new(2)]
        );
        let names: Vec<(String, Slot)> = c
            .map(|c| c.read_names().map(|(n, s)| (n.to_owned(), s)).collect())
            .unwrap_or_default();
        assert_eq!(
            names,
            vec![
                ("b".to_owned(), Slot::new(1)),
                ("x".to_owned(), Slot::new(2))
            ]
        );
    }

    #[test]
    fn the_bit_stack_holds_as_many_values_as_parentheses_nest() {
        // `(a OR b) == ((a OR b) == (… (a AND a) …))`: one push per level, MAX_NESTING levels.
        let mut src = "a AND a".to_owned();
        for _ in 0..MAX_NESTING {
            src = format!("(a OR b) == ({src})");
        }
        let c = compile(&src, &schema()).expect("within the nesting limit");
        assert_eq!(
            c.ops.iter().filter(|o| **o == Op::Push).count(),
            MAX_NESTING
        );
        let mut state = crate::State::for_schema(&schema());
        state.set(Slot::new(0), true);
        assert!(c.eval(&state), "true == true all the way up");
        // With a false: level 1 is (false == false) = true, and each level above negates.
        state.set(Slot::new(0), false);
        assert_eq!(c.eval(&state), MAX_NESTING % 2 == 1);
    }
}
