//! The agent's side of next hops: each round of the resolver's changes goes into the maps
//! (`Publisher::set_next_hops`), into the state the rules read, and into what `status` says.

use std::{net::IpAddr, time::Instant};

use log::{error, info, warn};

use super::{now_secs, runtime::Runtime};
use crate::{
    api::status::NextHopStatus,
    nexthop::{NextHopEvent, Resolution},
};

impl Runtime {
    /// Applies a round of next-hop changes: the map entries, the tables of the pools whose usable
    /// backends changed, the state the rules read (a backend without a next hop is not healthy to
    /// them), and what `status` says. A next hop that leaves by an interface the program is not
    /// attached to cannot be used (the program could not redirect there): it counts as
    /// unresolved, with that reason.
    pub(super) fn on_next_hops(&mut self, events: Vec<NextHopEvent>) {
        let s = self;
        let event = Instant::now();
        let mut hops = Vec::with_capacity(events.len());
        for ev in events {
            let (hop, status) = judge(s, ev.address, ev.resolution);
            match (&hop, &status.reason) {
                (Some(_), _) => info!(
                    "backend {}: next hop {}",
                    ev.address,
                    status.via.as_deref().unwrap_or("")
                ),
                (None, Some(why)) if status.decided() => {
                    warn!("backend {}: no next hop, no new flows ({why})", ev.address);
                    s.metrics
                        .unresolved
                        .get_or_create(&vec![("backend", ev.address.to_string())])
                        .inc();
                }
                (None, _) => {}
            }
            s.next_hops.insert(ev.address, status);
            hops.push((ev.address, hop));
        }
        let started = Instant::now();
        let pools = match s.publisher.set_next_hops(&mut s.maps, &hops) {
            Ok(pools) => pools,
            Err(e) => {
                error!("writing next hops failed: {e}");
                return;
            }
        };
        s.metrics.map_write.observe(started.elapsed().as_secs_f64());
        // The rules see what the tables hold; a pool that gained or lost usable backends changes
        // what `require` vetoes: every group is evaluated again.
        let slots = s.store.refresh_health(s.publisher.health(), &pools);
        if !slots.is_empty() || !pools.is_empty() {
            s.decide(&slots, !pools.is_empty(), "next hop", event);
        }
    }
}

/// Before the first apply of a start: has the resolver resolve `cfg`'s backends and takes its
/// reports until every one has a verdict, for at most [`FIRST_ROUND`], so the first tables
/// already hold the backends that can be reached (a backend still resolving then joins when
/// it resolves, as after any apply).
pub(super) async fn first_round(
    s: &mut Runtime,
    cfg: &crate::config::Config,
    rx: &mut tokio::sync::mpsc::Receiver<Vec<NextHopEvent>>,
) {
    let targets = super::backend_addresses(cfg);
    let Some(resolver) = &s.resolver else { return };
    resolver.set_targets(targets.clone());
    let deadline = tokio::time::Instant::now() + FIRST_ROUND;
    while !targets
        .iter()
        .all(|a| s.next_hops.get(a).is_some_and(NextHopStatus::decided))
    {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(events)) => s.on_next_hops(events),
            Ok(None) | Err(_) => break,
        }
    }
}

/// How long a start waits for its backends' first next-hop verdicts (ARP and NDP answer in
/// well under a millisecond on a segment; an absent host takes the kernel's 3 s to fail).
pub const FIRST_ROUND: std::time::Duration = std::time::Duration::from_secs(1);

/// The map entry (`None`: unresolved) and the status of one backend address's resolution.
fn judge(
    s: &Runtime,
    address: IpAddr,
    resolution: Resolution,
) -> (Option<router_common::NextHop>, NextHopStatus) {
    match resolution {
        Resolution::Resolved(nh) if s.egress.contains_key(&nh.ifindex) => {
            let mut macs = [0u8; 12];
            macs[..6].copy_from_slice(&nh.dmac);
            macs[6..].copy_from_slice(&nh.smac);
            let hop = router_common::NextHop {
                ifindex: nh.ifindex,
                flags: router_common::NH_F_RESOLVED,
                macs,
                mtu: nh.mtu,
            };
            let status = NextHopStatus {
                state: "resolved".into(),
                via: Some(nh.to_string()),
                reason: None,
                since: now_secs(),
            };
            (Some(hop), status)
        }
        Resolution::Resolved(nh) => {
            let reason = format!(
                "the route leaves by {}, an interface switchyard is not attached to (attach \
                 to it too)",
                nh.iface
            );
            (None, unresolved(s, address, reason))
        }
        Resolution::Resolving { reason } => (None, NextHopStatus::resolving(reason)),
        Resolution::Unresolved { reason } => (None, unresolved(s, address, reason)),
    }
}

/// The status of a next hop that just became (or stays) unresolved: it keeps the time it
/// first became so.
fn unresolved(s: &Runtime, address: IpAddr, reason: String) -> NextHopStatus {
    let since = s
        .next_hops
        .get(&address)
        .filter(|h| h.state == "unresolved")
        .map_or_else(now_secs, |h| h.since);
    NextHopStatus {
        state: "unresolved".into(),
        via: None,
        reason: Some(reason),
        since,
    }
}
