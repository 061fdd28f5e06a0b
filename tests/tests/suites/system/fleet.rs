//! A fleet of three balancers on a three-member etcd cluster, all real: three lb namespaces
//! (each its own topology with two backends and a real `switchyard attach`), and an `etcd`
//! namespace whose bridge joins a management veth of each lb; the three etcd members listen on
//! three addresses of that bridge (198.19.0.1–3), the lbs have 198.19.0.11–13.
//!
//! One decision group (`G`) over pools `dc1` (b1) and `dc2` (b2): `dc2` while the pushed
//! variable `use_dc2` is true, `dc1` by default. What the test shows: one leader; `ctl state set`
//! on a follower moves every node's decision word (read from the pinned `DECISIONS` map with
//! bpftool); the leader killed with SIGKILL is replaced (0.8–1.6 s measured, against a goal of
//! 2 s; the test allows 3 s) without a decision changing;
//! an etcd member killed changes nothing; a node cut off from etcd (nftables drop in its
//! namespace) keeps its maps and says `stale since …`; and the fleet's switch latency (leader's
//! decision to the last node's map write) over 20 switches.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4},
    agent::{Agent, temp_dir, unique_pin_path},
    etcd::{self, Cluster, percentile, pool_of, until},
    netns::{Netns, Topology},
    privileged,
};
use serde_json::Value;

const GROUP: &str = "G";
const NODES: usize = 3;

