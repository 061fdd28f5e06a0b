//! `switchyard top`: a live view of the agent, refreshed every second from its API.
//!
//! This module is the pure part, tested without a terminal: a [`Sample`] is one poll of
//! `/status`, `/metrics`, `/explain/{group}` and `/decisions`; a [`View`] keeps the last two
//! samples' counters (rates are their difference over the time between them), the sort, the
//! filter and the pause, and turns keys into [`Flow`]s. [`draw`] lays the rows out with
//! ratatui; [`run`] owns the terminal and the polling.

pub mod draw;
mod run;

use std::collections::BTreeMap;
use std::time::Instant;

use router_common::Reason;
use rules::engine::{Action, AuditKind, AuditRecord, By};
use serde::Deserialize;

pub use run::{TopError, run};

use crate::api::status::Status;

/// Polls in a row that may fail (timeouts, unreadable answers) before `top` gives the agent up.
/// A refused connection gives it up at once: nothing listens there any more.
pub const MAX_FAILED_POLLS: u32 = 3;

/// How many decision switches the view keeps, newest first.
pub const SWITCHES_SHOWN: usize = 6;

/// The reasons whose packets the program drops (`XDP_DROP`), shown under "drops".
pub const DROP_REASONS: [Reason; 8] = [
    Reason::MalformedDrop,
    Reason::NoBackend,
    Reason::NoNextHop,
    Reason::NoTxPort,
    Reason::BadState,
    Reason::TooBigDrop,
    Reason::VipNoService,
    Reason::VipRateLimited,
];

/// Packets and bytes of one counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Total {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The data plane's counters in one `/metrics` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// By service, summed over the program's verdicts (`switchyard_service_*_total`).
    pub services: BTreeMap<String, Total>,
    /// By pool and backend address (`switchyard_backend_*_total`).
    pub backends: BTreeMap<(String, String), Total>,
    /// By reason (`switchyard_packets_total`, `switchyard_bytes_total`).
    pub reasons: BTreeMap<String, Total>,
}

/// One sample line of the Prometheus text format: the metric name, its labels and the value.
/// `None` for comments, blank lines and lines that do not parse.
fn sample_line(line: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let Some((name, rest)) = head.split_once('{') else {
        return Some((head, BTreeMap::new(), value));
    };
    let mut labels = BTreeMap::new();
    let mut rest = rest.strip_suffix('}')?;
    while let Some((key, after)) = rest.split_once("=\"") {
        // The value runs to the first unescaped quote; `\\`, `\"` and `\n` are escapes.
        let mut text = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => text.push('\n'),
                    Some((_, e)) => text.push(e),
                    None => return None,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => text.push(c),
            }
        }
        let end = end?;
        labels.insert(key.trim_start_matches(',').trim().to_owned(), text);
        rest = &after[end + 1..];
    }
    Some((name, labels, value))
}

impl Counters {
    /// The counters of a `/metrics` answer; families and lines it does not know are skipped.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut c = Self::default();
        for (name, mut labels, value) in text.lines().filter_map(sample_line) {
            // Counters are whole numbers; the text format writes them as floats.
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a counter is a non-negative whole number below 2^53 in practice"
            )]
            let v = value as u64;
            let mut label = |k: &str| labels.remove(k).unwrap_or_default();
            let (total, bytes) = match name {
                "switchyard_service_packets_total" | "switchyard_service_bytes_total" => (
                    c.services.entry(label("service")).or_default(),
                    name.contains("bytes"),
                ),
                "switchyard_backend_packets_total" | "switchyard_backend_bytes_total" => {
                    let key = (label("pool"), label("backend"));
                    (c.backends.entry(key).or_default(), name.contains("bytes"))
                }
                "switchyard_packets_total" | "switchyard_bytes_total" => (
                    c.reasons.entry(label("reason")).or_default(),
                    name.contains("bytes"),
                ),
                _ => continue,
            };
            if bytes {
                total.bytes += v;
            } else {
                total.packets += v;
            }
        }
        c
    }
}

