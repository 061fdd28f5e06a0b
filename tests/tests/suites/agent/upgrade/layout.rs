//! Pinned maps of another layout — another layout version, or a map of another shape — are
//! refused by `attach` and `upgrade` alike with the upgrade path, and the running program is left
//! alone.

use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, lb_backend_if, vip_v4},
    agent::{Agent, pins_under},
    client::{self},
    netns::Topology,
    privileged, servers,
};
use switchyard::dataplane::maps::KernelMaps;

use router_common::{ABI_VERSION, Config, maps};

use switchyard::dataplane::Dataplane as _;

use crate::common::{EXIT_LIMIT, lb_interfaces};

use super::{args, check_spread, failing_cli, link_ids, pin_path_of, runs_program, web};

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
    let config = maps.config()?;
    maps.set_config(Config {
        abi_version: ABI_VERSION + 1,
        ..config
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
        exited.output.contains("value 8 B")
            && exited
                .output
                .contains(&format!("value {} B", size_of::<router_common::Config>())),
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
