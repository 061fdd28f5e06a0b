//! `detach --keep-maps` keeps the maps for the next agent, which resumes them (no renumbering,
//! the running config unchanged); `detach` removes them.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, lb_backend_if, vip_v4},
    agent::{Agent, pins_under},
    client::{self},
    netns::Topology,
    privileged, servers,
};
use switchyard::dataplane::{attach, maps::KernelMaps};

use router_common::{ABI_VERSION, maps};

use crate::common::{self, Lb, consistent, dir_arg, lb_interfaces, serves};

use super::{args, check_spread, web};

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

/// `detach --keep-maps` while the agent is stopped, then a start: a new link over the kept
/// maps, resumed from the history (no renumbering), the running config unchanged.
#[test]
fn a_start_after_detach_keep_maps_resumes_the_kept_maps() -> Result<()> {
    let Some(lb) = Lb::start("a_start_after_detach_keep_maps", 2, |pin| {
        common::web(pin, "web", &[100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        mut agent,
        ..
    } = lb;
    let before = agent.status()?;
    agent.stop()?;
    let dir = dir_arg(&agent);
    for iface in [LB_CLIENT_IF.to_owned(), lb_backend_if(1), lb_backend_if(2)] {
        agent.cli(&[
            "detach",
            "--iface",
            &iface,
            "--keep-maps",
            "--config-dir",
            &dir,
        ])?;
    }
    ensure!(
        KernelMaps::open_pinned(&agent.pin_dir()).is_ok(),
        "the maps are gone"
    );
    agent.relaunch()?;
    let after = agent.status()?;
    ensure!(
        after.generation == before.generation && after.running.version == before.running.version,
        "{:?}/{:?} → {:?}/{:?}",
        before.generation,
        before.running.version,
        after.generation,
        after.running.version
    );
    ensure!(
        agent.log_text().contains("resumed the pinned maps"),
        "{}",
        agent.log_text()
    );
    consistent(&agent)?;
    serves(&topo, 10)
}
