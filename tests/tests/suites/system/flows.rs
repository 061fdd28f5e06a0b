//! The whole system in network namespaces — `switchyard flows` and `switchyard trace`: a known
//! set of open connections is listed exactly (all, by backend, by client prefix); purging a
//! drained backend's flows sends their next packets to a new selection; and for 1,000 random
//! clients over a weighted pool and a decision group's split, trace's answer is the backend
//! that then serves the real connection.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{CLIENT_IF, VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client::{self, TcpSession, payload},
    config_text::{ConfigText, backends_v4},
    netns::Topology,
    privileged, servers,
};
use switchyard::{flows::FlowRow, trace::Trace};

/// Connections kept open.
const OPEN: usize = 36;
/// The backend whose flows are purged (1-based).
const PURGED: usize = 2;
/// Random tuples traced and connected.
const TRACED: usize = 1_000;
/// Client addresses the traced tuples come from: 198.18.0.1 (the client's own) and the next.
const CLIENT_ADDRESSES: u8 = 8;

/// `switchyard ARGS… --config-dir DIR` against `agent`.
fn cli(agent: &Agent, args: &[&str]) -> Result<String> {
    let dir = agent.dir().display().to_string();
    let mut all = args.to_vec();
    all.extend(["--config-dir", dir.as_str()]);
    agent.cli(&all)
}

/// Flows as (client, backend address).
type Listed = BTreeSet<(SocketAddr, IpAddr)>;

/// `switchyard flows --json FILTER…`: (client, backend address) of each row, and the rows.
fn flows(agent: &Agent, filter: &[&str]) -> Result<(Listed, Vec<FlowRow>)> {
    let mut args = vec!["flows", "--json"];
    args.extend_from_slice(filter);
    let rows: Vec<FlowRow> = serde_json::from_str(&cli(agent, &args)?)?;
    let set = rows
        .iter()
        .map(|r| Ok((r.client, r.backend.context("a row without a backend")?)))
        .collect::<Result<_>>()?;
    Ok((set, rows))
}

