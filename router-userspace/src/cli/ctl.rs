//! `switchyard ctl …`: the operator commands, over the local API of the agent serving the
//! config directory ([`super::locate`]: `--api URL`, else the running agent's record, else
//! `agent.api` of the directory).
//!
//! Each command prints a table or a sentence made from the agent's answer ([`render`]); with
//! `--json` it prints the answer as the API sent it, for scripts.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;
use rules::engine::{Action, AuditKind, AuditRecord, SwitchKind};
use serde_json::{Value, json};

/// `switchyard ctl` commands.
#[derive(Debug, Subcommand)]
pub enum Ctl {
    /// `state get` / `state set NAME=VALUE`.
    State {
        /// `get` or `set`.
        #[command(subcommand)]
        op: StateOp,
    },
    /// `override set GROUP --to pool=dc2 …` / `override clear GROUP`.
    Override {
        /// `set` or `clear`.
        #[command(subcommand)]
        op: OverrideOp,
    },
    /// `backend drain POOL ADDRESS [--timeout 5m]` / `backend undrain POOL ADDRESS`.
    Backend {
        /// `drain` or `undrain`.
        #[command(subcommand)]
        op: BackendOp,
    },
    /// A pool's adaptive weights: each backend's base, pass rate, RTT p99, latency score, agent
    /// answer, computed weight, the weight the live table holds, and when it last changed.
    Weights {
        /// The pool.
        pool: String,
    },
    /// The audit trail.
    Decisions {
        /// Only this group.
        #[arg(long)]
        group: Option<String>,
    },
    /// Each rule, the values it reads, which wins and why the active action is what it is.
    Explain {
        /// The decision group.
        group: String,
    },
    /// The same evaluation on a hypothetical state (`var=value …`); changes nothing.
    WhatIf {
        /// The decision group.
        group: String,
        /// `var=value` settings.
        sets: Vec<String>,
    },
    /// Applies the config directory now (the watch does this on its own after a change).
    Apply,
    /// The applied config versions, newest last; `*` marks the running one.
    Versions,
    /// What changed from version A to version B: services, pools, backends, state, rules.
    Diff {
        /// From this version.
        a: u64,
        /// To this version.
        b: u64,
    },
    /// Applies version N again, as a new version. The files in the config directory are left
    /// alone; `status` says the running config differs from them until the next apply.
    Rollback {
        /// The version to restore.
        n: u64,
    },
    /// The client classes: each one's id, prefixes, precedence, and its new flows by side of
    /// its action (since the program was loaded).
    Classes,
    /// `canary status|pause|resume|abort GROUP`: a decision group's canary ramp.
    Canary {
        /// `status`, `pause`, `resume` or `abort`.
        #[command(subcommand)]
        op: CanaryCmd,
    },
}

/// `ctl canary …`.
#[derive(Debug, Subcommand)]
pub enum CanaryCmd {
    /// The ramp: its state, step, share, and when the next step is due.
    Status {
        /// The decision group.
        group: String,
    },
    /// Freezes the step and what is left of its hold (`rollback_when` still applies).
    Pause {
        /// The decision group.
        group: String,
    },
    /// Goes on from a pause with what was left of the hold.
    Resume {
        /// The decision group.
        group: String,
    },
    /// Sends no new flows to the canary pool any more and stops the ramp, audited with the
    /// reason.
    Abort {
        /// The decision group.
        group: String,
        /// Why (required).
        #[arg(long)]
        reason: String,
    },
}

/// `ctl state …`.
#[derive(Debug, Subcommand)]
pub enum StateOp {
    /// Every variable and built-in.
    Get,
    /// Sets a push variable: `NAME=VALUE`.
    Set {
        /// `NAME=VALUE`.
        assignment: String,
    },
}

/// `ctl override …`.
#[derive(Debug, Subcommand)]
pub enum OverrideOp {
    /// Forces an action.
    Set {
        /// The decision group.
        group: String,
        /// `pool=NAME` or `split=A:W,B:W`.
        #[arg(long)]
        to: String,
        /// Why (required).
        #[arg(long)]
        reason: String,
        /// Expires after this long (`10m`).
        #[arg(long)]
        ttl: Option<String>,
        /// Even if the target fails the group's `require`.
        #[arg(long)]
        force: bool,
    },
    /// Ends the override.
    Clear {
        /// The decision group.
        group: String,
    },
}

/// `ctl backend …`.
#[derive(Debug, Subcommand)]
pub enum BackendOp {
    /// New flows avoid the backend; its tracked flows stay (`status` counts them). Lasts
    /// until `undrain`, an apply that removes the backend from the pool, or the agent's exit.
    /// A drain of a drained backend (evicted or not) starts it over.
    Drain {
        /// The pool.
        pool: String,
        /// The backend's address.
        address: String,
        /// After this long (`5m`), its remaining tracked flows are re-selected too.
        #[arg(long)]
        timeout: Option<String>,
    },
    /// Ends a drain: the backend takes new flows again (when healthy).
    Undrain {
        /// The pool.
        pool: String,
        /// The backend's address.
        address: String,
    },
}

