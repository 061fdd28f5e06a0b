//! Audit records of switches, vetoes, freezes and overrides, and a bounded ring of them.
//!
//! The engine fills every field it knows; the caller adds what happens after the decision: the
//! microseconds from the triggering event to the completed map write ([`AuditLog::set_latency`])
//! and the values the winning rule read ([`AuditRecord::values`]). A record is one JSON line
//! ([`AuditRecord::to_json_line`]) for a log file that outlives the agent.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::action::{Action, By};
use super::group::SwitchKind;
use super::time::{Time, us};

/// What an audit record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// The published action changed (`switch` says how).
    Switch,
    /// A true rule (or the default) was skipped: its action (`to`) fails `require`. Recorded
    /// once when the veto starts.
    Veto,
    /// The `automatic` gate blocked a switch to `to` that was due. Recorded once per candidate
    /// while the gate stays closed.
    Freeze,
    /// A manual override was set (`to`, `reason`).
    OverrideSet,
    /// A manual override was cleared by command.
    OverrideCleared,
    /// A manual override reached its TTL.
    OverrideExpired,
    /// A backend's circuit breaker changed phase (`group` names the pool; `values` hold
    /// `backend`, `from` and `to`).
    Breaker,
    /// A canary ramp changed state without changing what the group publishes (a pause, a
    /// resume, a step under an override); `values` hold `canary.state`, `canary.step` and
    /// `canary.share`. A change of the share is a `switch` record of switch kind `canary`.
    Canary,
}

/// One audit record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// The position in the [`AuditLog`] (from 1); 0 until pushed.
    pub seq: u64,
    /// Engine time of the evaluation; JSON `at_us`.
    #[serde(rename = "at_us", with = "us")]
    pub at: Time,
    /// The decision group.
    pub group: String,
    /// What the record is about.
    pub kind: AuditKind,
    /// For [`AuditKind::Switch`], the kind of switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<SwitchKind>,
    /// The active action before.
    pub from: Option<Action>,
    /// The new action (switch), the refused one (veto, freeze), or the override's.
    pub to: Option<Action>,
    /// The rule, default or override behind `to`.
    pub by: Option<By>,
    /// The triggering event, as the caller named it.
    pub cause: String,
    /// An override's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The values the rule read (variable → value), filled by the caller.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, String>,
    /// Microseconds from the triggering event to the completed map write, filled by the caller.
    #[serde(default)]
    pub latency_us: Option<u64>,
    /// For a failback, what became of the flows tracked on the pools it left (the group's
    /// `on_failback`), filled by the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<String>,
}

impl AuditRecord {
    pub(super) fn new(at: Time, group: &str, kind: AuditKind, cause: &str) -> Self {
        Self {
            seq: 0,
            at,
            group: group.to_owned(),
            kind,
            switch: None,
            from: None,
            to: None,
            by: None,
            cause: cause.to_owned(),
            reason: None,
            values: BTreeMap::new(),
            latency_us: None,
            flows: None,
        }
    }

    /// A record of a circuit-breaker transition in `pool` at `at`, for `cause`; the caller
    /// fills `values`.
    #[must_use]
    pub fn breaker(at: Time, pool: &str, cause: &str) -> Self {
        Self::new(at, pool, AuditKind::Breaker, cause)
    }

    pub(super) fn moving(mut self, from: Option<&Action>, to: &Action, by: By) -> Self {
        self.from = from.cloned();
        self.to = Some(to.clone());
        self.by = Some(by);
        self
    }

    /// The record as one line of JSON, without the line break.
    ///
    /// # Errors
    ///
    /// `serde_json`'s error. Every field of a record (strings, numbers, actions, a map with
    /// string keys) serializes, so it does not fail in practice.
    pub fn to_json_line(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// A record read back from one line of JSON (as [`to_json_line`](Self::to_json_line)
    /// writes it).
    ///
    /// # Errors
    ///
    /// `serde_json`'s error when `line` is not JSON or not a record's shape.
    pub fn from_json_line(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// A bounded in-memory ring of audit records, oldest first. When full, a push drops the oldest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditLog {
    capacity: usize,
    records: VecDeque<AuditRecord>,
    next_seq: u64,
    evicted: u64,
}

impl AuditLog {
    /// An empty ring that holds at most `capacity` records (0 keeps none, but still numbers
    /// them).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            records: VecDeque::with_capacity(capacity.min(4096)),
            next_seq: 1,
            evicted: 0,
        }
    }

    /// The most records the ring holds.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The number of records held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// How many records were dropped to make room.
    #[must_use]
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Numbers `record`, stores it (dropping the oldest if full) and returns its number.
    pub fn push(&mut self, mut record: AuditRecord) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        record.seq = seq;
        if self.capacity == 0 {
            self.evicted += 1;
            return seq;
        }
        if self.records.len() == self.capacity {
            self.records.pop_front();
            self.evicted += 1;
        }
        self.records.push_back(record);
        seq
    }

    /// The record numbered `seq`, if still held.
    #[must_use]
    pub fn get(&self, seq: u64) -> Option<&AuditRecord> {
        self.index(seq).and_then(|i| self.records.get(i))
    }

    /// The record numbered `seq`, if still held, to fill in.
    pub fn get_mut(&mut self, seq: u64) -> Option<&mut AuditRecord> {
        self.index(seq).and_then(|i| self.records.get_mut(i))
    }

    /// Records the microseconds from event to completed map write; `false` if the record is
    /// no longer held.
    pub fn set_latency(&mut self, seq: u64, micros: u64) -> bool {
        match self.get_mut(seq) {
            Some(record) => {
                record.latency_us = Some(micros);
                true
            }
            None => false,
        }
    }

    /// The records held, oldest first.
    #[must_use]
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &AuditRecord> {
        self.records.iter()
    }

    fn index(&self, seq: u64) -> Option<usize> {
        let first = self.records.front()?.seq;
        usize::try_from(seq.checked_sub(first)?).ok()
    }
}