/// Each backend server's name → its address (servers start in backend order).
fn addresses(servers: &[servers::BackendServers]) -> BTreeMap<String, IpAddr> {
    servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name().to_owned(), IpAddr::V4(backend_v4(i + 1))))
        .collect()
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn flows_lists_open_connections_exactly_and_a_purge_re_selects_a_backends_flows() -> Result<()> {
    if privileged::require_root_and_bpf("flows_lists_open_connections_exactly").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let cfg = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&[100, 100, 100]), None);
    let agent = Agent::start(&topo, &[("10-web.yaml", cfg.text())])?;
    let names = addresses(&servers);
    let vip = vip_v4(80);

    let mut sessions = client::tcp_sessions(topo.client(), vip, OPEN)?;
    let known: BTreeSet<(SocketAddr, IpAddr)> = sessions
        .iter()
        .map(|s| Ok((s.local_addr()?, names[s.backend()])))
        .collect::<Result<_>>()?;
    let purged = IpAddr::V4(backend_v4(PURGED));
    let on_purged: BTreeSet<_> = known
        .iter()
        .filter(|(_, b)| *b == purged)
        .copied()
        .collect();
    ensure!(
        !on_purged.is_empty() && on_purged.len() < OPEN,
        "{} of {OPEN} connections on {purged}: the purge needs some there and some elsewhere",
        on_purged.len()
    );

    // Exactly the open connections: no more, no fewer, each on the backend that answered it.
    let (all, rows) = flows(&agent, &[])?;
    ensure!(
        all == known,
        "flows lists {all:?}\nthe open connections are {known:?}"
    );
    ensure!(
        rows.iter().all(|r| r.service.as_deref() == Some("web")
            && r.vip == vip
            && r.protocol == "tcp"
            && r.state == "open"
            && r.pool.as_deref() == Some("web")),
        "{rows:#?}"
    );
    let by_backend = flows(&agent, &["--backend", &purged.to_string()])?.0;
    ensure!(
        by_backend == on_purged,
        "--backend {purged}: {by_backend:?}"
    );
    for prefix in ["198.18.0.0/24", "198.18.0.1", "198.18.0.0/15"] {
        let by_client = flows(&agent, &["--client", prefix])?.0;
        ensure!(by_client == known, "--client {prefix}: {by_client:?}");
    }
    for prefix in ["198.18.0.2", "198.19.0.0/16", "2001:db8::/32"] {
        let by_client = flows(&agent, &["--client", prefix])?.0;
        ensure!(by_client.is_empty(), "--client {prefix}: {by_client:?}");
    }
    let both = flows(
        &agent,
        &[
            "--service",
            "web",
            "--vip",
            &VIP_V4.to_string(),
            "--backend",
            &purged.to_string(),
        ],
    )?
    .0;
    ensure!(both == on_purged, "{both:?}");
    let text = cli(&agent, &["flows"])?;
    ensure!(
        text.contains(&format!("{OPEN} tracked flows")) && text.contains("198.18.0.1:"),
        "flows text:\n{text}"
    );
    // Bad filters are refused with the reason; nothing is purged without a filter.
    for (args, reason) in [
        (
            vec!["flows", "--service", "nope"],
            "unknown service \"nope\"",
        ),
        (
            vec!["flows", "--backend", "198.18.1.99"],
            "no pool has a backend",
        ),
        (vec!["flows", "--client", "198.18.0.1/24"], "host bits"),
        (vec!["flows", "--purge"], "needs a filter"),
    ] {
        let e = cli(&agent, &args);
        ensure!(
            e.as_ref().is_err_and(|e| e.to_string().contains(reason)),
            "{args:?}: {e:?}"
        );
    }
    ensure!(flows(&agent, &[])?.0 == known);

    // Drained: its connections stay on it, new ones go elsewhere. Purged: its connections'
    // next packets are new flows, selected afresh: they reach another backend, which knows no
    // such connection and resets it.
    cli(
        &agent,
        &["ctl", "backend", "drain", "web", &purged.to_string()],
    )?;
    topo.client().run(|| -> Result<()> {
        for (k, s) in sessions.iter_mut().enumerate() {
            s.echo(&payload(k, 256))
                .with_context(|| format!("connection {k}"))?;
        }
        Ok(())
    })??;
    let said = cli(
        &agent,
        &["flows", "--purge", "--backend", &purged.to_string()],
    )?;
    ensure!(
        said.contains(&format!(
            "purged {} connection-tracking entries",
            on_purged.len()
        )),
        "purge said {said:?}"
    );
    ensure!(
        flows(&agent, &["--backend", &purged.to_string()])?
            .0
            .is_empty()
    );
    let purged_ports: HashSet<SocketAddr> = on_purged.iter().map(|(c, _)| *c).collect();
    let outcomes = topo.client().run(|| -> Result<Vec<(SocketAddr, bool)>> {
        sessions
            .iter_mut()
            .enumerate()
            .map(|(k, s)| Ok((s.local_addr()?, s.echo(&payload(OPEN + k, 256)).is_ok())))
            .collect()
    })??;
    for (local, ok) in &outcomes {
        if purged_ports.contains(local) {
            ensure!(!ok, "{local}: a purged connection still reached {purged}");
        } else {
            ensure!(ok, "{local}: a connection of another backend broke");
        }
    }
    let after = flows(&agent, &[])?.0;
    for (local, _) in &on_purged {
        let now_on: Vec<IpAddr> = after
            .iter()
            .filter(|(c, _)| c == local)
            .map(|x| x.1)
            .collect();
        ensure!(
            now_on.len() == 1 && now_on[0] != purged,
            "{local}: its next packet was tracked on {now_on:?}, not on a new selection"
        );
    }
    Ok(())
}

