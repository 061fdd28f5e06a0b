//! What the read-only CLI commands print: `status` (from the agent's API) and `maps` (each
//! pinned map's purpose, key and value layout, and the bpftool command that dumps it).

pub mod ctl;

use std::path::{Path, PathBuf};

use router_common::maps;

use crate::{
    agent::Status,
    config::{self, Agent},
    dataplane::{attach, layout, load},
};

/// The `agent:` settings of `dir`, or the defaults when the directory is missing or invalid
/// (read-only commands still work against a default install).
pub fn agent_settings(dir: &Path) -> Agent {
    config::load_dir(dir).map(|c| c.agent).unwrap_or_default()
}

/// `agent.pin_path` of `dir` (or the default).
pub fn pin_path(dir: &Path) -> PathBuf {
    agent_settings(dir).pin_path
}

/// Errors of `status`.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The agent did not answer.
    #[error(
        "no agent answers at {url} (is `switchyard attach` running? interfaces with a pinned \
         program: {pinned})"
    )]
    Unreachable {
        /// URL tried.
        url: String,
        /// Cause.
        #[source]
        source: reqwest::Error,
        /// Interfaces with a pinned link.
        pinned: String,
    },
}

/// Prints the agent's status.
pub async fn status(dir: &Path, api: Option<&str>, json: bool) -> Result<(), StatusError> {
    let agent = agent_settings(dir);
    let base = api.map_or_else(|| format!("http://{}", agent.api), str::to_owned);
    let url = format!("{}/status", base.trim_end_matches('/'));
    let unreachable = |source| {
        let pinned = attach::attached_interfaces(&load::pin_dir(&agent.pin_path));
        StatusError::Unreachable {
            url: url.clone(),
            source,
            pinned: if pinned.is_empty() {
                "none".into()
            } else {
                pinned.join(", ")
            },
        }
    };
    let resp = reqwest::get(&url).await.map_err(unreachable)?;
    if json {
        let text = resp.text().await.map_err(unreachable)?;
        println!("{text}");
        return Ok(());
    }
    let s: Status = resp.json().await.map_err(unreachable)?;
    print!("{}", render(&s));
    Ok(())
}

/// The human form of a status document.
pub fn render(s: &Status) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(o, "generation {}  ({})", s.generation, s.config_dir);
    let r = &s.running;
    let _ = writeln!(
        o,
        "version {}  (applied by {}; hash {})",
        r.version
            .map_or_else(|| "not recorded".into(), |v| v.to_string()),
        if r.source.is_empty() { "?" } else { &r.source },
        r.hash.get(..12).unwrap_or(&r.hash)
    );
    let interfaces: Vec<String> = s
        .interfaces
        .iter()
        .map(|i| match i.program_id {
            Some(id) => format!("{} (program {id})", i.name),
            None => format!(
                "{} (DETACHED: no pinned link; `switchyard detach` ran?)",
                i.name
            ),
        })
        .collect();
    let _ = writeln!(o, "interfaces: {}; {} XDP", interfaces.join(", "), s.mode);
    if let Some(r) = &s.rejected {
        let _ = writeln!(
            o,
            "\nRUNNING CONFIG DIFFERS FROM THE DIRECTORY: the last change was rejected:\n{r}"
        );
    } else if s.differs_from_files == Some(true) {
        let _ = writeln!(
            o,
            "\nRUNNING CONFIG DIFFERS FROM THE DIRECTORY (applied by {}); `switchyard ctl apply` \
             applies the directory",
            s.running.source
        );
    }
    let _ = writeln!(o, "\nservices:");
    for v in &s.services {
        let _ = writeln!(
            o,
            "  {:<16} {:<28} {:<7} → {}",
            v.name, v.address, v.forward, v.to
        );
    }
    let _ = writeln!(o, "\npools:");
    for p in &s.pools {
        let up = p.backends.iter().filter(|b| b.healthy).count();
        let _ = writeln!(o, "  {} ({up}/{} healthy)", p.name, p.backends.len());
        for b in &p.backends {
            let probe = b.probe.as_ref().map_or("not checked".to_owned(), |p| {
                format!("{} in {} µs", p.detail, p.latency_us)
            });
            let state = if b.healthy { "up" } else { "DOWN" };
            let _ = writeln!(
                o,
                "    {:<24} weight {:<5} {:<4}  {probe}",
                b.address, b.weight, state
            );
            match &b.next_hop {
                Some(h) if h.state == "resolved" => {
                    let _ = writeln!(o, "      next hop {}", h.via.as_deref().unwrap_or(""));
                }
                Some(h) => {
                    let _ = writeln!(
                        o,
                        "      NO NEXT HOP since {} ({}): no new flows",
                        crate::cli::ago(s.time, h.since),
                        h.reason.as_deref().unwrap_or("unknown")
                    );
                }
                None => {}
            }
        }
    }
    o
}

