//! The whole system in network namespaces — hitless operation under load: a client
//! keeps 200 TCP connections open and exchanging data, and opens new connections continuously,
//! while
//!
//! - (a) 50 configuration versions are applied (backends added and removed, weights changed,
//!   the pool renamed twice), each written atomically into the config directory and live —
//!   `status` shows it — before the next;
//! - (b) the agent is killed with SIGKILL, the pool changes while it is away (a backend added or
//!   removed), it is started again on the same config directory, and 20 more versions follow
//!   (a restarted agent allocates slots again: it must not hand a tracked flow's slot to another
//!   backend, nor forget a slot whose flows still run);
//! - (c) the program is upgraded in place (`switchyard upgrade --iface IF` on every interface).
//!
//! It must show: no failed exchange on a connection whose backend stayed in the config, no new
//! connection refused, and no packet of the service passed to the kernel by accident — neither
//! by the program's own counters nor by an nftables counter in the lb namespace that sees every
//! packet for the VIP the program let through to the stack (the program counts a VIP packet it
//! found no service for under `no_service`, with every backend's DSR reply, so only that second
//! counter can tell them apart). At the end, the backend slots the program can forward to are
//! exactly the running config's backends.
//!
//! Six backends: b1–b3 are always in the pool, b4–b6 come and go. The persistent connections
//! are opened first, so they reach b1–b3; a connection that reached a backend while it was in
//! the pool and broke while that backend was being removed is excused (the load records which
//! backend each connection reached, from the echo server's name line). Every failure is printed
//! with the change it followed; one `HITLESS` line sums the run.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use router_common::{BACKEND_DOWN, FAMILY_V4, MAX_BACKENDS, MAX_SERVICES, Reason, Verdict};
use router_tests::{
    addrs::{LB_CLIENT_IF, VIP_V4, backend_name, backend_v4, lb_backend_if, vip_v4},
    agent::{self, Agent, unique_pin_path},
    load::{Failure, FailureKind, Load, LoadReport, LoadSpec},
    netns::{Netns, Topology},
    privileged, servers,
};
use switchyard::api::status::Status;
use switchyard::dataplane::{counters, maps::KernelMaps};

/// Backends in the topology.
const BACKENDS: usize = 6;
/// Backends in every version of the pool.
const CORE: [usize; 3] = [1, 2, 3];
/// Backends added and removed during the run, in this order.
const EXTRAS: [usize; 3] = [4, 5, 6];
/// Config versions applied in step (a).
const VERSIONS: usize = 50;
/// The version written while the agent is dead in step (b) (a backend added or removed).
const WHILE_DEAD: usize = VERSIONS + 1;
/// Versions applied after the restart in step (b): the restarted agent allocates slots again,
/// and must not hand a tracked flow's slot to another backend.
const AFTER_RESTART: usize = 20;
/// Pool names, one per rename.
const POOL_NAMES: [&str; 4] = ["alpha", "bravo", "charlie", "delta"];
/// Versions (1-based) at which the pool is renamed.
const RENAMES: [usize; 3] = [17, 34, 60];
/// Persistent connections.
const PERSISTENT: usize = 200;
/// How long each version serves traffic once it is live.
const DWELL: Duration = Duration::from_millis(300);
/// Steady traffic after each step, so that a failure the step caused is seen in its phase.
const SETTLE: Duration = Duration::from_millis(1500);
/// How long the agent stays dead in step (b).
const DEAD_TIME: Duration = Duration::from_secs(1);
/// How long a version may take to be live (write, SIGHUP or the directory watch, apply,
/// `status`).
const LIVE_LIMIT: Duration = Duration::from_secs(10);
/// The fragment that changes.
const FRAGMENT: &str = "10-web.yaml";
/// The nftables table that counts VIP packets reaching the lb's stack.
const NFT_TABLE: &str = "sy_hitless";

/// Phases of the run, for the load's per-phase counts.
const PHASES: [&str; 6] = [
    "warmup",
    "(a) 50 versions",
    "(b) kill, change, restart",
    "(b) 20 versions after the restart",
    "(c) upgrade",
    "cooldown",
];
const WARMUP: usize = 0;
const CONFIGS: usize = 1;
const RESTART: usize = 2;
const AFTER: usize = 3;
const UPGRADE: usize = 4;
const COOLDOWN: usize = 5;

