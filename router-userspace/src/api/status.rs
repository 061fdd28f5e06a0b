//! The `/status` document: what the agent runs and how each service, pool, backend and
//! interface stands. The wire types are read back by `switchyard status`, `ctl` and the tests.

use serde::{Deserialize, Serialize};

use crate::{
    agent::{Running, now_secs},
    config,
    dataplane::attach,
};

/// The last probe of one backend.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProbeStatus {
    /// Verdict after thresholds.
    pub healthy: bool,
    /// Whether the last probe succeeded.
    pub last_ok: bool,
    /// What the last probe saw.
    pub detail: String,
    /// Its latency, µs.
    pub latency_us: u64,
}

/// A backend address's next hop in `/status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NextHopStatus {
    /// `resolved`; `unresolved` (no new flows: the backend is out of every table); or
    /// `resolving`, no verdict yet (no new flows either).
    pub state: String,
    /// How frames leave, when resolved: destination MAC, interface, source MAC, gateway.
    pub via: Option<String>,
    /// Why not, when unresolved or resolving (`neighbour … FAILED`, `no route to …`,
    /// `resolving neighbour … on …`).
    pub reason: Option<String>,
    /// Since when (seconds since the Unix epoch).
    pub since: u64,
}

impl NextHopStatus {
    /// A next hop not resolved yet, for `reason` (what is being resolved).
    #[must_use]
    pub fn resolving(reason: String) -> Self {
        Self {
            state: "resolving".into(),
            via: None,
            reason: Some(reason),
            since: now_secs(),
        }
    }

    /// Whether this is a verdict (resolved, or unresolved for a reason) rather than a next hop
    /// still being resolved.
    #[must_use]
    pub fn decided(&self) -> bool {
        self.state != "resolving"
    }
}

/// `/status` as JSON.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    /// Generation of the applied config.
    pub generation: u64,
    /// The config directory.
    pub config_dir: String,
    /// The XDP mode the program runs in, read from the kernel for each interface's live link
    /// ([`InterfaceStatus::mode`]): `native`, `generic` or `offloaded`; the distinct modes in
    /// interface order, comma-separated, when the interfaces differ; `none` when no link is
    /// live. Never the mode asked for (that is `requested_mode`).
    pub mode: String,
    /// The mode `--mode` asked for (`native` or `generic`), `None` when the agent was started
    /// without it (a new attachment is then native).
    #[serde(default)]
    pub requested_mode: Option<String>,
    /// Attached interfaces.
    pub interfaces: Vec<InterfaceStatus>,
    /// Services.
    pub services: Vec<ServiceStatus>,
    /// Pools.
    pub pools: Vec<PoolStatus>,
    /// The last rejected config change, with every problem, until a change applies.
    pub rejected: Option<String>,
    /// The running config's version, content hash and what applied it.
    #[serde(default)]
    pub running: Running,
    /// Each virtual IP as published, with its announcement.
    #[serde(default)]
    pub vips: Vec<VipStatus>,
    /// Whether the fragments in the config directory differ from the running config (after a
    /// rollback, or while a change is rejected); `None` when the directory cannot be read.
    #[serde(default)]
    pub differs_from_files: Option<bool>,
    /// The fleet (`fleet:`): etcd's state (`connected` or `stale since …`) and each group's
    /// role here; `None` for a node on its own.
    #[serde(default)]
    pub fleet: Option<crate::agent::fleet::FleetStatus>,
    /// Each hook (`hooks:`) with its counters, in config order.
    #[serde(default)]
    pub hooks: Vec<crate::hooks::HookStatus>,
    /// Seconds since the Unix epoch when this was taken.
    pub time: u64,
}

/// One virtual IP in `/status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VipStatus {
    /// The address.
    pub address: String,
    /// Whether its `VIPS` entry, as this agent wrote it, says one of its services reaches a
    /// usable backend (`VIP_F_LIVE`); `false` before it is written.
    pub live: bool,
    /// Whether the agent announces it (its route is on the announcement interface); `None`
    /// without `announce:`.
    pub announced: Option<bool>,
}

