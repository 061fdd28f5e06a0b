//! The config directory watch: fragments dropped into, changed in and removed from the directory
//! are applied without a signal; broken or odd ones change nothing and are reported by name until
//! fixed; a half-written fragment waits for its writer; a deleted, re-created or swapped
//! directory is watched again at its path; the agent's own writes into it never loop.
//!
//! No test here sends SIGHUP: every change reaches the agent through the directory watch.

use std::{
    fs,
    io::Write as _,
    os::unix::fs::symlink,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, vip_v4},
    agent::Agent,
    client::{self},
    config_text::{ConfigText, backends_v4, web_pool},
    netns::Topology,
    privileged, servers,
};
use switchyard::dataplane::maps::KernelMaps;

use crate::common::{
    LIVE_LIMIT, Lb, consistent, ctl, dns, generation, live_after, metric, serves, view, web,
};

#[test]
fn a_dropped_in_fragment_is_live_after_the_debounce_and_deleting_it_removes_what_it_defined()
-> Result<()> {
    if privileged::require_root_and_bpf("a_dropped_in_fragment_is_live").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", web_pool(2).text())])?;
    let first = generation(&agent)?;

    let written = Instant::now();
    agent.write_file("20-dns.yaml", &dns())?;
    live_after(&agent, first)?;
    let took = written.elapsed();
    println!(
        "dropped-in fragment live {} ms after the write",
        took.as_millis()
    );
    let udp = client::udp_tally(topo.client(), vip_v4(80), 20).context("the new UDP service")?;
    ensure!(client::total(&udp) == 20, "{udp:?}");

    // An editor's swap and backup files wake the watch and change nothing.
    let second = generation(&agent)?;
    agent.write_file(".20-dns.yaml.swp", "garbage: [")?;
    agent.write_file("20-dns.yaml~", "garbage: [")?;
    std::thread::sleep(Duration::from_millis(600));
    let status = agent.status()?;
    ensure!(
        status.generation == second && status.rejected.is_none(),
        "editor files changed the config: generation {second} → {}, rejected {:?}",
        status.generation,
        status.rejected
    );

    std::fs::remove_file(agent.dir().join("20-dns.yaml"))?;
    live_after(&agent, second)?;
    let status = agent.status()?;
    ensure!(
        status.services.iter().all(|s| s.name != "dns"),
        "{:?}",
        status.services
    );
    let maps = KernelMaps::open_pinned(&agent.pin_dir())?;
    ensure!(maps.services().len() == 1, "{:?}", maps.services());
    Ok(())
}

/// Broken fragments, each with the problem it must be reported with (`FILE:LINE PATH: …`).
fn broken() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        (
            "bad YAML",
            "services:\n  - { name: dns, vip: 198.18.0.10\n",
            "30-broken.yaml:",
        ),
        (
            "unknown key",
            "services:\n  - { name: dns, vip: 198.18.0.10, port: 80, protocol: udp, \
             forward: dsr-l2, to: { pool: web }, wieght: 3 }\n",
            "30-broken.yaml:2 services[0].wieght: unknown key",
        ),
        (
            "unknown pool",
            "services:\n  - { name: dns, vip: 198.18.0.10, port: 80, protocol: udp, \
             forward: dsr-l2, to: { pool: wbe } }\n",
            "30-broken.yaml:2 services[0].to.pool: unknown pool \"wbe\"",
        ),
        (
            "bad expression",
            "state:\n  ok:\n    expr: \"pool.web.healthy AND AND\"\n",
            "30-broken.yaml:3 state.ok.expr: invalid expression",
        ),
    ]
}

#[test]
fn a_broken_fragment_changes_nothing_is_reported_with_its_location_and_fixing_it_applies()
-> Result<()> {
    if privileged::require_root_and_bpf("a_broken_fragment_changes_nothing").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", web_pool(2).text())])?;
    let before = view(&agent)?;
    let first = generation(&agent)?;
    for (what, text, location) in broken() {
        agent.write_file("30-broken.yaml", text)?;
        agent
            .wait_for(LIVE_LIMIT, |s| {
                s.rejected.as_deref().is_some_and(|r| r.contains(location))
            })
            .with_context(|| format!("{what}: not reported as {location:?}"))?;
        let status = agent.status()?;
        println!("{what}: {}", status.rejected.as_deref().unwrap_or(""));
        ensure!(status.generation == first, "{what}: applied");
        ensure!(view(&agent)? == before, "{what}: the maps changed");
        let human = agent.cli(&["status", "--config-dir", &agent.dir().display().to_string()])?;
        ensure!(
            human.contains(location),
            "{what}: `status` lacks {location:?}:\n{human}"
        );
        let tcp = client::tcp_tally(topo.client(), vip_v4(80), 20)?;
        ensure!(client::total(&tcp) == 20, "{what}: not serving: {tcp:?}");
    }
    let metrics = agent.api_get("/metrics")?;
    ensure!(
        metrics
            .lines()
            .any(|l| l.starts_with("switchyard_config_rejected_total") && !l.ends_with(" 0")),
        "rejections not counted:\n{metrics}"
    );
    agent.write_file("30-broken.yaml", &dns())?;
    live_after(&agent, first)?;
    let udp = client::udp_tally(topo.client(), vip_v4(80), 10)?;
    ensure!(
        client::total(&udp) == 10,
        "the fixed fragment's service: {udp:?}"
    );
    Ok(())
}

