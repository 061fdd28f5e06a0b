//! The whole system in network namespaces — state-driven failover: the `web-failover` decision
//! group of `shared/design/reference.yaml` on real backends. Four backends: `dc1` = b1, b2 and
//! `dc2` = b3, b4; one TCP `dsr-l2` service on the IPv4 VIP with `to: { decide: web-failover }`.
//! `dc1_api_healthy` is an HTTP probe of b1's `/health` every 100 ms (timeout 200 ms, down after
//! 2 failures, up after 3 successes); `maintenance_mode` is a push variable; `dc2_ready` is
//! `pool.dc2.healthy_count >= 1`.
//!
//! Each test builds its own topology, servers, agent and audit directory, and undoes them on
//! drop.

use std::path::PathBuf;
use std::thread::{self};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4, backend_v6, vip_v4},
    agent::{Agent, temp_dir, unique_pin_path},
    client::TcpSession,
    config_text::FAST_HTTP_CHECK,
    netns::Topology,
    privileged,
    servers::{self, BackendServers},
};
use serde_json::Value;

use crate::common::sampling::{Conn, Stream, ms};

const GROUP: &str = "web-failover";

/// `dc1_api_healthy`'s probe interval.
const INTERVAL: Duration = Duration::from_millis(100);
/// `dc1_api_healthy`'s probe timeout.
const TIMEOUT: Duration = Duration::from_millis(200);
/// The group's `stable_for`.
const STABLE_FOR: Duration = Duration::from_millis(50);
/// The group's `cooldown`.
const COOLDOWN: Duration = Duration::from_secs(1);
/// The group's `failback_after`.
const FAILBACK_AFTER: Duration = Duration::from_secs(3);

/// Room for what the bound `2 × interval + timeout + stable_for` does not model.
///
/// The probe loop spaces probes from the end of one to the start of the next by `interval`
/// ± 10 % jitter; with an endpoint that fails fast (a 503 in about a millisecond) the two
/// failures that mark `dc1_api_healthy` false come ≤ 2 × 110 ms after the flip, and the switch
/// follows `stable_for` later: about 270 ms against the 450 ms bound. The margin covers what is
/// not the product's timing: tokio's timer granularity, the test health server's thread per
/// request, the agent's event-loop hop and map write (microseconds), the sampling of the
/// measurement (one client connection every few milliseconds), and CPU contention on a
/// two-core machine where the other tests of this file and the servers run at once.
const SCHEDULING_MARGIN: Duration = Duration::from_millis(150);

/// Tolerance when comparing a deadline the agent reports (engine time, read through a CLI
/// call) with the test's own clock.
const CLOCK_SLACK: Duration = Duration::from_millis(100);

/// The config fragment: pools dc1 (b1, b2) and dc2 (b3, b4), both health-checked, the
/// service, the state and the group; audit under `state_dir`.
/// The tests here measure timings of a few hundred milliseconds; run side by side they compete
/// for the machine's two CPUs (one failover run in eight failed that way), so each holds this
/// lock for its whole run.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes [`SERIAL`], whether or not an earlier test panicked while holding it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn config(state_dir: &std::path::Path) -> String {
    let b = |i| backend_v4(i).to_string();
    format!(
        r#"agent:
  pin_path: {pin}
  state_dir: {state}
services:
  - {{ name: web, vip: "{vip}", port: 80, protocol: tcp, forward: dsr-l2, to: {{ decide: {GROUP} }} }}
pools:
  - name: dc1
    backends:
      - {{ address: "{b1}", weight: 100 }}
      - {{ address: "{b2}", weight: 100 }}
    health_check: {check}
  - name: dc2
    backends:
      - {{ address: "{b3}", weight: 100 }}
      - {{ address: "{b4}", weight: 100 }}
    health_check: {check}
  - name: v6
    backends:
      - {{ address: "{b6}" }}
state:
  dc1_api_healthy:
    probe: {{ http: "http://{b1}:8080/health", interval: 100ms, timeout: 200ms, unhealthy_threshold: 2, healthy_threshold: 3 }}
  maintenance_mode: {{ push: {{ default: false }} }}
  dc2_ready: {{ expr: "pool.dc2.healthy_count >= 1" }}
decisions:
  - name: {GROUP}
    rules:
      - id: dc1-primary
        priority: 100
        when: dc1_api_healthy AND NOT maintenance_mode
        then: {{ pool: dc1 }}
      - id: failover-dc2
        priority: 90
        when: (NOT dc1_api_healthy OR maintenance_mode) AND dc2_ready
        then: {{ pool: dc2 }}
    default: {{ pool: dc1 }}
    switch: {{ stable_for: 50ms, cooldown: 1s, failback_after: 3s }}
    require: "target.healthy_count >= 1"
"#,
        pin = unique_pin_path(),
        state = state_dir.display(),
        vip = VIP_V4,
        check = FAST_HTTP_CHECK,
        b1 = b(1),
        b2 = b(2),
        b3 = b(3),
        b4 = b(4),
        b6 = backend_v6(1),
    )
}

