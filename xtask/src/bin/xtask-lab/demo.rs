//! `cargo xtask demo`: the whole system in network namespaces on this machine, narrated for
//! a newcomer — a client, the balancer running the real `switchyard attach`, and 7 backends;
//! traffic over TCP, UDP and IPv6; a backend failing and traffic moving; a config change and
//! a rollback; then the failover story: a decision group over two pools (data centres dc1 and
//! dc2), a failing probe and the measured time until connections reach dc2, the failback
//! waiting `failback_after`, a maintenance flag, an override with a TTL and a reason, and the
//! audit trail; then everything removed again (see [`crate::cleanup`]).

use std::{
    fmt::Write as _,
    net::SocketAddr,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use router_tests::{
    addrs::{
        CLIENT_V4, CLIENT_V6, HEALTH_PORT, LB_CLIENT_IF, TCP_ECHO_PORT, UDP_NAME_PORT, VIP_V4,
        VIP_V6, backend_name, backend_return_v4, backend_return_v6, backend_v4, backend_v6, vip_v4,
        vip_v6,
    },
    agent::{self, Agent},
    client::{self, Tally, TcpSession},
    netns::{Netns, Topology},
    servers,
};

use switchyard::api::status::Status;

use crate::cleanup::{self, checkpoint};

/// The backends of pool `web` (b1..b3).
const BACKENDS: usize = 3;
/// Pool dc1 of the failover story; the group's probe reads the first one's `GET /health`.
pub(crate) const DC1: [usize; 2] = [4, 5];
/// Pool dc2 of the failover story.
pub(crate) const DC2: [usize; 2] = [6, 7];
/// Every backend namespace.
const ALL_BACKENDS: usize = 7;
/// The story's decision group.
pub(crate) const GROUP: &str = "web-failover";
/// The group's probe of dc1's API: interval, timeout (ms) and failures before it reads false.
pub(crate) const PROBE_INTERVAL_MS: u64 = 100;
pub(crate) const PROBE_TIMEOUT_MS: u64 = 200;
pub(crate) const PROBE_FAILURES: u64 = 2;
/// The group's `stable_for` (ms), `cooldown` and `failback_after` (s).
pub(crate) const STABLE_FOR_MS: u64 = 50;
pub(crate) const COOLDOWN_S: u64 = 1;
pub(crate) const FAILBACK_AFTER_S: u64 = 5;
/// Connections per look at where new connections go in the story.
pub(crate) const LOOK: usize = 40;
/// The backend that fails (1-based).
const FAILING: usize = 2;
/// Connections per tally.
const TALLY: usize = 300;
/// Health-check timing, as written in the config.
const INTERVAL: &str = "300ms";
const UNHEALTHY_THRESHOLD: u32 = 2;

/// Runs the demo and checks that nothing is left behind, whatever happened. With `pause`, it
/// waits before cleaning up, so the running system can be inspected from another shell.
pub fn run(pause: bool) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the demo creates network namespaces and loads BPF programs: run it as root");
    }
    cleanup::install()?;
    let stale = cleanup::sweep_stale();
    if !stale.is_empty() {
        println!(
            "removed what earlier, killed runs left: {}",
            stale.join(", ")
        );
    }
    let result = demo(pause);
    let left = cleanup::sweep_own();
    if left.is_empty() {
        println!(
            "Nothing left behind: no namespaces, no pins under {}, no temporary files.",
            cleanup::pin_path().display()
        );
    } else {
        println!("Removed what was left:");
        for l in &left {
            println!("  {l}");
        }
    }
    match result {
        Err(_) if cleanup::interrupted() => bail!("interrupted; everything was removed"),
        r => r,
    }
}

pub(crate) fn heading(n: u32, title: &str) {
    println!("\n== {n}. {title} ==");
}

