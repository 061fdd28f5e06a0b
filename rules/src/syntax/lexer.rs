//! The lexer: characters → tokens with byte spans, built with `chumsky`.
//!
//! Whitespace (spaces, tabs, line breaks) separates tokens and is otherwise ignored. The word
//! and symbol spellings of an operator give the same token (`AND`, `and`, `&&` → [`Token::And`]),
//! so the parser and its messages know one spelling.

use std::fmt;

use chumsky::prelude::*;

use crate::error::{Error, ErrorKind, Span};

/// A token. Literals and names borrow the source.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Token<'src> {
    /// `true`, `TRUE`, `false`, `FALSE`.
    Bool(bool),
    /// A number literal, already converted.
    Num(f64),
    /// A string literal's inside, escapes not yet resolved (the lexer checked them).
    Str(&'src str),
    /// A dotted name.
    Name(&'src str),
    Not,
    And,
    Or,
    In,
    Cmp(crate::syntax::CmpOp),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
}

impl fmt::Display for Token<'_> {
    /// How a token is named in a message: `AND`, `')'`, `name "x"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Bool(b) => write!(f, "{b}"),
            Token::Num(n) => write!(f, "number {n}"),
            Token::Str(s) => write!(f, "string \"{s}\""),
            Token::Name(n) => write!(f, "name {n:?}"),
            Token::Not => f.write_str("NOT"),
            Token::And => f.write_str("AND"),
            Token::Or => f.write_str("OR"),
            Token::In => f.write_str("in"),
            Token::Cmp(op) => write!(f, "'{op}'"),
            Token::LParen => f.write_str("'('"),
            Token::RParen => f.write_str("')'"),
            Token::LBracket => f.write_str("'['"),
            Token::RBracket => f.write_str("']'"),
            Token::Comma => f.write_str("','"),
        }
    }
}

type Extra<'src> = extra::Err<Rich<'src, char>>;

/// The word a bare identifier stands for: a keyword, or a name.
fn word(w: &str) -> Token<'_> {
    match w {
        "true" | "TRUE" => Token::Bool(true),
        "false" | "FALSE" => Token::Bool(false),
        "not" | "NOT" => Token::Not,
        "and" | "AND" => Token::And,
        "or" | "OR" => Token::Or,
        "in" | "IN" => Token::In,
        _ => Token::Name(w),
    }
}

fn lexer<'src>() -> impl Parser<'src, &'src str, Vec<(Token<'src>, SimpleSpan)>, Extra<'src>> {
    use crate::syntax::CmpOp;

    let number = just('-')
        .or_not()
        .then(text::digits(10))
        .then(just('.').then(text::digits(10)).or_not())
        .to_slice()
        .validate(|text: &str, e, emitter| match text.parse::<f64>() {
            Ok(n) if n.is_finite() => Token::Num(n),
            _ => {
                emitter.emit(Rich::custom(e.span(), format!("number:{text}")));
                Token::Num(0.0)
            }
        });

    // Greedy over name characters and dots, then checked for empty segments, so `a..b` and
    // `a.` are reported as one bad name rather than as a stray '.'.
    let name = any()
        .filter(|c: &char| c.is_ascii_alphabetic() || *c == '_')
        .then(
            any()
                .filter(|c: &char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                .repeated(),
        )
        .to_slice()
        .validate(|text: &str, e, emitter| {
            if text.split('.').any(str::is_empty) {
                emitter.emit(Rich::custom(e.span(), format!("name:{text}")));
            }
            word(text)
        });

    let escape = just('\\').then(any()).validate(|(_, c), e, emitter| {
        if !matches!(c, '"' | '\\' | 'n' | 't') {
            emitter.emit(Rich::custom(e.span(), format!("escape:\\{c}")));
        }
    });
    let string = just('"')
        .ignore_then(
            none_of("\"\\")
                .ignored()
                .or(escape.ignored())
                .repeated()
                .to_slice(),
        )
        .then(just('"').or_not())
        .validate(|(inside, close), e, emitter| {
            if close.is_none() {
                emitter.emit(Rich::custom(e.span(), "unterminated"));
            }
            Token::Str(inside)
        });

    let symbol = choice((
        just("==").to(Token::Cmp(CmpOp::Eq)),
        just("!=").to(Token::Cmp(CmpOp::Ne)),
        just("<=").to(Token::Cmp(CmpOp::Le)),
        just(">=").to(Token::Cmp(CmpOp::Ge)),
        just("<").to(Token::Cmp(CmpOp::Lt)),
        just(">").to(Token::Cmp(CmpOp::Gt)),
        just("&&").to(Token::And),
        just("||").to(Token::Or),
        just("!").to(Token::Not),
        just("(").to(Token::LParen),
        just(")").to(Token::RParen),
        just("[").to(Token::LBracket),
        just("]").to(Token::RBracket),
        just(",").to(Token::Comma),
        // Likely typos of `==`, `&&` and `||`: reported as such, lexed as what was meant.
        one_of("=&|").validate(|c: char, e, emitter| {
            emitter.emit(Rich::custom(e.span(), format!("char:{c}")));
            match c {
                '&' => Token::And,
                '|' => Token::Or,
                _ => Token::Cmp(CmpOp::Eq),
            }
        }),
    ));

    choice((number, string, name, symbol))
        .map_with(|token, e| (token, e.span()))
        .padded()
        .repeated()
        .collect()
        .padded()
        .then_ignore(end())
}

