//! Types and name resolution: the [`Schema`] of known names, and [`check`], which gives every
//! node of a parsed expression a type and rejects what is ill-typed or unknown.
//!
//! The typing rules:
//!
//! | expression | operands | result |
//! | --- | --- | --- |
//! | literal, name | — | its own type (a name's from the schema) |
//! | `NOT a`, `a AND b`, `a OR b` | bool | bool |
//! | `a == b`, `a != b` | the same type, any | bool |
//! | `a < b`, `a <= b`, `a > b`, `a >= b` | number | bool |
//! | `a in [x, y]` | every item of `a`'s type | bool |
//!
//! and a whole rule must be bool.

use std::collections::HashMap;
use std::fmt;

use crate::error::{Error, ErrorKind, Span};
use crate::syntax::{CmpOp, Expr, ExprKind};

/// The type of a value or an expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    /// `true` or `false`.
    Bool,
    /// A 64-bit float; integers are exact up to 2^53.
    Number,
    /// Text.
    String,
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Type::Bool => "bool",
            Type::Number => "number",
            Type::String => "string",
        })
    }
}

/// Where a name's value lives in a [`crate::State`]: an index the schema hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(u32);

impl Slot {
    /// The slot with index `index`.
    #[must_use]
    pub const fn new(index: u32) -> Self {
        Self(index)
    }

    /// The index into a [`crate::State`].
    #[must_use]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why [`Schema::define`] refused a name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The name cannot be written in an expression (see `docs/rules.md`, "Names").
    #[error(
        "{name:?} is not a valid name: dot-separated segments of letters, digits, '_' or '-', starting with a letter or '_', and not a keyword"
    )]
    InvalidName {
        /// The name.
        name: String,
    },
    /// The name is defined already.
    #[error("{name:?} is defined twice")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// More names than slots.
    #[error("too many names (at most {})", u32::MAX)]
    Full,
}

/// The names an expression may read, each with its slot and type. Built by the caller (the
/// agent: state variables and built-ins such as `pool.dc1.healthy_ratio`); slots are handed
/// out in order from 0, so a [`crate::State`] of [`Schema::len`] slots holds every value.
#[derive(Clone, Debug, Default)]
pub struct Schema {
    by_name: HashMap<String, (Slot, Type)>,
    names: Vec<(String, Type)>,
}

impl Schema {
    /// An empty schema.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Defines `name` with type `ty` and returns its slot, the next free one.
    ///
    /// # Errors
    ///
    /// Nothing is defined when it fails: [`SchemaError::InvalidName`] if `name` cannot be
    /// written in an expression ([`crate::syntax::is_name`]), [`SchemaError::Duplicate`] if it
    /// is defined already, [`SchemaError::Full`] once every `u32` slot is taken.
    pub fn define(&mut self, name: &str, ty: Type) -> Result<Slot, SchemaError> {
        if !crate::syntax::is_name(name) {
            return Err(SchemaError::InvalidName {
                name: name.to_owned(),
            });
        }
        if self.by_name.contains_key(name) {
            return Err(SchemaError::Duplicate {
                name: name.to_owned(),
            });
        }
        let index = u32::try_from(self.names.len()).map_err(|_| SchemaError::Full)?;
        let slot = Slot(index);
        self.by_name.insert(name.to_owned(), (slot, ty));
        self.names.push((name.to_owned(), ty));
        Ok(slot)
    }

    /// The slot and type of `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<(Slot, Type)> {
        self.by_name.get(name).copied()
    }

    /// The name defined at `slot`.
    #[must_use]
    pub fn name(&self, slot: Slot) -> Option<&str> {
        self.names.get(slot.index()).map(|(n, _)| n.as_str())
    }

    /// How many names (and so slots) there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name is defined.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every name with its slot and type, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Slot, Type)> {
        self.names
            .iter()
            .zip(0u32..)
            .map(|((n, t), i)| (n.as_str(), Slot(i), *t))
    }

    /// The defined name closest to `name`, if close enough to be a likely typo.
    #[must_use]
    pub fn closest(&self, name: &str) -> Option<&str> {
        /// Similarity (Jaro–Winkler) above which a name is offered as "did you mean".
        const SIMILAR: f64 = 0.8;
        let mut best: Option<(&str, f64)> = None;
        for (candidate, _) in &self.names {
            let edits = strsim::osa_distance(name, candidate);
            // One edit (or one per four characters) is a typo, unless it rewrites the whole
            // name ("q" is no typo of "a").
            let typo =
                edits <= (candidate.len() / 4).max(1) && edits < name.len().min(candidate.len());
            let jw = strsim::jaro_winkler(name, candidate);
            let score = if typo { jw.max(0.95) } else { jw };
            if score > SIMILAR && best.is_none_or(|(_, b)| score > b) {
                best = Some((candidate, score));
            }
        }
        best.map(|(c, _)| c)
    }
}