fn demo(pause: bool) -> Result<()> {
    println!(
        "Switchyard demo: a client, a load balancer and {ALL_BACKENDS} backends, each in its \
         own network namespace on this machine. The balancer runs the real `switchyard attach`."
    );

    heading(1, "The network");
    let topo = Topology::builder().backends(ALL_BACKENDS).build()?;
    print_network(&topo);
    let mut servers = servers::start_all(&topo)?;
    checkpoint()?;

    heading(2, "The configuration, as an operator writes it");
    let yaml = config();
    let agent = start_agent(&topo, &yaml)?;
    checkpoint()?;

    heading(3, "What the agent reports");
    println!(
        "$ switchyard status   (here inside the lb namespace: nsenter --net={} {} status \
         --config-dir {})",
        topo.lb().path().display(),
        agent::binary()?.display(),
        agent.dir().display()
    );
    print!("{}", status(&agent)?);
    checkpoint()?;

    heading(4, "TCP to the IPv4 virtual IP (service `web`, dsr-l2)");
    println!(
        "Each connection is a new flow; Maglev hashing picks its backend, which replies to \
         the client directly."
    );
    connections(topo.client(), vip_v4(TCP_ECHO_PORT), 12)?;
    tally(&topo, vip_v4(TCP_ECHO_PORT))?;
    checkpoint()?;

    heading(5, "UDP to the IPv4 virtual IP (service `dns`, nat)");
    println!("Each query comes from a new source port; replies come back through the balancer.");
    udp_queries(topo.client(), vip_v4(UDP_NAME_PORT), 6)?;
    checkpoint()?;

    heading(6, "IPv6 (service `web6`, dsr-l2)");
    connections(topo.client(), vip_v6(TCP_ECHO_PORT), 6)?;
    checkpoint()?;

    let failing = backend_name(FAILING);
    heading(7, &format!("Backend {failing} fails"));
    println!(
        "Stopping every server on {failing}: its health check (GET /health on :{HEALTH_PORT}) \
         now gets \"connection refused\"."
    );
    let stopped = Instant::now();
    servers.remove(FAILING - 1).stop();
    let v4 = backend_v4(FAILING).to_string();
    let v6 = backend_v6(FAILING).to_string();
    wait_until(&agent, |s| {
        Agent::healthy(s, "web", &v4) == Some(false)
            && Agent::healthy(s, "web6", &v6) == Some(false)
    })?;
    println!(
        "The agent marked {failing} down in both pools {:.2} s after it stopped (a check every \
         {INTERVAL}, down after {UNHEALTHY_THRESHOLD} failures in a row), and removed it from \
         the pools' Maglev tables.",
        stopped.elapsed().as_secs_f64()
    );
    println!("New flows now go to the others:");
    tally(&topo, vip_v4(TCP_ECHO_PORT))?;
    udp_queries(topo.client(), vip_v4(UDP_NAME_PORT), 6)?;
    checkpoint()?;

    heading(8, "What the agent reports now");
    println!("$ switchyard status");
    print!("{}", status(&agent)?);
    checkpoint()?;

    heading(9, "A config change, dropped into the directory");
    config_change(&topo, &agent, &yaml)?;
    checkpoint()?;

    heading(
        10,
        "Metrics (GET /metrics on the agent's API, 127.0.0.1:9900; a few lines)",
    );
    print_metrics(&agent.api_get("/metrics")?);
    checkpoint()?;

    crate::story::run(&topo, &servers, &agent, &yaml)?;

    if pause {
        pause_for_inspection(&topo, &agent)?;
    }
    heading(17, "Cleaning up");
    drop(agent);
    println!("agent stopped; program detached from every interface; its pins removed");
    drop(servers);
    topo.teardown()?;
    println!("servers stopped; namespaces deleted");
    Ok(())
}

/// `switchyard ARGS…` as the operator types it, run in the lb namespace; prints both.
pub(crate) fn show(agent: &Agent, args: &[&str]) -> Result<()> {
    let dir = agent.dir().display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--config-dir", &dir]);
    if args.first() == Some(&"ctl") {
        // `--config-dir` belongs to `ctl`, before its subcommand.
        all = vec!["ctl", "--config-dir", &dir];
        all.extend(&args[1..]);
    }
    let typed: Vec<String> = args
        .iter()
        .map(|a| {
            if a.contains(' ') {
                format!("{a:?}")
            } else {
                (*a).to_owned()
            }
        })
        .collect();
    println!("$ switchyard {}", typed.join(" "));
    print!("{}", agent.cli(&all)?);
    Ok(())
}

