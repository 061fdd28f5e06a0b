//! `switchyard flows` and `switchyard trace`, over the agent's API (`crate::api::flows`).

use std::path::Path;

use anyhow::{Context as _, Result};

use super::ctl::call;
use crate::{
    api::flows::PurgeAnswer,
    flows::{FlowQuery, FlowRow, table_text},
    trace::{Trace, text},
};

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
        let v = call(&target, c.post(format!("{base}/flows/purge")).json(q)).await?;
        if json {
            println!("{v:#}");
            return Ok(());
        }
        let a: PurgeAnswer =
            serde_json::from_value(v).context("the agent's answer has another shape")?;
        println!(
            "purged {} tracked flows ({} backends renewed): their next packets are new flows",
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
    let v = call(&target, c.get(url)).await?;
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
    .await?;
    if json {
        println!("{v:#}");
        return Ok(());
    }
    let t: Trace = serde_json::from_value(v).context("the agent's answer has another shape")?;
    print!("{}", text(&t));
    Ok(())
}