/// The config of node `i`: everything the same on every node but its name and pins.
fn config(i: usize, state: &std::path::Path, prefix: &str) -> String {
    format!(
        r#"agent:
  pin_path: {pin}
  state_dir: {state}
fleet:
  node: lb{i}
  endpoints: [{endpoints}]
  prefix: {prefix}
  lease_ttl: 1s
  dial_timeout: 500ms
  request_timeout: 1s
services:
  - {{ name: web, vip: "{vip}", port: 80, protocol: tcp, forward: dsr-l2, to: {{ decide: {GROUP} }} }}
pools:
  - name: dc1
    backends:
      - {{ address: "{b1}" }}
  - name: dc2
    backends:
      - {{ address: "{b2}" }}
state:
  use_dc2: {{ push: {{ default: false }} }}
decisions:
  - name: {GROUP}
    rules:
      - id: to-dc2
        priority: 100
        when: use_dc2
        then: {{ pool: dc2 }}
    default: {{ pool: dc1 }}
    switch: {{ stable_for: 1ms, cooldown: 1ms, failback_after: 1ms }}
"#,
        pin = unique_pin_path(),
        state = state.display(),
        endpoints = etcd::endpoints(),
        vip = VIP_V4,
        b1 = backend_v4(1),
        b2 = backend_v4(2),
    )
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fleet; fields drop in order: agents, etcd, topologies.
struct Fleet {
    agents: Vec<Option<Agent>>,
    etcd: Cluster,
    topos: Vec<Topology>,
    _dirs: Vec<TempDir>,
}

impl Fleet {
    fn start() -> Result<Self> {
        let mut topos = Vec::new();
        for _ in 0..NODES {
            topos.push(Topology::builder().backends(2).build()?);
        }
        let lbs: Vec<&Netns> = topos.iter().map(Topology::lb).collect();
        let etcd = Cluster::start(&lbs)?;
        let prefix = etcd.prefix();
        let mut dirs = Vec::new();
        let mut agents = Vec::new();
        for (i, topo) in topos.iter().enumerate() {
            let state = TempDir(temp_dir("state")?);
            let text = config(i + 1, &state.0, &prefix);
            agents.push(Some(Agent::start(topo, &[("10-fleet.yaml", text)])?));
            dirs.push(state);
        }
        let fleet = Self {
            agents,
            etcd,
            topos,
            _dirs: dirs,
        };
        Ok(fleet)
    }

    fn agent(&self, i: usize) -> &Agent {
        self.agents[i].as_ref().expect("agent running")
    }

    fn live(&self) -> Vec<usize> {
        (0..NODES).filter(|&i| self.agents[i].is_some()).collect()
    }

    /// Node `i`'s `/status` fleet section.
    fn fleet_status(&self, i: usize) -> Result<Value> {
        etcd::fleet_status(self.agent(i))
    }

    fn role(&self, i: usize) -> Result<String> {
        etcd::role(self.agent(i))
    }

    /// The leaders among the live nodes.
    fn leaders(&self) -> Result<Vec<usize>> {
        let mut out = Vec::new();
        for i in self.live() {
            if self.role(i)? == "leader" {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// Node `i`'s non-zero `DECISIONS` words, read from its pinned map with bpftool.
    fn words(&self, i: usize) -> Result<Vec<String>> {
        etcd::decision_words(self.agents[i].as_ref().context("agent gone")?)
    }

    fn ctl(&self, i: usize, args: &[&str]) -> Result<String> {
        let dir = self.agent(i).dir().display().to_string();
        let mut all = vec!["ctl", "--config-dir", dir.as_str()];
        all.extend_from_slice(args);
        self.agent(i).cli(&all)
    }

    /// `switchyard fleet status --json`, from node `i`'s namespace.
    fn view(&self, i: usize) -> Result<Value> {
        let dir = self.agent(i).dir().display().to_string();
        let text = self
            .agent(i)
            .cli(&["fleet", "status", "--json", "--config-dir", &dir])?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Waits until `leader`'s word names the pool `like` names (its fallback may differ: it is
    /// the pool switched from), then until every live node holds that word.
    fn settle_on_pool_of(&self, leader: usize, like: &[String]) -> Result<()> {
        until(Duration::from_secs(5), || {
            Ok(pool_of(&self.words(leader)?) == pool_of(like))
        })?;
        self.wait_words(&self.words(leader)?, Duration::from_secs(5))?;
        Ok(())
    }

    /// Every live node's fleet status and the tail of its log.
    fn diagnose(&self) -> String {
        etcd::log_tails(
            self.live()
                .into_iter()
                .map(|i| (format!("lb{}", i + 1), self.agent(i))),
            25,
        )
    }

    /// Waits until every live node's words are `words` (up to `limit`).
    fn wait_words(&self, words: &[String], limit: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let mut all = true;
            for i in self.live() {
                if self.words(i)? != words {
                    all = false;
                }
            }
            if all {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                let mut got = String::new();
                for i in self.live() {
                    let _ = write!(
                        got,
                        "\nlb{}: {:?}\n{}",
                        i + 1,
                        self.words(i)?,
                        self.agent(i).log_text()
                    );
                }
                bail!("words not {words:?} on every node within {limit:?}:{got}");
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one fleet, its scenarios step by step"
)]
fn fleet_decides_once_survives_leader_and_etcd_failures() -> Result<()> {
    if privileged::require(
        "fleet_decides_once_survives_leader_and_etcd_failures",
        &["etcd", "etcdctl", "bpftool", "nft"],
    )
    .is_err()
    {
        return Ok(());
    }
    let mut fleet = Fleet::start()?;

    // One leader, elected within a few seconds; the others follow.
    until(Duration::from_secs(10), || Ok(fleet.leaders()?.len() == 1))
        .with_context(|| format!("one leader; logs:\n{}", fleet.agent(0).log_text()))?;
    let leader = fleet.leaders()?[0];
    let follower = (0..NODES).find(|&i| i != leader).unwrap_or(0);
    println!("leader: lb{}", leader + 1);
    let dc1 = fleet.words(leader)?;
    ensure!(!dc1.is_empty(), "the leader has no decision word");
    fleet.wait_words(&dc1, Duration::from_secs(5))?;

    // `ctl state set` on a follower moves all three.
    fleet.ctl(follower, &["state", "set", "use_dc2=true"])?;
    until(Duration::from_secs(5), || Ok(fleet.words(leader)? != dc1))?;
    let dc2 = fleet.words(leader)?;
    fleet.wait_words(&dc2, Duration::from_secs(5))?;
    println!(
        "state set on follower lb{}: every node moved to {dc2:?}",
        follower + 1
    );

    // A follower still explains the group, as its follower.
    let explained = fleet.ctl(follower, &["explain", GROUP])?;
    ensure!(
        explained.contains("this node is the group's follower"),
        "explain on a follower: {explained}"
    );

    // An override set on a follower acts on every node; cleared, the rules' choice is back.
    fleet.ctl(
        follower,
        &[
            "override",
            "set",
            GROUP,
            "--to",
            "pool=dc1",
            "--reason",
            "fleet test",
        ],
    )?;
    fleet.settle_on_pool_of(leader, &dc1)?;
    fleet.ctl(follower, &["override", "clear", GROUP])?;
    fleet.settle_on_pool_of(leader, &dc2)?;
    println!(
        "override set and cleared on follower lb{}: every node followed",
        follower + 1
    );

    // The fleet's switch latency over 20 switches, from the node records in etcd.
    let mut latencies = Vec::new();
    let mut value = false;
    for run in 0..20 {
        let words_before = fleet.words(leader)?;
        let before = fleet.view(leader)?;
        let rev_before = before["groups"][0]["revision"].as_i64().unwrap_or(0);
        fleet.ctl(follower, &["state", "set", &format!("use_dc2={value}")])?;
        value = !value;
        until(Duration::from_secs(5), || {
            Ok(fleet.words(leader)? != words_before)
        })?;
        let target = fleet.words(leader)?;
        fleet.wait_words(&target, Duration::from_secs(5))?;
        // Every node's record names the new revision.
        let mut worst = 0;
        until(Duration::from_secs(5), || {
            let v = fleet.view(leader)?;
            let rev = v["groups"][0]["revision"].as_i64().unwrap_or(0);
            let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
            let done = rev > rev_before
                && nodes.len() == NODES
                && nodes
                    .iter()
                    .all(|n| n["record"]["decisions"][GROUP].as_i64() == Some(rev));
            if done {
                worst = nodes
                    .iter()
                    .filter_map(|n| n["record"]["latency_us"].as_u64())
                    .max()
                    .unwrap_or(0);
            }
            Ok(done)
        })
        .with_context(|| format!("run {run}: node records"))?;
        latencies.push(worst);
    }
    latencies.sort_unstable();
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!(
        "fleet switch latency (leader's decision to the last node's map write) over {} runs: \
         p50 {p50} µs, p99 {p99} µs, all {latencies:?}",
        latencies.len()
    );

    // An etcd member killed: nothing changes.
    let words = fleet.words(leader)?;
    fleet.etcd.kill(3)?;
    thread::sleep(Duration::from_secs(3));
    for i in fleet.live() {
        ensure!(
            fleet.words(i)? == words,
            "lb{}: words changed after an etcd member died",
            i + 1
        );
    }
    ensure!(
        fleet.leaders()?.len() == 1,
        "one leader after an etcd member died"
    );
    let leader = fleet.leaders()?[0];
    println!(
        "etcd member e3 killed: no decision changed, leader lb{}",
        leader + 1
    );

    // The leader killed: another takes over within 2 s, and no decision changes.
    let revision_before = fleet.view((leader + 1) % NODES)?["groups"][0]["revision"].as_i64();
    let killed = Instant::now();
    fleet.agents[leader].as_mut().expect("leader").kill()?;
    let old = fleet.agents[leader].take();
    until(Duration::from_secs(5), || Ok(fleet.leaders()?.len() == 1))?;
    let took = killed.elapsed();
    let new_leader = fleet.leaders()?[0];
    println!(
        "leader lb{} killed: lb{} took over in {} ms",
        leader + 1,
        new_leader + 1,
        took.as_millis()
    );
    // The goal is 2 s (docs/performance.md reports the measured times); the bound here is
    // liveness: the lease's TTL, etcd's expiry check and one election, with room for a loaded
    // machine's polling.
    ensure!(
        took <= Duration::from_secs(3),
        "takeover took {took:?}:\n{}",
        fleet.diagnose()
    );
    thread::sleep(Duration::from_millis(500));
    for i in fleet.live() {
        ensure!(
            fleet.words(i)? == words,
            "lb{}: decision flapped on takeover",
            i + 1
        );
    }
    let revision_after = fleet.view(new_leader)?["groups"][0]["revision"].as_i64();
    ensure!(
        revision_after == revision_before,
        "the new leader republished: {revision_before:?} → {revision_after:?}"
    );
    drop(old);

    // A node partitioned from etcd keeps its maps and says stale.
    let cut = fleet
        .live()
        .into_iter()
        .find(|&i| i != new_leader)
        .unwrap_or(0);
    let lb = fleet.topos[cut].lb();
    lb.exec_with_stdin(
        &["nft", "-f", "-"],
        Some(
            "table inet fleetcut {\n chain out {\n  type filter hook output priority 0;\n  \
             ip daddr 198.19.0.0/24 drop\n }\n}\n",
        ),
    )?;
    until(Duration::from_secs(5), || {
        Ok(fleet.fleet_status(cut)?["etcd"]
            .as_str()
            .is_some_and(|s| s.starts_with("stale since")))
    })?;
    let stale = fleet.fleet_status(cut)?["etcd"].clone();
    println!("lb{} cut from etcd: status says {stale}", cut + 1);
    // The rest of the fleet switches; the cut node keeps the last decision.
    let cut_words = fleet.words(cut)?;
    fleet.ctl(new_leader, &["state", "set", &format!("use_dc2={value}")])?;
    until(Duration::from_secs(5), || {
        Ok(fleet.words(new_leader)? != words)
    })?;
    thread::sleep(Duration::from_millis(500));
    ensure!(
        fleet.words(cut)? == cut_words,
        "the cut node's maps changed"
    );
    ensure!(!cut_words.is_empty(), "the cut node cleared its maps");
    // Healed: it catches up.
    lb.exec(&["nft", "delete", "table", "inet", "fleetcut"])?;
    let target = fleet.words(new_leader)?;
    fleet.wait_words(&target, Duration::from_secs(10))?;
    println!("lb{} healed: caught up", cut + 1);

    // The leader stopped (SIGTERM) resigns: the other node takes over at once, well before
    // its lease would have expired.
    let leader = fleet.leaders()?[0];
    let stopped = Instant::now();
    fleet.agents[leader].as_mut().expect("leader").stop()?;
    let old = fleet.agents[leader].take();
    until(Duration::from_secs(5), || Ok(fleet.leaders()?.len() == 1))?;
    let took = stopped.elapsed();
    println!(
        "leader lb{} stopped (SIGTERM): took over in {} ms",
        leader + 1,
        took.as_millis()
    );
    ensure!(
        took < Duration::from_millis(800),
        "a stopped leader's successor took {took:?}:\n{}",
        fleet.diagnose()
    );
    drop(old);
    Ok(())
}
