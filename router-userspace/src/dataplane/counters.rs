//! Reading the per-CPU counters: each slot summed over CPUs.

use aya::maps::{MapData, PerCpuArray};
use router_common::{BackendSignals, MAX_BACKENDS, MAX_SERVICES, Reason, Traffic, Verdict};

/// Sums slot `index` of a per-CPU counter map over all CPUs; a missing slot reads as zero.
#[must_use]
pub fn sum(map: &PerCpuArray<MapData, Traffic>, index: u32) -> Traffic {
    match map.get(&index, 0) {
        Ok(values) => values.iter().fold(Traffic::default(), |acc, t| Traffic {
            packets: acc.packets + t.packets,
            bytes: acc.bytes + t.bytes,
        }),
        Err(_) => Traffic::default(),
    }
}

/// Every counter, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// By [`Reason`], in `Reason::ALL` order.
    pub reasons: Vec<(Reason, Traffic)>,
    /// By service slot and verdict (non-zero only).
    pub services: Vec<(u32, Verdict, Traffic)>,
    /// By backend slot (non-zero only).
    pub backends: Vec<(u32, Traffic)>,
    /// Failure signals by backend slot (non-zero only).
    pub signals: Vec<(u32, BackendSignals)>,
}

/// Reads every counter. `services` and `backends` limit the slots read (the agent knows which
/// are in use), so a read costs a few syscalls, not `MAX_SERVICES · 4 + MAX_BACKENDS`.
pub fn snapshot(
    maps: &super::maps::KernelMaps,
    services: impl IntoIterator<Item = u32>,
    backends: impl IntoIterator<Item = u32>,
) -> Snapshot {
    let reasons = Reason::ALL
        .iter()
        .map(|r| (*r, sum(&maps.reason_stats, *r as u32)))
        .collect();
    let mut snap = Snapshot {
        reasons,
        ..Snapshot::default()
    };
    for s in services.into_iter().filter(|s| *s < MAX_SERVICES) {
        for v in Verdict::ALL {
            let t = sum(&maps.svc_stats, s * Verdict::COUNT + v as u32);
            if t.packets > 0 {
                snap.services.push((s, v, t));
            }
        }
    }
    for b in backends.into_iter().filter(|b| *b < MAX_BACKENDS) {
        let t = sum(&maps.backend_stats, b);
        if t.packets > 0 {
            snap.backends.push((b, t));
        }
        if let Ok(values) = maps.backend_signals.get(&b, 0) {
            let s = values
                .iter()
                .fold(BackendSignals::default(), |acc, s| BackendSignals {
                    rsts: acc.rsts + s.rsts,
                    syn_retransmits: acc.syn_retransmits + s.syn_retransmits,
                });
            if s != BackendSignals::default() {
                snap.signals.push((b, s));
            }
        }
    }
    snap
}

/// Open flows (`CONNTRACK` entries) naming each of `slots`, read from the maps pinned under
/// `pin_dir`: one pass over the table (a syscall or two per entry: about a second for the
/// table's 262,144 entries), so it runs off the agent's event loop. A flow counts while it is
/// open ([`router_common::flow_open`]): an open TCP flow or a UDP flow, tracked (not only a
/// first packet's record), and idle for no longer than its state's timeout in the pinned
/// `CONFIG`, by the program's clock ([`super::clock`]). A SYN, a closing TCP flow and an expired
/// entry the LRU still holds do not. Entries the LRU evicts or adds during the pass may be
/// missed or counted; none is counted twice (the kernel restarts a walk whose current key was
/// evicted, so each flow is counted once, by its key).
///
/// # Errors
///
/// When a pinned map cannot be opened or read (a missing `CONFIG` or `CLOCK` pin reads as
/// the default timeouts and time 0).
pub fn flows_of(
    pin_dir: &std::path::Path,
    slots: &[u32],
) -> Result<std::collections::BTreeMap<u32, u64>, aya::maps::MapError> {
    let pinned = crate::flows::open(pin_dir)?;
    // An entry refreshed during the pass is ahead of `now`: not expired
    // (`router_common::expired`).
    Ok(count_open(
        pinned.table.iter().flatten(),
        slots,
        &pinned.timeouts,
        pinned.now,
    ))
}

/// The open flows ([`router_common::flow_open`]) of `entries` naming each of `slots`, each key
/// counted once, judged at the program's time `now`.
fn count_open(
    entries: impl IntoIterator<Item = (router_common::FlowKey, router_common::FlowEntry)>,
    slots: &[u32],
    timeouts: &[u32; router_common::FLOW_STATES],
    now: u32,
) -> std::collections::BTreeMap<u32, u64> {
    let mut counts: std::collections::BTreeMap<u32, u64> = slots.iter().map(|&s| (s, 0)).collect();
    let mut seen: std::collections::HashSet<router_common::FlowKey> =
        std::collections::HashSet::new();
    for (key, entry) in entries {
        if let Some(n) = counts.get_mut(&entry.backend)
            && router_common::flow_open(&entry, now, timeouts)
            && seen.insert(key)
        {
            *n += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use router_common::{
        FLOW_F_FIRST, FLOW_TCP_CLOSING, FLOW_TCP_OPEN, FLOW_TCP_SYN, FLOW_UDP, FlowEntry, FlowKey,
    };

    use super::*;

    fn flow(sport: u16, backend: u32, state: u8, seen: u32) -> (FlowKey, FlowEntry) {
        let key = FlowKey {
            sport,
            ..FlowKey::default()
        };
        let entry = FlowEntry {
            backend,
            seen,
            state,
            ..FlowEntry::default()
        };
        (key, entry)
    }

    #[test]
    fn only_open_flows_within_their_timeout_are_counted_once() {
        let timeouts = [10, 100, 10, 50];
        let entries = [
            flow(1, 7, FLOW_TCP_OPEN, 900),
            flow(2, 7, FLOW_UDP, 960),
            // Idle past its timeout (UDP: 50 ticks).
            flow(3, 7, FLOW_UDP, 940),
            flow(4, 7, FLOW_TCP_SYN, 1_000),
            flow(5, 7, FLOW_TCP_CLOSING, 1_000),
            flow(6, 7, FLOW_TCP_OPEN | FLOW_F_FIRST, 1_000),
            // Another backend's, and the first key again (a restarted walk).
            flow(7, 8, FLOW_TCP_OPEN, 1_000),
            flow(1, 7, FLOW_TCP_OPEN, 900),
        ];
        let counts = count_open(entries, &[7, 9], &timeouts, 1_000);
        assert_eq!(counts.into_iter().collect::<Vec<_>>(), [(7, 2), (9, 0)]);
    }
}
