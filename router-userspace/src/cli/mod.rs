//! What the read-only CLI commands print: `status` (from the agent's API) and `maps` (each
//! pinned map's purpose, key and value layout, and the bpftool command that dumps it).

pub mod ctl;
pub mod flows;
pub mod top;

use std::path::{Path, PathBuf};

use router_common::maps;

use crate::{
    api::status::Status,
    config::{self, Agent},
    dataplane::{attach, layout, load},
    record,
};

/// The `agent:` settings of `dir`, or the defaults when the directory is missing or invalid
/// (read-only commands still work against a default install). `status` and `ctl` find the
/// running agent with [`locate`] instead.
#[must_use]
pub fn agent_settings(dir: &Path) -> Agent {
    config::load_dir(dir).map(|c| c.agent).unwrap_or_default()
}

/// The pin path of `dir`'s agent: the running agent's, from its record (it keeps the pin path
/// it started with, whatever the fragments say now, and a fragment being written cannot hide
/// it); else `agent.pin_path` of `dir`, or the default.
#[must_use]
pub fn pin_path(dir: &Path) -> PathBuf {
    crate::record::find(Path::new(crate::record::RUN_DIR), dir)
        .map_or_else(|| agent_settings(dir).pin_path, |r| r.pin_path)
}

/// Where `status` and `ctl` reach the agent of a config directory, and how that was learnt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Base URL of its API, without a trailing `/`.
    pub base: String,
    /// Where the address came from, for error messages.
    pub from: String,
    /// Its `agent.pin_path` (the record's, else the directory's, else the default).
    pub pin_path: PathBuf,
    /// The directory's `agent.api_token_file`, whose token every request carries.
    pub token_file: Option<PathBuf>,
}

impl Target {
    /// `req` with the API token as `Authorization: Bearer …` when the directory sets one.
    ///
    /// # Errors
    ///
    /// The token file cannot be read (it is usually readable by root only).
    pub fn authorize(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, String> {
        match &self.token_file {
            None => Ok(req),
            Some(path) => Ok(req.bearer_auth(config::api_token(path)?)),
        }
    }
}

/// Why the agent of a config directory cannot be asked from here.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    /// The agent runs in another network namespace: its loopback API is not this one's.
    #[error(
        "the agent of {config_dir} (pid {pid}, API {api}) runs in network namespace {theirs}, \
         this command in {ours}; run it there: nsenter --net=/proc/{pid}/ns/net switchyard …"
    )]
    OtherNamespace {
        /// The config directory.
        config_dir: String,
        /// The agent's pid.
        pid: u32,
        /// Its API address.
        api: std::net::SocketAddr,
        /// Its namespace.
        theirs: String,
        /// This process's.
        ours: String,
    },
}

/// Finds the agent serving `dir`, looking in order at: `api` (an explicit `--api URL`); the
/// record the running agent keeps under `run_dir` ([`record`], normally [`record::RUN_DIR`]),
/// which holds whatever the fragments do; `agent.api` of the directory; the default address,
/// when the directory cannot be read.
///
/// # Errors
///
/// [`LocateError::OtherNamespace`] when, without `api`, the record names an agent of another
/// network namespace than this process's.
pub fn locate(dir: &Path, api: Option<&str>, run_dir: &Path) -> Result<Target, LocateError> {
    // Read once: the token and, without a record, the address and pins all come from it.
    let loaded = config::load_dir(dir).ok().map(|c| c.agent);
    let token_file = loaded.as_ref().and_then(|a| a.api_token_file.clone());
    let from_config = || {
        if let Some(a) = loaded.clone() {
            (a.api, format!("agent.api of {}", dir.display()), a.pin_path)
        } else {
            let d = Agent::default();
            (
                d.api,
                format!(
                    "the default address: no running agent recorded for {} and its config \
                     cannot be read",
                    dir.display()
                ),
                d.pin_path,
            )
        }
    };
    if let Some(api) = api {
        return Ok(Target {
            base: api.trim_end_matches('/').to_owned(),
            from: "--api".into(),
            pin_path: from_config().2,
            token_file,
        });
    }
    if let Some(r) = record::find(run_dir, dir) {
        let ours = record::this_netns();
        if !r.netns.is_empty() && !ours.is_empty() && r.netns != ours {
            return Err(LocateError::OtherNamespace {
                config_dir: r.config_dir.display().to_string(),
                pid: r.pid,
                api: r.api,
                theirs: r.netns,
                ours,
            });
        }
        return Ok(Target {
            base: format!("http://{}", r.api),
            from: format!(
                "the record of the agent running for it (pid {}, {})",
                r.pid,
                record::record_path(run_dir, dir).display()
            ),
            pin_path: r.pin_path,
            token_file,
        });
    }
    let (api, from, pin_path) = from_config();
    Ok(Target {
        base: format!("http://{api}"),
        from,
        pin_path,
        token_file,
    })
}

