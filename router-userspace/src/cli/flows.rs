//! `switchyard flows` and `switchyard trace`, over the agent's API (`crate::api::flows`).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::ctl::call;
use crate::{
    api::flows::PurgeAnswer,
    flows::{FlowQuery, FlowRow, table_text},
    trace::{Trace, text},
};

/// `switchyard flows` arguments.
#[derive(Debug, clap::Args)]
pub struct FlowsArgs {
    /// Flows to this virtual IP.
    #[arg(long)]
    pub vip: Option<String>,
    /// Flows of this service.
    #[arg(long)]
    pub service: Option<String>,
    /// Flows on this backend address (in any pool).
    #[arg(long)]
    pub backend: Option<String>,
    /// Flows from clients in this prefix (198.18.0.0/15, or one address).
    #[arg(long)]
    pub client: Option<String>,
    /// Delete the matching flows (a filter, or --all, is required).
    #[arg(long)]
    pub purge: bool,
    /// With --purge and no filter: purge every tracked flow.
    #[arg(long, requires = "purge")]
    pub all: bool,
    /// Print the agent's JSON answer.
    #[arg(long)]
    pub json: bool,
    /// Directory of `*.yaml` fragments: the agent running for it is found through the record
    /// it keeps in /run/switchyard, else through the directory's `agent.api`.
    #[arg(long, default_value = "/etc/switchyard")]
    pub config_dir: PathBuf,
    /// The agent's API, e.g. http://127.0.0.1:9900 (overrides the record and the config).
    #[expect(
        clippy::doc_markdown,
        reason = "this doc comment is the option's --help text, printed as written"
    )]
    #[arg(long)]
    pub api: Option<String>,
}

/// `switchyard trace` arguments.
#[derive(Debug, clap::Args)]
#[expect(
    clippy::doc_markdown,
    reason = "these doc comments are the arguments' --help text, printed as written"
)]
pub struct TraceArgs {
    /// The client: IP:PORT ([2001:db8::1]:5000 for IPv6).
    pub client: String,
    /// The service: VIP:PORT/PROTO (198.18.0.10:80/tcp).
    pub vip: String,
    /// Print the agent's JSON answer.
    #[arg(long)]
    pub json: bool,
    /// Directory of `*.yaml` fragments (finds the agent, as for `flows`).
    #[arg(long, default_value = "/etc/switchyard")]
    pub config_dir: PathBuf,
    /// The agent's API, e.g. http://127.0.0.1:9900 (overrides the record and the config).
    #[arg(long)]
    pub api: Option<String>,
}

/// Runs `switchyard flows` on a runtime of its own.
///
/// # Errors
///
/// As [`flows`].
pub fn run_flows(a: FlowsArgs) -> Result<()> {
    let q = FlowQuery {
        vip: a.vip,
        service: a.service,
        backend: a.backend,
        client: a.client,
        all: a.all,
    };
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(flows(&a.config_dir, a.api.as_deref(), &q, a.purge, a.json))
}

/// Runs `switchyard trace` on a runtime of its own.
///
/// # Errors
///
/// As [`trace`].
pub fn run_trace(a: &TraceArgs) -> Result<()> {
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(trace(
        &a.config_dir,
        a.api.as_deref(),
        &a.client,
        &a.vip,
        a.json,
    ))
}

/// `switchyard flows`: lists the tracked flows `q` matches, or with `purge` deletes them.
///
/// # Errors
///
/// The agent cannot be found or asked, or refuses the filter (its reason).
pub async fn flows(
    dir: &Path,
    api: Option<&str>,
    q: &FlowQuery,
    purge: bool,
    json: bool,
) -> Result<()> {
    let target = super::locate(dir, api, Path::new(crate::record::RUN_DIR))?;
    let base = target.base.as_str();
    let c = reqwest::Client::new();
    if purge {
        let v = call(&target, c.post(format!("{base}/flows/purge")).json(q))
            .await?
            .value;
        if json {
            println!("{v:#}");
            return Ok(());
        }
        let a: PurgeAnswer =
            serde_json::from_value(v).context("the agent's answer has another shape")?;
        println!(
            "purged {} connection-tracking entries, live or expired ({} backends renewed): their next packets are new flows",
            a.purged, a.renewed
        );
        return Ok(());
    }
    let query = q.query_string();
    let url = if query.is_empty() {
        format!("{base}/flows")
    } else {
        format!("{base}/flows?{query}")
    };
    let v = call(&target, c.get(url)).await?.value;
    if json {
        println!("{v:#}");
        return Ok(());
    }
    let rows: Vec<FlowRow> =
        serde_json::from_value(v).context("the agent's answer has another shape")?;
    print!("{}", table_text(&rows));
    Ok(())
}

/// `switchyard trace CLIENT VIP`.
///
/// # Errors
///
/// The agent cannot be found or asked, or refuses the addresses (its reason).
pub async fn trace(
    dir: &Path,
    api: Option<&str>,
    client: &str,
    vip: &str,
    json: bool,
) -> Result<()> {
    let target = super::locate(dir, api, Path::new(crate::record::RUN_DIR))?;
    let base = target.base.as_str();
    let c = reqwest::Client::new();
    // Addresses and `/tcp`: nothing that needs escaping in a query but IPv6 brackets, which
    // the agent reads either way.
    let v = call(
        &target,
        c.get(format!("{base}/trace?client={client}&vip={vip}")),
    )
    .await?
    .value;
    if json {
        println!("{v:#}");
        return Ok(());
    }
    let t: Trace = serde_json::from_value(v).context("the agent's answer has another shape")?;
    print!("{}", text(&t));
    Ok(())
}
