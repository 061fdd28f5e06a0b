//! The runtime: everything the running agent knows, behind one mutator.
//!
//! The event loop owns the [`Runtime`] and is the only caller of [`Runtime::execute`]; the API
//! sends [`Command`]s and reads [`Query`] answers. The pipeline of every command is the same:
//! event → state (the health table, the state store) → decide (the pure driver) → publish (the
//! publisher writes the maps) → what the operator sees (status, metrics, the audit trail). A
//! health or next-hop change is published as it enters the health table (its pool's table and
//! entries, in their safe order), before the groups that read it decide.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    path::PathBuf,
    time::Instant,
};

use log::{error, info};
use rules::{
    Slot,
    engine::{AuditKind, By},
};
use tokio::sync::mpsc;

use super::{
    apply::Running,
    command::{Command, Published, Query},
    rates::RateSampler,
    recorder::Recorder,
};
use crate::{
    api::{
        metrics::Metrics,
        status::{NextHopStatus, ProbeStatus},
    },
    config::Config,
    dataplane::{attach::Attached, attach::Mode, maps::KernelMaps},
    decision::{Audit, Decided, Driver, View},
    nexthop::Resolver,
    probe::{self, HealthEvent, ProbeSet, Subject},
    publish::Publisher,
    state::Store,
};

/// The running agent's state. Fields are the agent module's; nothing outside it changes them.
pub struct Runtime {
    /// The map writer, what it published, and the backend-health table.
    pub(super) publisher: Publisher,
    /// The maps.
    pub(super) maps: KernelMaps,
    /// The running config.
    pub(super) config: Config,
    /// Where it came from.
    pub(super) config_dir: PathBuf,
    /// Interfaces and how they were attached.
    pub(super) interfaces: Vec<(String, Attached)>,
    /// The XDP mode `--mode` asked for, `None` when it was not given. What runs is read from
    /// the kernel (`status`); this only says whether an adopted attachment differs.
    pub(super) mode: Option<Mode>,
    /// Last probe per (pool, backend).
    pub(super) probes: HashMap<(String, IpAddr), ProbeStatus>,
    /// The running probes (dropping them stops them).
    pub(super) probe_set: Option<ProbeSet>,
    /// Where probes report.
    pub(super) probe_tx: mpsc::Sender<HealthEvent>,
    /// The last rejected change of the config directory, with its errors, until one applies.
    pub(super) rejected: Option<String>,
    /// Agent metrics.
    pub(super) metrics: Metrics,
    /// The live state.
    pub(super) store: Store,
    /// The decision groups.
    pub(super) driver: Driver,
    /// The audit trail.
    pub(super) audit: Audit,
    /// Engine time is the time since this instant.
    pub(super) started: Instant,
    /// The running config's version.
    pub(super) running: Running,
    /// The history store's thread.
    pub(super) recorder: Recorder,
    /// The loop's own queue, for what finishes elsewhere (a history record).
    pub(super) commands: mpsc::Sender<Command>,
    /// Content hash of the config directory's fragments when it was last read: the watch
    /// applies the directory only when its fragments changed since, so after a rollback an
    /// event that changes no fragment does not apply the files again; `status` compares it with
    /// the running hash. Empty when the last read failed.
    pub(super) seen: String,
    /// Resolves and follows every backend's next hop (`None` only without netlink).
    pub(super) resolver: Option<Resolver>,
    /// What the agent last made of each backend address's next hop, for `status`.
    pub(super) next_hops: BTreeMap<IpAddr, NextHopStatus>,
    /// Interfaces the program is attached to, by ifindex: the only ones a next hop may
    /// leave by (they are the redirect targets in `TX_PORTS`).
    pub(super) egress: BTreeMap<u32, String>,
    /// Counter rates between two samples.
    pub(super) sampler: RateSampler,
    /// Operators' drains.
    pub(super) drains: super::drains::Drains,
    /// Backends' circuit breakers.
    pub(super) breakers: super::breakers::Breakers,
    /// Adaptive weights of the pools that have them.
    pub(super) weights: crate::weights::Weights,
    /// The running agent-checks (dropping them stops them).
    pub(super) agent_checks: Option<crate::probe::agent_check::AgentCheckSet>,
    /// Pools a decision group failed back away from, by pool: the group and its
    /// `on_failback` (`agent::failback`).
    pub(super) left: BTreeMap<String, super::failback::Left>,
    /// The virtual IPs announced (routes on the announcement interface), as the event loop
    /// last made them; `None` without `announce:` (`crate::announce`).
    pub(super) announced: Option<std::collections::BTreeSet<IpAddr>>,
    /// The fleet this node belongs to (`fleet:`), `None` when it decides on its own.
    pub(super) fleet: Option<super::fleet::FleetLink>,
    /// The running config's hooks: the loop only offers them events ([`crate::hooks`]).
    pub(super) hooks: crate::hooks::Hooks,
}