/// The config directory is deleted while the agent runs (a `rm -rf` and re-provisioning by a
/// configuration manager), then created again with a changed config. The deletion must be a
/// rejected change (the running config stays, `status` says why), and the new directory must be
/// watched again: its change applies without a signal.
#[test]
fn a_deleted_and_recreated_config_directory_is_watched_again() -> Result<()> {
    let Some(lb) = Lb::start("a_deleted_and_recreated_config_directory", 2, |pin| {
        web(pin, "web", &[100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        agent,
    } = lb;
    let first = agent.status()?.generation;

    fs::remove_dir_all(agent.dir())?;
    agent
        .wait_for(LIVE_LIMIT, |s| {
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
    agent.write_file("20-dns.yaml", &dns())?;
    agent
        .wait_for(LIVE_LIMIT, |s| s.generation > first && s.rejected.is_none())
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
    let Some(lb) = Lb::start("a_config_directory_swapped_by_renames", 2, |pin| {
        web(pin, "web", &[100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        agent,
    } = lb;
    let first = agent.status()?.generation;

    let staged = agent.dir().with_extension("new");
    let old = agent.dir().with_extension("old");
    let _ = fs::remove_dir_all(&staged);
    fs::create_dir(&staged)?;
    let state = agent.state_dir();
    let text = router_tests::agent::with_state_dir(&web(&pin, "web", &[100, 100]), &state);
    fs::write(staged.join("10-web.yaml"), &text)?;
    fs::write(staged.join("20-dns.yaml"), dns())?;
    fs::rename(agent.dir(), &old)?;
    fs::rename(&staged, agent.dir())?;
    let applied = agent.wait_for(LIVE_LIMIT, |s| s.generation > first && s.rejected.is_none());
    let _ = fs::remove_dir_all(&old);
    applied.context("the swapped-in directory was not applied")?;
    // Let the events of the removal settle, so what follows is seen only by watching the new
    // directory.
    std::thread::sleep(Duration::from_millis(600));

    // And the new one stays watched.
    let second = agent.status()?.generation;
    fs::remove_file(agent.dir().join("20-dns.yaml"))?;
    agent
        .wait_for(LIVE_LIMIT, |s| {
            s.generation > second && s.services.len() == 1
        })
        .context("a change in the swapped-in directory was not applied")?;
    consistent(&agent)?;
    serves(&topo, 10)
}

/// Fragments that are not plain text files: a symlink (followed), a dangling symlink, a
/// directory, a FIFO (must not hang the agent), a non-UTF-8 file and one over the size limit.
/// Each bad one is a rejected change with its name; none changes the maps or stops the agent.
/// Makes an odd file at a fragment's path (the first argument); the second is a regular file
/// outside the config directory.
type Make = fn(&Path, &Path) -> Result<()>;

#[test]
fn odd_fragment_files_are_rejected_by_name_and_never_hang_the_agent() -> Result<()> {
    let Some(lb) = Lb::start("odd_fragment_files", 2, |pin| web(pin, "web", &[100, 100]))? else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        agent,
        ..
    } = lb;
    let dir = agent.dir().to_owned();
    let name = "20-odd.yaml";
    let path = dir.join(name);
    let outside = dir.with_extension("outside.yaml");

    // A symlink to a valid fragment outside the directory is read through.
    fs::write(&outside, dns())?;
    symlink(&outside, &path)?;
    let g = agent.status()?.generation;
    agent
        .wait_for(LIVE_LIMIT, |s| s.generation > g && s.services.len() == 2)
        .context("a symlinked fragment")?;
    let good = agent.status()?.generation;

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
            .wait_for(LIVE_LIMIT, |s| {
                s.rejected
                    .as_deref()
                    .is_some_and(|r| r.contains(name) && r.contains(expect))
            })
            .with_context(|| format!("{what}: not rejected with {expect:?}"))?;
        let status = agent.status()?;
        ensure!(status.generation == good, "{what}: applied");
        ensure!(
            started.elapsed() < LIVE_LIMIT,
            "{what}: took {:?}",
            started.elapsed()
        );
        serves(&topo, 5).with_context(|| what.to_owned())?;
    }
    let _ = fs::remove_file(&path).or_else(|_| fs::remove_dir(&path));
    let _ = fs::remove_file(&outside);
    agent
        .wait_for(LIVE_LIMIT, |s| {
            s.rejected.is_none() && s.services.len() == 1
        })
        .context("removing the odd file")?;
    consistent(&agent)
}

/// A fragment written slowly, in two parts with a pause longer than the debounce between them
/// (a `cp` of a large file on a busy disk, `cat > file`, a configuration manager streaming a
/// template). Its first half is valid YAML that drops the service: applying it would cut
/// traffic. The watch must wait until the writer has closed the file.
#[test]
fn a_fragment_still_being_written_is_not_applied_half_written() -> Result<()> {
    let Some(lb) = Lb::start("a_fragment_still_being_written", 2, |pin| {
        web(pin, "web", &[100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        agent,
    } = lb;
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
        .wait_for(LIVE_LIMIT, |s| {
            s.generation > first && s.differs_from_files == Some(false)
        })
        .context("the whole fragment")?;
    consistent(&agent)?;
    serves(&topo, 10)
}

/// The config directory is also the state directory: the history store, its journal and the
/// audit log are written where the watch looks. Each write wakes the watch; none may turn into
/// an apply, let alone a loop of them.
#[test]
#[expect(
    clippy::float_cmp,
    reason = "a counter's value: a whole number, exact in f64"
)]
fn a_config_directory_that_is_also_the_state_directory_does_not_loop() -> Result<()> {
    let Some(lb) = Lb::start("config_dir_is_state_dir", 2, |pin| {
        web(pin, "web", &[100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        mut agent,
    } = lb;
    let here = |weights: &[u32], dir: &Path| {
        ConfigText::at_pin_path(&pin)
            .state_dir(dir)
            .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
            .pool("web", &backends_v4(weights), None)
            .text()
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
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
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