/// Splits `source` into tokens, or reports the first character that starts none.
pub(crate) fn lex(source: &str) -> Result<Vec<(Token<'_>, SimpleSpan)>, Error> {
    lexer().parse(source).into_result().map_err(|errors| {
        let Some(first) = errors.into_iter().min_by_key(|e| e.span().start) else {
            return Error::new(ErrorKind::UnexpectedEnd, Span::default(), source);
        };
        let span = Span::new(first.span().start, first.span().end);
        let kind = match first.reason() {
            chumsky::error::RichReason::Custom(msg) => custom_kind(msg),
            chumsky::error::RichReason::ExpectedFound { found, .. } => match found.as_deref() {
                Some(&found) => ErrorKind::UnexpectedChar { found },
                None => ErrorKind::UnexpectedEnd,
            },
        };
        Error::new(kind, span, source)
    })
}

/// Decodes the custom errors the lexer emits: `KIND:DETAIL` (`number:1e999`, `char:=`, …).
fn custom_kind(msg: &str) -> ErrorKind {
    if let Some(text) = msg.strip_prefix("number:") {
        ErrorKind::NumberOutOfRange {
            text: text.to_owned(),
        }
    } else if let Some(found) = msg.strip_prefix("char:").and_then(|c| c.chars().next()) {
        ErrorKind::UnexpectedChar { found }
    } else if let Some(name) = msg.strip_prefix("name:") {
        ErrorKind::EmptySegment {
            name: name.to_owned(),
        }
    } else if let Some(found) = msg.strip_prefix("escape:") {
        ErrorKind::BadEscape {
            found: found.to_owned(),
        }
    } else {
        ErrorKind::UnterminatedString
    }
}

/// Resolves the escapes of a string token's inside (the lexer accepted only valid ones).
pub(crate) fn unescape(inside: &str) -> String {
    let mut out = String::with_capacity(inside.len());
    let mut chars = inside.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Token<'_>> {
        lex(src)
            .map(|ts| ts.into_iter().map(|(t, _)| t).collect())
            .unwrap_or_default()
    }

    #[test]
    fn word_and_symbol_spellings_lex_alike() {
        assert_eq!(kinds("AND and &&"), vec![Token::And; 3]);
        assert_eq!(kinds("OR or ||"), vec![Token::Or; 3]);
        assert_eq!(kinds("NOT not !"), vec![Token::Not; 3]);
        assert_eq!(kinds("in IN"), vec![Token::In; 2]);
        assert_eq!(
            kinds("true TRUE false FALSE True"),
            vec![
                Token::Bool(true),
                Token::Bool(true),
                Token::Bool(false),
                Token::Bool(false),
                Token::Name("True"),
            ]
        );
    }

    #[test]
    fn numbers_names_and_strings() {
        assert_eq!(
            kinds(r#"x>-1.5 a-1 !=0 "q\"\\""#),
            vec![
                Token::Name("x"),
                Token::Cmp(crate::syntax::CmpOp::Gt),
                Token::Num(-1.5),
                Token::Name("a-1"),
                Token::Cmp(crate::syntax::CmpOp::Ne),
                Token::Num(0.0),
                Token::Str(r#"q\"\\"#),
            ]
        );
        assert_eq!(unescape(r#"q\"\\\n\t"#), "q\"\\\n\t");
    }

    #[test]
    fn spans_are_byte_offsets() {
        let spans: Vec<(usize, usize)> = lex("\"ü\" ==\n x")
            .map(|ts| ts.into_iter().map(|(_, s)| (s.start, s.end)).collect())
            .unwrap_or_default();
        assert_eq!(spans, vec![(0, 4), (5, 7), (9, 10)]);
    }

    #[test]
    fn lexer_errors_name_the_problem() {
        let err = |src: &str| lex(src).err().map(|e| (e.message(), e.line(), e.column()));
        assert_eq!(
            err("a = 1"),
            Some(("unexpected character '='; use '==' to compare".into(), 1, 3))
        );
        assert_eq!(
            err("a &\n b"),
            Some(("unexpected character '&'; use '&&' or AND".into(), 1, 3))
        );
        assert_eq!(
            err("x == \"abc"),
            Some(("unterminated string: missing the closing '\"'".into(), 1, 6))
        );
        assert_eq!(
            err(r#"x == "a\qb""#),
            Some((
                r#"unknown escape "\\q" in a string: use \", \\, \n or \t"#.into(),
                1,
                8
            ))
        );
        assert_eq!(
            err("pool..x OR a"),
            Some((
                r#"name "pool..x" has an empty segment (two dots in a row, or a dot at an end)"#
                    .into(),
                1,
                1
            ))
        );
        assert_eq!(err("a.").map(|(_, l, c)| (l, c)), Some((1, 1)));
        let big = format!("x > 1{}", "0".repeat(400));
        assert_eq!(err(&big).map(|(_, l, c)| (l, c)), Some((1, 5)));
    }
}