/// A temporary directory removed on drop (the agent's `state_dir`).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One test's world; fields drop in order: the agent first, the namespaces last.
struct Lab {
    agent: Agent,
    servers: Vec<BackendServers>,
    topo: Topology,
    _state_dir: TempDir,
}

impl Lab {
    /// Four backends, their servers and the agent; returns once every backend is probed
    /// healthy and the group publishes `pool=dc1` by `dc1-primary`.
    fn start() -> Result<Self> {
        let state_dir = TempDir(temp_dir("state")?);
        let topo = Topology::builder().backends(4).build()?;
        let servers = servers::start_all(&topo)?;
        let agent = Agent::start(&topo, &[("10-web.yaml", config(&state_dir.0))])?;
        let lab = Self {
            agent,
            servers,
            topo,
            _state_dir: state_dir,
        };
        lab.agent.wait_for(Duration::from_secs(5), |s| {
            // Pool `v6` (unused, unprobed) is there only for an override of the wrong family.
            let all: Vec<_> = s
                .pools
                .iter()
                .filter(|p| p.name != "v6")
                .flat_map(|p| &p.backends)
                .collect();
            all.len() == 4 && all.iter().all(|b| b.healthy)
        })?;
        // Probe variables start healthy, so the group adopts dc1-primary at start. Wait for
        // that decision in the audit trail (the explanation applies a passed deadline before
        // the agent has written it).
        let start = Instant::now();
        loop {
            let records = lab.decisions()?;
            let last = switches(&records).last().map(|r| r["to"]["pool"].clone());
            if last.as_ref().is_some_and(|p| p == "dc1") {
                break;
            }
            if start.elapsed() > FAILBACK_AFTER + Duration::from_secs(3) {
                bail!(
                    "the group never published pool=dc1: {records:#?}\nlog:\n{}",
                    lab.agent.log_text()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
        // That switch starts a cooldown; the tests measure switches that must not wait for it.
        thread::sleep(COOLDOWN + Duration::from_millis(100));
        let e = lab.explain()?;
        ensure!(
            active_pool(&e) == Some("dc1".into()) && active_by(&e) == "dc1-primary",
            "after the start: {}",
            e["text"]
        );
        Ok(lab)
    }

    /// `switchyard ctl --config-dir DIR ARGS…`: stdout, or an error with stderr.
    fn ctl(&self, args: &[&str]) -> Result<String> {
        let dir = self.agent.dir().display().to_string();
        let mut all = vec!["ctl", "--config-dir", dir.as_str()];
        all.extend_from_slice(args);
        self.agent.cli(&all)
    }

    /// The group's explanation (`GET /explain/web-failover`), JSON.
    fn explain(&self) -> Result<Value> {
        Ok(serde_json::from_str(
            &self.agent.api_get(&format!("/explain/{GROUP}"))?,
        )?)
    }

    /// Polls the explanation every 20 ms until `pred` holds; returns it and when it was read.
    fn wait_explain(
        &self,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<(Value, Instant)> {
        let start = Instant::now();
        loop {
            let at = Instant::now();
            if let Ok(e) = self.explain()
                && pred(&e)
            {
                return Ok((e, at));
            }
            if start.elapsed() > limit {
                bail!(
                    "explanation not reached within {limit:?}: {}\nlog:\n{}",
                    self.explain()
                        .map(|e| e["text"].to_string())
                        .unwrap_or_default(),
                    self.agent.log_text()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The audit trail of the group (`ctl decisions --group web-failover --json`: the API's
    /// array of records).
    fn decisions(&self) -> Result<Vec<Value>> {
        let text = self.ctl(&["decisions", "--group", GROUP, "--json"])?;
        serde_json::from_str(&text).with_context(|| format!("the audit trail {text:?}"))
    }

    /// The names of the servers of pool dc1 (b1, b2) and dc2 (b3, b4).
    fn names(&self, pool: &str) -> Vec<String> {
        let range = if pool == "dc1" { 0..2 } else { 2..4 };
        self.servers[range]
            .iter()
            .map(|s| s.name().to_owned())
            .collect()
    }
}

/// The explanation's active pool (`None` for a split or nothing).
fn active_pool(e: &Value) -> Option<String> {
    e["explanation"]["active"]["action"]["pool"]
        .as_str()
        .map(str::to_owned)
}

/// What the active action came from: a rule id, `default` or `override`.
fn active_by(e: &Value) -> String {
    let by = &e["explanation"]["active"]["by"];
    by["rule"]
        .as_str()
        .map_or_else(|| by.to_string(), str::to_owned)
}

/// Switch records (`kind: switch` or `override_set`).
fn switches(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "switch" || r["kind"] == "override_set")
        .collect()
}

/// Whether connection `i` reuses the source port of an earlier connection to the same backend.
fn reuses_tuple(conns: &[Conn], i: usize) -> bool {
    let c = &conns[i];
    c.port.is_some()
        && conns[..i]
            .iter()
            .any(|e| e.port == c.port && e.backend == c.backend)
}

/// The first connection from `from` on that reached one of `pool` on a fresh 5-tuple.
fn first_on<'a>(conns: &'a [Conn], pool: &[String], from: Instant) -> Option<&'a Conn> {
    conns.iter().enumerate().find_map(|(i, c)| {
        let on = c.backend.as_ref().is_ok_and(|b| pool.contains(b));
        (c.started >= from && on && !reuses_tuple(conns, i)).then_some(c)
    })
}

/// Connections in `[from, to)` served by one of `wrong` that reuse the source port (so the
/// 5-tuple) of an earlier connection to the same backend. The XDP program's connection
/// tracking does not end a flow at FIN nor start one at SYN, so such a connection would follow
/// the old entry, not the new decision; that is the only stray this suite accepts (the client
/// closes first and so holds `TIME_WAIT`, which makes it rare). Returns their number, or fails,
/// naming the connection, if a connection to `wrong` is not such a reuse.
fn stale_tuples(conns: &[Conn], wrong: &[String], from: Instant, to: Instant) -> Result<usize> {
    let mut reused = 0;
    for (i, c) in conns.iter().enumerate() {
        if c.started < from || c.started >= to {
            continue;
        }
        let Ok(b) = &c.backend else { continue };
        if !wrong.contains(b) {
            continue;
        }
        ensure!(
            reuses_tuple(conns, i),
            "a new connection (port {:?}) reached {b} at +{:.1} ms from the window's start",
            c.port,
            ms(c.started - from)
        );
        reused += 1;
    }
    Ok(reused)
}

/// Where the connections of `conns` in `[from, to)` went: (dc1, dc2, failed).
fn tally(conns: &[Conn], dc1: &[String], from: Instant, to: Instant) -> (usize, usize, usize) {
    let mut t = (0, 0, 0);
    for c in conns.iter().filter(|c| c.started >= from && c.started < to) {
        match &c.backend {
            Ok(b) if dc1.contains(b) => t.0 += 1,
            Ok(_) => t.1 += 1,
            Err(_) => t.2 += 1,
        }
    }
    t
}

#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn web_failover_moves_new_connections_to_dc2_when_dc1_fails_and_back_after_failback() -> Result<()>
{
    let _serial = serial();
    if privileged::require_root_and_bpf("web_failover_moves_new_connections_to_dc2").is_err() {
        return Ok(());
    }
    let lab = Lab::start()?;
    let (dc1, dc2) = (lab.names("dc1"), lab.names("dc2"));
    let explain_dc1 = lab.ctl(&["explain", GROUP])?;
    println!("explain before the failure:\n{explain_dc1}");
    for needle in [
        "dc1-primary",
        "failover-dc2",
        "WINS, active",
        "dc1_api_healthy = true",
        "maintenance_mode = false",
    ] {
        ensure!(
            explain_dc1.contains(needle),
            "explain lacks {needle:?}:\n{explain_dc1}"
        );
    }
    let switches_before = switches(&lab.decisions()?).len();

    let stream = Stream::start(lab.topo.client(), vip_v4(80))?;
    thread::sleep(Duration::from_millis(300));

    // dc1 fails.
    let failed_at = Instant::now();
    lab.servers[0].set_healthy(false);
    let (_, saw_dc2) = lab.wait_explain(Duration::from_secs(3), |e| {
        active_pool(e) == Some("dc2".into())
    })?;
    let explain_dc2 = lab.ctl(&["explain", GROUP])?;
    println!(
        "explain after the failure (read +{:.1} ms):\n{explain_dc2}",
        ms(saw_dc2 - failed_at)
    );
    for needle in [
        "failover-dc2",
        "WINS, active",
        "dc1_api_healthy = false",
        "dc2_ready = true",
    ] {
        ensure!(
            explain_dc2.contains(needle),
            "explain lacks {needle:?}:\n{explain_dc2}"
        );
    }
    thread::sleep(Duration::from_secs(1));

    // dc1 recovers: failback waits failback_after from when the probe sees it healthy.
    let recovered_at = Instant::now();
    lab.servers[0].set_healthy(true);
    let (pending, detected) = lab.wait_explain(Duration::from_secs(3), |e| {
        e["text"]
            .as_str()
            .is_some_and(|t| t.contains("failback pending"))
    })?;
    let pending_text = pending["text"].as_str().unwrap_or_default().to_owned();
    println!(
        "explain while failback is pending (read +{:.1} ms after recovery):\n{pending_text}",
        ms(detected - recovered_at)
    );
    for needle in [
        "dc1-primary",
        "failback pending until",
        "dc1_api_healthy = true",
    ] {
        ensure!(
            pending_text.contains(needle),
            "explain lacks {needle:?}:\n{pending_text}"
        );
    }
    ensure!(
        active_pool(&pending) == Some("dc2".into()),
        "failback pending but dc2 no longer active: {pending_text}"
    );
    // The deadline, in engine time, relative to the explanation's own `now`.
    let now_us = pending["explanation"]["now_us"].as_u64().unwrap_or(0);
    let until_us = pending["explanation"]["wait"]["until_us"]
        .as_u64()
        .or_else(|| pending["explanation"]["next_deadline_us"].as_u64())
        .context("no failback deadline in the explanation")?;
    let remaining = Duration::from_micros(until_us.saturating_sub(now_us));
    // The probe saw dc1 healthy `failback_after - remaining` before the explanation.
    let recovery_seen = (detected + remaining)
        .checked_sub(FAILBACK_AFTER)
        .unwrap_or(detected);
    let (_, back) = lab.wait_explain(Duration::from_secs(6), |e| {
        active_pool(e) == Some("dc1".into())
    })?;
    thread::sleep(Duration::from_millis(700));
    let conns = stream.finish();
    let explain_back = lab.ctl(&["explain", GROUP])?;
    println!("explain after failback:\n{explain_back}");
    ensure!(
        explain_back.contains("WINS, active") && explain_back.contains("active pool=dc1"),
        "explain after failback:\n{explain_back}"
    );

    // Detection to switch.
    let end = conns.last().map_or_else(Instant::now, |c| c.started) + Duration::from_secs(1);
    let first = conns.first().context("no connection at all")?.started;
    let (b1, b2, bf) = tally(&conns, &dc1, first, failed_at);
    ensure!(
        b1 > 0 && b2 == 0,
        "before the failure: {b1} on dc1, {b2} on dc2"
    );
    let first_dc2 =
        first_on(&conns, &dc2, failed_at).context("no connection reached dc2 after the failure")?;
    let to_dc2 = first_dc2.started - failed_at;
    // One machine-readable line per run for `bench/failover.sh`, before any assertion on
    // timing: detection to switch (b1's health endpoint fails → first new connection on dc2,
    // ms), failed client connections over the whole stream, connections made, and the agent's
    // event-to-map-write time of the failover switch from the audit trail (µs, `-` if absent).
    let write_us = lab
        .decisions()
        .ok()
        .and_then(|r| {
            switches(&r)
                .into_iter()
                .skip(switches_before)
                .find(|r| r["to"]["pool"] == "dc2")
                .and_then(|r| r["latency_us"].as_u64())
        })
        .map_or_else(|| "-".to_owned(), |u| u.to_string());
    println!(
        "FAILOVER detection_ms={:.1} failed={} conns={} write_us={write_us}",
        ms(to_dc2),
        tally(&conns, &dc1, first, end).2,
        conns.len()
    );
    let bound = INTERVAL * 2 + TIMEOUT + STABLE_FOR;
    let switched = first_dc2.started + Duration::from_millis(20);
    let (d1, d2, df) = tally(&conns, &dc1, switched, recovered_at);
    let d1_stale = stale_tuples(&conns, &dc1, switched, recovered_at)?;
    println!(
        "failover: first new connection on dc2 started +{:.1} ms after b1's health endpoint \
         failed (bound {:.0} ms + {:.0} ms scheduling margin); before: {b1} on dc1 ({bf} \
         failed); on dc2 until recovery: {d1} on dc1 ({d1_stale} on a reused 5-tuple), {d2} on dc2, \
         {df} failed",
        ms(to_dc2),
        ms(bound),
        ms(SCHEDULING_MARGIN)
    );
    ensure!(
        to_dc2 <= bound + SCHEDULING_MARGIN,
        "new connections reached dc2 only {:.1} ms after the failure",
        ms(to_dc2)
    );
    ensure!(
        d1 <= 3 && d2 >= 50,
        "after the switch: {d1} on dc1, {d2} on dc2"
    );

    // Failback.
    let first_back =
        first_on(&conns, &dc1, recovered_at).context("no connection returned to dc1")?;
    let since_recovery = first_back.started - recovered_at;
    let since_seen = first_back.started.saturating_duration_since(recovery_seen);
    let (w1, w2, wf) = tally(&conns, &dc1, recovered_at, first_back.started);
    let returned = first_back.started + Duration::from_millis(20);
    let (a1, a2, af) = tally(&conns, &dc1, returned, end);
    let w1_stale = stale_tuples(&conns, &dc1, recovered_at, first_back.started)?;
    let a2_stale = stale_tuples(&conns, &dc2, returned, end)?;
    println!(
        "failback: b1 healthy again at +0; the probe saw it by about +{:.1} ms (explain read \
         +{:.1} ms showed {:.1} ms left of failback_after); first new connection on dc1 at \
         +{:.1} ms = {:.1} ms after the probe saw it (failback_after {:.0} ms); explain showed \
         dc1 active by +{:.1} ms; while waiting: {w1} on dc1 ({w1_stale} on a reused 5-tuple), \
         {w2} on dc2, {wf} failed; after: {a1} on dc1, {a2} on dc2 ({a2_stale} on a reused \
         5-tuple), {af} failed",
        ms(recovery_seen.saturating_duration_since(recovered_at)),
        ms(detected - recovered_at),
        ms(remaining),
        ms(since_recovery),
        ms(since_seen),
        ms(FAILBACK_AFTER),
        ms(back - recovered_at),
    );
    ensure!(
        since_recovery >= FAILBACK_AFTER,
        "dc1 got a new connection {:.1} ms after recovering, before failback_after",
        ms(since_recovery)
    );
    ensure!(
        since_seen + CLOCK_SLACK >= FAILBACK_AFTER,
        "dc1 got a new connection {:.1} ms after the probe saw it healthy",
        ms(since_seen)
    );
    ensure!(
        since_seen <= FAILBACK_AFTER + STABLE_FOR + SCHEDULING_MARGIN + CLOCK_SLACK,
        "failback took {:.1} ms after the probe saw dc1 healthy",
        ms(since_seen)
    );
    ensure!(
        w1 <= 3 && w2 > 0 && a2 <= 3 && a1 > 0,
        "waiting: {w1}/{w2}, after: {a1}/{a2}"
    );
    let failed = bf + df + wf + af;
    ensure!(failed <= 2, "{failed} connections failed");

    // The audit trail: the failover and the failback, with their latency.
    let records = lab.decisions()?;
    let new: Vec<&Value> = switches(&records)
        .into_iter()
        .skip(switches_before)
        .collect();
    for r in &new {
        println!(
            "audit: {} → {} by {} on {:?}, {} µs from event to map write; values {}",
            r["from"], r["to"], r["by"], r["cause"], r["latency_us"], r["values"]
        );
    }
    ensure!(
        new.len() == 2,
        "expected the failover and the failback, got {new:#?}"
    );
    ensure!(new[0]["to"]["pool"] == "dc2" && new[0]["by"]["rule"] == "failover-dc2");
    ensure!(new[1]["to"]["pool"] == "dc1" && new[1]["by"]["rule"] == "dc1-primary");
    for r in &new {
        ensure!(
            r["latency_us"].as_u64().is_some(),
            "switch without latency: {r}"
        );
    }
    Ok(())
}

#[test]
fn maintenance_mode_moves_new_connections_at_once() -> Result<()> {
    let _serial = serial();
    if privileged::require_root_and_bpf("maintenance_mode_moves_new_connections_at_once").is_err() {
        return Ok(());
    }
    let lab = Lab::start()?;
    let dc1 = lab.names("dc1");
    // A session opened before the switch, from the client namespace.
    let mut open = lab.topo.client().run(|| -> Result<TcpSession> {
        let mut s = TcpSession::connect(vip_v4(80))?;
        s.echo(b"before\n")?;
        Ok(s)
    })??;
    ensure!(
        dc1.contains(&open.backend().to_owned()),
        "the session before maintenance is on {}",
        open.backend()
    );
    let stream = Stream::start(lab.topo.client(), vip_v4(80))?;
    thread::sleep(Duration::from_millis(300));

    let set_at = Instant::now();
    let out = lab.ctl(&["state", "set", "maintenance_mode=true"])?;
    let returned = set_at.elapsed();
    ensure!(
        out.contains("maintenance_mode: set"),
        "state set said {out:?}"
    );
    thread::sleep(Duration::from_millis(700));
    let conns = stream.finish();

    let first_dc2 = first_on(&conns, &lab.names("dc2"), set_at)
        .context("no connection reached dc2 after maintenance_mode=true")?;
    let moved = first_dc2.started - set_at;
    let switched = first_dc2.started + Duration::from_millis(20);
    let (l1, l2, lf) = tally(&conns, &dc1, switched, Instant::now());
    let l1_stale = stale_tuples(&conns, &dc1, switched, Instant::now())?;
    let explain = lab.ctl(&["explain", GROUP])?;
    let records = lab.decisions()?;
    let latest = switches(&records).last().map(|r| (*r).clone());
    println!(
        "maintenance_mode=true: `ctl state set` returned after {:.1} ms; first new connection \
         on dc2 at +{:.1} ms (stable_for {:.0} ms); after: {l1} on dc1 ({l1_stale} on a reused \
         5-tuple), {l2} on dc2, {lf} failed; switch {}\n{explain}",
        ms(returned),
        ms(moved),
        ms(STABLE_FOR),
        latest.as_ref().map(Value::to_string).unwrap_or_default()
    );
    // The command itself is a process start and an HTTP call; the switch follows stable_for.
    let bound = Duration::from_millis(300);
    ensure!(
        moved <= bound,
        "new connections moved to dc2 only after {:.1} ms",
        ms(moved)
    );
    ensure!(l1 <= 3 && l2 > 0 && lf == 0, "after: {l1}/{l2}/{lf}");
    ensure!(
        explain.contains("maintenance_mode = true") && explain.contains("active pool=dc2"),
        "explain:\n{explain}"
    );
    let latest = latest.context("no switch recorded")?;
    ensure!(
        latest["to"]["pool"] == "dc2"
            && latest["by"]["rule"] == "failover-dc2"
            && latest["values"]["maintenance_mode"] == "true",
        "latest switch: {latest}"
    );

    // The established session on dc1 keeps its backend.
    let backend = open.backend().to_owned();
    open.echo(b"after the switch\n")
        .with_context(|| format!("the session on {backend} broke after the switch"))?;
    open.finish()?;
    Ok(())
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one table of bad inputs, then what stayed"
)]
fn bad_ctl_input_is_a_clear_error_and_changes_nothing() -> Result<()> {
    let _serial = serial();
    if privileged::require_root_and_bpf("bad_ctl_input_is_a_clear_error").is_err() {
        return Ok(());
    }
    let lab = Lab::start()?;
    // dc2 loses every backend: an override to it fails `require`.
    lab.servers[2].set_healthy(false);
    lab.servers[3].set_healthy(false);
    lab.agent.wait_for(Duration::from_secs(3), |s| {
        s.pools
            .iter()
            .find(|p| p.name == "dc2")
            .is_some_and(|p| p.backends.iter().all(|b| !b.healthy))
    })?;
    let before = lab.decisions()?;
    let before_switches = switches(&before).len();

    let cases: [(&[&str], &[&str]); 8] = [
        (
            &["state", "set", "dc1_api_healthy=false"],
            &["dc1_api_healthy", "probe"],
        ),
        (
            &["state", "set", "maintenance_mode=3"],
            &["maintenance_mode", "bool"],
        ),
        (
            &[
                "override", "set", GROUP, "--to", "pool=dc2", "--reason", "test",
            ],
            &["require"],
        ),
        (
            &[
                "override",
                "set",
                "web-failvoer",
                "--to",
                "pool=dc2",
                "--reason",
                "test",
            ],
            &["web-failvoer"],
        ),
        (&["explain", "no-such-group"], &["no-such-group"]),
        // A pool of the other address family: the service's packets cannot go there.
        (
            &[
                "override", "set", GROUP, "--to", "pool=v6", "--reason", "test", "--force",
            ],
            &["v6", "IPv6", "web"],
        ),
        (
            &[
                "override",
                "set",
                GROUP,
                "--to",
                "split=dc1:50,v6:50",
                "--reason",
                "test",
                "--force",
            ],
            &["v6", "IPv6"],
        ),
        (
            &[
                "override",
                "set",
                GROUP,
                "--to",
                "split=dc1:0,dc2:100",
                "--reason",
                "test",
            ],
            &["at least 1"],
        ),
    ];
    for (args, needles) in cases {
        let err = match lab.ctl(args) {
            Ok(out) => bail!("`ctl {}` succeeded: {out}", args.join(" ")),
            Err(e) => format!("{e:#}"),
        };
        println!("ctl {}: {}", args.join(" "), err.trim());
        for needle in needles {
            ensure!(
                err.contains(needle),
                "`ctl {}`: the error does not mention {needle:?}: {err}",
                args.join(" ")
            );
        }
    }
    let after = lab.decisions()?;
    ensure!(
        switches(&after).len() == before_switches,
        "a refused command switched: {after:#?}"
    );
    let e = lab.explain()?;
    ensure!(
        active_pool(&e) == Some("dc1".into()) && e["explanation"]["override"].is_null(),
        "the group changed: {}",
        e["text"]
    );
    let state = lab.ctl(&["state", "get"])?;
    ensure!(
        state
            .lines()
            .any(|l| l.starts_with("maintenance_mode") && l.trim_end().ends_with("false")),
        "maintenance_mode changed:\n{state}"
    );
    Ok(())
}

#[test]
fn an_override_wins_and_expires() -> Result<()> {
    let _serial = serial();
    if privileged::require_root_and_bpf("an_override_wins_and_expires").is_err() {
        return Ok(());
    }
    let lab = Lab::start()?;
    let dc1 = lab.names("dc1");
    let stream = Stream::start(lab.topo.client(), vip_v4(80))?;
    thread::sleep(Duration::from_millis(300));
    let set_at = Instant::now();
    let out = lab.ctl(&[
        "override", "set", GROUP, "--to", "pool=dc2", "--ttl", "2s", "--reason", "test",
    ])?;
    println!("override set: {out}");
    let explain = lab.ctl(&["explain", GROUP])?;
    println!("{explain}");
    ensure!(
        explain.contains("override pool=dc2") && explain.contains("test"),
        "explain under the override:\n{explain}"
    );
    let (_, expired) = lab.wait_explain(Duration::from_secs(5), |e| {
        active_pool(e) == Some("dc1".into())
    })?;
    thread::sleep(Duration::from_millis(500));
    let conns = stream.finish();
    let first_dc2 = first_on(&conns, &lab.names("dc2"), set_at)
        .context("no connection reached dc2 under the override")?;
    let first_back = first_on(&conns, &dc1, first_dc2.started + Duration::from_millis(1))
        .context("no connection returned to dc1 after the override expired")?;
    println!(
        "override: first connection on dc2 +{:.1} ms after `override set`; back on dc1 at \
         +{:.1} ms (ttl 2 s; explain showed dc1 by +{:.1} ms)",
        ms(first_dc2.started - set_at),
        ms(first_back.started - set_at),
        ms(expired - set_at)
    );
    ensure!(first_dc2.started - set_at <= Duration::from_millis(300));
    let back = first_back.started - set_at;
    ensure!(
        back + CLOCK_SLACK >= Duration::from_secs(2) && back <= Duration::from_millis(2600),
        "back on dc1 after {:.1} ms",
        ms(back)
    );
    let records = lab.decisions()?;
    ensure!(
        records.iter().any(|r| r["kind"] == "override_expired"),
        "no override_expired record: {records:#?}"
    );
    Ok(())
}
