//! The whole fleet in one topology, every daemon real: a router running BIRD with ECMP
//! multipath over three balancers, each running BIRD and a real `switchyard attach` with a
//! `fleet:` section ([`router_tests::bird::Fleet`]); a three-member etcd cluster in a namespace
//! of its own, linked to each balancer by a management veth ([`router_tests::etcd::Cluster`]);
//! three DSR backends on the shared segment and a client behind the router.
//!
//! Every node runs the same shared config (its `local.yaml` holds its name, pins, etcd and
//! `announce:`): one TCP service on the VIP whose new flows go where
//! decision group `G` decides — pool `dc1` (b1, b2) by default, `dc2` (b3) while the pushed
//! variable `use_dc2` is true — with fast health checks, `conntrack.second_chance` and
//! `announce:`. In sequence on that topology:
//!
//! 1. **Balance**: one leader; connections spread over the three nodes, all to `dc1`'s
//!    backends, and every one completes.
//! 2. **The leader's node dies** (the router hears nothing more from it; its agent and BIRD
//!    are killed with SIGKILL): BFD withdraws it (time printed, under 1 s), connections
//!    through the surviving nodes survive, new ones succeed, another node leads within 2 s
//!    and no decision changes (words and published revision).
//! 3. **The node rejoins** after `dc1`'s table changed under established connections (b2 went
//!    down and came back while they were open, so every node's previous table is b1's
//!    alone): the router rehashes, flows land on nodes that never tracked them, and the
//!    second chance keeps every one on its backend.
//! 4. **Failover decisions on the fleet**: `use_dc2` pushed from a follower sends new flows to
//!    `dc2`; a node then goes silent, and the connections that began on `dc1` before the switch,
//!    rehashed onto nodes that never tracked them, stay on `dc1`'s backends (the second chance
//!    of the pool a group left); over 20 switches, the latency from the leader's decision to
//!    the last node's map write (from the nodes' records in etcd) is printed as p50/p99.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{TCP_ECHO_PORT, VIP_V4},
    agent::Agent,
    bird::{self, Bird, DOWN_IF, Fleet, UP_IF},
    client::{Tally, TcpSession, payload, tcp_tally},
    config_text::{ConfigText, FAST_HTTP_CHECK, Group},
    etcd::{self, Cluster, percentile, pool_of, until},
    privileged,
    servers::BackendServers,
};
use serde_json::Value;

const NODES: usize = 3;
const GROUP: &str = "G";
/// The announcement interface and route protocol (the `announce:` defaults).
const DUMMY: &str = "switchyard0";
const PROTOCOL: u8 = 83;
/// How long a wait for BGP sessions to carry an announcement may take: BIRD connects 5 s
/// after it starts, and a session that failed (the router's session to a node BFD declared
/// down) is retried after BIRD's `error wait time`, 60 s by default. A liveness bound, not a
/// measurement.
const SESSIONS_UP: Duration = Duration::from_mins(2);

fn vip() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(VIP_V4), TCP_ECHO_PORT)
}

/// The fleet's shared config, the same on every node.
fn shared_config() -> String {
    let backend = |i: usize| -> (IpAddr, u32) { (bird::backend(i).into(), 100) };
    let text = ConfigText::without_agent()
        .deciding_service("web", VIP_V4.into(), "tcp", "dsr-l2", GROUP)
        .pool("dc1", &[backend(1), backend(2)], Some(FAST_HTTP_CHECK))
        .pool("dc2", &[backend(3)], Some(FAST_HTTP_CHECK))
        .state("use_dc2", "{ push: { default: false } }")
        .decision(
            &Group::new(GROUP)
                .rule("to-dc2", 100, "use_dc2", "dc2")
                .default_pool("dc1")
                .switch("{ stable_for: 1ms, cooldown: 1ms, failback_after: 1ms }"),
        )
        .text();
    format!(
        "{text}conntrack:
  second_chance: 10m
"
    )
}

/// The node-local file of node `k` (1-based): its name, its own `pin`, etcd and `announce:`.
fn local_config(k: usize, pin: &str, prefix: &str) -> String {
    format!(
        "agent:
  pin_path: {pin}
fleet:
  node: lb{k}
  endpoints: [{endpoints}]
  prefix: {prefix}
  lease_ttl: 1s
  dial_timeout: 500ms
  request_timeout: 1s
announce:
  interface: {DUMMY}
",
        endpoints = etcd::endpoints(),
    )
}

