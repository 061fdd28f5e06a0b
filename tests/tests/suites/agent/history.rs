//! The history store: a corrupt or read-only store refuses the start and leaves the program
//! forwarding; a store deleted or overwritten while the agent runs is reported and counted, and
//! applies go on; a restart after an apply whose version could not be recorded keeps every
//! established connection; a decision is written while a version's record waits for the store.

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{LB_CLIENT_IF, backend_v4, vip_v4},
    agent::Agent,
    client::{self},
    config_text::web_pool,
    netns::Topology,
    privileged, servers,
};

use crate::common::{
    EXIT_LIMIT, LIVE_LIMIT, Lb, consistent, ctl, dir_arg, metric, refused, serves, wait_metric, web,
};

/// Starts an agent, checks it balances, stops it (the program stays), breaks its history store
/// with `break_store`, and starts it again: the start must be refused with `want`, and the
/// program must still be attached and balancing with the first agent's maps.
fn restart_onto_a_broken_store(
    what: &str,
    want: &str,
    break_store: impl FnOnce(&Path) -> Result<Option<ReadOnly>>,
) -> Result<()> {
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let mut agent = Agent::start(&topo, &[("10-web.yaml", web_pool(2).text())])?;
    let tcp = client::tcp_tally(topo.client(), vip_v4(80), 40)?;
    ensure!(client::total(&tcp) == 40, "{tcp:?}");
    agent.stop()?;
    let before = topo.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(before.is_some(), "no program after the first agent stopped");
    // Declared after `agent`, so dropped (unmounted) before the agent removes its state dir.
    let _undo = break_store(&agent.state_dir())?;
    let exited = agent.relaunch_expecting_exit(EXIT_LIMIT)?;
    refused(what, &exited, want)?;
    let after = topo.lb().xdp_program(LB_CLIENT_IF)?;
    ensure!(after == before, "{what}: program {before:?} → {after:?}");
    let tcp = client::tcp_tally(topo.client(), vip_v4(80), 40)?;
    println!("{what}: still balancing: {tcp:?}");
    ensure!(
        client::total(&tcp) == 40 && tcp.len() == 2,
        "{what}: {tcp:?}"
    );
    Ok(())
}

#[test]
fn a_corrupt_history_store_refuses_the_start_and_leaves_the_program_forwarding() -> Result<()> {
    if privileged::require_root_and_bpf("a_corrupt_history_store").is_err() {
        return Ok(());
    }
    restart_onto_a_broken_store("corrupt store", "history.sqlite", |state| {
        std::fs::write(state.join("history.sqlite"), vec![0x5a; 8192])?;
        Ok(None)
    })
}