/// The hooks' event for the switch `s` of `group`, written now.
fn switch_event(group: &str, s: &rules::engine::Switch) -> crate::hooks::Event {
    crate::hooks::Event::Switch {
        time: crate::fleet::now_ns(),
        group: group.to_owned(),
        from: s.from.as_ref().map(ToString::to_string),
        to: s.to.to_string(),
        by: match &s.by {
            By::Rule(_) => "rule".to_owned(),
            other => other.to_string(),
        },
        rule: match &s.by {
            By::Rule(id) => Some(id.clone()),
            _ => None,
        },
        cause: s.cause.clone(),
    }
}

impl Runtime {
    /// Whether the program counts as attached for the announcement ([`crate::announce`]):
    /// the pinned link of every interface this agent runs on is live (read from the kernel).
    pub(super) fn attached(&self) -> bool {
        let pin_dir = crate::dataplane::load::pin_dir(&self.config.agent.pin_path);
        !self.interfaces.is_empty()
            && self.interfaces.iter().all(|(name, _)| {
                matches!(
                    crate::dataplane::attach::link_state(&pin_dir, name),
                    Ok(crate::dataplane::attach::LinkState::Live(..))
                )
            })
    }

    /// Executes one command.
    pub fn execute(&mut self, command: Command) {
        self.publisher.set_now(self.now());
        match command {
            Command::Health(ev) => self.on_health(&ev),
            Command::NextHops(events) => self.on_next_hops(events),
            Command::Deadline => self.on_deadline(),
            Command::Sample => {
                self.sample();
                self.sync_fleet();
            }
            Command::Fleet(ev) => self.on_fleet(ev),
            Command::ApplyDirectory {
                source,
                only_if_changed,
                reply,
            } => self.apply_directory(source, only_if_changed, reply),
            Command::Apply {
                fragments,
                source,
                reply,
            } if self.fleet.is_some() => self.fleet_rollback(&fragments, &source, reply),
            Command::Apply {
                fragments,
                source,
                reply,
            } => self.apply_fragments(fragments, &source, Some(reply)),
            Command::Recorded { hash, version } => self.recorded(&hash, version),
            Command::SetState {
                name,
                value,
                event,
                reply,
            } if self.fleet.is_some() => {
                let _ = event;
                self.fleet_set_state(name, value, reply);
            }
            Command::SetState {
                name,
                value,
                event,
                reply,
            } => {
                let answer = match self.store.set_push(&name, &value) {
                    Ok(slots) => {
                        let cause = format!("state set {name}={value}");
                        self.decide(&slots, false, &cause, event);
                        Ok(!slots.is_empty())
                    }
                    Err(e) => Err(e.to_string()),
                };
                let _ = reply.send(answer);
            }
            Command::Override {
                group,
                request,
                event: _,
                reply,
            } if self.fleet.is_some() => self.fleet_override(group, request, reply),
            Command::Override {
                group,
                request,
                event,
                reply,
            } => {
                let _ = reply.send(self.set_override(&group, request, event));
            }
            Command::Canary {
                group,
                op,
                event,
                reply,
            } => {
                let _ = reply.send(self.canary_op(&group, op, event));
            }
            Command::Drain {
                pool,
                address,
                op,
                reply,
            } => {
                let _ = reply.send(self.set_drain(&pool, address, op));
            }
            Command::RenewGenerations { slots, reply } => {
                let renewed = self
                    .publisher
                    .renew_generations(&mut self.maps, &slots)
                    .map_err(|e| e.to_string());
                let _ = reply.send(renewed);
            }
            Command::AgentCheck(read) => {
                let now = self.now();
                if self
                    .weights
                    .record_agent(&read.pool, read.address, read.read, now)
                {
                    self.give_weights(&read.pool);
                }
            }
            Command::Query(q) => self.answer(q),
        }
    }

