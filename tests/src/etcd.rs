//! A three-member etcd cluster in a namespace of its own, and the fleet's view of the agents
//! that use it (their roles, the decision words in their pinned maps).
//!
//! The cluster's namespace (`<tag>-et`) holds a bridge `br0` with the members' addresses
//! 198.19.0.1–3 ([`member_ip`]); each balancer namespace handed to [`Cluster::start`] gets a
//! management veth `fleet0` on that bridge with 198.19.0.11, .12, … ([`node_ip`]). The agents'
//! `fleet.endpoints` are [`endpoints`]. Dropping the cluster kills the members, deletes the
//! namespace (and with it every `fleet0`) and removes the members' data.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use crate::agent::Agent;
use crate::netns::{Netns, unique_tag};

/// The cluster's members.
pub const MEMBERS: usize = 3;

/// Member `i`'s address (1-based).
#[must_use]
pub fn member_ip(i: usize) -> String {
    format!("198.19.0.{i}")
}

/// The management address of the `i`-th balancer (1-based) handed to [`Cluster::start`].
#[must_use]
pub fn node_ip(i: usize) -> String {
    format!("198.19.0.{}", 10 + i)
}

/// The members' client URLs as a YAML flow sequence's items, for `fleet.endpoints`:
/// `"198.19.0.1:2379", …`.
#[must_use]
pub fn endpoints() -> String {
    (1..=MEMBERS)
        .map(|i| format!("\"{}:2379\"", member_ip(i)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The etcd namespace, its bridge and members; killed and deleted on drop.
pub struct Cluster {
    ns: Netns,
    tag: String,
    members: Vec<Option<Child>>,
    dirs: Vec<PathBuf>,
}

impl Cluster {
    /// Creates the namespace, links each of `lbs` to its bridge, starts the members (their
    /// data on tmpfs) and waits until `etcdctl endpoint health` answers for all (up to 20 s).
    ///
    /// # Errors
    ///
    /// When a command fails, etcd cannot be started, or the cluster is not healthy in time
    /// (the error carries the members' last log lines).
    pub fn start(lbs: &[&Netns]) -> Result<Self> {
        let tag = unique_tag();
        let ns = Netns::new(format!("{tag}-et"));
        let status = Command::new("ip")
            .args(["netns", "add", ns.name()])
            .status()?;
        ensure!(status.success(), "ip netns add {}", ns.name());
        let mut etcd = Self {
            ns,
            tag,
            members: Vec::new(),
            dirs: Vec::new(),
        };
        etcd.ns.ip(&["link", "set", "lo", "up"])?;
        etcd.ns.ip(&["link", "add", "br0", "type", "bridge"])?;
        etcd.ns.ip(&["link", "set", "br0", "up"])?;
        for i in 1..=MEMBERS {
            etcd.ns.ip(&[
                "addr",
                "add",
                &format!("{}/24", member_ip(i)),
                "dev",
                "br0",
                "nodad",
            ])?;
        }
        for (i, lb) in lbs.iter().enumerate() {
            let i = i + 1;
            let port = format!("e{i}");
            etcd.ns.ip(&[
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "fleet0",
                "netns",
                lb.name(),
            ])?;
            etcd.ns.ip(&["link", "set", &port, "master", "br0", "up"])?;
            lb.ip(&[
                "addr",
                "add",
                &format!("{}/24", node_ip(i)),
                "dev",
                "fleet0",
                "nodad",
            ])?;
            lb.ip(&["link", "set", "fleet0", "up"])?;
        }
        let cluster = (1..=MEMBERS)
            .map(|i| format!("e{i}=http://{}:2380", member_ip(i)))
            .collect::<Vec<_>>()
            .join(",");
        for i in 1..=MEMBERS {
            let (child, dir) = etcd.spawn_member(i, &cluster)?;
            etcd.members.push(Some(child));
            etcd.dirs.push(dir);
        }
        let eps = (1..=MEMBERS)
            .map(|i| format!("http://{}:2379", member_ip(i)))
            .collect::<Vec<_>>()
            .join(",");
        let start = Instant::now();
        while etcd
            .ns
            .exec(&["etcdctl", "--endpoints", &eps, "endpoint", "health"])
            .is_err()
        {
            if start.elapsed() > Duration::from_secs(20) {
                bail!("etcd did not become healthy: {}", etcd.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(etcd)
    }

    /// A key prefix for `fleet.prefix` unique to this cluster.
    #[must_use]
    pub fn prefix(&self) -> String {
        format!("/switchyard-test-{}", self.tag)
    }

    /// Starts member `i` of `cluster` in the namespace, its data on tmpfs.
    fn spawn_member(&self, i: usize, cluster: &str) -> Result<(Child, PathBuf)> {
        // On tmpfs: etcd syncs every write, and a loaded disk would stretch its lease
        // expiry and writes far beyond what the agents do.
        let dir = PathBuf::from(format!("/dev/shm/switchyard-etcd-{}-{i}", self.tag));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let ip = member_ip(i);
        let log = std::fs::File::create(dir.join("log"))?;
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path().display()))
            .arg("etcd")
            .args(["--name", &format!("e{i}")])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &format!("http://{ip}:2379")])
            .args(["--advertise-client-urls", &format!("http://{ip}:2379")])
            .args(["--listen-peer-urls", &format!("http://{ip}:2380")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{ip}:2380"),
            ])
            .args(["--initial-cluster", cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.tag])
            // Fast elections, so that a lease of 1 s is above etcd's minimum TTL.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting etcd (apt package etcd-server, installed by xtask/setup.sh)")?;
        Ok((child, dir))
    }

    /// Kills member `i` (1-based) with SIGKILL and reaps it.
    ///
    /// # Errors
    ///
    /// When it cannot be signalled or reaped.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        if let Some(mut c) = self.members[i - 1].take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// The last 15 lines of each member's log.
    #[must_use]
    pub fn logs(&self) -> String {
        self.dirs
            .iter()
            .map(|d| std::fs::read_to_string(d.join("log")).unwrap_or_default())
            .map(|l| l.lines().rev().take(15).collect::<Vec<_>>().join("\n"))
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.members.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", self.ns.name()])
            .status();
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The agent's `/status` fleet section (`null` without one).
///
/// # Errors
///
/// When the API does not answer or its answer is not JSON.
pub fn fleet_status(agent: &Agent) -> Result<Value> {
    Ok(serde_json::from_str::<Value>(&agent.api_get("/status")?)?
        .get("fleet")
        .cloned()
        .unwrap_or(Value::Null))
}

/// The agent's role in its first decision group: `leader`, `follower` or empty.
///
/// # Errors
///
/// As [`fleet_status`].
pub fn role(agent: &Agent) -> Result<String> {
    let f = fleet_status(agent)?;
    Ok(f["groups"][0]["role"].as_str().unwrap_or("").to_owned())
}

/// The agent's non-zero `DECISIONS` words as `KEY=VALUE` (bpftool's JSON), read from its
/// pinned map with `bpftool map dump`.
///
/// # Errors
///
/// When bpftool fails or its output is not JSON.
pub fn decision_words(agent: &Agent) -> Result<Vec<String>> {
    let map = agent.pin_dir().join("DECISIONS");
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(&map)
        .output()?;
    ensure!(out.status.success(), "bpftool map dump {}", map.display());
    let v: Value = serde_json::from_slice(&out.stdout)?;
    let mut words = Vec::new();
    for e in v.as_array().cloned().unwrap_or_default() {
        let value = e["value"].to_string();
        if !value
            .contains("\"0x00\",\"0x00\",\"0x00\",\"0x00\",\"0x00\",\"0x00\",\"0x00\",\"0x00\"")
            && value != "0"
        {
            words.push(format!("{}={value}", e["key"]));
        }
    }
    Ok(words)
}

/// The first pool of decision words as [`decision_words`] shows them (the first two bytes of
/// the first word): the fallback, which follows, may differ between two words of one pool.
#[must_use]
pub fn pool_of(words: &[String]) -> String {
    words
        .first()
        .and_then(|w| w.split('=').nth(1))
        .map(|v| v.split(',').take(2).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

/// Polls `f` every 10 ms until it holds (up to `limit`); returns the time it took.
///
/// # Errors
///
/// When `f` fails or does not hold within `limit`.
pub fn until(limit: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if f()? {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            bail!("not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The `p` quantile (0–1) of `sorted` by the nearest rank.
///
/// # Panics
///
/// When `sorted` is empty.
#[must_use]
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index into a short list"
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Every agent's last `lines` log lines, headed by its name in `names`.
#[must_use]
pub fn log_tails<'a>(
    agents: impl IntoIterator<Item = (String, &'a Agent)>,
    lines: usize,
) -> String {
    let mut o = String::new();
    for (name, agent) in agents {
        let log = agent.log_text();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        let _ = write!(
            o,
            "{name}: {}\n{}\n",
            fleet_status(agent)
                .map(|v| v.to_string())
                .unwrap_or_default(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    o
}