/// The agent's answer to one request: its text as sent, and that text parsed.
pub(super) struct Answer {
    pub(super) text: String,
    pub(super) value: Value,
}

pub(super) async fn call(target: &super::Target, req: reqwest::RequestBuilder) -> Result<Answer> {
    let resp = target
        .authorize(req)
        .map_err(anyhow::Error::msg)?
        .send()
        .await
        .with_context(|| format!("no agent answers at {} (from {})", target.base, target.from))?;
    let status = resp.status();
    let text = resp.text().await.context("reading the agent's answer")?;
    let body = serde_json::from_str::<Value>(&text);
    if !status.is_success() {
        // The agent's own refusals are `{"error": …}`; the router's (no such path, a path
        // segment that is not a number) are plain text or empty: say what came back rather
        // than that it is not JSON.
        let error = body
            .as_ref()
            .ok()
            .and_then(|b| b.get("error"))
            .and_then(Value::as_str);
        match (error, text.trim()) {
            (Some(e), _) => bail!("{e}"),
            (None, "") => bail!("the agent refused the request: {status}"),
            (None, t) => bail!("the agent refused the request: {status}: {t}"),
        }
    }
    let value = body.context("the agent's answer is not JSON")?;
    Ok(Answer { text, value })
}

/// The request `cmd` makes of the agent at `base`.
///
/// # Errors
///
/// `state set` without `NAME=VALUE`.
fn request(c: &reqwest::Client, base: &str, cmd: &Ctl) -> Result<reqwest::RequestBuilder> {
    Ok(match cmd {
        Ctl::State { op: StateOp::Get } => c.get(format!("{base}/state")),
        Ctl::State {
            op: StateOp::Set { assignment },
        } => {
            let (name, value) = assignment_parts(assignment)?;
            c.post(format!("{base}/state"))
                .json(&json!({ "name": name, "value": value }))
        }
        Ctl::Override {
            op:
                OverrideOp::Set {
                    group,
                    to,
                    reason,
                    ttl,
                    force,
                },
        } => c.post(format!("{base}/override")).json(&json!({
            "group": group, "to": to, "reason": reason, "ttl": ttl, "force": force
        })),
        Ctl::Override {
            op: OverrideOp::Clear { group },
        } => c.delete(format!("{base}/override/{group}")),
        Ctl::Backend {
            op:
                BackendOp::Drain {
                    pool,
                    address,
                    timeout,
                },
        } => c
            .post(format!("{base}/backend/drain"))
            .json(&json!({ "pool": pool, "address": address, "timeout": timeout })),
        Ctl::Backend {
            op: BackendOp::Undrain { pool, address },
        } => c
            .post(format!("{base}/backend/undrain"))
            .json(&json!({ "pool": pool, "address": address })),
        Ctl::Weights { pool } => c.get(format!("{base}/weights/{pool}")),
        // Group names are letters, digits, `-` and `_`: no escaping needed.
        Ctl::Decisions { group: Some(g) } => c.get(format!("{base}/decisions?group={g}")),
        Ctl::Decisions { group: None } => c.get(format!("{base}/decisions")),
        Ctl::Explain { group } => c.get(format!("{base}/explain/{group}")),
        Ctl::WhatIf { group, sets } => c
            .post(format!("{base}/what-if"))
            .json(&json!({ "group": group, "set": sets })),
        Ctl::Apply => c.post(format!("{base}/apply")),
        Ctl::Rollback { n } => c.post(format!("{base}/rollback/{n}")),
        Ctl::Versions => c.get(format!("{base}/versions")),
        Ctl::Diff { a, b } => c.get(format!("{base}/diff/{a}/{b}")),
        Ctl::Canary {
            op: CanaryCmd::Status { group },
        } => c.get(format!("{base}/canary/{group}")),
        Ctl::Canary {
            op: CanaryCmd::Pause { group },
        } => c
            .post(format!("{base}/canary/{group}/pause"))
            .json(&json!({})),
        Ctl::Canary {
            op: CanaryCmd::Resume { group },
        } => c
            .post(format!("{base}/canary/{group}/resume"))
            .json(&json!({})),
        Ctl::Canary {
            op: CanaryCmd::Abort { group, reason },
        } => c
            .post(format!("{base}/canary/{group}/abort"))
            .json(&json!({ "reason": reason })),
        Ctl::Classes => c.get(format!("{base}/classes")),
    })
}

/// `NAME=VALUE`, trimmed.
fn assignment_parts(assignment: &str) -> Result<(&str, &str)> {
    match assignment.split_once('=') {
        Some((name, value)) => Ok((name.trim(), value.trim())),
        None => bail!("{assignment:?}: expected NAME=VALUE"),
    }
}

