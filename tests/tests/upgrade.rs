//! Replacing the running program and moving between map layouts, in network namespaces with
//! the real binary: `switchyard upgrade` under traffic (with the agent running and stopped)
//! drops no exchange and keeps link and maps; pinned maps of another layout are refused by
//! `attach` and `upgrade` alike with the upgrade path, leaving the running program alone; a pin
//! path that is not on bpffs is a clear error; `detach --keep-maps` keeps the maps for the next
//! agent, and `detach` removes them.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use router_common::{ABI_VERSION, Config, maps};
use router_tests::{
    addrs::{LB_CLIENT_IF, VIP_V4, backend_name, backend_v4, lb_backend_if, vip_v4},
    agent::{Agent, pins_under, temp_dir},
    client::{self, Tally, TcpSession},
    config_text::{ConfigText, backends_v4},
    netns::{Netns, Topology},
    privileged, servers,
};
use switchyard::dataplane::{Dataplane as _, attach, maps::KernelMaps};

/// How long a start that must fail may take (the program load dominates).
const EXIT_LIMIT: Duration = Duration::from_secs(20);

/// Connections kept open and exchanging data through the upgrades.
const LONG_LIVED: usize = 40;

/// TCP on the IPv4 VIP over backends `1..=n`, equal weights, with `pin_path`.
fn web(n: usize, pin_path: Option<&str>) -> String {
    let text = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&vec![100; n]), None)
        .text();
    match pin_path {
        // Keep the agent's pin path when the config changes.
        Some(p) => text
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("pin_path:") {
                    format!("  pin_path: {p}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect(),
        None => text,
    }
}

/// `agent.pin_path` of the config text `cfg`.
fn pin_path_of(cfg: &str) -> Result<PathBuf> {
    cfg.lines()
        .find_map(|l| l.trim().strip_prefix("pin_path: "))
        .map(PathBuf::from)
        .context("no pin path")
}

/// The lb's interfaces in `topo`: the client side, then each backend side.
fn lb_interfaces(topo: &Topology) -> Vec<String> {
    let mut all = vec![LB_CLIENT_IF.to_owned()];
    all.extend((1..=topo.backend_count()).map(lb_backend_if));
    all
}

/// `--iface A --iface B …` then `--config-dir DIR`, after `cmd`.
fn args<'a>(cmd: &'a str, ifaces: &'a [String], dir: &'a str) -> Vec<&'a str> {
    let mut out = vec![cmd];
    for i in ifaces {
        out.extend(["--iface", i.as_str()]);
    }
    out.extend(["--config-dir", dir]);
    out
}

/// (link id, program id) of each interface's pinned link.
fn link_ids(agent: &Agent, ifaces: &[String]) -> Result<Vec<(u32, u32)>> {
    ifaces
        .iter()
        .map(|i| {
            attach::pinned_link_ids(&agent.pin_dir(), i)
                .with_context(|| format!("{i}: no pinned link"))
        })
        .collect()
}

/// Checks every interface runs program `id` according to `ip -d link` in the lb namespace.
fn runs_program(topo: &Topology, ifaces: &[String], id: u32) -> Result<()> {
    for iface in ifaces {
        let prog = topo.lb().xdp_program(iface)?;
        ensure!(
            prog.as_deref() == Some(format!("id {id} name switchyard").as_str()),
            "{iface} runs {prog:?}, not program {id}"
        );
    }
    Ok(())
}

/// Runs `switchyard upgrade` on every lb interface and checks what changed: each link kept its
/// id and pin, and now runs one new program (the one the command printed). Returns its id.
fn upgrade(agent: &Agent, topo: &Topology, what: &str) -> Result<u32> {
    let ifaces = lb_interfaces(topo);
    let dir = agent.dir().display().to_string();
    let before = link_ids(agent, &ifaces)?;
    let started = Instant::now();
    let out = agent.cli(&args("upgrade", &ifaces, &dir))?;
    let took = started.elapsed();
    print!("upgrade ({what}, {took:?}):\n{out}");
    let after = link_ids(agent, &ifaces)?;
    let new = after[0].1;
    for ((iface, (link, old)), (link_after, prog)) in ifaces.iter().zip(&before).zip(&after) {
        ensure!(
            link == link_after,
            "{iface}: link {link} became {link_after}"
        );
        ensure!(prog != old, "{iface}: still program {old}");
        ensure!(
            *prog == new,
            "{iface} runs {prog}, {} runs {new}",
            ifaces[0]
        );
        ensure!(
            out.contains(&format!(
                "{iface}: link {link} now runs program {new} (was {old})"
            )),
            "{iface} missing from the output"
        );
    }
    runs_program(topo, &ifaces, new)?;
    Ok(new)
}