/// A decision group as `/explain/{group}` tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The group.
    pub name: String,
    /// The published action (`pool=dc1`, `split=dc1:95,dc2:5`), `-` before the first.
    pub active: String,
    /// What chose it: `rule ID`, `default`, `override` or `kept`.
    pub by: String,
    /// How long it has been active, seconds.
    pub for_secs: Option<u64>,
    /// `leader` or `follower` in a fleet.
    pub role: Option<String>,
}

/// What `top` reads of `/explain/{group}`.
#[derive(Deserialize)]
struct ExplainWire {
    explanation: ExplanationWire,
    #[serde(default)]
    fleet_role: Option<String>,
}

#[derive(Deserialize)]
struct ExplanationWire {
    now_us: u64,
    #[serde(default)]
    active: Option<ActiveWire>,
}

#[derive(Deserialize)]
struct ActiveWire {
    action: Action,
    by: By,
    since_us: u64,
}

impl Group {
    /// The group `name` from the JSON of `/explain/{name}`.
    ///
    /// # Errors
    ///
    /// The text is not an explanation.
    pub fn parse(name: &str, json: &str) -> Result<Self, String> {
        let w: ExplainWire =
            serde_json::from_str(json).map_err(|e| format!("/explain/{name}: {e}"))?;
        let now_us = w.explanation.now_us;
        Ok(match w.explanation.active {
            Some(a) => Self {
                name: name.to_owned(),
                active: a.action.to_string(),
                by: a.by.to_string(),
                for_secs: Some(now_us.saturating_sub(a.since_us) / 1_000_000),
                role: w.fleet_role,
            },
            None => Self {
                name: name.to_owned(),
                active: "-".into(),
                by: "-".into(),
                for_secs: None,
                role: w.fleet_role,
            },
        })
    }

    /// Group `name`, which the agent could not explain: `why` in place of what chose its
    /// action.
    #[must_use]
    pub fn unexplained(name: &str, why: &str) -> Self {
        Self {
            name: name.to_owned(),
            active: "?".into(),
            by: why.to_owned(),
            for_secs: None,
            role: None,
        }
    }
}

/// The decision groups the services of `status` name (`to: { decide: G }`), each once, in
/// service order.
#[must_use]
pub fn groups_of(status: &Status) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in &status.services {
        if let Some(g) = s.to.strip_prefix("decide ")
            && !out.iter().any(|x| x == g)
        {
            out.push(g.to_owned());
        }
    }
    out
}

/// One switch of a decision group, from `/decisions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    /// When, µs since the Unix epoch (the agent stamps its audit records with the wall clock).
    pub at_us: u64,
    /// The group.
    pub group: String,
    /// The action before (`-` when none).
    pub from: String,
    /// The action after.
    pub to: String,
    /// What chose it.
    pub by: String,
    /// The triggering event.
    pub cause: String,
}

/// The last [`SWITCHES_SHOWN`] switches of the audit trail (`/decisions`), newest first.
///
/// # Errors
///
/// The text is not a list of audit records.
pub fn switches(json: &str) -> Result<Vec<Switch>, String> {
    let records: Vec<AuditRecord> =
        serde_json::from_str(json).map_err(|e| format!("/decisions: {e}"))?;
    let show = |a: Option<&Action>| a.map_or_else(|| "-".to_owned(), ToString::to_string);
    Ok(records
        .iter()
        .rev()
        .filter(|r| r.kind == AuditKind::Switch)
        .take(SWITCHES_SHOWN)
        .map(|r| Switch {
            at_us: u64::try_from(r.at.as_micros()).unwrap_or(u64::MAX),
            group: r.group.clone(),
            from: show(r.from.as_ref()),
            to: show(r.to.as_ref()),
            by: r
                .by
                .as_ref()
                .map_or_else(|| "-".into(), ToString::to_string),
            cause: r.cause.clone(),
        })
        .collect())
}

