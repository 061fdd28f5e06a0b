//! The second chance (`conntrack.second_chance`, decision 0028): after a pool's Maglev table
//! changes, a TCP segment that opens no connection and has no tracked flow goes to the backend
//! the previous table names, while the grace lasts, so a connection that reaches a node which
//! never saw its SYN (ECMP moved it, or its entry was lost) keeps its backend. A SYN takes the
//! current table; once the grace ends, so does every untracked segment. IPv4 and IPv6.

use std::{net::IpAddr, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};
use router_common::Reason;
use router_tests::{
    addrs::{backend_mac, backend_v4, backend_v6},
    lab::Lab,
    packets,
};

use super::{BACKENDS, c4, c6, fixture_config, lab, v4, v6};

const GRACE: Duration = Duration::from_mins(1);

/// Which backend (1-based) a forwarded frame went to.
fn backend_of(out: &[u8]) -> Result<usize> {
    let mac = out.get(..6).context("runt")?;
    (1..=BACKENDS)
        .find(|i| backend_mac(*i) == mac)
        .with_context(|| format!("destination MAC {mac:02x?} is no backend's"))
}

/// Runs `frame`; returns the backend it went to and the one reason it was counted under.
fn run(lab: &Lab, frame: &[u8]) -> Result<(usize, Reason)> {
    let before: Vec<u64> = Reason::ALL.iter().map(|r| lab.reason(*r)).collect();
    let r = lab.run(frame)?;
    let moved: Vec<Reason> = Reason::ALL
        .iter()
        .zip(&before)
        .filter(|(r, b)| lab.reason(**r) != **b)
        .map(|(r, _)| *r)
        .collect();
    match moved.as_slice() {
        [one] => Ok((
            backend_of(&r.out).with_context(|| format!("{one:?}"))?,
            *one,
        )),
        _ => bail!("counted {moved:?}, not one reason"),
    }
}

/// Flows of `web` (or `web6`) from `client` to `vip`: an ACK of port `p` and a SYN of port `p`.
struct Flows {
    client: IpAddr,
    vip: IpAddr,
    pool: &'static str,
    heavy: IpAddr,
}

impl Flows {
    fn ack(&self, port: u16) -> Vec<u8> {
        packets::tcp(self.client, port, self.vip, 80)
    }
    fn syn(&self, port: u16) -> Vec<u8> {
        packets::syn(self.client, port, self.vip, 80)
    }
}

fn v4_flows() -> Flows {
    Flows {
        client: c4(),
        vip: v4(),
        pool: "web",
        heavy: backend_v4(1).into(),
    }
}

fn v6_flows() -> Flows {
    Flows {
        client: c6(),
        vip: v6(),
        pool: "web6",
        heavy: backend_v6(1).into(),
    }
}

const PORTS: std::ops::Range<u16> = 46000..46200;

fn second_chance(tag: &str, f: &Flows) -> Result<()> {
    let Some(mut lab) = lab(tag) else {
        return Ok(());
    };
    let mut cfg = fixture_config();
    cfg.conntrack.second_chance = GRACE;
    lab.apply(&cfg)?;

    // Connections whose SYN this node saw under the first table.
    let mut first = Vec::new();
    for port in PORTS {
        let (b, reason) = run(&lab, &f.ack(port))?;
        ensure!(reason == Reason::NewFlow, "flow {port}: {reason:?}");
        first.push((port, b));
    }

    // The table changes (the first backend weighs three times the others), and the node
    // forgets its flows, as a node ECMP moves them to never knew them.
    let pool = cfg
        .pools
        .iter_mut()
        .find(|p| p.name == f.pool)
        .context("no pool")?;
    let heavy = pool
        .backends
        .iter_mut()
        .find(|b| b.address == f.heavy)
        .context("no backend")?;
    heavy.weight *= 3;
    lab.apply(&cfg)?;
    lab.flush_conntrack();

    let mut moved = Vec::new();
    for &(port, b) in &first {
        let (now, reason) = run(&lab, &f.ack(port))?;
        ensure!(
            now == b,
            "flow {port} moved from backend {b} to {now} ({reason:?})"
        );
        match reason {
            Reason::NewFlow => {}
            Reason::SecondChance => moved.push((port, b)),
            other => bail!("flow {port}: {other:?}"),
        }
        // Tracked where it went.
        let (again, reason) = run(&lab, &f.ack(port))?;
        ensure!(
            again == b && reason == Reason::ConntrackHit,
            "flow {port}: {reason:?}"
        );
    }
    ensure!(
        !moved.is_empty(),
        "no flow's backend differs between the two tables"
    );

    // A SYN takes the current table, whose choice differs for the flows that moved.
    lab.flush_conntrack();
    for &(port, b) in &moved {
        let (now, reason) = run(&lab, &f.syn(port))?;
        ensure!(reason == Reason::NewFlow, "SYN {port}: {reason:?}");
        ensure!(
            now != b,
            "SYN {port} went to the previous table's backend {b}"
        );
    }

    // The grace ends: untracked segments take the current table too.
    lab.publisher.set_now(GRACE + Duration::from_secs(1));
    let ended = lab.publisher.end_second_chances(&mut lab.maps)?;
    ensure!(ended.iter().any(|p| p == f.pool), "ended {ended:?}");
    lab.flush_conntrack();
    for &(port, b) in &moved {
        let (now, reason) = run(&lab, &f.ack(port))?;
        ensure!(reason == Reason::NewFlow, "flow {port}: {reason:?}");
        ensure!(
            now != b,
            "flow {port} still on the previous table's backend {b}"
        );
    }
    Ok(())
}

#[test]
fn an_untracked_segment_goes_to_the_previous_tables_backend_during_the_grace_v4() -> Result<()> {
    second_chance("second_chance_v4", &v4_flows())
}

#[test]
fn an_untracked_segment_goes_to_the_previous_tables_backend_during_the_grace_v6() -> Result<()> {
    second_chance("second_chance_v6", &v6_flows())
}

/// Without `conntrack.second_chance`, a changed table is the only one read.
#[test]
fn without_a_grace_an_untracked_segment_takes_the_current_table() -> Result<()> {
    let Some(mut lab) = lab("second_chance_off") else {
        return Ok(());
    };
    let f = v4_flows();
    let mut cfg = fixture_config();
    let mut first = Vec::new();
    for port in PORTS {
        first.push((port, run(&lab, &f.ack(port))?.0));
    }
    for p in cfg.pools.iter_mut().filter(|p| p.name == "web") {
        for b in p.backends.iter_mut().filter(|b| b.address == f.heavy) {
            b.weight *= 3;
        }
    }
    lab.apply(&cfg)?;
    lab.flush_conntrack();
    let mut changed = 0;
    for (port, b) in first {
        let (now, reason) = run(&lab, &f.ack(port))?;
        ensure!(reason == Reason::NewFlow, "flow {port}: {reason:?}");
        changed += usize::from(now != b);
    }
    ensure!(changed > 0, "the table change moved no flow");
    Ok(())
}
