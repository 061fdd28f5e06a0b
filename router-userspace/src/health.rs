//! The one backend-health table: for each pool, each backend's health-check verdict and
//! whether its next hop is resolved. A backend takes new flows (is *usable*) only when both
//! hold.
//!
//! Everything that needs health reads it here: the publisher builds the Maglev tables and the
//! backend entries from it, the state store derives `pool.<name>.*` and
//! `backend.<address>.healthy` from it, and decision groups' `require` and emergency exit count
//! its usable backends. Nothing else keeps a copy, so the rules and the maps cannot disagree.
//!
//! Where a backend's verdict starts:
//! - A backend **new** to a health-checked pool of the running config (added by an apply, or
//!   by the first apply of an agent that resumed its maps) is not healthy until it has passed
//!   its check — `healthy_threshold` probes in a row — and gets no new flow before
//!   ([`BackendHealth::awaiting_check`]). A backend added while its server is down never
//!   takes a flow it would refuse.
//! - A backend **carried over** (same pool name and address in the running config, or the same
//!   address in a pool that is gone: a renamed pool) keeps its verdict, waiting included.
//! - A backend resumed from the maps an earlier agent left keeps the verdict its map entry
//!   holds: a restart takes no serving backend out of service.
//! - At a **cold start** (no running config: no pinned maps, or maps without a version to
//!   resume them from) every backend starts healthy, as `HAProxy`'s servers (`init-state up`,
//!   its default) and keepalived's real servers (without `alpha`) do: a balancer that was not
//!   serving serves at once, and a dead backend is out after `unhealthy_threshold` failed
//!   probes.
//! - A backend of a pool without a health check is always healthy (nothing would ever probe
//!   it back up).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
};

use crate::{breaker::Phase, config::Config};

/// An operator's drain of one backend in one pool (`switchyard ctl backend drain`), as
/// `HAProxy`'s `set server … state drain` and IPVS's weight 0 do it: new flows avoid the
/// backend, its tracked flows stay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Drain {
    /// Not drained.
    #[default]
    Off,
    /// No new flows; tracked flows stay on it.
    Draining,
    /// The drain's timeout passed: its tracked flows are re-selected as well (as for a backend
    /// that is down), until the drain ends.
    Evicted,
}

/// One backend of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendHealth {
    /// Its address.
    pub address: IpAddr,
    /// The health check's verdict after thresholds: `true` until a check says otherwise for a
    /// backend that starts healthy, `false` while it [awaits its first
    /// check](Self::awaiting_check), always `true` for a pool without a check.
    pub healthy: bool,
    /// New to a health-checked pool of the running config and not yet through its first
    /// check (`healthy_threshold` passed probes in a row): not healthy until then. Implies
    /// `!healthy`; cleared by the first healthy verdict.
    pub awaiting_check: bool,
    /// Whether its next hop is resolved (always, when nobody manages next hops).
    pub reachable: bool,
    /// The operator's drain.
    pub drain: Drain,
    /// Its circuit breaker's phase (`crate::breaker`; closed in a pool without one): open
    /// takes no new flows and keeps tracked ones, as a drain; half-open takes a trial share.
    pub breaker: Phase,
}

impl BackendHealth {
    /// Takes new flows: healthy, reachable, not drained and its breaker not open.
    #[must_use]
    pub fn usable(&self) -> bool {
        self.healthy && self.reachable && self.drain == Drain::Off && self.breaker != Phase::Open
    }

    /// Why it takes no new flows, `None` when it does ([`usable`](Self::usable)): the health
    /// check first ([`AWAITING_FIRST_CHECK`], `health check failed`), then its next hop
    /// (`no next hop`), then the operator's drain (`drained`, `drained, timeout passed`).
    #[must_use]
    pub fn reason(&self) -> Option<&'static str> {
        if self.awaiting_check {
            Some(AWAITING_FIRST_CHECK)
        } else if !self.healthy {
            Some("health check failed")
        } else if !self.reachable {
            Some("no next hop")
        } else {
            match (self.drain, self.breaker) {
                (Drain::Off, Phase::Open) => Some("circuit breaker open"),
                (Drain::Off, _) => None,
                (Drain::Draining, _) => Some("drained"),
                (Drain::Evicted, _) => Some("drained, timeout passed"),
            }
        }
    }
}

