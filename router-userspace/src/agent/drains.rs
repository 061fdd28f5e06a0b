//! Operators' drains (`switchyard ctl backend drain POOL ADDRESS [--timeout T]` and
//! `undrain`): the backend takes no new flows and keeps its tracked ones; after the optional
//! timeout its remaining tracked flows are re-selected too (it is evicted), until `undrain`.
//!
//! A drain belongs to the running agent: an apply keeps it while the pool keeps the backend,
//! a restart ends it. A drain that must outlive the agent is `weight: 0` in the config.

use std::{collections::BTreeMap, net::IpAddr, time::Instant};

use log::{error, info};

use super::{command::DrainOp, now_secs, runtime::Runtime};
use crate::health::Drain;

/// One backend's drain: when it began and ends. Whether it is evicted is the health table's
/// (`Drain::Evicted`), read with [`Runtime::evicted`].
#[derive(Clone, Copy, Debug)]
pub struct DrainRecord {
    /// When it started, seconds since the Unix epoch.
    pub since: u64,
    /// When its timeout passes: the instant, and seconds since the Unix epoch.
    pub until: Option<(Instant, u64)>,
}

/// Drains by (pool, backend address).
pub type Drains = BTreeMap<(String, IpAddr), DrainRecord>;

impl Runtime {
    /// Drains `address` in `pool` or ends its drain. A drain of a draining backend sets its
    /// timeout anew and keeps when it started. Returns whether the maps changed; an unknown
    /// backend or a failed map write is an error in words.
    pub(super) fn set_drain(
        &mut self,
        pool: &str,
        address: IpAddr,
        op: DrainOp,
    ) -> Result<bool, String> {
        let event = Instant::now();
        // A timeout is checked before anything is written: one past what the clock can hold
        // is refused.
        let until = match op {
            DrainOp::Drain(Some(t)) => {
                let Some(at) = event.checked_add(t) else {
                    return Err(format!(
                        "timeout {} is too long",
                        humantime::format_duration(t)
                    ));
                };
                Some((at, now_secs().saturating_add(t.as_secs())))
            }
            DrainOp::Drain(None) | DrainOp::Undrain => None,
        };
        let state = match op {
            DrainOp::Drain(_) => Drain::Draining,
            DrainOp::Undrain => Drain::Off,
        };
        let changed = match self
            .publisher
            .set_drain(&mut self.maps, pool, address, state)
        {
            Ok(Some(changed)) => changed,
            Ok(None) if !self.publisher.pools().contains_key(pool) => {
                return Err(format!("unknown pool {pool:?}"));
            }
            Ok(None) => return Err(format!("pool {pool:?} has no backend {address}")),
            Err(e) => {
                error!("pool {pool} backend {address}: writing the drain failed: {e}");
                return Err(format!("writing the maps failed: {e}"));
            }
        };
        let key = (pool.to_owned(), address);
        if let DrainOp::Drain(timeout) = op {
            let since = self.drains.get(&key).map_or_else(now_secs, |d| d.since);
            self.drains.insert(key, DrainRecord { since, until });
            let after = timeout.map_or(String::new(), |t| {
                format!("; evicted after {}", humantime::format_duration(t))
            });
            info!("pool {pool} backend {address} drained by the operator{after}");
        } else {
            self.drains.remove(&key);
            info!("pool {pool} backend {address}: drain ended by the operator");
        }
        if changed {
            self.health_changed(
                pool,
                &format!("drain of pool {pool} backend {address}"),
                event,
            );
        }
        Ok(changed)
    }

    /// Whether the drain of `address` in `pool` timed out: the backend is evicted.
    pub(super) fn evicted(&self, pool: &str, address: IpAddr) -> bool {
        self.publisher
            .health()
            .get(pool, address)
            .is_some_and(|b| b.drain == Drain::Evicted)
    }

    /// The earliest drain timeout still to pass.
    pub(super) fn next_drain_deadline(&self) -> Option<Instant> {
        self.drains
            .iter()
            .filter(|((pool, address), _)| !self.evicted(pool, *address))
            .filter_map(|(_, d)| d.until.map(|(at, _)| at))
            .min()
    }

    /// Evicts every drained backend whose timeout passed.
    pub(super) fn expire_drains(&mut self) {
        let now = Instant::now();
        let due: Vec<(String, IpAddr)> = self
            .drains
            .iter()
            .filter(|((pool, address), d)| {
                !self.evicted(pool, *address) && d.until.is_some_and(|(at, _)| at <= now)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (pool, address) in due {
            match self
                .publisher
                .set_drain(&mut self.maps, &pool, address, Drain::Evicted)
            {
                // A backend the health table no longer has (an apply that failed part way):
                // its drain is over, and its deadline with it.
                Ok(None) => {
                    self.drains.remove(&(pool, address));
                    continue;
                }
                Ok(Some(_)) => info!(
                    "pool {pool} backend {address}: drain timeout passed; its remaining flows are \
                     re-selected"
                ),
                Err(e) => error!("pool {pool} backend {address}: writing the eviction failed: {e}"),
            }
            self.health_changed(
                &pool,
                &format!("drain timeout of pool {pool} backend {address}"),
                now,
            );
        }
    }

    /// Forgets the drains of backends the running config no longer has in that pool.
    pub(super) fn forget_removed_drains(&mut self) {
        let publisher = &self.publisher;
        self.drains
            .retain(|(pool, address), _| publisher.backend_slot(pool, *address).is_some());
    }
}
