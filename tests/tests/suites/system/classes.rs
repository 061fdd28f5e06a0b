//! The whole system in network namespaces — client classes and a sticky split: one TCP
//! `dsr-l2` service on the IPv4 VIP follows decision group `web`, whose one rule acts per
//! class: `vip` (198.18.0.16/28) → pool `stable` (b1), `trial` (198.18.0.32/28) → pool `canary`
//! (b2), every other client a split of `stable` and `canary` with `split_by: client`. The
//! client namespace holds extra addresses of its /24 and each connection binds one, as a
//! network of clients would come from several sources.
//!
//! Checked: vip-class sources never reach the canary over 1,000 connections; trial sources
//! always do; the other sources split within [`SHARE_TOLERANCE_PP`] of the weight (counted by
//! connection), each client on one side only; and when an apply raises the canary's weight
//! from 5 to 25, no client moves from the canary to stable. The share of clients that moved is
//! printed beside the minimum a weight change can move (20 % of them).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{CLIENT_IF, VIP_V4, backend_name, backend_v4, vip_v4},
    agent::{Agent, temp_dir, unique_pin_path},
    client::TcpSession,
    netns::Topology,
    privileged, servers,
};
use switchyard::flows::FlowRow;

/// Hosts of 198.18.0.0/24 in class `vip` (198.18.0.16/28).
const VIP_HOSTS: [u8; 4] = [16, 17, 18, 19];
/// Hosts in class `trial` (198.18.0.32/28).
const TRIAL_HOSTS: [u8; 4] = [32, 33, 34, 35];
/// The first of the hosts of no class: 198.18.0.64 and the next [`OTHERS`] − 1.
const OTHER_FIRST: u8 = 64;
/// Clients of no class. Each client is on one side, so the canary's share of their
/// connections is the share of clients whose point falls below the threshold: with `n`
/// clients its spread is about `sqrt(0.2 · 0.8 / n)`, 5.7 points for 50 clients, 3.3 for 150.
/// Fewer than 150 would make the ±3-point bound a matter of which addresses were picked (the
/// points are a fixed hash of the addresses, so a given set passes or fails every run).
const OTHERS: u8 = 150;
/// Connections from the vip-class hosts (spread over them).
const VIP_CONNECTIONS: usize = 1_000;
/// Connections from the trial-class hosts.
const TRIAL_CONNECTIONS: usize = 200;
/// Connections from each client of no class.
const PER_OTHER: usize = 4;
/// Allowed distance between the canary's share of the other clients' connections and its
/// weight share, in percentage points.
const SHARE_TOLERANCE_PP: f64 = 3.0;

/// The config: pools `stable` (b1) and `canary` (b2), the two classes, and group `web`
/// splitting the other clients `100 − canary` / `canary`.
fn config(pin: &str, state: &std::path::Path, canary: u32) -> String {
    format!(
        r#"agent:
  pin_path: {pin}
  state_dir: {state}
services:
  - {{ name: web, vip: "{VIP_V4}", port: 80, protocol: tcp, forward: dsr-l2, to: {{ decide: web }} }}
pools:
  - {{ name: stable, backends: [ {{ address: "{b1}" }} ] }}
  - {{ name: canary, backends: [ {{ address: "{b2}" }} ] }}
classes:
  vip: {{ prefixes: [198.18.0.16/28] }}
  trial: {{ prefixes: [198.18.0.32/28] }}
decisions:
  - name: web
    split_by: client
    rules:
      - id: canary
        when: "true"
        then:
          by_class:
            vip: {{ pool: stable }}
            trial: {{ pool: canary }}
            default: {{ split: [ {{ pool: stable, weight: {stable} }}, {{ pool: canary, weight: {canary} }} ] }}
"#,
        state = state.display(),
        b1 = backend_v4(1),
        b2 = backend_v4(2),
        stable = 100 - canary,
    )
}

/// 198.18.0.`host`.
fn host(h: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, 0, h))
}

