//! The running agent's circuit breakers (`pools[].breaker`, [`crate::breaker`]): one per
//! backend of a pool that has one, fed by probe results and the program's failure signals,
//! each transition written to the health table (and so to the maps), the audit log, the
//! metrics and the `backend.<address>.breaker_open` built-in.
//!
//! An apply keeps a carried-over backend's breaker (with the new thresholds); a restart starts
//! every breaker closed.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    time::{Duration, Instant},
};

use log::{error, warn};
use router_common::BackendSignals;

use super::runtime::Runtime;
use crate::{
    breaker::{Breaker, Phase},
    dataplane::counters::Snapshot,
};

/// Breakers by (pool, backend address), and the signal totals of the last sample by backend
/// slot.
#[derive(Default)]
pub struct Breakers {
    machines: BTreeMap<(String, IpAddr), Breaker>,
    last: HashMap<u32, (BackendSignals, u64)>,
}

impl Breakers {
    /// The phase of the breaker of `address` in `pool` and when it began (engine time), if the
    /// pool has breakers.
    #[must_use]
    pub fn get(&self, pool: &str, address: IpAddr) -> Option<(Phase, Duration)> {
        self.machines
            .get(&(pool.to_owned(), address))
            .map(|b| (b.phase(), b.since()))
    }
}

impl Runtime {
    /// Makes the breakers those of the running config: one per backend of a pool with a
    /// breaker, carried-over ones kept (reconfigured), the rest gone.
    pub(super) fn sync_breakers(&mut self) {
        let now = self.now();
        let mut kept = BTreeMap::new();
        for p in &self.config.pools {
            let Some(config) = p.breaker else { continue };
            for b in &p.backends {
                let key = (p.name.clone(), b.address);
                let machine = match self.breakers.machines.remove(&key) {
                    Some(mut m) => {
                        m.reconfigure(config);
                        m
                    }
                    None => Breaker::new(config, now),
                };
                kept.insert(key, machine);
            }
        }
        self.breakers.machines = kept;
    }

    /// A probe of `address` in `pool` passed or failed.
    pub(super) fn breaker_probe(&mut self, pool: &str, address: IpAddr, passed: bool) {
        let now = self.now();
        let key = (pool.to_owned(), address);
        let Some(m) = self.breakers.machines.get_mut(&key) else {
            return;
        };
        let from = m.phase();
        let moved = if passed {
            m.success(now)
        } else {
            m.failure(now, 1)
        };
        if let Some(to) = moved {
            let cause = if passed {
                "probes passed"
            } else {
                "failed probes"
            };
            self.breaker_moved(pool, address, from, to, cause);
        }
    }

    /// Counts the program's failure signals since the last sample: each RST and retransmitted
    /// SYN is a failure; a backend that took packets and sent none is a success.
    pub(super) fn breaker_signals(&mut self, snap: &Snapshot) {
        if self.breakers.machines.is_empty() {
            return;
        }
        let now = self.now();
        let mut pending = Vec::new();
        let signals_of: HashMap<u32, BackendSignals> = snap.signals.iter().copied().collect();
        let packets_of: HashMap<u32, u64> =
            snap.backends.iter().map(|(s, t)| (*s, t.packets)).collect();
        // The backends of pools with breakers only.
        let slots: Vec<(String, IpAddr, u32)> = self
            .publisher
            .pools()
            .iter()
            .flat_map(|(name, p)| p.backends.iter().map(|b| (name.clone(), b.address, b.slot)))
            .filter(|(name, address, _)| {
                self.breakers
                    .machines
                    .contains_key(&(name.clone(), *address))
            })
            .collect();
        let mut last = HashMap::new();
        for (pool, address, slot) in slots {
            let signals = signals_of.get(&slot).copied().unwrap_or_default();
            let packets = packets_of.get(&slot).copied().unwrap_or(0);
            let before = self.breakers.last.get(&slot).copied();
            last.insert(slot, (signals, packets));
            // A slot first seen in this sample (or reused) has no baseline yet.
            let Some((was, was_packets)) = before else {
                continue;
            };
            let Some(m) = self.breakers.machines.get_mut(&(pool.clone(), address)) else {
                continue;
            };
            let failures = signals.rsts.saturating_sub(was.rsts)
                + signals.syn_retransmits.saturating_sub(was.syn_retransmits);
            let from = m.phase();
            let moved = if failures > 0 {
                m.failure(now, failures)
                    .map(|to| (to, "RSTs and unanswered SYNs"))
            } else if packets > was_packets {
                m.success(now).map(|to| (to, "traffic without failures"))
            } else {
                None
            };
            if let Some((to, cause)) = moved {
                pending.push((pool, address, from, to, cause));
            }
        }
        self.breakers.last = last;
        for (pool, address, from, to, cause) in pending {
            self.breaker_moved(&pool, address, from, to, cause);
        }
    }