/// One version of the config: the pool's name and its backends (index, weight), in order.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version {
    pool: &'static str,
    backends: Vec<(usize, u32)>,
}

impl Version {
    fn first() -> Self {
        Self {
            pool: POOL_NAMES[0],
            backends: CORE.iter().map(|&i| (i, 100)).collect(),
        }
    }

    fn has(&self, i: usize) -> bool {
        self.backends.iter().any(|(b, _)| *b == i)
    }

    fn set_weight(&mut self, i: usize, w: u32) {
        for (b, weight) in &mut self.backends {
            if *b == i {
                *weight = w;
            }
        }
    }

    /// The next of [`EXTRAS`] after `cursor` (in rotation) that is not in the pool, added with
    /// `weight`; `cursor` moves past it.
    fn add_extra(&mut self, cursor: &mut usize, weight: u32) -> Option<usize> {
        let i = (0..EXTRAS.len())
            .map(|k| EXTRAS[(*cursor + k) % EXTRAS.len()])
            .find(|&i| !self.has(i))?;
        *cursor = EXTRAS.iter().position(|&e| e == i).unwrap_or(0) + 1;
        self.backends.push((i, weight));
        Some(i)
    }

    /// Removes the extra that has been in the pool longest.
    fn remove_extra(&mut self) -> Option<usize> {
        let at = self.backends.iter().position(|(b, _)| EXTRAS.contains(b))?;
        Some(self.backends.remove(at).0)
    }

    /// The service and pool fragment.
    fn text(&self) -> String {
        let mut out = format!(
            "services:\n  - {{ name: web, vip: \"{VIP_V4}\", port: 80, protocol: tcp, \
             forward: dsr-l2, to: {{ pool: {} }} }}\npools:\n  - name: {}\n    backends:\n",
            self.pool, self.pool
        );
        for (i, w) in &self.backends {
            let _ = writeln!(
                out,
                "      - {{ address: \"{}\", weight: {w} }}",
                backend_v4(*i)
            );
        }
        out
    }

    /// Whether `status` shows exactly this version.
    fn is_live(&self, s: &Status) -> bool {
        let [pool] = s.pools.as_slice() else {
            return false;
        };
        let want: Vec<(String, u32)> = self
            .backends
            .iter()
            .map(|(i, w)| (backend_v4(*i).to_string(), *w))
            .collect();
        let have: Vec<(String, u32)> = pool
            .backends
            .iter()
            .map(|b| (b.address.clone(), b.weight))
            .collect();
        pool.name == self.pool
            && have == want
            && s.services
                .iter()
                .any(|svc| svc.name == "web" && svc.to == format!("pool {}", self.pool))
    }
}

/// What a version changed, for the log and for the check that every kind of change is covered.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    Add(usize),
    Remove(usize),
    Weight(usize, u32),
    Rename(&'static str, &'static str),
}

/// Versions `1..=count`, each with its change. Deterministic: adds (in rotation over
/// [`EXTRAS`], every fourth version), removes (only of backends added earlier in the run, every
/// eighth), weight changes (drains to 0 included, never all of the always-present backends at
/// once), renames at [`RENAMES`]; [`WHILE_DEAD`] adds a backend, or removes one when all are in.
#[expect(
    clippy::cast_possible_truncation,
    reason = "a version's number, at most the run's 50, in a weight"
)]
fn versions(count: usize) -> Vec<(Version, Change)> {
    const WEIGHTS: [u32; 6] = [0, 40, 100, 160, 250, 70];
    let mut v = Version::first();
    let mut out = Vec::with_capacity(count);
    let mut renamed = 0;
    let mut cursor = 0;
    for n in 1..=count {
        let extra = v.backends.iter().find(|(b, _)| EXTRAS.contains(b)).copied();
        let mut change = None;
        if RENAMES.contains(&n) {
            let from = v.pool;
            renamed += 1;
            v.pool = POOL_NAMES[renamed % POOL_NAMES.len()];
            change = Some(Change::Rename(from, v.pool));
        } else if n == WHILE_DEAD {
            change = v
                .add_extra(&mut cursor, 80)
                .map(Change::Add)
                .or_else(|| v.remove_extra().map(Change::Remove));
        } else if n % 4 == 1 {
            change = v
                .add_extra(&mut cursor, 50 + (n as u32 * 13) % 100)
                .map(Change::Add);
        } else if n % 8 == 3 {
            change = v.remove_extra().map(Change::Remove);
        } else if n % 4 == 2
            && let Some((i, old)) = extra
        {
            // An extra's weight, when one is there.
            let mut w = WEIGHTS[(n / 4 + 1) % WEIGHTS.len()].max(1);
            if w == old {
                w += 5;
            }
            v.set_weight(i, w);
            change = Some(Change::Weight(i, w));
        }
        let change = change.unwrap_or_else(|| {
            // A weight of an always-present backend; 0 only while the others carry weight.
            let i = CORE[n % CORE.len()];
            let mut w = WEIGHTS[n % WEIGHTS.len()];
            let others_up = v
                .backends
                .iter()
                .any(|(b, weight)| CORE.contains(b) && *b != i && *weight > 0);
            if w == 0 && !others_up {
                w = 100;
            }
            if v.backends.iter().any(|(b, weight)| *b == i && *weight == w) {
                w += 5;
            }
            v.set_weight(i, w);
            Change::Weight(i, w)
        });
        out.push((v.clone(), change));
    }
    out
}