/// What `cmd` prints for the agent's answer `v` (the JSON of the API): a table or sentences,
/// each line ending in a line break.
///
/// # Errors
///
/// The answer does not have the shape of its endpoint's (an agent of another version).
pub fn render(cmd: &Ctl, v: &Value) -> Result<String> {
    use std::fmt::Write as _;
    let mut o = String::new();
    match cmd {
        Ctl::State { op: StateOp::Get } => o = state_table(v),
        Ctl::State {
            op: StateOp::Set { assignment },
        } => {
            let (name, value) = assignment_parts(assignment)?;
            let _ = match v["changed"].as_bool() {
                Some(true) => writeln!(o, "{name}: set to {value}"),
                _ => writeln!(o, "{name}: unchanged (it already was {value})"),
            };
        }
        Ctl::Override {
            op:
                OverrideOp::Set {
                    group,
                    to,
                    reason,
                    ttl,
                    ..
                },
        } => {
            let until = ttl
                .as_ref()
                .map_or("until `ctl override clear`".to_owned(), |t| {
                    format!("for {t}")
                });
            let _ = writeln!(
                o,
                "override set on {group}: {to} {until} (reason: {reason:?})"
            );
            o.push_str(&switched_line(group, v));
        }
        Ctl::Override {
            op: OverrideOp::Clear { group },
        } => {
            let _ = writeln!(o, "override cleared on {group}; its rules decide again");
            o.push_str(&switched_line(group, v));
        }
        Ctl::Backend { op } => o = backend_sentence(op, v),
        Ctl::Weights { .. } => {
            let view: crate::api::weights::PoolWeightsView = serde_json::from_value(v.clone())
                .context("the agent's answer has another shape")?;
            o = weights_table(&view);
        }
        Ctl::Decisions { group } => {
            let records: Vec<AuditRecord> = serde_json::from_value(v.clone())
                .context("the agent's answer has another shape")?;
            o = decisions_table(group.as_deref(), &records);
        }
        Ctl::Explain { .. } => o = explain_text(v),
        Ctl::WhatIf { sets, .. } => {
            let _ = writeln!(o, "what if {} (nothing changes):", sets.join(", "));
            o.push_str(&explain_text(v));
        }
        Ctl::Apply | Ctl::Rollback { .. } => o = outcome_text(v),
        Ctl::Versions => o = versions_table(v),
        Ctl::Canary {
            op: CanaryCmd::Status { .. },
        } => o = canary_text(v),
        Ctl::Canary { op } => {
            let (group, done) = match op {
                CanaryCmd::Pause { group } => (group, "paused"),
                CanaryCmd::Resume { group } => (group, "resumed"),
                CanaryCmd::Abort { group, .. } => (group, "aborted"),
                CanaryCmd::Status { group } => (group, "unchanged"),
            };
            let _ = writeln!(o, "canary ramp of {group} {done}");
            o.push_str(&canary_text(&v["ramp"]));
            if !v["switched"].is_null() {
                o.push_str(&switched_line(group, v));
            }
        }
        Ctl::Diff { a, b } => {
            let changes = v["changes"].as_array().cloned().unwrap_or_default();
            if changes.is_empty() {
                let _ = writeln!(o, "versions {a} and {b} define the same resources");
            }
            for line in changes {
                let _ = writeln!(o, "{}", line.as_str().unwrap_or(""));
            }
        }
        Ctl::Classes => {
            let view: crate::api::classes::ClassesView = serde_json::from_value(v.clone())
                .context("the agent's answer has another shape")?;
            o = classes_table(&view);
        }
    }
    Ok(o)
}

/// `ctl classes`: one line per class, `none` (no class) first.
#[must_use]
pub fn classes_table(v: &crate::api::classes::ClassesView) -> String {
    use std::fmt::Write as _;
    if v.classes.len() <= 1 {
        return "no client classes are configured\n".to_owned();
    }
    let mut out = format!(
        "{:<16} {:>3} {:>9} {:>10}  new flows by pool\n",
        "class", "id", "prefixes", "precedence"
    );
    for c in &v.classes {
        let [(a, na), (b, nb)] = &c.sides;
        let _ = writeln!(
            out,
            "{:<16} {:>3} {:>9} {:>10}  {a} {na}, {b} {nb}",
            c.name,
            c.id,
            c.prefixes,
            c.precedence.map_or("-".to_owned(), |p| p.to_string()),
        );
    }
    if v.answered > 0 || v.unknown > 0 {
        let _ = writeln!(
            out,
            "new flows classed by a classifier answer: {}; with neither a prefix nor an answer: {}",
            v.answered, v.unknown
        );
    }
    out
}

