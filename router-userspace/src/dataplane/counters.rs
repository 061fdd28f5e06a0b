//! Reading the per-CPU counters: each slot summed over CPUs.

use aya::maps::{MapData, PerCpuArray};
use router_common::{MAX_BACKENDS, MAX_SERVICES, Reason, Traffic, Verdict};

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
    }
    snap
}
