//! Pool tables and backend entries, written from the health table in the order that never
//! sends a new flow where it cannot go: a backend's entry is valid before a table names it, and
//! a backend leaves every table before its entry stops taking flows.

use router_common::{BACKEND_UP, MAGLEV_SIZE, Pool};

use super::{PoolState, PublishError};
use crate::{
    dataplane::Dataplane,
    health::Health,
    maglev::{self, MaglevBackend},
};

/// Rewrites pool `name` after its backends' health or next hops changed: entries that become
/// (or stay) up and differ from the map, then the table, then every other entry that differs
/// (down or draining: out of the table first).
pub(super) fn refresh(
    dp: &mut dyn Dataplane,
    name: &str,
    pool: &mut PoolState,
    health: &Health,
) -> Result<(), PublishError> {
    for up in [true, false] {
        if !up {
            publish(dp, name, pool, health, false)?;
        }
        for b in &mut pool.backends {
            let entry = b.entry(health.get(name, b.address));
            if (entry.state == BACKEND_UP) == up && b.written != Some(entry) {
                dp.set_backend(b.slot, entry)?;
                b.written = Some(entry);
            }
        }
    }
    Ok(())
}

/// Builds `pool`'s table from its usable, weighted backends; when it differs from the live one
/// (or the flags changed), writes the inactive half and flips.
pub(super) fn publish(
    dp: &mut dyn Dataplane,
    name: &str,
    pool: &mut PoolState,
    health: &Health,
    flags_changed: bool,
) -> Result<(), PublishError> {
    let input: Vec<(u32, std::net::IpAddr, u32)> = pool
        .backends
        .iter()
        .filter(|b| b.weight > 0 && health.usable(name, b.address))
        .map(|b| (b.slot, b.address, b.weight))
        .collect();
    // Same members as the live table: it stands, unbuilt. Otherwise build, and write only a
    // table that differs (the inactive half, then one flip, which also carries the flags).
    if !(pool.live.is_some() && pool.built_from.as_ref() == Some(&input)) {
        let members: Vec<MaglevBackend> = input
            .iter()
            .map(|&(id, address, weight)| MaglevBackend {
                id,
                key: address.to_string(),
                weight,
            })
            .collect();
        let table =
            maglev::build(&members, MAGLEV_SIZE).map_err(|source| PublishError::Maglev {
                pool: name.to_owned(),
                source,
            })?;
        pool.built_from = Some(input);
        if pool.live.as_ref() != Some(&table) {
            let half = pool.active ^ 1;
            dp.write_table(pool.slot, half, &table)?;
            dp.set_pool(
                pool.slot,
                Pool {
                    active: half,
                    flags: pool.flags,
                },
            )?;
            pool.active = half;
            pool.live = Some(table);
            return Ok(());
        }
    }
    if flags_changed {
        dp.set_pool(
            pool.slot,
            Pool {
                active: pool.active,
                flags: pool.flags,
            },
        )?;
    }
    Ok(())
}