/// Errors of `status`.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The agent cannot be asked from here.
    #[error(transparent)]
    Locate(#[from] LocateError),
    /// The agent did not answer.
    #[error(
        "no agent answers at {url} (from {from}; is `switchyard attach` running? interfaces \
         with a pinned program: {pinned})"
    )]
    Unreachable {
        /// URL tried.
        url: String,
        /// Where its address came from.
        from: String,
        /// Cause.
        #[source]
        source: reqwest::Error,
        /// Interfaces with a pinned link.
        pinned: String,
    },
    /// The directory's `agent.api_token_file` cannot be read.
    #[error("agent.api_token_file: {0}")]
    Token(String),
    /// The agent refused the request (`401`: no token, or not its token).
    #[error("the agent refused the request: {0}")]
    Refused(String),
}

/// Prints the status of the agent serving `dir` (found by [`locate`]; `api` overrides).
///
/// # Errors
///
/// [`StatusError::Locate`] when the agent cannot be asked from here; [`StatusError::Unreachable`]
/// when no agent answers at the address found, or its answer cannot be read (or, without
/// `json`, is not a status document); [`StatusError::Token`] and [`StatusError::Refused`] when
/// the directory's API token cannot be read or is not the agent's.
pub async fn status(dir: &Path, api: Option<&str>, json: bool) -> Result<(), StatusError> {
    let target = locate(dir, api, Path::new(record::RUN_DIR))?;
    let url = format!("{}/status", target.base);
    let unreachable = |source| {
        let pinned = attach::attached_interfaces(&load::pin_dir(&target.pin_path));
        StatusError::Unreachable {
            url: url.clone(),
            from: target.from.clone(),
            source,
            pinned: if pinned.is_empty() {
                "none".into()
            } else {
                pinned.join(", ")
            },
        }
    };
    let request = target
        .authorize(reqwest::Client::new().get(&url))
        .map_err(StatusError::Token)?;
    let resp = request.send().await.map_err(unreachable)?;
    if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
        return Err(StatusError::Refused(resp.text().await.unwrap_or_default()));
    }
    if json {
        let text = resp.text().await.map_err(unreachable)?;
        println!("{text}");
        return Ok(());
    }
    let s: Status = resp.json().await.map_err(unreachable)?;
    print!("{}", render(&s));
    Ok(())
}

/// The interfaces line of [`render`]: each interface's link, the mode it runs in and its
/// program; then a `WARNING` line for each interface whose mode is not the one asked for.
fn interfaces_text(o: &mut String, s: &Status) {
    use std::fmt::Write as _;
    let interfaces: Vec<String> = s
        .interfaces
        .iter()
        .map(|i| match (i.program_id, i.link.as_str()) {
            (Some(id), link) => match &i.mode {
                Some(mode) => format!("{} (link {link}, {mode} mode, program {id})", i.name),
                None => format!("{} (link {link}, program {id})", i.name),
            },
            (None, "none" | "") => format!(
                "{} (DETACHED: no pinned link; `switchyard detach` ran?)",
                i.name
            ),
            (None, link) => match link.strip_prefix("defunct") {
                Some(why) => format!(
                    "{} (link DEFUNCT{why}: nothing runs here; restarting the agent attaches anew)",
                    i.name
                ),
                None => format!("{} (link {link})", i.name),
            },
        })
        .collect();
    let _ = writeln!(o, "interfaces: {}; {} XDP", interfaces.join(", "), s.mode);
    for i in &s.interfaces {
        if let Some(warning) = &i.mode_warning {
            let _ = writeln!(o, "\nWARNING: {}: {warning}", i.name);
        }
    }
}

