//! Attacks on the config lifecycle: the one apply path, the directory watch, the
//! history store, versions/diff/rollback, resuming the pinned maps on restart, and `upgrade`,
//! each pushed where an operator's (or a script's) mistakes push it. Every test says what it
//! attacks and what must hold afterwards: the agent answers, the running config and the maps
//! agree, and traffic still flows.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::fs::symlink,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, VIP_V4, backend_v4, lb_backend_if, vip_v4},
    agent::{API, Agent, unique_pin_path},
    client,
    netns::Topology,
    privileged, servers,
};
use switchyard::dataplane::maps::KernelMaps;

/// How long a change may take to be live (debounce 200 ms + one apply, wide margin).
const LIMIT: Duration = Duration::from_secs(5);

/// One fragment: the TCP service `web` on the IPv4 VIP over pool `pool` of backends
/// `1..=weights.len()` with `weights`, under pin path `pin`.
fn web(pin: &str, pool: &str, weights: &[u32]) -> String {
    let mut text = format!(
        "agent:\n  pin_path: {pin}\nservices:\n  - {{ name: web, vip: \"{VIP_V4}\", port: 80, \
         protocol: tcp, forward: dsr-l2, to: {{ pool: {pool} }} }}\npools:\n  - name: {pool}\n    \
         backends:\n"
    );
    for (i, w) in weights.iter().enumerate() {
        text += &format!(
            "      - {{ address: \"{}\", weight: {w} }}\n",
            backend_v4(i + 1)
        );
    }
    text
}

/// A second fragment: a UDP service on the same VIP over the `web` pool.
const DNS: &str = "services:
  - { name: dns, vip: 198.18.0.10, port: 80, protocol: udp, forward: dsr-l2, to: { pool: web } }
";

fn skip(name: &str) -> bool {
    privileged::require_root_and_bpf(name).is_err()
}

/// `n` TCP connections through the VIP all succeed.
fn serves(topo: &Topology, n: usize) -> Result<()> {
    let tally = client::tcp_tally(topo.client(), vip_v4(80), n)?;
    ensure!(client::total(&tally) == n, "{tally:?}");
    Ok(())
}

/// The agent's view and the maps agree: the generation in `CONFIG` is the one `status`
/// reports, and `SERVICES` holds as many services as the running config.
fn consistent(agent: &Agent) -> Result<()> {
    let status = agent.status()?;
    let maps = KernelMaps::open_pinned(&agent.pin_dir())?;
    let config = maps.config()?;
    ensure!(
        config.generation == status.generation,
        "maps at generation {}, status says {}",
        config.generation,
        status.generation
    );
    ensure!(
        maps.services().len() == status.services.len(),
        "maps hold {} services, status lists {:?}",
        maps.services().len(),
        status.services
    );
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

fn dir_arg(agent: &Agent) -> String {
    agent.dir().display().to_string()
}

/// `switchyard ctl --config-dir DIR ARGS…`: its stdout, or its stderr as the error.
fn ctl(agent: &Agent, args: &[&str]) -> Result<String> {
    let dir = dir_arg(agent);
    let mut full = vec!["ctl", "--config-dir", dir.as_str()];
    full.extend_from_slice(args);
    agent.cli(&full)
}

/// A metric's value from `/metrics` (0 when absent).
fn metric(agent: &Agent, name: &str) -> Result<f64> {
    let text = agent.api_get("/metrics")?;
    Ok(text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0))
}

// ---------------------------------------------------------------------------------------------
// The directory watch
// ---------------------------------------------------------------------------------------------

/// The config directory is deleted while the agent runs (a `rm -rf` and re-provisioning by a
/// configuration manager), then created again with a changed config. The deletion must be a
/// rejected change (the running config stays, `status` says why), and the new directory must be
/// watched again: its change applies without a signal.
#[test]
fn a_deleted_and_recreated_config_directory_is_watched_again() -> Result<()> {
    if skip("a_deleted_and_recreated_config_directory") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let first = agent.status()?.generation;

    fs::remove_dir_all(agent.dir())?;
    agent
        .wait_for(LIMIT, |s| {
            s.rejected
                .as_deref()
                .is_some_and(|r| r.contains("cannot read the configuration directory"))
        })
        .context("the deleted directory is not reported")?;
    let status = agent.status()?;
    ensure!(status.generation == first, "something was applied");
    ensure!(
        status.differs_from_files.is_none(),
        "{:?}",
        status.differs_from_files
    );
    serves(&topo, 10)?;

    fs::create_dir(agent.dir())?;
    agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 100]))?;
    agent.write_file("20-dns.yaml", DNS)?;
    agent
        .wait_for(LIMIT, |s| s.generation > first && s.rejected.is_none())
        .context("the re-created directory's change was not applied by the watch")?;
    let udp = client::udp_tally(topo.client(), vip_v4(80), 10)?;
    ensure!(client::total(&udp) == 10, "{udp:?}");
    consistent(&agent)
}

