//! Answers to [`super::command::Query`]: snapshots of the runtime for `status`, `ctl` and
//! `/metrics`, taken between two commands.

use std::net::IpAddr;

use rules::Value;

use super::{now_secs, runtime::Runtime};
use crate::{
    api::{
        ctl::StateEntry,
        metrics::{BackendRow, Scrape},
        status::{
            BackendStatus, BreakerStatus, DrainStatus, InterfaceStatus, LeftStatus, NextHopStatus,
            PoolStatus, ServiceStatus, Status, VipStatus, modes_in_use, protocol,
        },
    },
    config,
    dataplane::{counters, load},
    decision::{GroupExplanation, View},
};

impl Runtime {
    /// Each published virtual IP, whether its entry is live and whether it is announced.
    fn vip_statuses(&self) -> Vec<VipStatus> {
        self.publisher
            .vips()
            .iter()
            .map(|(address, v)| VipStatus {
                address: address.to_string(),
                live: v
                    .written
                    .is_some_and(|w| w.flags & router_common::VIP_F_LIVE != 0),
                announced: self.announced.as_ref().map(|on| on.contains(address)),
            })
            .collect()
    }

    /// Every pool in `/status`: its table's fingerprint, backends, drains and breakers.
    fn pool_statuses(&self) -> Vec<PoolStatus> {
        self.publisher
            .pools()
            .iter()
            .map(|(name, p)| PoolStatus {
                name: name.clone(),
                table: p.table_digest().map(|d| format!("{d:016x}")),
                second_chance: p.second_chance_until().is_some(),
                left: self.left.get(name).map(|l| LeftStatus {
                    group: l.group.clone(),
                    policy: l.policy.name().to_owned(),
                    slots: p.backends.iter().map(|b| b.slot).collect(),
                    open_flows: None,
                }),
                backends: p
                    .backends
                    .iter()
                    .map(|b| BackendStatus {
                        address: b.address.to_string(),
                        weight: b.weight,
                        effective_weight: b.ramp.and_then(|_| p.weight_in_table(b.slot)),
                        healthy: self.publisher.health().usable(name, b.address),
                        reason: self
                            .publisher
                            .health()
                            .get(name, b.address)
                            .map_or(Some("not in the health table"), |h| h.reason())
                            .map(str::to_owned),
                        probe: self.probes.get(&(name.clone(), b.address)).cloned(),
                        next_hop: Some(
                            self.next_hops
                                .get(&b.address)
                                .cloned()
                                .unwrap_or_else(|| NextHopStatus::resolving("resolving".into())),
                        ),
                        drain: self
                            .drains
                            .get(&(name.clone(), b.address))
                            .map(|d| DrainStatus {
                                since: d.since,
                                until: d.until.map(|(_, secs)| secs),
                                evicted: self.evicted(name, b.address),
                                slot: b.slot,
                                open_flows: None,
                            }),
                        breaker: self.breakers.get(name, b.address).map(|(phase, since)| {
                            BreakerStatus {
                                phase,
                                for_secs: self.now().saturating_sub(since).as_secs(),
                            }
                        }),
                    })
                    .collect(),
            })
            .collect()
    }

    /// The status document.
    pub(super) fn status(&self) -> Status {
        let services = self
            .config
            .services
            .iter()
            .map(|s| ServiceStatus {
                name: s.name.clone(),
                address: match s.vip {
                    IpAddr::V4(a) => format!("{a}:{}/{}", s.port, protocol(s.protocol)),
                    IpAddr::V6(a) => format!("[{a}]:{}/{}", s.port, protocol(s.protocol)),
                },
                forward: match s.forward {
                    config::Forward::DsrL2 => "dsr-l2".to_owned(),
                    config::Forward::Nat => "nat".to_owned(),
                    config::Forward::Ipip(range) => format!("ipip from {range}"),
                },
                to: match &s.to {
                    config::Target::Pool(p) => format!("pool {p}"),
                    config::Target::Decide(g) => format!("decide {g}"),
                    config::Target::Split(v) => v
                        .iter()
                        .map(|x| format!("{} {}", x.pool, x.weight))
                        .collect::<Vec<_>>()
                        .join(" / "),
                },
            })
            .collect();
        let pools = self.pool_statuses();
        // The pinned link says which program runs now (it follows `switchyard upgrade` and
        // adopted links), whether it still runs on the interface, and the interface in which
        // mode: read from the kernel each time, never the mode asked for.
        let interfaces: Vec<InterfaceStatus> = self
            .interfaces
            .iter()
            .map(|(name, _)| {
                InterfaceStatus::of(&load::pin_dir(&self.config.agent.pin_path), name, self.mode)
            })
            .collect();
        Status {
            generation: self.publisher.generation(),
            config_dir: self.config_dir.display().to_string(),
            mode: modes_in_use(&interfaces),
            requested_mode: self.mode.map(|m| m.name().to_owned()),
            interfaces,
            services,
            pools,
            rejected: self.rejected.clone(),
            running: self.running.clone(),
            vips: self.vip_statuses(),
            differs_from_files: self.differs_from_files(),
            hooks: self.hooks.status(),
            fleet: self.fleet_status(),
            time: now_secs(),
        }
    }
}

