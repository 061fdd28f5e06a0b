//! Pool tables and backend entries, written from the health table in the order that never
//! sends a new flow where it cannot go: a backend's entry is valid before a table names it, and
//! a backend leaves every table before its entry stops taking flows.

use std::{collections::HashSet, time::Duration};

use router_common::{
    BACKEND_STATE_MASK, BACKEND_UP, MAGLEV_SIZE, POOL_F_LEFT_CHANCE, POOL_F_SECOND_CHANCE, Pool,
};

use super::{PoolState, PublishError};
use crate::{
    breaker::{self, Phase},
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
    now: Duration,
) -> Result<(), PublishError> {
    let mut chance = false;
    for up in [true, false] {
        if !up {
            chance = publish_deferring(dp, name, pool, health, false, now, true)?;
        }
        let marks = pool.marks;
        for b in &mut pool.backends {
            let entry = b.entry(health.get(name, b.address), marks);
            if (entry.state & BACKEND_STATE_MASK == BACKEND_UP) == up && b.written != Some(entry) {
                dp.set_backend(b.slot, entry)?;
                b.written = Some(entry);
            }
        }
    }
    // The replaced table names the backends that just went down: it becomes a second chance
    // only once their entries say so, or a flow could be sent (and kept) there in between.
    if chance {
        begin_second_chance(dp, pool)?;
    }
    Ok(())
}

/// The weight a backend in slow start has reached at `now`: from 1 at `start` to `weight`
/// at `start + slow_start`, linearly (rounded up), as `HAProxy`'s `slowstart` ramps a server
/// back from down.
#[must_use]
pub fn effective_weight(weight: u32, start: Duration, slow_start: Duration, now: Duration) -> u32 {
    let elapsed = now.saturating_sub(start);
    if slow_start.is_zero() || elapsed >= slow_start {
        return weight;
    }
    let reached = (u128::from(weight) * elapsed.as_nanos()).div_ceil(slow_start.as_nanos());
    u32::try_from(reached)
        .unwrap_or(weight)
        .clamp(1, weight.max(1))
}

/// Starts and ends `pool`'s slow starts at `now`: a usable, weighted backend that the live
/// table did not have starts one (only with `slow_start`, and once the pool has a table: a
/// first build, or an agent resuming its maps, starts none); one that is not usable, or whose
/// ramp is over, has none.
fn ramps(name: &str, pool: &mut PoolState, health: &Health, now: Duration) {
    let members: Option<HashSet<u32>> = pool
        .built_from
        .as_ref()
        .map(|b| b.iter().map(|m| m.0).collect());
    for b in &mut pool.backends {
        let member = b.target() > 0 && health.usable(name, b.address);
        b.ramp = match (pool.slow_start, b.ramp) {
            (Some(t), Some(start)) if member && now.saturating_sub(start) < t => Some(start),
            (Some(_), None) if member && members.as_ref().is_some_and(|m| !m.contains(&b.slot)) => {
                Some(now)
            }
            _ => None,
        };
    }
}

/// Builds `pool`'s table from its usable, weighted backends (at their adaptive weights, or
/// their configured ones, as far as their slow starts have reached by `now`); when it differs from the live one (or the flags changed), writes
/// the inactive half and flips.
pub(super) fn publish(
    dp: &mut dyn Dataplane,
    name: &str,
    pool: &mut PoolState,
    health: &Health,
    flags_changed: bool,
    now: Duration,
) -> Result<(), PublishError> {
    publish_deferring(dp, name, pool, health, flags_changed, now, false).map(|_| ())
}

