//! The whole system in network namespaces — slow start (`pools[].slow_start`): a backend added
//! to a running pool by a reload ramps linearly from weight 1 to its weight; every sample of
//! the weight `status` reports is within ±10 % of the weight of the linear schedule, the live
//! Maglev table the program reads gives the backend the share that weight gives it, and new
//! connections reach it once the ramp is over.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use router_common::{Decision, MAGLEV_SIZE};
use router_tests::{
    addrs::{VIP_V4, backend_v4, vip_v4},
    agent::Agent,
    client,
    config_text::{ConfigText, backends_v4},
    netns::Topology,
    privileged, servers,
};
use switchyard::{api::status::Status, dataplane::maps::KernelMaps};

/// The pool's `slow_start`.
const SLOW_START: Duration = Duration::from_secs(4);
/// Every backend's weight.
const WEIGHT: u32 = 100;
/// The schedule's tolerance: a tenth of the weight.
const TOLERANCE: f64 = 0.1 * WEIGHT as f64;

fn config(backends: &[u32]) -> String {
    ConfigText::new()
        .service("web", VIP_V4.into(), "tcp", "dsr-l2", "web")
        .pool("web", &backends_v4(backends), None)
        .text()
        .replace(
            "  - name: web\n",
            &format!("  - name: web\n    slow_start: {}s\n", SLOW_START.as_secs()),
        )
}

/// The weight of the new backend in `s`: its slow start's, or its own once the ramp is over.
fn weight_of(s: &Status) -> Option<u32> {
    let address = backend_v4(3).to_string();
    let b = s
        .pools
        .iter()
        .flat_map(|p| &p.backends)
        .find(|b| b.address == address)?;
    Some(b.effective_weight.unwrap_or(b.weight))
}

/// The share of backend slot `slot` in the live table of the service's pool, read through
/// the pinned maps' memory mapping.
fn table_share(maps: &KernelMaps, slot: u32) -> Result<f64> {
    let (_, service) = maps.services().into_iter().next().context("no service")?;
    let pool = u32::from(Decision::decode(maps.decision(service.decision)?).pool_a);
    let half = maps.pool(pool)?.active;
    let entries = (0..MAGLEV_SIZE)
        .filter(|&e| maps.table_entry(pool, half, e) == Some(slot))
        .count();
    ensure!(
        maps.pool(pool)?.active == half,
        "the table flipped while it was read"
    );
    #[expect(clippy::cast_precision_loss, reason = "at most 65,537 entries")]
    Ok(entries as f64 / f64::from(MAGLEV_SIZE))
}

/// The backend slot that holds `address`.
fn slot_of(maps: &KernelMaps, address: std::net::Ipv4Addr) -> Result<u32> {
    (0..router_common::MAX_BACKENDS)
        .find(|&s| {
            maps.backend(s)
                .is_ok_and(|b| b.state != 0 && b.addr[..4] == address.octets())
        })
        .context("no backend slot holds the new backend")
}

#[test]
fn a_backend_added_to_a_running_pool_ramps_on_the_schedule() -> Result<()> {
    if privileged::require_root_and_bpf("a_backend_added_to_a_running_pool_ramps").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let servers = servers::start_all(&topo)?;
    let agent = Agent::start(&topo, &[("10-web.yaml", config(&[WEIGHT, WEIGHT]))])?;
    let added = servers[2].name().to_owned();

    agent.write_file("10-web.yaml", &config(&[WEIGHT, WEIGHT, WEIGHT]))?;
    let before = Instant::now();
    agent.reload()?;
    agent.wait_for(Duration::from_secs(5), |s| weight_of(s).is_some())?;
    let seen = Instant::now();

    let maps = KernelMaps::open_pinned(&agent.pin_dir())?;
    let slot = slot_of(&maps, backend_v4(3))?;
    // (time since the apply was seen, time since the reload was sent, weight, table share); a
    // sample during which the table took a step (or flipped while read) is taken again.
    let mut samples = Vec::new();
    loop {
        let from_seen = seen.elapsed();
        let (Ok(first), Ok(status), Ok(second)) = (
            table_share(&maps, slot),
            agent.status(),
            table_share(&maps, slot),
        ) else {
            continue;
        };
        let from_sent = before.elapsed();
        if first.to_bits() != second.to_bits() {
            continue;
        }
        let w = weight_of(&status).context("the new backend left status")?;
        samples.push((from_seen, from_sent, w, first));
        if from_seen > SLOW_START + Duration::from_millis(500) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let schedule = |t: Duration| f64::from(WEIGHT) * (t.as_secs_f64() / SLOW_START.as_secs_f64());
    let mut report = String::new();
    for &(from_seen, from_sent, w, share) in &samples {
        // The ramp began between the reload being sent and the apply being seen.
        let low = schedule(from_seen).min(f64::from(WEIGHT)) - TOLERANCE;
        let high = schedule(from_sent).min(f64::from(WEIGHT)) + TOLERANCE;
        let expected_share = f64::from(w) / f64::from(w + 2 * WEIGHT);
        let _ = writeln!(
            report,
            "  {:>5} ms: weight {w:>3} (schedule {low:.0}–{high:.0}), table share {share:.3} \
             (for that weight {expected_share:.3})",
            from_seen.as_millis()
        );
        ensure!(
            (low..=high).contains(&f64::from(w)),
            "weight {w} at {from_seen:?} is off the schedule:\n{report}"
        );
        ensure!(
            (share - expected_share).abs() < 0.005,
            "the live table does not follow the weight:\n{report}"
        );
    }
    let ramping = samples
        .iter()
        .filter(|s| s.2 > 5 && s.2 < WEIGHT - 5)
        .count();
    ensure!(ramping >= 5, "too few samples inside the ramp:\n{report}");
    ensure!(
        samples.last().is_some_and(|s| s.2 == WEIGHT),
        "the ramp did not end:\n{report}"
    );
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 150)?;
    ensure!(
        tally.get(&added).copied().unwrap_or(0) > 25,
        "after its slow start {added} takes about a third of new connections: {tally:?}"
    );
    Ok(())
}