/// Gives b1 three times the weight by editing the fragment in place (no signal: the agent
/// watches the directory), shows the traffic follow, the history and the diff, then rolls back.
fn config_change(topo: &Topology, agent: &Agent, yaml: &str) -> Result<()> {
    let b1 = backend_v4(1);
    let edited = yaml.replacen(
        &format!("{{ address: \"{b1}\" }}"),
        &format!("{{ address: \"{b1}\", weight: 300 }}"),
        1,
    );
    println!(
        "Editing 10-demo.yaml: {} gets weight 300 in pool web (the others keep 100). No signal: \
         the agent watches its config directory.",
        backend_name(1)
    );
    let before = agent.status()?.generation;
    let written = Instant::now();
    agent.write_file("10-demo.yaml", &edited)?;
    wait_until(agent, |s| s.generation > before)?;
    println!(
        "Live {:.2} s after the write (a 200 ms quiet period, then one apply: validate, diff, \
         write the maps, record the version).",
        written.elapsed().as_secs_f64()
    );
    tally(topo, vip_v4(TCP_ECHO_PORT))?;
    show(agent, &["ctl", "versions"])?;
    show(agent, &["ctl", "diff", "1", "2"])?;
    println!("Rolling back to version 1 (the file is left as it is; `status` says so):");
    let before = agent.status()?.generation;
    show(agent, &["ctl", "rollback", "1"])?;
    wait_until(agent, |s| s.generation > before)?;
    tally(topo, vip_v4(TCP_ECHO_PORT))?;
    Ok(())
}

/// Prints how to look at the running system from another shell and waits for Enter.
fn pause_for_inspection(topo: &Topology, agent: &Agent) -> Result<()> {
    let bin = agent::binary()?.display().to_string();
    let ns = format!("nsenter --net={}", topo.lb().path().display());
    let dir = agent.dir().display();
    println!("\n== Paused: the system keeps running. From another shell, as root: ==");
    println!("  {ns} {bin} status --config-dir {dir}");
    println!("  {ns} {bin} ctl --config-dir {dir} versions");
    println!("  {ns} {bin} ctl --config-dir {dir} explain {GROUP}");
    println!("  {ns} {bin} ctl --config-dir {dir} decisions --json");
    println!("  {ns} {bin} maps --config-dir {dir}");
    println!(
        "  bpftool map dump pinned {}/SERVICES",
        agent.pin_dir().display()
    );
    println!("  vi {dir}/10-demo.yaml      # a change is live ~200 ms after you save");
    println!(
        "  ip netns exec {} curl -s 127.0.0.1:9900/metrics | head",
        topo.lb().name()
    );
    println!("(`ip netns exec` hides /sys/fs/bpf: run switchyard itself with nsenter, as above.)");
    println!("Press Enter to clean up (Ctrl-C also cleans up).");
    // Poll rather than block in read_line, so a Ctrl-C (a flag the checkpoint reads) ends the
    // pause at once.
    loop {
        checkpoint()?;
        let mut fd = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&raw mut fd, 1, 100) } > 0 {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading stdin")?;
            return Ok(());
        }
    }
}

fn print_network(topo: &Topology) {
    println!(
        "  client  {:<14} {CLIENT_V4}, {CLIENT_V6}",
        topo.client().name()
    );
    println!(
        "  lb      {:<14} the balancer: switchyard on {LB_CLIENT_IF} and on to-b1..to-b{ALL_BACKENDS}",
        topo.lb().name()
    );
    for i in 1..=ALL_BACKENDS {
        let pool = if DC1.contains(&i) {
            "pool dc1"
        } else if DC2.contains(&i) {
            "pool dc2"
        } else {
            "pools web, web6"
        };
        println!(
            "  {:<7} {:<14} {}, {} (return link {}, {}); {pool}",
            backend_name(i),
            topo.backend(i).name(),
            backend_v4(i),
            backend_v6(i),
            backend_return_v4(i),
            backend_return_v6(i)
        );
    }
    println!(
        "Virtual IPs {VIP_V4} and {VIP_V6}: the client routes them to the lb; every backend \
         holds them on its loopback (for direct server return)."
    );
    println!(
        "The lb keeps the kernel's defaults (no forwarding, no static neighbours). Backends \
         send direct-server-return replies over a return link to the client namespace (their \
         router) and, by a policy rule on their own address, NAT replies through the lb."
    );
    println!(
        "Every backend runs a TCP echo server on :{TCP_ECHO_PORT} (it first says its name), a \
         UDP server on :{UDP_NAME_PORT} (answers with its name) and GET /health on \
         :{HEALTH_PORT}."
    );
}