/// Writes `text` as `dir/name` the way a careful operator (or a config-management tool) does:
/// a hidden temporary file in the same directory, then rename(2), so the agent never reads a
/// half-written fragment.
fn write_atomically(dir: &Path, name: &str, text: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, text)?;
    fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

/// Writes `v`; the agent's directory watch applies it (no signal).
fn apply(agent: &Agent, v: &Version) -> Result<()> {
    write_version(agent, v)
}

/// Writes `v` into the agent's config directory, with the agent's own state directory.
fn write_version(agent: &Agent, v: &Version) -> Result<()> {
    let text = router_tests::agent::with_state_dir(&v.text(), &agent.state_dir());
    write_atomically(agent.dir(), FRAGMENT, &text)
}

/// Waits until `status` shows `v` with a generation above `above`.
fn wait_live(agent: &Agent, v: &Version, above: u64) -> Result<Duration> {
    agent
        .wait_for(LIVE_LIMIT, |s| s.generation > above && v.is_live(s))
        .with_context(|| format!("version {v:?} not live"))
}

/// Applies `plan` (versions `first + 1…`) one after another, each live before the next and
/// serving for [`DWELL`]; records removals and, in `events`, when each version was written.
/// Returns how long each took from the write until `status` showed it.
fn apply_all(
    agent: &Agent,
    plan: &[(Version, Change)],
    first: usize,
    removals: &mut Vec<Removal>,
    events: &mut Vec<(Instant, String)>,
) -> Result<Vec<Duration>> {
    let mut took = Vec::with_capacity(plan.len());
    for (k, (v, change)) in plan.iter().enumerate() {
        let n = first + k + 1;
        let generation = agent.status()?.generation;
        let from = Instant::now();
        events.push((from, format!("v{n} {change:?}")));
        apply(agent, v)?;
        took.push(wait_live(agent, v, generation).with_context(|| format!("version {n}"))?);
        if let Change::Remove(i) = change {
            removals.push(Removal {
                backend: backend_name(*i),
                from,
                to: Instant::now(),
            });
        }
        std::thread::sleep(DWELL);
    }
    Ok(took)
}

/// When a backend was being removed: from the write to the moment `status` showed the version
/// without it.
#[derive(Debug)]
struct Removal {
    backend: String,
    from: Instant,
    to: Instant,
}

/// Whether `f` happened on a connection to a backend that was removed during its life: it had
/// reached that backend before the removal was live, and broke after the removal began.
fn excused(f: &Failure, removals: &[Removal]) -> bool {
    let Some(backend) = f.backend.as_deref() else {
        return false;
    };
    removals
        .iter()
        .any(|r| r.backend == backend && f.opened <= r.to && f.at >= r.from)
}

/// The lb's interfaces: the client side, then each backend side.
fn lb_interfaces() -> Vec<String> {
    let mut all = vec![LB_CLIENT_IF.to_owned()];
    all.extend((1..=BACKENDS).map(lb_backend_if));
    all
}

