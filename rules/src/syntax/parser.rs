//! The parser: tokens → [`Expr`], built with `chumsky` combinators.
//!
//! One combinator per precedence level, tightest first: an atom (a literal, a name or a
//! parenthesized expression), a comparison (`atom op atom`, `atom in [..]`; not chained), any
//! number of `NOT`s before a comparison, then `AND`, then `OR`. A chain of `AND`s (or `OR`s) is
//! one node with all its operands, so a long chain is not a deep tree.

use chumsky::{input::ValueInput, prelude::*};

use super::lexer::{Token, unescape};
use super::{CmpOp, Expr, ExprKind};
use crate::error::{Error, ErrorKind, Span};

type Extra<'t, 's> = extra::Err<Rich<'t, Token<'s>, SimpleSpan>>;

/// Labels the parser gives in "expected …" messages, in the order messages list them.
const ORDER: [&str; 11] = [
    EXPRESSION, OPERAND, VALUE, COMPARISON, "in", "AND", "OR", "')'", "']'", "','", END,
];
const EXPRESSION: &str = "an expression";
const OPERAND: &str = "an operand";
const VALUE: &str = "a name or literal";
const COMPARISON: &str = "a comparison";
const END: &str = "end of input";

fn span(s: SimpleSpan) -> Span {
    Span::new(s.start, s.end)
}

/// What may follow an atom in a comparison.
enum Tail {
    Cmp(CmpOp, Span, Expr),
    In(Vec<Expr>),
}

fn expr_parser<'t, 's: 't, I>() -> impl Parser<'t, I, Expr, Extra<'t, 's>> + Clone
where
    I: ValueInput<'t, Token = Token<'s>, Span = SimpleSpan>,
{
    recursive(|expr| {
        let value = select! {
            Token::Bool(b) => ExprKind::Bool(b),
            Token::Num(n) => ExprKind::Number(n),
            Token::Str(s) => ExprKind::Str(unescape(s)),
            Token::Name(n) => ExprKind::Name(n.to_owned()),
        }
        .map_with(|kind, e| Expr::new(kind, span(e.span())))
        .labelled(VALUE);

        let parenthesized = expr
            .delimited_by(just(Token::LParen), just(Token::RParen))
            .map_with(|inner: Expr, e| Expr::new(inner.kind, span(e.span())));
        let atom = value.or(parenthesized).labelled(OPERAND);

        let list = value
            .separated_by(just(Token::Comma))
            .at_least(1)
            .collect::<Vec<_>>()
            .delimited_by(just(Token::LBracket), just(Token::RBracket));
        let cmp_op = select! { Token::Cmp(op) => op }
            .map_with(|op, e| (op, span(e.span())))
            .labelled(COMPARISON);
        let tail = cmp_op
            .then(atom.clone())
            .map(|((op, op_span), rhs)| Tail::Cmp(op, op_span, rhs))
            .or(just(Token::In).ignore_then(list).map(Tail::In));
        let comparison = atom
            .then(tail.or_not())
            .map_with(|(lhs, tail), e| match tail {
                None => lhs,
                Some(Tail::Cmp(op, op_span, rhs)) => Expr::new(
                    ExprKind::Compare {
                        op,
                        op_span,
                        lhs: Box::new(lhs),
                        rhs: Box::new(rhs),
                    },
                    span(e.span()),
                ),
                Some(Tail::In(items)) => Expr::new(
                    ExprKind::In {
                        lhs: Box::new(lhs),
                        items,
                    },
                    span(e.span()),
                ),
            });

        let not = just(Token::Not)
            .map_with(|_, e| span(e.span()))
            .repeated()
            .foldr(comparison, |not_span, operand| {
                let whole = not_span.to(operand.span);
                Expr::new(ExprKind::Not(Box::new(operand)), whole)
            })
            .labelled(EXPRESSION);

        let and = not
            .separated_by(just(Token::And))
            .at_least(1)
            .collect::<Vec<_>>()
            .map_with(|operands, e| chain(operands, span(e.span()), ExprKind::And));
        and.separated_by(just(Token::Or))
            .at_least(1)
            .collect::<Vec<_>>()
            .map_with(|operands, e| chain(operands, span(e.span()), ExprKind::Or))
    })
}

