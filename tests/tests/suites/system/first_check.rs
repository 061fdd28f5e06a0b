//! The whole system in network namespaces — a backend's first check: a backend that a reload
//! adds to a health-checked pool while its server is down gets no client SYN (every client
//! connection meanwhile succeeds on the other backends, and the program forwards nothing to
//! it); `status` and `/metrics` show it waiting for its first check; once its server is up,
//! `healthy_threshold` passed probes in a row put it in service and it takes new connections.
//!
//! The pool uses [`FAST_HTTP_CHECK`]: `GET /health` on port 8080 every 200 ms, down after 2
//! failures, up after 2 successes. A backend that started healthy at the reload (as before
//! this rule) took new flows until its second refused probe, about 400 ms.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_name, backend_v4, vip_v4},
    agent::Agent,
    config_text::{ConfigText, FAST_HTTP_CHECK, backends_v4},
    netns::Topology,
    privileged,
    servers::{self, BackendServers},
};
use switchyard::{api::status::Status, health::AWAITING_FIRST_CHECK};

use crate::common::{
    metric,
    sampling::{Conn, Stream, ms},
};

/// The backend (1-based) the reload adds while its server is down.
const ADDED: usize = 3;
/// How long the added backend stays down after the reload: seven of its probes, well past
/// the ~400 ms a backend that started healthy would have taken new flows.
const DOWN_FOR: Duration = Duration::from_millis(1500);
/// How long the client keeps connecting once the added backend is in service.
const OBSERVE: Duration = Duration::from_secs(1);

/// The web service over backends `1..=n`, with [`FAST_HTTP_CHECK`], pinned at `pin`.
fn config(pin: &str, n: usize) -> String {
    ConfigText::at_pin_path(pin)
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&vec![100; n]), Some(FAST_HTTP_CHECK))
        .text()
}

