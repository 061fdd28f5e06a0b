//! Reloads (SIGHUP, `ctl apply`): a broken reload keeps the running config and a fixed one
//! applies; a storm of SIGHUPs, an emptied config and rapid churn with concurrent applies end on
//! the last write; a pool whose health check is removed brings its down backends back; `agent:`
//! settings change only on restart.

use std::{fs, time::Duration};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client::{self},
    config_text::{ConfigText, FAST_HTTP_CHECK, backends_v4, web_pool},
    netns::Topology,
    privileged, servers,
};

use crate::common::{
    BROKEN, FIXED, LIVE_LIMIT, Lb, broken_errors, check_spread, consistent, ctl, serves, web,
};

#[test]
fn a_broken_reload_keeps_the_running_config_and_a_fixed_one_applies() -> Result<()> {
    if privileged::require_root_and_bpf("a_broken_reload_keeps_the_running_config").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", web_pool(2).text())])?;
    let first = agent.status()?.generation;

    agent.write_file("20-extra.yaml", BROKEN)?;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| s.rejected.is_some())?;
    let status = agent.status()?;
    let rejected = status.rejected.clone().unwrap_or_default();
    println!(
        "broken reload: generation {first} → {}; status reports:\n{rejected}",
        status.generation
    );
    ensure!(status.generation == first, "the broken config was applied");
    for error in broken_errors("20-extra.yaml") {
        ensure!(rejected.contains(&error), "status lacks {error:?}");
    }
    let human = agent.cli(&["status", "--config-dir", &agent.dir().display().to_string()])?;
    ensure!(
        human.contains("the last change was rejected"),
        "`switchyard status` does not say the change was rejected:\n{human}"
    );
    let tcp = client::tcp_tally(topo.client(), vip_v4(80), 100)?;
    println!("still serving with the old config: {tcp:?}");
    ensure!(client::total(&tcp) == 100 && tcp.len() == 2, "{tcp:?}");

    agent.write_file("20-extra.yaml", FIXED)?;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| {
        s.generation > first && s.rejected.is_none()
    })?;
    let generation = agent.status()?.generation;
    // The fixed fragment's UDP service now answers, over the old pool.
    let udp = client::udp_tally(topo.client(), vip_v4(80), 30).context("the new UDP service")?;
    println!("fixed reload: generation {first} → {generation}; new UDP service answers {udp:?}");
    ensure!(client::total(&udp) == 30);
    Ok(())
}

#[test]
fn a_sighup_storm_with_status_polls_and_an_emptied_config_leaves_a_working_agent() -> Result<()> {
    if privileged::require_root_and_bpf("a_sighup_storm").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let cfg = web_pool(2).text();
    let agent = Agent::start(&topo, &[("10-web.yaml", cfg.clone())])?;
    let first = agent.status()?.generation;
    // 200 reloads as fast as signals go, status read in between.
    for i in 0..200 {
        agent.reload()?;
        if i % 20 == 0 {
            agent.status()?;
        }
    }
    // The directory did not change, so no reload applied anything (an unchanged content hash
    // is a no-op): same generation, nothing rejected, still balancing.
    std::thread::sleep(Duration::from_millis(300));
    let after = agent.status()?;
    ensure!(
        after.generation == first && after.rejected.is_none(),
        "an unchanged config was applied or rejected: generation {first} → {}, {:?}",
        after.generation,
        after.rejected
    );
    check_spread(
        "after the storm",
        &client::tcp_tally(topo.client(), vip_v4(80), 100)?,
        2,
    )?;
    // Every service and pool removed: nothing is balanced, nothing breaks.
    let pin = cfg.lines().take(2).collect::<Vec<_>>().join("\n");
    agent.write_file("10-web.yaml", &format!("{pin}\n"))?;
    let generation = agent.status()?.generation;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| {
        s.generation > generation && s.services.is_empty() && s.pools.is_empty()
    })?;
    let maps = switchyard::dataplane::maps::KernelMaps::open_pinned(&agent.pin_dir())?;
    ensure!(maps.services().is_empty(), "{:?}", maps.services());
    // And back.
    agent.write_file("10-web.yaml", &cfg)?;
    let generation = agent.status()?.generation;
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| s.generation > generation)?;
    check_spread(
        "after emptying and restoring",
        &client::tcp_tally(topo.client(), vip_v4(80), 100)?,
        2,
    )?;
    Ok(())
}

