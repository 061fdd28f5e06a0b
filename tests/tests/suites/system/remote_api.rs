//! The API beyond loopback, all real: an agent whose `agent.api` is the lb's address on the
//! client's link and whose `agent.api_token_file` holds a token, asked from the client
//! namespace over TCP. Without the token, or with another, every endpoint answers `401` and
//! changes nothing (the generation stays); with it, it answers; `switchyard status` and `ctl`
//! read the token from the config directory. With `api_open_read`, reads are open and a change
//! still needs the token.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_SIDE_V4, VIP_V4},
    agent::{Agent, temp_dir},
    config_text::{ConfigText, backends_v4},
    netns::{Netns, Topology},
    privileged,
};

const TOKEN: &str = "5b0e6c1f3d9a4e27b8c2f1a0d6e4b3c9";

/// `METHOD PATH` to `addr` from `ns`, with `Authorization: Bearer TOKEN` when `token`; the
/// status code and the body.
fn request(
    ns: &Netns,
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String)> {
    let (method, path) = (method.to_owned(), path.to_owned());
    let token = token.map(str::to_owned);
    ns.run(move || -> Result<(u16, String)> {
        let timeout = Duration::from_secs(3);
        let mut s = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connect to {addr}"))?;
        s.set_read_timeout(Some(timeout))?;
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: 2\r\n\r\n{{}}"
        )?;
        let mut response = String::new();
        s.read_to_string(&mut response)?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .context("malformed answer")?;
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .context("no status code")?;
        Ok((code, body.to_owned()))
    })?
}

fn config(token_file: &std::path::Path, open_read: bool, pin: &str) -> String {
    let text = ConfigText::at_pin_path(pin)
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&[100, 100]), None)
        .text();
    text.replacen(
        "agent:\n",
        &format!(
            "agent:\n  api: {LB_CLIENT_SIDE_V4}:9900\n  api_token_file: {}\n  api_open_read: \
             {open_read}\n",
            token_file.display()
        ),
        1,
    )
}

#[test]
fn a_remote_api_answers_its_token_only_and_open_reads_when_asked() -> Result<()> {
    if privileged::require_root_and_bpf("remote_api").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let dir = temp_dir("token")?;
    let token_file = dir.join("api.token");
    std::fs::write(&token_file, format!("{TOKEN}\n"))?;
    // As the README tells the operator: the token file is the owner's alone.
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    let pin = router_tests::agent::unique_pin_path();
    // `status` from the harness reads the token from the config directory.
    let mut agent = Agent::start(&topo, &[("10-web.yaml", config(&token_file, false, &pin))])?;
    let addr = SocketAddr::from((LB_CLIENT_SIDE_V4, 9900));
    let client = topo.client();
    let generation = agent.status()?.generation;

    for path in ["/status", "/metrics", "/versions"] {
        let (code, body) = request(client, addr, "GET", path, None)?;
        ensure!(code == 401, "GET {path} without a token: {code} {body}");
        let (code, _) = request(client, addr, "GET", path, Some("not-the-token-at-all"))?;
        ensure!(code == 401, "GET {path} with another token: {code}");
        let (code, _) = request(client, addr, "GET", path, Some(TOKEN))?;
        ensure!(code == 200, "GET {path} with the token: {code}");
    }
    let (code, body) = request(client, addr, "POST", "/apply", None)?;
    ensure!(code == 401, "POST /apply without a token: {code} {body}");
    ensure!(body.contains("bearer token"), "{body}");
    ensure!(
        agent.status()?.generation == generation,
        "a refused apply changed the config"
    );
    let state = agent.cli(&[
        "ctl",
        "state",
        "get",
        "--config-dir",
        &agent.dir().display().to_string(),
    ])?;
    println!("ctl with the token: {state:?}");

    // Open reads: a GET needs no token, a change still does.
    agent.stop()?;
    agent.write_file("10-web.yaml", &config(&token_file, true, &pin))?;
    agent.relaunch()?;
    let (code, _) = request(client, addr, "GET", "/metrics", None)?;
    ensure!(code == 200, "GET /metrics with open reads: {code}");
    let (code, _) = request(client, addr, "POST", "/apply", None)?;
    ensure!(code == 401, "POST /apply with open reads, no token: {code}");
    drop(agent);
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