/// The config directory is renamed away and a new one takes its place (a deploy tool that
/// stages `/etc/switchyard.new` and swaps it in with two renames): the agent must follow the
/// path, not the inode it first watched.
#[test]
fn a_config_directory_swapped_by_renames_is_watched_at_its_path() -> Result<()> {
    if skip("a_config_directory_swapped_by_renames") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let first = agent.status()?.generation;

    let staged = agent.dir().with_extension("new");
    let old = agent.dir().with_extension("old");
    let _ = fs::remove_dir_all(&staged);
    fs::create_dir(&staged)?;
    let state = agent.state_dir();
    let text = router_tests::agent::with_state_dir(&web(&pin, "web", &[100, 100]), &state);
    fs::write(staged.join("10-web.yaml"), &text)?;
    fs::write(staged.join("20-dns.yaml"), DNS)?;
    fs::rename(agent.dir(), &old)?;
    fs::rename(&staged, agent.dir())?;
    let applied = agent.wait_for(LIMIT, |s| s.generation > first && s.rejected.is_none());
    let _ = fs::remove_dir_all(&old);
    applied.context("the swapped-in directory was not applied")?;
    // Let the events of the removal settle, so what follows is seen only by watching the new
    // directory.
    std::thread::sleep(Duration::from_millis(600));

    // And the new one stays watched.
    let second = agent.status()?.generation;
    fs::remove_file(agent.dir().join("20-dns.yaml"))?;
    agent
        .wait_for(LIMIT, |s| s.generation > second && s.services.len() == 1)
        .context("a change in the swapped-in directory was not applied")?;
    consistent(&agent)?;
    serves(&topo, 10)
}

/// Fragments that are not plain text files: a symlink (followed), a dangling symlink, a
/// directory, a FIFO (must not hang the agent), a non-UTF-8 file and one over the size limit.
/// Each bad one is a rejected change with its name; none changes the maps or stops the agent.
#[test]
fn odd_fragment_files_are_rejected_by_name_and_never_hang_the_agent() -> Result<()> {
    if skip("odd_fragment_files") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let dir = agent.dir().to_owned();
    let name = "20-odd.yaml";
    let path = dir.join(name);
    let outside = dir.with_extension("outside.yaml");

    // A symlink to a valid fragment outside the directory is read through.
    fs::write(&outside, DNS)?;
    symlink(&outside, &path)?;
    let g = agent.status()?.generation;
    agent
        .wait_for(LIMIT, |s| s.generation > g && s.services.len() == 2)
        .context("a symlinked fragment")?;
    let good = agent.status()?.generation;

    type Make = fn(&Path, &Path) -> Result<()>;
    let cases: Vec<(&str, Make, &str)> = vec![
        (
            "dangling symlink",
            |p, o| {
                symlink(o.with_extension("gone"), p)?;
                Ok(())
            },
            "No such file",
        ),
        (
            "directory",
            |p, _| {
                fs::create_dir(p)?;
                Ok(())
            },
            "a directory",
        ),
        (
            "FIFO",
            |p, _| {
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())?;
                // SAFETY: mkfifo(3) on a NUL-terminated path.
                ensure!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) } == 0, "mkfifo");
                Ok(())
            },
            "not a regular file",
        ),
        (
            "non-UTF-8",
            |p, _| {
                fs::write(p, b"services: []\n# \xff\xfe\n")?;
                Ok(())
            },
            "UTF-8",
        ),
        (
            "17 MiB",
            |p, _| {
                let f = fs::File::create(p)?;
                f.set_len(17 << 20)?;
                Ok(())
            },
            "larger than 16 MiB",
        ),
    ];
    for (what, make, expect) in cases {
        let _ = fs::remove_file(&path).or_else(|_| fs::remove_dir(&path));
        make(&path, &outside)?;
        let started = Instant::now();
        agent
            .wait_for(LIMIT, |s| {
                s.rejected
                    .as_deref()
                    .is_some_and(|r| r.contains(name) && r.contains(expect))
            })
            .with_context(|| format!("{what}: not rejected with {expect:?}"))?;
        let status = agent.status()?;
        ensure!(status.generation == good, "{what}: applied");
        ensure!(
            started.elapsed() < LIMIT,
            "{what}: took {:?}",
            started.elapsed()
        );
        serves(&topo, 5).with_context(|| what.to_owned())?;
    }
    let _ = fs::remove_file(&path).or_else(|_| fs::remove_dir(&path));
    let _ = fs::remove_file(&outside);
    agent
        .wait_for(LIMIT, |s| s.rejected.is_none() && s.services.len() == 1)
        .context("removing the odd file")?;
    consistent(&agent)
}

/// A fragment written slowly, in two parts with a pause longer than the debounce between them
/// (a `cp` of a large file on a busy disk, `cat > file`, a configuration manager streaming a
/// template). Its first half is valid YAML that drops the service: applying it would cut
/// traffic. The watch must wait until the writer has closed the file.
#[test]
fn a_fragment_still_being_written_is_not_applied_half_written() -> Result<()> {
    if skip("a_fragment_still_being_written") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let first = agent.status()?.generation;
    let full =
        router_tests::agent::with_state_dir(&web(&pin, "web", &[100, 50]), &agent.state_dir());
    let cut = full.find("services:").context("no services")?;
    let mut f = fs::File::create(agent.dir().join("10-web.yaml"))?;
    f.write_all(&full.as_bytes()[..cut])?;
    f.flush()?;
    std::thread::sleep(Duration::from_millis(700));
    let during = agent.status()?;
    f.write_all(&full.as_bytes()[cut..])?;
    drop(f);
    ensure!(
        during.generation == first && during.services.len() == 1,
        "the half-written fragment was applied: generation {first} → {}, services {:?}",
        during.generation,
        during.services
    );
    agent
        .wait_for(LIMIT, |s| {
            s.generation > first && s.differs_from_files == Some(false)
        })
        .context("the whole fragment")?;
    consistent(&agent)?;
    serves(&topo, 10)
}