/// One exchange: when it ended, and its error if it failed.
struct Exchange {
    at: Instant,
    error: Option<String>,
}

/// Client traffic until stopped: [`LONG_LIVED`] connections taking turns to echo 64 bytes,
/// and new connections opened (name, echo, close) one after another.
struct Traffic {
    stop: Arc<AtomicBool>,
    long: JoinHandle<Vec<Exchange>>,
    new: JoinHandle<Vec<Exchange>>,
}

impl Traffic {
    fn start(client: &Netns, addr: SocketAddr) -> Result<Self> {
        let mut sessions = client::tcp_sessions(client, addr, LONG_LIVED)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        // The sockets are in the client namespace already; any thread may use them.
        let long = std::thread::spawn(move || {
            let mut log = Vec::new();
            let mut k = 0;
            while !flag.load(Ordering::SeqCst) {
                let i = k % sessions.len();
                let error = sessions[i]
                    .echo(&client::payload(k, 64))
                    .err()
                    .map(|e| format!("connection {i} ({}): {e:#}", sessions[i].backend()));
                log.push(Exchange {
                    at: Instant::now(),
                    error,
                });
                k += 1;
            }
            for s in sessions {
                if let Err(e) = s.finish() {
                    log.push(Exchange {
                        at: Instant::now(),
                        error: Some(format!("closing: {e:#}")),
                    });
                }
            }
            log
        });
        let flag = stop.clone();
        let new = client.spawn(move || {
            let mut log = Vec::new();
            let mut k = 0;
            while !flag.load(Ordering::SeqCst) {
                let error = TcpSession::connect(addr)
                    .and_then(|mut s| {
                        s.echo(&client::payload(k, 64))?;
                        s.finish()
                    })
                    .err()
                    .map(|e| format!("new connection {k}: {e:#}"));
                log.push(Exchange {
                    at: Instant::now(),
                    error,
                });
                k += 1;
            }
            log
        })?;
        Ok(Self { stop, long, new })
    }

    /// Stops both, and returns (exchanges on long-lived connections, new connections).
    fn finish(self) -> (Vec<Exchange>, Vec<Exchange>) {
        self.stop.store(true, Ordering::SeqCst);
        (
            self.long.join().unwrap_or_default(),
            self.new.join().unwrap_or_default(),
        )
    }
}

/// Checks `log` has no failure, and exchanges both before and after each of `moments`.
fn check_traffic(what: &str, log: &[Exchange], moments: &[Instant]) -> Result<()> {
    let failed: Vec<&str> = log.iter().filter_map(|e| e.error.as_deref()).collect();
    println!("{what}: {} exchanges, {} failed", log.len(), failed.len());
    ensure!(
        failed.is_empty(),
        "{what}: {} of {} failed: {:?}",
        failed.len(),
        log.len(),
        &failed[..failed.len().min(5)]
    );
    for m in moments {
        ensure!(
            log.iter().any(|e| e.at < *m) && log.iter().any(|e| e.at > *m),
            "{what}: no exchange on both sides of an upgrade"
        );
    }
    Ok(())
}

/// Checks each backend in `expect` got at least 20 % of `tally` and no other backend got any.
fn check_spread(what: &str, tally: &Tally, expect: &[usize]) -> Result<()> {
    let n = client::total(tally);
    println!("{what}: {n} connections: {tally:?}");
    for i in expect {
        let got = tally.get(&backend_name(*i)).copied().unwrap_or(0);
        ensure!(
            got * 5 >= n,
            "{what}: {} got {got} of {n}",
            backend_name(*i)
        );
    }
    ensure!(
        tally.len() == expect.len(),
        "{what}: other backends answered"
    );
    Ok(())
}