/// Step (c): `switchyard upgrade --iface IF --config-dir DIR` in the lb namespace for every
/// interface of `ifaces`, one at a time, then checks each interface runs a new program (another
/// kernel id). Fails with "upgrade not available" when the binary has no `upgrade` subcommand
/// (clap's usage error, exit code 2).
fn upgrade_in_place(lb: &Netns, agent: &Agent, ifaces: &[String]) -> Result<()> {
    let bin = agent::binary()?;
    for iface in ifaces {
        let before = lb.xdp_program_id(iface)?;
        let out = Command::new("nsenter")
            .arg(format!("--net={}", lb.path().display()))
            .arg(&bin)
            .args(["upgrade", "--iface", iface, "--config-dir"])
            .arg(agent.dir())
            .stdin(Stdio::null())
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(2) {
            bail!(
                "upgrade not available: `switchyard upgrade --iface {iface}` is a usage error \
                 (exit 2):\n{}",
                stderr.trim_end()
            );
        }
        ensure!(
            out.status.success(),
            "switchyard upgrade --iface {iface}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            stderr
        );
        let after = lb.xdp_program_id(iface)?;
        println!("upgrade {iface}: program {before:?} → {after:?}");
        ensure!(
            after.is_some() && after != before,
            "{iface}: the program is still {before:?} after the upgrade (now {after:?})"
        );
    }
    Ok(())
}

/// Installs a table in the lb namespace that counts every IPv4 packet for the VIP entering the
/// kernel stack (prerouting, before conntrack). A packet the program forwards (redirect) never
/// gets there; one it passes does.
fn install_vip_counter(lb: &Netns) -> Result<()> {
    let ruleset = format!(
        "table ip {NFT_TABLE} {{\n\tcounter vip_passed {{ }}\n\tchain pre {{\n\t\ttype filter \
         hook prerouting priority raw; policy accept;\n\t\tip daddr {VIP_V4} counter name \
         \"vip_passed\"\n\t}}\n}}\n"
    );
    lb.exec_with_stdin(&["nft", "-f", "-"], Some(&ruleset))
        .context("installing the VIP counter")?;
    Ok(())
}

