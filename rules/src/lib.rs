//! The rule language and the decision engine (state-driven failover).
//!
//! Not built yet: decision groups, state variables and `to: { decide: GROUP }` arrive with the
//! failover issue. Until then the agent rejects those configuration keys with a clear
//! "not supported yet" error.

pub mod engine;