impl Runtime {
    /// Every variable and built-in (but `target.*`) with its value and source.
    pub(super) fn state_entries(&self) -> Vec<StateEntry> {
        self.store
            .values()
            .filter(|(n, _)| !n.starts_with("target."))
            .map(|(n, v)| StateEntry {
                name: n.to_owned(),
                value: v.to_string(),
                source: self.store.source_of(n).to_owned(),
            })
            .collect()
    }

    /// `group` explained over the live state, or over a copy with `sets` applied.
    pub(super) fn explain(
        &self,
        group: &str,
        sets: &[(String, String)],
    ) -> Result<GroupExplanation, String> {
        let hypothetical;
        let state = if sets.is_empty() {
            self.store.state()
        } else {
            hypothetical = self.store.hypothetical(sets).map_err(|e| e.to_string())?;
            &hypothetical
        };
        let view = View {
            state,
            health: self.publisher.health(),
            now: self.now(),
        };
        let mut e = self
            .driver
            .explain(group, view)
            .map_err(|e| e.to_string())?;
        if self.fleet.is_some() {
            let role = if self.driver.leads(group) {
                "leader"
            } else {
                "follower"
            };
            e.text = format!(
                "fleet: this node is the group's {role}{}\n{}",
                if role == "follower" {
                    " (its maps hold the leader's decision; this is its own evaluation)"
                } else {
                    ""
                },
                e.text
            );
            e.fleet_role = Some(role.to_owned());
        }
        Ok(e)
    }

    /// What `/metrics` reads at scrape time: the program's counters, every backend, the state
    /// values and the decision counts of the audit ring.
    pub(super) fn scrape(&self) -> Scrape {
        let pools = self.publisher.pools();
        let services = self.publisher.services();
        let counters = counters::snapshot(
            &self.maps,
            services.values().map(|s| s.value.id),
            pools
                .values()
                .flat_map(|p| p.backends.iter().map(|b| b.slot)),
        );
        let health = self.publisher.health();
        let weights = &self.weights;
        let backends = pools
            .iter()
            .flat_map(|(pool, p)| {
                p.backends.iter().map(move |b| {
                    let h = health.get(pool, b.address);
                    let computed = weights
                        .pool(pool)
                        .and_then(|w| w.backends.iter().find(|w| w.address == b.address))
                        .map(|w| w.computed);
                    BackendRow {
                        pool: pool.clone(),
                        address: b.address,
                        slot: b.slot,
                        healthy: h.is_some_and(|h| h.healthy),
                        awaiting_check: h.is_some_and(|h| h.awaiting_check),
                        reachable: h.is_some_and(|h| h.reachable),
                        drain: h.map(|h| h.drain).unwrap_or_default(),
                        breaker: h.map(|h| h.breaker).unwrap_or_default(),
                        weight_computed: computed,
                        weight_effective: p.weight_in_table(b.slot).unwrap_or(0),
                    }
                })
            })
            .collect();
        let state = self
            .store
            .values()
            .filter_map(|(name, v)| match v {
                Value::Bool(b) => Some((name.to_owned(), f64::from(u8::from(*b)))),
                Value::Number(n) => Some((name.to_owned(), *n)),
                _ => None,
            })
            .collect();
        let classes = if self.config.classes.is_empty() {
            Vec::new()
        } else {
            self.classes_view().classes
        };
        Scrape {
            classes,
            counters,
            services: services
                .iter()
                .map(|(n, s)| (n.clone(), s.value.id))
                .collect(),
            backends,
            state,
            overrides: self.driver.active_overrides(),
            canaries: self.driver.canaries(),
            announced: self.announced.as_ref().map_or_else(Vec::new, |on| {
                self.publisher
                    .vips()
                    .keys()
                    .map(|a| (*a, on.contains(a)))
                    .collect()
            }),
        }
    }
}