/// A small deterministic generator (xorshift64*): the tuples are random but repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn trace_agrees_with_the_data_path_for_a_thousand_random_tuples() -> Result<()> {
    if privileged::require_root_and_bpf("trace_agrees_with_the_data_path").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(4).build()?;
    let servers = servers::start_all(&topo)?;
    let names = addresses(&servers);
    // A weighted pool of three, a pool of one, and a decision group whose rule splits 60:40.
    let main = backends_v4(&[100, 300, 50]);
    let other = [(IpAddr::V4(backend_v4(4)), 100)];
    let mut text = ConfigText::new()
        .deciding_service("web", VIP_V4.into(), "tcp", "dsr-l2", "g")
        .pool("main", &main, None)
        .pool("other", &other, None)
        .state("canary", "{ push: { default: true } }")
        .text();
    text.push_str(
        "decisions:\n  - name: g\n    rules:\n      - { id: canary-on, priority: 10, when: \
         \"canary\", then: { split: [ { pool: main, weight: 60 }, { pool: other, weight: 40 } ] } }\n    \
         default: { pool: main }\n",
    );
    let agent = Agent::start(&topo, &[("10-web.yaml", text)])?;
    agent.wait_next_hops()?;
    let client = topo.client();
    for i in 2..=CLIENT_ADDRESSES {
        client.ip(&["addr", "add", &format!("198.18.0.{i}/24"), "dev", CLIENT_IF])?;
    }

    let mut rng = Rng(0x5eed_f10e_7ace_0001);
    let mut used = HashSet::new();
    let mut served: BTreeMap<IpAddr, usize> = BTreeMap::new();
    let mut pools: BTreeMap<String, usize> = BTreeMap::new();
    while used.len() < TRACED {
        let host = u8::try_from(rng.next() % u64::from(CLIENT_ADDRESSES)).unwrap_or(0) + 1;
        let port = u16::try_from(20_000 + rng.next() % 40_000).unwrap_or(20_000);
        let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, host)), port);
        if !used.insert(from) {
            continue;
        }
        let t: Trace = serde_json::from_str(
            &agent.api_get(&format!("/trace?client={from}&vip={VIP_V4}:80/tcp"))?,
        )?;
        ensure!(
            t.by == "new flow"
                && t.group.as_deref() == Some("g")
                && t.rule.as_deref() == Some("rule canary-on"),
            "{from}: {t:#?}"
        );
        let said: IpAddr = t
            .backend
            .as_deref()
            .with_context(|| format!("{from}: no backend: {t:#?}"))?
            .parse()?;
        let session = client.run(move || TcpSession::connect_bound(vip_v4(80), from))??;
        let answered = names[session.backend()];
        ensure!(
            answered == said,
            "{from}: trace says {said}, {answered} answered; trace: {t:#?}"
        );
        client.run(move || session.reset())??;
        *served.entry(answered).or_default() += 1;
        *pools.entry(t.pool.unwrap_or_default()).or_default() += 1;
    }
    // Both pools of the split and every backend of the weighted pool took part.
    ensure!(served.len() == 4, "backends served: {served:?}");
    ensure!(
        pools.get("main").is_some_and(|n| *n > TRACED / 2)
            && pools.get("other").is_some_and(|n| *n > TRACED / 4),
        "pools picked: {pools:?}"
    );

    // The text form names every step.
    let text = cli(
        &agent,
        &["trace", "198.18.0.1:4242", &format!("{VIP_V4}:80/tcp")],
    )?;
    for part in [
        "service   web",
        "group     g: split=main:60,other:40 (by rule canary-on)",
        "Maglev slot",
        "(new flow)",
    ] {
        ensure!(text.contains(part), "no {part:?} in:\n{text}");
    }

    // An open connection overrides a changed decision: with the group on `main` alone, its
    // tuple still goes where it is tracked, and a new one goes to `main`.
    let (kept, kept_on) = loop {
        let port = u16::try_from(10_000 + rng.next() % 10_000).unwrap_or(10_000);
        let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), port);
        let t: Trace = serde_json::from_str(
            &agent.api_get(&format!("/trace?client={from}&vip={VIP_V4}:80/tcp"))?,
        )?;
        if t.pool.as_deref() == Some("other") {
            let session = client.run(move || TcpSession::connect_bound(vip_v4(80), from))??;
            break (session, from);
        }
    };
    cli(&agent, &["ctl", "state", "set", "canary=false"])?;
    let t: Trace = serde_json::from_str(
        &agent.api_get(&format!("/trace?client={kept_on}&vip={VIP_V4}:80/tcp"))?,
    )?;
    ensure!(
        t.by == "tracked flow"
            && t.pool.as_deref() == Some("main")
            && t.backend == Some(backend_v4(4).to_string())
            && t.rule.as_deref() == Some("default"),
        "{t:#?}"
    );
    let mut kept = kept;
    client.run(move || kept.echo(b"still here"))??;
    Ok(())
}