/// One interface in `/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct InterfaceStatus {
    /// Interface name.
    pub name: String,
    /// Kernel id of the XDP program running there, read from the pinned link (so it follows
    /// `switchyard upgrade`); `None` when the link is not live (see `link`).
    pub program_id: Option<u32>,
    /// The pinned link, judged in the agent's network namespace
    /// ([`crate::dataplane::link`]): `live` (it runs the program on this interface), `defunct
    /// (REASON)` (it runs on no interface of this name here: `defunct (interface gone)` once the
    /// interface was deleted; a restart attaches anew), `none` (no pinned link: `switchyard
    /// detach` ran while this agent runs), or `unknown (ERROR)` when it cannot be read. Empty
    /// from agents that predate it.
    #[serde(default)]
    pub link: String,
    /// The mode the interface runs the link's program in, read from the kernel (`IFLA_XDP`):
    /// `native`, `generic` or `offloaded`; `None` when the link is not live.
    #[serde(default)]
    pub mode: Option<String>,
    /// Set when `--mode` asked for another mode than the one the adopted program runs in: what
    /// runs, what was asked, and how to change it (the agent keeps the program as it runs,
    /// [`attach::ModeMismatch`]).
    #[serde(default)]
    pub mode_warning: Option<String>,
}

impl InterfaceStatus {
    /// The status of `name`, whose link is pinned under `pin_dir`, for an agent that was asked
    /// for `requested` (`--mode`; `None` when not given).
    #[must_use]
    pub fn of(pin_dir: &std::path::Path, name: &str, requested: Option<attach::Mode>) -> Self {
        let (program_id, running, link) = match attach::link_state(pin_dir, name) {
            Ok(state) => {
                let (program_id, running) = match &state {
                    attach::LinkState::Live(info, running) => {
                        (Some(info.program_id), Some(*running))
                    }
                    _ => (None, None),
                };
                (program_id, running, state.describe())
            }
            Err(e) => (None, None, format!("unknown ({e})")),
        };
        Self {
            name: name.to_owned(),
            program_id,
            link,
            mode: running.map(|m| m.name().to_owned()),
            mode_warning: running
                .and_then(|m| attach::ModeMismatch::of(requested, m))
                .map(|mismatch| mismatch.describe(name)),
        }
    }
}

/// [`Status::mode`] of `interfaces`: their distinct modes in order, comma-separated, or `none`
/// when none has a live link.
#[must_use]
pub fn modes_in_use(interfaces: &[InterfaceStatus]) -> String {
    let mut modes: Vec<&str> = Vec::new();
    for mode in interfaces.iter().filter_map(|i| i.mode.as_deref()) {
        if !modes.contains(&mode) {
            modes.push(mode);
        }
    }
    if modes.is_empty() {
        "none".to_owned()
    } else {
        modes.join(", ")
    }
}

/// One service in `/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// Name.
    pub name: String,
    /// `vip:port/protocol`.
    pub address: String,
    /// `dsr-l2` or `nat`.
    pub forward: String,
    /// The target, as configured.
    pub to: String,
}

/// One pool in `/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Name.
    pub name: String,
    /// Backends.
    pub backends: Vec<BackendStatus>,
    /// The decision group that failed back away from the pool, while no group chose it again
    /// (`decisions[].on_failback`). `None` from agents that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<LeftStatus>,
    /// The live Maglev table's fingerprint, 16 hex digits
    /// ([`crate::publish::PoolState::table_digest`]): equal on every node with the same members,
    /// weights and table size, whatever their slots. `None` before the pool's first table, and
    /// from agents that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Whether the pool's previous table still gets its second chance
    /// (`conntrack.second_chance`).
    #[serde(default)]
    pub second_chance: bool,
}