/// After `ctl rollback`, the running config differs from the files on purpose. Events in the
/// directory that change no fragment — an editor opening a fragment (its swap file), a README
/// — must not apply the files again and so undo the rollback; only a change to the fragments
/// (or `ctl apply`, SIGHUP) does.
#[test]
fn a_rollback_is_not_undone_by_events_that_change_no_fragment() -> Result<()> {
    if skip("a_rollback_is_not_undone") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let g = agent.status()?.generation;
    agent.write_file("20-dns.yaml", DNS)?;
    agent.wait_for(LIMIT, |s| s.generation > g)?;
    let out = ctl(&agent, &["rollback", "1"])?;
    ensure!(out.contains("applied as version 3"), "{out}");
    let rolled = agent.status()?;
    ensure!(rolled.services.len() == 1 && rolled.differs_from_files == Some(true));

    fs::write(agent.dir().join(".20-dns.yaml.swp"), "swap")?;
    fs::write(agent.dir().join("README"), "notes")?;
    fs::remove_file(agent.dir().join(".20-dns.yaml.swp"))?;
    std::thread::sleep(Duration::from_millis(800));
    let status = agent.status()?;
    ensure!(
        status.generation == rolled.generation && status.running.source == "rollback to 1",
        "the rollback was undone by an unrelated event: {:?} at generation {}",
        status.running,
        status.generation
    );

    // A change to a fragment applies the files.
    agent.write_file("20-dns.yaml", &DNS.replace("dns", "dns2"))?;
    agent.wait_for(LIMIT, |s| {
        s.generation > rolled.generation && s.services.len() == 2
    })?;
    consistent(&agent)
}

/// Rapid churn: 40 versions of a fragment written 10–30 ms apart, mixed with SIGHUPs and
/// `ctl apply`s from another thread. Afterwards the running config is the last one written,
/// every recorded version has a higher generation than the one before, the last version is the
/// running one, and the maps carry its generation.
#[test]
fn rapid_churn_with_concurrent_ctl_apply_and_sighup_ends_on_the_last_write() -> Result<()> {
    if skip("rapid_churn") {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(
        &topo,
        &[("10-web.yaml", web(&pin, "web", &[100, 100, 100]))],
    )?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<()> {
        let applier = scope.spawn(|| {
            let mut errors = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Err(e) = ctl(&agent, &["apply"]) {
                    // A half-written file can be rejected; anything else is a failure.
                    let e = format!("{e:#}");
                    if !e.contains("10-web.yaml") {
                        errors.push(e);
                    }
                }
            }
            errors
        });
        for k in 0..40u32 {
            let weights = [100, 1 + (k * 37) % 200, 1 + (k * 11) % 150];
            agent.write_file("10-web.yaml", &web(&pin, "web", &weights))?;
            if k % 5 == 0 {
                agent.reload()?;
            }
            std::thread::sleep(Duration::from_millis(10 + u64::from(k % 3) * 10));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let errors = applier
            .join()
            .map_err(|_| anyhow::anyhow!("applier panicked"))?;
        ensure!(errors.is_empty(), "ctl apply failed: {errors:?}");
        Ok(())
    })?;
    let last = [100, 1 + (39 * 37) % 200, 1 + (39 * 11) % 150];
    // The last write may land after the last read of the directory (`differs_from_files` is
    // as of that read): the watch applies it once the directory has been quiet for its
    // debounce. Its version number shows once the history has recorded it.
    let weights_of = |s: &switchyard::api::status::Status| -> Vec<u32> {
        s.pools[0].backends.iter().map(|b| b.weight).collect()
    };
    agent
        .wait_for(LIMIT, |s| {
            s.differs_from_files == Some(false)
                && s.rejected.is_none()
                && weights_of(s) == last
                && s.running.version.is_some()
        })
        .context("the last write is not the running config")?;
    let status = agent.status()?;
    let weights = weights_of(&status);
    ensure!(weights == last, "{weights:?} != {last:?}");
    let versions: serde_json::Value =
        serde_json::from_str(&agent.api_get("/versions")?).context("/versions")?;
    let list = versions["versions"].as_array().context("versions")?;
    let generations: Vec<u64> = list
        .iter()
        .map(|v| v["generation"].as_u64().unwrap_or(0))
        .collect();
    ensure!(
        generations.windows(2).all(|w| w[0] < w[1]),
        "{generations:?}"
    );
    ensure!(
        generations.last() == Some(&status.generation)
            && versions["running"].as_u64() == list.last().and_then(|v| v["number"].as_u64()),
        "last version {:?} / running {} at generation {}",
        list.last(),
        versions["running"],
        status.generation
    );
    consistent(&agent)?;
    serves(&topo, 10)
}

