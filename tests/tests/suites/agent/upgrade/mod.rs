//! Replacing the running program and moving between map layouts, in network namespaces with
//! the real binary: `switchyard upgrade` under traffic (with the agent running and stopped)
//! drops no exchange and keeps link and maps; pinned maps of another layout are refused by
//! `attach` and `upgrade` alike with the upgrade path, leaving the running program alone; a pin
//! path that is not on bpffs is a clear error; `detach --keep-maps` keeps the maps for the next
//! agent, and `detach` removes them.

mod keep_maps;
mod layout;
mod swap;

use std::{path::PathBuf, process::Command, time::Instant};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_name},
    agent::Agent,
    client::{self, Tally},
    config_text::{ConfigText, backends_v4},
    netns::{Netns, Topology},
};
use switchyard::dataplane::attach;

use crate::common::lb_interfaces;

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
