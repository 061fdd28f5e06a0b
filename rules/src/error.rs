//! Errors of the expression language: what went wrong, and where, as line, column and a caret
//! line under the source.
//!
//! Every stage (`syntax`, `check`, `compile`) reports one [`Error`]: the first problem found,
//! with a byte [`Span`] into the source and, computed from it, a 1-based line and column
//! (columns count characters, not bytes). Its `Display` is three lines:
//!
//! ```text
//! expected AND, OR or ')', found name "c" at 1:12
//!   (a AND b c)
//!            ^
//! ```

use std::fmt;

use crate::check::Type;
use crate::syntax::CmpOp;

/// A byte range `start..end` into the source text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    /// The span `start..end`.
    #[must_use]
    pub const fn new(start: usize, end: usize) -> Self {
        Self { start, end }
    }

    /// The smallest span covering both `self` and `other`.
    #[must_use]
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// What went wrong, without the position.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A character that starts no token (`@`, a single `&` or `=`).
    #[error("unexpected character {found:?}{}", hint_for(*.found))]
    UnexpectedChar {
        /// The character.
        found: char,
    },
    /// The input ended inside a token.
    #[error("unexpected end of input")]
    UnexpectedEnd,
    /// A name with an empty segment: `a..b`, `a.`.
    #[error("name {name:?} has an empty segment (two dots in a row, or a dot at an end)")]
    EmptySegment {
        /// The name as written.
        name: String,
    },
    /// A string literal without its closing `"`.
    #[error("unterminated string: missing the closing '\"'")]
    UnterminatedString,
    /// A backslash followed by something other than `"`, `\`, `n` or `t`.
    #[error("unknown escape {found:?} in a string: use \\\", \\\\, \\n or \\t")]
    BadEscape {
        /// The escape as written, such as `\x`.
        found: String,
    },
    /// A number literal too large to represent.
    #[error("number {text} is out of range")]
    NumberOutOfRange {
        /// The literal as written.
        text: String,
    },
    /// The tokens do not form an expression.
    #[error("expected {}, found {found}", or_list(expected))]
    Syntax {
        /// What would have been accepted here, in a fixed order.
        expected: Vec<String>,
        /// What was there instead (`end of input` at the end).
        found: String,
    },
    /// A name the schema does not define.
    #[error("unknown name {name:?}{}", match suggestion {
        Some(s) => format!("; did you mean {s:?}?"),
        None => String::new(),
    })]
    UnknownName {
        /// The name as written.
        name: String,
        /// The closest defined name, if one is close enough to be a likely typo.
        suggestion: Option<String>,
    },
    /// An operand of `NOT`, `AND` or `OR` that is not bool.
    #[error("{operator} needs bool operands, found {found}")]
    NotBoolOperand {
        /// `NOT`, `AND` or `OR`.
        operator: &'static str,
        /// The operand's type.
        found: Type,
    },
    /// `==`/`!=`/`in` between different types, or `<`, `<=`, `>`, `>=` on non-numbers.
    #[error("{}", incomparable(*.op, *.lhs, *.rhs))]
    Incomparable {
        /// The comparison (`in` is reported as `==`, per item).
        op: CmpOp,
        /// Type of the left operand.
        lhs: Type,
        /// Type of the right operand (or of the list item).
        rhs: Type,
    },
    /// The whole expression is not bool.
    #[error("an expression must be bool (true or false), found {found}")]
    NotBool {
        /// The expression's type.
        found: Type,
    },
    /// Parentheses (or brackets) nested deeper than the limit.
    #[error("parentheses nested more than {limit} deep")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// More `NOT`s in a row than the limit.
    #[error("more than {limit} NOTs in a row")]
    TooManyNots {
        /// The limit.
        limit: usize,
    },
    /// More instructions or constants than a program can index (2^32).
    #[error("expression too large")]
    TooLarge,
}

fn hint_for(c: char) -> &'static str {
    match c {
        '=' => "; use '==' to compare",
        '&' => "; use '&&' or AND",
        '|' => "; use '||' or OR",
        _ => "",
    }
}

