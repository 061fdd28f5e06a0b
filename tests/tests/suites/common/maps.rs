//! The maps as the program reads them, for comparing what two configs balance.

use std::{collections::BTreeMap, fmt::Write as _, net::IpAddr};

use anyhow::{Context as _, Result};
use router_common::{Decision, MAGLEV_SIZE, NO_POOL};
use router_tests::agent::Agent;
use switchyard::dataplane::maps::KernelMaps;

/// What the program would do for every service, with slot numbers resolved to addresses: per
/// service key, its flags and, for each pool its decision word names, the pool's flags and
/// live Maglev table as backend addresses (with each backend's state). Two configs that
/// balance identically give equal views whatever slots they were given.
pub type View = BTreeMap<String, String>;

/// The [`View`] of the maps `agent` pins.
pub fn view(agent: &Agent) -> Result<View> {
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
            let _ = write!(
                text,
                " | pool {role}: flags {:#x} {owners:?} {sequence}",
                p.flags
            );
        }
        out.insert(format!("{key:?}"), text);
    }
    Ok(out)
}
