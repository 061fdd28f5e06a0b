//! `switchyard upgrade` swaps the program behind the pinned links: under traffic, with the agent
//! running and stopped, it drops no exchange and keeps links and maps; while the agent applies
//! changes every upgrade and every change succeeds; without a pinned link, or with a pin path
//! outside bpffs, it is a clear error that changes nothing.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, VIP_V4, backend_v4, lb_backend_if, vip_v4},
    agent::{Agent, temp_dir},
    client::{self},
    config_text::ConfigText,
    netns::Topology,
    privileged, servers,
};

use router_tests::netns::Netns;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use router_tests::client::TcpSession;

use crate::common::{self, EXIT_LIMIT, LIVE_LIMIT, Lb, consistent, dir_arg, lb_interfaces, serves};

use super::{args, check_spread, failing_cli, link_ids, pin_path_of, runs_program, upgrade, web};

/// Connections kept open and exchanging data through the upgrades.
const LONG_LIVED: usize = 40;

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
    #[expect(
        clippy::similar_names,
        reason = "`long` is the long-lived connections' thread, as the field it fills; `log` what \
                  a thread saw, as `check_traffic` reads it"
    )]
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

/// Replaces the config with `text` and waits until the agent applied it.
fn apply(agent: &Agent, text: &str) -> Result<()> {
    agent.write_file("10-web.yaml", text)?;
    let generation = agent.status()?.generation;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| s.generation > generation)?;
    Ok(())
}

/// An nftables counter of packets to the VIP that reach the lb's own network stack, which
/// happens only when no program handled them (`XDP_PASS`, or no program at all): the program
/// sends every packet of a VIP flow back out with `XDP_TX` or `XDP_REDIRECT`.
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

/// `switchyard upgrade` three times while the agent applies a change every 100 ms: every
/// upgrade succeeds, every change applies, and the program serves afterwards.
#[test]
fn upgrades_while_applies_run() -> Result<()> {
    let Some(lb) = Lb::start("upgrades_while_applies_run", 2, |pin| {
        common::web(pin, "web", &[100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        agent,
    } = lb;
    let dir = dir_arg(&agent);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let ifaces = [LB_CLIENT_IF.to_owned(), lb_backend_if(1), lb_backend_if(2)];
    std::thread::scope(|scope| -> Result<()> {
        let writer = scope.spawn(|| -> Result<u32> {
            let mut k = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                k += 1;
                agent.write_file("10-web.yaml", &common::web(&pin, "web", &[100, 1 + k % 99]))?;
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(k)
        });
        let upgraded = (0..3).try_for_each(|_| {
            let mut args = vec!["upgrade"];
            for i in &ifaces {
                args.extend(["--iface", i.as_str()]);
            }
            args.extend(["--config-dir", &dir]);
            agent.cli(&args).map(drop)
        });
        // The writer stops whatever the upgrades did: the scope waits for it.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("writer panicked"))??;
        upgraded
    })?;
    agent.wait_for(LIVE_LIMIT, |s| {
        s.differs_from_files == Some(false) && s.rejected.is_none()
    })?;
    consistent(&agent)?;
    serves(&topo, 10)
}