/// The human form of a status document.
#[must_use]
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
    interfaces_text(&mut o, s);
    fleet_line(&mut o, s);
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
    if s.vips.iter().any(|v| v.announced.is_some()) {
        let _ = writeln!(o, "\nvirtual IPs:");
        for v in &s.vips {
            let _ = writeln!(
                o,
                "  {:<40} {:<8} {}",
                v.address,
                if v.live { "live" } else { "not live" },
                if v.announced == Some(true) {
                    "announced"
                } else {
                    "NOT ANNOUNCED"
                }
            );
        }
    }
    let _ = writeln!(o, "\npools:");
    for p in &s.pools {
        let up = p.backends.iter().filter(|b| b.healthy).count();
        let table = p.table.as_deref().map_or(String::new(), |t| {
            let chance = if p.second_chance {
                ", previous table on its second chance"
            } else {
                ""
            };
            format!(", table {t}{chance}")
        });
        let _ = writeln!(o, "  {} ({up}/{} healthy{table})", p.name, p.backends.len());
        if let Some(l) = &p.left {
            let flows = l
                .open_flows
                .map_or("tracked flows not counted".to_owned(), |n| {
                    format!("{n} open flows remain")
                });
            let _ = writeln!(
                o,
                "    LEFT by decision group {} at failback (on_failback {}): {flows}",
                l.group, l.policy
            );
        }
        for b in &p.backends {
            backend_lines(&mut o, b, s.time);
        }
    }
    hooks_text(&mut o, s);
    o
}

/// The `hooks:` section of `status`: each hook's counters and its last failure.
fn hooks_text(o: &mut String, s: &Status) {
    use std::fmt::Write as _;
    if s.hooks.is_empty() {
        return;
    }
    let _ = writeln!(o, "\nhooks:");
    for h in &s.hooks {
        let _ = writeln!(
            o,
            "  {} ({}; {}): {} ok, {} failed, {} timed out, {} dropped, {} queued",
            h.name,
            h.runs,
            h.events.join(", "),
            h.ok,
            h.failed,
            h.timeout,
            h.dropped,
            h.queued
        );
        if let Some(why) = &h.last_failure {
            let _ = writeln!(o, "    last failure: {why}");
        }
    }
}

/// The `fleet:` line of `status`: this node, its etcd session and each group's leader.
fn fleet_line(o: &mut String, s: &Status) {
    use std::fmt::Write as _;
    if let Some(f) = &s.fleet {
        let groups: Vec<String> = f
            .groups
            .iter()
            .map(|g| {
                format!(
                    "{} {} (decision {} by {})",
                    g.group,
                    g.role,
                    g.revision.map_or("none".to_owned(), |r| r.to_string()),
                    g.leader.as_deref().unwrap_or("nobody")
                )
            })
            .collect();
        let _ = write!(o, "fleet: node {}, etcd {}", f.node, f.etcd);
        match (f.config_revision, f.config_in_etcd) {
            (Some(r), Some(e)) if r == e => {
                let _ = write!(o, ", shared config revision {r}");
            }
            (r, Some(e)) => {
                let _ = write!(
                    o,
                    ", shared config revision {} (NOT etcd's {e}: see rejected)",
                    r.map_or("none".to_owned(), |r| r.to_string())
                );
            }
            _ => {}
        }
        if !groups.is_empty() {
            let _ = write!(o, "; {}", groups.join("; "));
        }
        o.push('\n');
    }
}

/// A backend's lines in `status`, as seen at `now` (seconds since the Unix epoch): address,
/// weight, state and last probe, then its next hop, why it waits (a backend awaiting its
/// first check, state `NEW`) and its drain.
fn backend_lines(o: &mut String, b: &crate::api::status::BackendStatus, now: u64) {
    use std::fmt::Write as _;
    let probe = b.probe.as_ref().map_or("not checked".to_owned(), |p| {
        format!("{} in {} µs", p.detail, p.latency_us)
    });
    let awaiting = b.reason.as_deref() == Some(crate::health::AWAITING_FIRST_CHECK);
    let open = b
        .breaker
        .as_ref()
        .is_some_and(|br| br.phase == crate::breaker::Phase::Open);
    let state = match (&b.drain, b.healthy) {
        (Some(d), _) if d.evicted => "EVICTED",
        (Some(_), _) => "DRAIN",
        (None, false) if open => "OPEN",
        (None, true) => "up",
        (None, false) if awaiting => "NEW",
        (None, false) => "DOWN",
    };
    let weight = match b.effective_weight {
        Some(w) => format!("{w}/{} (slow start)", b.weight),
        None => b.weight.to_string(),
    };
    let _ = writeln!(
        o,
        "    {:<24} weight {weight:<5} {state:<4}  {probe}",
        b.address
    );
    match &b.next_hop {
        Some(h) if h.state == "resolved" => {
            let _ = writeln!(o, "      next hop {}", h.via.as_deref().unwrap_or(""));
        }
        Some(h) => {
            let _ = writeln!(
                o,
                "      NO NEXT HOP since {} ({}): no new flows",
                crate::cli::ago(now, h.since),
                h.reason.as_deref().unwrap_or("unknown")
            );
        }
        None => {}
    }
    if awaiting {
        let _ = writeln!(
            o,
            "      {}: no new flows until it passes",
            crate::health::AWAITING_FIRST_CHECK
        );
    }
    if let Some(d) = &b.drain {
        let _ = writeln!(o, "      {}", drain_line(d, now));
    }
    if let Some(br) = &b.breaker {
        let what = match br.phase {
            crate::breaker::Phase::Closed => "closed",
            crate::breaker::Phase::Open => "OPEN: no new flows",
            crate::breaker::Phase::HalfOpen => "HALF-OPEN: a trial share of new flows",
        };
        let _ = writeln!(o, "      circuit breaker {what} for {} s", br.for_secs);
    }
}