/// Checks that `expr`, parsed from `source`, is a well-typed bool expression over `schema`.
///
/// # Errors
///
/// The first problem found, placed in `source`: the errors of [`type_of`], or
/// [`ErrorKind::NotBool`] when the whole expression is well-typed but not bool.
pub fn check(expr: &Expr, schema: &Schema, source: &str) -> Result<(), Error> {
    match type_of(expr, schema) {
        Ok(Type::Bool) => Ok(()),
        Ok(found) => Err(Error::new(ErrorKind::NotBool { found }, expr.span, source)),
        Err((kind, span)) => Err(Error::new(kind, span, source)),
    }
}

/// The type of `expr`, or the first problem and where it is.
///
/// # Errors
///
/// The first problem in evaluation order, with its span: [`ErrorKind::UnknownName`] for a name
/// `schema` does not define (with the closest defined name as a suggestion),
/// [`ErrorKind::NotBoolOperand`] for a `NOT`, `AND` or `OR` operand that is not bool,
/// [`ErrorKind::Incomparable`] for a comparison or `in` between types it does not accept.
pub fn type_of(expr: &Expr, schema: &Schema) -> Result<Type, (ErrorKind, Span)> {
    let bool_operand = |e: &Expr, operator: &'static str| -> Result<(), (ErrorKind, Span)> {
        match type_of(e, schema)? {
            Type::Bool => Ok(()),
            found => Err((ErrorKind::NotBoolOperand { operator, found }, e.span)),
        }
    };
    match &expr.kind {
        ExprKind::Bool(_) => Ok(Type::Bool),
        ExprKind::Number(_) => Ok(Type::Number),
        ExprKind::Str(_) => Ok(Type::String),
        ExprKind::Name(name) => schema.get(name).map(|(_, t)| t).ok_or_else(|| {
            let suggestion = schema.closest(name).map(str::to_owned);
            let kind = ErrorKind::UnknownName {
                name: name.clone(),
                suggestion,
            };
            (kind, expr.span)
        }),
        ExprKind::Not(e) => bool_operand(e, "NOT").map(|()| Type::Bool),
        ExprKind::And(operands) => operands
            .iter()
            .try_for_each(|e| bool_operand(e, "AND"))
            .map(|()| Type::Bool),
        ExprKind::Or(operands) => operands
            .iter()
            .try_for_each(|e| bool_operand(e, "OR"))
            .map(|()| Type::Bool),
        ExprKind::Compare {
            op,
            op_span,
            lhs,
            rhs,
        } => {
            let (l, r) = (type_of(lhs, schema)?, type_of(rhs, schema)?);
            let fits = if op.is_ordering() {
                l == Type::Number && r == Type::Number
            } else {
                l == r
            };
            if fits {
                Ok(Type::Bool)
            } else {
                let kind = ErrorKind::Incomparable {
                    op: *op,
                    lhs: l,
                    rhs: r,
                };
                Err((kind, *op_span))
            }
        }
        ExprKind::In { lhs, items } => {
            let l = type_of(lhs, schema)?;
            for item in items {
                let r = type_of(item, schema)?;
                if r != l {
                    let kind = ErrorKind::Incomparable {
                        op: CmpOp::Eq,
                        lhs: l,
                        rhs: r,
                    };
                    return Err((kind, item.span));
                }
            }
            Ok(Type::Bool)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn define_hands_out_slots_in_order_and_rejects_bad_names() {
        let mut s = Schema::new();
        assert_eq!(s.define("a", Type::Bool), Ok(Slot::new(0)));
        assert_eq!(
            s.define("pool.dc1.healthy_ratio", Type::Number),
            Ok(Slot::new(1))
        );
        assert_eq!(
            s.define("a", Type::Number),
            Err(SchemaError::Duplicate { name: "a".into() })
        );
        assert!(matches!(
            s.define("not", Type::Bool),
            Err(SchemaError::InvalidName { .. })
        ));
        assert!(matches!(
            s.define("backend.2001:db8::1.healthy", Type::Bool),
            Err(SchemaError::InvalidName { .. })
        ));
        assert_eq!(
            s.get("pool.dc1.healthy_ratio"),
            Some((Slot::new(1), Type::Number))
        );
        assert_eq!(s.name(Slot::new(0)), Some("a"));
        assert_eq!(s.len(), 2);
        assert_eq!(s.iter().count(), 2);
    }

    #[test]
    fn closest_finds_typos_and_nothing_far() {
        let mut s = Schema::new();
        for n in [
            "dc1_api_healthy",
            "dc1_db_healthy",
            "pool.dc1.healthy_ratio",
        ] {
            assert!(s.define(n, Type::Bool).is_ok());
        }
        assert_eq!(s.closest("dc1_api_healty"), Some("dc1_api_healthy"));
        assert_eq!(s.closest("dc1_bd_healthy"), Some("dc1_db_healthy"));
        assert_eq!(
            s.closest("pool.dc1.healthy_ration"),
            Some("pool.dc1.healthy_ratio")
        );
        assert_eq!(s.closest("zzz"), None);
        let mut short = Schema::new();
        assert!(short.define("a", Type::Bool).is_ok());
        assert_eq!(short.closest("q"), None);
        assert_eq!(short.closest("A"), None);
    }
}