/// Replaces the config with `text` and waits until the agent applied it.
fn apply(agent: &Agent, text: &str) -> Result<()> {
    agent.write_file("10-web.yaml", text)?;
    let generation = agent.status()?.generation;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| s.generation > generation)?;
    Ok(())
}

/// An nftables counter of packets to the VIP that reach the lb's own network stack, which
/// happens only when no program handled them (XDP_PASS, or no program at all): the program
/// sends every packet of a VIP flow back out with XDP_TX or XDP_REDIRECT.
struct StackProbe {
    lb: Netns,
}

/// Table of the [`StackProbe`].
const PROBE_TABLE: &str = "switchyard_upgrade_probe";

impl StackProbe {
    fn install(lb: &Netns) -> Result<Self> {
        let rules = format!(
            "table inet {PROBE_TABLE} {{\n  counter vip_seen {{ }}\n  chain pre {{\n    \
             type filter hook prerouting priority -300; policy accept;\n    \
             ip daddr {VIP_V4} counter name vip_seen\n  }}\n}}\n"
        );
        lb.exec_with_stdin(&["nft", "-f", "-"], Some(&rules))?;
        Ok(Self { lb: lb.clone() })
    }

    /// Packets counted so far.
    fn packets(&self) -> Result<u64> {
        let text = self
            .lb
            .exec(&["nft", "list", "counter", "inet", PROBE_TABLE, "vip_seen"])?;
        text.split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .context("no packet count")?
            .parse()
            .with_context(|| format!("nft printed {text}"))
    }
}

impl Drop for StackProbe {
    fn drop(&mut self) {
        let _ = self
            .lb
            .exec(&["nft", "delete", "table", "inet", PROBE_TABLE]);
    }
}

#[test]
fn upgrade_under_traffic_swaps_the_program_behind_the_pinned_links_and_drops_nothing() -> Result<()>
{
    if privileged::require("upgrade_under_traffic", &["nft"]).is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    // Without a program, the lb's stack sees the client's SYN: the probe counts it.
    let probe = StackProbe::install(topo.lb())?;
    let unhandled = topo
        .client()
        .run(|| TcpSession::connect_with_timeout(vip_v4(80), Duration::from_millis(300)))?;
    ensure!(unhandled.is_err(), "the VIP answered without a program");
    ensure!(probe.packets()? > 0, "the probe counted nothing");
    let first = web(2, None);
    let pin_path = pin_path_of(&first)?.display().to_string();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", first)])?;
    let passed = probe.packets()?;
    let ifaces = lb_interfaces(&topo);
    let (_, original) = link_ids(&agent, &ifaces)?[0];

    // 1. With the agent running.
    let traffic = Traffic::start(topo.client(), vip_v4(80))?;
    std::thread::sleep(Duration::from_millis(300));
    let at = Instant::now();
    let second = upgrade(&agent, &topo, "agent running")?;
    std::thread::sleep(Duration::from_millis(300));
    let (long, new) = traffic.finish();
    check_traffic("long-lived, agent running", &long, &[at])?;
    check_traffic("new connections, agent running", &new, &[at])?;
    ensure!(second != original);
    // The agent that was running writes the maps the new program reads.
    apply(&agent, &web(3, Some(&pin_path)))?;
    check_spread(
        "config change after the upgrade",
        &client::tcp_tally(topo.client(), vip_v4(80), 300)?,
        &[1, 2, 3],
    )?;

    // 2. With the agent stopped.
    agent.stop()?;
    let traffic = Traffic::start(topo.client(), vip_v4(80))?;
    std::thread::sleep(Duration::from_millis(300));
    let at = Instant::now();
    let third = upgrade(&agent, &topo, "agent stopped")?;
    std::thread::sleep(Duration::from_millis(300));
    let (long, new) = traffic.finish();
    check_traffic("long-lived, agent stopped", &long, &[at])?;
    check_traffic("new connections, agent stopped", &new, &[at])?;
    ensure!(third != second);
    // A new agent adopts the upgraded program's links and maps, and its config changes apply.
    agent.restart()?;
    runs_program(&topo, &ifaces, third)?;
    apply(&agent, &web(2, Some(&pin_path)))?;
    check_spread(
        "config change after a restart",
        &client::tcp_tally(topo.client(), vip_v4(80), 150)?,
        &[1, 2],
    )?;
    // Not one packet to the VIP went past the program, upgrades included. This, not the
    // exchanges, is what catches a gap: TCP retransmits across one (an upgrade done as
    // detach, 50 ms, attach failed no exchange and put 84 packets here).
    let now = probe.packets()?;
    println!(
        "packets to the VIP seen by the lb's stack while attached: {}",
        now - passed
    );
    ensure!(
        now == passed,
        "{} packets to the VIP reached the lb's stack",
        now - passed
    );
    Ok(())
}