/// The running fleet; fields drop in order: agents, BIRDs, servers, etcd, namespaces.
struct Running {
    agents: Vec<Agent>,
    birds: Vec<Option<Bird>>,
    router_bird: Bird,
    servers: Vec<BackendServers>,
    etcd: Cluster,
    fleet: Fleet,
    /// The node (0-based) that is down, if any.
    down: Option<usize>,
}

impl Running {
    fn start() -> Result<Self> {
        let fleet = Fleet::build(NODES, 3)?;
        let servers = (1..=3)
            .map(|i| BackendServers::start(&fleet.backends[i - 1], &format!("b{i}"), &[]))
            .collect::<Result<Vec<_>>>()?;
        let lbs: Vec<_> = fleet.balancers.iter().collect();
        let etcd = Cluster::start(&lbs)?;
        let neighbors: Vec<Ipv4Addr> = (1..=NODES).map(bird::balancer_up).collect();
        let router_bird = Bird::start(
            &fleet.router,
            &bird::router_config(bird::ROUTER_CLIENT_SIDE, &neighbors, "198.18.0.0/24"),
        )?;
        let birds = (1..=NODES)
            .map(|k| Bird::start(&fleet.balancers[k - 1], &balancer_bird(k)).map(Some))
            .collect::<Result<Vec<_>>>()?;
        let prefix = etcd.prefix();
        let mut agents = Vec::new();
        for k in 1..=NODES {
            let pin = router_tests::agent::unique_pin_path();
            agents.push(Agent::launch_in(
                &fleet.balancers[k - 1],
                &[
                    ("local.yaml", local_config(k, &pin, &prefix)),
                    ("10-shared.yaml", shared_config()),
                ],
                &[UP_IF, DOWN_IF],
            )?);
        }
        for a in &mut agents {
            a.wait_answering()?;
        }
        Ok(Self {
            agents,
            birds,
            router_bird,
            servers,
            etcd,
            fleet,
            down: None,
        })
    }

    fn live(&self) -> Vec<usize> {
        (0..NODES).filter(|&i| Some(i) != self.down).collect()
    }

    fn leaders(&self) -> Result<Vec<usize>> {
        let mut out = Vec::new();
        for i in self.live() {
            if etcd::role(&self.agents[i])? == "leader" {
                out.push(i);
            }
        }
        Ok(out)
    }

    fn words(&self, i: usize) -> Result<Vec<String>> {
        etcd::decision_words(&self.agents[i])
    }