/// `switchyard ARGS… --config-dir DIR` against `agent`.
fn cli(agent: &Agent, args: &[&str]) -> Result<String> {
    let dir = agent.dir().display().to_string();
    let mut all = args.to_vec();
    all.extend(["--config-dir", dir.as_str()]);
    agent.cli(&all)
}

/// One connection from `from` (any port) to the VIP: the backend that answered.
fn answered(from: IpAddr) -> Result<String> {
    let session = TcpSession::connect_bound(vip_v4(80), SocketAddr::new(from, 0))
        .with_context(|| format!("a connection from {from}"))?;
    let name = session.backend().to_owned();
    session.finish()?;
    Ok(name)
}

/// `n` connections from each of `hosts`: the backends that answered each host, with counts.
fn sides(topo: &Topology, hosts: &[u8], n: usize) -> Result<BTreeMap<u8, BTreeMap<String, usize>>> {
    let hosts = hosts.to_vec();
    topo.client().run(move || -> Result<_> {
        let mut out: BTreeMap<u8, BTreeMap<String, usize>> = BTreeMap::new();
        for k in 0..n {
            for &h in &hosts {
                let name = answered(host(h)).with_context(|| format!("round {k}"))?;
                *out.entry(h).or_default().entry(name).or_default() += 1;
            }
        }
        Ok(out)
    })?
}

/// The one backend each host reached; an error naming a host that reached two.
fn one_side_each(seen: &BTreeMap<u8, BTreeMap<String, usize>>) -> Result<BTreeMap<u8, String>> {
    seen.iter()
        .map(|(h, backends)| {
            ensure!(
                backends.len() == 1,
                "client {} reached more than one side: {backends:?}",
                host(*h)
            );
            Ok((*h, backends.keys().next().cloned().unwrap_or_default()))
        })
        .collect()
}

