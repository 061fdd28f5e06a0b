//! The agent's API and the CLI that reaches it: status and ctl find an agent on a non-default API
//! while a fragment is broken; bad requests are 4xx answers (or `ctl` errors) that change
//! nothing.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::LB_CLIENT_IF,
    agent::{API, Agent},
    config_text::web_pool,
    netns::Topology,
    privileged,
};

use crate::common::{BROKEN, Lb, broken_errors, consistent, ctl, serves, web};

#[test]
fn status_and_ctl_reach_an_agent_on_a_non_default_api_while_a_fragment_is_broken() -> Result<()> {
    if privileged::require_root_and_bpf("status_reaches_an_agent_on_a_non_default_api").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let cfg = web_pool(1)
        .text()
        .replacen("agent:\n", "agent:\n  api: 127.0.0.1:9911\n", 1);
    let mut agent = Agent::start(&topo, &[("10-web.yaml", cfg)])?;
    let record = switchyard::record::record_path(
        std::path::Path::new(switchyard::record::RUN_DIR),
        agent.dir(),
    );
    let text = std::fs::read_to_string(&record)
        .with_context(|| format!("no record at {}", record.display()))?;
    println!("{}: {text}", record.display());
    ensure!(text.contains("\"api\":\"127.0.0.1:9911\""), "{text}");

    // A second agent for the same directory, started in another namespace (so its API binds),
    // is refused by the pin-directory lock before it records anything: the running agent's
    // record stays.
    let other = Topology::builder().backends(1).build()?;
    let refused = std::process::Command::new("nsenter")
        .arg(format!("--net={}", other.lb().path().display()))
        .arg(router_tests::agent::binary()?)
        .args(["attach", "--iface", LB_CLIENT_IF, "--config-dir"])
        .arg(agent.dir())
        .stdin(std::process::Stdio::null())
        .output()?;
    ensure!(
        !refused.status.success(),
        "a second agent for the same directory started"
    );
    ensure!(
        std::fs::read_to_string(&record).ok().as_deref() == Some(text.as_str()),
        "the refused agent replaced or removed the running one's record: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    drop(other);

    agent.write_file("20-broken.yaml", BROKEN)?;
    agent.reload()?;
    // The directory no longer parses, so its `agent.api` is unknown to the CLI: the answer can
    // only come through the agent's record.
    agent.wait_for(Duration::from_secs(5), |s| s.rejected.is_some())?;
    let dir = agent.dir().display().to_string();
    let human = agent.cli(&["status", "--config-dir", &dir])?;
    print!("{human}");
    ensure!(
        human.contains("the last change was rejected"),
        "`switchyard status` does not show the rejection:\n{human}"
    );
    for error in broken_errors("20-broken.yaml") {
        ensure!(human.contains(&error), "status lacks {error:?}:\n{human}");
    }
    let versions = agent.cli(&["ctl", "--config-dir", &dir, "versions"])?;
    print!("{versions}");
    ensure!(
        versions.lines().any(|l| l.starts_with('*')),
        "ctl versions marks no running version"
    );

    // An orderly exit removes the record; status then says where it looked.
    agent.stop()?;
    ensure!(!record.exists(), "the record outlived the agent");
    let gone = agent
        .cli(&["status", "--config-dir", &dir])
        .err()
        .context("status answered without an agent")?;
    println!("without the agent: {gone:#}");
    ensure!(format!("{gone:#}").contains("from the default address"));
    Ok(())
}

/// One request on the agent's API from inside the lb namespace: status code and body. The
/// body is sent whole even if the server answers early (the write error is ignored).
fn http(topo: &Topology, method: &str, path: &str, body: Vec<u8>) -> Result<(u16, String)> {
    let addr: SocketAddr = API.parse()?;
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    topo.lb().run(move || -> Result<(u16, String)> {
        let timeout = Duration::from_secs(5);
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(head.as_bytes())?;
        let _ = stream.write_all(&body);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let code = answer
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("no status line in {answer:?}"))?;
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((code, body))
    })?
}

/// Bad numbers, wrong methods, broken and huge bodies on the API and through `ctl`: each is a
/// 4xx answer (or a `ctl` error), nothing changes, the agent keeps answering.
#[test]
fn bad_api_requests_change_nothing() -> Result<()> {
    let Some(lb) = Lb::start("bad_api_requests", 2, |pin| web(pin, "web", &[100, 100]))? else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        agent,
        ..
    } = lb;
    let before = agent.status()?;
    for (method, path, body) in [
        ("POST", "/rollback/0", Vec::new()),
        ("POST", "/rollback/18446744073709551615", Vec::new()),
        ("POST", "/rollback/99999999999999999999999", Vec::new()),
        ("POST", "/rollback/-1", Vec::new()),
        ("POST", "/rollback/1.5", Vec::new()),
        ("GET", "/versions/0", Vec::new()),
        ("GET", "/versions/9223372036854775808", Vec::new()),
        ("GET", "/diff/1/999", Vec::new()),
        ("GET", "/diff/0/0", Vec::new()),
        ("GET", "/diff/x/1", Vec::new()),
        ("GET", "/apply", Vec::new()),
        ("PUT", "/apply", Vec::new()),
        ("DELETE", "/versions", Vec::new()),
        ("POST", "/state", b"{".to_vec()),
        ("POST", "/state", vec![b' '; 8 << 20]),
        ("POST", "/override", b"{\"group\":1}".to_vec()),
        ("GET", "/explain/%00", Vec::new()),
    ] {
        let (code, answer) = http(&topo, method, path, body)?;
        ensure!(
            (400..500).contains(&code),
            "{method} {path}: {code} {answer}"
        );
    }
    for args in [
        vec!["rollback", "0"],
        vec!["rollback", "18446744073709551615"],
        vec!["diff", "1", "999"],
        vec!["diff", "0", "1"],
    ] {
        let e = ctl(&agent, &args)
            .err()
            .with_context(|| format!("{args:?} succeeded"))?;
        ensure!(format!("{e:#}").contains("no version"), "{args:?}: {e:#}");
    }
    // Names the router cannot route: the refusal says so, not that the answer is not JSON.
    for args in [vec!["explain", "a/b"], vec!["override", "clear", "a/b"]] {
        let e = ctl(&agent, &args)
            .err()
            .with_context(|| format!("{args:?} succeeded"))?;
        ensure!(format!("{e:#}").contains("404"), "{args:?}: {e:#}");
    }
    // Rolling back to the running version is not a new version.
    let out = ctl(&agent, &["rollback", "1"])?;
    ensure!(out.contains("unchanged"), "{out}");
    // `--json`, before or after the command, prints the API's answer as it was sent; without
    // it, a table.
    let api = agent.api_get("/versions")?;
    for args in [["--json", "versions"], ["versions", "--json"]] {
        let json = ctl(&agent, &args)?;
        ensure!(
            json.trim_end() == api.trim_end(),
            "{args:?}: {json} ≠ {api}"
        );
    }
    let table = ctl(&agent, &["versions"])?;
    ensure!(table.starts_with("   version  generation"), "{table}");
    let after = agent.status()?;
    ensure!(
        after.generation == before.generation && after.running.version == before.running.version,
        "changed: {before:?} → {after:?}"
    );
    consistent(&agent)?;
    serves(&topo, 5)
}
