//! The `HAProxy` agent-check protocol: what one answer line says.
//!
//! The agent writes one ASCII line of words separated by spaces, tabs or commas, case
//! insensitive (`HAProxy`'s configuration manual, `agent-check`):
//!
//! | word | meaning here |
//! |---|---|
//! | `NN%` (0 to 100) | `agent_score = NN / 100` |
//! | `ready` | clears `drain` and `maint` |
//! | `drain` | weight 0: no new flows, tracked flows stay |
//! | `maint` | weight 0, like `drain` |
//! | `up` | clears `down` |
//! | `down`, `failed`, `stopped` | weight 0 until `up` (a `#` ends the line: what follows is a description) |
//! | `maxconn:N` | accepted, no effect (the balancer has no connection limit) |
//!
//! An answer changes only what it names: `50%` alone leaves a drain in place. A line with any
//! other word is refused as a whole, and the previous answer stands.

use std::fmt;

/// The longest answer read, in bytes; the rest of a longer line is refused.
pub const MAX_ANSWER: usize = 512;

/// The operator state an agent sets with `ready`, `drain` and `maint`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Admin {
    /// In service.
    #[default]
    Ready,
    /// No new flows; tracked flows stay.
    Drain,
    /// Out of service (treated like `Drain`: the health check decides about tracked flows).
    Maint,
}

impl fmt::Display for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Admin::Ready => "ready",
            Admin::Drain => "drain",
            Admin::Maint => "maint",
        })
    }
}

/// What one answer line says; `None`: the line does not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// `NN%`.
    pub percent: Option<u8>,
    /// `ready`, `drain`, `maint`.
    pub admin: Option<Admin>,
    /// `up` (`true`), `down`/`failed`/`stopped` (`false`).
    pub up: Option<bool>,
}

/// Why an answer line was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// Nothing but separators.
    #[error("empty answer")]
    Empty,
    /// Not text.
    #[error("the answer is not ASCII text")]
    NotText,
    /// Longer than [`MAX_ANSWER`].
    #[error("the answer is longer than {MAX_ANSWER} bytes")]
    TooLong,
    /// A word the protocol does not have.
    #[error("unknown word {0:?} in the answer")]
    UnknownWord(String),
    /// `NN%` out of range or not a number.
    #[error("{0:?} is not a weight from 0% to 100%")]
    BadPercent(String),
}

/// Reads one answer line (without or with its line end).
///
/// # Errors
///
/// A line that is empty, not ASCII, too long, or has a word the protocol does not have.
pub fn parse(line: &[u8]) -> Result<Answer, AnswerError> {
    if line.len() > MAX_ANSWER {
        return Err(AnswerError::TooLong);
    }
    let text = std::str::from_utf8(line)
        .ok()
        .filter(|t| t.is_ascii())
        .ok_or(AnswerError::NotText)?;
    // A `#` starts a description (after `down` and its kind): not words.
    let words = text.split('#').next().unwrap_or_default();
    let mut answer = Answer::default();
    let mut any = false;
    for word in words
        .split([' ', '\t', ',', '\r', '\n'])
        .filter(|w| !w.is_empty())
    {
        any = true;
        let lower = word.to_ascii_lowercase();
        match lower.as_str() {
            "ready" => answer.admin = Some(Admin::Ready),
            "drain" => answer.admin = Some(Admin::Drain),
            "maint" => answer.admin = Some(Admin::Maint),
            "up" => answer.up = Some(true),
            "down" | "failed" | "stopped" => answer.up = Some(false),
            w if w.starts_with("maxconn:") => {}
            w => match w.strip_suffix('%') {
                Some(n) => match n.parse::<u8>() {
                    Ok(p) if p <= 100 && !n.starts_with('+') => answer.percent = Some(p),
                    _ => return Err(AnswerError::BadPercent(word.to_owned())),
                },
                None => return Err(AnswerError::UnknownWord(word.to_owned())),
            },
        }
    }
    if any {
        Ok(answer)
    } else {
        Err(AnswerError::Empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_percentages_and_separators() {
        assert_eq!(
            parse(b"75%\n"),
            Ok(Answer {
                percent: Some(75),
                ..Answer::default()
            })
        );
        assert_eq!(
            parse(b"up, ready,50%"),
            Ok(Answer {
                percent: Some(50),
                admin: Some(Admin::Ready),
                up: Some(true)
            })
        );
        assert_eq!(parse(b"DRAIN\r\n").map(|a| a.admin), Ok(Some(Admin::Drain)));
        assert_eq!(parse(b"maint").map(|a| a.admin), Ok(Some(Admin::Maint)));
        assert_eq!(
            parse(b"down#disk full, sorry").map(|a| a.up),
            Ok(Some(false))
        );
        assert_eq!(parse(b"stopped\tmaxconn:30").map(|a| a.up), Ok(Some(false)));
        assert_eq!(parse(b"0%").map(|a| a.percent), Ok(Some(0)));
        assert_eq!(parse(b"100%").map(|a| a.percent), Ok(Some(100)));
        // The last word of a kind wins.
        assert_eq!(
            parse(b"drain ready").map(|a| a.admin),
            Ok(Some(Admin::Ready))
        );
    }

    #[test]
    fn garbage_is_refused_with_what_was_wrong() {
        assert_eq!(parse(b""), Err(AnswerError::Empty));
        assert_eq!(parse(b" ,\t\r\n"), Err(AnswerError::Empty));
        assert_eq!(parse(b"#only a comment"), Err(AnswerError::Empty));
        assert_eq!(
            parse(b"50% sleepy"),
            Err(AnswerError::UnknownWord("sleepy".into()))
        );
        for bad in ["101%", "-5%", "+5%", "%", "x%", "1e2%", "99999999999%"] {
            assert_eq!(
                parse(bad.as_bytes()),
                Err(AnswerError::BadPercent(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(parse(&[0xff, 0xfe, b'u', b'p']), Err(AnswerError::NotText));
        assert_eq!(parse("üp".as_bytes()), Err(AnswerError::NotText));
        assert_eq!(parse(&[b'u'; MAX_ANSWER + 1]), Err(AnswerError::TooLong));
        assert_eq!(
            AnswerError::UnknownWord("x".into()).to_string(),
            "unknown word \"x\" in the answer"
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // Every byte pair, and a few longer mixes of the protocol's own characters.
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let _ = parse(&[a, b]);
            }
        }
        for s in [
            "%%%", "1%%", "#", "##down", ",,%", "maxconn:", "255%", "00100%",
        ] {
            let _ = parse(s.as_bytes());
        }
    }
}
