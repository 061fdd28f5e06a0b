//! Pinned links: a link whose interface was deleted and created again, or which belongs to an
//! interface of another namespace, is replaced rather than adopted, and status tells live links
//! from defunct ones.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::LB_CLIENT_IF, agent::Agent, config_text::web_pool, netns::Topology, privileged,
};
use switchyard::dataplane::attach;

/// The lb-side end of a veth pair of the test's own inside the lb namespace (its peer is
/// [`EXTRA_PEER`]), for a test that deletes an interface the agent is attached to and creates
/// it again without breaking the topology's own.
const EXTRA_IF: &str = "sy-extra0";

/// The peer of [`EXTRA_IF`], in the lb namespace too.
const EXTRA_PEER: &str = "sy-extra1";

/// Creates the [`EXTRA_IF`] veth pair in the lb namespace, both ends up.
fn add_extra_veth(topo: &Topology) -> Result<()> {
    topo.lb().ip_batch(&[
        format!("link add {EXTRA_IF} type veth peer name {EXTRA_PEER}"),
        format!("link set {EXTRA_IF} up"),
        format!("link set {EXTRA_PEER} up"),
    ])
}

/// Deletes the [`EXTRA_IF`] veth pair (deleting one end deletes both).
fn delete_extra_veth(topo: &Topology) -> Result<()> {
    topo.lb().ip(&["link", "del", EXTRA_IF]).map(drop)
}

