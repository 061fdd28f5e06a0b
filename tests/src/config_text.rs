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

use crate::addrs::{HEALTH_PORT, TCP_ECHO_PORT, UDP_NAME_PORT, backend_v4, backend_v6};
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
pub fn backends_v4(weights: &[u32]) -> Vec<(IpAddr, u32)> {
    (1..=weights.len())
        .map(|i| (backend_v4(i).into(), weights[i - 1]))
        .collect()
}

/// Backends `1..=n` by their IPv6 addresses, weight 100 each.
pub fn backends_v6(n: usize) -> Vec<(IpAddr, u32)> {
    (1..=n).map(|i| (backend_v6(i).into(), 100)).collect()
}

/// One fragment: the `agent` section (a unique pin path), services on port 80, pools.
#[derive(Debug, Clone)]
pub struct ConfigText {
    pin_path: String,
    services: Vec<String>,
    pools: Vec<String>,
}

impl Default for ConfigText {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigText {
    /// An empty fragment with a fresh [`unique_pin_path`].
    pub fn new() -> Self {
        Self {
            pin_path: unique_pin_path(),
            services: Vec::new(),
            pools: Vec::new(),
        }
    }

    /// Adds service `name` on `vip` at the port the backends' servers listen on
    /// ([`TCP_ECHO_PORT`] or [`UDP_NAME_PORT`]): `protocol` is `tcp` or `udp`, `forward` is
    /// `dsr-l2` or `nat`, every new flow goes to `pool`.
    pub fn service(
        mut self,
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
        self.services.push(format!(
            "  - {{ name: {name}, vip: \"{vip}\", port: {port}, protocol: {protocol}, \
             forward: {forward}, to: {{ pool: {pool} }} }}"
        ));
        self
    }

    /// Adds pool `name` of `backends` (address, weight), with `health_check` (a flow mapping
    /// such as [`FAST_HTTP_CHECK`]) if given.
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

    /// The pin path in the `agent` section.
    pub fn pin_path(&self) -> &str {
        &self.pin_path
    }

    /// The YAML text.
    pub fn text(&self) -> String {
        let mut out = format!("agent:\n  pin_path: {}\n", self.pin_path);
        if !self.services.is_empty() {
            out += "services:\n";
            out += &self.services.join("\n");
            out += "\n";
        }
        if !self.pools.is_empty() {
            out += "pools:\n";
            out += &self.pools.concat();
        }
        out
    }
}
