//! Evaluation: values, the [`State`] a program reads, and [`Compiled::eval`].
//!
//! Evaluation allocates nothing and runs no code but the program's own instructions: one pass
//! over a flat instruction list (jumps only go forward), reading slots and constants by
//! reference. A slot past the end of the state reads as unset; nothing panics.
//!
//! **Unset values.** A slot holds a value or [`Value::Unset`] (a probe that has not answered
//! yet, a variable never set). The rules, which `docs/rules.md` repeats with examples:
//!
//! - every comparison with an unset operand is false: `==`, `!=`, `<`, `<=`, `>`, `>=`, and
//!   `in` (an unset item matches nothing; an unset left side is in no list);
//! - a bare unset name in a bool position reads as false;
//! - `NOT`, `AND` and `OR` are plain two-valued logic over those results, so `NOT x` is true
//!   when `x` is unset, and `NOT (x == 1)` is true while `x != 1` is false.
//!
//! A value of the wrong type for its slot (the caller's mistake: the schema says bool, the
//! state holds a number), and a number that is NaN, read as unset.

use std::fmt;

use crate::check::{Schema, Slot, Type};
use crate::compile::{Compiled, Op, Operand};
use crate::syntax::{CmpOp, escape};

/// A value in a [`State`] slot, or a constant of a program.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Value {
    /// No value yet. See the [module docs](self) for how it compares.
    #[default]
    Unset,
    /// A bool.
    Bool(bool),
    /// A number.
    Number(f64),
    /// A string.
    String(Box<str>),
}

impl Value {
    /// The value's type; `None` when unset.
    #[must_use]
    pub fn type_of(&self) -> Option<Type> {
        match self {
            Value::Unset => None,
            Value::Bool(_) => Some(Type::Bool),
            Value::Number(_) => Some(Type::Number),
            Value::String(_) => Some(Type::String),
        }
    }

    /// Whether the value is [`Value::Unset`].
    #[must_use]
    pub fn is_unset(&self) -> bool {
        matches!(self, Value::Unset)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<f64> for Value {
    fn from(n: f64) -> Self {
        Value::Number(n)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.into())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s.into())
    }
}

impl fmt::Display for Value {
    /// `true`, `0.75`, `"text"`, `unset`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Unset => f.write_str("unset"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Number(n) => write!(f, "{n}"),
            Value::String(s) => write!(f, "\"{}\"", escape(s)),
        }
    }
}

static UNSET: Value = Value::Unset;

/// The values programs read, indexed by [`Slot`]. Every slot starts unset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    values: Vec<Value>,
}

impl State {
    /// `len` unset slots.
    #[must_use]
    pub fn new(len: usize) -> Self {
        Self {
            values: vec![Value::Unset; len],
        }
    }

    /// One unset slot for every name of `schema`.
    #[must_use]
    pub fn for_schema(schema: &Schema) -> Self {
        Self::new(schema.len())
    }

    /// The value at `slot`; unset past the end.
    #[must_use]
    pub fn get(&self, slot: Slot) -> &Value {
        self.values.get(slot.index()).unwrap_or(&UNSET)
    }

    /// Sets `slot` (growing the state if it is past the end) and says whether the value
    /// changed: only a real change is an event worth re-evaluating for.
    pub fn set(&mut self, slot: Slot, value: impl Into<Value>) -> bool {
        let value = value.into();
        let i = slot.index();
        if i >= self.values.len() {
            if value.is_unset() {
                return false;
            }
            self.values.resize(i + 1, Value::Unset);
        }
        match self.values.get_mut(i) {
            Some(old) if *old != value => {
                *old = value;
                true
            }
            _ => false,
        }
    }

    /// How many slots the state has.
    #[must_use]
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the state has no slot.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// An operand's value during evaluation, borrowed: reading one allocates nothing.
#[derive(Clone, Copy)]
enum Val<'a> {
    Unset,
    Bool(bool),
    Number(f64),
    Str(&'a str),
}

impl<'a> From<&'a Value> for Val<'a> {
    fn from(v: &'a Value) -> Self {
        match v {
            Value::Unset => Val::Unset,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) if n.is_nan() => Val::Unset,
            Value::Number(n) => Val::Number(*n),
            Value::String(s) => Val::Str(s),
        }
    }
}

