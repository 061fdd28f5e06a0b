//! Switchyard follows its neighbours: a flushed neighbour table under traffic loses nothing, a
//! backend's new MAC address is followed, and a carrier blip resets no established connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    addrs::{BACKEND_IF, TCP_ECHO_PORT, UDP_NAME_PORT, backend_v4, mac_string, vip_v4, vip_v6},
    client::TcpSession,
    load::{Load, LoadReport, LoadSpec},
    netns::{Netns, Topology},
};

use super::{first_tcp, hosts, only_from, services, tally};

/// A steady load on `addr`: persistent connections exchanging every 50 ms plus short
/// connections back to back.
fn steady_load(ns: &Netns, addr: SocketAddr) -> Result<Load> {
    Load::start(
        ns,
        LoadSpec {
            addr,
            persistent: 4,
            period: Duration::from_millis(50),
            payload: 256,
            new_pause: Duration::from_millis(10),
            connect_timeout: Duration::from_secs(3),
        },
        Duration::from_secs(15),
    )
}

/// Checks a load's report: no failure of any kind, and progress (exchanges on persistent
/// connections and completed short ones) in phase `phase`.
fn check_load(what: &str, report: &LoadReport, phase: usize) -> Result<()> {
    let p = &report.phases[phase];
    println!(
        "{what}: {} exchanges and {} short connections while flushing, slowest exchange \
         {:.1} ms, {} failures; short connections per backend {:?}",
        p.exchanges,
        p.short_ok,
        Duration::from_micros(p.max_exchange_us).as_secs_f64() * 1e3,
        report.failures.len(),
        report.short_backends
    );
    ensure!(
        report.failures.is_empty(),
        "{what}: {} failures, first {:?}",
        report.failures.len(),
        report.failures.first()
    );
    ensure!(
        p.exchanges > 0 && p.short_ok > 0,
        "{what}: no progress while the neighbour table was flushed: {p:?}"
    );
    Ok(())
}

fn flushing_the_neighbour_table_loses_nothing(test: &str, forward: &str) -> Result<()> {
    const FLUSHES: usize = 20;
    const FLUSH_EVERY: Duration = Duration::from_millis(100);
    const FLUSHING: usize = 1;
    const AFTER: usize = 2;
    let pool = [1, 2];
    let Some(hosts) = hosts(test, Topology::builder().backends(2), forward, &pool)? else {
        return Ok(());
    };
    let client = hosts.topo.client();
    let loads = [
        ("TCP v4", steady_load(client, vip_v4(TCP_ECHO_PORT))?),
        ("TCP v6", steady_load(client, vip_v6(TCP_ECHO_PORT))?),
    ];
    for (_, load) in &loads {
        load.set_phase(FLUSHING);
    }
    for _ in 0..FLUSHES {
        hosts.topo.lb().ip(&["neigh", "flush", "all"])?;
        // Pacing between flushes, not a wait for a condition.
        std::thread::sleep(FLUSH_EVERY);
    }
    for (_, load) in &loads {
        load.set_phase(AFTER);
    }
    // New flows after the last flush, on every service.
    for (what, addr) in services() {
        only_from(what, &tally(&hosts, what, addr, 20)?, 20, &pool)?;
    }
    for (what, load) in loads {
        let report = load.stop();
        check_load(&format!("{forward} {what}"), &report, FLUSHING)?;
        let backends = report.short_backends.len();
        ensure!(
            backends == pool.len(),
            "{what}: short connections reached {backends} backends: {:?}",
            report.short_backends
        );
    }
    Ok(())
}

#[test]
fn flushing_the_neighbour_table_under_traffic_loses_nothing_with_dsr() -> Result<()> {
    flushing_the_neighbour_table_loses_nothing(
        "flushing_the_neighbour_table_under_traffic_loses_nothing_with_dsr",
        "dsr-l2",
    )
}

#[test]
fn flushing_the_neighbour_table_under_traffic_loses_nothing_with_nat() -> Result<()> {
    flushing_the_neighbour_table_loses_nothing(
        "flushing_the_neighbour_table_under_traffic_loses_nothing_with_nat",
        "nat",
    )
}

/// New connections to `addr` from the client, each with a 200 ms connect timeout, until one
/// is served (then returns its backend) or `limit` passes.
fn first_served_within(ns: &Netns, addr: SocketAddr, limit: Duration) -> Result<String> {
    ns.run(|| -> Result<String> {
        let start = Instant::now();
        loop {
            match TcpSession::connect_with_timeout(addr, Duration::from_millis(200)) {
                Ok(s) => return Ok(s.backend().to_owned()),
                Err(e) if start.elapsed() > limit => {
                    return Err(e).context(format!("nothing served {addr} within {limit:?}"));
                }
                Err(_) => {}
            }
        }
    })?
}