/// `ctl state get`: name, source and value, one variable a line.
fn state_table(v: &Value) -> String {
    use std::fmt::Write as _;
    let mut o = format!("{:<48} {:<10} {}\n", "variable", "source", "value");
    for e in v.as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "{:<48} {:<10} {}",
            e["name"].as_str().unwrap_or(""),
            e["source"].as_str().unwrap_or(""),
            e["value"].as_str().unwrap_or("")
        );
    }
    o
}

/// The second line of `ctl override`: the switch the agent wrote (`{"switched": {group, to,
/// word, latency_us}}`), or that the group's action stayed.
fn switched_line(group: &str, v: &Value) -> String {
    let s = &v["switched"];
    if s.is_null() {
        return format!("{group} already ran that action: nothing switched\n");
    }
    let to = serde_json::from_value::<Action>(s["to"].clone())
        .map_or_else(|_| s["to"].to_string(), |a| a.to_string());
    format!(
        "{group} switched to {to}: decision word {:#x} written {} µs after the request\n",
        s["word"].as_u64().unwrap_or(0),
        s["latency_us"].as_u64().unwrap_or(0)
    )
}

/// A canary ramp (`GET /canary/{group}`, or the `ramp` of an operation's answer):
/// `canary pool canary: ramping, step 2 of 4 (25%), steps 5%, 25%, 50%, 100%, hold 10m`, then
/// when the next step is due, what the group publishes and its `rollback_when`.
fn canary_text(v: &Value) -> String {
    use std::fmt::Write as _;
    let pct = |x: &Value| format!("{}%", x.as_f64().unwrap_or(0.0));
    let steps: Vec<String> = v["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(pct)
        .collect();
    let hold = std::time::Duration::from_micros(v["hold_us"].as_u64().unwrap_or(0));
    let mut o = format!(
        "canary pool {}: {}, step {} of {} ({}), steps {}, hold {}\n",
        v["pool"].as_str().unwrap_or("?"),
        v["state"].as_str().unwrap_or("?"),
        v["step"].as_u64().unwrap_or(0),
        steps.len(),
        pct(&v["share"]),
        steps.join(", "),
        humantime::format_duration(hold)
    );
    if let Some(s) = v["next_step_in_s"].as_f64() {
        let _ = writeln!(o, "  next step in {s:.1}s");
    }
    if let Some(left) = v["hold_left_us"].as_u64() {
        let left = std::time::Duration::from_millis(left / 1000);
        let _ = writeln!(
            o,
            "  paused with {} of the hold left",
            humantime::format_duration(left)
        );
    }
    if let Some(p) = v["published"].as_str() {
        let _ = writeln!(o, "  publishes {p}");
    }
    match v["rollback_when"].as_str() {
        Some("") | None => {}
        Some(r) => {
            let _ = writeln!(o, "  rollback_when: {r}");
        }
    }
    o
}

/// `ctl backend drain/undrain`: what became of the backend (`{"changed": bool}`).
fn backend_sentence(op: &BackendOp, v: &Value) -> String {
    let changed = v["changed"].as_bool().unwrap_or(false);
    match op {
        BackendOp::Drain {
            pool,
            address,
            timeout,
        } => {
            let after = timeout.as_ref().map_or(String::new(), |t| {
                format!("; its remaining flows are re-selected after {t}")
            });
            if changed {
                format!(
                    "pool {pool} backend {address}: draining (no new flows; tracked flows \
                     stay, `switchyard status` counts them){after}\n"
                )
            } else {
                format!(
                    "pool {pool} backend {address}: was draining; drained anew (timeout set \
                     anew){after}\n"
                )
            }
        }
        BackendOp::Undrain { pool, address } if changed => {
            format!("pool {pool} backend {address}: drain ended\n")
        }
        BackendOp::Undrain { pool, address } => {
            format!("pool {pool} backend {address}: was not drained\n")
        }
    }
}

/// `ctl explain` and `ctl what-if`: the explanation's text form.
fn explain_text(v: &Value) -> String {
    match v.get("text").and_then(Value::as_str) {
        Some(t) if t.ends_with('\n') => t.to_owned(),
        Some(t) => format!("{t}\n"),
        None => format!("{v:#}\n"),
    }
}

/// `ctl apply` and `ctl rollback`: the version applied and what it changed.
fn outcome_text(v: &Value) -> String {
    use std::fmt::Write as _;
    if v["changed"].as_bool() == Some(false) {
        return format!(
            "unchanged: the running config is already this one (version {})\n",
            v["version"]
        );
    }
    let mut o = format!(
        "applied as version {} (generation {}) in {} µs\n",
        v["version"], v["generation"], v["took_us"]
    );
    for line in v["diff"].as_array().into_iter().flatten() {
        let _ = writeln!(o, "  {}", line.as_str().unwrap_or(""));
    }
    o
}

/// `ctl versions`: one version a line, `*` on the running one.
fn versions_table(v: &Value) -> String {
    use std::fmt::Write as _;
    let running = v["running"].as_u64();
    let mut o = String::from(
        "   version  generation  time (UTC)            hash          source / files\n",
    );
    for e in v["versions"].as_array().into_iter().flatten() {
        let n = e["number"].as_u64().unwrap_or(0);
        let files: Vec<&str> = e["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let _ = writeln!(
            o,
            "{} {:>7}  {:>10}  {:<20}  {:<12}  {} ({})",
            if Some(n) == running { "*" } else { " " },
            n,
            e["generation"].as_u64().unwrap_or(0),
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH
                    + std::time::Duration::from_secs(e["time"].as_u64().unwrap_or(0))
            ),
            e["hash"].as_str().unwrap_or("").get(..12).unwrap_or(""),
            e["source"].as_str().unwrap_or(""),
            files.join(", ")
        );
    }
    o
}

