//! The whole system in network namespaces — a DNS health check: each backend runs its own
//! dnsmasq on its address; the agent in the balancer's namespace asks each for
//! `www.probe.test` and keeps in service only the backends whose answer holds the expected
//! address. A backend whose resolver answers another address is taken out (after
//! `unhealthy_threshold` probes: a cold start begins every backend healthy), and one whose
//! resolver stops is taken out too.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};
use router_tests::{
    addrs::{VIP_V4, backend_v4},
    agent::Agent,
    config_text::{ConfigText, backends_v4},
    netns::{Netns, Topology},
    privileged,
};
use switchyard::api::status::Status;

/// The address the check expects for `www.probe.test`.
const EXPECTED: &str = "198.18.0.5";
/// The check: every 200 ms, down after 2 failures, up after 2 successes.
const DNS_CHECK: &str = "{ dns: { query: www.probe.test, record: A, expect: [198.18.0.5] }, \
     interval: 200ms, timeout: 100ms, unhealthy_threshold: 2, healthy_threshold: 2 }";

/// dnsmasq in `ns`, on `address` port 53, answering `www.probe.test` with `answer`.
struct Resolver(Child);

impl Resolver {
    fn start(ns: &Netns, address: &str, answer: &str) -> Result<Self> {
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), "dnsmasq"])
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--pid-file=",
                "--bind-interfaces",
                &format!("--listen-address={address}"),
                "--port=53",
                "--local=/probe.test/",
                &format!("--host-record=www.probe.test,{answer}"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dnsmasq")?;
        Ok(Self(child))
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `(healthy, last probe passed, its detail)` of backend `i` of pool `dns`.
fn backend(s: &Status, i: usize) -> Option<(bool, bool, String)> {
    let address = backend_v4(i).to_string();
    let b = s
        .pools
        .iter()
        .find(|p| p.name == "dns")?
        .backends
        .iter()
        .find(|b| b.address == address)?;
    let probe = b.probe.as_ref()?;
    Some((b.healthy, probe.last_ok, probe.detail.clone()))
}

#[test]
fn a_dns_health_check_keeps_only_the_backends_whose_resolver_answers_as_expected() -> Result<()> {
    let test = "a_dns_health_check_keeps_only_the_backends_whose_resolver_answers_as_expected";
    if privileged::require(test, &["dnsmasq"]).is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let mut good = Resolver::start(topo.backend(1), &backend_v4(1).to_string(), EXPECTED)?;
    let _wrong = Resolver::start(topo.backend(2), &backend_v4(2).to_string(), "198.18.0.6")?;
    let cfg = ConfigText::new()
        .service("dns", VIP_V4.into(), "udp", "dsr-l2", "dns")
        .pool("dns", &backends_v4(&[100, 100]), Some(DNS_CHECK));
    let agent = Agent::start(&topo, &[("10-dns.yaml", cfg.text())])?;

    agent
        .wait_for(Duration::from_secs(5), |s| {
            let one = backend(s, 1);
            let two = backend(s, 2);
            one.is_some_and(|(healthy, ok, _)| healthy && ok)
                && two.is_some_and(|(healthy, ok, _)| !healthy && !ok)
        })
        .context("backend 1 up and backend 2 (wrong answer) down")?;
    let status = agent.status()?;
    let (_, _, detail) = backend(&status, 1).context("backend 1")?;
    assert_eq!(detail, format!("answer {EXPECTED}"));
    let (_, _, detail) = backend(&status, 2).context("backend 2")?;
    assert_eq!(detail, format!("answer 198.18.0.6 lacks {EXPECTED}"));

    good.stop();
    agent
        .wait_for(Duration::from_secs(5), |s| {
            backend(s, 1).is_some_and(|(healthy, ok, _)| !healthy && !ok)
        })
        .context("backend 1 down once its resolver stops")?;
    Ok(())
}
