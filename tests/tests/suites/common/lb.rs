//! An agent on a standard topology with the backends' servers running, and the checks the agent
//! suites make of it: it serves, its status and maps agree, each backend gets its share.

use anyhow::{Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, backend_name, lb_backend_if, vip_v4},
    agent::{Agent, unique_pin_path},
    client::{self, Tally},
    netns::Topology,
    privileged,
    servers::{self, BackendServers},
};
use switchyard::dataplane::maps::KernelMaps;

/// A topology, its backends' servers and an agent started on one fragment, `10-web.yaml`.
/// Fields drop in declaration order: the agent stops before the servers and the topology go.
pub struct Lb {
    /// The agent, in the lb namespace.
    pub agent: Agent,
    /// The backends' servers.
    pub servers: Vec<BackendServers>,
    /// The namespaces.
    pub topo: Topology,
    /// The fragment's pin path (a fragment written later keeps it: it changes only on restart).
    pub pin: String,
}

impl Lb {
    /// Builds a topology of `backends` backends, starts their servers and an agent on the
    /// fragment `fragment` makes from a fresh pin path. `None` when `test` cannot run here
    /// (said loudly; a failure under `CI=true`).
    pub fn start(
        test: &str,
        backends: usize,
        fragment: impl FnOnce(&str) -> String,
    ) -> Result<Option<Self>> {
        if privileged::require_root_and_bpf(test).is_err() {
            return Ok(None);
        }
        let topo = Topology::builder().backends(backends).build()?;
        let servers = servers::start_all(&topo)?;
        let pin = unique_pin_path();
        let agent = Agent::start(&topo, &[("10-web.yaml", fragment(&pin))])?;
        Ok(Some(Self {
            agent,
            servers,
            topo,
            pin,
        }))
    }
}

/// `n` TCP connections through the VIP all succeed.
pub fn serves(topo: &Topology, n: usize) -> Result<()> {
    let tally = client::tcp_tally(topo.client(), vip_v4(80), n)?;
    ensure!(client::total(&tally) == n, "{tally:?}");
    Ok(())
}

/// The agent's view and the maps agree: the generation in `CONFIG` is the one `status`
/// reports, and `SERVICES` holds as many services as the running config.
pub fn consistent(agent: &Agent) -> Result<()> {
    let status = agent.status()?;
    let maps = KernelMaps::open_pinned(&agent.pin_dir())?;
    let config = maps.config()?;
    ensure!(
        config.generation == status.generation,
        "maps at generation {}, status says {}",
        config.generation,
        status.generation
    );
    ensure!(
        maps.services().len() == status.services.len(),
        "maps hold {} services, status lists {:?}",
        maps.services().len(),
        status.services
    );
    Ok(())
}

/// The lb's interfaces in `topo`: the client side, then each backend side.
pub fn lb_interfaces(topo: &Topology) -> Vec<String> {
    let mut all = vec![LB_CLIENT_IF.to_owned()];
    all.extend((1..=topo.backend_count()).map(lb_backend_if));
    all
}

/// Checks no lb interface but `except` has an XDP program.
pub fn no_xdp_on_lb(topo: &Topology, except: Option<&str>) -> Result<()> {
    for iface in lb_interfaces(topo) {
        if Some(iface.as_str()) != except {
            let prog = topo.lb().xdp_program(&iface)?;
            ensure!(prog.is_none(), "{iface} has XDP program {prog:?}");
        }
    }
    Ok(())
}

/// Checks every one of `backends` backends got at least 20 % of `tally` (300 flows, p = 1/3:
/// about 5 standard deviations below the mean).
pub fn check_spread(what: &str, tally: &Tally, backends: usize) -> Result<()> {
    let n = client::total(tally);
    println!("{what}: {n} connections: {tally:?}");
    for i in 1..=backends {
        let got = tally.get(&backend_name(i)).copied().unwrap_or(0);
        ensure!(got * 5 >= n, "{what}: {} got {got} of {n}", backend_name(i));
    }
    Ok(())
}
