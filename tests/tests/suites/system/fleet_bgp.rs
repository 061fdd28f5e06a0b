//! The whole system in network namespaces — virtual IPs announced over BGP: a router running
//! BIRD with ECMP multipath over three balancers, each running BIRD and a real `switchyard
//! attach` with the same config (so the same Maglev tables), DSR backends on a shared segment,
//! a client behind the router ([`router_tests::bird::Fleet`]). Connections spread over the
//! three nodes; a node that dies is withdrawn by BFD (the time is measured and printed);
//! an agent announces a VIP only once its maps are written and withdraws it first on SIGTERM
//! and on `switchyard detach`, and its gratuitous ARP moves a neighbour's entry for the VIP
//! to it; a restarted agent removes routes it does not announce; a node
//! joining and a rolling upgrade (each node stopped, its program swapped by a new build,
//! the new build started) under traffic fail no connection; an IPv6 VIP
//! gets a /128 route and an unsolicited neighbour advertisement.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{TCP_ECHO_PORT, VIP_V4},
    agent::{Agent, temp_dir},
    bird::{self, Bird, DOWN_IF, Fleet, UP_IF},
    client::{TcpSession, payload, tcp_tally},
    config_text::{ConfigText, FAST_HTTP_CHECK},
    load::{Load, LoadSpec},
    privileged,
    servers::BackendServers,
};

/// The announcement interface and route protocol (the `announce:` defaults).
const DUMMY: &str = "switchyard0";
const PROTOCOL: u8 = 83;

fn vip() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(VIP_V4), TCP_ECHO_PORT)
}

/// The same config for every node: one DSR service on the VIP over both backends (health
/// checked), and `announce:` with its defaults.
/// How long a wait for BGP sessions to carry an announcement may take: BIRD connects 5 s
/// after it starts, and a session that failed on the way (a BFD flap on a loaded machine)
/// is retried after BIRD's `error wait time`, 60 s by default. A liveness bound, not a
/// measurement.
const SESSIONS_UP: Duration = Duration::from_mins(2);

fn config() -> String {
    config_with_garp(&[])
}

/// [`config`] with `announce.garp` listing `garp`.
fn config_with_garp(garp: &[&str]) -> String {
    let backends: Vec<(IpAddr, u32)> = (1..=2).map(|i| (bird::backend(i).into(), 100)).collect();
    let text = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends, Some(FAST_HTTP_CHECK))
        .text();
    format!(
        "{text}announce:\n  interface: {DUMMY}\n  garp: [{}]\n",
        garp.join(", ")
    )
}

/// A fleet of `nodes` balancers with BIRD running on the router and on each node, and the
/// backends' servers.
struct Running {
    fleet: Fleet,
    router_bird: Bird,
    birds: Vec<Bird>,
    servers: Vec<BackendServers>,
}

impl Running {
    /// [`Fleet::wait_router`]; a timeout carries what every BIRD says of its sessions and
    /// routes, so a session that did not come up is named.
    fn wait_router(
        &self,
        limit: Duration,
        pred: impl Fn(&[Ipv4Addr]) -> bool,
    ) -> Result<(Vec<Ipv4Addr>, Duration)> {
        self.fleet
            .wait_router(VIP_V4, limit, pred)
            .with_context(|| self.bird_report())
    }

    fn bird_report(&self) -> String {
        let mut text = String::new();
        let birds = std::iter::once(("router", &self.router_bird))
            .chain(self.birds.iter().map(|bird| ("balancer", bird)));
        for (role, bird) in birds {
            for command in [&["show", "protocols", "all"][..], &["show", "route"][..]] {
                let out = bird
                    .birdc(command)
                    .unwrap_or_else(|e| format!("birdc failed: {e:#}"));
                let _ = writeln!(text, "--- {role}: birdc {}\n{out}", command.join(" "));
            }
            let _ = writeln!(text, "--- {role}: output\n{}", bird.output());
        }
        for k in 1..=self.birds.len() {
            let routes = routes_on_dummy(self, k).unwrap_or_else(|e| format!("{e:#}"));
            let _ = writeln!(text, "--- balancer {k}: announcement routes\n{routes}");
        }
        text
    }
}