/// The output of a `switchyard` command run in `ns` that must fail: fails if it succeeds.
fn failing_cli(ns: &Netns, args: &[&str]) -> Result<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", ns.path().display()))
        .arg(router_tests::agent::binary()?)
        .args(args)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        bail!("switchyard {args:?} succeeded:\n{text}");
    }
    Ok(text)
}

/// Checks `text` is the layout-mismatch error with the upgrade path.
fn check_mismatch(what: &str, text: &str, versions: &str) -> Result<()> {
    println!("{what}: {}", text.trim_end());
    for needle in [
        "map layout mismatch",
        versions,
        "changed nothing",
        "switchyard detach --iface",
        "switchyard attach",
    ] {
        ensure!(text.contains(needle), "{what}: no {needle:?} in:\n{text}");
    }
    ensure!(!text.contains("panicked"), "{what} panicked:\n{text}");
    Ok(())
}

#[test]
fn maps_written_by_another_layout_version_are_refused_by_attach_and_upgrade() -> Result<()> {
    if privileged::require_root_and_bpf("maps_of_another_layout").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(2, None))])?;
    let ifaces = lb_interfaces(&topo);
    let before = link_ids(&agent, &ifaces)?;
    agent.stop()?;
    // What an agent of the next layout version would have written.
    let mut maps = KernelMaps::open_pinned(&agent.pin_dir())?;
    let generation = maps.config()?.generation;
    maps.set_config(Config {
        generation,
        abi_version: ABI_VERSION + 1,
        _pad: 0,
    })?;
    drop(maps);
    let versions = format!(
        "map layout version {}; this binary uses version {ABI_VERSION}",
        ABI_VERSION + 1
    );

    let dir = agent.dir().display().to_string();
    let text = failing_cli(topo.lb(), &args("upgrade", &ifaces, &dir))?;
    check_mismatch("upgrade", &text, &versions)?;
    let err = agent
        .restart()
        .err()
        .context("an agent adopted maps of another layout")?;
    check_mismatch("attach", &format!("{err:#}"), &versions)?;

    // The running program, its links and maps are as they were, and it still balances.
    ensure!(link_ids(&agent, &ifaces)? == before, "the links changed");
    runs_program(&topo, &ifaces, before[0].1)?;
    let pins = pins_under(&agent.pin_dir());
    ensure!(pins.len() == maps::ALL.len() + ifaces.len(), "{pins:?}");
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 100)?;
    check_spread("after the refusals", &tally, &[1, 2])?;
    Ok(())
}

