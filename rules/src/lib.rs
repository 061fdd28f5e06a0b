//! Switchyard's rule language — one small, safe expression language for decision rules, derived
//! state variables and `require` — and the decision engine. Pure: no aya, no async runtime, no kernel.
//!
//! ```
//! use rules::{Schema, State, Type, compile};
//!
//! let mut schema = Schema::new();
//! let api = schema.define("dc1_api_healthy", Type::Bool)?;
//! let ratio = schema.define("pool.dc1.healthy_ratio", Type::Number)?;
//! let rule = compile("dc1_api_healthy AND pool.dc1.healthy_ratio >= 0.5", &schema)?;
//! assert_eq!(rule.reads(), &[api, ratio]);
//!
//! let mut state = State::for_schema(&schema);
//! assert!(!rule.eval(&state)); // unset values make comparisons false
//! state.set(api, true);
//! state.set(ratio, 0.75);
//! assert!(rule.eval(&state));
//! assert_eq!(
//!     rule.explain(&state).to_string(),
//!     "true: dc1_api_healthy = true, pool.dc1.healthy_ratio = 0.75"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The stages, one module each: [`syntax`] (text → tree with spans), [`check`] (types and
//! names against a [`Schema`]), [`compile`](mod@compile) (tree → a flat program over slots) and [`eval`]
//! (running it over a [`State`] without allocating). Errors carry line, column and a caret
//! line ([`Error`]). The language is described in `docs/rules.md`.
//!
//! The decision engine ([`engine`]) runs decision groups over rule truth values: switching
//! policy, overrides, safety rules, audit and explain; [`lint`](mod@lint) checks a group for rules that
//! never fire, uncovered states and overlaps. The agent (`router-userspace`'s `engine` module)
//! drives it from live state and publishes each group's action as one decision word.

pub mod check;
pub mod compile;
pub mod engine;
pub mod error;
pub mod eval;
pub mod lint;
pub mod syntax;

pub use check::{Schema, SchemaError, Slot, Type};
pub use compile::{Compiled, compile};
pub use error::{Error, ErrorKind, Span};
pub use eval::{Explanation, Reading, State, Value};
pub use lint::{Finding, Lint, LintRule, lint};