/// A backend down by its health check, then the health check removed from its pool (an
/// operator forcing the backend back in): nothing probes it any more, so nothing would ever
/// bring it up — a pool without a health check has every backend up.
#[test]
fn removing_a_pools_health_check_brings_its_down_backends_back() -> Result<()> {
    if skip("removing_a_pools_health_check") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let checked = web(&pin, "web", &[100, 100])
        + &format!(
            "    health_check: {}\n",
            router_tests::config_text::FAST_HTTP_CHECK
        );
    let agent = Agent::start(&topo, &[("10-web.yaml", checked)])?;
    let b1 = backend_v4(1).to_string();
    agent.wait_for(LIMIT, |s| Agent::healthy(s, "web", &b1) == Some(true))?;
    servers[0].set_healthy(false);
    agent.wait_for(LIMIT, |s| Agent::healthy(s, "web", &b1) == Some(false))?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 100]))?;
    agent.wait_for(LIMIT, |s| s.generation > g)?;
    std::thread::sleep(Duration::from_millis(500));
    ensure!(
        Agent::healthy(&agent.status()?, "web", &b1) == Some(true),
        "b1 stays down with no health check to bring it up"
    );
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 20)?;
    ensure!(tally.len() == 2, "b1 gets no new flows: {tally:?}");
    consistent(&agent)
}

// ---------------------------------------------------------------------------------------------
// The API and ctl
// ---------------------------------------------------------------------------------------------

/// Bad numbers, wrong methods, broken and huge bodies on the API and through `ctl`: each is a
/// 4xx answer (or a `ctl` error), nothing changes, the agent keeps answering.
#[test]
fn bad_api_requests_change_nothing() -> Result<()> {
    if skip("bad_api_requests") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
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
    let after = agent.status()?;
    ensure!(
        after.generation == before.generation && after.running.version == before.running.version,
        "changed: {before:?} → {after:?}"
    );
    consistent(&agent)?;
    serves(&topo, 5)
}

/// `web` plus a UDP service on port 81 over pool `big` of `n` backends at `10.<net>.x.y` (not
/// reachable; only their slots matter).
fn with_big_pool(pin: &str, net: u8, n: usize) -> String {
    let mut text = web(pin, "web", &[100, 100]);
    text = text.replace(
        "pools:\n",
        "  - { name: bulk, vip: \"198.18.0.10\", port: 81, protocol: udp, forward: dsr-l2, \
         to: { pool: big } }\npools:\n",
    );
    text += "  - name: big\n    backends:\n";
    for i in 0..n {
        text += &format!(
            "      - {{ address: \"10.{net}.{}.{}\", weight: 1 }}\n",
            i / 250,
            1 + i % 250
        );
    }
    text
}

/// A rollback to a version that cannot be published beside the running one: the new backends
/// of the version need more slots than are free while the running ones are held. Refused whole
/// with the reason, the maps unchanged, the running version kept.
#[test]
fn a_rollback_beyond_the_slot_limits_is_refused_and_changes_nothing() -> Result<()> {
    if skip("a_rollback_beyond_the_slot_limits") {
        return Ok(());
    }
    let n = router_common::MAX_BACKENDS as usize / 2 + 100;
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", with_big_pool(&pin, 1, n))])?;
    // Version 2 without the big pool, version 3 with another one as big.
    for (version, text) in [
        (2, web(&pin, "web", &[100, 100])),
        (3, with_big_pool(&pin, 2, n)),
    ] {
        let g = agent.status()?.generation;
        agent.write_file("10-web.yaml", &text)?;
        agent
            .wait_for(Duration::from_secs(20), |s| {
                s.generation > g && s.running.version == Some(version)
            })
            .with_context(|| format!("version {version}"))?;
    }
    let before = agent.status()?;
    let e = ctl(&agent, &["rollback", "1"])
        .err()
        .context("the rollback beyond the limits succeeded")?;
    ensure!(
        format!("{e:#}").contains("not enough free backend slots"),
        "{e:#}"
    );
    let after = agent.status()?;
    ensure!(
        after.generation == before.generation && after.running.version == Some(3),
        "{:?} → {:?}",
        before.running,
        after.running
    );
    // The directory was not what was refused: `status` must not say it was.
    ensure!(
        after.rejected.is_none() && after.differs_from_files == Some(false),
        "status blames the directory: {:?}",
        after.rejected
    );
    consistent(&agent)?;
    serves(&topo, 5)?;
    // Through a version without the big pool, the rollback fits.
    ctl(&agent, &["rollback", "2"])?;
    let out = ctl(&agent, &["rollback", "1"])?;
    ensure!(out.contains("applied as version"), "{out}");
    consistent(&agent)
}

// ---------------------------------------------------------------------------------------------
// Agent settings, history, restart
// ---------------------------------------------------------------------------------------------

/// `agent:` settings change only on restart (the apply says so). A change to `state_dir` in a
/// fragment must not send the running agent's audit log elsewhere: the running agent keeps the
/// directory it started with (its history is open there).
#[test]
fn a_changed_state_dir_is_not_used_before_a_restart() -> Result<()> {
    if skip("a_changed_state_dir") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let first = agent.status()?.generation;
    let elsewhere = agent.dir().with_extension("elsewhere");
    let _ = fs::remove_dir_all(&elsewhere);
    let moved = web(&pin, "web", &[100, 50]).replace(
        &format!("pin_path: {pin}\n"),
        &format!("pin_path: {pin}\n  state_dir: {}\n", elsewhere.display()),
    );
    agent.write_file("10-web.yaml", &moved)?;
    agent.wait_for(LIMIT, |s| s.generation > first)?;
    let created = elsewhere.exists();
    let _ = fs::remove_dir_all(&elsewhere);
    ensure!(
        !created,
        "the running agent started using the new state_dir {} before a restart",
        elsewhere.display()
    );
    ensure!(
        agent.log_text().contains("change only on restart"),
        "{}",
        agent.log_text()
    );
    Ok(())
}