#[test]
fn a_pinned_map_of_another_shape_is_a_layout_mismatch_and_nothing_is_attached() -> Result<()> {
    if privileged::require("a_pinned_map_of_another_shape", &["bpftool"]).is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let cfg = web(1, None);
    let pin_path = pin_path_of(&cfg)?;
    // CONFIG with an 8-byte value where the program declares 16.
    let pin_dir = switchyard::dataplane::load::pin_dir(&pin_path);
    std::fs::create_dir_all(&pin_dir)?;
    let config = pin_dir.join(maps::CONFIG);
    let made = Command::new("bpftool")
        .args(["map", "create"])
        .arg(&config)
        .args([
            "type", "array", "key", "4", "value", "8", "entries", "1", "name", "CONFIG",
        ])
        .output()?;
    ensure!(
        made.status.success(),
        "bpftool map create: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let exited = Agent::attach_expecting_exit(
        &topo,
        &[("10-web.yaml", cfg)],
        &[LB_CLIENT_IF, &lb_backend_if(1)],
        EXIT_LIMIT,
    );
    let _ = std::fs::remove_dir_all(&pin_path);
    let exited = exited?;
    check_mismatch("attach", &exited.output, "map CONFIG pinned at")?;
    ensure!(
        exited.output.contains("value 8 B") && exited.output.contains("value 16 B"),
        "the error does not say what differs: {}",
        exited.output
    );
    ensure!(!exited.status.success());
    ensure!(
        exited.pins_left == vec![config],
        "pins left: {:?}",
        exited.pins_left
    );
    for iface in lb_interfaces(&topo) {
        let prog = topo.lb().xdp_program(&iface)?;
        ensure!(prog.is_none(), "{iface} has XDP program {prog:?}");
    }
    Ok(())
}

#[test]
fn a_pin_path_outside_bpffs_is_a_clear_error_for_attach_and_upgrade() -> Result<()> {
    if privileged::require_root_and_bpf("a_pin_path_outside_bpffs").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let tmp = temp_dir("not-bpffs")?;
    let pin_path = tmp.join("pins");
    let cfg = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &[(backend_v4(1).into(), 100)], None)
        .text()
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("pin_path:") {
                format!("  pin_path: {}\n", pin_path.display())
            } else {
                format!("{l}\n")
            }
        })
        .collect::<String>();
    let ifaces = [LB_CLIENT_IF.to_owned(), lb_backend_if(1)];
    let exited = Agent::attach_expecting_exit(
        &topo,
        &[("10-web.yaml", cfg.clone())],
        &[LB_CLIENT_IF, &lb_backend_if(1)],
        EXIT_LIMIT,
    )?;
    println!("attach: {}: {}", exited.status, exited.output.trim_end());
    let expect = [
        "is not on a bpffs mount".to_owned(),
        format!("({} is on ", tmp.display()),
        "mount -t bpf bpf /sys/fs/bpf".to_owned(),
        "agent.pin_path".to_owned(),
    ];
    ensure!(!exited.status.success(), "attach succeeded");
    for needle in &expect {
        ensure!(
            exited.output.contains(needle.as_str()),
            "attach: no {needle:?}"
        );
    }
    ensure!(!exited.output.contains("panicked"));
    for iface in &ifaces {
        let prog = topo.lb().xdp_program(iface)?;
        ensure!(prog.is_none(), "{iface} has XDP program {prog:?}");
    }
    ensure!(!pin_path.exists(), "attach created {}", pin_path.display());

    let dir = temp_dir("not-bpffs-config")?;
    std::fs::write(dir.join("10-web.yaml"), &cfg)?;
    let text = failing_cli(
        topo.lb(),
        &args("upgrade", &ifaces, &dir.display().to_string()),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&tmp);
    let text = text?;
    println!("upgrade: {}", text.trim_end());
    for needle in &expect {
        ensure!(text.contains(needle.as_str()), "upgrade: no {needle:?}");
    }
    Ok(())
}

