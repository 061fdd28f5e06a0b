//! The config lifecycle on real files: fragments dropped into, changed in and removed
//! from the watched config directory are applied without a signal; broken ones change nothing
//! and are reported with their location until fixed; `ctl versions`, `ctl diff` and `ctl
//! rollback` work on the history store, and a rollback restores the exact map contents.
//!
//! No test here sends SIGHUP: every change reaches the agent through the directory watch.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use router_common::{Decision, MAGLEV_SIZE, NO_POOL};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client,
    config_text::{ConfigText, backends_v4},
    netns::Topology,
    privileged, servers,
};
use switchyard::dataplane::maps::KernelMaps;

/// How long a change may take to be live: the watch's debounce (200 ms) plus one apply, with
/// a wide margin for a loaded 2-core machine.
const LIVE_LIMIT: Duration = Duration::from_secs(5);

/// TCP on the IPv4 VIP over backends `1..=n`, equal weights.
fn web(n: usize) -> ConfigText {
    ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(&vec![100; n]), None)
}

/// A second fragment: a UDP service on the same VIP over the `web` pool.
const DNS: &str = "services:
  - { name: dns, vip: 198.18.0.10, port: 80, protocol: udp, forward: dsr-l2, to: { pool: web } }
";

/// What the program would do for every service, with slot numbers resolved to addresses: per
/// service key, its flags and, for each pool its decision word names, the pool's flags and
/// live Maglev table as backend addresses (with each backend's state). Two configs that
/// balance identically give equal views whatever slots they were given.
type View = BTreeMap<String, String>;

fn view(agent: &Agent) -> Result<View> {
    let maps = KernelMaps::open_pinned(&agent.pin_dir())?;
    let mut out = View::new();
    for (key, svc) in maps.services() {
        let word = maps.decision(svc.decision)?;
        let d = Decision::decode(word);
        let mut text = format!("flags {:#x} split {}", svc.flags, d.split_b);
        for (role, pool) in [("a", d.pool_a), ("b", d.pool_b), ("fallback", d.fallback)] {
            if pool == NO_POOL {
                continue;
            }
            let p = maps.pool(u32::from(pool))?;
            let mut owners: BTreeMap<String, usize> = BTreeMap::new();
            let mut sequence = String::new();
            for entry in 0..MAGLEV_SIZE {
                let slot = maps
                    .table_entry(u32::from(pool), p.active, entry)
                    .context("table entry")?;
                let b = maps.backend(slot)?;
                let addr = IpAddr::from(<[u8; 4]>::try_from(&b.addr[..4])?);
                let name = format!("{addr}/{}", b.state);
                if entry < 64 {
                    sequence.push_str(&name);
                    sequence.push(' ');
                }
                *owners.entry(name).or_default() += 1;
            }
            text += &format!(" | pool {role}: flags {:#x} {owners:?} {sequence}", p.flags);
        }
        out.insert(format!("{:?}", key), text);
    }
    Ok(out)
}

fn generation(agent: &Agent) -> Result<u64> {
    Ok(agent.status()?.generation)
}

/// Waits until the generation passes `after`; returns how long that took.
fn live_after(agent: &Agent, after: u64) -> Result<Duration> {
    agent.wait_for(LIVE_LIMIT, |s| s.generation > after && s.rejected.is_none())
}

#[test]
fn a_dropped_in_fragment_is_live_after_the_debounce_and_deleting_it_removes_what_it_defined()
-> Result<()> {
    if privileged::require_root_and_bpf("a_dropped_in_fragment_is_live").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(2).build()?;
    let _servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", web(2).text())])?;
    let first = generation(&agent)?;

    let written = Instant::now();
    agent.write_file("20-dns.yaml", DNS)?;
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
    let agent = Agent::start(&topo, &[("10-web.yaml", web(2).text())])?;
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
    agent.write_file("30-broken.yaml", DNS)?;
    live_after(&agent, first)?;
    let udp = client::udp_tally(topo.client(), vip_v4(80), 10)?;
    ensure!(
        client::total(&udp) == 10,
        "the fixed fragment's service: {udp:?}"
    );
    Ok(())
}

#[test]
fn versions_diff_and_rollback_restore_the_exact_maps_and_leave_the_files_alone() -> Result<()> {
    if privileged::require_root_and_bpf("versions_diff_and_rollback").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let v1 = web(2).service("dns", VIP_V4.into(), "udp", "dsr-l2", "web");
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

/// `switchyard ctl ARGS…` against `agent`; its output.
fn ctl(agent: &Agent, args: &[&str]) -> Result<String> {
    let dir = agent.dir().display().to_string();
    let mut all = vec!["ctl", "--config-dir", &dir];
    all.extend_from_slice(args);
    agent.cli(&all)
}