/// The state directory (history store and all) is deleted while the agent runs: applies go on,
/// the failed record is counted and `status` says the version is not recorded; a restart then
/// starts a new history and serves.
#[test]
fn a_history_store_deleted_while_running_is_reported_and_applies_go_on() -> Result<()> {
    if skip("a_history_store_deleted") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let first = agent.status()?.generation;
    fs::remove_dir_all(agent.state_dir())?;
    agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 50]))?;
    agent.wait_for(LIMIT, |s| s.generation > first)?;
    let status = agent.status()?;
    ensure!(status.rejected.is_none(), "{:?}", status.rejected);
    ensure!(
        status.running.version.is_none(),
        "the version claims to be recorded: {:?}",
        status.running
    );
    ensure!(
        metric(&agent, "switchyard_history_errors_total")? >= 1.0,
        "the failed record is not counted"
    );
    let human = agent.cli(&["status", "--config-dir", &dir_arg(&agent)])?;
    ensure!(human.contains("not recorded"), "{human}");
    consistent(&agent)?;
    agent.stop()?;
    agent.relaunch()?;
    consistent(&agent)?;
    serves(&topo, 10)
}

/// `chattr +i` on a directory (the history store's): the next record fails.
struct Immutable<'a>(&'a Path);

impl<'a> Immutable<'a> {
    fn set(dir: &'a Path) -> Result<Self> {
        let ok = Command::new("chattr")
            .arg("+i")
            .arg(dir)
            .status()?
            .success();
        ensure!(ok, "chattr +i {}", dir.display());
        Ok(Self(dir))
    }
}

impl Drop for Immutable<'_> {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(self.0).status();
    }
}

/// An apply whose version could not be recorded (the history's directory is immutable for a
/// moment), then an agent restart with the same config: the maps carry a generation the
/// history never saw. Connections established before must survive the restart, as they do
/// after a recorded apply (`system_lifecycle`'s restart-after-a-pool-change test): renumbering
/// the backend slots moves the flows tracked on them.
#[test]
fn a_restart_after_an_unrecorded_apply_keeps_established_connections() -> Result<()> {
    if skip("a_restart_after_an_unrecorded_apply") {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    // b1 leaves, b3 arrives: [b2, b3] in slots 1 and 2 (a fresh numbering gives 0 and 1).
    let second = web(&pin, "web", &[100, 100])
        .replace(
            &format!("\"{}\"", backend_v4(2)),
            &format!("\"{}\"", backend_v4(3)),
        )
        .replace(
            &format!("\"{}\"", backend_v4(1)),
            &format!("\"{}\"", backend_v4(2)),
        );
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &second)?;
    agent.wait_for(LIMIT, |s| s.generation > g)?;
    let mut sessions = client::tcp_sessions(topo.client(), vip_v4(80), 30)?;
    for (k, s) in sessions.iter_mut().enumerate() {
        s.echo(&client::payload(k, 64))?;
    }
    // A weight change whose record fails.
    let third = second.replace("weight: 100 }\n", "weight: 60 }\n");
    ensure!(third != second);
    let g = agent.status()?.generation;
    let state = agent.state_dir();
    {
        let _frozen = Immutable::set(&state)?;
        agent.write_file("10-web.yaml", &third)?;
        agent.wait_for(LIMIT, |s| s.generation > g)?;
        ensure!(
            agent.status()?.running.version.is_none(),
            "the record did not fail"
        );
    }
    agent.kill()?;
    agent.relaunch()?;
    consistent(&agent)?;
    let mut broken = Vec::new();
    for (k, mut s) in sessions.into_iter().enumerate() {
        let backend = s.backend().to_owned();
        if let Err(e) = s
            .echo(&client::payload(k + 100, 64))
            .and_then(|()| s.finish())
        {
            broken.push(format!("{backend}: {e:#}"));
        }
    }
    ensure!(
        broken.is_empty(),
        "{} of 30 connections broke across the restart: {broken:?}\n{}",
        broken.len(),
        agent.log_text()
    );
    let log = agent.log_text();
    ensure!(!log.contains("renumbered"), "{log}");
    // The start applied the directory over the maps and recorded it.
    let status = agent.status()?;
    ensure!(
        status.running.version.is_some() && status.differs_from_files == Some(false),
        "{:?}",
        status.running
    );
    Ok(())
}