/// One poll of the agent.
#[derive(Debug)]
pub struct Sample {
    /// When the counters were read (the rates divide by the time between two samples).
    pub at: Instant,
    /// `/status`.
    pub status: Status,
    /// `/metrics`.
    pub counters: Counters,
    /// `/explain/{group}` of each group of [`groups_of`].
    pub groups: Vec<Group>,
    /// `/decisions`, as [`switches`].
    pub switches: Vec<Switch>,
}

/// Why a poll failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PollError {
    /// Nothing listens at the agent's address (connection refused): it is gone.
    Gone(String),
    /// The agent refused the request (`401`): no token, or not its token.
    Refused(String),
    /// Anything else (a timeout, an answer that does not parse): tried again next second.
    Failed(String),
}

/// What a key asks of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on.
    Continue,
    /// Restore the terminal and exit 0.
    Quit,
}

/// A key, as the view understands it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// A printable character.
    Char(char),
    /// Escape.
    Esc,
    /// Enter.
    Enter,
    /// Backspace.
    Backspace,
    /// Control-C (raw mode delivers it as a key, not as SIGINT).
    Interrupt,
}

/// The order of services and backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sort {
    /// By name (services) and address (backends, within their pool).
    #[default]
    Name,
    /// By packets per second, highest first.
    Pps,
    /// By bits per second, highest first.
    Bps,
}

impl Sort {
    /// The next order (`s`).
    #[must_use]
    pub fn next(self) -> Self {
        match self {
            Self::Name => Self::Pps,
            Self::Pps => Self::Bps,
            Self::Bps => Self::Name,
        }
    }

    /// Its name in the header.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Name => "name",
            Self::Pps => "pps",
            Self::Bps => "bps",
        }
    }
}

/// Packets and bits per second of one counter between two samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// Packets per second.
    pub pps: f64,
    /// Bits per second.
    pub bps: f64,
}

/// The rate of a counter from `before` to `now` over `secs`; `None` without an earlier value,
/// without time between them, or when the counter went back (the agent restarted and its maps
/// were created anew).
#[must_use]
pub fn rate(before: Option<Total>, now: Total, secs: f64) -> Option<Rate> {
    let before = before?;
    if secs <= 0.0 || now.packets < before.packets || now.bytes < before.bytes {
        return None;
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "a per-second rate needs no more than f64's 53 bits"
    )]
    Some(Rate {
        pps: (now.packets - before.packets) as f64 / secs,
        bps: (now.bytes - before.bytes) as f64 * 8.0 / secs,
    })
}

/// One service row.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceRow {
    /// Name.
    pub name: String,
    /// `vip:port/protocol`.
    pub address: String,
    /// How it forwards.
    pub forward: String,
    /// Its target, as configured.
    pub to: String,
    /// Its rate; `None` on the first sample.
    pub rate: Option<Rate>,
}

/// One backend row.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendRow {
    /// Its pool.
    pub pool: String,
    /// Address.
    pub address: String,
    /// Whether it gets new flows.
    pub up: bool,
    /// `up`, or `down: REASON`, `drained` …
    pub health: String,
    /// Configured weight.
    pub weight: u32,
    /// The weight slow start has reached, while it ramps.
    pub effective_weight: Option<u32>,
    /// Tracked flows still open on it, counted while it is drained.
    pub flows: Option<u64>,
    /// Its rate; `None` on the first sample.
    pub rate: Option<Rate>,
}

/// One drop reason row.
#[derive(Clone, Debug, PartialEq)]
pub struct DropRow {
    /// The reason's label.
    pub reason: &'static str,
    /// Packets so far.
    pub packets: u64,
    /// Packets per second; `None` on the first sample.
    pub pps: Option<f64>,
}

/// What `top` shows and how: the last sample, the counters and time of the one before, the
/// sort, filter and pause.
#[derive(Debug, Default)]
pub struct View {
    /// The order of services and backends.
    pub sort: Sort,
    /// Rows whose text contains this (case-insensitive) are shown; empty shows all.
    pub filter: String,
    /// Keys go to the filter (after `/`, until Enter or Esc).
    pub editing: bool,
    /// New samples are not shown (polling goes on, so a lost agent still ends `top`).
    pub paused: bool,
    /// The last failed poll's problem, until a poll succeeds.
    pub problem: Option<String>,
    current: Option<Sample>,
    before: Option<(Instant, Counters)>,
    failures: u32,
}