/// The demo's config file, `10-demo.yaml`.
pub(crate) fn config() -> String {
    let health = health_check();
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# /etc/switchyard/10-demo.yaml (here in a temporary folder)"
    );
    let _ = writeln!(y, "agent:");
    let _ = writeln!(
        y,
        "  pin_path: {}   # unique to this run",
        cleanup::pin_path().display()
    );
    y.push_str("\nservices:");
    for (name, vip, proto, forward, pool) in [
        ("web", VIP_V4.to_string(), "tcp", "dsr-l2", "web"),
        ("web6", VIP_V6.to_string(), "tcp", "dsr-l2", "web6"),
        ("dns", VIP_V4.to_string(), "udp", "nat", "web"),
    ] {
        let _ = write!(
            y,
            "\n  - name: {name}\n    vip: \"{vip}\"\n    port: 80\n    protocol: {proto}\n    \
             forward: {forward}\n    to: {{ pool: {pool} }}\n"
        );
    }
    y.push_str("\npools:");
    let v4: fn(usize) -> String = |i| backend_v4(i).to_string();
    let v6: fn(usize) -> String = |i| backend_v6(i).to_string();
    for (pool, addr) in [("web", v4), ("web6", v6)] {
        let _ = writeln!(y, "\n  - name: {pool}\n    backends:");
        for i in 1..=BACKENDS {
            let _ = writeln!(y, "      - {{ address: \"{}\" }}", addr(i));
        }
        y.push_str(&health);
    }
    y
}

/// The `health_check:` of a pool, indented for a pool of `pools:`.
fn health_check() -> String {
    format!(
        "    health_check:\n      http: {{ port: {HEALTH_PORT}, path: /health }}\n      \
         interval: {INTERVAL}\n      timeout: 200ms\n      unhealthy_threshold: \
         {UNHEALTHY_THRESHOLD}\n      healthy_threshold: 2\n"
    )
}

/// The story's fragment, `20-failover.yaml`: pools dc1 and dc2, the state the rules read and
/// the decision group.
pub(crate) fn failover_fragment() -> String {
    let mut y = String::from(
        "# 20-failover.yaml: two data centres and the rules that choose between them\npools:",
    );
    for (pool, members) in [("dc1", DC1), ("dc2", DC2)] {
        let _ = writeln!(y, "\n  - name: {pool}\n    backends:");
        for i in members {
            let _ = writeln!(y, "      - {{ address: \"{}\" }}", backend_v4(i));
        }
        y.push_str(&health_check());
    }
    let _ = write!(
        y,
        "\nstate:\n  dc1_api_healthy:   # dc1's API, as the rules see it\n    probe: {{ http: \
         \"http://{probe}:{HEALTH_PORT}/health\", interval: {PROBE_INTERVAL_MS}ms, timeout: \
         {PROBE_TIMEOUT_MS}ms, unhealthy_threshold: {PROBE_FAILURES}, healthy_threshold: 3 }}\n  \
         maintenance_mode: {{ push: {{ default: false }} }}   # `switchyard ctl state set`\n  \
         dc2_ready: {{ expr: \"pool.dc2.healthy_count >= 1\" }}\n\
         \ndecisions:\n  - name: {GROUP}\n    rules:\n      - id: dc1-primary\n        \
         priority: 100\n        when: dc1_api_healthy AND NOT maintenance_mode\n        \
         then: {{ pool: dc1 }}\n      - id: failover-dc2\n        priority: 90\n        \
         when: (NOT dc1_api_healthy OR maintenance_mode) AND dc2_ready\n        \
         then: {{ pool: dc2 }}\n    default: {{ pool: dc1 }}\n    switch: {{ stable_for: \
         {STABLE_FOR_MS}ms, cooldown: {COOLDOWN_S}s, failback_after: {FAILBACK_AFTER_S}s }}\n    \
         require: \"target.healthy_count >= 1\"   # never switch to a pool with no healthy \
         backend\n",
        probe = backend_v4(DC1[0]),
    );
    y
}

/// `10-demo.yaml` with service `web` following the decision group instead of pool `web`.
pub(crate) fn deciding(yaml: &str) -> String {
    yaml.replacen(
        "to: { pool: web }",
        &format!("to: {{ decide: {GROUP} }}"),
        1,
    )
}

/// Validates the config as an operator would, prints both, and starts the agent with it.
fn start_agent(topo: &Topology, yaml: &str) -> Result<Agent> {
    let bin = agent::binary()?;
    let dir = agent::temp_dir("demo")?;
    std::fs::write(dir.join("10-demo.yaml"), yaml)?;
    println!("{}", yaml.trim_end());
    println!("\n$ switchyard validate {}", dir.display());
    let out = Command::new(&bin)
        .arg("validate")
        .arg(&dir)
        .output()
        .context("running switchyard validate")?;
    print!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        bail!("the demo's config is invalid");
    }
    let ifaces = topo.lb_interfaces();
    let flags: Vec<String> = ifaces.iter().map(|i| format!("--iface {i}")).collect();
    println!(
        "\n$ switchyard attach {} --config-dir …   (in namespace {})",
        flags.join(" "),
        topo.lb().name()
    );
    let started = Instant::now();
    let agent = Agent::start(topo, &[("10-demo.yaml", yaml.to_owned())])?;
    println!(
        "The agent loaded and verified the XDP program, attached it, wrote the maps and \
         answers on its API ({:.1} s).",
        started.elapsed().as_secs_f64()
    );
    Ok(agent)
}

