//! The whole system in network namespaces — adaptive weights with an agent-check
//! (`pools[].weights.adaptive.agent_check`): an agent on one backend answers `50%`, then
//! `drain`, then `ready 100%`; `ctl weights` shows each answer and the weight the live table
//! holds, and the backend's share of new connections follows: smaller at 50 %, none while
//! drained, back after `ready`.

use std::{
    io::Write as _,
    net::TcpListener,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, vip_v4},
    agent::Agent,
    client,
    config_text::{ConfigText, FAST_HTTP_CHECK, backends_v4},
    netns::Topology,
    privileged, servers,
};
use switchyard::api::weights::PoolWeightsView;

/// The agent's port on the backend.
const AGENT_PORT: u16 = 8500;

fn config() -> String {
    ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&[100, 100]), Some(FAST_HTTP_CHECK))
        .text()
        .replace(
            &format!("    health_check: {FAST_HTTP_CHECK}\n"),
            &format!(
                "    health_check: {FAST_HTTP_CHECK}\n    weights:\n      adaptive: {{ alpha: \
                 0.5, beta: 0.1, gamma: 0, delta: 0.4, interval: 1s, smoothing: 0, \
                 max_decrease_per_second: 10, window: 5s, agent_check: {{ port: {AGENT_PORT}, \
                 interval: 200ms, timeout: 100ms }} }}\n"
            ),
        )
}

/// An agent that answers every connection with the line `answer` holds.
fn start_agent(topo: &Topology, i: usize, answer: &Arc<Mutex<String>>) -> Result<()> {
    let answer = Arc::clone(answer);
    let listener = topo
        .backend(i)
        .run(|| TcpListener::bind(("0.0.0.0", AGENT_PORT)))?
        .context("bind the agent's port")?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let line = answer.lock().map(|a| a.clone()).unwrap_or_default();
            let _ = writeln!(stream, "{line}");
        }
    });
    Ok(())
}

fn weights(agent: &Agent) -> Result<PoolWeightsView> {
    let body = agent.api_get("/weights/web")?;
    serde_json::from_str(&body).context("GET /weights/web")
}

/// Polls `ctl weights` until backend 0 satisfies `pred`, for at most 10 s.
fn wait_weights(agent: &Agent, what: &str, pred: impl Fn(&PoolWeightsView) -> bool) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v = weights(agent)?;
        if pred(&v) {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "{what}: not within 10 s; last: {v:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_agent_check_lowers_drains_and_restores_a_backends_weight() -> Result<()> {
    if privileged::require_root_and_bpf("an_agent_check_lowers_drains_and_restores").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let servers = servers::start_all(&topo)?;
    let answer = Arc::new(Mutex::new("up ready 100%".to_owned()));
    start_agent(&topo, 1, &answer)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", config())])?;
    let first = servers[0].name().to_owned();

    // 50 %: 100·(0.5 + 0.1 + 0.4·0.5) = 80 against 100.
    *answer.lock().unwrap() = "50%".to_owned();
    wait_weights(&agent, "50% in the live table", |v| {
        v.backends[0].agent_score == Some(0.5) && v.backends[0].effective == Some(80)
    })?;
    let dir = agent.config_dir.display().to_string();
    let text = agent.cli(&["ctl", "--config-dir", &dir, "weights", "web"])?;
    ensure!(
        text.contains("\"50%\""),
        "ctl weights shows the answer:\n{text}"
    );
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 200)?;
    let share = tally.get(&first).copied().unwrap_or(0);
    ensure!(
        (60..=120).contains(&share),
        "at 80 against 100, {first} takes about 89 of 200 new connections: {tally:?}"
    );

    // drain: out of the table at once, no new connections.
    *answer.lock().unwrap() = "drain".to_owned();
    wait_weights(&agent, "drained", |v| {
        v.backends[0].agent_state == "drain" && v.backends[0].effective.is_none()
    })?;
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 60)?;
    ensure!(
        tally.get(&first).copied().unwrap_or(0) == 0,
        "a drained backend takes no new connection: {tally:?}"
    );

    // ready 100%: back at its full weight.
    *answer.lock().unwrap() = "ready 100%".to_owned();
    wait_weights(&agent, "back", |v| v.backends[0].effective == Some(100))?;
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 200)?;
    let share = tally.get(&first).copied().unwrap_or(0);
    ensure!(
        (70..=130).contains(&share),
        "back at 100 against 100, {first} takes about half: {tally:?}"
    );
    Ok(())
}