/// `then` (seconds since the Unix epoch) as seen at `now`: `12 s ago`.
pub fn ago(now: u64, then: u64) -> String {
    format!("{} s ago", now.saturating_sub(then))
}

/// What each pinned map holds, for `switchyard maps`.
pub const MAP_HELP: [(&str, &str); 14] = [
    (
        maps::SERVICES,
        "services: (VIP, port, protocol) → slot, decision slot, flags",
    ),
    (
        maps::DECISIONS,
        "decision words: pool A, pool B, split share, fallback pool",
    ),
    (maps::POOLS, "pools: live Maglev half and flags"),
    (
        maps::MAGLEV,
        "Maglev tables: 2 halves × 65,537 backend slots per pool",
    ),
    (
        maps::BACKENDS,
        "backends: address, family, state (up/draining/down), live next-hop half",
    ),
    (
        maps::NEXT_HOPS,
        "next hops: 2 per backend slot → egress ifindex, resolved flag, dst MAC, src MAC",
    ),
    (
        maps::CONNTRACK,
        "connection tracking: 5-tuple → backend slot (LRU)",
    ),
    (
        maps::NAT_REVERSE,
        "NAT replies: reply 5-tuple → virtual IP, ingress ifindex, MACs back (LRU)",
    ),
    (maps::FRAGMENTS, "fragmented datagrams in flight (LRU)"),
    (maps::TX_PORTS, "interfaces the program may redirect to"),
    (maps::REASON_STATS, "per-CPU packets/bytes by reason"),
    (maps::SVC_STATS, "per-CPU packets/bytes by service × action"),
    (maps::BACKEND_STATS, "per-CPU packets/bytes by backend slot"),
    (maps::CONFIG, "config generation and ABI version"),
];

/// Prints each map, what it holds, its key and value layout, and how to dump it.
pub fn maps(dir: &Path) {
    print!("{}", maps_text(&load::pin_dir(&pin_path(dir))));
}

/// What [`maps`] prints for the pin directory `pin_dir`.
pub fn maps_text(pin_dir: &Path) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "maps pinned under {} (map layout version {}):",
        pin_dir.display(),
        router_common::ABI_VERSION
    );
    let layouts = layout::all();
    for (name, help) in MAP_HELP {
        let path = pin_dir.join(name);
        let mark = if path.exists() { "" } else { "  (not pinned)" };
        let _ = writeln!(o, "  {name:<14} {help}{mark}");
        if let Some(m) = layouts.iter().find(|m| m.name == name) {
            let per_cpu = if m.kind.starts_with("percpu") {
                " per CPU"
            } else {
                ""
            };
            let _ = writeln!(o, "  {:<14} {}, {} entries", "", m.kind, m.entries);
            let _ = writeln!(o, "  {:<14} key   {}", "", m.key);
            let _ = writeln!(o, "  {:<14} value {}{per_cpu}", "", m.value);
        }
        let _ = writeln!(o, "  {:<14} bpftool map dump pinned {}", "", path.display());
    }
    let attached = attach::attached_interfaces(pin_dir);
    if !attached.is_empty() {
        let _ = writeln!(
            o,
            "links: {}  (bpftool link show; bpftool net show)",
            attached.join(", ")
        );
    }
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn maps_prints_each_map_s_key_and_value_layout_and_command() {
        let text = super::maps_text(std::path::Path::new("/sys/fs/bpf/nowhere/v1"));
        assert!(text.contains(
            "key   ServiceKey (20 B) {addr [u8; 16] (network order, IPv4 in the first 4 bytes), \
             port u16 (network-order bytes), proto u8 (6 TCP, 17 UDP), family u8 (4 or 6)}"
        ));
        assert!(text.contains("value Traffic (16 B) {packets u64, bytes u64} per CPU"));
        assert!(text.contains("bpftool map dump pinned /sys/fs/bpf/nowhere/v1/CONNTRACK"));
        for name in router_common::maps::ALL {
            assert!(
                text.contains(&format!("  {name} ")),
                "{name} missing:\n{text}"
            );
        }
    }

    #[test]
    fn every_map_has_help() {
        for name in router_common::maps::ALL {
            assert!(
                super::MAP_HELP.iter().any(|(n, _)| *n == name),
                "{name} has no help line"
            );
        }
    }
}
