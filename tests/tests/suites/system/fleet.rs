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

/// The node-local file of node `i` (`local.yaml`): its name, pins and etcd.
fn local_config(i: usize, state: &std::path::Path, prefix: &str) -> String {
    format!(
        r"agent:
  pin_path: {pin}
  state_dir: {state}
fleet:
  node: lb{i}
  endpoints: [{endpoints}]
  prefix: {prefix}
  lease_ttl: 1s
  dial_timeout: 500ms
  request_timeout: 1s
",
        pin = unique_pin_path(),
        state = state.display(),
        endpoints = etcd::endpoints(),
    )
}

/// The fleet's shared config (`10-fleet.yaml`), the same on every node.
fn shared_config() -> String {
    format!(
        r#"services:
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
            let local = local_config(i + 1, &state.0, &prefix);
            agents.push(Some(Agent::start(
                topo,
                &[("local.yaml", local), ("10-fleet.yaml", shared_config())],
            )?));
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

impl Fleet {
    /// Waits until etcd holds a shared config at a revision above `after` and every live
    /// node but `except` records that it runs it; returns the revision, its hash and each
    /// node's latency from the write to its applied generation (µs).
    fn config_converged(
        &self,
        after: i64,
        except: Option<usize>,
        limit: Duration,
    ) -> Result<(i64, String, Vec<u64>)> {
        let mut got = (0, String::new(), Vec::new());
        let waiting = until(limit, || {
            let v = self.view(self.live()[0])?;
            let Some(rev) = v["config"][0].as_i64().filter(|&r| r > after) else {
                return Ok(false);
            };
            let hash = v["config"][1].as_str().unwrap_or("").to_owned();
            let names: Vec<String> = self
                .live()
                .into_iter()
                .filter(|&i| Some(i) != except)
                .map(|i| format!("lb{}", i + 1))
                .collect();
            let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
            let mut lat = Vec::new();
            for name in &names {
                let Some(n) = nodes.iter().find(|n| n["node"] == name.as_str()) else {
                    return Ok(false);
                };
                if n["record"]["config_revision"].as_i64() != Some(rev) {
                    return Ok(false);
                }
                lat.push(n["record"]["config_latency_us"].as_u64().unwrap_or(0));
            }
            got = (rev, hash, lat);
            Ok(true)
        });
        waiting.with_context(|| {
            format!("shared config after revision {after}:\n{}", self.diagnose())
        })?;
        Ok(got)
    }

    /// Node `i`'s `/status` as JSON.
    fn status_json(&self, i: usize) -> Result<Value> {
        Ok(serde_json::from_str(&self.agent(i).api_get("/status")?)?)
    }

    /// The pool names node `i` runs.
    fn pools(&self, i: usize) -> Result<Vec<String>> {
        let s = self.status_json(i)?;
        Ok(s["pools"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect())
    }
}

/// A shared fragment with one more pool, `extraK`.
fn extra_pool(k: usize) -> String {
    format!(
        "pools:\n  - {{ name: extra{k}, backends: [ {{ address: \"{}\" }} ] }}\n",
        backend_v4(1)
    )
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one fleet, its scenarios step by step"
)]
fn fleet_applies_and_rolls_back_the_shared_config_on_every_node() -> Result<()> {
    if privileged::require(
        "fleet_applies_and_rolls_back_the_shared_config_on_every_node",
        &["etcd", "etcdctl", "bpftool", "nft"],
    )
    .is_err()
    {
        return Ok(());
    }
    let fleet = Fleet::start()?;

    // The first node to reach etcd seeds the shared config; every node runs it.
    let (seeded, _, _) = fleet.config_converged(0, None, Duration::from_secs(20))?;
    println!("seeded: shared config revision {seeded}");

    // `ctl apply` on lb1 reaches every node: the latency from the write to etcd to each
    // node's applied generation, over 10 applies.
    let mut latencies = Vec::new();
    let mut revision = seeded;
    let mut hashes = Vec::new();
    for k in 0..10 {
        let generations: Vec<u64> = (0..NODES)
            .map(|i| Ok(fleet.status_json(i)?["generation"].as_u64().unwrap_or(0)))
            .collect::<Result<_>>()?;
        fleet.agent(0).write_file("20-extra.yaml", &extra_pool(k))?;
        let out = fleet.ctl(0, &["apply"])?;
        let (rev, hash, lat) = fleet.config_converged(revision, None, Duration::from_secs(10))?;
        ensure!(lat.len() == NODES, "apply {k}: {lat:?}");
        for (i, before) in generations.iter().enumerate() {
            let pools = fleet.pools(i)?;
            ensure!(
                pools.contains(&format!("extra{k}")),
                "apply {k}: lb{} runs {pools:?} (ctl apply said {out})",
                i + 1
            );
            let g = fleet.status_json(i)?["generation"].as_u64().unwrap_or(0);
            ensure!(g > *before, "apply {k}: lb{} generation {g}", i + 1);
        }
        latencies.extend(lat);
        revision = rev;
        hashes.push(hash);
    }
    latencies.sort_unstable();
    println!(
        "shared config apply (write to etcd to each node's applied generation) over {} \
         node-applies: p50 {} µs, max {} µs, all {latencies:?}",
        latencies.len(),
        percentile(&latencies, 0.5),
        latencies.last().copied().unwrap_or(0)
    );
    // Of which the apply itself (read, validate, compile, write the maps), as each agent
    // logs it: `config generation N applied (fleet revision R: ctl apply on lb1, US µs)`.
    let mut took: Vec<u64> = (0..NODES)
        .flat_map(|i| {
            fleet
                .agent(i)
                .log_text()
                .lines()
                .filter(|l| l.contains("applied (fleet revision") && l.contains("ctl apply on"))
                .filter_map(|l| l.rsplit(", ").next()?.split(' ').next()?.parse().ok())
                .collect::<Vec<u64>>()
        })
        .collect();
    took.sort_unstable();
    if !took.is_empty() {
        println!(
            "of which the apply on the node: p50 {} µs, max {} µs over {}",
            percentile(&took, 0.5),
            took.last().copied().unwrap_or(0),
            took.len()
        );
    }

    // `ctl rollback` on lb2 to the version before: every node runs the older shared config.
    let version = fleet.status_json(1)?["running"]["version"]
        .as_u64()
        .context("lb2 has no recorded version")?;
    fleet.ctl(1, &["rollback", &(version - 1).to_string()])?;
    let (rev, hash, lat) = fleet.config_converged(revision, None, Duration::from_secs(10))?;
    ensure!(
        hash == hashes[hashes.len() - 2],
        "rollback: hash {hash}, expected {}",
        hashes[hashes.len() - 2]
    );
    for i in 0..NODES {
        let pools = fleet.pools(i)?;
        ensure!(
            !pools.contains(&"extra9".to_owned()) && pools.contains(&"extra8".to_owned()),
            "rollback: lb{} runs {pools:?}",
            i + 1
        );
    }
    println!("rollback on lb2: revision {rev} (the older shared config) on every node, {lat:?} µs");
    revision = rev;

    // lb3 with an invalid local file keeps running its config; the others apply.
    fleet
        .agent(2)
        .write_file("lb3.local.yaml", "conntrack: { no_such_timeout: 5s }\n")?;
    until(Duration::from_secs(5), || {
        Ok(fleet.status_json(2)?["rejected"]
            .as_str()
            .is_some_and(|r| r.contains("lb3.local.yaml")))
    })
    .with_context(|| fleet.diagnose())?;
    let lb3_generation = fleet.status_json(2)?["generation"].as_u64();
    fleet
        .agent(0)
        .write_file("20-extra.yaml", &extra_pool(10))?;
    fleet.ctl(0, &["apply"])?;
    let (rev, _, _) = fleet.config_converged(revision, Some(2), Duration::from_secs(10))?;
    thread::sleep(Duration::from_millis(300));
    let lb3 = fleet.status_json(2)?;
    ensure!(
        lb3["generation"].as_u64() == lb3_generation,
        "lb3 applied with an invalid local file: {lb3}"
    );
    ensure!(
        lb3["fleet"]["config_revision"].as_i64() == Some(revision)
            && lb3["fleet"]["config_in_etcd"].as_i64() == Some(rev),
        "lb3's fleet status: {}",
        lb3["fleet"]
    );
    let rejected = lb3["rejected"].as_str().unwrap_or("");
    ensure!(
        rejected.contains(&format!("revision {rev}")) && rejected.contains("lb3.local.yaml"),
        "lb3's status: {rejected}"
    );
    let view = fleet.view(0)?;
    let behind: Vec<&Value> = view["nodes"]
        .as_array()
        .map(|n| n.iter().filter(|n| n["config_behind"] == true).collect())
        .unwrap_or_default();
    ensure!(
        behind.len() == 1 && behind[0]["node"] == "lb3",
        "fleet status: {view}"
    );
    println!("lb3 with an invalid local file keeps revision {revision}: {rejected}");
    // Fixed, it catches up.
    fleet
        .agent(2)
        .write_file("lb3.local.yaml", "conntrack: {}\n")?;
    until(Duration::from_secs(5), || {
        Ok(fleet.status_json(2)?["fleet"]["config_revision"].as_i64() == Some(rev))
    })
    .with_context(|| fleet.diagnose())?;
    revision = rev;

    // lb2 cut off from etcd: its apply is refused, and its config stays.
    let lb = fleet.topos[1].lb();
    lb.exec_with_stdin(
        &["nft", "-f", "-"],
        Some(
            "table inet fleetcut {\n chain out {\n  type filter hook output priority 0;\n  \
             ip daddr 198.19.0.0/24 drop\n }\n}\n",
        ),
    )?;
    until(Duration::from_secs(5), || {
        Ok(fleet.fleet_status(1)?["etcd"]
            .as_str()
            .is_some_and(|s| s.starts_with("stale since")))
    })?;
    let generation = fleet.status_json(1)?["generation"].as_u64();
    fleet
        .agent(1)
        .write_file("20-extra.yaml", &extra_pool(11))?;
    let refused = fleet.ctl(1, &["apply"]);
    let error = format!(
        "{:#}",
        refused.err().context("an apply without etcd succeeded")?
    );
    ensure!(error.contains("etcd is unreachable"), "{error}");
    let lb2 = fleet.status_json(1)?;
    ensure!(
        lb2["generation"].as_u64() == generation && !fleet.pools(1)?.contains(&"extra11".into()),
        "lb2 applied without etcd: {lb2}"
    );
    println!(
        "lb2 cut from etcd: apply refused: {}",
        error.lines().last().unwrap_or("")
    );
    lb.exec(&["nft", "delete", "table", "inet", "fleetcut"])?;
    until(Duration::from_secs(10), || {
        Ok(fleet.fleet_status(1)?["etcd"] == "connected")
    })?;
    let (_, _, _) = fleet.config_converged(revision - 1, None, Duration::from_secs(10))?;
    Ok(())
}
