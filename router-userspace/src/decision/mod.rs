//! Decision groups: one [`rules::engine::Group`] per configured group, driven from the state
//! store and the health table. Pure: the driver reads state and returns what each group
//! decided ([`Decided`]); the agent's runtime writes the switches into the maps and keeps the
//! audit records ([`Audit`]).
//!
//! Truths come from each rule's compiled `when` (compiled once, with the configuration:
//! [`crate::config::compiled`]); [`rules::engine::Facts`] from the health table and the
//! compiled `require` (evaluated with `target.healthy_count`/`target.healthy_ratio` bound to the
//! candidate's pools); the gate from the `automatic` variable. Event-driven: a change of state
//! re-evaluates only the groups whose rules, `require` or gate read a changed slot; the caller
//! sleeps until [`Driver::next_deadline`] for pending switches and expiring overrides.

mod audit;
mod driver;
mod explain;

pub use audit::{Audit, AuditFile};
pub use driver::{Decided, Driver, DriverError, TIMER, View};
pub use explain::{Condition, GroupExplanation};

/// Audit records kept in memory.
pub const AUDIT_CAPACITY: usize = 1024;

#[cfg(test)]
mod tests;