/// The added backend as `status` shows it.
fn added(s: &Status) -> Option<&switchyard::api::status::BackendStatus> {
    let address = backend_v4(ADDED).to_string();
    s.pools
        .iter()
        .flat_map(|p| &p.backends)
        .find(|b| b.address == address)
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn a_backend_added_while_down_gets_no_syn_until_its_first_probe_passes() -> Result<()> {
    if privileged::require_root_and_bpf("a_backend_added_while_down_gets_no_syn").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let mut servers = servers::start_all(&topo)?;
    // Its address answers, its ports refuse: a connection it took would be reset.
    servers.pop().context("three backends")?.stop();
    let pin = ConfigText::new().pin_path().to_owned();
    let agent = Agent::start(&topo, &[("10-web.yaml", config(&pin, 2))])?;
    agent.wait_for(Duration::from_secs(5), |s| {
        let all: Vec<_> = s.pools.iter().flat_map(|p| &p.backends).collect();
        all.len() == 2
            && all
                .iter()
                .all(|b| b.healthy && b.probe.as_ref().is_some_and(|p| p.last_ok))
    })?;
    let name = backend_name(ADDED);
    let address = backend_v4(ADDED).to_string();
    let packets = format!("switchyard_backend_packets_total{{pool=\"web\",backend=\"{address}\"}}");
    let awaiting =
        format!("switchyard_backend_awaiting_check{{pool=\"web\",backend=\"{address}\"}}");
    let healthy = format!("switchyard_backend_healthy{{pool=\"web\",backend=\"{address}\"}}");

    let stream = Stream::start(topo.client(), vip_v4(80))?;
    thread::sleep(Duration::from_millis(200));
    let generation = agent.status()?.generation;
    agent.write_file("10-web.yaml", &config(&pin, 3))?;
    let reloaded_at = Instant::now();
    agent.reload()?;
    agent.wait_for(Duration::from_secs(3), |s| s.generation > generation)?;
    let applied = reloaded_at.elapsed();
    let waiting = |s: &Status| {
        added(s).is_some_and(|b| !b.healthy && b.reason.as_deref() == Some(AWAITING_FIRST_CHECK))
    };
    ensure!(
        waiting(&agent.status()?),
        "status right after the reload: {:?}",
        added(&agent.status()?).map(|b| (b.healthy, &b.reason))
    );
    thread::sleep(DOWN_FOR);

    // Still waiting: its probes were refused all along.
    let status = agent.status()?;
    let b = added(&status).context("the added backend in status")?;
    ensure!(
        waiting(&status) && b.probe.as_ref().is_some_and(|p| !p.last_ok),
        "status after {DOWN_FOR:?} down: healthy {}, reason {:?}, probe {:?}",
        b.healthy,
        b.reason,
        b.probe
    );
    let text = agent.cli(&["status", "--config-dir", &agent.dir().display().to_string()])?;
    ensure!(
        text.contains(&format!("{AWAITING_FIRST_CHECK}: no new flows")),
        "status text:\n{text}"
    );
    // A 0/1 gauge (an absent one reads 0).
    let gauge = |m: &str| -> Result<bool> { Ok(metric(&agent, m)? > 0.5) };
    ensure!(
        gauge(&awaiting)? && !gauge(&healthy)?,
        "metrics while it waits: awaiting {}, healthy {}",
        metric(&agent, &awaiting)?,
        metric(&agent, &healthy)?
    );
    let forwarded = metric(&agent, &packets)?;
    ensure!(
        forwarded == 0.0,
        "the program forwarded {forwarded} packets to {name} before its first check passed"
    );

    let started_at = Instant::now();
    let server = BackendServers::start_standard(&topo, ADDED)?;
    agent.wait_for(Duration::from_secs(3), |s| {
        added(s).is_some_and(|b| b.healthy && b.reason.is_none())
    })?;
    let in_service = started_at.elapsed();
    ensure!(
        !gauge(&awaiting)? && gauge(&healthy)?,
        "metrics once in service: awaiting {}, healthy {}",
        metric(&agent, &awaiting)?,
        metric(&agent, &healthy)?
    );
    thread::sleep(OBSERVE);
    let conns = stream.finish();

    let on = |c: &Conn| c.backend.as_deref() == Ok(name.as_str());
    let down: Vec<&Conn> = conns
        .iter()
        .filter(|c| c.started >= reloaded_at && c.started < started_at)
        .collect();
    let after: Vec<&Conn> = conns.iter().filter(|c| c.started >= started_at).collect();
    // Each failure with when it started (ms after the reload), the first five of them.
    let failed = |cs: &[&Conn]| -> (usize, Vec<(f64, String)>) {
        let all: Vec<(f64, String)> = cs
            .iter()
            .filter_map(|c| {
                let at = ms(c.started.saturating_duration_since(reloaded_at));
                c.backend.as_ref().err().map(|e| (at, e.clone()))
            })
            .collect();
        (all.len(), all.into_iter().take(5).collect())
    };
    let (down_failures, down_failed) = failed(&down);
    let (after_failures, after_failed) = failed(&after);
    let share = after.iter().filter(|c| on(c)).count();
    println!(
        "reload live after {:.1} ms; {} connections while {name} was down ({down_failures} \
         failed, first: {down_failed:?}); {name} in service {:.1} ms after its server started; \
         {share} of {} connections since on {name} ({after_failures} failed, first: \
         {after_failed:?}); {} accepted by its server",
        ms(applied),
        down.len(),
        ms(in_service),
        after.len(),
        server.tcp_connections()
    );
    ensure!(
        down.len() >= 100,
        "too few connections ({}) while {name} was down to show that none reached it",
        down.len()
    );
    ensure!(
        down_failures == 0,
        "{down_failures} connections failed while {name} waited for its first check, first: \
         {down_failed:?}"
    );
    ensure!(!down.iter().any(|c| on(c)));
    ensure!(
        share > 0 && server.tcp_connections() > 0,
        "{name} got no new connection once its check passed"
    );
    // Only a connection in flight when its table flips can break (one whose SYN took the old
    // table and whose next segment the new one).
    ensure!(
        after_failures <= 1,
        "{after_failures} connections failed once {name} was in service: {after_failed:?}"
    );
    Ok(())
}