/// SIGKILL at moments around an apply (during the debounce, during the apply, right after),
/// then a restart on the same directory: each time the agent comes back consistent with the
/// maps, runs the directory's config and serves.
#[test]
fn sigkill_around_applies_then_restart_is_consistent() -> Result<()> {
    if skip("sigkill_around_applies") {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let mut agent = Agent::start(
        &topo,
        &[("10-web.yaml", web(&pin, "web", &[100, 100, 100]))],
    )?;
    for (k, delay) in [150u64, 230, 300].into_iter().enumerate() {
        let weights = [100, 40 + 20 * k as u32, 100];
        agent.write_file("10-web.yaml", &web(&pin, "web", &weights))?;
        agent.write_file("20-dns.yaml", if k % 2 == 0 { DNS } else { "" })?;
        std::thread::sleep(Duration::from_millis(delay));
        agent.kill()?;
        agent.relaunch()?;
        agent
            .wait_for(LIMIT, |s| {
                s.differs_from_files == Some(false) && s.rejected.is_none()
            })
            .with_context(|| format!("kill {k} after {delay} ms"))?;
        consistent(&agent).with_context(|| format!("kill {k} after {delay} ms"))?;
        let status = agent.status()?;
        let got: Vec<u32> = status.pools[0].backends.iter().map(|b| b.weight).collect();
        ensure!(got == weights, "kill {k}: {got:?}");
        serves(&topo, 5)?;
    }
    Ok(())
}

/// `detach --keep-maps` while the agent is stopped, then a start: a new link over the kept
/// maps, resumed from the history (no renumbering), the running config unchanged.
#[test]
fn a_start_after_detach_keep_maps_resumes_the_kept_maps() -> Result<()> {
    if skip("a_start_after_detach_keep_maps") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let before = agent.status()?;
    agent.stop()?;
    let dir = dir_arg(&agent);
    for iface in [LB_CLIENT_IF.to_owned(), lb_backend_if(1), lb_backend_if(2)] {
        agent.cli(&[
            "detach",
            "--iface",
            &iface,
            "--keep-maps",
            "--config-dir",
            &dir,
        ])?;
    }
    ensure!(
        KernelMaps::open_pinned(&agent.pin_dir()).is_ok(),
        "the maps are gone"
    );
    agent.relaunch()?;
    let after = agent.status()?;
    ensure!(
        after.generation == before.generation && after.running.version == before.running.version,
        "{:?}/{:?} → {:?}/{:?}",
        before.generation,
        before.running.version,
        after.generation,
        after.running.version
    );
    ensure!(
        agent.log_text().contains("resumed the pinned maps"),
        "{}",
        agent.log_text()
    );
    consistent(&agent)?;
    serves(&topo, 10)
}

/// One map pin removed while the agent is stopped (a clean-up script, a hand-run `rm`), the
/// program still attached through its pinned link and using the map. A starting agent that
/// created a fresh map under that name would write a map the running program never reads:
/// every change would be "applied" and none would reach the data plane. It must refuse to
/// start (the program keeps forwarding) or keep using the program's map.
#[test]
fn a_missing_map_pin_under_an_attached_program_is_not_replaced_by_a_fresh_map() -> Result<()> {
    if skip("a_missing_map_pin") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    agent.stop()?;
    fs::remove_file(agent.pin_dir().join(router_common::maps::SERVICES))?;
    agent.write_file("20-dns.yaml", DNS)?;
    match agent.relaunch_expecting_exit(Duration::from_secs(10)) {
        // Refused: with a clear error, and the old program still forwards.
        Ok(exited) => {
            ensure!(!exited.status.success(), "{}", exited.output);
            ensure!(
                exited.output.contains(router_common::maps::SERVICES),
                "the refusal does not name the map:\n{}",
                exited.output
            );
            serves(&topo, 5)
        }
        // Running: then the change must reach the program.
        Err(_) => {
            agent.wait_for(LIMIT, |s| s.services.len() == 2)?;
            let udp = client::udp_tally(topo.client(), vip_v4(80), 5)
                .context("the new service does not reach the running program")?;
            ensure!(client::total(&udp) == 5, "{udp:?}");
            Ok(())
        }
    }
}

/// SIGHUP sent while the agent is still starting (a configuration manager that writes the
/// config and signals a reload right as the service restarts): a reload asked for before the
/// agent is ready must not terminate it (SIGHUP's default action).
#[test]
fn a_sighup_during_start_does_not_kill_the_agent() -> Result<()> {
    if skip("a_sighup_during_start") {
        return Ok(());
    }
    let topo = Topology::builder().backends(1).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100]))])?;
    agent.stop()?;
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", topo.lb().path().display()))
        .arg(router_tests::agent::binary()?)
        .args([
            "attach",
            "--iface",
            LB_CLIENT_IF,
            "--iface",
            &lb_backend_if(1),
        ])
        .arg("--config-dir")
        .arg(agent.dir())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn()?;
    // Once nsenter has exec'd the agent (a signal before that would be nsenter's), and a little
    // later: into the start (loading and verifying the program takes hundreds of ms), past the
    // process's own few ms of setup before its `main` runs.
    let exe = format!("/proc/{}/exe", child.id());
    let started = Instant::now();
    while !fs::read_link(&exe).is_ok_and(|p| p.ends_with("switchyard")) {
        ensure!(started.elapsed() < LIMIT, "the agent never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: kill(2) on our own child (nsenter execs the agent: same pid).
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let ready = agent.wait_for(LIMIT, |s| s.generation >= 1);
    let exited = child.try_wait()?;
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    ensure!(exited.is_none(), "the agent died of the SIGHUP: {exited:?}");
    ready.context("the agent did not come up")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Decision groups, overrides, pushed state across reloads
// ---------------------------------------------------------------------------------------------

fn decided(pin: &str, p1: &str, p2: &str, extra_weight: u32) -> String {
    format!(
        "agent:
  pin_path: {pin}
services:
  - {{ name: web, vip: \"{VIP_V4}\", port: 80, protocol: tcp, forward: dsr-l2, to: {{ decide: g }} }}
pools:
  - name: {p1}
    backends:
      - {{ address: \"{b1}\", weight: {extra_weight} }}
  - name: {p2}
    backends:
      - {{ address: \"{b2}\", weight: 100 }}
state:
  maint: {{ push: {{ default: false }} }}
decisions:
  - name: g
    rules:
      - id: normal
        priority: 100
        when: NOT maint
        then: {{ pool: {p1} }}
      - id: maintenance
        priority: 90
        when: maint
        then: {{ pool: {p2} }}
    default: {{ pool: {p1} }}
",
        b1 = backend_v4(1),
        b2 = backend_v4(2),
    )
}

/// Every switch in the audit trail of group `g`: (from, to, cause).
fn switches(agent: &Agent) -> Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(&agent.api_get("/decisions?group=g")?)?;
    Ok(v.as_array()
        .context("decisions")?
        .iter()
        .filter(|r| r["kind"] == "switch")
        .map(|r| format!("{} → {} ({})", r["from"], r["to"], r["cause"]))
        .collect())
}

fn override_of(agent: &Agent) -> Result<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(&agent.api_get("/explain/g")?)?;
    Ok(v["explanation"]["override"].clone())
}

/// Which backends `n` new connections reach.
fn reached(topo: &Topology, n: usize) -> Result<Vec<String>> {
    Ok(client::tcp_tally(topo.client(), vip_v4(80), n)?
        .into_keys()
        .collect())
}

/// An override with a TTL survives an unrelated config change and still ends when its TTL
/// (counted from when it was set) runs out; a pushed value survives a reload; a pool of a
/// decision group renamed while connections are open on it moves none of them.
#[test]
fn overrides_pushed_state_and_a_renamed_group_pool_survive_reloads() -> Result<()> {
    if skip("overrides_pushed_state") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", decided(&pin, "dc1", "dc2", 100))])?;
    let b1 = router_tests::addrs::backend_name(1);
    let b2 = router_tests::addrs::backend_name(2);
    ensure!(reached(&topo, 5)? == [b1.as_str()]);

    let set = Instant::now();
    ctl(
        &agent,
        &[
            "override", "set", "g", "--to", "pool=dc2", "--reason", "attack", "--ttl", "4s",
        ],
    )?;
    ensure!(reached(&topo, 5)? == [b2.as_str()]);
    ensure!(
        !override_of(&agent)?.is_null(),
        "no override in {}",
        agent.api_get("/explain/g")?
    );
    // An unrelated change (dc1's weight) one second later.
    std::thread::sleep(Duration::from_secs(1));
    let switches = switches(&agent)?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &decided(&pin, "dc1", "dc2", 90))?;
    agent.wait_for(LIMIT, |s| s.generation > g)?;
    // Not even for a moment may the apply publish the rules' choice under the override.
    let after = crate::switches(&agent)?;
    ensure!(
        after == switches,
        "the apply switched the overridden group: {:?}",
        &after[switches.len().min(after.len())..]
    );
    ensure!(
        !override_of(&agent)?.is_null(),
        "the override ended at the reload: {}\n{}",
        agent.api_get("/explain/g")?,
        agent.log_text()
    );
    ensure!(
        reached(&topo, 5)? == [b2.as_str()],
        "the reload undid the override"
    );
    // It ends 4 s after it was set, not 4 s after the reload.
    while set.elapsed() < Duration::from_millis(4600) {
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        override_of(&agent)?.is_null(),
        "the override outlived its TTL: {}",
        override_of(&agent)?
    );
    ensure!(reached(&topo, 5)? == [b1.as_str()]);

    // A pushed value survives a reload.
    ctl(&agent, &["state", "set", "maint=true"])?;
    ensure!(reached(&topo, 5)? == [b2.as_str()]);
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &decided(&pin, "dc1", "dc2", 80))?;
    agent.wait_for(LIMIT, |s| s.generation > g)?;
    let state = ctl(&agent, &["state", "get"])?;
    ensure!(
        state
            .lines()
            .any(|l| l.starts_with("maint ") && l.trim_end().ends_with("true")),
        "{state}"
    );
    ensure!(reached(&topo, 5)? == [b2.as_str()]);

    // Rename the pool the group now uses, with connections open on it.
    let mut sessions = client::tcp_sessions(topo.client(), vip_v4(80), 10)?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &decided(&pin, "dc1", "standby", 80))?;
    agent.wait_for(LIMIT, |s| s.generation > g && s.rejected.is_none())?;
    for (k, s) in sessions.iter_mut().enumerate() {
        ensure!(s.backend() == b2);
        s.echo(&client::payload(k, 64))
            .with_context(|| format!("session {k} after the rename"))?;
    }
    ensure!(
        reached(&topo, 5)? == [b2.as_str()],
        "the rename moved new flows"
    );
    consistent(&agent)
}

/// Durations far in the future — an override TTL of 300 billion years, a `stable_for` as long
/// — are valid input (saturating engine time) and must not kill the agent when its event loop
/// turns the next deadline into an instant.
#[test]
fn absurd_durations_do_not_kill_the_agent() -> Result<()> {
    if skip("absurd_durations") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let slow = decided(&pin, "dc1", "dc2", 100)
        + "    switch: { stable_for: 300000000000y, cooldown: 0s, failback_after: 0s }\n";
    let agent = Agent::start(&topo, &[("10-web.yaml", slow)])?;
    let b2 = router_tests::addrs::backend_name(2);
    ctl(
        &agent,
        &[
            "override",
            "set",
            "g",
            "--to",
            "pool=dc2",
            "--reason",
            "long",
            "--ttl",
            "300000000000y",
        ],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    agent
        .status()
        .with_context(|| format!("the agent died after the override:\n{}", agent.log_text()))?;
    // Cleared, the group waits `stable_for` before it leaves the override's pool; a state
    // change then starts another such wait.
    ctl(&agent, &["override", "clear", "g"])?;
    ctl(&agent, &["state", "set", "maint=true"])?;
    ctl(&agent, &["state", "set", "maint=false"])?;
    std::thread::sleep(Duration::from_millis(300));
    agent
        .status()
        .with_context(|| format!("the agent died:\n{}", agent.log_text()))?;
    ensure!(
        reached(&topo, 5)? == [b2.as_str()],
        "stable_for was not waited for"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Upgrade while the agent applies
// ---------------------------------------------------------------------------------------------

/// `switchyard upgrade` three times while the agent applies a change every 100 ms: every
/// upgrade succeeds, every change applies, and the program serves afterwards.
#[test]
fn upgrades_while_applies_run() -> Result<()> {
    if skip("upgrades_while_applies_run") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let dir = dir_arg(&agent);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let ifaces = [LB_CLIENT_IF.to_owned(), lb_backend_if(1), lb_backend_if(2)];
    std::thread::scope(|scope| -> Result<()> {
        let writer = scope.spawn(|| -> Result<u32> {
            let mut k = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                k += 1;
                agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 1 + k % 99]))?;
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(k)
        });
        for _ in 0..3 {
            let mut args = vec!["upgrade"];
            for i in &ifaces {
                args.extend(["--iface", i.as_str()]);
            }
            args.extend(["--config-dir", &dir]);
            agent.cli(&args)?;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("writer panicked"))??;
        Ok(())
    })?;
    agent.wait_for(LIMIT, |s| {
        s.differs_from_files == Some(false) && s.rejected.is_none()
    })?;
    consistent(&agent)?;
    serves(&topo, 10)
}

/// The config directory is also the state directory: the history store, its journal and the
/// audit log are written where the watch looks. Each write wakes the watch; none may turn into
/// an apply, let alone a loop of them.
#[test]
fn a_config_directory_that_is_also_the_state_directory_does_not_loop() -> Result<()> {
    if skip("config_dir_is_state_dir") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let here = |weights: &[u32], dir: &Path| {
        web(&pin, "web", weights).replace(
            &format!("pin_path: {pin}\n"),
            &format!("pin_path: {pin}\n  state_dir: {}\n", dir.display()),
        )
    };
    let dir = agent.dir().to_owned();
    agent.write_file("10-web.yaml", &here(&[100, 100], &dir))?;
    agent.stop()?;
    agent.relaunch()?;
    ensure!(
        dir.join("history.sqlite").exists(),
        "the history is elsewhere"
    );
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &here(&[100, 70], &dir))?;
    agent.wait_for(LIMIT, |s| s.generation > g)?;
    let applied = metric(&agent, "switchyard_config_applied_total")?;
    let g = agent.status()?.generation;
    std::thread::sleep(Duration::from_millis(1500));
    let status = agent.status()?;
    ensure!(
        status.generation == g
            && metric(&agent, "switchyard_config_applied_total")? == applied
            && status.rejected.is_none(),
        "the agent's own writes were applied: generation {g} → {}, {:?}",
        status.generation,
        status.rejected
    );
    // A rollback writes the history (here: into the watched directory); that must not apply
    // the files again.
    let out = ctl(
        &agent,
        &[
            "rollback",
            &status
                .running
                .version
                .unwrap_or(0)
                .saturating_sub(1)
                .to_string(),
        ],
    )?;
    ensure!(out.contains("applied as version"), "{out}");
    let rolled = agent.status()?;
    std::thread::sleep(Duration::from_millis(800));
    let after = agent.status()?;
    ensure!(
        after.generation == rolled.generation && after.running.source.starts_with("rollback"),
        "the rollback was undone: {:?}",
        after.running
    );
    consistent(&agent)?;
    serves(&topo, 5)
}

/// Garbage written over the history store while the agent runs: applies go on, each failed
/// record is counted, `ctl versions` answers with an error, and the agent keeps serving.
#[test]
fn a_history_store_overwritten_while_running_is_counted_not_fatal() -> Result<()> {
    if skip("a_history_store_overwritten") {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let pin = unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", web(&pin, "web", &[100, 100]))])?;
    let store = agent.state_dir().join("history.sqlite");
    let len = fs::metadata(&store)?.len() as usize;
    fs::write(&store, vec![0xa5u8; len.max(8192)])?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 30]))?;
    agent.wait_for(LIMIT, |s| s.generation > g)?;
    ensure!(agent.status()?.running.version.is_none());
    ensure!(metric(&agent, "switchyard_history_errors_total")? >= 1.0);
    let e = ctl(&agent, &["versions"])
        .err()
        .context("versions of garbage")?;
    ensure!(format!("{e:#}").contains("history"), "{e:#}");
    consistent(&agent)?;
    serves(&topo, 5)
}