/// [`publish`]; with `defer`, a flip that begins a second chance is written without
/// `POOL_F_SECOND_CHANCE`, and `true` is returned: the caller marks the backends that stop
/// taking flows first (the replaced table still names them), then calls
/// [`begin_second_chance`].
pub(super) fn publish_deferring(
    dp: &mut dyn Dataplane,
    name: &str,
    pool: &mut PoolState,
    health: &Health,
    flags_changed: bool,
    now: Duration,
    defer: bool,
) -> Result<bool, PublishError> {
    // A second chance whose time is up ends here, not only at the deadline timer: an apply
    // that shortened or turned off `conntrack.second_chance` clears the flag at once.
    if pool.chance_until.is_some_and(|t| t <= now) {
        end_second_chance(dp, pool)?;
    }
    ramps(name, pool, health, now);
    let slow_start = pool.slow_start.unwrap_or_default();
    let input: Vec<(u32, std::net::IpAddr, u32)> = pool
        .backends
        .iter()
        .filter(|b| b.target() > 0 && health.usable(name, b.address))
        .map(|b| {
            let weight = b.ramp.map_or(b.target(), |start| {
                effective_weight(b.target(), start, slow_start, now)
            });
            let phase = health
                .get(name, b.address)
                .map_or(Phase::Closed, |h| h.breaker);
            (
                b.slot,
                b.address,
                breaker::trial(phase, weight, pool.trial_weight),
            )
        })
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
            // The inactive half is read as the previous table while the second chance runs:
            // that ends before the half is rewritten, so the program never reads it half
            // written.
            if pool.chance_until.is_some() {
                end_second_chance(dp, pool)?;
            }
            dp.write_table(pool.slot, half, &table)?;
            // A pool's first table replaces none; later, the replaced one gets the chance.
            let chance = pool.live.is_some() && !pool.second_chance.is_zero();
            let flag = if chance && !defer {
                POOL_F_SECOND_CHANCE
            } else {
                0
            };
            dp.set_pool(
                pool.slot,
                Pool {
                    active: half,
                    flags: pool.flags | flag,
                },
            )?;
            pool.active = half;
            pool.digest = Some(super::fingerprint(&table, &pool.backends));
            pool.live = Some(table);
            pool.chance_until = chance.then(|| now.saturating_add(pool.second_chance));
            return Ok(chance && defer);
        }
    }
    if flags_changed {
        dp.set_pool(
            pool.slot,
            Pool {
                active: pool.active,
                flags: pool.flags
                    | if pool.chance_until.is_some() {
                        POOL_F_SECOND_CHANCE
                    } else {
                        0
                    },
            },
        )?;
    }
    Ok(false)
}

/// Begins the second chance a deferred flip of `pool` ([`publish_deferring`]) left pending:
/// its `POOLS` entry with `POOL_F_SECOND_CHANCE`.
pub(super) fn begin_second_chance(
    dp: &mut dyn Dataplane,
    pool: &PoolState,
) -> Result<(), PublishError> {
    dp.set_pool(
        pool.slot,
        Pool {
            active: pool.active,
            flags: pool.flags | POOL_F_SECOND_CHANCE,
        },
    )?;
    Ok(())
}

/// Ends `pool`'s second chance: its `POOLS` entry without `POOL_F_SECOND_CHANCE`.
pub(super) fn end_second_chance(
    dp: &mut dyn Dataplane,
    pool: &mut PoolState,
) -> Result<(), PublishError> {
    dp.set_pool(
        pool.slot,
        Pool {
            active: pool.active,
            flags: pool.flags,
        },
    )?;
    pool.chance_until = None;
    Ok(())
}

/// Begins (`until` is `Some`) or ends (`None`) the second chance of the flows a decision group
/// left `pool` with: its `POOLS` entry with or without `POOL_F_LEFT_CHANCE` (kept in `flags`).
pub(super) fn set_left_chance(
    dp: &mut dyn Dataplane,
    pool: &mut PoolState,
    until: Option<Duration>,
) -> Result<(), PublishError> {
    let flags = if until.is_some() {
        pool.flags | POOL_F_LEFT_CHANCE
    } else {
        pool.flags & !POOL_F_LEFT_CHANCE
    };
    dp.set_pool(
        pool.slot,
        Pool {
            active: pool.active,
            flags: map_flags(pool, flags),
        },
    )?;
    pool.flags = flags;
    pool.left_until = until;
    Ok(())
}

/// `flags` as the pool's `POOLS` entry holds them: with `POOL_F_SECOND_CHANCE` while its
/// previous table gets its second chance.
fn map_flags(pool: &PoolState, flags: u32) -> u32 {
    if pool.chance_until.is_some() {
        flags | POOL_F_SECOND_CHANCE
    } else {
        flags
    }
}
