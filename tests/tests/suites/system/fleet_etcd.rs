//! The fleet's etcd side against a real etcd member in a test namespace.
//!
//! - TLS: a member serving only `https://` and asking every client for a certificate
//!   (`--client-cert-auth`), its certificates made with the `openssl` commands the README gives
//!   operators, and a real `switchyard attach` whose `fleet.tls` names the CA, its client
//!   certificate and key. The node connects, leads its decision group and records itself
//!   (`switchyard fleet status` reads it back over TLS); started again with a certificate of
//!   another CA, it is refused, says `stale since …`, and keeps its maps (its decision word is
//!   still there).
//! - Fencing: the election and publication transactions the agent sends
//!   (`switchyard::fleet::{campaign_txn, publish_txn}`), run for two nodes: a leader whose lease
//!   expired (a paused process) publishes after its successor was elected, and again after it
//!   was elected anew itself; etcd refuses both writes, and the successor's decision stays.
//! - The shared config's compare-and-set (`config_txn`): of two nodes writing against the same
//!   revision, the second is refused and told the revision now.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use etcd_client::{Client, TxnOpResponse};
use router_tests::{
    addrs::{VIP_V4, backend_v4},
    agent::{Agent, temp_dir, unique_pin_path},
    netns::{Netns, Topology},
    privileged,
};
use rules::engine::Action;
use serde_json::Value;
use switchyard::fleet::{
    Chooser, Keys, PublishedDecision, SharedConfig, campaign_txn, config_txn, publish_txn,
};

/// The etcd member's address, on the lb namespace's loopback.
const ETCD_IP: &str = "198.19.99.1";

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("openssl")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A CA `NAME.pem` (key `NAME-key.pem`) in `dir`, as the README makes it.
fn ca(dir: &Path, name: &str) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    )
}

/// A certificate `NAME.pem` (key `NAME-key.pem`) signed by the CA `ca`, with the extensions
/// `ext` (an openssl extension file's text).
fn issue(dir: &Path, ca: &str, name: &str, ext: &str) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    )?;
    std::fs::write(dir.join(format!("{name}.ext")), ext)?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}-key.pem"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    )
}

