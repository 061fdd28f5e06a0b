//! `switchyard ctl …`: the operator commands, over the local API of the agent serving the
//! config directory ([`super::locate`]: `--api URL`, else the running agent's record, else
//! `agent.api` of the directory).

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;
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
        /// Print the agent's JSON answer.
        #[arg(long)]
        json: bool,
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

pub(super) async fn call(target: &super::Target, req: reqwest::RequestBuilder) -> Result<Value> {
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
    body.context("the agent's answer is not JSON")
}

fn print_explain(v: &Value) {
    match v.get("text").and_then(Value::as_str) {
        Some(t) => print!("{t}"),
        None => println!("{v:#}"),
    }
}

fn print_outcome(v: &Value) {
    if v["changed"].as_bool() == Some(false) {
        println!(
            "unchanged: the running config is already this one (version {})",
            v["version"]
        );
        return;
    }
    println!(
        "applied as version {} (generation {}) in {} µs",
        v["version"], v["generation"], v["took_us"]
    );
    for line in v["diff"].as_array().into_iter().flatten() {
        println!("  {}", line.as_str().unwrap_or(""));
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

/// Runs one `ctl` command.
///
/// # Errors
///
/// The agent cannot be asked from here ([`super::locate`]); `state set` without `NAME=VALUE`;
/// no agent answers at the address found; the agent refuses the request (its reason, or the
/// HTTP status and body); its answer cannot be read or is not JSON.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per `ctl` command, each a request and how its answer prints"
)]
pub async fn run(dir: &Path, api: Option<&str>, cmd: Ctl) -> Result<()> {
    let target = super::locate(dir, api, std::path::Path::new(crate::record::RUN_DIR))?;
    let base = target.base.as_str();
    let c = reqwest::Client::new();
    match cmd {
        Ctl::State { op: StateOp::Get } => {
            let v = call(&target, c.get(format!("{base}/state"))).await?;
            for e in v.as_array().into_iter().flatten() {
                println!(
                    "{:<48} {:<10} {}",
                    e["name"].as_str().unwrap_or(""),
                    e["source"].as_str().unwrap_or(""),
                    e["value"].as_str().unwrap_or("")
                );
            }
        }
        Ctl::State {
            op: StateOp::Set { assignment },
        } => {
            let Some((name, value)) = assignment.split_once('=') else {
                bail!("{assignment:?}: expected NAME=VALUE");
            };
            let v = call(
                &target,
                c.post(format!("{base}/state"))
                    .json(&json!({ "name": name.trim(), "value": value.trim() })),
            )
            .await?;
            let changed = v["changed"].as_bool().unwrap_or(false);
            println!(
                "{}: {}",
                name.trim(),
                if changed { "set" } else { "unchanged" }
            );
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
        } => {
            let v = call(
                &target,
                c.post(format!("{base}/override")).json(&json!({
                    "group": group, "to": to, "reason": reason, "ttl": ttl, "force": force
                })),
            )
            .await?;
            println!("override set on {group}: {}", v["switched"]);
        }
        Ctl::Override {
            op: OverrideOp::Clear { group },
        } => {
            call(&target, c.delete(format!("{base}/override/{group}"))).await?;
            println!("override cleared on {group}");
        }
        Ctl::Backend { op } => {
            let (path, pool, address, body, after) = match op {
                BackendOp::Drain {
                    pool,
                    address,
                    timeout,
                } => {
                    let body = json!({ "pool": pool, "address": address, "timeout": timeout });
                    let after = timeout.map_or(String::new(), |t| {
                        format!("; its remaining flows are re-selected after {t}")
                    });
                    ("drain", pool, address, body, after)
                }
                BackendOp::Undrain { pool, address } => {
                    let body = json!({ "pool": pool, "address": address });
                    ("undrain", pool, address, body, String::new())
                }
            };
            let v = call(
                &target,
                c.post(format!("{base}/backend/{path}")).json(&body),
            )
            .await?;
            let changed = v["changed"].as_bool().unwrap_or(false);
            match (path, changed) {
                ("drain", true) => println!(
                    "pool {pool} backend {address}: draining (no new flows; tracked flows \
                     stay, `switchyard status` counts them){after}"
                ),
                ("drain", false) => println!(
                    "pool {pool} backend {address}: was draining; drained anew (timeout set \
                     anew){after}"
                ),
                (_, true) => println!("pool {pool} backend {address}: drain ended"),
                (_, false) => println!("pool {pool} backend {address}: was not drained"),
            }
        }
        Ctl::Weights { pool, json } => {
            let v = call(&target, c.get(format!("{base}/weights/{pool}"))).await?;
            if json {
                println!("{v:#}");
            } else {
                let view: crate::api::weights::PoolWeightsView =
                    serde_json::from_value(v).context("the agent's answer has another shape")?;
                print!("{}", weights_table(&view));
            }
        }
        Ctl::Decisions { group } => {
            // Group names are letters, digits, `-` and `_`: no escaping needed.
            let url = match &group {
                Some(g) => format!("{base}/decisions?group={g}"),
                None => format!("{base}/decisions"),
            };
            let v = call(&target, c.get(url)).await?;
            for r in v.as_array().into_iter().flatten() {
                println!("{r}");
            }
        }
        Ctl::Explain { group } => {
            print_explain(&call(&target, c.get(format!("{base}/explain/{group}"))).await?);
        }
        Ctl::WhatIf { group, sets } => {
            let v = call(
                &target,
                c.post(format!("{base}/what-if"))
                    .json(&json!({ "group": group, "set": sets })),
            )
            .await?;
            print_explain(&v);
        }
        Ctl::Apply => print_outcome(&call(&target, c.post(format!("{base}/apply"))).await?),
        Ctl::Rollback { n } => {
            print_outcome(&call(&target, c.post(format!("{base}/rollback/{n}"))).await?);
        }
        Ctl::Versions => {
            let v = call(&target, c.get(format!("{base}/versions"))).await?;
            let running = v["running"].as_u64();
            println!("   version  generation  time (UTC)            hash          source / files");
            for e in v["versions"].as_array().into_iter().flatten() {
                let n = e["number"].as_u64().unwrap_or(0);
                let files: Vec<&str> = e["files"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                println!(
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
        }
        Ctl::Diff { a, b } => {
            let v = call(&target, c.get(format!("{base}/diff/{a}/{b}"))).await?;
            let changes = v["changes"].as_array().cloned().unwrap_or_default();
            if changes.is_empty() {
                println!("versions {a} and {b} define the same resources");
            }
            for line in changes {
                println!("{}", line.as_str().unwrap_or(""));
            }
        }
    }
    Ok(())
}