    /// A deadline: drains and breakers that expire, slow-start steps, second chances that
    /// end, adaptive weights that are due, then the decision groups' timers.
    fn on_deadline(&mut self) {
        self.expire_drains();
        self.expire_breakers();
        let now = self.now();
        if self.publisher.next_ramp_step().is_some_and(|at| at <= now) {
            self.advance_ramps();
        }
        if self
            .publisher
            .next_second_chance_end()
            .is_some_and(|at| at <= now)
        {
            match self.publisher.end_second_chances(&mut self.maps) {
                Ok(pools) if !pools.is_empty() => {
                    info!("second chance over in pools {}", pools.join(", "));
                }
                Ok(_) => {}
                Err(e) => error!("ending a second chance failed: {e}"),
            }
        }
        if self.weights.next_due().is_some_and(|at| at <= now) {
            for pool in self.weights.compute_due(now) {
                self.give_weights(&pool);
            }
        }
        self.decide(&[], false, crate::decision::TIMER, Instant::now());
    }

    /// When the next decision deadline falls, as an instant (`None`: none pending, or too far
    /// out to exist: engine time saturates, and an override TTL of billions of years is valid
    /// input).
    #[must_use]
    pub fn next_deadline(&self) -> Option<Instant> {
        let decision = self
            .driver
            .next_deadline()
            .and_then(|d| self.started.checked_add(d));
        let ramp = self
            .publisher
            .next_ramp_step()
            .and_then(|d| self.started.checked_add(d));
        let chance = self
            .publisher
            .next_second_chance_end()
            .and_then(|d| self.started.checked_add(d));
        let breaker = self
            .next_breaker_deadline()
            .and_then(|d| self.started.checked_add(d));
        let weights = self
            .weights
            .next_due()
            .and_then(|d| self.started.checked_add(d));
        [
            decision,
            self.next_drain_deadline(),
            ramp,
            chance,
            breaker,
            weights,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Engine time now.
    pub(super) fn now(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Re-evaluates the groups that read `changed` (every group if `all`) and those whose
    /// deadline passed, and publishes their switches.
    pub(super) fn decide(&mut self, changed: &[Slot], all: bool, cause: &str, event: Instant) {
        let view = View {
            state: self.store.state(),
            health: self.publisher.health(),
            now: self.started.elapsed(),
        };
        let decided = self.driver.on_change(changed, all, view, cause);
        for d in decided {
            self.publish(d, event);
        }
    }

    /// Writes a group's switch (one decision-word write), then keeps its audit records with
    /// the latency from `event` to the completed write.
    pub(super) fn publish(&mut self, mut d: Decided, event: Instant) -> Option<Published> {
        // A fleet member writes only the decisions of the groups it leads; the others come
        // from their leader (`agent::fleet`).
        if self.fleet.is_some() && !self.driver.leads(&d.group) {
            d.switch_to = None;
        }
        let decided_ns = crate::fleet::now_ns();
        self.metrics
            .evaluation
            .get_or_create(&vec![("group", d.group.clone())])
            .observe(d.took.as_secs_f64());
        let mut published = None;
        if let Some(to) = &d.switch_to {
            match self
                .publisher
                .publish_decision(&mut self.maps, &d.group, to)
            {
                Ok(written) => {
                    let latency_us = u64::try_from(event.elapsed().as_micros()).unwrap_or(u64::MAX);
                    if let Some(s) = &d.switched {
                        info!(
                            "decision group {}: {} → {} ({}, {:?}; cause {}) written in \
                             {latency_us} µs",
                            d.group,
                            s.from
                                .as_ref()
                                .map_or("nothing".to_owned(), ToString::to_string),
                            s.to,
                            s.by,
                            s.kind,
                            s.cause
                        );
                    }
                    #[expect(
                        clippy::cast_precision_loss,
                        reason = "a latency in µs, far below 2^52, as seconds for a histogram"
                    )]
                    self.metrics
                        .decision_latency
                        .observe(latency_us as f64 / 1e6);
                    if let Some(s) = &d.switched {
                        self.hooks.emit(&switch_event(&d.group, s));
                    }
                    if let (Some(word), Some(s)) = (written, &d.switched) {
                        let (by, cause) = (s.by.clone(), s.cause.clone());
                        self.send_decision(&d.group, to, &by, word, &cause, Some(decided_ns));
                    }
                    published = written.map(|word| Published {
                        group: d.group.clone(),
                        to: to.clone(),
                        word,
                        latency_us,
                    });
                }
                Err(e) => error!("decision group {}: writing the switch failed: {e}", d.group),
            }
        }
        let flows = match (&published, &d.switched) {
            (Some(_), Some(s)) => self.after_switch(&d.group, s),
            _ => None,
        };
        let show = |a: &Option<rules::engine::Action>| {
            a.as_ref().map_or("none".to_owned(), ToString::to_string)
        };
        for mut record in d.records {
            match record.kind {
                AuditKind::Switch => {
                    record.latency_us = published.as_ref().map(|p| p.latency_us);
                    record.flows.clone_from(&flows);
                    self.metrics
                        .switches
                        .get_or_create(&vec![
                            ("group", record.group.clone()),
                            ("from", show(&record.from)),
                            ("to", show(&record.to)),
                        ])
                        .inc();
                }
                AuditKind::Veto => {
                    self.metrics
                        .vetoes
                        .get_or_create(&vec![("group", record.group.clone())])
                        .inc();
                }
                _ => {}
            }
            self.audit.push(record);
        }
        published
    }

    pub(super) fn set_override(
        &mut self,
        group: &str,
        request: Option<rules::engine::OverrideRequest>,
        event: Instant,
    ) -> Result<Option<Published>, String> {
        if let Some(r) = &request {
            let known = |p: &str| self.publisher.pools().contains_key(p);
            if let Some(p) = r.action.live_pools().find(|p| !known(p)) {
                return Err(format!("unknown pool {p:?}"));
            }
            self.same_family(group, &r.action)?;
        }
        let cause = if request.is_some() {
            "override set"
        } else {
            "override clear"
        };
        let view = View {
            state: self.store.state(),
            health: self.publisher.health(),
            now: self.started.elapsed(),
        };
        let d = self
            .driver
            .set_override(group, request, view, cause)
            .map_err(|e| e.to_string())?;
        Ok(self.publish(d, event))
    }

    /// `ctl canary pause|resume|abort GROUP`: the ramp's change goes through the group's
    /// evaluation, its audit and, when the share changes, the map write, like any switch. A
    /// fleet member changes only the ramps of the groups it leads.
    fn canary_op(
        &mut self,
        group: &str,
        op: rules::engine::CanaryOp,
        event: Instant,
    ) -> Result<(rules::engine::RampStatus, Option<Published>), String> {
        if self.fleet.is_some() && !self.driver.leads(group) {
            return Err(format!(
                "decision group {group:?} is decided by its fleet leader: change its canary \
                 ramp there"
            ));
        }
        let cause = match &op {
            rules::engine::CanaryOp::Pause => "canary pause",
            rules::engine::CanaryOp::Resume => "canary resume",
            rules::engine::CanaryOp::Abort(_) => "canary abort",
        };
        let view = View {
            state: self.store.state(),
            health: self.publisher.health(),
            now: self.started.elapsed(),
        };
        let d = self
            .driver
            .canary_op(group, op, view, cause)
            .map_err(|e| e.to_string())?;
        let published = self.publish(d, event);
        let status = self
            .driver
            .canary_status(group)
            .map_err(|e| e.to_string())?;
        Ok((status, published))
    }

    /// `ctl canary status GROUP`.
    fn canary_view(&self, group: &str) -> Result<crate::api::ctl::CanaryView, String> {
        let ramp = self
            .driver
            .canary_status(group)
            .map_err(|e| e.to_string())?;
        let now = self.now();
        Ok(crate::api::ctl::CanaryView {
            group: group.to_owned(),
            next_step_in_s: ramp
                .next_step_at
                .map(|at| at.saturating_sub(now).as_secs_f64()),
            published: self.driver.published(group).map(ToString::to_string),
            ramp,
        })
    }

    /// Refuses `action` for `group` when one of its pools has a backend of another address
    /// family than a service that uses the group: the program would forward that service's
    /// packets to it. The same rule `validate` applies to a group's pools in the config.
    fn same_family(&self, group: &str, action: &rules::engine::Action) -> Result<(), String> {
        let Some(service) = self
            .config
            .services
            .iter()
            .find(|s| matches!(&s.to, crate::config::Target::Decide(g) if g == group))
        else {
            return Ok(());
        };
        let family = |a: &std::net::IpAddr| if a.is_ipv4() { "IPv4" } else { "IPv6" };
        for name in action.live_pools() {
            let other = self
                .config
                .pools
                .iter()
                .find(|p| p.name == name)
                .and_then(|p| {
                    p.backends
                        .iter()
                        .find(|b| b.address.is_ipv4() != service.vip.is_ipv4())
                });
            if let Some(b) = other {
                return Err(format!(
                    "pool {name:?} has {} backend {} but service {:?} of group {group:?} is {} \
                     ({}): its packets cannot go there",
                    family(&b.address),
                    b.address,
                    service.name,
                    family(&service.vip),
                    service.vip
                ));
            }
        }
        Ok(())
    }

    fn on_health(&mut self, ev: &HealthEvent) {
        let event = Instant::now();
        let (pool, address) = match &ev.subject {
            Subject::State(var) => {
                let slots = self.store.set_probe(var, ev.healthy);
                let var = var.clone();
                self.decide(&slots, false, &var, event);
                return;
            }
            Subject::Backend { pool, address } => (pool.clone(), *address),
        };
        // A verdict queued by a probe of an earlier config, on a pool that has no health check
        // now: nothing would ever probe the backend back up, so it is not taken.
        if !self
            .config
            .pools
            .iter()
            .any(|p| p.name == pool && p.health_check.is_some())
        {
            return;
        }
        let now = self.now();
        self.weights
            .record_probe(&pool, address, ev.outcome.success, ev.outcome.latency, now);
        let rtt = self.store.record_rtt(address, ev.outcome.latency);
        self.decide(&rtt, false, "rtt", event);
        self.metrics
            .health_check
            .get_or_create(&vec![("pool", pool.clone())])
            .observe(ev.outcome.latency.as_secs_f64());
        self.probes.insert(
            (pool.clone(), address),
            ProbeStatus {
                healthy: ev.healthy,
                last_ok: ev.outcome.success,
                detail: ev.outcome.detail.clone(),
                latency_us: u64::try_from(ev.outcome.latency.as_micros()).unwrap_or(u64::MAX),
            },
        );
        self.breaker_probe(&pool, address, ev.outcome.success);
        if ev.transition.is_none() {
            return;
        }
        let started = Instant::now();
        match self
            .publisher
            .set_health(&mut self.maps, &pool, address, ev.healthy)
        {
            Ok(true) => {
                let took = started.elapsed();
                self.metrics.map_write.observe(took.as_secs_f64());
                let verdict = if ev.healthy { "up" } else { "down" };
                info!(
                    "pool {pool} backend {address} is {verdict} ({}); maps written in {} µs",
                    ev.outcome.detail,
                    took.as_micros()
                );
                let before = if ev.healthy { "down" } else { "up" };
                self.hooks.emit(&crate::hooks::Event::Health {
                    time: crate::fleet::now_ns(),
                    pool: pool.clone(),
                    backend: address,
                    from: before.to_owned(),
                    to: verdict.to_owned(),
                    detail: ev.outcome.detail.clone(),
                });
            }
            Ok(false) => return,
            Err(e) => error!("pool {pool} backend {address}: writing health failed: {e}"),
        }
        self.health_changed(&pool, &format!("pool {pool} backend {address}"), event);
    }

    /// Moves every slow start on to the weight it has reached (a deadline of its own).
    fn advance_ramps(&mut self) {
        if let Err(e) = self.publisher.advance_ramps(&mut self.maps) {
            error!("slow start: writing a pool's table failed: {e}");
        }
    }

    /// After the health table changed in `pool`: the state store derives its variables again,
    /// and the groups that read them decide.
    pub(super) fn health_changed(&mut self, pool: &str, cause: &str, event: Instant) {
        let slots = self
            .store
            .refresh_health(self.publisher.health(), &[pool.to_owned()]);
        self.decide(&slots, false, cause, event);
    }

    /// Starts the probes of the running config (backends and state probes), each backend from
    /// the verdict the health table has for it, and has the resolver follow its backends.
    pub(super) fn start_probes(&mut self) {
        let addresses = super::backend_addresses(&self.config);
        // What status says of an address no pool has any more is forgotten with it, as the
        // health table forgets its next hop: one that comes back shows the resolver's next
        // report.
        self.next_hops.retain(|a, _| addresses.contains(a));
        if let Some(resolver) = &self.resolver {
            resolver.set_targets(addresses);
        }
        self.sync_breakers();
        let health = self.publisher.health();
        let targets = probe::targets(&self.config, |pool, address| {
            health.get(pool, address).is_none_or(|b| b.healthy)
        });
        self.probe_set = Some(probe::spawn(targets, self.probe_tx.clone()));
        self.start_weights();
    }

    /// Takes the running config's adaptive weights (a backend that stays keeps its samples
    /// and weight), gives each pool's table its weights, and starts its agent-checks.
    fn start_weights(&mut self) {
        let now = self.now();
        self.weights.configure(&self.config.pools, now);
        let pools: Vec<String> = self.weights.pools().keys().cloned().collect();
        for pool in pools {
            self.give_weights(&pool);
        }
        self.agent_checks = Some(probe::agent_check::spawn(&self.config, &self.commands));
    }

    /// `ctl weights POOL`.
    fn weights_view(&self, pool: &str) -> Result<crate::api::weights::PoolWeightsView, String> {
        use crate::api::weights::{BackendWeightsView, PoolWeightsView, agent_state};
        let Some(p) = self.weights.pool(pool) else {
            return Err(if self.publisher.pools().contains_key(pool) {
                format!("pool {pool:?} has no adaptive weights")
            } else {
                format!("unknown pool {pool:?}")
            });
        };
        let now = self.now();
        let published = self.publisher.pools().get(pool);
        let ago = |t: std::time::Duration| now.saturating_sub(t).as_secs_f64();
        let backends = p
            .backends
            .iter()
            .map(|b| BackendWeightsView {
                address: b.address,
                base: b.base,
                pass_rate: b.pass_rate,
                rtt_p99_ms: b.rtt_p99.map(|d| d.as_secs_f64() * 1e3),
                latency_score: b.latency_score,
                agent_answer: b.agent.last.clone(),
                agent_error: b.agent.error.clone(),
                agent_score: b.agent.score,
                agent_state: agent_state(&b.agent),
                computed: b.computed,
                target: b.table_weight(),
                effective: published.and_then(|ps| {
                    let slot = ps.backends.iter().find(|s| s.address == b.address)?.slot;
                    ps.weight_in_table(slot)
                }),
                changed_s_ago: b.changed_at.map(ago),
            })
            .collect();
        Ok(PoolWeightsView {
            pool: pool.to_owned(),
            interval_s: p.params.interval.as_secs_f64(),
            computed_s_ago: ago(p.computed_at),
            backends,
        })
    }

    /// Writes `pool`'s adaptive weights into its table (entries and table in their safe
    /// order; nothing when the table has them already).
    fn give_weights(&mut self, pool: &str) {
        let Some(weights) = self.weights.table_weights(pool) else {
            return;
        };
        let weights: Vec<_> = weights.into_iter().map(|(a, w)| (a, Some(w))).collect();
        match self
            .publisher
            .set_adaptive_weights(&mut self.maps, pool, &weights)
        {
            Ok(true) => {
                let shown: Vec<String> = weights
                    .iter()
                    .map(|(a, w)| format!("{a} {}", w.unwrap_or_default()))
                    .collect();
                info!("pool {pool}: adaptive weights {}", shown.join(", "));
                // A backend the agent drained (or took back) changes the pool's usable
                // backends only for the table: the health table, and so the rules, are
                // unchanged.
            }
            Ok(false) => {}
            Err(e) => error!("pool {pool}: writing adaptive weights failed: {e}"),
        }
    }

    /// Stops the probes (the runtime is shutting down).
    pub fn stop(&mut self) {
        self.probe_set = None;
        self.agent_checks = None;
    }

    fn answer(&mut self, q: Query) {
        match q {
            Query::Status(reply) => {
                let _ = reply.send(self.status());
            }
            Query::State(reply) => {
                let _ = reply.send(self.state_entries());
            }
            Query::Decisions(group, reply) => {
                let records = self
                    .audit
                    .log
                    .iter()
                    .filter(|r| group.as_ref().is_none_or(|g| &r.group == g))
                    .cloned()
                    .collect();
                let _ = reply.send(records);
            }
            Query::Explain { group, sets, reply } => {
                let _ = reply.send(self.explain(&group, &sets));
            }
            Query::Scrape(reply) => {
                let _ = reply.send(self.scrape());
            }
            Query::Running(reply) => {
                let _ = reply.send(self.running.version);
            }
            Query::Weights(pool, reply) => {
                let _ = reply.send(self.weights_view(&pool));
            }
            Query::Canary(group, reply) => {
                let _ = reply.send(self.canary_view(&group));
            }
            Query::FlowCatalog(reply) => {
                let _ = reply.send(self.flow_catalog());
            }
            Query::Classes(reply) => {
                let _ = reply.send(Ok(self.classes_view()));
            }
            Query::Trace {
                client,
                vip,
                proto,
                reply,
            } => {
                let _ = reply.send(self.trace(client, vip, proto));
            }
        }
    }
}