#[test]
fn upgrade_without_a_pinned_link_names_attach_and_changes_nothing() -> Result<()> {
    if privileged::require_root_and_bpf("upgrade_without_a_pinned_link").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let dir = temp_dir("unattached")?;
    let cfg = web(1, None);
    std::fs::write(dir.join("10-web.yaml"), &cfg)?;
    let pin_path = switchyard::cli::pin_path(&dir);
    let dir_text = dir.display().to_string();
    let text = failing_cli(
        topo.lb(),
        &[
            "upgrade",
            "--iface",
            LB_CLIENT_IF,
            "--config-dir",
            &dir_text,
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    let text = text?;
    println!("upgrade: {}", text.trim_end());
    ensure!(
        text.contains(&format!(
            "{LB_CLIENT_IF} has no switchyard program to upgrade"
        )) && text.contains(&format!("switchyard attach --iface {LB_CLIENT_IF}")),
        "{text}"
    );
    ensure!(!pin_path.exists(), "upgrade created {}", pin_path.display());
    ensure!(topo.lb().xdp_program(LB_CLIENT_IF)?.is_none());
    Ok(())
}

/// The kernel id of map `name` pinned in `pin_dir`.
fn map_id(pin_dir: &Path, name: &'static str) -> Result<u32> {
    let info = aya::maps::MapInfo::from_pin(pin_dir.join(name))?;
    Ok(info.id())
}

/// `bpftool -j map dump pinned PATH`.
fn bpftool_dump(path: &Path) -> Result<String> {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(path)
        .output()?;
    ensure!(
        out.status.success(),
        "bpftool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn detach_keep_maps_leaves_the_maps_for_the_next_agent_and_detach_removes_them() -> Result<()> {
    if privileged::require("detach_keep_maps", &["bpftool"]).is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(2, None))])?;
    let ifaces = lb_interfaces(&topo);
    let dir = agent.dir().display().to_string();
    let pin_dir = agent.pin_dir();
    // The maps carry BTF: bpftool prints named fields.
    let config = bpftool_dump(&pin_dir.join(maps::CONFIG))?;
    let services = bpftool_dump(&pin_dir.join(maps::SERVICES))?;
    let abi = format!("\"abi_version\":{ABI_VERSION}");
    for (dump, field) in [
        (&config, abi.as_str()),
        (&config, "\"generation\":"),
        (&services, "\"port\":"),
        (&services, "\"decision\":"),
    ] {
        ensure!(dump.contains(field), "bpftool printed no {field}: {dump}");
    }
    let generation = KernelMaps::open_pinned(&pin_dir)?.config()?.generation;
    let services_id = map_id(&pin_dir, maps::SERVICES)?;
    agent.stop()?;

    let mut keep = args("detach", &ifaces, &dir);
    keep.push("--keep-maps");
    print!("{}", agent.cli(&keep)?);
    for iface in &ifaces {
        let prog = topo.lb().xdp_program(iface)?;
        ensure!(prog.is_none(), "{iface} still has {prog:?}");
    }
    let mut pins: Vec<String> = pins_under(&pin_dir)
        .iter()
        .filter_map(|p| Some(p.file_name()?.to_str()?.to_owned()))
        .collect();
    pins.sort();
    let mut want: Vec<String> = maps::ALL.iter().map(|m| (*m).to_owned()).collect();
    want.sort();
    ensure!(pins == want, "after detach --keep-maps: {pins:?}");
    ensure!(
        KernelMaps::open_pinned(&pin_dir)?.config()?.generation == generation,
        "the kept maps lost their content"
    );

    // The next agent attaches anew over the kept maps.
    agent.restart()?;
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 100)?;
    check_spread("over the kept maps", &tally, &[1, 2])?;
    ensure!(
        map_id(&pin_dir, maps::SERVICES)? == services_id,
        "the new agent replaced the kept maps"
    );
    let (_, program) = attach::pinned_link_ids(&pin_dir, LB_CLIENT_IF).context("no link")?;
    let shown = Command::new("bpftool")
        .args(["prog", "show", "id", &program.to_string()])
        .output()?;
    let shown = String::from_utf8_lossy(&shown.stdout);
    ensure!(
        shown
            .split_whitespace()
            .skip_while(|w| *w != "map_ids")
            .nth(1)
            .is_some_and(|ids| ids.split(',').any(|id| id == services_id.to_string())),
        "program {program} does not use the kept SERVICES map {services_id}: {shown}"
    );
    agent.stop()?;

    print!("{}", agent.cli(&args("detach", &ifaces, &dir))?);
    for iface in &ifaces {
        let prog = topo.lb().xdp_program(iface)?;
        ensure!(prog.is_none(), "{iface} still has {prog:?}");
    }
    let left = pins_under(&pin_dir);
    ensure!(left.is_empty(), "detach left {left:?}");
    Ok(())
}