/// One operand as itself; two or more as an `AND` or `OR` node (`make`).
fn chain(mut operands: Vec<Expr>, whole: Span, make: fn(Vec<Expr>) -> ExprKind) -> Expr {
    if operands.len() == 1
        && let Some(only) = operands.pop()
    {
        return only;
    }
    Expr::new(make(operands), whole)
}

/// Parses lexed `tokens` of `source`.
pub(crate) fn parse(source: &str, tokens: &[(Token<'_>, SimpleSpan)]) -> Result<Expr, Error> {
    let eoi = SimpleSpan::from(source.len()..source.len());
    let input = tokens.map(eoi, |(t, s)| (t, s));
    expr_parser()
        .then_ignore(end())
        .parse(input)
        .into_result()
        .map_err(|errors| {
            let first = errors.into_iter().min_by_key(|e| e.span().start);
            match first {
                Some(e) => Error::new(syntax_kind(&e), span(*e.span()), source),
                None => Error::new(
                    ErrorKind::Syntax {
                        expected: vec![EXPRESSION.to_owned()],
                        found: END.to_owned(),
                    },
                    Span::new(source.len(), source.len()),
                    source,
                ),
            }
        })
}

/// "expected A, B or C, found D" from chumsky's error, the expected items in [`ORDER`].
fn syntax_kind(e: &Rich<'_, Token<'_>, SimpleSpan>) -> ErrorKind {
    use chumsky::error::{RichPattern, RichReason};
    let (expected, found) = match e.reason() {
        RichReason::ExpectedFound { expected, found } => (
            expected
                .iter()
                .map(|p| match p {
                    RichPattern::Token(t) => t.to_string(),
                    RichPattern::Label(l) => l.to_string(),
                    RichPattern::Identifier(i) => i.clone(),
                    RichPattern::EndOfInput => END.to_owned(),
                    _ => "something else".to_owned(),
                })
                .collect::<Vec<_>>(),
            found
                .as_deref()
                .map_or_else(|| END.to_owned(), Token::to_string),
        ),
        RichReason::Custom(msg) => (Vec::new(), msg.clone()),
    };
    let rank = |s: &String| ORDER.iter().position(|o| o == s).unwrap_or(ORDER.len());
    let mut expected = expected;
    expected.sort_by_key(rank);
    expected.dedup();
    ErrorKind::Syntax { expected, found }
}

#[cfg(test)]
mod tests {
    use crate::syntax::parse;

    fn err(src: &str) -> String {
        match parse(src) {
            Ok(e) => format!("parsed as {e}"),
            Err(e) => format!("{} at {}:{}", e.message(), e.line(), e.column()),
        }
    }

    #[test]
    fn missing_operator_inside_parentheses() {
        assert_eq!(
            err("(a == b c)"),
            "expected AND, OR or ')', found name \"c\" at 1:9"
        );
    }

    #[test]
    fn error_after_an_operand_lists_what_may_follow() {
        assert_eq!(
            err("a b"),
            "expected a comparison, in, AND, OR or end of input, found name \"b\" at 1:3"
        );
    }

    #[test]
    fn missing_operand() {
        assert_eq!(
            err("a AND"),
            "expected an expression, found end of input at 1:6"
        );
        assert_eq!(err(""), "expected an expression, found end of input at 1:1");
        assert_eq!(
            err("a == "),
            "expected an operand, found end of input at 1:6"
        );
    }

    #[test]
    fn comparisons_do_not_chain() {
        assert_eq!(
            err("a < b < c"),
            "expected AND, OR or end of input, found '<' at 1:7"
        );
    }

    #[test]
    fn unclosed_list_and_parenthesis() {
        assert_eq!(
            err("x in [1, 2"),
            "expected ']' or ',', found end of input at 1:11"
        );
        assert_eq!(
            err("x in [1,]"),
            "expected a name or literal, found ']' at 1:9"
        );
        assert_eq!(
            err("x in []"),
            "expected a name or literal, found ']' at 1:7"
        );
        assert_eq!(
            err("(a OR\n b"),
            "expected a comparison, in, AND, OR or ')', found end of input at 2:3"
        );
    }
}