    /// Waits until every live node's decision words are `words` (up to `limit`).
    fn wait_words(&self, words: &[String], limit: Duration) -> Result<Duration> {
        until(limit, || {
            for i in self.live() {
                if self.words(i)? != words {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .with_context(|| format!("every node's words {words:?}:\n{}", self.diagnose()))
    }

    /// `switchyard ctl ARGS` on node `i`.
    fn ctl(&self, i: usize, args: &[&str]) -> Result<String> {
        let dir = self.agents[i].dir().display().to_string();
        let mut all = vec!["ctl", "--config-dir", dir.as_str()];
        all.extend_from_slice(args);
        self.agents[i].cli(&all)
    }

    /// `switchyard fleet status --json`, from node `i`'s namespace.
    fn view(&self, i: usize) -> Result<Value> {
        let dir = self.agents[i].dir().display().to_string();
        let text = self.agents[i].cli(&["fleet", "status", "--json", "--config-dir", &dir])?;
        Ok(serde_json::from_str(&text)?)
    }

    /// The published decision's revision, as node `i` reads it from etcd.
    fn revision(&self, i: usize) -> Result<i64> {
        self.view(i)?["groups"][0]["revision"]
            .as_i64()
            .context("no published decision")
    }

    fn wait_router(
        &self,
        limit: Duration,
        pred: impl Fn(&[Ipv4Addr]) -> bool,
    ) -> Result<(Vec<Ipv4Addr>, Duration)> {
        self.fleet
            .wait_router(VIP_V4, limit, pred)
            .with_context(|| self.router_bird.output())
    }

    /// The node (0-based) the router sends the client's TCP flow from `sport` through, as
    /// its multipath hash picks (`ip route get` with the 5-tuple).
    fn node_of(&self, sport: u16) -> Result<usize> {
        let text = self.fleet.router.ip(&[
            "-4",
            "route",
            "get",
            &VIP_V4.to_string(),
            "from",
            &bird::CLIENT.to_string(),
            "iif",
            "c0",
            "ipproto",
            "tcp",
            "sport",
            &sport.to_string(),
            "dport",
            &TCP_ECHO_PORT.to_string(),
        ])?;
        (0..NODES)
            .find(|&i| text.contains(&format!("via {} ", bird::balancer_up(i + 1))))
            .with_context(|| format!("no node in {text:?}"))
    }

    /// `n` TCP connections from the client to the VIP, each echoing one payload of `size`
    /// bytes, with the node (0-based) the router sends it through.
    fn open_sessions(&self, n: usize, size: usize) -> Result<Vec<(TcpSession, usize)>> {
        self.fleet.client.run(|| {
            let mut out = Vec::new();
            for k in 0..n {
                let mut s = TcpSession::connect(vip())?;
                s.echo(&payload(k, size))?;
                let node = self.node_of(s.local_addr()?.port())?;
                out.push((s, node));
            }
            Ok(out)
        })?
    }

    /// Echoes one more payload (256 bytes, numbered from `first`) on every session, each of
    /// which must survive; returns how many now go through another node than they began on.
    fn echo_moved(&self, sessions: &mut [(TcpSession, usize)], first: usize) -> Result<usize> {
        let mut moved = 0;
        for (k, (s, node)) in sessions.iter_mut().enumerate() {
            let now = self.node_of(s.local_addr()?.port())?;
            moved += usize::from(now != *node);
            s.echo(&payload(first + k, 256)).with_context(|| {
                format!(
                    "a connection to {} moved from lb{} to lb{} broke",
                    s.backend(),
                    *node + 1,
                    now + 1
                )
            })?;
        }
        Ok(moved)
    }

    /// Waits (up to 10 s) until every live node sees backend `i` (1-based) of pool `pool` as
    /// `healthy`.
    fn wait_health(&self, pool: &str, i: usize, healthy: bool) -> Result<()> {
        let address = bird::backend(i).to_string();
        for n in self.live() {
            self.agents[n]
                .wait_for(Duration::from_secs(10), |s| {
                    Agent::healthy(s, pool, &address) == Some(healthy)
                })
                .with_context(|| format!("lb{}: b{i} healthy {healthy}", n + 1))?;
        }
        Ok(())
    }

    fn diagnose(&self) -> String {
        etcd::log_tails(
            self.live()
                .into_iter()
                .map(|i| (format!("lb{}", i + 1), &self.agents[i])),
            25,
        )
    }
}

fn balancer_bird(k: usize) -> String {
    bird::balancer_config(
        bird::balancer_up(k),
        bird::router_side(k),
        UP_IF,
        DUMMY,
        PROTOCOL,
    )
}

/// The sum of a counter of the agent's `/metrics` over the lines that start with `prefix`.
fn counter(agent: &Agent, prefix: &str) -> Result<u64> {
    Ok(agent
        .api_get("/metrics")?
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}

fn web_packets(agent: &Agent) -> Result<u64> {
    counter(agent, "switchyard_service_packets_total{service=\"web\"")
}

fn second_chances(agent: &Agent) -> Result<u64> {
    counter(agent, "switchyard_packets_total{reason=\"second_chance\"")
}

fn only_backends(tally: &Tally, names: &[&str]) -> bool {
    tally.keys().all(|b| names.contains(&b.as_str()))
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one fleet, its scenarios step by step"
)]
fn the_whole_fleet_balances_survives_its_leaders_death_keeps_flows_on_rejoin_and_switches_as_one()
-> Result<()> {
    if privileged::require(
        "the_whole_fleet",
        &["bird", "nft", "etcd", "etcdctl", "bpftool"],
    )
    .is_err()
    {
        return Ok(());
    }
    let mut run = Running::start()?;
    let (_, took) = run.wait_router(SESSIONS_UP, |h| h.len() == NODES)?;
    println!("the router has {NODES} next hops to the VIP {took:?} after the agents answered");
    until(Duration::from_secs(10), || Ok(run.leaders()?.len() == 1)).with_context(|| {
        format!(
            "one leader:\n{}\netcd:\n{}",
            run.diagnose(),
            run.etcd.logs()
        )
    })?;
    let leader = run.leaders()?[0];
    let dc1 = run.words(leader)?;
    ensure!(!dc1.is_empty(), "the leader has no decision word");
    run.wait_words(&dc1, Duration::from_secs(5))?;
    for i in 1..=3 {
        run.wait_health(if i == 3 { "dc2" } else { "dc1" }, i, true)?;
    }

    // 1. Balance: every connection completes, on dc1's backends, and each node carries some.
    let before: Vec<u64> = run.agents.iter().map(web_packets).collect::<Result<_>>()?;
    let tally = tcp_tally(&run.fleet.client, vip(), 90)?;
    ensure!(
        tally.values().sum::<usize>() == 90 && only_backends(&tally, &["b1", "b2"]),
        "90 connections to dc1: {tally:?}"
    );
    let per_node: Vec<u64> = run
        .agents
        .iter()
        .zip(&before)
        .map(|(a, b)| Ok(web_packets(a)? - b))
        .collect::<Result<_>>()?;
    println!("balance: 90 connections, backends {tally:?}, packets per node {per_node:?}");
    ensure!(
        per_node.iter().all(|&p| p > 0),
        "a node carried no packet: {per_node:?}"
    );

    // 2. The leader's node dies: silent to the router (its link stays up), its agent and its
    // BIRD killed with SIGKILL. Established connections first, each with its node.
    let mut sessions = run.open_sessions(30, 512)?;
    let survivor = (leader + 1) % NODES;
    let revision = run.revision(survivor)?;
    let killed = Instant::now();
    run.fleet.silence(leader + 1)?;
    run.agents[leader].kill()?;
    if let Some(mut b) = run.birds[leader].take() {
        b.kill();
    }
    run.down = Some(leader);
    let dead_hop = bird::balancer_up(leader + 1);
    let (hops, _) = run.wait_router(Duration::from_secs(5), |h| !h.contains(&dead_hop))?;
    let withdrawn = killed.elapsed();
    println!(
        "BFD withdrawal: lb{} left the router's route {} ms after it was killed; next hops \
         {hops:?}",
        leader + 1,
        withdrawn.as_millis()
    );
    ensure!(hops.len() == NODES - 1, "next hops {hops:?}");
    ensure!(
        withdrawn < Duration::from_secs(1),
        "withdrawn after {withdrawn:?}, not within a second"
    );
    until(Duration::from_secs(5), || Ok(run.leaders()?.len() == 1))
        .with_context(|| format!("a new leader:\n{}", run.diagnose()))?;
    let takeover = killed.elapsed();
    let new_leader = run.leaders()?[0];
    println!(
        "leader lb{} killed: lb{} leads {} ms after the kill",
        leader + 1,
        new_leader + 1,
        takeover.as_millis()
    );
    ensure!(
        takeover <= Duration::from_secs(2),
        "takeover took {takeover:?}:\n{}",
        run.diagnose()
    );
    // No decision flaps: watched on every survivor for a second after the takeover.
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(1) {
        for i in run.live() {
            ensure!(
                run.words(i)? == dc1,
                "lb{}: decision changed on takeover",
                i + 1
            );
        }
    }
    ensure!(
        run.revision(new_leader)? == revision,
        "the new leader republished"
    );
    let (mut survived, mut moved, mut moved_ok) = (0, 0, 0);
    for (k, (s, node)) in sessions.iter_mut().enumerate() {
        let ok = s.echo(&payload(100 + k, 512)).is_ok();
        if *node == leader {
            moved += 1;
            moved_ok += usize::from(ok);
        } else {
            ensure!(
                ok,
                "a connection through surviving node lb{} broke",
                *node + 1
            );
            survived += 1;
        }
    }
    println!(
        "{survived} connections through the surviving nodes survived; {moved_ok} of {moved} \
         through lb{} continued on another node",
        leader + 1
    );
    let after = tcp_tally(&run.fleet.client, vip(), 30)?;
    ensure!(
        after.values().sum::<usize>() == 30,
        "after the kill: {after:?}"
    );
    drop(sessions);

    // 3. The node comes back: its agent first (it follows the published decision), still
    // silent to the router.
    run.agents[leader].relaunch()?;
    run.down = None;
    run.wait_words(&dc1, Duration::from_secs(10))?;
    for i in 1..=3 {
        run.wait_health(if i == 3 { "dc2" } else { "dc1" }, i, true)?;
    }
    until(Duration::from_secs(10), || {
        Ok(etcd::role(&run.agents[leader])? == "follower")
    })
    .with_context(|| format!("the restarted node follows:\n{}", run.diagnose()))?;
    ensure!(run.leaders()?.len() == 1, "one leader after the restart");
    // dc1's table changes under established connections: b2 goes down, connections open (all
    // on b1), b2 comes back; every node's previous table is now b1's alone.
    run.servers[1].set_healthy(false);
    run.wait_health("dc1", 2, false)?;
    let mut sessions = run.open_sessions(60, 256)?;
    ensure!(
        sessions.iter().all(|(s, _)| s.backend() == "b1"),
        "a connection reached a backend other than b1 while b2 was down"
    );
    run.servers[1].set_healthy(true);
    run.wait_health("dc1", 2, true)?;
    for i in 0..NODES {
        run.agents[i]
            .wait_for(Duration::from_secs(5), |s| {
                s.pools.iter().any(|p| p.name == "dc1" && p.second_chance)
            })
            .with_context(|| format!("lb{}: dc1's second chance", i + 1))?;
    }
    // The router hears the node again; BGP comes up and the router rehashes.
    let chances_before: u64 = run.agents.iter().map(second_chances).sum::<Result<u64>>()?;
    run.fleet.heal()?;
    run.birds[leader] = Some(Bird::start(
        &run.fleet.balancers[leader],
        &balancer_bird(leader + 1),
    )?);
    let (_, rejoined) = run.wait_router(SESSIONS_UP, |h| h.len() == NODES)?;
    let moved = run.echo_moved(&mut sessions, 200)?;
    let chances = run.agents.iter().map(second_chances).sum::<Result<u64>>()? - chances_before;
    println!(
        "lb{} rejoined the router's route {} ms after it was heard again: {moved} of {} \
         established connections moved node, all kept ({chances} packets took a second chance)",
        leader + 1,
        rejoined.as_millis(),
        sessions.len()
    );
    ensure!(moved > 0, "the rehash moved no connection");
    ensure!(chances > 0, "no moved connection needed its second chance");
    drop(sessions);

    // 4. Failover decisions on the fleet, pushed from a follower: new flows go to dc2.
    // Connections open on dc1 first, each with its node.
    let leader = run.leaders()?[0];
    let follower = (leader + 1) % NODES;
    let mut sessions = run.open_sessions(60, 256)?;
    run.ctl(follower, &["state", "set", "use_dc2=true"])?;
    until(Duration::from_secs(5), || {
        Ok(pool_of(&run.words(leader)?) != pool_of(&dc1))
    })?;
    let dc2 = run.words(leader)?;
    run.wait_words(&dc2, Duration::from_secs(5))?;
    let tally = tcp_tally(&run.fleet.client, vip(), 30)?;
    ensure!(
        tally.values().sum::<usize>() == 30 && only_backends(&tally, &["b3"]),
        "30 connections after the switch to dc2: {tally:?}"
    );
    println!(
        "use_dc2 pushed from lb{}: every node moved, new connections {tally:?}",
        follower + 1
    );
    // A node dies after the switch: the router rehashes the connections that began on dc1
    // onto nodes that never tracked them, whose decision is dc2; the second chance of the
    // pool the group left keeps them on dc1's backends (decision 0035).
    let gone = (leader + 2) % NODES;
    let chances_before = run.agents.iter().map(second_chances).sum::<Result<u64>>()?;
    run.fleet.silence(gone + 1)?;
    let gone_hop = bird::balancer_up(gone + 1);
    run.wait_router(Duration::from_secs(5), |h| !h.contains(&gone_hop))?;
    let moved = run.echo_moved(&mut sessions, 300)?;
    let chances = run.agents.iter().map(second_chances).sum::<Result<u64>>()? - chances_before;
    println!(
        "lb{} silenced after the switch: {moved} of {} connections opened on dc1 moved node, \
         all kept ({chances} packets took a second chance)",
        gone + 1,
        sessions.len()
    );
    ensure!(moved > 0, "the rehash moved no connection");
    ensure!(chances > 0, "no moved connection needed its second chance");
    drop(sessions);
    // The switch latency over 20 switches, from the nodes' records in etcd.
    let mut latencies = Vec::new();
    let mut value = false;
    for n in 0..20 {
        let words_before = run.words(leader)?;
        let rev_before = run.revision(leader)?;
        run.ctl(follower, &["state", "set", &format!("use_dc2={value}")])?;
        value = !value;
        until(Duration::from_secs(5), || {
            Ok(run.words(leader)? != words_before)
        })?;
        run.wait_words(&run.words(leader)?, Duration::from_secs(5))?;
        let mut worst = 0;
        until(Duration::from_secs(5), || {
            let v = run.view(leader)?;
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
        .with_context(|| format!("switch {n}: the nodes' records"))?;
        latencies.push(worst);
    }
    latencies.sort_unstable();
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!(
        "fleet switch latency (leader's decision to the last of {NODES} nodes' map write) over \
         {} switches: p50 {p50} µs, p99 {p99} µs, all {latencies:?}",
        latencies.len()
    );
    // The last switch pushed `use_dc2=true`.
    ensure!(
        pool_of(&run.words(leader)?) == pool_of(&dc2),
        "20 switches from dc2 end on dc2"
    );
    let last = tcp_tally(&run.fleet.client, vip(), 30)?;
    ensure!(
        last.values().sum::<usize>() == 30 && only_backends(&last, &["b3"]),
        "30 connections on dc2: {last:?}"
    );
    drop(run);
    Ok(())
}