/// Packets counted by [`install_vip_counter`]'s counter.
fn vip_passed(lb: &Netns) -> Result<u64> {
    let text = lb.exec(&[
        "nft",
        "-j",
        "list",
        "counter",
        "ip",
        NFT_TABLE,
        "vip_passed",
    ])?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    json["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|o| o["counter"]["packets"].as_u64())
        .with_context(|| format!("no counter in {text}"))
}

/// The program's counters that matter here, summed over CPUs.
#[derive(Clone, Debug, Default)]
struct Counters {
    /// Packets by reason, in `Reason::ALL` order.
    reasons: Vec<u64>,
    /// Packets of any service passed to the stack (`SVC_STATS`, verdict pass).
    service_passed: u64,
}

impl Counters {
    fn read(pin_dir: &Path) -> Result<Self> {
        let maps = KernelMaps::open_pinned(pin_dir)?;
        // Every service slot: a restarted agent may number them differently.
        let snap = counters::snapshot(&maps, 0..MAX_SERVICES, std::iter::empty());
        Ok(Self {
            reasons: snap.reasons.iter().map(|(_, t)| t.packets).collect(),
            service_passed: snap
                .services
                .iter()
                .filter(|(_, v, _)| *v == Verdict::Pass)
                .map(|(_, _, t)| t.packets)
                .sum(),
        })
    }

    fn reason(&self, r: Reason) -> u64 {
        self.reasons.get(r as usize).copied().unwrap_or(0)
    }

    /// `self - earlier`, counter by counter.
    fn since(&self, earlier: &Self) -> Self {
        Self {
            reasons: Reason::ALL
                .iter()
                .map(|r| self.reason(*r).saturating_sub(earlier.reason(*r)))
                .collect(),
            service_passed: self.service_passed.saturating_sub(earlier.service_passed),
        }
    }

    fn nonzero(&self) -> String {
        Reason::ALL
            .iter()
            .filter(|r| self.reason(**r) > 0)
            .map(|r| format!("{}={}", r.name(), self.reason(*r)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The backend slots the program can still forward a tracked flow to (state not down), as
/// `slot address` — after the run, exactly one per backend of the running config: a slot more
/// is one the agent no longer knows, whose tracked flows it can neither move nor stop.
fn live_slots(pin_dir: &Path) -> Result<Vec<(u32, String)>> {
    let maps = KernelMaps::open_pinned(pin_dir)?;
    let mut out = Vec::new();
    for slot in 0..MAX_BACKENDS {
        let b = maps
            .backend(slot)
            .with_context(|| format!("BACKENDS slot {slot}"))?;
        if b.state == BACKEND_DOWN {
            continue;
        }
        let address = if b.family == u32::from(FAMILY_V4) {
            let [a, b2, c, d, ..] = b.addr;
            std::net::Ipv4Addr::new(a, b2, c, d).to_string()
        } else {
            std::net::Ipv6Addr::from(b.addr).to_string()
        };
        out.push((slot, address));
    }
    Ok(out)
}

fn describe(f: &Failure, t0: Instant) -> String {
    format!(
        "[{}] {:?} on {} at {:.2}s (opened {:.2}s): {}",
        PHASES.get(f.phase).unwrap_or(&"?"),
        f.kind,
        f.backend.as_deref().unwrap_or("-"),
        f.at.duration_since(t0).as_secs_f64(),
        f.opened.duration_since(t0).as_secs_f64(),
        f.error
    )
}

/// Lists up to 10 of `failures`, then how many more.
fn list(failures: &[&Failure], t0: Instant) -> String {
    let mut out: Vec<String> = failures.iter().take(10).map(|f| describe(f, t0)).collect();
    if failures.len() > 10 {
        out.push(format!("… and {} more", failures.len() - 10));
    }
    out.join("\n  ")
}

#[test]
fn the_plan_changes_every_version_and_always_keeps_the_first_backends() {
    let plan = versions(WHILE_DEAD + AFTER_RESTART);
    let mut previous = Version::first();
    for (n, (v, change)) in plan.iter().enumerate() {
        assert_ne!(
            *v,
            previous,
            "version {} changes nothing ({change:?})",
            n + 1
        );
        for i in CORE {
            assert!(v.has(i), "version {} lacks b{i}", n + 1);
        }
        assert!(
            v.backends.iter().any(|(b, w)| CORE.contains(b) && *w > 0),
            "version {}: every always-present backend drains",
            n + 1
        );
        previous = v.clone();
    }
    let step_a: Vec<&Change> = plan[..VERSIONS].iter().map(|(_, c)| c).collect();
    println!("{step_a:?}");
    for i in EXTRAS {
        assert!(step_a.contains(&&Change::Add(i)), "b{i} is never added");
        assert!(
            step_a.contains(&&Change::Remove(i)),
            "b{i} is never removed"
        );
    }
    assert!(step_a.iter().any(|c| matches!(c, Change::Weight(_, 0))));
    assert!(step_a.iter().any(|c| matches!(c, Change::Rename(..))));
    assert!(matches!(
        plan[WHILE_DEAD - 1].1,
        Change::Add(_) | Change::Remove(_)
    ));
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario under one load: the versions, the kill, the upgrade, then the checks"
)]
fn connections_survive_50_config_versions_an_agent_kill_and_a_program_upgrade_under_load()
-> Result<()> {
    if privileged::require("connections_survive_50_config_versions", &["nft"]).is_err() {
        return Ok(());
    }
    let t0 = Instant::now();
    let topo = Topology::builder().backends(BACKENDS).build()?;
    let _servers = servers::start_all(&topo)?;

    // The detector first: with no program on the lb, a connection attempt to the VIP enters
    // the lb's stack (and goes nowhere), so the counter must move.
    install_vip_counter(topo.lb())?;
    let _ = topo
        .client()
        .run(|| std::net::TcpStream::connect_timeout(&vip_v4(80), Duration::from_millis(300)))?;
    let seen = vip_passed(topo.lb())?;
    ensure!(seen > 0, "the VIP counter saw nothing without the program");

    let pin = unique_pin_path();
    let plan = versions(WHILE_DEAD + AFTER_RESTART);
    let mut agent = Agent::start(
        &topo,
        &[
            ("00-agent.yaml", format!("agent:\n  pin_path: {pin}\n")),
            (FRAGMENT, Version::first().text()),
        ],
    )?;
    wait_live(&agent, &Version::first(), 0)?;
    let vip_before = vip_passed(topo.lb())?;
    let counters_before = Counters::read(&agent.pin_dir())?;

    let load = Load::start(
        topo.client(),
        LoadSpec {
            addr: vip_v4(80),
            persistent: PERSISTENT,
            period: Duration::from_millis(50),
            payload: 128,
            new_pause: Duration::from_millis(10),
            connect_timeout: Duration::from_secs(3),
        },
        Duration::from_secs(15),
    )?;
    load.set_phase(WARMUP);
    let started = Instant::now();
    std::thread::sleep(SETTLE);
    let mut problems = Vec::new();
    let mut removals = Vec::new();
    let mut events = Vec::new();

    // (a) 50 versions, each live before the next.
    load.set_phase(CONFIGS);
    let phase_a = Instant::now();
    let mut live_times = apply_all(&agent, &plan[..VERSIONS], 0, &mut removals, &mut events)?;
    std::thread::sleep(SETTLE);
    let phase_a = phase_a.elapsed();
    live_times.sort();
    println!(
        "(a) {VERSIONS} versions in {phase_a:.1?}: write → live median {:?}, max {:?}",
        live_times[live_times.len() / 2],
        live_times.last().copied().unwrap_or_default(),
    );

    // (b) SIGKILL; the pool changes while the agent is away; start it again; more versions.
    load.set_phase(RESTART);
    let (while_dead, change) = &plan[WHILE_DEAD - 1];
    let killed = agent.kill()?;
    let dead = Instant::now();
    events.push((
        dead,
        format!("SIGKILL, then v{WHILE_DEAD} {change:?} while dead"),
    ));
    write_version(&agent, while_dead)?;
    std::thread::sleep(DEAD_TIME);
    let restarted = agent
        .relaunch()
        .and_then(|()| wait_live(&agent, while_dead, 0));
    if let Change::Remove(i) = change {
        removals.push(Removal {
            backend: backend_name(*i),
            from: dead,
            to: Instant::now(),
        });
    }
    match restarted {
        Ok(_) => {
            println!(
                "(b) agent killed ({killed:?}); v{WHILE_DEAD} {change:?} written while dead; \
                 the new agent serves it {:.1?} after the kill",
                dead.elapsed()
            );
            std::thread::sleep(SETTLE);
            load.set_phase(AFTER);
            if let Err(e) = apply_all(
                &agent,
                &plan[WHILE_DEAD..],
                WHILE_DEAD,
                &mut removals,
                &mut events,
            ) {
                problems.push(format!("(b) versions after the restart: {e:#}"));
            }
        }
        Err(e) => problems.push(format!("(b) restart: {e:#}")),
    }
    std::thread::sleep(SETTLE);

    // (c) upgrade in place, every interface.
    load.set_phase(UPGRADE);
    let upgrading = Instant::now();
    events.push((upgrading, "upgrade".to_owned()));
    match upgrade_in_place(topo.lb(), &agent, &lb_interfaces()) {
        Ok(()) => println!("(c) upgraded in {:.1?}", upgrading.elapsed()),
        Err(e) => problems.push(format!("(c) {e:#}")),
    }
    std::thread::sleep(SETTLE);

    load.set_phase(COOLDOWN);
    std::thread::sleep(SETTLE);
    let open_at_end = load.open();
    let report: LoadReport = load.stop();
    let load_time = started.elapsed();

    let vip_leaked = vip_passed(topo.lb())?.saturating_sub(vip_before);
    let counters = Counters::read(&agent.pin_dir()).map_or_else(
        |e| {
            problems.push(format!("reading the program's counters: {e:#}"));
            Counters::default()
        },
        |c| c.since(&counters_before),
    );

    // The slots the data plane can still forward to, against the running config.
    let status = agent.status()?;
    let mut configured: Vec<String> = status
        .pools
        .iter()
        .flat_map(|p| p.backends.iter().map(|b| b.address.clone()))
        .collect();
    configured.sort();
    let slots = live_slots(&agent.pin_dir()).context("reading the backend slots")?;
    let mut forwarding: Vec<String> = slots.iter().map(|(_, a)| a.clone()).collect();
    forwarding.sort();
    println!("backend slots up at the end: {slots:?}; configured: {configured:?}");
    if forwarding != configured {
        problems.push(format!(
            "the data plane forwards tracked flows through {} backend slots, the running config \
             has {} backends: slots {slots:?}, config {configured:?}",
            forwarding.len(),
            configured.len()
        ));
    }

    // The report.
    let total = report.total();
    let persistent: Vec<&Failure> = report.failures_of(FailureKind::Persistent).collect();
    let short: Vec<&Failure> = report.failures_of(FailureKind::Short).collect();
    let refused: Vec<&Failure> = report.failures_of(FailureKind::Refused).collect();
    let (p_excused, p_bad): (Vec<&Failure>, Vec<&Failure>) =
        persistent.iter().partition(|f| excused(f, &removals));
    let (s_excused, s_bad): (Vec<&Failure>, Vec<&Failure>) =
        short.iter().partition(|f| excused(f, &removals));
    for (k, name) in PHASES.iter().enumerate() {
        let c = report.phases[k];
        let failed = report.failures.iter().filter(|f| f.phase == k).count();
        println!(
            "phase {name}: {} exchanges, {} short connections, slowest exchange {} ms, \
             {failed} failures",
            c.exchanges,
            c.short_ok,
            c.max_exchange_us / 1000
        );
        if c.exchanges == 0 || c.short_ok == 0 {
            problems.push(format!("no traffic flowed in phase {name}: {c:?}"));
        }
    }
    // Which change each failure followed: the last event written before it was seen.
    let mut by_event: std::collections::BTreeMap<usize, std::collections::BTreeMap<String, usize>> =
        std::collections::BTreeMap::new();
    for f in &report.failures {
        let k = events
            .iter()
            .rposition(|(t, _)| *t <= f.at)
            .unwrap_or(usize::MAX);
        let what = format!(
            "{:?}{}{}",
            f.kind,
            f.backend
                .as_deref()
                .map(|b| format!(" on {b}"))
                .unwrap_or_default(),
            if excused(f, &removals) {
                " (excused)"
            } else {
                ""
            }
        );
        *by_event.entry(k).or_default().entry(what).or_default() += 1;
    }
    for (k, counts) in &by_event {
        let event = events
            .get(*k)
            .map_or("(before any change)", |(_, e)| e.as_str());
        println!("failures after {event}: {counts:?}");
    }
    println!(
        "persistent connections by backend: {:?}; short connections by backend: {:?}",
        report.persistent_backends, report.short_backends
    );
    println!("program counters during the load: {}", counters.nonzero());
    println!(
        "HITLESS connections={PERSISTENT} exchanges={} failed_exchanges={} (excused {}: backend \
         removed) new_connections={} new_failed={} (excused {}) refused={} vip_passed={} \
         service_passed={} versions={VERSIONS}+1+{AFTER_RESTART} load={:.1}s total={:.1}s",
        total.exchanges,
        p_bad.len(),
        p_excused.len(),
        total.short_ok + short.len() as u64,
        s_bad.len(),
        s_excused.len(),
        refused.len(),
        vip_leaked,
        counters.service_passed,
        load_time.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );

    // The verdict: everything that went wrong, at once.
    if !p_bad.is_empty() {
        problems.push(format!(
            "{} failed exchanges on connections whose backend stayed in the pool:\n  {}",
            p_bad.len(),
            list(&p_bad, t0)
        ));
    }
    if !s_bad.is_empty() {
        problems.push(format!(
            "{} new connections broke after connecting to a backend that stayed:\n  {}",
            s_bad.len(),
            list(&s_bad, t0)
        ));
    }
    if !refused.is_empty() {
        problems.push(format!(
            "{} new connections refused or timed out:\n  {}",
            refused.len(),
            list(&refused, t0)
        ));
    }
    if open_at_end != PERSISTENT {
        problems.push(format!(
            "{open_at_end} of {PERSISTENT} persistent connections open at the end"
        ));
    }
    if vip_leaked > 0 {
        problems.push(format!(
            "{vip_leaked} packets for the VIP were passed to the lb's kernel stack"
        ));
    }
    if counters.service_passed > 0 {
        problems.push(format!(
            "the program passed {} packets of a service to the stack (SVC_STATS)",
            counters.service_passed
        ));
    }
    // A matched VIP with no usable pool or backend: passed (all_down_pass) or dropped because a
    // slot was missing or empty (bad_state, no_backend) — a half-built state either way.
    for r in [Reason::AllDownPass, Reason::BadState, Reason::NoBackend] {
        if counters.reason(r) > 0 {
            problems.push(format!(
                "{} packets counted as {}",
                counters.reason(r),
                r.name()
            ));
        }
    }
    // The versions took effect in the data plane: each backend that came and went got new
    // connections while it was in.
    for i in EXTRAS {
        let name = backend_name(i);
        if report.short_backends.get(&name).copied().unwrap_or(0) == 0 {
            problems.push(format!("{name} never got a new connection"));
        }
    }
    drop(agent);
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("{}", problems.join("\n"))
    }
}