/// The etcd member, killed and its data removed on drop.
struct Member {
    child: Child,
    dir: PathBuf,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Member {
    /// Starts a member on `ETCD_IP` in `ns` (its data on tmpfs, named after `tag`): plain
    /// HTTP, or with `pki` HTTPS only with `etcd.pem` and client certificates of `ca.pem`.
    fn start(ns: &Netns, tag: &str, pki: Option<&Path>) -> Result<Self> {
        let dir = PathBuf::from(format!("/dev/shm/switchyard-etcd-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let log = std::fs::File::create(dir.join("log"))?;
        let client = if pki.is_some() { "https" } else { "http" };
        let url = |port: u16, scheme: &str| format!("{scheme}://{ETCD_IP}:{port}");
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", ns.path().display()))
            .arg("etcd")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &url(2379, client)])
            .args(["--advertise-client-urls", &url(2379, client)])
            .args(["--listen-peer-urls", &url(2380, "http")])
            .args(["--initial-advertise-peer-urls", &url(2380, "http")])
            .args([
                "--initial-cluster",
                &format!("default={}", url(2380, "http")),
            ]);
        if let Some(pki) = pki {
            cmd.arg("--cert-file")
                .arg(pki.join("etcd.pem"))
                .arg("--key-file")
                .arg(pki.join("etcd-key.pem"))
                .arg("--trusted-ca-file")
                .arg(pki.join("ca.pem"))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting etcd (apt package etcd-server, installed by xtask/setup.sh)")?;
        Ok(Self { child, dir })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }
}

/// The node's config: one decision group `G` over `dc1` (backend 1) and `dc2` (backend 2, while
/// the pushed `use_dc2`), and
/// `fleet.tls` with the client certificate `client`; its maps pinned at `pin`.
fn config(pki: &Path, client: &str, pin: &str) -> String {
    let file = |name: &str| pki.join(name).display().to_string();
    format!(
        r#"agent:
  pin_path: {pin}
fleet:
  node: lb1
  endpoints: ["{ETCD_IP}:2379"]
  lease_ttl: 1s
  tls:
    ca: {ca}
    cert: {cert}
    key: {key}
services:
  - {{ name: web, vip: "{VIP_V4}", port: 80, protocol: tcp, forward: dsr-l2, to: {{ decide: G }} }}
pools:
  - {{ name: dc1, backends: [ {{ address: "{b1}" }} ] }}
  - {{ name: dc2, backends: [ {{ address: "{b2}" }} ] }}
state:
  use_dc2: {{ push: {{ default: false }} }}
decisions:
  - name: G
    rules:
      - {{ id: to-dc2, priority: 100, when: use_dc2, then: {{ pool: dc2 }} }}
    default: {{ pool: dc1 }}
"#,
        ca = file("ca.pem"),
        cert = file(&format!("{client}.pem")),
        key = file(&format!("{client}-key.pem")),
        b1 = backend_v4(1),
        b2 = backend_v4(2),
    )
}

/// The agent's pinned `DECISIONS` map, dumped by bpftool (pins are the host's, not the
/// namespace's).
fn decisions(agent: &Agent) -> Result<String> {
    let map = agent.pin_dir().join("DECISIONS");
    let out = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(&map)
        .output()?;
    ensure!(out.status.success(), "bpftool map dump {}", map.display());
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn fleet_status(agent: &Agent) -> Result<Value> {
    Ok(serde_json::from_str::<Value>(&agent.api_get("/status")?)?
        .get("fleet")
        .cloned()
        .unwrap_or(Value::Null))
}

/// Polls `pred` over the agent's `fleet` status for up to `limit`.
fn wait_fleet(agent: &Agent, limit: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value> {
    let start = std::time::Instant::now();
    loop {
        let status = fleet_status(agent)?;
        if pred(&status) {
            return Ok(status);
        }
        if start.elapsed() > limit {
            bail!(
                "fleet status {status} after {limit:?}\n{}",
                agent.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_node_reaches_etcd_over_tls_with_its_certificate_and_is_refused_with_another_cas() -> Result<()>
{
    if privileged::require_root_and_bpf("fleet_tls").is_err()
        || privileged::require("fleet_tls", &["etcd", "openssl", "bpftool"]).is_err()
    {
        return Ok(());
    }
    let pki = temp_dir("pki")?;
    ca(&pki, "ca")?;
    issue(
        &pki,
        "ca",
        "etcd",
        &format!("subjectAltName=IP:{ETCD_IP}\nextendedKeyUsage=serverAuth\n"),
    )?;
    issue(&pki, "ca", "lb1", "extendedKeyUsage=clientAuth\n")?;
    ca(&pki, "other-ca")?;
    issue(
        &pki,
        "other-ca",
        "intruder",
        "extendedKeyUsage=clientAuth\n",
    )?;

    let topo = Topology::builder().backends(2).build()?;
    let lb = topo.lb();
    lb.ip(&["addr", "add", &format!("{ETCD_IP}/32"), "dev", "lo"])?;
    let member = Member::start(lb, topo.tag(), Some(&pki))?;

    let pin = unique_pin_path();
    // Its own certificate: connected, the leader of G, recorded.
    let mut agent = Agent::start(&topo, &[("local.yaml", config(&pki, "lb1", &pin))])?;
    let status = wait_fleet(&agent, Duration::from_secs(20), |f| {
        f["etcd"] == "connected" && f["groups"][0]["role"] == "leader"
    })
    .with_context(|| member.log())?;
    println!("over TLS: {status}");
    let dir = agent.dir().display().to_string();
    let view = agent.cli(&["fleet", "status", "--json", "--config-dir", &dir])?;
    ensure!(view.contains("\"lb1\""), "fleet status over TLS: {view}");
    let word = decisions(&agent)?;
    ensure!(word.contains("key"), "no decision word: {word}");

    // Another CA's certificate: refused by etcd; the node says so and keeps its maps.
    agent.stop()?;
    agent.write_file("local.yaml", &config(&pki, "intruder", &pin))?;
    agent.relaunch()?;
    let status = wait_fleet(&agent, Duration::from_secs(20), |f| {
        f["etcd"]
            .as_str()
            .is_some_and(|s| s.starts_with("stale since"))
    })?;
    println!("with another CA's certificate: {status}");
    let after = decisions(&agent)?;
    ensure!(after == word, "the decision word changed: {word} → {after}");
    drop(agent);
    drop(member);
    let _ = std::fs::remove_dir_all(pki);
    Ok(())
}

/// Node `node`'s decision for group `G`: `pool`, under its election `revision`.
fn decision(node: &str, pool: &str, revision: i64) -> PublishedDecision {
    PublishedDecision {
        action: Action::pool(pool),
        word: 0,
        by: Chooser::Default,
        cause: "fencing test".to_owned(),
        leader: node.to_owned(),
        election_revision: revision,
        decided_at_ns: 0,
        switched_at_ns: 0,
        generation: 1,
    }
}

/// The election and publication transactions of two nodes against a real member: what
/// etcd answers is what the agent acts on (a publication refused ends its leadership).
async fn fencing(keys: Keys) -> Result<()> {
    let endpoint = format!("http://{ETCD_IP}:2379");
    let start = std::time::Instant::now();
    let mut c = loop {
        if let Ok(mut c) = Client::connect([&endpoint], None).await
            && c.status().await.is_ok()
        {
            break c;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(20),
            "etcd does not answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let lease_a = c.lease_grant(60, None).await?.id();
    let lease_b = c.lease_grant(60, None).await?.id();
    let elect = |r: &etcd_client::TxnResponse| {
        r.succeeded()
            .then(|| r.header().map_or(0, etcd_client::ResponseHeader::revision))
    };
    let published = |c: &mut Client| {
        let key = keys.decision("G");
        let mut c = c.clone();
        async move {
            let got = c.get(key, None).await?;
            let value = got
                .kvs()
                .first()
                .map(|kv| kv.value_str().map(str::to_owned));
            anyhow::Ok(value.transpose()?)
        }
    };

    let a1 = elect(&c.txn(campaign_txn(&keys, "lb1", "G", lease_a)).await?)
        .context("lb1 is not elected in an empty store")?;
    ensure!(
        elect(&c.txn(campaign_txn(&keys, "lb2", "G", lease_b)).await?).is_none(),
        "lb2 elected while lb1 leads"
    );
    ensure!(
        c.txn(publish_txn(&keys, "lb1", "G", &decision("lb1", "dc1", a1)))
            .await?
            .succeeded(),
        "the leader's decision is refused"
    );

    // lb1 pauses past its lease: the election key goes with it, lb2 is elected and publishes.
    c.lease_revoke(lease_a).await?;
    let b = elect(&c.txn(campaign_txn(&keys, "lb2", "G", lease_b)).await?)
        .context("lb2 is not elected once lb1's lease is gone")?;
    ensure!(
        c.txn(publish_txn(&keys, "lb2", "G", &decision("lb2", "dc2", b)))
            .await?
            .succeeded()
    );
    let theirs = published(&mut c).await?;

    // lb1 wakes up and publishes what it decided before the pause: refused, and the answer
    // names the leader now.
    let stale = c
        .txn(publish_txn(&keys, "lb1", "G", &decision("lb1", "dc1", a1)))
        .await?;
    ensure!(!stale.succeeded(), "a stale leader's decision was written");
    let holder = stale.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    });
    ensure!(holder.as_deref() == Some(b"lb2".as_slice()), "{holder:?}");
    ensure!(
        published(&mut c).await? == theirs,
        "the successor's decision changed"
    );

    // lb2 resigns and lb1 is elected again: the key names lb1 once more, but a decision carrying
    // its first election's token is still refused; one under its new token passes.
    c.lease_revoke(lease_b).await?;
    let lease_a2 = c.lease_grant(60, None).await?.id();
    let a2 = elect(&c.txn(campaign_txn(&keys, "lb1", "G", lease_a2)).await?)
        .context("lb1 is not elected again")?;
    ensure!(a2 != a1);
    let old_token = c
        .txn(publish_txn(&keys, "lb1", "G", &decision("lb1", "dc1", a1)))
        .await?;
    ensure!(
        !old_token.succeeded() && published(&mut c).await? == theirs,
        "a decision under an ended election's token was written"
    );
    ensure!(
        c.txn(publish_txn(&keys, "lb1", "G", &decision("lb1", "dc1", a2)))
            .await?
            .succeeded()
    );
    println!("fencing: elections at revisions {a1}, {b}, {a2}; both stale publications refused");
    shared_config_compare_and_set(&mut c, &keys).await
}

/// The write of the fleet's shared config (`config_txn`): two nodes that both saw no shared
/// config write theirs; the first wins, the second is refused and told the revision now, and
/// written again against that revision it passes.
async fn shared_config_compare_and_set(c: &mut Client, keys: &Keys) -> Result<()> {
    let doc = |node: &str, text: &str| SharedConfig {
        files: vec![("10-web.yaml".to_owned(), text.to_owned())],
        hash: text.to_owned(),
        written_by: node.to_owned(),
        written_at_ns: 1,
        source: "ctl apply".to_owned(),
    };
    let written_by = |c: &mut Client| {
        let key = keys.config();
        let mut c = c.clone();
        async move {
            let got = c.get(key, None).await?;
            let kv = got.kvs().first().context("no shared config")?;
            let d: SharedConfig = serde_json::from_slice(kv.value())?;
            anyhow::Ok((kv.mod_revision(), d.written_by))
        }
    };
    let first = c.txn(config_txn(keys, &doc("lb1", "a"), 0)).await?;
    ensure!(first.succeeded(), "the first shared config is refused");
    let lost = c.txn(config_txn(keys, &doc("lb2", "b"), 0)).await?;
    ensure!(!lost.succeeded(), "a write against an old revision passed");
    let (rev, by) = written_by(c).await?;
    ensure!(
        by == "lb1",
        "the winner's shared config was overwritten by {by}"
    );
    let told = lost.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(etcd_client::KeyValue::mod_revision),
        _ => None,
    });
    ensure!(
        told == Some(rev),
        "the refusal names revision {told:?}, not {rev}"
    );
    let again = c.txn(config_txn(keys, &doc("lb2", "b"), rev)).await?;
    ensure!(
        again.succeeded(),
        "a write against the current revision is refused"
    );
    ensure!(written_by(c).await?.1 == "lb2");
    println!("shared config: a write against revision 0 after revision {rev} refused");
    Ok(())
}

#[test]
fn a_stale_leaders_decision_is_refused_by_its_election_token() -> Result<()> {
    if privileged::require("fleet_fencing", &["etcd"]).is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let lb = topo.lb();
    lb.ip(&["addr", "add", &format!("{ETCD_IP}/32"), "dev", "lo"])?;
    lb.ip(&["link", "set", "lo", "up"])?;
    let member = Member::start(lb, topo.tag(), None)?;
    let keys = Keys::new("/switchyard/fencing");
    let run = lb.spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(fencing(keys)))
    })?;
    run.join()
        .map_err(|_| anyhow::anyhow!("the fencing thread panicked"))?
        .with_context(|| member.log())
}