impl View {
    /// A view with nothing sampled yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The last sample shown.
    #[must_use]
    pub fn current(&self) -> Option<&Sample> {
        self.current.as_ref()
    }

    /// Takes a sample in, unless paused; the one it replaces becomes the base of the rates.
    pub fn update(&mut self, sample: Sample) {
        self.failures = 0;
        self.problem = None;
        if self.paused {
            return;
        }
        if let Some(old) = self.current.replace(sample) {
            self.before = Some((old.at, old.counters));
        }
    }

    /// Notes a failed poll; `Some(why)` when the agent is lost: gone, refusing, or
    /// [`MAX_FAILED_POLLS`] failures in a row.
    pub fn failed(&mut self, e: PollError) -> Option<String> {
        match e {
            PollError::Gone(why) => Some(why),
            PollError::Refused(why) => Some(format!("the agent refused the request: {why}")),
            PollError::Failed(why) => {
                self.failures += 1;
                if self.failures >= MAX_FAILED_POLLS {
                    return Some(format!("{MAX_FAILED_POLLS} polls in a row failed: {why}"));
                }
                self.problem = Some(why);
                None
            }
        }
    }

    /// Handles a key.
    pub fn key(&mut self, key: Key) -> Flow {
        if key == Key::Interrupt {
            return Flow::Quit;
        }
        if self.editing {
            match key {
                Key::Char(c) => self.filter.push(c),
                Key::Backspace => {
                    self.filter.pop();
                }
                Key::Enter => self.editing = false,
                Key::Esc => {
                    self.editing = false;
                    self.filter.clear();
                }
                Key::Interrupt => {}
            }
            return Flow::Continue;
        }
        match key {
            Key::Char('q') | Key::Esc => return Flow::Quit,
            Key::Char('s') => self.sort = self.sort.next(),
            Key::Char('/') => {
                self.editing = true;
                self.filter.clear();
            }
            Key::Char('c') => self.filter.clear(),
            Key::Char('p' | ' ') => self.paused = !self.paused,
            _ => {}
        }
        Flow::Continue
    }

    /// Whether any of `fields` contains the filter.
    fn shows(&self, fields: &[&str]) -> bool {
        let f = self.filter.to_lowercase();
        f.is_empty() || fields.iter().any(|x| x.to_lowercase().contains(&f))
    }

    /// The rate of the counter `pick` chooses, between the samples; a counter missing from a
    /// sample counted nothing yet (the data plane reports only counters that moved).
    fn rate_of(&self, pick: impl Fn(&Counters) -> Option<Total>) -> Option<Rate> {
        let now = self.current.as_ref()?;
        let (at, before) = self.before.as_ref()?;
        rate(
            Some(pick(before).unwrap_or_default()),
            pick(&now.counters).unwrap_or_default(),
            now.at.saturating_duration_since(*at).as_secs_f64(),
        )
    }

    /// The services, filtered and sorted.
    #[must_use]
    pub fn services(&self) -> Vec<ServiceRow> {
        let Some(s) = &self.current else {
            return Vec::new();
        };
        let mut rows: Vec<ServiceRow> = s
            .status
            .services
            .iter()
            .filter(|v| self.shows(&[&v.name, &v.address, &v.to]))
            .map(|v| ServiceRow {
                name: v.name.clone(),
                address: v.address.clone(),
                forward: v.forward.clone(),
                to: v.to.clone(),
                rate: self.rate_of(|c| c.services.get(&v.name).copied()),
            })
            .collect();
        rows.sort_by(|a, b| by_rate(self.sort, a.rate, b.rate).then_with(|| a.name.cmp(&b.name)));
        rows
    }

