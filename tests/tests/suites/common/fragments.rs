//! The config fragments the agent suites write, built with [`ConfigText`], and a broken one with
//! the errors it must be reported with.

use router_tests::{
    addrs::VIP_V4,
    config_text::{ConfigText, backends_v4},
};

/// One fragment: the TCP service `web` on the IPv4 VIP over pool `pool` of backends
/// `1..=weights.len()` with `weights`, under pin path `pin`.
pub fn web(pin: &str, pool: &str, weights: &[u32]) -> String {
    ConfigText::at_pin_path(pin)
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", pool)
        .pool(pool, &backends_v4(weights), None)
        .text()
}

/// A second fragment: a UDP service on the same VIP over the `web` pool.
pub fn dns() -> String {
    ConfigText::without_agent()
        .service("dns", VIP_V4.into(), "udp", "dsr-l2", "web")
        .text()
}

/// A fragment with two mistakes: an unknown pool (line 7) and a misspelt key (line 11).
pub const BROKEN: &str = "services:
  - name: dns
    vip: 198.18.0.10
    port: 80
    protocol: udp
    forward: dsr-l2
    to: { pool: wbe }
pools:
  - name: extra
    backends: [ { address: 198.18.11.11 } ]
    health_check: { tcp: { port: 80 }, intervall: 1s }
";

/// [`BROKEN`] corrected.
pub const FIXED: &str = "services:
  - name: dns
    vip: 198.18.0.10
    port: 80
    protocol: udp
    forward: dsr-l2
    to: { pool: web }
pools:
  - name: extra
    backends: [ { address: 198.18.11.11 } ]
    health_check: { tcp: { port: 80 }, interval: 1s }
";

/// The errors [`BROKEN`] must be reported with, as `FILE:LINE PATH`.
pub fn broken_errors(file: &str) -> [String; 2] {
    [
        format!("{file}:7 services[0].to.pool: unknown pool \"wbe\""),
        format!("{file}:11 pools[0].health_check.intervall: unknown key"),
    ]
}