/// `a op b`; false if either is unset or their types differ.
#[expect(
    clippy::float_cmp,
    reason = "the language's `==` and `!=` compare numbers exactly (`1 == 1.0`, docs/rules.md)"
)]
fn compare(op: CmpOp, a: Val<'_>, b: Val<'_>) -> bool {
    match (a, b) {
        (Val::Number(x), Val::Number(y)) => match op {
            CmpOp::Eq => x == y,
            CmpOp::Ne => x != y,
            CmpOp::Lt => x < y,
            CmpOp::Le => x <= y,
            CmpOp::Gt => x > y,
            CmpOp::Ge => x >= y,
        },
        (Val::Bool(x), Val::Bool(y)) => match op {
            CmpOp::Eq => x == y,
            CmpOp::Ne => x != y,
            _ => false,
        },
        (Val::Str(x), Val::Str(y)) => match op {
            CmpOp::Eq => x == y,
            CmpOp::Ne => x != y,
            _ => false,
        },
        _ => false,
    }
}

impl Compiled {
    /// Evaluates the expression over `state`. Allocates nothing; never panics.
    #[must_use]
    pub fn eval(&self, state: &State) -> bool {
        let mut acc = false;
        let mut stack: u64 = 0;
        let mut pc = 0;
        while let Some(op) = self.ops.get(pc) {
            pc += 1;
            match *op {
                Op::Const(b) => acc = b,
                Op::Load(slot) => acc = matches!(state.get(slot), Value::Bool(true)),
                Op::Not => acc = !acc,
                Op::JumpIfFalse(target) if !acc => pc = target as usize,
                Op::JumpIfTrue(target) if acc => pc = target as usize,
                Op::JumpIfFalse(_) | Op::JumpIfTrue(_) => {}
                Op::Push => stack = (stack << 1) | u64::from(acc),
                Op::Cmp { op, lhs, rhs } => {
                    let l = self.val(lhs, state, acc, &mut stack);
                    let r = self.val(rhs, state, acc, &mut stack);
                    acc = compare(op, l, r);
                }
                Op::In { lhs, start, len } => {
                    let l = self.val(lhs, state, acc, &mut stack);
                    let (start, len) = (start as usize, len as usize);
                    let items = self.items.get(start..start + len).unwrap_or_default();
                    acc = items
                        .iter()
                        .any(|&item| compare(CmpOp::Eq, l, self.val(item, state, acc, &mut 0)));
                }
            }
        }
        acc
    }

    fn val<'a>(&'a self, o: Operand, state: &'a State, acc: bool, stack: &mut u64) -> Val<'a> {
        match o {
            Operand::Slot(slot) => state.get(slot).into(),
            Operand::Const(i) => self.consts.get(i as usize).unwrap_or(&UNSET).into(),
            Operand::Acc => Val::Bool(acc),
            Operand::Pop => {
                let top = *stack & 1 == 1;
                *stack >>= 1;
                Val::Bool(top)
            }
        }
    }

    /// The result over `state` and the value of every variable the expression reads, for
    /// `explain` and audit records. (This one allocates: it is not for the hot path.)
    #[must_use]
    pub fn explain<'a>(&'a self, state: &'a State) -> Explanation<'a> {
        Explanation {
            result: self.eval(state),
            values: self
                .read_names()
                .map(|(name, slot)| Reading {
                    name,
                    slot,
                    value: state.get(slot),
                })
                .collect(),
        }
    }
}

/// One variable an expression read and its value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading<'a> {
    /// The variable's name.
    pub name: &'a str,
    /// Its slot.
    pub slot: Slot,
    /// Its value in the state explained.
    pub value: &'a Value,
}

/// What [`Compiled::explain`] found: the result and the values it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation<'a> {
    /// The expression's value.
    pub result: bool,
    /// Every variable it reads, in slot order.
    pub values: Vec<Reading<'a>>,
}

impl fmt::Display for Explanation<'_> {
    /// `true: dc1_api_healthy = true, pool.dc1.healthy_ratio = 0.5, maintenance_mode = unset`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.result)?;
        for (i, r) in self.values.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { ", " })?;
            write!(f, "{} = {}", r.name, r.value)?;
        }
        Ok(())
    }
}