/// A backend's new MAC address, announced by the backend (`arp_notify`, `ndisc_notify`), is
/// followed: new connections reach it again soon after the change. The pool holds that one
/// backend only, so every new connection goes to it.
#[test]
fn a_backends_new_mac_address_is_followed() -> Result<()> {
    const BOUND: Duration = Duration::from_secs(5);
    let pool = [1];
    let Some(hosts) = hosts(
        "a_backends_new_mac_address_is_followed",
        Topology::builder().backends(1),
        "dsr-l2",
        &pool,
    )?
    else {
        return Ok(());
    };
    let (client, b1) = (hosts.topo.client(), hosts.topo.backend(1));
    ensure!(first_tcp(client, vip_v4(TCP_ECHO_PORT))? == "b1");
    for (k, (what, addr)) in [
        ("TCP v4", vip_v4(TCP_ECHO_PORT)),
        ("TCP v6", vip_v6(TCP_ECHO_PORT)),
    ]
    .into_iter()
    .enumerate()
    {
        let new_mac = mac_string([0x02, 0x53, 0x59, 0x0f, 0x01, 0x10 + u8::try_from(k)?]);
        let changed = Instant::now();
        b1.ip(&["link", "set", "dev", BACKEND_IF, "address", &new_mac])?;
        let backend = if k == 0 {
            backend_v4(1).to_string()
        } else {
            router_tests::addrs::backend_v6(1).to_string()
        };
        // The agent's next hop (what the map holds) names the new MAC, polled every 20 ms.
        let followed = hosts
            .agent
            .wait_for(BOUND, |s| {
                s.pools.iter().flat_map(|p| p.backends.iter()).any(|b| {
                    b.address == backend
                        && b.next_hop
                            .as_ref()
                            .and_then(|h| h.via.as_deref())
                            .is_some_and(|v| v.starts_with(&new_mac))
                })
            })
            .with_context(|| format!("{what}; agent log:\n{}", hosts.agent.log_text()))?;
        let served = first_served_within(client, addr, BOUND)
            .with_context(|| format!("{what}; agent log:\n{}", hosts.agent.log_text()))?;
        let took = changed.elapsed();
        println!(
            "{what}: backend b1 changed its MAC to {new_mac}; the agent's next hop had it \
             after {:.1} ms (status polled every 20 ms), a new connection was served after \
             {:.1} ms",
            followed.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e3
        );
        ensure!(served == "b1", "{what}: served by {served}");
        let seen = hosts
            .topo
            .lb()
            .ip(&["neigh", "show", &backend_v4(1).to_string()])?;
        ensure!(
            !seen.contains("02:53:59:00:01:01"),
            "the lb's neighbour entry still has the old MAC: {seen}"
        );
    }
    only_from(
        "UDP v4",
        &tally(&hosts, "UDP v4", vip_v4(UDP_NAME_PORT), 10)?,
        10,
        &pool,
    )
}

/// The lb's link to a backend loses carrier for a second under traffic (a switch port
/// renegotiating): the backend takes no new flows meanwhile, but its established connections
/// are not moved elsewhere (where they would be reset): TCP retransmits through the blip, as
/// through IPVS or a router.
#[test]
fn a_carrier_blip_resets_no_established_connection() -> Result<()> {
    let test = "a_carrier_blip_resets_no_established_connection";
    let Some(hosts) = hosts(test, Topology::builder().backends(2), "dsr-l2", &[1, 2])? else {
        return Ok(());
    };
    let vip = vip_v4(TCP_ECHO_PORT);
    let mut on_b1 = hosts
        .topo
        .client()
        .run(move || -> Result<Vec<TcpSession>> {
            let mut v = Vec::new();
            for _ in 0..24 {
                let mut s = TcpSession::connect(vip)?;
                s.echo(b"hello")?;
                if s.backend() == "b1" {
                    v.push(s);
                }
            }
            Ok(v)
        })??;
    ensure!(!on_b1.is_empty(), "no connection landed on b1");
    let n = on_b1.len();
    let link = router_tests::addrs::lb_backend_if(1);
    hosts.topo.lb().ip(&["link", "set", &link, "down"])?;
    // Traffic during the blip: each connection sends, and its retransmissions cross the blip.
    let talk = hosts.topo.client().spawn(move || -> Vec<String> {
        on_b1
            .iter_mut()
            .filter_map(|s| s.echo(b"during the blip").err().map(|e| format!("{e:#}")))
            .collect()
    })?;
    // The agent sees the carrier go: b1 takes no new flows.
    hosts.agent.wait_for(Duration::from_secs(5), |s| {
        s.pools
            .iter()
            .flat_map(|p| p.backends.iter())
            .any(|b| b.address == backend_v4(1).to_string() && !b.healthy)
    })?;
    for _ in 0..10 {
        let served = hosts
            .topo
            .client()
            .run(move || TcpSession::connect(vip).map(|s| s.backend().to_owned()))??;
        ensure!(
            served == "b2",
            "a new connection during the blip went to {served}"
        );
    }
    hosts.topo.lb().ip(&["link", "set", &link, "up"])?;
    let failures = talk
        .join()
        .map_err(|_| anyhow::anyhow!("the talking thread panicked"))?;
    let reasons: Vec<String> = hosts
        .agent
        .api_get("/metrics")?
        .lines()
        .filter(|l| l.starts_with("switchyard_packets_total"))
        .map(str::to_owned)
        .collect();
    ensure!(
        failures.is_empty(),
        "{} of {n} connections on b1 broke across the blip: {failures:?}\n{reasons:#?}\nagent log:\n{}",
        failures.len(),
        hosts.agent.log_text()
    );
    println!("{n} connections on b1 crossed a carrier blip; new flows went to b2 meanwhile");
    Ok(())
}