/// `ctl decisions`: the audit trail, oldest first, one record a line (number, wall-clock time
/// in UTC as the agent stamped it, group, event, change, what chose it, event-to-map-write
/// latency), then indented lines for the cause, the values the rule read, an override's
/// reason and what became of the flows a failback left.
#[must_use]
pub fn decisions_table(group: Option<&str>, records: &[AuditRecord]) -> String {
    use std::fmt::Write as _;
    if records.is_empty() {
        return match group {
            Some(g) => format!("no decisions recorded for group {g}\n"),
            None => "no decisions recorded\n".to_owned(),
        };
    }
    let mut o = format!(
        "{:>4}  {:<24}  {:<16} {:<18} {:<30} {:<20} {:>9}\n",
        "#", "time (UTC)", "group", "event", "change", "by", "latency"
    );
    for r in records {
        let at = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + r.at).to_string();
        let action = |a: &Option<Action>| a.as_ref().map_or("none".to_owned(), Action::to_string);
        let event = match (r.kind, r.switch) {
            (AuditKind::Switch, Some(k)) => format!("switch ({})", switch_kind(k)),
            (AuditKind::Switch, None) => "switch".to_owned(),
            (AuditKind::Veto, _) => "veto (require)".to_owned(),
            (AuditKind::Freeze, _) => "frozen (automatic)".to_owned(),
            (AuditKind::OverrideSet, _) => "override set".to_owned(),
            (AuditKind::OverrideCleared, _) => "override cleared".to_owned(),
            (AuditKind::OverrideExpired, _) => "override expired".to_owned(),
            (AuditKind::Breaker, _) => "circuit breaker".to_owned(),
            (AuditKind::Canary, _) => "canary".to_owned(),
        };
        let change = match r.kind {
            AuditKind::Switch => format!("{} → {}", action(&r.from), action(&r.to)),
            AuditKind::Veto | AuditKind::Freeze => format!("not {}", action(&r.to)),
            AuditKind::Breaker => format!(
                "{} {} → {}",
                r.values.get("backend").map_or("?", String::as_str),
                r.values.get("from").map_or("?", String::as_str),
                r.values.get("to").map_or("?", String::as_str)
            ),
            AuditKind::OverrideSet => action(&r.to),
            AuditKind::OverrideCleared | AuditKind::OverrideExpired => String::new(),
            AuditKind::Canary => r
                .values
                .get("canary.state")
                .map_or_else(String::new, |s| format!("ramp {s}")),
        };
        let by = r.by.as_ref().map_or("-".to_owned(), ToString::to_string);
        let latency = r.latency_us.map_or("-".to_owned(), |us| format!("{us} µs"));
        let _ = writeln!(
            o,
            "{:>4}  {at:<24}  {:<16} {event:<18} {change:<30} {by:<20} {latency:>9}",
            r.seq, r.group
        );
        let _ = writeln!(o, "{:>6}cause: {}", "", r.cause);
        if r.kind != AuditKind::Breaker && !r.values.is_empty() {
            let read: Vec<String> = r.values.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            let _ = writeln!(o, "{:>6}read: {}", "", read.join(", "));
        }
        if let Some(reason) = &r.reason {
            let _ = writeln!(o, "{:>6}reason: {reason:?}", "");
        }
        if let Some(flows) = &r.flows {
            let _ = writeln!(o, "{:>6}flows: {flows}", "");
        }
    }
    o
}

/// A switch kind as the audit trail's JSON names it.
fn switch_kind(k: SwitchKind) -> &'static str {
    match k {
        SwitchKind::Adopt => "adopt",
        SwitchKind::Failover => "failover",
        SwitchKind::Failback => "failback",
        SwitchKind::Emergency => "emergency",
        SwitchKind::Resume => "resume",
        SwitchKind::Override => "override",
        SwitchKind::Canary => "canary",
    }
}