/// [`BackendHealth::reason`] of a backend that [awaits its first
/// check](BackendHealth::awaiting_check).
pub const AWAITING_FIRST_CHECK: &str = "waiting for its first check";

/// The table.
#[derive(Clone, Debug, Default)]
pub struct Health {
    pools: BTreeMap<String, Pool>,
    /// The next hop of each backend address, as last reported: `true` resolved.
    resolved: HashMap<IpAddr, bool>,
    /// Whether an address with no report is unreachable (the agent, which resolves next hops)
    /// or reachable (nobody manages next hops: tests and benchmarks).
    require_hops: bool,
    /// Whether the table holds a running config (it was configured, or resumed from maps):
    /// from then on a backend new to a checked pool awaits its first check. Before, at a cold
    /// start, every backend starts healthy.
    running: bool,
}

#[derive(Clone, Debug, Default)]
struct Pool {
    backends: Vec<BackendHealth>,
}

impl Health {
    /// An empty table whose backends are reachable without a next-hop report.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the table hold `cfg`'s pools. A backend that stays in its pool keeps its verdict
    /// (awaiting its first check included) while the pool has a health check, and its drain;
    /// an address whose earlier pool is gone keeps the verdict it had there (a renamed pool
    /// keeps its backends' verdicts). A new backend of a checked pool awaits its first check,
    /// unless the table held no running config yet (a cold start: healthy). Every backend of
    /// a pool without a check is healthy. Next-hop reports of addresses no pool has any more
    /// are forgotten: an address that comes back waits for a new report.
    pub fn configure(&mut self, cfg: &Config) {
        let old = std::mem::take(&mut self.pools);
        let previous = |pool: &str, address: IpAddr| {
            old.get(pool)
                .and_then(|p| p.backends.iter().find(|b| b.address == address))
        };
        let drain =
            |pool: &str, address: IpAddr| previous(pool, address).map_or(Drain::Off, |b| b.drain);
        let breaker = |pool: &crate::config::model::Pool, address: IpAddr| {
            pool.breaker
                .and_then(|_| previous(&pool.name, address))
                .map_or(Phase::Closed, |b| b.breaker)
        };
        let verdict = |pool: &str, address: IpAddr| {
            previous(pool, address)
                .or_else(|| {
                    old.iter()
                        .filter(|(name, _)| cfg.pools.iter().all(|p| &p.name != *name))
                        .find_map(|(_, p)| p.backends.iter().find(|b| b.address == address))
                })
                .map(|b| (b.healthy, b.awaiting_check))
        };
        // A backend the running config does not have: healthy at a cold start, else not until
        // its first check passes.
        let new = if self.running {
            (false, true)
        } else {
            (true, false)
        };
        let configured: HashSet<IpAddr> = cfg
            .pools
            .iter()
            .flat_map(|p| p.backends.iter().map(|b| b.address))
            .collect();
        self.resolved.retain(|a, _| configured.contains(a));
        for p in &cfg.pools {
            let checked = p.health_check.is_some();
            let backends = p
                .backends
                .iter()
                .map(|b| {
                    let (healthy, awaiting_check) = if checked {
                        verdict(&p.name, b.address).unwrap_or(new)
                    } else {
                        (true, false)
                    };
                    BackendHealth {
                        address: b.address,
                        healthy,
                        awaiting_check,
                        reachable: self.reachable(b.address),
                        drain: drain(&p.name, b.address),
                        breaker: breaker(p, b.address),
                    }
                })
                .collect();
            self.pools.insert(p.name.clone(), Pool { backends });
        }
        self.running = true;
    }

    /// From now on the table holds a running config, even one without backends (maps resumed
    /// from a version with no pool): a backend of a later config that it does not have awaits
    /// its first check.
    pub fn mark_running(&mut self) {
        self.running = true;
    }

    /// Puts a resumed backend's state back (an agent restarted over pinned maps): its verdict
    /// and whether its slot holds a resolved next hop. The table holds a running config from
    /// now on ([`mark_running`](Self::mark_running)).
    pub fn resume(&mut self, pool: &str, address: IpAddr, healthy: bool, resolved: bool) {
        self.running = true;
        if resolved {
            self.resolved.insert(address, true);
        }
        let reachable = self.reachable(address);
        let p = self.pools.entry(pool.to_owned()).or_default();
        p.backends.push(BackendHealth {
            address,
            healthy,
            awaiting_check: false,
            reachable,
            drain: Drain::Off,
            breaker: Phase::Closed,
        });
    }