    /// When the next open breaker ends (engine time).
    pub(super) fn next_breaker_deadline(&self) -> Option<Duration> {
        self.breakers
            .machines
            .values()
            .filter_map(Breaker::deadline)
            .min()
    }

    /// Moves every open breaker whose recovery timeout passed to half-open.
    pub(super) fn expire_breakers(&mut self) {
        let now = self.now();
        let mut pending = Vec::new();
        for ((pool, address), m) in &mut self.breakers.machines {
            let from = m.phase();
            if let Some(to) = m.tick(now) {
                pending.push((pool.clone(), *address, from, to));
            }
        }
        for (pool, address, from, to) in pending {
            self.breaker_moved(&pool, address, from, to, "recovery timeout");
        }
    }

    /// Whether the breaker of `address` in `pool` may open: the pool keeps another usable
    /// backend, and at most half of its backends are open at once (Envoy's
    /// `max_ejection_percent` guards the same): failures a client can provoke (RSTs to bare
    /// ACKs, forged SYNs) never take a whole pool out.
    fn may_open(&self, pool: &str, address: IpAddr) -> bool {
        let health = self.publisher.health();
        let backends = health.pool(pool);
        let others_usable = backends
            .iter()
            .filter(|b| b.address != address && b.usable())
            .count();
        let open = backends
            .iter()
            .filter(|b| b.address != address && b.breaker == Phase::Open)
            .count();
        others_usable >= 1 && (open + 1) * 2 <= backends.len()
    }

    /// Writes a breaker's transition: the health table and the maps, the audit log, the
    /// metrics, the log and the rules' built-ins. A breaker that may not open
    /// ([`Runtime::may_open`]) is held closed instead, and that is logged.
    fn breaker_moved(&mut self, pool: &str, address: IpAddr, from: Phase, to: Phase, cause: &str) {
        if to == Phase::Open && !self.may_open(pool, address) {
            let now = self.now();
            if let Some(m) = self.breakers.machines.get_mut(&(pool.to_owned(), address)) {
                m.hold(now);
            }
            if from == Phase::Closed {
                warn!(
                    "pool {pool} backend {address}: circuit breaker held closed ({cause}): \
                     opening it would leave the pool without another usable backend or with \
                     more than half its backends open"
                );
            } else {
                self.breaker_moved(
                    pool,
                    address,
                    from,
                    Phase::Closed,
                    "held: the pool needs it",
                );
            }
            return;
        }
        let event = Instant::now();
        match self
            .publisher
            .set_breaker(&mut self.maps, pool, address, to)
        {
            Ok(_) => warn!(
                "pool {pool} backend {address}: circuit breaker {} → {} ({cause})",
                from.name(),
                to.name()
            ),
            Err(e) => error!("pool {pool} backend {address}: writing the breaker failed: {e}"),
        }
        self.metrics
            .breaker_transitions
            .get_or_create(&vec![
                ("pool", pool.to_owned()),
                ("backend", address.to_string()),
                ("to", to.name().to_owned()),
            ])
            .inc();
        let mut record = rules::engine::AuditRecord::breaker(self.now(), pool, cause);
        record
            .values
            .insert("backend".to_owned(), address.to_string());
        record
            .values
            .insert("from".to_owned(), from.name().to_owned());
        record.values.insert("to".to_owned(), to.name().to_owned());
        self.audit.push(record);
        self.health_changed(
            pool,
            &format!("pool {pool} backend {address} breaker"),
            event,
        );
    }
}