/// Writes the config with the canary at `canary` and applies it.
fn apply(agent: &Agent, pin: &str, state: &std::path::Path, canary: u32) -> Result<()> {
    agent.write_file("10-web.yaml", &config(pin, state, canary))?;
    let out = cli(agent, &["ctl", "apply"])?;
    println!("apply canary {canary}: {}", out.trim());
    Ok(())
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
#[expect(
    clippy::cast_precision_loss,
    reason = "connection and client counts, far below 2^52, as percentages"
)]
fn classes_pick_their_pools_and_the_rest_split_by_client() -> Result<()> {
    if privileged::require_root_and_bpf("classes_pick_their_pools").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let others: Vec<u8> = (OTHER_FIRST..OTHER_FIRST + OTHERS).collect();
    for h in VIP_HOSTS.iter().chain(&TRIAL_HOSTS).chain(&others) {
        topo.client()
            .ip(&["addr", "add", &format!("{}/24", host(*h)), "dev", CLIENT_IF])?;
    }
    let (stable, canary) = (backend_name(1), backend_name(2));
    let pin = unique_pin_path();
    let state = temp_dir("classes")?;
    let agent = Agent::start(&topo, &[("10-web.yaml", config(&pin, &state, 20))])?;

    // What trace says of a vip client and a client of no class.
    let vip_trace = cli(
        &agent,
        &["trace", "198.18.0.16:40000", "198.18.0.10:80/tcp"],
    )?;
    println!("{vip_trace}");
    ensure!(
        vip_trace.contains("class     vip (id 2)") && vip_trace.contains("in pool stable"),
        "trace of a vip client:\n{vip_trace}"
    );
    let other_trace = cli(
        &agent,
        &["trace", "198.18.0.64:40000", "198.18.0.10:80/tcp"],
    )?;
    ensure!(
        other_trace.contains("class     none") && other_trace.contains("split_by client"),
        "trace of a client of no class:\n{other_trace}"
    );

    // vip-class sources: never the canary.
    let per_host = VIP_CONNECTIONS / VIP_HOSTS.len();
    let vip = sides(&topo, &VIP_HOSTS, per_host)?;
    let vip_total: usize = vip.values().flat_map(BTreeMap::values).sum();
    println!("vip class: {vip_total} connections: {vip:?}");
    ensure!(vip_total == VIP_CONNECTIONS, "{vip_total} connections");
    ensure!(
        vip.values().all(|b| b.keys().all(|n| *n == stable)),
        "a vip-class client reached the canary: {vip:?}"
    );

    // trial-class sources: always the canary.
    let trial = sides(&topo, &TRIAL_HOSTS, TRIAL_CONNECTIONS / TRIAL_HOSTS.len())?;
    println!("trial class: {trial:?}");
    ensure!(
        trial.values().all(|b| b.keys().all(|n| *n == canary)),
        "a trial-class client reached stable: {trial:?}"
    );

    // Everyone else: each client on one side; the canary's share of connections near 20 %.
    let rest = sides(&topo, &others, PER_OTHER)?;
    let side = one_side_each(&rest)?;
    let on_canary = side.values().filter(|n| **n == canary).count();
    let share = (on_canary * PER_OTHER) as f64 * 100.0 / (others.len() * PER_OTHER) as f64;
    println!(
        "no class: {} clients × {PER_OTHER} connections, each client on one side; canary {share:.1} % \
         of connections (weight 20 %, bound ±{SHARE_TOLERANCE_PP} pp)",
        others.len()
    );
    ensure!(
        (share - 20.0).abs() <= SHARE_TOLERANCE_PP,
        "the canary took {share:.1} % of the other clients' connections against a weight of 20 %"
    );

    // The class of an open connection, as `flows` lists it; `ctl classes` counts the sides.
    let open = topo
        .client()
        .run(|| TcpSession::connect_bound(vip_v4(80), SocketAddr::new(host(VIP_HOSTS[0]), 0)))??;
    let rows: Vec<FlowRow> = serde_json::from_str(&cli(&agent, &["flows", "--json"])?)?;
    let mine = open.local_addr()?;
    let row = rows
        .iter()
        .find(|r| r.client == mine)
        .with_context(|| format!("{mine} is not listed: {rows:?}"))?;
    ensure!(row.class.as_deref() == Some("vip"), "listed as {row:?}");
    drop(open);
    let classes = cli(&agent, &["ctl", "classes"])?;
    println!("{classes}");
    ensure!(
        classes.contains("vip") && classes.contains("trial") && classes.contains("stable"),
        "ctl classes:\n{classes}"
    );

    let metrics = agent.api_get("/metrics")?;
    let vip_line = metrics
        .lines()
        .find(|l| l.starts_with("switchyard_class_new_flows_total{") && l.contains("class=\"vip\""))
        .with_context(|| format!("no class metric for vip in:\n{metrics}"))?;
    println!("{vip_line}");
    ensure!(
        vip_line.contains("pool=\"stable\"")
            && vip_line.ends_with(&format!(" {}", VIP_CONNECTIONS + 1)),
        "the vip class's new flows: {vip_line}"
    );

    // Stickiness across a weight change: 5 → 25.
    apply(&agent, &pin, &state, 5)?;
    let before = one_side_each(&sides(&topo, &others, 2)?)?;
    apply(&agent, &pin, &state, 25)?;
    let after = one_side_each(&sides(&topo, &others, 2)?)?;
    let back: BTreeSet<u8> = before
        .iter()
        .filter(|(h, b)| **b == canary && after.get(h) == Some(&stable))
        .map(|(h, _)| *h)
        .collect();
    ensure!(
        back.is_empty(),
        "clients moved from the canary to stable when its weight rose: {:?}",
        back.iter().map(|h| host(*h)).collect::<Vec<_>>()
    );
    let moved = before
        .iter()
        .filter(|(h, b)| after.get(h) != Some(b))
        .count();
    let at = |m: &BTreeMap<u8, String>| m.values().filter(|n| **n == canary).count();
    println!(
        "weights 5 → 25: {moved} of {} clients changed side ({:.1} %; the least a change of 20 \
         points can move is 20 %); on the canary {} before, {} after",
        others.len(),
        moved as f64 * 100.0 / others.len() as f64,
        at(&before),
        at(&after)
    );
    Ok(())
}
