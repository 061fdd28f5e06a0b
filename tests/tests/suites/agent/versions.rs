//! Versions, diff and rollback: `ctl versions`, `ctl diff` and `ctl rollback` work on the history
//! store and a rollback restores the exact maps; events that change no fragment do not undo a
//! rollback; a rollback that cannot be published beside the running version is refused whole.

use std::{fs, net::IpAddr, time::Duration};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client::{self},
    config_text::{ConfigText, backends_v4, web_pool},
    netns::Topology,
    privileged, servers,
};

use crate::common::{
    LIVE_LIMIT, Lb, consistent, ctl, dns, generation, live_after, serves, view, web,
};

#[test]
fn versions_diff_and_rollback_restore_the_exact_maps_and_leave_the_files_alone() -> Result<()> {
    if privileged::require_root_and_bpf("versions_diff_and_rollback").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let v1 = web_pool(2).service("dns", VIP_V4.into(), "udp", "dsr-l2", "web");
    let agent = Agent::start(&topo, &[("10-web.yaml", v1.text())])?;
    let first_view = view(&agent)?;
    let versions = ctl(&agent, &["versions"])?;
    println!("{versions}");
    let v1_number = 1;
    ensure!(versions.contains("start"), "{versions}");

    // Version 2: a third backend, other weights, the UDP service gone.
    let b = |i: usize, w: u32| (IpAddr::from(backend_v4(i)), w);
    let v2 = ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &[b(1, 100), b(2, 300), b(3, 100)], None);
    let text = v2.text().replace(v2.pin_path(), v1.pin_path());
    let g = generation(&agent)?;
    agent.write_file("10-web.yaml", &text)?;
    live_after(&agent, g)?;
    ensure!(
        view(&agent)? != first_view,
        "version 2 did not change the maps"
    );

    let diff = ctl(&agent, &["diff", "1", "2"])?;
    println!("ctl diff 1 2:\n{diff}");
    for needle in [
        "- service dns".to_owned(),
        format!("+ pool web: backend {}", backend_v4(3)),
        format!("~ pool web: backend {} weight 100 → 300", backend_v4(2)),
    ] {
        ensure!(diff.contains(&needle), "the diff lacks {needle:?}:\n{diff}");
    }

    let out = ctl(&agent, &["rollback", &v1_number.to_string()])?;
    println!("ctl rollback {v1_number}: {out}");
    let rolled = view(&agent)?;
    for (key, want) in &first_view {
        let got = rolled.get(key).map_or("(missing)", String::as_str);
        ensure!(
            got == want,
            "service {key} after rollback:\n got {got}\nwant {want}"
        );
    }
    ensure!(rolled.len() == first_view.len(), "{rolled:?}");
    let status = agent.status()?;
    ensure!(
        status.differs_from_files == Some(true),
        "{:?}",
        status.differs_from_files
    );
    let human = agent.cli(&["status", "--config-dir", &agent.dir().display().to_string()])?;
    ensure!(human.contains("DIFFERS FROM THE DIRECTORY"), "{human}");
    // The files were left alone: version 2's text is still there.
    let on_disk = std::fs::read_to_string(agent.dir().join("10-web.yaml"))?;
    ensure!(!on_disk.contains("udp"), "rollback rewrote the files");
    let versions = ctl(&agent, &["versions"])?;
    println!("{versions}");
    ensure!(versions.contains("rollback to 1"), "{versions}");
    let udp = client::udp_tally(topo.client(), vip_v4(80), 10)?;
    ensure!(
        client::total(&udp) == 10,
        "the rolled-back UDP service: {udp:?}"
    );
    Ok(())
}

/// After `ctl rollback`, the running config differs from the files on purpose. Events in the
/// directory that change no fragment — an editor opening a fragment (its swap file), a README
/// — must not apply the files again and so undo the rollback; only a change to the fragments
/// (or `ctl apply`, SIGHUP) does.
#[test]
fn a_rollback_is_not_undone_by_events_that_change_no_fragment() -> Result<()> {
    let Some(lb) = Lb::start("a_rollback_is_not_undone", 2, |pin| {
        web(pin, "web", &[100, 100])
    })?
    else {
        return Ok(());
    };
    let Lb { agent, .. } = lb;
    let g = agent.status()?.generation;
    agent.write_file("20-dns.yaml", &dns())?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
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
    agent.write_file("20-dns.yaml", &dns().replace("dns", "dns2"))?;
    agent.wait_for(LIVE_LIMIT, |s| {
        s.generation > rolled.generation && s.services.len() == 2
    })?;
    consistent(&agent)
}

/// `web` plus a UDP service on port 81 over pool `big` of `n` backends at `10.<net>.x.y` (not
/// reachable; only their slots matter).
fn with_big_pool(pin: &str, net: u8, n: usize) -> String {
    let big: Vec<(IpAddr, u32)> = (0..n)
        .map(|i| {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "1 + i % 250 ≤ 250, and i / 250 fits an octet for the pools here (a few \
                          thousand backends)"
            )]
            let address = std::net::Ipv4Addr::new(10, net, (i / 250) as u8, 1 + (i % 250) as u8);
            (address.into(), 1)
        })
        .collect();
    ConfigText::at_pin_path(pin)
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .service_on("bulk", VIP_V4.into(), 81, "udp", "dsr-l2", "big")
        .pool("web", &backends_v4(&[100, 100]), None)
        .pool("big", &big, None)
        .text()
}

/// A rollback to a version that cannot be published beside the running one: the new backends
/// of the version need more slots than are free while the running ones are held. Refused whole
/// with the reason, the maps unchanged, the running version kept.
#[test]
fn a_rollback_beyond_the_slot_limits_is_refused_and_changes_nothing() -> Result<()> {
    let n = router_common::MAX_BACKENDS as usize / 2 + 100;
    let Some(lb) = Lb::start("a_rollback_beyond_the_slot_limits", 2, |pin| {
        with_big_pool(pin, 1, n)
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
