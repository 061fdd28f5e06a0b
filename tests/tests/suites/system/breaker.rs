//! The whole system in network namespaces — the L4 circuit breaker (`pools[].breaker`): a NAT
//! backend that resets half its connections trips its breaker from the RSTs the program sees
//! on the reply path (its health check passes all along), takes no new connections while the
//! breaker is open, goes half-open after the recovery timeout, and closes again once it
//! serves without resets; each transition is in the audit log and the metrics.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client::{Tally, TcpSession},
    config_text::{ConfigText, FAST_HTTP_CHECK, backends_v4},
    netns::Topology,
    privileged, servers,
};
use switchyard::{api::status::Status, breaker::Phase};

/// The pool's breaker: three failures within 10 s open it for 2 s; two successes close it.
const BREAKER: &str = "{ failure_threshold: 3, window: 10s, recovery_timeout: 2s, \
                       success_threshold: 2, trial_weight: 50 }";

fn config() -> String {
    ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "nat", "web")
        .pool("web", &backends_v4(&[100, 100, 100]), Some(FAST_HTTP_CHECK))
        .text()
        .replace(
            "  - name: web\n",
            &format!("  - name: web\n    breaker: {BREAKER}\n"),
        )
}

/// Backend 1's breaker phase in `s`.
fn phase_of(s: &Status) -> Option<Phase> {
    let address = backend_v4(1).to_string();
    s.pools
        .iter()
        .flat_map(|p| &p.backends)
        .find(|b| b.address == address)?
        .breaker
        .as_ref()
        .map(|b| b.phase)
}

/// Opens `n` connections to the VIP, each greeted then closed; counts the backends that
/// greeted and the connections that failed (reset before the greeting).
fn connections(topo: &Topology, n: usize) -> Result<(Tally, usize)> {
    let vip = vip_v4(router_tests::addrs::TCP_ECHO_PORT);
    topo.client().run(|| {
        let mut tally = Tally::new();
        let mut failed = 0;
        for _ in 0..n {
            match TcpSession::connect(vip) {
                Ok(s) => {
                    *tally.entry(s.backend().to_owned()).or_default() += 1;
                    let _ = s.finish();
                }
                Err(_) => failed += 1,
            }
        }
        (tally, failed)
    })
}

#[test]
fn a_backend_that_resets_half_its_connections_trips_the_breaker_and_recovers() -> Result<()> {
    if privileged::require_root_and_bpf("a_backend_that_resets_half_its_connections").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", config())])?;
    let b1 = servers[0].name().to_owned();
    servers[0].reset_every(2);

    // Connections until the breaker opens: about a third reach backend 1, half of those are
    // reset, and three resets open it.
    let started = Instant::now();
    let mut failed = 0;
    while agent.status().ok().as_ref().and_then(phase_of) != Some(Phase::Open) {
        ensure!(
            started.elapsed() < Duration::from_secs(15),
            "the breaker did not open; {failed} connections failed"
        );
        failed += connections(&topo, 10)?.1;
    }
    println!(
        "open after {:?}, {failed} connections reset",
        started.elapsed()
    );
    ensure!(failed >= 3, "the breaker opened after {failed} resets");
    let s = agent.status()?;
    let b = s
        .pools
        .iter()
        .flat_map(|p| &p.backends)
        .find(|b| b.address == backend_v4(1).to_string())
        .context("no backend 1 in status")?;
    ensure!(
        !b.healthy && b.reason.as_deref() == Some("circuit breaker open"),
        "status of an open breaker: healthy {}, reason {:?}",
        b.healthy,
        b.reason
    );

    // Open: no new connection reaches backend 1 (the recovery timeout is 2 s: a short round).
    let (tally, failed) = connections(&topo, 12)?;
    if agent.status().ok().as_ref().and_then(phase_of) == Some(Phase::Open) {
        ensure!(
            !tally.contains_key(&b1) && failed == 0,
            "while open: {tally:?}, {failed} failed"
        );
    }

    // The backend stops resetting; the breaker goes half-open after the timeout, then closes
    // on passed probes and traffic without resets.
    servers[0].reset_every(0);
    let mut seen_half_open = false;
    let started = Instant::now();
    loop {
        let phase = agent.status().ok().as_ref().and_then(phase_of);
        seen_half_open |= phase == Some(Phase::HalfOpen);
        if phase == Some(Phase::Closed) {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(15),
            "the breaker did not close: {phase:?}"
        );
        let _ = connections(&topo, 6)?;
        std::thread::sleep(Duration::from_millis(100));
    }
    let (tally, failed) = connections(&topo, 30)?;
    ensure!(
        tally.contains_key(&b1) && failed == 0,
        "closed again: {tally:?}, {failed} failed"
    );

    // Every transition is audited and counted.
    let audit = agent.api_get("/decisions")?;
    for to in ["open", "half_open", "closed"] {
        ensure!(
            audit.contains("\"breaker\"") && audit.contains(&format!("\"to\":\"{to}\"")),
            "no breaker transition to {to} in the audit log: {audit}"
        );
    }
    let metrics = agent.api_get("/metrics")?;
    ensure!(
        metrics.contains("switchyard_breaker_transitions_total{pool=\"web\",backend=\"198.18.")
            && metrics.contains("to=\"open\""),
        "no transition metric"
    );
    ensure!(seen_half_open || audit.contains("\"to\":\"half_open\""));
    Ok(())
}

/// Backend `i`'s breaker phase in `s`.
fn phase_of_backend(s: &Status, i: usize) -> Option<Phase> {
    let address = backend_v4(i).to_string();
    s.pools
        .iter()
        .flat_map(|p| &p.backends)
        .find(|b| b.address == address)?
        .breaker
        .as_ref()
        .map(|b| b.phase)
}

#[test]
fn breakers_never_open_a_whole_pool() -> Result<()> {
    if privileged::require_root_and_bpf("breakers_never_open_a_whole_pool").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let servers = servers::start_all(&topo)?;
    let text = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "nat", "web")
        .pool("web", &backends_v4(&[100, 100]), Some(FAST_HTTP_CHECK))
        .text()
        .replace(
            "  - name: web\n",
            &format!("  - name: web\n    breaker: {BREAKER}\n"),
        );
    let agent = Agent::start(&topo, &[("10-web.yaml", text)])?;
    // Both backends reset half their connections: both breakers count enough failures, but
    // at most one of the two may be open at a time.
    for s in &servers {
        s.reset_every(2);
    }
    let started = Instant::now();
    let mut opened = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let _ = connections(&topo, 10)?;
        let s = agent.status()?;
        let open = (1..=2)
            .filter(|&i| phase_of_backend(&s, i) == Some(Phase::Open))
            .count();
        ensure!(open < 2, "both breakers of the pool are open");
        opened = opened.max(open);
    }
    ensure!(opened == 1, "no breaker opened");
    ensure!(
        agent.log_text().contains("circuit breaker held closed"),
        "the held breaker is not in the log"
    );
    Ok(())
}