/// A pool a decision group failed back away from, in `/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct LeftStatus {
    /// The group.
    pub group: String,
    /// What becomes of the flows tracked on the pool: `keep` (they stay until they end),
    /// `reset` or `migrate`. `keep` also when the group's `on_failback` could not apply
    /// because another service still sends new flows to the pool.
    pub policy: String,
    /// The pool's backend slots (the `backend` field of their `CONNTRACK` entries).
    pub slots: Vec<u32>,
    /// Open flows still on the pool's backends (as for a drain), counted from connection
    /// tracking when the status was taken (`None` when the table could not be read).
    pub open_flows: Option<u64>,
}

/// One backend in `/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct BackendStatus {
    /// Address.
    pub address: String,
    /// Weight.
    pub weight: u32,
    /// The weight its slow start has reached in the live table, while it ramps
    /// (`pools[].slow_start`).
    #[serde(default)]
    pub effective_weight: Option<u32>,
    /// Whether it gets new flows: healthy, and its next hop resolved.
    pub healthy: bool,
    /// Why it gets no new flows, when `healthy` is false: `waiting for its first check` (added
    /// to a running health-checked pool, it has not yet passed `healthy_threshold` probes in a
    /// row), `health check failed`, `no next hop`, `drained`, `drained, timeout passed` or
    /// `circuit breaker open`
    /// ([`crate::health::BackendHealth::reason`]). `None` from agents that predate it.
    #[serde(default)]
    pub reason: Option<String>,
    /// The last probe, if checked.
    pub probe: Option<ProbeStatus>,
    /// Its next hop.
    #[serde(default)]
    pub next_hop: Option<NextHopStatus>,
    /// The operator's drain, while it lasts.
    #[serde(default)]
    pub drain: Option<DrainStatus>,
    /// Its circuit breaker, in a pool that has one.
    #[serde(default)]
    pub breaker: Option<BreakerStatus>,
}

/// A backend's circuit breaker in `/status` (`pools[].breaker`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BreakerStatus {
    /// `closed`, `open` (no new flows) or `half_open` (a trial share of new flows).
    pub phase: crate::breaker::Phase,
    /// How long it has been in this phase, seconds.
    pub for_secs: u64,
}

/// A drained backend in `/status` (`switchyard ctl backend drain`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DrainStatus {
    /// Since when (seconds since the Unix epoch).
    pub since: u64,
    /// When its timeout passes (seconds since the Unix epoch), if it has one.
    pub until: Option<u64>,
    /// The timeout passed: its remaining tracked flows are re-selected too.
    pub evicted: bool,
    /// Its backend slot (the `backend` field of its `CONNTRACK` entries).
    pub slot: u32,
    /// Open flows still on it (established TCP and UDP flows not idle past their timeout,
    /// `router_common::flow_open`), counted from connection tracking when the status was taken
    /// (`None` when the table could not be read).
    pub open_flows: Option<u64>,
}

/// `tcp` or `udp`.
#[must_use]
pub fn protocol(p: config::Protocol) -> &'static str {
    match p {
        config::Protocol::Tcp => "tcp",
        config::Protocol::Udp => "udp",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interface(name: &str, mode: Option<&str>) -> InterfaceStatus {
        InterfaceStatus {
            name: name.to_owned(),
            program_id: mode.map(|_| 42),
            link: if mode.is_some() { "live" } else { "none" }.to_owned(),
            mode: mode.map(str::to_owned),
            mode_warning: None,
        }
    }

    #[test]
    fn the_status_mode_is_the_modes_the_interfaces_run() {
        assert_eq!(modes_in_use(&[]), "none");
        assert_eq!(modes_in_use(&[interface("a", None)]), "none");
        assert_eq!(
            modes_in_use(&[interface("a", Some("generic")), interface("b", None)]),
            "generic"
        );
        assert_eq!(
            modes_in_use(&[
                interface("a", Some("generic")),
                interface("b", Some("native")),
                interface("c", Some("generic")),
            ]),
            "generic, native"
        );
    }

    #[test]
    fn an_interface_status_of_an_older_agent_has_no_mode() {
        let old: InterfaceStatus =
            serde_json::from_str(r#"{"name":"eth0","program_id":7,"link":"live"}"#).unwrap();
        assert_eq!(old.mode, None);
        assert_eq!(old.mode_warning, None);
    }
}