/// `ctl weights`: one line per backend.
#[must_use]
pub fn weights_table(v: &crate::api::weights::PoolWeightsView) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "pool {}: computed every {}, last {:.1}s ago\n",
        v.pool,
        humantime::format_duration(std::time::Duration::from_secs_f64(v.interval_s.max(0.0))),
        v.computed_s_ago
    );
    let _ = writeln!(
        out,
        "{:<24} {:>5} {:>5} {:>9} {:>7} {:<22} {:>9} {:>6} {:>9} {:>9}",
        "backend",
        "base",
        "pass",
        "rtt p99",
        "latency",
        "agent",
        "computed",
        "target",
        "effective",
        "changed"
    );
    for b in &v.backends {
        let rtt = b
            .rtt_p99_ms
            .map_or("-".to_owned(), |ms| format!("{ms:.1}ms"));
        let mut agent = match (&b.agent_answer, b.agent_score) {
            (None, _) => "-".to_owned(),
            (Some(a), _) => format!("{a:?} ({})", b.agent_state),
        };
        if b.agent_error.is_some() {
            agent.push_str(" !");
        }
        let effective = b.effective.map_or("out".to_owned(), |w| w.to_string());
        let changed = b
            .changed_s_ago
            .map_or("never".to_owned(), |s| format!("{s:.0}s ago"));
        let _ = writeln!(
            out,
            "{:<24} {:>5} {:>5.2} {:>9} {:>7.2} {:<22} {:>9.1} {:>6} {:>9} {:>9}",
            b.address.to_string(),
            b.base,
            b.pass_rate,
            rtt,
            b.latency_score,
            agent,
            b.computed,
            b.target,
            effective,
            changed
        );
        if let Some(e) = &b.agent_error {
            let _ = writeln!(out, "  ! agent-check of {}: {e}", b.address);
        }
    }
    out
}

