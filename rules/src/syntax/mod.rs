//! Syntax: source text → an abstract syntax tree whose every node carries its [`Span`].
//!
//! Both stages are built with the `chumsky` parser library: a lexer from characters to tokens
//! (`lexer.rs`) and a parser from tokens to [`Expr`] (`parser.rs`). Names are not resolved
//! here and types are not checked; see [`crate::check`]. The grammar is in `docs/rules.md`.

mod lexer;
mod parser;

use std::fmt;

use crate::error::{Error, ErrorKind, Span};

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CmpOp {
    /// Every comparison operator.
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];

    /// `<`, `<=`, `>` and `>=`: defined on numbers only.
    #[must_use]
    pub const fn is_ordering(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }

    /// The operator as written.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An expression node and where it is in the source.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    /// What the node is.
    pub kind: ExprKind,
    /// Its source text: for a parenthesized expression, the inside without the parentheses.
    pub span: Span,
}

/// The kinds of expression node.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// `true`, `false`, `TRUE`, `FALSE`.
    Bool(bool),
    /// `12`, `-3`, `0.5`.
    Number(f64),
    /// `"text"`, escapes already resolved.
    Str(String),
    /// A dotted name: `dc1_api_healthy`, `backend.10.0.1.11.rtt_p99_ms`.
    Name(String),
    /// `NOT e`, `not e`, `!e`.
    Not(Box<Expr>),
    /// `a AND b AND …` (`and`, `&&`): two or more operands, evaluated left to right.
    And(Vec<Expr>),
    /// `a OR b OR …` (`or`, `||`): two or more operands, evaluated left to right.
    Or(Vec<Expr>),
    /// `a == b` and the other comparisons.
    Compare {
        /// The operator.
        op: CmpOp,
        /// Where the operator is written.
        op_span: Span,
        /// Left operand.
        lhs: Box<Expr>,
        /// Right operand.
        rhs: Box<Expr>,
    },
    /// `a in [x, y, z]`: true when `a` equals one of the items.
    In {
        /// The value looked for.
        lhs: Box<Expr>,
        /// The items: literals and names.
        items: Vec<Expr>,
    },
}

impl Expr {
    /// A node.
    #[must_use]
    pub fn new(kind: ExprKind, span: Span) -> Self {
        Self { kind, span }
    }
}

impl fmt::Display for Expr {
    /// Fully parenthesized, with word operators: `((a AND (NOT b) AND c) OR (x >= 1))`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExprKind::Bool(b) => write!(f, "{b}"),
            ExprKind::Number(n) => write!(f, "{n}"),
            ExprKind::Str(s) => write!(f, "\"{}\"", escape(s)),
            ExprKind::Name(n) => f.write_str(n),
            ExprKind::Not(e) => write!(f, "(NOT {e})"),
            ExprKind::And(operands) => chain(f, operands, " AND "),
            ExprKind::Or(operands) => chain(f, operands, " OR "),
            ExprKind::Compare { op, lhs, rhs, .. } => write!(f, "({lhs} {op} {rhs})"),
            ExprKind::In { lhs, items } => {
                write!(f, "({lhs} in [")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("])")
            }
        }
    }
}

/// `(a OP b OP c)`.
fn chain(f: &mut fmt::Formatter<'_>, operands: &[Expr], op: &str) -> fmt::Result {
    f.write_str("(")?;
    for (i, e) in operands.iter().enumerate() {
        if i > 0 {
            f.write_str(op)?;
        }
        write!(f, "{e}")?;
    }
    f.write_str(")")
}

/// `s` with `"`, `\`, newlines and tabs escaped, as a string literal's inside.
#[must_use]
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

/// How deeply parentheses (and `[`) may nest.
pub const MAX_NESTING: usize = 32;

/// How many `NOT`s may stand in a row.
pub const MAX_NOTS: usize = 4;

/// Parses `source` into an expression tree; the first problem is the error.
///
/// Nesting is limited ([`MAX_NESTING`], [`MAX_NOTS`]) before the tree is built, so the stages
/// that walk it recursively — checking, compiling, dropping — stay within a small stack
/// whatever the input.
///
/// # Errors
///
/// The first problem, placed in `source`: a lexical error ([`ErrorKind::UnexpectedChar`],
/// [`ErrorKind::UnexpectedEnd`], [`ErrorKind::EmptySegment`], [`ErrorKind::UnterminatedString`],
/// [`ErrorKind::BadEscape`], [`ErrorKind::NumberOutOfRange`]), then [`ErrorKind::TooDeep`] or
/// [`ErrorKind::TooManyNots`], then [`ErrorKind::Syntax`] for tokens that form no expression.
pub fn parse(source: &str) -> Result<Expr, Error> {
    let tokens = lexer::lex(source)?;
    let (mut depth, mut nots) = (0usize, 0usize);
    for (token, s) in &tokens {
        let at = Span::new(s.start, s.end);
        match token {
            lexer::Token::LParen | lexer::Token::LBracket => depth += 1,
            lexer::Token::RParen | lexer::Token::RBracket => depth = depth.saturating_sub(1),
            _ => {}
        }
        nots = if *token == lexer::Token::Not {
            nots + 1
        } else {
            0
        };
        if depth > MAX_NESTING {
            let kind = ErrorKind::TooDeep { limit: MAX_NESTING };
            return Err(Error::new(kind, at, source));
        }
        if nots > MAX_NOTS {
            let kind = ErrorKind::TooManyNots { limit: MAX_NOTS };
            return Err(Error::new(kind, at, source));
        }
    }
    parser::parse(source, &tokens)
}

/// Whether `s` is a name as the language writes it (one token, not a keyword), such as
/// `pool.dc1-canary.healthy`. Used by [`crate::Schema::define`].
#[must_use]
pub fn is_name(s: &str) -> bool {
    matches!(lexer::lex(s).as_deref(), Ok([(lexer::Token::Name(n), _)]) if *n == s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_may_hold_digits_dashes_and_dots() {
        for ok in [
            "a",
            "_x",
            "dc1_api_healthy",
            "pool.dc1-canary.healthy_ratio",
            "backend.10.0.1.11.rtt_p99_ms",
            "A.B-C.0",
        ] {
            assert!(is_name(ok), "{ok}");
        }
        for bad in [
            "", "1a", "-a", "a.", ".a", "a..b", "a b", "AND", "in", "true", "a:b", "é",
        ] {
            assert!(!is_name(bad), "{bad}");
        }
    }

    #[test]
    fn nesting_and_not_runs_are_limited() {
        let deep = |n: usize| format!("{}a{}", "(".repeat(n), ")".repeat(n));
        assert!(parse(&deep(MAX_NESTING)).is_ok());
        let e = parse(&deep(MAX_NESTING + 1)).err();
        assert_eq!(
            e.map(|e| (e.message(), e.column())),
            Some(("parentheses nested more than 32 deep".into(), 33))
        );
        assert!(parse(&format!("{}a", "NOT ".repeat(MAX_NOTS))).is_ok());
        let e = parse(&format!("{}a", "! ".repeat(MAX_NOTS + 1))).err();
        assert_eq!(
            e.map(|e| (e.message(), e.column())),
            Some(("more than 4 NOTs in a row".into(), 9))
        );
        // A long flat chain is no nesting at all.
        assert!(parse(&vec!["a"; 10_000].join(" AND ")).is_ok());
    }

    #[test]
    fn display_is_fully_parenthesized() {
        let e = parse(r#"NOT a == 1 OR b in ["x\"", 2] && c"#).map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Ok(r#"((NOT (a == 1)) OR ((b in ["x\"", 2]) AND c))"#)
        );
    }
}