/// A drained backend's line in `status`, as seen at `now` (seconds since the Unix epoch).
fn drain_line(d: &crate::api::status::DrainStatus, now: u64) -> String {
    let flows = d
        .open_flows
        .map_or("tracked flows not counted".to_owned(), |n| {
            format!("{n} tracked flows")
        });
    let until = match (d.evicted, d.until) {
        (true, _) => ", timeout passed: its flows are re-selected".to_owned(),
        (false, Some(u)) => format!(", evicted in {} s", u.saturating_sub(now)),
        (false, None) => String::new(),
    };
    format!(
        "drained by the operator {} ({flows}{until}): no new flows",
        ago(now, d.since)
    )
}

/// `then` (seconds since the Unix epoch) as seen at `now`: `12 s ago`.
#[must_use]
pub fn ago(now: u64, then: u64) -> String {
    format!("{} s ago", now.saturating_sub(then))
}

/// What each pinned map holds, for `switchyard maps`.
pub const MAP_HELP: [(&str, &str); 25] = [
    (
        maps::SERVICES,
        "services: (VIP, port, protocol) → slot, decision slot, flags",
    ),
    (
        maps::SERVICE_SLOTS,
        "services by slot, with their keys: what a tracked flow's slot still holds",
    ),
    (
        maps::SERVICE_FILTER,
        "filter bits of service keys and NAT reply sources: a clear bit passes a packet unlooked-up",
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
        "backends: address, family, state (up/draining/down/evicted, with flags for tracked flows: keep/reset/migrate), live next-hop half",
    ),
    (
        maps::NEXT_HOPS,
        "next hops: 2 per backend slot → egress ifindex, resolved flag, dst MAC, src MAC",
    ),
    (
        maps::CONNTRACK,
        "connection tracking: 5-tuple → backend slot, state, last seen (LRU)",
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
    (
        maps::BACKEND_SIGNALS,
        "per-CPU failure signals by backend slot: NAT RSTs, SYN retransmits",
    ),
    (
        maps::IPIP_TX,
        "the ipip encapsulation program, tail-called for ipip services",
    ),
    (
        maps::CONFIG,
        "config generation, ABI version and flow timeouts",
    ),
    (
        maps::VIPS,
        "virtual IPs: echo answered, ports passed to the host; the rest no service takes is dropped",
    ),
    (
        maps::CLOCK,
        "the program's clock: the agent's time (advanced while it runs) and an offset (tests)",
    ),
    (
        maps::CLIENT_CLASSES,
        "client classes: longest prefix of the client's address → class id",
    ),
    (
        maps::CLASS_DECISIONS,
        "decision words per class: 16 per decision slot (class 0 reads DECISIONS)",
    ),
    (
        maps::CLIENT_ANSWERS,
        "classifier answers: client address → class, expiry tick (LRU)",
    ),
    (
        maps::UNKNOWN_CLIENTS,
        "ring of new flows from clients with neither class nor answer (rate-limited)",
    ),
    (
        maps::CLASS_STATS,
        "per-CPU new flows by class × side of the split; answer and ring counters",
    ),
];

/// Prints each map, what it holds, its key and value layout, and how to dump it.
pub fn maps(dir: &Path) {
    print!("{}", maps_text(&load::pin_dir(&pin_path(dir))));
}

/// What [`maps`] prints for the pin directory `pin_dir`.
#[must_use]
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

/// The text of `switchyard fleet status`: the groups (leader, decision revision, action), then
/// one line per node (generation, the decision revisions it runs, when it wrote the last one,
/// its latency from the decision, and what it is behind on).
#[must_use]
pub fn fleet_text(v: &crate::fleet::FleetView) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    if let Some((revision, hash, by)) = &v.config {
        let _ = writeln!(
            o,
            "shared config: revision {revision}, hash {}, written by {by}",
            hash.get(..12).unwrap_or(hash)
        );
    }
    for g in &v.groups {
        let _ = writeln!(
            o,
            "group {}: leader {}, decision revision {}, {}",
            g.group,
            g.leader.as_deref().unwrap_or("none"),
            g.revision.map_or("none".to_owned(), |r| r.to_string()),
            g.action
                .as_ref()
                .map_or("no action".to_owned(), ToString::to_string)
        );
    }
    for n in &v.nodes {
        let runs: Vec<String> = n
            .record
            .decisions
            .iter()
            .map(|(g, r)| format!("{g}@{r}"))
            .collect();
        let behind = if n.behind.is_empty() && n.generations_behind == 0 {
            "up to date".to_owned()
        } else {
            format!(
                "BEHIND: {} decision(s) ({}), {} generation(s)",
                n.behind.len(),
                n.behind.join(", "),
                n.generations_behind
            )
        };
        let config = match (n.record.config_revision, n.config_behind) {
            (Some(r), false) => format!(", shared config revision {r}"),
            (r, true) => format!(
                ", SHARED CONFIG BEHIND: runs revision {}",
                r.map_or("none".to_owned(), |r| r.to_string())
            ),
            (None, false) => String::new(),
        };
        let _ = writeln!(
            o,
            "node {}: generation {}, runs {}, applied at {}, latency {}, {behind}{config}",
            n.node,
            n.record.generation,
            if runs.is_empty() {
                "nothing".to_owned()
            } else {
                runs.join(" ")
            },
            humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH + std::time::Duration::from_nanos(n.record.applied_at_ns)
            ),
            n.record
                .latency_us
                .map_or("-".to_owned(), |us| format!("{us} µs")),
        );
    }
    if v.nodes.is_empty() {
        o.push_str("no node has recorded itself\n");
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
    fn status_text_shows_the_mode_each_interface_runs_and_a_mismatch() {
        use crate::api::status::{InterfaceStatus, Status};
        let interface = |name: &str, mode: &str, warning: Option<&str>| InterfaceStatus {
            name: name.to_owned(),
            program_id: Some(42),
            link: "live".to_owned(),
            mode: Some(mode.to_owned()),
            mode_warning: warning.map(str::to_owned),
        };
        let status = Status {
            generation: 1,
            config_dir: "/etc/switchyard".to_owned(),
            mode: "generic".to_owned(),
            requested_mode: Some("native".to_owned()),
            interfaces: vec![interface(
                "eth0",
                "generic",
                Some("--mode native was asked for"),
            )],
            services: Vec::new(),
            pools: Vec::new(),
            rejected: None,
            running: crate::agent::Running::default(),
            vips: Vec::new(),
            differs_from_files: None,
            fleet: None,
            hooks: Vec::new(),
            time: 0,
        };
        let text = super::render(&status);
        assert!(
            text.contains("interfaces: eth0 (link live, generic mode, program 42); generic XDP"),
            "{text}"
        );
        assert!(
            text.contains("WARNING: eth0: --mode native was asked for"),
            "{text}"
        );
        let agreeing = Status {
            requested_mode: None,
            interfaces: vec![interface("eth0", "generic", None)],
            ..status
        };
        assert!(!super::render(&agreeing).contains("WARNING"));
    }

    #[test]
    fn status_text_shows_each_hook_with_its_counters_and_last_failure() {
        use crate::api::status::Status;
        let hook = crate::hooks::HookStatus {
            name: "page".to_owned(),
            runs: "command /usr/local/bin/page".to_owned(),
            events: vec!["switch".to_owned(), "health".to_owned()],
            timeout_ms: 300,
            queued: 2,
            ok: 5,
            failed: 1,
            timeout: 3,
            dropped: 4,
            last_failure: Some("timed out after 300ms".to_owned()),
        };
        let status = Status {
            generation: 1,
            config_dir: "/etc/switchyard".to_owned(),
            mode: "native".to_owned(),
            requested_mode: None,
            interfaces: Vec::new(),
            services: Vec::new(),
            pools: Vec::new(),
            rejected: None,
            running: crate::agent::Running::default(),
            vips: Vec::new(),
            differs_from_files: None,
            fleet: None,
            hooks: vec![hook],
            time: 0,
        };
        let text = super::render(&status);
        assert!(
            text.contains(
                "hooks:\n  page (command /usr/local/bin/page; switch, health): 5 ok, 1 failed, \
                 3 timed out, 4 dropped, 2 queued\n    last failure: timed out after 300ms\n"
            ),
            "{text}"
        );
        let none = Status {
            hooks: Vec::new(),
            ..status
        };
        assert!(!super::render(&none).contains("hooks:"));
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
