//! Config fragments for the namespace suites, written as an operator writes them
//! (`docs/configuration.md`), each with its own [`unique_pin_path`].
//!
//! ```
//! # use router_tests::config_text::{ConfigText, backends_v4, FAST_HTTP_CHECK};
//! # use router_tests::addrs::VIP_V4;
//! let yaml = ConfigText::new()
//!     .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
//!     .pool("web", &backends_v4(&[1, 2, 1]), Some(FAST_HTTP_CHECK))
//!     .text();
//! assert!(yaml.contains("weight: 2"));
//! ```

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;

use crate::addrs::{HEALTH_PORT, TCP_ECHO_PORT, UDP_NAME_PORT, VIP_V4, backend_v4, backend_v6};
use crate::agent::unique_pin_path;

/// A fast HTTP health check on the backends' health endpoint: `GET /health` on
/// [`HEALTH_PORT`] every 200 ms (±10 % jitter), 100 ms timeout, down after 2 failures, up after
/// 2 successes; no backoff while down.
pub const FAST_HTTP_CHECK: &str = "{ http: { port: 8080, path: /health }, interval: 200ms, \
     timeout: 100ms, unhealthy_threshold: 2, healthy_threshold: 2 }";

/// [`FAST_HTTP_CHECK`]'s timing, for bounds computed from it.
pub mod fast_check {
    use std::time::Duration;
    /// `interval`.
    pub const INTERVAL: Duration = Duration::from_millis(200);
    /// `timeout`.
    pub const TIMEOUT: Duration = Duration::from_millis(100);
    /// `unhealthy_threshold`.
    pub const UNHEALTHY_THRESHOLD: u32 = 2;
    /// `healthy_threshold`.
    pub const HEALTHY_THRESHOLD: u32 = 2;
}

const _: () = assert!(HEALTH_PORT == 8080, "FAST_HTTP_CHECK names the port");

/// Backends `1..=weights.len()` by their IPv4 addresses, with `weights`.
#[must_use]
pub fn backends_v4(weights: &[u32]) -> Vec<(IpAddr, u32)> {
    (1..=weights.len())
        .map(|i| (backend_v4(i).into(), weights[i - 1]))
        .collect()
}

/// Backends `1..=n` by their IPv6 addresses, weight 100 each.
#[must_use]
pub fn backends_v6(n: usize) -> Vec<(IpAddr, u32)> {
    (1..=n).map(|i| (backend_v6(i).into(), 100)).collect()
}

/// TCP on the IPv4 VIP over backends `1..=n`, equal weights, all new flows to pool `web`.
#[must_use]
pub fn web_pool(n: usize) -> ConfigText {
    ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&vec![100; n]), None)
}

/// One fragment: the `agent` section (a unique pin path, unless it has none), services on
/// port 80 unless given another, pools, state variables and decision groups.
#[derive(Debug, Clone)]
pub struct ConfigText {
    pin_path: String,
    /// Whether the fragment has an `agent` section.
    agent: bool,
    state_dir: Option<String>,
    services: Vec<String>,
    pools: Vec<String>,
    state: Vec<String>,
    decisions: Vec<String>,
}

/// A decision group for [`ConfigText::decision`]: rules that each pick one pool, an optional
/// default pool and switch policy.
#[derive(Debug, Clone)]
pub struct Group {
    name: String,
    rules: Vec<String>,
    default: Option<String>,
    switch: Option<String>,
    on_failback: Option<String>,
}

impl Group {
    /// A group `name` without rules.
    #[must_use]
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            rules: Vec::new(),
            default: None,
            switch: None,
            on_failback: None,
        }
    }

    /// Adds rule `id`: while the expression `when` holds, new flows go to `pool` (the highest
    /// `priority` that holds wins).
    #[must_use]
    pub fn rule(mut self, id: &str, priority: u32, when: &str, pool: &str) -> Self {
        self.rules.push(format!(
            "      - {{ id: {id}, priority: {priority}, when: \"{when}\", then: {{ pool: {pool} }} }}"
        ));
        self
    }

    /// New flows go to `pool` while no rule holds.
    #[must_use]
    pub fn default_pool(mut self, pool: &str) -> Self {
        self.default = Some(pool.to_owned());
        self
    }

    /// The group's `switch` policy, a flow mapping such as
    /// `{ stable_for: 1s, cooldown: 0s, failback_after: 0s }`.
    #[must_use]
    pub fn switch(mut self, policy: &str) -> Self {
        self.switch = Some(policy.to_owned());
        self
    }

    /// The group's `on_failback` (`keep`, `reset` or `migrate`).
    #[must_use]
    pub fn on_failback(mut self, policy: &str) -> Self {
        self.on_failback = Some(policy.to_owned());
        self
    }

    fn text(&self) -> String {
        let mut out = format!("  - name: {}\n    rules:\n", self.name);
        for r in &self.rules {
            out += r;
            out += "\n";
        }
        if let Some(pool) = &self.default {
            let _ = writeln!(out, "    default: {{ pool: {pool} }}");
        }
        if let Some(policy) = &self.switch {
            let _ = writeln!(out, "    switch: {policy}");
        }
        if let Some(policy) = &self.on_failback {
            let _ = writeln!(out, "    on_failback: {policy}");
        }
        out
    }
}

impl Default for ConfigText {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigText {
    /// An empty fragment with a fresh [`unique_pin_path`].
    #[must_use]
    pub fn new() -> Self {
        Self::at_pin_path(&unique_pin_path())
    }

    /// An empty fragment with `pin` as its pin path: a new version of a fragment an agent runs,
    /// whose pin path must stay (it changes only on restart).
    #[must_use]
    pub fn at_pin_path(pin: &str) -> Self {
        Self {
            pin_path: pin.to_owned(),
            agent: true,
            state_dir: None,
            services: Vec::new(),
            pools: Vec::new(),
            state: Vec::new(),
            decisions: Vec::new(),
        }
    }