fn fleet(nodes: usize) -> Result<Running> {
    let fleet = Fleet::build(nodes, 2)?;
    let servers = (1..=2)
        .map(|i| BackendServers::start(&fleet.backends[i - 1], &format!("b{i}"), &[]))
        .collect::<Result<Vec<_>>>()?;
    let neighbors: Vec<Ipv4Addr> = (1..=nodes).map(bird::balancer_up).collect();
    let router_bird = Bird::start(
        &fleet.router,
        &bird::router_config(bird::ROUTER_CLIENT_SIDE, &neighbors, "198.18.0.0/24"),
    )?;
    let birds = (1..=nodes)
        .map(|k| {
            Bird::start(
                &fleet.balancers[k - 1],
                &bird::balancer_config(
                    bird::balancer_up(k),
                    bird::router_side(k),
                    UP_IF,
                    DUMMY,
                    PROTOCOL,
                ),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Running {
        fleet,
        router_bird,
        birds,
        servers,
    })
}

fn start_agent(run: &Running, k: usize) -> Result<Agent> {
    let mut agent = Agent::launch_in(
        &run.fleet.balancers[k - 1],
        &[("base.yaml", config())],
        &[UP_IF, DOWN_IF],
    )?;
    agent.wait_answering()?;
    Ok(agent)
}

/// The agent's announcement routes in its namespace (`ip route show dev switchyard0 proto 83`).
fn routes_on_dummy(run: &Running, k: usize) -> Result<String> {
    let ns = &run.fleet.balancers[k - 1];
    match ns.ip(&[
        "-4",
        "route",
        "show",
        "dev",
        DUMMY,
        "proto",
        &PROTOCOL.to_string(),
    ]) {
        Ok(text) => Ok(text),
        // No interface yet: no route.
        Err(e) if e.to_string().contains("Cannot find device") => Ok(String::new()),
        Err(e) => Err(e),
    }
}

/// Packets the agent's program counted for the service `web`, all actions (`/metrics`).
fn web_packets(agent: &Agent) -> Result<u64> {
    let text = agent.api_get("/metrics")?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("switchyard_service_packets_total{service=\"web\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}

/// The node (1-based) the router sends the client's TCP flow from `sport` through: `ip route
/// get` with the 5-tuple, as the multipath hash picks.
fn node_of(run: &Running, sport: u16, nodes: usize) -> Result<Option<usize>> {
    let text = run.fleet.router.ip(&[
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
    Ok((1..=nodes).find(|&k| text.contains(&format!("via {} ", bird::balancer_up(k)))))
}

/// Identical tables: once every node has checked every backend, each reports the same
/// fingerprint for the pool's live table.
fn same_tables(agents: &[Agent]) -> Result<()> {
    for a in agents {
        a.wait_for(Duration::from_secs(10), |s| {
            s.pools.iter().all(|p| p.backends.iter().all(|b| b.healthy))
        })?;
    }
    let tables: Vec<Option<String>> = agents
        .iter()
        .map(|a| {
            Ok(a.status()?
                .pools
                .into_iter()
                .find(|p| p.name == "web")
                .and_then(|p| p.table))
        })
        .collect::<Result<_>>()?;
    ensure!(
        tables[0].is_some() && tables.iter().all(|t| *t == tables[0]),
        "the nodes' tables differ: {tables:?}"
    );
    Ok(())
}

#[test]
fn three_balancers_share_a_vip_by_ecmp_and_bfd_withdraws_a_killed_one() -> Result<()> {
    if privileged::require("three_balancers_share_a_vip_by_ecmp", &["bird", "nft"]).is_err() {
        return Ok(());
    }
    let run = fleet(3)?;
    let mut agents = (1..=3)
        .map(|k| start_agent(&run, k))
        .collect::<Result<Vec<_>>>()?;
    let all: Vec<Ipv4Addr> = (1..=3).map(bird::balancer_up).collect();
    let (_, took) = run
        .wait_router(SESSIONS_UP, |h| h.len() == 3)
        .with_context(|| run.router_bird.output())?;
    println!("the router has 3 next hops to the VIP {took:?} after the agents answered");

    same_tables(&agents)?;

    // Balance: every connection completes, and each node carries some.
    let before: Vec<u64> = agents.iter().map(web_packets).collect::<Result<_>>()?;
    let tally = tcp_tally(&run.fleet.client, vip(), 90)?;
    ensure!(
        tally.values().sum::<usize>() == 90,
        "connections completed: {tally:?}"
    );
    let per_node: Vec<u64> = agents
        .iter()
        .zip(&before)
        .map(|(a, b)| Ok(web_packets(a)? - b))
        .collect::<Result<_>>()?;
    println!("90 connections: backends {tally:?}, packets per node {per_node:?}");
    ensure!(
        per_node.iter().all(|&p| p > 0),
        "a node carried no packet: {per_node:?}"
    );

    // Established connections, each with the node the router hashes it to.
    let mut sessions = run
        .fleet
        .client
        .run(|| -> Result<Vec<(TcpSession, usize)>> {
            let mut out = Vec::new();
            for k in 0..30 {
                let mut s = TcpSession::connect(vip())?;
                s.echo(&payload(k, 512))?;
                let node = node_of(&run, s.local_addr()?.port(), 3)?.context("no node")?;
                out.push((s, node));
            }
            Ok(out)
        })??;

    // Node 3 dies: the router hears nothing more from it (its link stays up), its agent and
    // its BIRD are killed with SIGKILL; only BFD can tell the router.
    let killed = Instant::now();
    run.fleet.silence(3)?;
    agents[2].kill()?;
    let mut run = run;
    run.birds[2].kill();
    let (hops, _) = run.wait_router(Duration::from_secs(5), |h| {
        !h.contains(&bird::balancer_up(3))
    })?;
    let withdrawn = killed.elapsed();
    println!(
        "BFD withdrawal: node 3 left the router's route {} ms after it was killed; next hops \
         {hops:?}",
        withdrawn.as_millis()
    );
    ensure!(hops.len() == 2 && hops.iter().all(|h| all.contains(h)));
    ensure!(
        withdrawn < Duration::from_secs(1),
        "withdrawn after {withdrawn:?}, not within a second"
    );

    // Connections through the surviving nodes survive; new connections succeed.
    let (mut survived, mut moved, mut moved_ok) = (0, 0, 0);
    for (k, (s, node)) in sessions.iter_mut().enumerate() {
        let ok = s.echo(&payload(100 + k, 512)).is_ok();
        if *node == 3 {
            moved += 1;
            moved_ok += usize::from(ok);
        } else {
            ensure!(ok, "a connection through surviving node {node} broke");
            survived += 1;
        }
    }
    println!(
        "{survived} connections through nodes 1-2 survived; {moved_ok} of {moved} through \
         node 3 continued on another node"
    );
    let after = tcp_tally(&run.fleet.client, vip(), 30)?;
    ensure!(
        after.values().sum::<usize>() == 30,
        "after the kill: {after:?}"
    );
    drop(sessions);
    drop(agents);
    drop(run.birds);
    drop(run.servers);
    Ok(())
}

/// Starts the agent of the only node and checks it is not announced before its maps are
/// written: from the first moment the route exists, the agent's status says the VIP is live
/// in the map it wrote, its log has the apply before the announcement, and `/metrics` says 1.
fn announced_after_publishing(run: &Running) -> Result<Agent> {
    let mut agent = Agent::launch_in(
        &run.fleet.balancers[0],
        &[("base.yaml", config_with_garp(&[UP_IF]))],
        &[UP_IF, DOWN_IF],
    )?;
    let start = Instant::now();
    loop {
        if !routes_on_dummy(run, 1)?.is_empty() {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "no announcement route: {}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = agent.status()?;
    let v = status
        .vips
        .iter()
        .find(|v| v.address == VIP_V4.to_string())
        .context("the VIP is not in status")?;
    ensure!(v.live && v.announced == Some(true), "{v:?}");
    let log = agent.log_text();
    let (applied, announced) = (
        log.find("applied").context("no apply in the log")?,
        log.find("announced")
            .context("no announcement in the log")?,
    );
    ensure!(
        applied < announced,
        "announced before the first apply:\n{log}"
    );
    agent.wait_answering()?;
    let metrics = agent.api_get("/metrics")?;
    ensure!(
        metrics.contains(&format!("switchyard_vip_announced{{vip=\"{VIP_V4}\"}} 1")),
        "{metrics}"
    );
    Ok(agent)
}

#[test]
fn an_agent_announces_after_publishing_and_withdraws_first_on_sigterm_and_detach() -> Result<()> {
    if privileged::require("an_agent_announces_after_publishing", &["bird"]).is_err() {
        return Ok(());
    }
    let run = fleet(1)?;
    // A host on the uplink's segment that has the VIP at another MAC address (as after
    // another node held it): the gratuitous ARP of the announcement moves it here.
    let stale_mac = "02:00:00:00:00:99";
    run.fleet.router.ip(&[
        "neigh",
        "replace",
        &VIP_V4.to_string(),
        "lladdr",
        stale_mac,
        "dev",
        "lb1",
        "nud",
        "stale",
    ])?;
    let mut agent = announced_after_publishing(&run)?;
    run.wait_router(SESSIONS_UP, |h| h.len() == 1)?;
    let uplink_mac = run.fleet.balancers[0].ip(&["-br", "link", "show", UP_IF])?;
    let uplink_mac = uplink_mac
        .split_whitespace()
        .nth(2)
        .context("no MAC address")?
        .to_owned();
    let neigh = run
        .fleet
        .router
        .ip(&["neigh", "show", &VIP_V4.to_string(), "dev", "lb1"])?;
    ensure!(
        neigh.contains(&uplink_mac),
        "the router's entry for the VIP is {neigh:?}, not at {uplink_mac}"
    );

    // The service goes down (both backends fail their checks): withdrawn; back up: announced.
    for s in &run.servers {
        s.set_healthy(false);
    }
    run.wait_router(Duration::from_secs(10), <[_]>::is_empty)?;
    ensure!(routes_on_dummy(&run, 1)?.is_empty());
    for s in &run.servers {
        s.set_healthy(true);
    }
    run.wait_router(Duration::from_secs(10), |h| h.len() == 1)?;

    // SIGTERM: the route is gone when the agent has exited, and the router follows.
    let stopping = Instant::now();
    agent.stop()?;
    ensure!(
        routes_on_dummy(&run, 1)?.is_empty(),
        "the route outlived the agent"
    );
    run.wait_router(Duration::from_secs(5), <[_]>::is_empty)?;
    println!(
        "SIGTERM: the router dropped the VIP {} ms after the signal",
        stopping.elapsed().as_millis()
    );
    ensure!(agent.log_text().contains("withdrew"));

    // A restarted agent removes an announcement route it does not make, and announces again.
    let stale = "198.18.0.99/32";
    run.fleet.balancers[0].ip(&[
        "route", "add", stale, "dev", DUMMY, "proto", "83", "scope", "link",
    ])?;
    agent.relaunch()?;
    run.wait_router(SESSIONS_UP, |h| h.len() == 1)?;
    let routes = routes_on_dummy(&run, 1)?;
    ensure!(
        !routes.contains("198.18.0.99"),
        "stale route kept: {routes}"
    );

    // `switchyard detach` withdraws before it detaches, and the running agent announces
    // nothing more.
    let dir = agent.config_dir.display().to_string();
    agent.cli(&[
        "detach",
        "--iface",
        UP_IF,
        "--iface",
        DOWN_IF,
        "--config-dir",
        &dir,
    ])?;
    ensure!(routes_on_dummy(&run, 1)?.is_empty());
    std::thread::sleep(Duration::from_millis(1500));
    ensure!(
        routes_on_dummy(&run, 1)?.is_empty(),
        "announced again after the detach"
    );
    run.wait_router(Duration::from_secs(5), <[_]>::is_empty)?;
    drop(run.birds);
    Ok(())
}

/// An agent killed while announcing leaves its routes (decision 0026); restarted with
/// `announce:` removed, it withdraws them: nothing else ever would (`switchyard detach`
/// follows the directory's settings).
#[test]
fn a_restart_without_announce_withdraws_the_routes_a_killed_agent_left() -> Result<()> {
    if privileged::require("a_restart_without_announce_withdraws", &["bird"]).is_err() {
        return Ok(());
    }
    let run = fleet(1)?;
    let mut agent = start_agent(&run, 1)?;
    let start = Instant::now();
    while routes_on_dummy(&run, 1)?.is_empty() {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "no announcement route: {}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    agent.kill()?;
    ensure!(!routes_on_dummy(&run, 1)?.is_empty(), "SIGKILL keeps them");
    // The same file (its pin path included) without its `announce:`.
    let text = std::fs::read_to_string(agent.dir().join("base.yaml"))?;
    let without = text.split("announce:").next().context("a config")?;
    agent.write_file("base.yaml", without)?;
    agent.relaunch()?;
    agent.wait_answering()?;
    let routes = routes_on_dummy(&run, 1)?;
    ensure!(
        routes.is_empty(),
        "routes left by the killed agent: {routes}\n{}",
        agent.log_text()
    );
    drop(run.birds);
    Ok(())
}

#[test]
fn a_node_joining_and_a_rolling_upgrade_under_traffic_fail_no_connection() -> Result<()> {
    if privileged::require("a_node_joining_and_a_rolling_upgrade", &["bird"]).is_err() {
        return Ok(());
    }
    let run = fleet(3)?;
    let mut agents = (1..=2)
        .map(|k| start_agent(&run, k))
        .collect::<Result<Vec<_>>>()?;
    run.wait_router(SESSIONS_UP, |h| h.len() == 2)?;
    let load = Load::start(
        &run.fleet.client,
        LoadSpec {
            addr: vip(),
            persistent: 30,
            period: Duration::from_millis(50),
            payload: 128,
            new_pause: Duration::from_millis(10),
            connect_timeout: Duration::from_secs(3),
        },
        Duration::from_secs(15),
    )?;
    std::thread::sleep(Duration::from_secs(1));

    // Node 3 joins: the router rehashes a third of the flows onto it, which has never seen
    // them; its tables are the others', so they reach the same backends.
    load.set_phase(1);
    agents.push(start_agent(&run, 3)?);
    let (_, took) = run.wait_router(SESSIONS_UP, |h| h.len() == 3)?;
    println!("node 3 joined the router's route {took:?} after its agent answered");
    std::thread::sleep(Duration::from_secs(1));
    let joined = web_packets(&agents[2])?;
    ensure!(joined > 0, "node 3 took no packet of the load");

    // A rolling upgrade: each node in turn is stopped (withdrawn first), its new build
    // installed, its program swapped in place by the new build (`switchyard upgrade`, maps and
    // flows kept), and the new build started and announced again before the next node. A copy
    // of this build stands for the new one: the steps and what they keep are an operator's;
    // what a real new build may change, the map layout, is refused by `upgrade` (decision 0007).
    load.set_phase(2);
    let release = temp_dir("release")?;
    let new_build = release.join("switchyard");
    std::fs::copy(router_tests::agent::binary()?, &new_build)?;
    for (k, agent) in agents.iter_mut().enumerate() {
        let lb = &run.fleet.balancers[k];
        agent.stop()?;
        let before = [lb.xdp_program_id(UP_IF)?, lb.xdp_program_id(DOWN_IF)?];
        for iface in [UP_IF, DOWN_IF] {
            // nsenter keeps the host's /sys (and its bpffs); `ip netns exec` mounts its own.
            let out = std::process::Command::new("nsenter")
                .arg(format!("--net={}", lb.path().display()))
                .arg(&new_build)
                .args(["upgrade", "--iface", iface, "--config-dir"])
                .arg(agent.dir())
                .stdin(std::process::Stdio::null())
                .output()?;
            ensure!(
                out.status.success(),
                "node {}: upgrade {iface}: {}\n{}",
                k + 1,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let after = [lb.xdp_program_id(UP_IF)?, lb.xdp_program_id(DOWN_IF)?];
        ensure!(
            after
                .iter()
                .zip(&before)
                .all(|(a, b)| a.is_some() && a != b),
            "node {}: programs {before:?} after the upgrade are {after:?}",
            k + 1
        );
        agent.set_bin(new_build.clone());
        agent.relaunch()?;
        ensure!(
            agent.running_exe().as_deref() == Some(new_build.as_path()),
            "node {} runs {:?}",
            k + 1,
            agent.running_exe()
        );
        run.wait_router(SESSIONS_UP, |h| {
            h.contains(&bird::balancer_up(k + 1)) && h.len() == 3
        })?;
    }
    std::thread::sleep(Duration::from_secs(1));
    let report = load.stop();
    let total = report.total();
    println!(
        "join and rolling upgrade: {} exchanges, {} short connections, {} failures, per \
         phase {:?}",
        total.exchanges,
        total.short_ok,
        report.failures.len(),
        report
            .phases
            .iter()
            .map(|p| (p.exchanges, p.short_ok))
            .collect::<Vec<_>>()
    );
    ensure!(
        report.failures.is_empty(),
        "failures: {:#?}",
        report.failures
    );
    ensure!(report.phases.iter().take(3).all(|p| p.short_ok > 0));
    drop(agents);
    drop(run.birds);
    let _ = std::fs::remove_dir_all(release);
    Ok(())
}

#[test]
fn an_ipv6_vip_is_announced_as_a_host_route_and_advertised_by_an_unsolicited_na() -> Result<()> {
    use router_tests::addrs::{CLIENT_IF, LB_CLIENT_IF, LB_CLIENT_SIDE_MAC, VIP_V6, mac_string};
    use router_tests::config_text::{backends_v4, backends_v6};
    if privileged::require_root_and_bpf("an_ipv6_vip_is_announced").is_err() {
        return Ok(());
    }
    // The standard topology, one balancer: the client's link is the shared segment, where
    // the client still has the VIP at another node's MAC address.
    let topo = router_tests::netns::Topology::builder()
        .backends(2)
        .build()?;
    let _servers = router_tests::servers::start_all(&topo)?;
    topo.client().ip(&[
        "-6",
        "neigh",
        "replace",
        &VIP_V6.to_string(),
        "lladdr",
        "02:00:00:00:00:99",
        "dev",
        CLIENT_IF,
        "nud",
        "stale",
    ])?;
    let text = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .service("web6", VIP_V6.into(), "tcp", "dsr-l2", "web6")
        .pool("web", &backends_v4(&[100, 100]), None)
        .pool("web6", &backends_v6(2), None)
        .text();
    let config = format!("{text}announce:\n  garp: [{LB_CLIENT_IF}]\n");
    let agent = Agent::start(&topo, &[("10-web.yaml", config)])?;
    agent.wait_for(Duration::from_secs(10), |s| {
        s.vips.iter().all(|v| v.announced == Some(true))
    })?;
    let routes = topo
        .lb()
        .ip(&["-6", "route", "show", "dev", DUMMY, "proto", "83"])?;
    ensure!(routes.contains(&VIP_V6.to_string()), "{routes:?}");
    let routes4 = topo
        .lb()
        .ip(&["-4", "route", "show", "dev", DUMMY, "proto", "83"])?;
    ensure!(routes4.contains(&VIP_V4.to_string()), "{routes4:?}");
    let neigh =
        topo.client()
            .ip(&["-6", "neigh", "show", &VIP_V6.to_string(), "dev", CLIENT_IF])?;
    ensure!(
        neigh.contains(&mac_string(LB_CLIENT_SIDE_MAC)),
        "the client's entry for the VIP is {neigh:?}"
    );
    Ok(())
}