    /// From now on, a backend needs a resolved next hop. A resumed backend whose slot holds no
    /// resolved next hop becomes unreachable, and its verdict unknown — healthy until a probe
    /// says otherwise (its down entry is explained by the missing next hop, and its pool may
    /// have no check to bring it up). A backend awaiting its first check keeps waiting.
    pub fn require_next_hops(&mut self) {
        self.require_hops = true;
        let resolved = &self.resolved;
        for b in self.pools.values_mut().flat_map(|p| p.backends.iter_mut()) {
            if resolved.get(&b.address) != Some(&true) && b.reachable {
                b.reachable = false;
                b.healthy = !b.awaiting_check;
            }
        }
    }

    fn reachable(&self, address: IpAddr) -> bool {
        self.resolved
            .get(&address)
            .copied()
            .unwrap_or(!self.require_hops)
    }

    /// A health check's verdict on `address` in `pool`. Returns whether the verdict changed.
    /// A healthy verdict ends a wait for the first check; an unhealthy one leaves it waiting.
    /// Unknown pools or addresses are ignored. A verdict on a pool without a check (the agent
    /// takes none: its probes run only for checked pools) holds until the next
    /// [`configure`](Self::configure).
    pub fn set_check(&mut self, pool: &str, address: IpAddr, healthy: bool) -> bool {
        let Some(b) = self
            .pools
            .get_mut(pool)
            .and_then(|p| p.backends.iter_mut().find(|b| b.address == address))
        else {
            return false;
        };
        let changed = b.healthy != healthy;
        b.healthy = healthy;
        if healthy {
            b.awaiting_check = false;
        }
        changed
    }

    /// Drains `address` in `pool`, or ends its drain ([`Drain::Off`]). Returns whether it
    /// changed, `None` when the pool has no such backend.
    pub fn set_drain(&mut self, pool: &str, address: IpAddr, drain: Drain) -> Option<bool> {
        let b = self
            .pools
            .get_mut(pool)?
            .backends
            .iter_mut()
            .find(|b| b.address == address)?;
        let changed = b.drain != drain;
        b.drain = drain;
        Some(changed)
    }

    /// Whether a circuit breaker of `address` is open, in any pool that has it.
    #[must_use]
    pub fn breaker_open(&self, address: IpAddr) -> bool {
        self.pools
            .values()
            .flat_map(|p| p.backends.iter())
            .any(|b| b.address == address && b.breaker == Phase::Open)
    }

    /// Sets the breaker phase of `address` in `pool`. Returns whether it changed, `None` when
    /// the pool has no such backend.
    pub fn set_breaker(&mut self, pool: &str, address: IpAddr, phase: Phase) -> Option<bool> {
        let b = self
            .pools
            .get_mut(pool)?
            .backends
            .iter_mut()
            .find(|b| b.address == address)?;
        let changed = b.breaker != phase;
        b.breaker = phase;
        Some(changed)
    }

    /// A next-hop report for `address` (`true` resolved), in every pool that has it. Returns
    /// the pools where a backend's usability changed.
    pub fn set_next_hop(&mut self, address: IpAddr, resolved: bool) -> Vec<String> {
        self.resolved.insert(address, resolved);
        let mut changed = Vec::new();
        for (name, p) in &mut self.pools {
            for b in p.backends.iter_mut().filter(|b| b.address == address) {
                let was = b.usable();
                b.reachable = resolved;
                if was != b.usable() && !changed.contains(name) {
                    changed.push(name.clone());
                }
            }
        }
        changed
    }

    /// The backend `address` of `pool`.
    #[must_use]
    pub fn get(&self, pool: &str, address: IpAddr) -> Option<BackendHealth> {
        self.pools
            .get(pool)?
            .backends
            .iter()
            .find(|b| b.address == address)
            .copied()
    }

    /// Whether `address` in `pool` takes new flows (`false` when unknown).
    #[must_use]
    pub fn usable(&self, pool: &str, address: IpAddr) -> bool {
        self.get(pool, address).is_some_and(|b| b.usable())
    }

    /// The backends of `pool`, in configuration order (empty when unknown).
    #[must_use]
    pub fn pool(&self, pool: &str) -> &[BackendHealth] {
        self.pools.get(pool).map_or(&[], |p| p.backends.as_slice())
    }