/// A read-only bind mount of a directory onto itself, undone on drop.
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn mount(dir: &Path) -> Result<Self> {
        let run = |args: &[&str]| -> Result<()> {
            let out = Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .output()?;
            ensure!(
                out.status.success(),
                "mount {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        };
        run(&["--bind"])?;
        let guard = ReadOnly(dir.to_owned());
        run(&["-o", "remount,bind,ro"])?;
        Ok(guard)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_read_only_history_store_refuses_the_start_and_leaves_the_program_forwarding() -> Result<()> {
    if privileged::require_root_and_bpf("a_read_only_history_store").is_err() {
        return Ok(());
    }
    restart_onto_a_broken_store("read-only store", "read-only", |state| {
        ReadOnly::mount(state).map(Some)
    })
}

/// The state directory (history store and all) is deleted while the agent runs: applies go on,
/// the failed record is counted and `status` says the version is not recorded; a restart then
/// starts a new history and serves.
#[test]
fn a_history_store_deleted_while_running_is_reported_and_applies_go_on() -> Result<()> {
    let Some(lb) = Lb::start("a_history_store_deleted", 2, |pin| {
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
    let first = agent.status()?.generation;
    fs::remove_dir_all(agent.state_dir())?;
    agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 50]))?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > first)?;
    wait_metric(&agent, "switchyard_history_errors_total", 1.0)
        .context("the failed record is not counted")?;
    let status = agent.status()?;
    ensure!(status.rejected.is_none(), "{:?}", status.rejected);
    ensure!(
        status.running.version.is_none(),
        "the version claims to be recorded: {:?}",
        status.running
    );
    let human = agent.cli(&["status", "--config-dir", &dir_arg(&agent)])?;
    ensure!(human.contains("not recorded"), "{human}");
    consistent(&agent)?;
    agent.stop()?;
    agent.relaunch()?;
    consistent(&agent)?;
    serves(&topo, 10)
}

/// Garbage written over the history store while the agent runs: applies go on, each failed
/// record is counted, `ctl versions` answers with an error, and the agent keeps serving.
#[test]
fn a_history_store_overwritten_while_running_is_counted_not_fatal() -> Result<()> {
    let Some(lb) = Lb::start("a_history_store_overwritten", 2, |pin| {
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
    let store = agent.state_dir().join("history.sqlite");
    let len = usize::try_from(fs::metadata(&store)?.len())?;
    fs::write(&store, vec![0xa5u8; len.max(8192)])?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 30]))?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
    wait_metric(&agent, "switchyard_history_errors_total", 1.0)?;
    ensure!(agent.status()?.running.version.is_none());
    let e = ctl(&agent, &["versions"])
        .err()
        .context("versions of garbage")?;
    ensure!(format!("{e:#}").contains("history"), "{e:#}");
    consistent(&agent)?;
    serves(&topo, 5)
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
/// after a recorded apply (`agent::restart`'s restart-after-a-pool-change test): renumbering
/// the backend slots moves the flows tracked on them.
#[test]
fn a_restart_after_an_unrecorded_apply_keeps_established_connections() -> Result<()> {
    let Some(lb) = Lb::start("a_restart_after_an_unrecorded_apply", 3, |pin| {
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
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
    let mut sessions = client::tcp_sessions(topo.client(), vip_v4(80), 30)?;
    for (k, s) in sessions.iter_mut().enumerate() {
        s.echo(&client::payload(k, 64))?;
    }
    // A weight change whose record fails.
    let third = second.replace("weight: 100 }\n", "weight: 60 }\n");
    ensure!(third != second);
    let g = agent.status()?.generation;
    let errors = metric(&agent, "switchyard_history_errors_total")?;
    let state = agent.state_dir();
    {
        let _frozen = Immutable::set(&state)?;
        agent.write_file("10-web.yaml", &third)?;
        agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
        // The record fails while the directory is still immutable.
        wait_metric(&agent, "switchyard_history_errors_total", errors + 1.0)?;
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

/// A decision made while an apply's version is being recorded: another process holds the
/// history store's write lock, so the record waits for it (up to the store's busy timeout).
/// The switch must be written, and answered, while the record still waits — the record runs on
/// the history's own thread, never in the way of a decision — and the record must then
/// finish (recorded or counted as failed) without losing the apply.
#[test]
#[expect(
    clippy::float_cmp,
    reason = "a counter's value: a whole number, exact in f64"
)]
fn a_decision_is_written_while_a_version_record_waits_for_the_store() -> Result<()> {
    use router_tests::config_text::{ConfigText, Group};
    use std::sync::atomic::{AtomicBool, Ordering};

    let config = |pin: &str, weight: u32| {
        ConfigText::at_pin_path(pin)
            .deciding_service(
                "web",
                router_tests::addrs::VIP_V4.into(),
                "tcp",
                "dsr-l2",
                "g",
            )
            .pool("p1", &[(backend_v4(1).into(), weight)], None)
            .pool("p2", &[(backend_v4(2).into(), 100)], None)
            .state("maint", "{ push: { default: false } }")
            .decision(
                &Group::new("g")
                    .rule("normal", 100, "NOT maint", "p1")
                    .rule("maintenance", 90, "maint", "p2")
                    .default_pool("p1"),
            )
            .text()
    };
    let Some(lb) = Lb::start("a_decision_while_a_record_waits", 2, |pin| config(pin, 100))? else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        agent,
    } = lb;
    let errors = metric(&agent, "switchyard_history_errors_total")?;
    let versions = metric(&agent, "switchyard_config_applied_total")?;
    // Another writer holds the store: every write of the agent's waits for it.
    let store = rusqlite::Connection::open(agent.state_dir().join("history.sqlite"))?;
    store.execute_batch("BEGIN EXCLUSIVE")?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &config(&pin, 50))?;
    let answered = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<()> {
        let apply = scope.spawn(|| {
            let r = ctl(&agent, &["apply"]);
            answered.store(true, Ordering::SeqCst);
            r
        });
        // The apply is live (its maps written) while its record waits.
        agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
        ensure!(
            metric(&agent, "switchyard_config_applied_total")? > versions,
            "the apply is not live"
        );
        ctl(&agent, &["state", "set", "maint=true"])?;
        let switched: serde_json::Value =
            serde_json::from_str(&agent.api_get("/decisions?group=g")?)?;
        let to_p2 = switched
            .as_array()
            .context("decisions")?
            .iter()
            .any(|r| r["kind"] == "switch" && r["to"].to_string().contains("p2"));
        ensure!(to_p2, "the switch to p2 is not written: {switched}");
        ensure!(
            !answered.load(Ordering::SeqCst)
                && metric(&agent, "switchyard_history_errors_total")? == errors,
            "the record finished before the decision: the decision did not run beside it"
        );
        store.execute_batch("ROLLBACK")?;
        apply
            .join()
            .map_err(|_| anyhow::anyhow!("the apply's caller panicked"))?
            .context("ctl apply")?;
        Ok(())
    })?;
    // Recorded once the lock went, or failed at the busy timeout and counted: either way the
    // running config is the applied one and the agent serves.
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g && s.rejected.is_none())?;
    consistent(&agent)?;
    serves(&topo, 5)
}

/// SIGTERM while an apply's record waits for the store (another process holds its write lock
/// for 0.8 s, under the store's busy timeout): the apply is live in the maps, and an orderly
/// exit finishes the records it handed to the history thread, so the version is in the
/// history after the agent exits.
#[test]
fn sigterm_while_a_version_is_recorded_keeps_the_version() -> Result<()> {
    let Some(lb) = Lb::start("sigterm_while_a_version_is_recorded", 2, |pin| {
        web(pin, "web", &[100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb {
        pin,
        mut agent,
        servers: _servers,
        ..
    } = lb;
    let g = agent.status()?.generation;
    let store_path = agent.state_dir().join("history.sqlite");
    let store = rusqlite::Connection::open(&store_path)?;
    store.execute_batch("BEGIN EXCLUSIVE")?;
    agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 60]))?;
    agent.reload()?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
    let released = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(800));
        store.execute_batch("ROLLBACK")
    });
    agent.stop()?;
    released
        .join()
        .map_err(|_| anyhow::anyhow!("the lock's thread panicked"))??;
    let store = rusqlite::Connection::open(&store_path)?;
    let recorded: i64 = store.query_row(
        "SELECT count(*) FROM versions WHERE generation = ?1",
        [i64::try_from(g + 1)?],
        |r| r.get(0),
    )?;
    ensure!(
        recorded == 1,
        "generation {} was live and the agent exited without recording it:\n{}",
        g + 1,
        agent.log_text()
    );
    Ok(())
}
