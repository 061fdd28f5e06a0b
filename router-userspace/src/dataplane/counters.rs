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

/// Tracked flows (`CONNTRACK` entries) naming each of `slots`, read from the map pinned under
/// `pin_dir`: one pass over the table (a syscall or two per entry: about a second for the
/// table's 262,144 entries), so it runs off the agent's event loop. Entries the LRU evicts or
/// adds during the pass may be missed or counted; none is counted twice (the kernel restarts
/// a walk whose current key was evicted, so each flow is counted once, by its key).
///
/// # Errors
///
/// When the pinned map cannot be opened.
pub fn flows_of(
    pin_dir: &std::path::Path,
    slots: &[u32],
) -> Result<std::collections::BTreeMap<u32, u64>, aya::maps::MapError> {
    use aya::maps::{HashMap, Map};
    use router_common::{FlowEntry, FlowKey, maps};

    let data = MapData::from_pin(pin_dir.join(maps::CONNTRACK))?;
    let table: HashMap<MapData, FlowKey, FlowEntry> = HashMap::try_from(Map::LruHashMap(data))?;
    let mut counts: std::collections::BTreeMap<u32, u64> = slots.iter().map(|&s| (s, 0)).collect();
    let mut seen: std::collections::HashSet<FlowKey> = std::collections::HashSet::new();
    for (key, entry) in table.iter().flatten() {
        if let Some(n) = counts.get_mut(&entry.backend)
            && seen.insert(key)
        {
            *n += 1;
        }
    }
    Ok(counts)
}