fn incomparable(op: CmpOp, lhs: Type, rhs: Type) -> String {
    if op.is_ordering() {
        let bad = if lhs == Type::Number { rhs } else { lhs };
        format!("'{op}' compares numbers, found {bad}")
    } else {
        format!("cannot compare {lhs} with {rhs}")
    }
}

/// `a`, `a or b`, `a, b or c`.
fn or_list(items: &[String]) -> String {
    match items {
        [] => "something else".to_owned(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// An error with its position in the source: see the [module docs](self). Boxed inside, so a
/// `Result` carrying it stays one pointer wide.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "{} at {}:{}\n  {}\n  {}",
    .0.kind, .0.line, .0.column, .0.source_line, .0.caret
)]
pub struct Error(Box<Located>);

#[derive(Clone, Debug, PartialEq)]
struct Located {
    kind: ErrorKind,
    span: Span,
    line: usize,
    column: usize,
    source_line: String,
    caret: String,
}

impl Error {
    /// Places `kind` at `span` of `source`. A span past the end is clamped to it.
    #[must_use]
    pub fn new(kind: ErrorKind, span: Span, source: &str) -> Self {
        let start = floor_char_boundary(source, span.start);
        let end = floor_char_boundary(source, span.end.max(start));
        let before = &source[..start];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line_end = source[start..]
            .find('\n')
            .map_or(source.len(), |i| start + i);
        let line = before.matches('\n').count() + 1;
        let column = source[line_start..start].chars().count() + 1;
        let source_line = source[line_start..line_end].trim_end_matches('\r');
        let mut caret: String = source[line_start..start]
            .chars()
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        let width = source[start..end.min(line_end)].chars().count().max(1);
        caret.extend(std::iter::repeat_n('^', width));
        Self(Box::new(Located {
            kind,
            span,
            line,
            column,
            source_line: source_line.to_owned(),
            caret,
        }))
    }

    /// What went wrong.
    #[must_use]
    pub fn kind(&self) -> &ErrorKind {
        &self.0.kind
    }

    /// Where, in bytes of the source.
    #[must_use]
    pub fn span(&self) -> Span {
        self.0.span
    }

    /// 1-based line of the span's start.
    #[must_use]
    pub fn line(&self) -> usize {
        self.0.line
    }

    /// 1-based column of the span's start, in characters.
    #[must_use]
    pub fn column(&self) -> usize {
        self.0.column
    }

    /// The source line holding the span's start, without its line break.
    #[must_use]
    pub fn source_line(&self) -> &str {
        &self.0.source_line
    }

    /// Spaces (tabs where the source line has tabs) and `^` under the span's first line.
    #[must_use]
    pub fn caret(&self) -> &str {
        &self.0.caret
    }

    /// The message without the position: `unknown name "x"`.
    #[must_use]
    pub fn message(&self) -> String {
        self.0.kind.to_string()
    }
}

/// `index` clamped to `s.len()` and moved down to a character boundary.
fn floor_char_boundary(s: &str, index: usize) -> usize {
    let mut i = index.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_is_line_and_character_column() {
        let src = "a AND\n  é OR @";
        let at = src.find('@').unwrap_or_default();
        let e = Error::new(
            ErrorKind::UnexpectedChar { found: '@' },
            Span::new(at, at + 1),
            src,
        );
        assert_eq!((e.line(), e.column()), (2, 8));
        assert_eq!(e.source_line(), "  é OR @");
        assert_eq!(e.caret(), "       ^");
        assert_eq!(
            e.to_string(),
            "unexpected character '@' at 2:8\n    é OR @\n         ^"
        );
    }

    #[test]
    fn span_at_end_of_input_points_past_the_last_character() {
        let e = Error::new(ErrorKind::UnterminatedString, Span::new(99, 99), "ab\r\ncd");
        assert_eq!((e.line(), e.column()), (2, 3));
        assert_eq!(e.caret(), "  ^");
    }

    #[test]
    fn caret_keeps_tabs_and_underlines_the_span() {
        let e = Error::new(
            ErrorKind::NotBool {
                found: Type::Number,
            },
            Span::new(2, 5),
            "\t x12 ",
        );
        assert_eq!(e.caret(), "\t ^^^");
    }
}