/// Runs one `ctl` command: prints what [`render`] makes of the agent's answer, or with `json`
/// the answer as the API sent it.
///
/// # Errors
///
/// The agent cannot be asked from here ([`super::locate`]); `state set` without `NAME=VALUE`;
/// no agent answers at the address found; the agent refuses the request (its reason, or the
/// HTTP status and body); its answer cannot be read, is not JSON, or (without `json`) does not
/// have its endpoint's shape.
pub async fn run(dir: &Path, api: Option<&str>, json: bool, cmd: Ctl) -> Result<()> {
    let target = super::locate(dir, api, std::path::Path::new(crate::record::RUN_DIR))?;
    let req = request(&reqwest::Client::new(), target.base.as_str(), &cmd)?;
    let answer = call(&target, req).await?;
    if json {
        println!("{}", answer.text.trim_end());
    } else {
        print!("{}", render(&cmd, &answer.value)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{BackendOp, Ctl, OverrideOp, StateOp, render};

    fn text(cmd: &Ctl, answer: &str) -> String {
        render(cmd, &serde_json::from_str(answer).unwrap()).unwrap()
    }

    #[test]
    fn decisions_print_one_line_a_record_with_cause_values_and_reason() {
        let answer = json!([
            {"seq": 1, "at_us": 1_796_447_687_445_000_u64, "group": "web-failover", "kind": "switch",
             "switch": "adopt", "from": null, "to": {"pool": "dc1"},
             "by": {"rule": "dc1-primary"}, "cause": "start",
             "values": {"dc1_api_healthy": "true"}, "latency_us": 85},
            {"seq": 2, "at_us": 1_796_447_689_085_250_u64, "group": "web-failover", "kind": "switch",
             "switch": "failover", "from": {"pool": "dc1"}, "to": {"pool": "dc2"},
             "by": {"rule": "dc2-standby"}, "cause": "probe dc1_api_healthy",
             "values": {"dc1_api_healthy": "false"}, "latency_us": 140},
            {"seq": 3, "at_us": 1_796_447_695_714_000_u64, "group": "web-failover", "kind": "override_set",
             "from": {"pool": "dc2"}, "to": {"split": [["dc1", 90], ["dc2", 10]]},
             "by": "override", "cause": "api", "reason": "db migration", "latency_us": null},
            {"seq": 4, "at_us": 1_796_447_698_715_000_u64, "group": "web-failover",
             "kind": "override_expired", "from": {"pool": "dc1"}, "to": null, "by": "override",
             "cause": "timer", "latency_us": null},
            {"seq": 5, "at_us": 1_796_447_704_686_000_u64, "group": "web-failover", "kind": "switch",
             "switch": "failback", "from": {"pool": "dc2"}, "to": {"pool": "dc1"},
             "by": {"rule": "dc1-primary"}, "cause": "timer", "latency_us": 90,
             "flows": "kept"}
        ])
        .to_string();
        let cmd = Ctl::Decisions {
            group: Some("web-failover".into()),
        };
        let want = [
            "   #  time (UTC)                group            event              change                         by                     latency",
            "   1  2026-12-05T05:14:47.445Z  web-failover     switch (adopt)     none → pool=dc1                rule dc1-primary         85 µs",
            "      cause: start",
            "      read: dc1_api_healthy = true",
            "   2  2026-12-05T05:14:49.085Z  web-failover     switch (failover)  pool=dc1 → pool=dc2            rule dc2-standby        140 µs",
            "      cause: probe dc1_api_healthy",
            "      read: dc1_api_healthy = false",
            "   3  2026-12-05T05:14:55.714Z  web-failover     override set       split=dc1:90,dc2:10            override                     -",
            "      cause: api",
            "      reason: \"db migration\"",
            "   4  2026-12-05T05:14:58.715Z  web-failover     override expired                                  override                     -",
            "      cause: timer",
            "   5  2026-12-05T05:15:04.686Z  web-failover     switch (failback)  pool=dc2 → pool=dc1            rule dc1-primary         90 µs",
            "      cause: timer",
            "      flows: kept",
        ]
        .map(|l| format!("{l}\n"))
        .concat();
        assert_eq!(text(&cmd, &answer), want);
        assert_eq!(
            text(&cmd, "[]"),
            "no decisions recorded for group web-failover\n"
        );
    }

    #[test]
    fn decisions_of_another_shape_are_an_error_not_a_panic() {
        let cmd = Ctl::Decisions { group: None };
        let e = render(&cmd, &json!({"error": "?"})).unwrap_err();
        assert!(e.to_string().contains("another shape"), "{e}");
    }

    #[test]
    fn override_set_says_what_for_how_long_why_and_the_switch() {
        let cmd = Ctl::Override {
            op: OverrideOp::Set {
                group: "web-failover".into(),
                to: "pool=dc2".into(),
                reason: "db migration".into(),
                ttl: Some("10m".into()),
                force: false,
            },
        };
        assert_eq!(
            text(
                &cmd,
                r#"{"switched":{"group":"web-failover","to":{"pool":"dc2"},"word":258,"latency_us":73}}"#
            ),
            "override set on web-failover: pool=dc2 for 10m (reason: \"db migration\")\n\
             web-failover switched to pool=dc2: decision word 0x102 written 73 µs after the \
             request\n"
        );
        let clear = Ctl::Override {
            op: OverrideOp::Clear {
                group: "web-failover".into(),
            },
        };
        assert_eq!(
            text(&clear, r#"{"switched":null}"#),
            "override cleared on web-failover; its rules decide again\n\
             web-failover already ran that action: nothing switched\n"
        );
    }

    #[test]
    fn state_get_is_a_table_and_state_set_a_sentence() {
        let get = Ctl::State { op: StateOp::Get };
        let answer = r#"[{"name":"maintenance_mode","value":"false","source":"push"},
                         {"name":"dc1_api_healthy","value":"true","source":"probe"}]"#;
        let want = format!(
            "{:<48} {:<10} value\n{:<48} {:<10} false\n{:<48} {:<10} true\n",
            "variable", "source", "maintenance_mode", "push", "dc1_api_healthy", "probe"
        );
        assert_eq!(text(&get, answer), want);
        let set = Ctl::State {
            op: StateOp::Set {
                assignment: "maintenance_mode = true".into(),
            },
        };
        assert_eq!(
            text(&set, r#"{"changed":true}"#),
            "maintenance_mode: set to true\n"
        );
        assert_eq!(
            text(&set, r#"{"changed":false}"#),
            "maintenance_mode: unchanged (it already was true)\n"
        );
        let bad = Ctl::State {
            op: StateOp::Set {
                assignment: "maintenance_mode".into(),
            },
        };
        assert!(render(&bad, &json!({"changed": true})).is_err());
    }

    #[test]
    fn drains_say_what_became_of_the_backend() {
        let drain = Ctl::Backend {
            op: BackendOp::Drain {
                pool: "web".into(),
                address: "198.18.1.12".into(),
                timeout: Some("5m".into()),
            },
        };
        assert_eq!(
            text(&drain, r#"{"changed":true}"#),
            "pool web backend 198.18.1.12: draining (no new flows; tracked flows stay, \
             `switchyard status` counts them); its remaining flows are re-selected after 5m\n"
        );
        let undrain = Ctl::Backend {
            op: BackendOp::Undrain {
                pool: "web".into(),
                address: "198.18.1.12".into(),
            },
        };
        assert_eq!(
            text(&undrain, r#"{"changed":false}"#),
            "pool web backend 198.18.1.12: was not drained\n"
        );
    }

    #[test]
    fn classes_print_a_line_per_class_with_its_sides() {
        let answer = r#"{"classes":[
            {"name":"none","id":0,"prefixes":0,"precedence":null,"sides":[["stable",80],["canary",20]]},
            {"name":"trial","id":1,"prefixes":1,"precedence":10,"sides":[["canary",7],["-",0]]}],
            "answered":0,"unknown":0}"#;
        let out = text(&Ctl::Classes, answer);
        assert!(out.starts_with("class "), "{out}");
        assert!(
            out.contains("none               0         0          -  stable 80, canary 20"),
            "{out}"
        );
        assert!(
            out.contains("trial              1         1         10  canary 7, - 0"),
            "{out}"
        );
        let empty = r#"{"classes":[{"name":"none","id":0,"prefixes":0,"precedence":null,
            "sides":[["A",0],["B",0]]}],"answered":0,"unknown":0}"#;
        assert_eq!(
            text(&Ctl::Classes, empty),
            "no client classes are configured\n"
        );
    }

    #[test]
    fn explain_prints_its_text_and_what_if_says_nothing_changes() {
        let answer = r#"{"text":"group web-failover: active pool=dc1\n","explanation":{}}"#;
        let explain = Ctl::Explain {
            group: "web-failover".into(),
        };
        assert_eq!(
            text(&explain, answer),
            "group web-failover: active pool=dc1\n"
        );
        let what_if = Ctl::WhatIf {
            group: "web-failover".into(),
            sets: vec!["dc1_api_healthy=false".into()],
        };
        assert_eq!(
            text(&what_if, answer),
            "what if dc1_api_healthy=false (nothing changes):\n\
             group web-failover: active pool=dc1\n"
        );
    }

    #[test]
    fn apply_versions_and_diff_print_sentences_and_a_table() {
        let applied = r#"{"changed":true,"version":3,"generation":7,"took_us":912,
                          "diff":["~ pool web: backend 198.18.1.11 weight 100 → 300"]}"#;
        assert_eq!(
            text(&Ctl::Apply, applied),
            "applied as version 3 (generation 7) in 912 µs\n  \
             ~ pool web: backend 198.18.1.11 weight 100 → 300\n"
        );
        assert_eq!(
            text(&Ctl::Rollback { n: 2 }, r#"{"changed":false,"version":2}"#),
            "unchanged: the running config is already this one (version 2)\n"
        );
        let versions = r#"{"running":2,"versions":[
            {"number":1,"generation":1,"time":0,"hash":"0123456789abcdef","source":"start",
             "files":["10-web.yaml"]},
            {"number":2,"generation":2,"time":60,"hash":"fedcba9876543210","source":"watch",
             "files":["10-web.yaml"]}]}"#;
        assert_eq!(
            text(&Ctl::Versions, versions),
            [
                "   version  generation  time (UTC)            hash          source / files\n",
                "        1           1  1970-01-01T00:00:00Z  0123456789ab  start (10-web.yaml)\n",
                "*       2           2  1970-01-01T00:01:00Z  fedcba987654  watch (10-web.yaml)\n",
            ]
            .concat()
        );
        assert_eq!(
            text(&Ctl::Diff { a: 1, b: 1 }, r#"{"changes":[]}"#),
            "versions 1 and 1 define the same resources\n"
        );
    }

    #[test]
    fn canary_status_says_where_the_ramp_is_and_what_the_group_publishes() {
        use super::CanaryCmd;
        let cmd = Ctl::Canary {
            op: CanaryCmd::Status {
                group: "web".into(),
            },
        };
        let answer = r#"{"group": "web", "pool": "canary", "state": "ramping", "step": 2,
            "steps": [5.0, 25.0, 50.0, 100.0], "share": 25.0, "hold_us": 600000000,
            "next_step_at_us": 1000, "hold_left_us": null,
            "rollback_when": "pool.canary.healthy_ratio < 0.9", "next_step_in_s": 312.44,
            "published": "split=stable:75,canary:25"}"#;
        assert_eq!(
            text(&cmd, answer),
            "canary pool canary: ramping, step 2 of 4 (25%), steps 5%, 25%, 50%, 100%, hold \
             10m\n  next step in 312.4s\n  publishes split=stable:75,canary:25\n  \
             rollback_when: pool.canary.healthy_ratio < 0.9\n"
        );
        let abort = Ctl::Canary {
            op: CanaryCmd::Abort {
                group: "web".into(),
                reason: "bad build".into(),
            },
        };
        let answer = r#"{"ramp": {"pool": "canary", "state": "aborted", "step": 2,
            "steps": [5.0, 25.0], "share": 0.0, "hold_us": 1000000, "next_step_at_us": null,
            "hold_left_us": null, "rollback_when": ""},
            "switched": {"group": "web", "to": {"pool": "stable"}, "word": 1, "latency_us": 7}}"#;
        assert_eq!(
            text(&abort, answer),
            "canary ramp of web aborted\ncanary pool canary: aborted, step 2 of 2 (0%), steps \
             5%, 25%, hold 1s\nweb switched to pool=stable: decision word 0x1 written 7 µs \
             after the request\n"
        );
    }
}