/// Rapid churn: 40 versions of a fragment written 10–30 ms apart, mixed with SIGHUPs and
/// `ctl apply`s from another thread. A read can catch a write half way (an empty file is a
/// config without pools): the backends then leave and come back, and must be served again
/// (their next hops reported afresh). Afterwards the running config is the last one written,
/// every recorded version has a higher generation than the one before, the last version is the
/// running one, and the maps carry its generation.
#[test]
fn rapid_churn_with_concurrent_ctl_apply_and_sighup_ends_on_the_last_write() -> Result<()> {
    let Some(lb) = Lb::start("rapid_churn", 3, |pin| web(pin, "web", &[100, 100, 100]))? else {
        return Ok(());
    };
    let Lb {
        topo,
        servers: _servers,
        pin,
        agent,
    } = lb;
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
        let written = (0..40u32).try_for_each(|k| {
            let weights = [100, 1 + (k * 37) % 200, 1 + (k * 11) % 150];
            agent.write_file("10-web.yaml", &web(&pin, "web", &weights))?;
            if k % 5 == 0 {
                agent.reload()?;
            }
            std::thread::sleep(Duration::from_millis(10 + u64::from(k % 3) * 10));
            Ok::<_, anyhow::Error>(())
        });
        // The applier stops whatever the writes did: the scope waits for it.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let errors = applier
            .join()
            .map_err(|_| anyhow::anyhow!("applier panicked"))?;
        written?;
        ensure!(errors.is_empty(), "ctl apply failed: {errors:?}");
        Ok(())
    })?;
    let last = [100, 1 + (39 * 37) % 200, 1 + (39 * 11) % 150];
    // The last write may land after the last read of the directory (`differs_from_files` is
    // as of that read): the watch applies it once the directory has been quiet for its
    // debounce. Its version number shows once the history has recorded it.
    let weights_of = |s: &switchyard::api::status::Status| -> Vec<u32> {
        s.pools
            .first()
            .map(|p| p.backends.iter().map(|b| b.weight).collect())
            .unwrap_or_default()
    };
    agent
        .wait_for(LIVE_LIMIT, |s| {
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
    let recorded = versions["versions"].as_array().context("versions")?;
    let generations: Vec<u64> = recorded
        .iter()
        .map(|v| v["generation"].as_u64().unwrap_or(0))
        .collect();
    ensure!(
        generations.windows(2).all(|w| w[0] < w[1]),
        "{generations:?}"
    );
    ensure!(
        generations.last() == Some(&status.generation)
            && versions["running"].as_u64() == recorded.last().and_then(|v| v["number"].as_u64()),
        "last version {:?} / running {} at generation {}",
        recorded.last(),
        versions["running"],
        status.generation
    );
    consistent(&agent)?;
    serves(&topo, 10).with_context(|| {
        format!(
            "after the churn; status: {}",
            agent.api_get("/status").unwrap_or_default()
        )
    })
}

/// A backend down by its health check, then the health check removed from its pool (an
/// operator forcing the backend back in): nothing probes it any more, so nothing would ever
/// bring it up — a pool without a health check has every backend up.
#[test]
fn removing_a_pools_health_check_brings_its_down_backends_back() -> Result<()> {
    let Some(lb) = Lb::start("removing_a_pools_health_check", 2, |pin| {
        ConfigText::at_pin_path(pin)
            .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
            .pool("web", &backends_v4(&[100, 100]), Some(FAST_HTTP_CHECK))
            .text()
    })?
    else {
        return Ok(());
    };
    let Lb {
        topo,
        servers,
        pin,
        agent,
    } = lb;
    let b1 = backend_v4(1).to_string();
    agent.wait_for(LIVE_LIMIT, |s| Agent::healthy(s, "web", &b1) == Some(true))?;
    servers[0].set_healthy(false);
    agent.wait_for(LIVE_LIMIT, |s| Agent::healthy(s, "web", &b1) == Some(false))?;
    let g = agent.status()?.generation;
    agent.write_file("10-web.yaml", &web(&pin, "web", &[100, 100]))?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > g)?;
    std::thread::sleep(Duration::from_millis(500));
    ensure!(
        Agent::healthy(&agent.status()?, "web", &b1) == Some(true),
        "b1 stays down with no health check to bring it up"
    );
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 20)?;
    ensure!(tally.len() == 2, "b1 gets no new flows: {tally:?}");
    consistent(&agent)
}

/// `agent:` settings change only on restart (the apply says so). A change to `state_dir` in a
/// fragment must not send the running agent's audit log elsewhere: the running agent keeps the
/// directory it started with (its history is open there).
#[test]
fn a_changed_state_dir_is_not_used_before_a_restart() -> Result<()> {
    let Some(lb) = Lb::start("a_changed_state_dir", 2, |pin| web(pin, "web", &[100, 100]))? else {
        return Ok(());
    };
    let Lb { pin, agent, .. } = lb;
    let first = agent.status()?.generation;
    let elsewhere = agent.dir().with_extension("elsewhere");
    let _ = fs::remove_dir_all(&elsewhere);
    let moved = ConfigText::at_pin_path(&pin)
        .state_dir(&elsewhere)
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&[100, 50]), None)
        .text();
    agent.write_file("10-web.yaml", &moved)?;
    agent.wait_for(LIVE_LIMIT, |s| s.generation > first)?;
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