/// Polls the agent's status until `pred` holds, like [`Agent::wait_for`], but stops at once
/// when interrupted (the agent got the Ctrl-C too and no longer answers).
pub(crate) fn wait_until(agent: &Agent, pred: impl Fn(&Status) -> bool) -> Result<()> {
    let start = Instant::now();
    loop {
        checkpoint()?;
        if let Ok(s) = agent.status()
            && pred(&s)
        {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(15) {
            bail!(
                "the agent did not get there in 15 s; its log:\n{}",
                agent.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status(agent: &Agent) -> Result<String> {
    agent.cli(&["status", "--config-dir", &agent.dir().display().to_string()])
}

/// Opens `n` connections from the client, one after another, and prints who answered each.
fn connections(ns: &Netns, addr: SocketAddr, n: usize) -> Result<()> {
    let served = ns.run(|| -> Result<Vec<(u16, String)>> {
        (0..n)
            .map(|_| {
                let session = TcpSession::connect(addr)?;
                let port = session.local_addr()?.port();
                let backend = session.backend().to_owned();
                session.finish()?;
                Ok((port, backend))
            })
            .collect()
    })??;
    let client = if addr.is_ipv4() {
        CLIENT_V4.to_string()
    } else {
        format!("[{CLIENT_V6}]")
    };
    for (k, (port, backend)) in served.iter().enumerate() {
        println!(
            "  connection {:>2}: {client}:{port} → {addr}  served by {backend}",
            k + 1
        );
    }
    Ok(())
}

/// Opens [`TALLY`] connections and draws how many each backend served.
fn tally(topo: &Topology, addr: SocketAddr) -> Result<()> {
    let started = Instant::now();
    let t = client::tcp_tally(topo.client(), addr, TALLY)?;
    println!(
        "{TALLY} new connections to {addr}, one after another ({} ms), served by:",
        started.elapsed().as_millis()
    );
    draw(&t, BACKENDS);
    Ok(())
}

fn draw(t: &Tally, backends: usize) {
    let max = t.values().copied().max().unwrap_or(1).max(1);
    for i in 1..=backends {
        let name = backend_name(i);
        let n = t.get(&name).copied().unwrap_or(0);
        println!("  {name:<3} {:<40} {n}", "█".repeat(n * 40 / max));
    }
}

fn udp_queries(ns: &Netns, addr: SocketAddr, n: usize) -> Result<()> {
    let answers =
        ns.run(|| -> Result<Vec<String>> { (0..n).map(|_| client::udp_query(addr)).collect() })??;
    println!(
        "  {n} UDP queries to {addr}, answered by: {}",
        answers.join(" ")
    );
    Ok(())
}

/// Prints the metric families a newcomer cares about first.
fn print_metrics(text: &str) {
    const SHOWN: [&str; 4] = [
        "switchyard_backend_healthy",
        "switchyard_backend_packets_total{pool=\"web\"",
        "switchyard_service_packets_total",
        "switchyard_config_generation",
    ];
    let mut lines = 0;
    for line in text.lines() {
        if SHOWN.iter().any(|p| line.starts_with(p)) && lines < 16 {
            println!("  {line}");
            lines += 1;
        }
    }
    let total = text.lines().filter(|l| !l.starts_with('#')).count();
    println!("  … {total} samples in all");
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_config_is_valid() {
        let dir = std::env::temp_dir().join(format!("xtask-demo-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("10-demo.yaml"), super::config()).unwrap();
        let loaded = switchyard::config::load_dir(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = loaded.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((cfg.services.len(), cfg.pools.len()), (3, 2));
    }

    #[test]
    fn the_story_s_config_is_valid_and_web_follows_the_group() {
        let dir = std::env::temp_dir().join(format!("xtask-demo-story-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("10-demo.yaml"), super::deciding(&super::config())).unwrap();
        std::fs::write(dir.join("20-failover.yaml"), super::failover_fragment()).unwrap();
        let loaded = switchyard::config::load_dir(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = loaded.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (cfg.services.len(), cfg.pools.len(), cfg.decisions.len()),
            (3, 4, 1)
        );
        let web = cfg.services.iter().find(|s| s.name == "web").unwrap();
        assert!(format!("{:?}", web.to).contains(super::GROUP), "{web:?}");
    }
}