    /// An empty fragment without an `agent` section: another fragment beside one that has it
    /// (only one fragment of a directory may set `agent`).
    #[must_use]
    pub fn without_agent() -> Self {
        Self {
            agent: false,
            ..Self::at_pin_path("")
        }
    }

    /// Sets `agent.state_dir` (otherwise the harness gives every agent its own,
    /// [`crate::agent::with_state_dir`]).
    #[must_use]
    pub fn state_dir(mut self, dir: &Path) -> Self {
        self.state_dir = Some(dir.display().to_string());
        self
    }

    /// Adds service `name` on `vip` at the port the backends' servers listen on
    /// ([`TCP_ECHO_PORT`] or [`UDP_NAME_PORT`]): `protocol` is `tcp` or `udp`, `forward` is
    /// `dsr-l2` or `nat`, every new flow goes to `pool`.
    #[must_use]
    pub fn service(
        self,
        name: &str,
        vip: IpAddr,
        protocol: &str,
        forward: &str,
        pool: &str,
    ) -> Self {
        let port = if protocol == "udp" {
            UDP_NAME_PORT
        } else {
            TCP_ECHO_PORT
        };
        self.service_on(name, vip, port, protocol, forward, pool)
    }

    /// Like [`ConfigText::service`], forwarding with `ipip` from the outer source range
    /// `encap_source` (`ADDRESS/PREFIX`).
    #[must_use]
    pub fn ipip_service(
        self,
        name: &str,
        vip: IpAddr,
        protocol: &str,
        encap_source: &str,
        pool: &str,
    ) -> Self {
        let port = if protocol == "udp" {
            UDP_NAME_PORT
        } else {
            TCP_ECHO_PORT
        };
        let forward = format!("ipip, encap_source: \"{encap_source}\"");
        self.service_on(name, vip, port, protocol, &forward, pool)
    }

    /// Like [`ConfigText::service`], on `port` instead of the servers' port.
    #[must_use]
    pub fn service_on(
        self,
        name: &str,
        vip: IpAddr,
        port: u16,
        protocol: &str,
        forward: &str,
        pool: &str,
    ) -> Self {
        self.service_to(
            name,
            vip,
            port,
            protocol,
            forward,
            &format!("{{ pool: {pool} }}"),
        )
    }

    /// Like [`ConfigText::service`], with every new flow going where decision group `group`
    /// decides.
    #[must_use]
    pub fn deciding_service(
        self,
        name: &str,
        vip: IpAddr,
        protocol: &str,
        forward: &str,
        group: &str,
    ) -> Self {
        self.service_to(
            name,
            vip,
            TCP_ECHO_PORT,
            protocol,
            forward,
            &format!("{{ decide: {group} }}"),
        )
    }

    fn service_to(
        mut self,
        name: &str,
        vip: IpAddr,
        port: u16,
        protocol: &str,
        forward: &str,
        to: &str,
    ) -> Self {
        self.services.push(format!(
            "  - {{ name: {name}, vip: \"{vip}\", port: {port}, protocol: {protocol}, \
             forward: {forward}, to: {to} }}"
        ));
        self
    }

    /// Adds pool `name` of `backends` (address, weight), with `health_check` (a flow mapping
    /// such as [`FAST_HTTP_CHECK`]) if given.
    #[must_use]
    pub fn pool(
        mut self,
        name: &str,
        backends: &[(IpAddr, u32)],
        health_check: Option<&str>,
    ) -> Self {
        let mut text = format!("  - name: {name}\n    backends:\n");
        for (address, weight) in backends {
            let _ = writeln!(
                text,
                "      - {{ address: \"{address}\", weight: {weight} }}"
            );
        }
        if let Some(check) = health_check {
            let _ = writeln!(text, "    health_check: {check}");
        }
        self.pools.push(text);
        self
    }

    /// Sets `on_backend_down` (`keep`, `reset` or `migrate`) on the pool added last.
    #[must_use]
    pub fn on_backend_down(mut self, policy: &str) -> Self {
        if let Some(last) = self.pools.last_mut() {
            let _ = writeln!(last, "    on_backend_down: {policy}");
        }
        self
    }

    /// Adds state variable `name` with `source`, a flow mapping such as
    /// `{ push: { default: false } }`.
    #[must_use]
    pub fn state(mut self, name: &str, source: &str) -> Self {
        self.state.push(format!("  {name}: {source}\n"));
        self
    }

    /// Adds decision group `group`.
    #[must_use]
    pub fn decision(mut self, group: &Group) -> Self {
        self.decisions.push(group.text());
        self
    }

    /// The pin path in the `agent` section.
    #[must_use]
    pub fn pin_path(&self) -> &str {
        &self.pin_path
    }

    /// The YAML text.
    #[must_use]
    pub fn text(&self) -> String {
        let mut out = String::new();
        if self.agent {
            let _ = writeln!(out, "agent:\n  pin_path: {}", self.pin_path);
            if let Some(dir) = &self.state_dir {
                let _ = writeln!(out, "  state_dir: {dir}");
            }
        }
        if !self.services.is_empty() {
            out += "services:\n";
            out += &self.services.join("\n");
            out += "\n";
        }
        if !self.pools.is_empty() {
            out += "pools:\n";
            out += &self.pools.concat();
        }
        if !self.state.is_empty() {
            out += "state:\n";
            out += &self.state.concat();
        }
        if !self.decisions.is_empty() {
            out += "decisions:\n";
            out += &self.decisions.concat();
        }
        out
    }
}
