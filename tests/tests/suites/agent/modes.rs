//! The XDP mode an agent reports is the one the kernel runs: an adopted attachment keeps its
//! mode, the log and `status` say which, and a `--mode` that asks for another one is warned
//! about, never acted on (decision 0019).

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::LB_CLIENT_IF, agent::Agent, config_text::web_pool, netns::Topology, privileged,
};
use switchyard::api::status::{InterfaceStatus, Status};

/// `status`'s entry for `iface`.
fn interface<'a>(status: &'a Status, iface: &str) -> Result<&'a InterfaceStatus> {
    status
        .interfaces
        .iter()
        .find(|i| i.name == iface)
        .with_context(|| format!("no status of {iface}: {:?}", status.interfaces))
}

/// The XDP mode `ip link` shows for `iface` in the lb namespace: the word `ip -o link show`
/// prints after the MTU (`xdp` for native, `xdpgeneric`, `xdpoffload`, `xdpmulti`), `None`
/// when no program is attached.
fn ip_link_mode(topo: &Topology, iface: &str) -> Result<Option<String>> {
    let line = topo.lb().ip(&["-o", "link", "show", "dev", iface])?;
    Ok(line
        .split_whitespace()
        .find(|w| w.starts_with("xdp"))
        .map(str::to_owned))
}

/// Starts an agent in generic mode on the client side and stops it: the program stays
/// attached in generic mode. Returns the agent and its program's id.
fn generic_attachment(topo: &Topology) -> Result<(Agent, u32)> {
    let mut agent = Agent::start_on_in_mode(
        topo,
        &[("10-web.yaml", web_pool(1).text())],
        &[LB_CLIENT_IF],
        "generic",
    )?;
    let log = agent.log_text();
    ensure!(
        log.contains(&format!("{LB_CLIENT_IF}: attached (generic mode)")),
        "{log}"
    );
    let status = agent.status()?;
    ensure!(status.mode == "generic", "{status:?}");
    ensure!(status.requested_mode.as_deref() == Some("generic"));
    let program = interface(&status, LB_CLIENT_IF)?
        .program_id
        .context("no program")?;
    agent.stop()?;
    ensure!(ip_link_mode(topo, LB_CLIENT_IF)?.as_deref() == Some("xdpgeneric"));
    Ok((agent, program))
}

#[test]
fn an_agent_restarted_without_a_mode_reports_the_generic_attachment_it_adopts() -> Result<()> {
    if privileged::require_root_and_bpf("an_agent_restarted_without_a_mode").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let (mut agent, program) = generic_attachment(&topo)?;

    agent.set_mode(None);
    agent.relaunch()?;
    let log = agent.log_text();
    let said = log
        .lines()
        .find(|l| l.contains(&format!("{LB_CLIENT_IF}: adopted the program")))
        .with_context(|| format!("the restarted agent did not adopt the program:\n{log}"))?;
    println!("{said}");
    ensure!(
        said.ends_with("adopted the program already attached (generic mode)"),
        "{said}"
    );
    ensure!(!log.contains("(native mode)"), "{log}");

    let status = agent.status()?;
    let client = interface(&status, LB_CLIENT_IF)?;
    println!("status: mode {}, {client:?}", status.mode);
    ensure!(status.mode == "generic", "{status:?}");
    ensure!(status.requested_mode.is_none(), "{status:?}");
    ensure!(client.link == "live", "{client:?}");
    ensure!(client.mode.as_deref() == Some("generic"), "{client:?}");
    ensure!(client.mode_warning.is_none(), "{client:?}");
    ensure!(
        client.program_id == Some(program),
        "the program was attached again"
    );
    let shown = ip_link_mode(&topo, LB_CLIENT_IF)?;
    println!("ip link: {shown:?}");
    ensure!(shown.as_deref() == Some("xdpgeneric"), "{shown:?}");

    let dir = agent.dir().display().to_string();
    let human = agent.cli(&["status", "--config-dir", &dir])?;
    print!("{human}");
    ensure!(
        human.contains(&format!(
            "{LB_CLIENT_IF} (link live, generic mode, program {program}); generic XDP"
        )),
        "{human}"
    );
    ensure!(!human.contains("WARNING"), "{human}");
    Ok(())
}

#[test]
fn an_explicit_mode_other_than_the_attached_one_is_adopted_with_a_warning() -> Result<()> {
    if privileged::require_root_and_bpf("an_explicit_mode_other_than_the_attached_one").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let (mut agent, program) = generic_attachment(&topo)?;

    // `--mode native` over the generic attachment: the agent starts, keeps the program as it
    // runs (nothing detached, nothing attached again) and says so.
    agent.set_mode(Some("native"));
    agent.relaunch()?;
    let log = agent.log_text();
    let said = log
        .lines()
        .find(|l| l.contains(&format!("{LB_CLIENT_IF}: adopted the program")))
        .with_context(|| format!("the restarted agent did not adopt the program:\n{log}"))?;
    println!("{said}");
    ensure!(said.contains("WARN"), "not a warning: {said}");
    ensure!(
        said.contains("(generic mode), NOT IN THE MODE ASKED FOR: --mode native was asked for"),
        "{said}"
    );
    ensure!(
        said.contains(&format!(
            "`switchyard detach --iface {LB_CLIENT_IF} --keep-maps`"
        )),
        "{said}"
    );

    let status = agent.status()?;
    let client = interface(&status, LB_CLIENT_IF)?;
    println!("status: mode {}, {client:?}", status.mode);
    ensure!(status.mode == "generic", "{status:?}");
    ensure!(status.requested_mode.as_deref() == Some("native"));
    ensure!(client.mode.as_deref() == Some("generic"), "{client:?}");
    ensure!(client.program_id == Some(program), "{client:?}");
    let warning = client
        .mode_warning
        .as_deref()
        .context("status carries no warning")?;
    ensure!(
        warning.starts_with(&format!(
            "--mode native was asked for, but the program already attached to {LB_CLIENT_IF} \
             runs in generic mode"
        )),
        "{warning}"
    );
    ensure!(ip_link_mode(&topo, LB_CLIENT_IF)?.as_deref() == Some("xdpgeneric"));
    let dir = agent.dir().display().to_string();
    let human = agent.cli(&["status", "--config-dir", &dir])?;
    print!("{human}");
    ensure!(
        human.contains(&format!(
            "WARNING: {LB_CLIENT_IF}: --mode native was asked for"
        )),
        "{human}"
    );

    // Asked for the mode it runs in: no warning.
    agent.stop()?;
    agent.set_mode(Some("generic"));
    agent.relaunch()?;
    let status = agent.status()?;
    let client = interface(&status, LB_CLIENT_IF)?;
    ensure!(client.mode_warning.is_none(), "{client:?}");
    ensure!(client.program_id == Some(program), "{client:?}");
    ensure!(status.mode == "generic", "{status:?}");
    Ok(())
}