/// `status`'s `link` of `iface`.
fn link_of(status: &switchyard::api::status::Status, iface: &str) -> Option<String> {
    status
        .interfaces
        .iter()
        .find(|i| i.name == iface)
        .map(|i| i.link.clone())
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn a_link_whose_interface_was_created_again_is_replaced_and_status_tells_live_from_defunct()
-> Result<()> {
    if privileged::require_root_and_bpf("a_link_whose_interface_was_created_again").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    add_extra_veth(&topo)?;
    let first_index = topo.lb().ip(&["-o", "link", "show", "dev", EXTRA_IF])?;
    let mut agent = Agent::start_on(
        &topo,
        &[("10-web.yaml", web_pool(1).text())],
        &[LB_CLIENT_IF, EXTRA_IF],
    )?;
    let status = agent.status()?;
    for iface in [LB_CLIENT_IF, EXTRA_IF] {
        ensure!(
            link_of(&status, iface).as_deref() == Some("live"),
            "{iface}: {:?}",
            status.interfaces
        );
    }

    // The interface is deleted and created again (same name, new ifindex) while no agent runs:
    // the pinned link survives with no interface.
    agent.stop()?;
    delete_extra_veth(&topo)?;
    add_extra_veth(&topo)?;
    let second_index = topo.lb().ip(&["-o", "link", "show", "dev", EXTRA_IF])?;
    println!("{EXTRA_IF} before: {first_index}{EXTRA_IF} after: {second_index}");
    ensure!(topo.lb().xdp_program(EXTRA_IF)?.is_none());
    ensure!(
        attach::link_path(&agent.pin_dir(), EXTRA_IF).exists(),
        "the pinned link went with its interface"
    );
    agent.relaunch()?;
    let log = agent.log_text();
    ensure!(
        log.contains(&format!(
            "{EXTRA_IF}: link_{EXTRA_IF} was defunct (interface gone): attached anew"
        )),
        "the restarted agent did not say it attached anew:\n{log}"
    );
    ensure!(
        log.contains(&format!(
            "{LB_CLIENT_IF}: adopted the program already attached"
        )),
        "the live link was not adopted:\n{log}"
    );
    let status = agent.status()?;
    println!("after the restart: {:?}", status.interfaces);
    let extra = status
        .interfaces
        .iter()
        .find(|i| i.name == EXTRA_IF)
        .context("no status of the extra interface")?;
    ensure!(extra.link == "live", "{extra:?}");
    let program = extra
        .program_id
        .context("no program on the new interface")?;
    let shown = topo.lb().xdp_program(EXTRA_IF)?;
    println!("ip -d link show dev {EXTRA_IF}: {shown:?}");
    ensure!(
        shown
            .as_deref()
            .is_some_and(|p| p.starts_with(&format!("id {program} ")) && p.contains("switchyard")),
        "{EXTRA_IF} does not run program {program}: {shown:?}"
    );
    ensure!(link_of(&status, LB_CLIENT_IF).as_deref() == Some("live"));

    // Deleted while the agent runs: status says the link is defunct.
    delete_extra_veth(&topo)?;
    agent.wait_for(Duration::from_secs(5), |s| {
        link_of(s, EXTRA_IF).as_deref() == Some("defunct (interface gone)")
    })?;
    let dir = agent.dir().display().to_string();
    let human = agent.cli(&["status", "--config-dir", &dir])?;
    print!("{human}");
    ensure!(
        human.contains(&format!("{EXTRA_IF} (link DEFUNCT (interface gone)")),
        "the text status does not say the link is defunct:\n{human}"
    );
    // No program to upgrade behind a defunct link: refused, naming it.
    let refused = agent
        .cli(&["upgrade", "--iface", EXTRA_IF, "--config-dir", &dir])
        .err()
        .context("upgrade accepted a defunct link")?;
    println!("upgrade: {refused:#}");
    ensure!(
        format!("{refused:#}").contains("is defunct (interface gone)"),
        "{refused:#}"
    );
    // Detach removes it, and says it was defunct.
    let out = agent.cli(&[
        "detach",
        "--iface",
        EXTRA_IF,
        "--keep-maps",
        "--config-dir",
        &dir,
    ])?;
    print!("{out}");
    ensure!(
        out.contains(&format!(
            "{EXTRA_IF}: removed the defunct link (interface gone)"
        )),
        "{out}"
    );
    ensure!(!attach::link_path(&agent.pin_dir(), EXTRA_IF).exists());
    agent.wait_for(Duration::from_secs(5), |s| {
        link_of(s, EXTRA_IF).as_deref() == Some("none")
    })?;
    Ok(())
}

#[test]
fn a_link_pinned_for_an_interface_of_another_namespace_is_not_adopted() -> Result<()> {
    if privileged::require_root_and_bpf("a_link_of_another_namespace").is_err() {
        return Ok(());
    }
    // Two lb namespaces, each with a `to-client`, and agents sharing one pin path (bpffs is
    // the same in both).
    let ours = Topology::builder().backends(1).build()?;
    let theirs = Topology::builder().backends(1).build()?;
    let cfg = web_pool(1).text();
    let mut first = Agent::start_on(&theirs, &[("10-web.yaml", cfg.clone())], &[LB_CLIENT_IF])?;
    first.stop()?;
    ensure!(theirs.lb().xdp_program(LB_CLIENT_IF)?.is_some());
    let second = Agent::start_on(&ours, &[("10-web.yaml", cfg)], &[LB_CLIENT_IF])?;
    let log = second.log_text();
    let said = log
        .lines()
        .find(|l| l.contains(&format!("link_{LB_CLIENT_IF} was defunct (")))
        .with_context(|| format!("the other namespace's link was adopted:\n{log}"))?;
    println!("{said}");
    ensure!(said.ends_with("attached anew (native mode)"), "{said}");
    let status = second.status()?;
    ensure!(link_of(&status, LB_CLIENT_IF).as_deref() == Some("live"));
    let program = status.interfaces[0].program_id.context("no program")?;
    let shown = ours.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(
        shown
            .as_deref()
            .is_some_and(|p| p.starts_with(&format!("id {program} "))),
        "this namespace's {LB_CLIENT_IF} does not run program {program}: {shown:?}"
    );
    // The link pinned there was the only reference to the other namespace's attachment.
    let left = theirs.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(left.is_none(), "the other namespace still runs {left:?}");
    drop(second);
    drop(first);
    Ok(())
}