    /// Every pool with its backends.
    pub fn pools(&self) -> impl Iterator<Item = (&str, &[BackendHealth])> {
        self.pools
            .iter()
            .map(|(n, p)| (n.as_str(), p.backends.as_slice()))
    }

    /// `(usable, total)` backends of `pool` (`(0, 0)` when unknown).
    #[must_use]
    pub fn counts(&self, pool: &str) -> (usize, usize) {
        let b = self.pool(pool);
        (b.iter().filter(|b| b.usable()).count(), b.len())
    }

    /// The addresses usable in at least one pool.
    #[must_use]
    pub fn usable_addresses(&self) -> HashSet<IpAddr> {
        self.pools
            .values()
            .flat_map(|p| p.backends.iter())
            .filter(|b| b.usable())
            .map(|b| b.address)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_files;

    fn cfg(check: bool) -> Config {
        let hc = if check {
            "    health_check: { tcp: { port: 80 }, interval: 1s, timeout: 300ms }\n"
        } else {
            ""
        };
        let text = format!(
            "services:\n  - {{ name: web, vip: \"203.0.113.10\", port: 80, protocol: tcp, forward: \
             dsr-l2, to: {{ pool: dc1 }} }}\npools:\n  - name: dc1\n{hc}    backends:\n      - {{ \
             address: \"198.18.1.11\" }}\n      - {{ address: \"198.18.1.12\" }}\n"
        );
        load_files(&[("a.yaml".into(), text)]).expect("config")
    }

    fn a(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn a_verdict_stays_while_the_pool_is_checked_and_ends_with_its_check() {
        let mut h = Health::new();
        h.configure(&cfg(true));
        assert!(h.set_check("dc1", a("198.18.1.11"), false));
        assert!(!h.set_check("dc1", a("198.18.1.11"), false));
        h.configure(&cfg(true));
        assert_eq!(h.counts("dc1"), (1, 2));
        // Nothing probes a pool without a check: a backend its removed check had marked down
        // would stay down for good.
        h.configure(&cfg(false));
        assert_eq!(h.counts("dc1"), (2, 2));
    }

    #[test]
    fn a_backend_new_to_a_running_checked_pool_awaits_its_first_check() {
        let mut h = Health::new();
        let mut one = cfg(true);
        one.pools[0].backends.truncate(1);
        // A cold start: nothing runs yet, every backend serves.
        h.configure(&one);
        assert_eq!(h.counts("dc1"), (1, 1));
        h.configure(&cfg(true));
        let new = h.get("dc1", a("198.18.1.12")).expect("configured");
        assert!(new.awaiting_check && !new.healthy && !new.usable());
        assert_eq!(new.reason(), Some(AWAITING_FIRST_CHECK));
        // A failed probe leaves it waiting; a healthy verdict ends the wait.
        assert!(!h.set_check("dc1", a("198.18.1.12"), false));
        assert!(
            h.get("dc1", a("198.18.1.12"))
                .is_some_and(|b| b.awaiting_check)
        );
        assert!(h.set_check("dc1", a("198.18.1.12"), true));
        let up = h.get("dc1", a("198.18.1.12")).expect("configured");
        assert!(up.usable() && !up.awaiting_check && up.reason().is_none());
        // Next hops required later do not end a wait as they end an unknown verdict.
        h.configure(&one);
        h.configure(&cfg(true));
        h.require_next_hops();
        assert!(
            h.get("dc1", a("198.18.1.12"))
                .is_some_and(|b| b.awaiting_check && !b.healthy && !b.reachable)
        );
        assert_eq!(
            h.get("dc1", a("198.18.1.11")).and_then(|b| b.reason()),
            Some("no next hop")
        );
    }

    #[test]
    fn a_backend_needs_a_resolved_next_hop_when_next_hops_are_required() {
        let mut h = Health::new();
        h.require_next_hops();
        h.configure(&cfg(true));
        assert_eq!(h.counts("dc1"), (0, 2));
        assert_eq!(
            h.set_next_hop(a("198.18.1.12"), true),
            vec!["dc1".to_owned()]
        );
        assert!(h.usable("dc1", a("198.18.1.12")));
        assert!(h.set_next_hop(a("198.18.1.12"), true).is_empty());
        assert_eq!(
            h.set_next_hop(a("198.18.1.12"), false),
            vec!["dc1".to_owned()]
        );
        assert_eq!(h.counts("dc1"), (0, 2));
    }
}