    /// The backends of every pool, filtered (on pool and address), in pool order and sorted
    /// within each pool.
    #[must_use]
    pub fn backends(&self) -> Vec<BackendRow> {
        let Some(s) = &self.current else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for p in &s.status.pools {
            let mut rows: Vec<BackendRow> = p
                .backends
                .iter()
                .filter(|b| self.shows(&[&p.name, &b.address]))
                .map(|b| {
                    let health = match (&b.drain, b.healthy) {
                        (Some(d), _) if d.evicted => "drained, timeout passed".to_owned(),
                        (Some(_), _) => "drained".to_owned(),
                        (None, true) => "up".to_owned(),
                        (None, false) => {
                            format!("down: {}", b.reason.as_deref().unwrap_or("no new flows"))
                        }
                    };
                    let key = (p.name.clone(), b.address.clone());
                    BackendRow {
                        pool: p.name.clone(),
                        address: b.address.clone(),
                        up: b.healthy,
                        health,
                        weight: b.weight,
                        effective_weight: b.effective_weight,
                        flows: b.drain.as_ref().and_then(|d| d.open_flows),
                        rate: self.rate_of(|c| c.backends.get(&key).copied()),
                    }
                })
                .collect();
            rows.sort_by(|a, b| {
                by_rate(self.sort, a.rate, b.rate).then_with(|| a.address.cmp(&b.address))
            });
            out.extend(rows);
        }
        out
    }

    /// The decision groups, filtered (on name and action).
    #[must_use]
    pub fn groups(&self) -> Vec<Group> {
        self.current.as_ref().map_or_else(Vec::new, |s| {
            s.groups
                .iter()
                .filter(|g| self.shows(&[&g.name, &g.active]))
                .cloned()
                .collect()
        })
    }

    /// The last switches, newest first, filtered (on group and actions); with each, how many
    /// seconds before the status was taken (both by the agent's wall clock).
    #[must_use]
    pub fn switches(&self) -> Vec<(Switch, u64)> {
        let Some(s) = &self.current else {
            return Vec::new();
        };
        s.switches
            .iter()
            .filter(|w| self.shows(&[&w.group, &w.from, &w.to]))
            .map(|w| (w.clone(), s.status.time.saturating_sub(w.at_us / 1_000_000)))
            .collect()
    }

    /// The drop reasons that counted packets, the fastest first.
    #[must_use]
    pub fn drops(&self) -> Vec<DropRow> {
        let Some(s) = &self.current else {
            return Vec::new();
        };
        let mut rows: Vec<DropRow> = DROP_REASONS
            .iter()
            .filter_map(|r| {
                let total = s.counters.reasons.get(r.name()).copied()?;
                (total.packets > 0).then(|| DropRow {
                    reason: r.name(),
                    packets: total.packets,
                    pps: self
                        .rate_of(|c| c.reasons.get(r.name()).copied())
                        .map(|x| x.pps),
                })
            })
            .collect();
        rows.sort_by(|a, b| {
            b.pps
                .unwrap_or(0.0)
                .total_cmp(&a.pps.unwrap_or(0.0))
                .then(b.packets.cmp(&a.packets))
        });
        rows
    }
}

/// `a` before `b` in `sort`: the higher rate first, an unknown rate last; equal by name.
fn by_rate(sort: Sort, a: Option<Rate>, b: Option<Rate>) -> std::cmp::Ordering {
    let pick = |r: Option<Rate>| match sort {
        Sort::Name => 0.0,
        Sort::Pps => r.map_or(-1.0, |r| r.pps),
        Sort::Bps => r.map_or(-1.0, |r| r.bps),
    };
    pick(b).total_cmp(&pick(a))
}

/// `1.2k`, `3.4M`, `5.6G`: a rate or count in at most five characters.
#[must_use]
pub fn human(x: f64) -> String {
    let (v, unit) = if x >= 1e9 {
        (x / 1e9, "G")
    } else if x >= 1e6 {
        (x / 1e6, "M")
    } else if x >= 1e3 {
        (x / 1e3, "k")
    } else {
        (x, "")
    };
    if unit.is_empty() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}{unit}")
    }
}

#[cfg(test)]
mod tests;
