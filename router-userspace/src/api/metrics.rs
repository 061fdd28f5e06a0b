//! Prometheus metrics (`/metrics`): the data plane's per-CPU counters, read from the maps at
//! scrape time, and the agent's own histograms and gauges.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `switchyard_packets_total`, `switchyard_bytes_total` | counter | `reason` |
//! | `switchyard_service_packets_total`, `…_bytes_total` | counter | `service`, `action` |
//! | `switchyard_backend_packets_total`, `…_bytes_total` | counter | `pool`, `backend` |
//! | `switchyard_backend_healthy` | gauge (0/1) | `pool`, `backend` |
//! | `switchyard_backend_awaiting_check` | gauge (0/1) | `pool`, `backend` |
//! | `switchyard_backend_next_hop_resolved` | gauge (0/1) | `pool`, `backend` |
//! | `switchyard_backend_drained` | gauge (0 no, 1 draining, 2 evicted) | `pool`, `backend` |
//! | `switchyard_backend_breaker` | gauge (0 closed, 1 open, 2 half-open) | `pool`, `backend` |
//! | `switchyard_backend_rsts_total`, `…_syn_retransmits_total` | counter | `pool`, `backend` |
//! | `switchyard_breaker_transitions_total` | counter | `pool`, `backend`, `to` |
//! | `switchyard_next_hop_unresolved_total` | counter | `backend` |
//! | `switchyard_health_check_duration_seconds` | histogram | `pool` |
//! | `switchyard_map_write_duration_seconds` | histogram | |
//! | `switchyard_config_generation` | gauge | |
//! | `switchyard_config_rejected_total` | counter | |
//! | `switchyard_config_applied_total` | counter | |
//! | `switchyard_history_errors_total` | counter | |
//! | `switchyard_decision_evaluation_seconds` | histogram | `group` |
//! | `switchyard_decision_write_latency_seconds` | histogram | |
//! | `switchyard_decision_switches_total` | counter | `group`, `from`, `to` |
//! | `switchyard_decision_vetoes_total` | counter | `group` |
//! | `switchyard_failback_open_flows` | gauge | `group`, `pool` |
//! | `switchyard_decision_overrides_active` | gauge | |
//! | `switchyard_vip_announced` | gauge (0/1), only with `announce:` | `vip` |
//! | `switchyard_state_value` | gauge (bool as 0/1) | `name` |
//! | `switchyard_hook_runs_total` | counter | `hook`, `result` (`ok`, `failed`, `timeout`, `dropped`) |
//! | `switchyard_class_new_flows_total` | counter, only with `classes:` | `class` (`none` for no class), `pool` (the side's pool, or `A`/`B` when groups differ) |

use std::net::IpAddr;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::dataplane::counters;

type Labels = Vec<(&'static str, String)>;

/// The agent's own metrics (the data-plane counters are read at scrape time). Clones share
/// the same families: the runtime updates them, `/metrics` encodes them.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Health-check probe latency by pool, seconds.
    pub health_check: Family<Labels, Histogram>,
    /// Time to write one change (health transition or config apply) into the maps, seconds.
    pub map_write: Histogram,
    /// Generation of the applied configuration.
    pub generation: Gauge,
    /// Configuration changes rejected (parse, validation or apply errors).
    pub rejected: Counter,
    /// Configuration changes applied (a new version).
    pub applied: Counter,
    /// Applied versions the history store failed to record.
    pub history_errors: Counter,
    /// Decision-group evaluation time by group, seconds.
    pub evaluation: Family<Labels, Histogram>,
    /// From the triggering event to the completed decision-word write, seconds.
    pub decision_latency: Histogram,
    /// Times a backend address's next hop was found unresolved (it then takes no new flows).
    pub unresolved: Family<Labels, Counter>,
    /// Switches of decision groups, by group, from and to (`none` for no action).
    pub switches: Family<Labels, Counter>,
    /// Candidates vetoed by `require`, by group (once per veto, when it starts).
    pub vetoes: Family<Labels, Counter>,
    /// Circuit-breaker transitions, by pool, backend and the phase entered.
    pub breaker_transitions: Family<Labels, Counter>,
    /// Open flows on a pool a decision group failed back away from, as `/status` last counted
    /// them (the count is taken with each `/status`, off the event loop).
    pub failback_open_flows: Family<Labels, Gauge>,
    /// 1 while this fleet member's etcd does not answer (it keeps the last decisions), else 0.
    pub fleet_stale: Gauge,
    /// From a fleet leader's decision (its timestamp) to this node's write of it into the
    /// maps, seconds; the slowest node's is the fleet's switch latency.
    pub fleet_switch_latency: Histogram,
    /// Runs of each hook by how they ended (`ok`, `failed`, `timeout`), and its events
    /// `dropped` on a full queue ([`crate::hooks`]).
    pub hook_runs: Family<Labels, Counter>,
}

impl Metrics {
    /// Sets the open flows `group` left on `pool` by a failback.
    pub fn set_failback_open_flows(&self, group: &str, pool: &str, open: u64) {
        self.failback_open_flows
            .get_or_create(&vec![
                ("group", group.to_owned()),
                ("pool", pool.to_owned()),
            ])
            .set(i64::try_from(open).unwrap_or(i64::MAX));
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            health_check: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
            }),
            map_write: Histogram::new(exponential_buckets(0.000_001, 2.0, 20)),
            generation: Gauge::default(),
            rejected: Counter::default(),
            applied: Counter::default(),
            history_errors: Counter::default(),
            evaluation: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_000_5, 2.0, 20))
            }),
            decision_latency: Histogram::new(exponential_buckets(0.000_001, 2.0, 24)),
            unresolved: Family::default(),
            switches: Family::default(),
            vetoes: Family::default(),
            breaker_transitions: Family::default(),
            failback_open_flows: Family::default(),
            fleet_stale: Gauge::default(),
            fleet_switch_latency: Histogram::new(exponential_buckets(0.000_05, 2.0, 18)),
            hook_runs: Family::default(),
        }
    }
}

/// One backend of one pool, at scrape time.
#[derive(Clone, Debug)]
pub struct BackendRow {
    /// The pool.
    pub pool: String,
    /// The backend's address.
    pub address: IpAddr,
    /// Its slot (its counters' index).
    pub slot: u32,
    /// Its health check's verdict (`false` while it awaits its first check).
    pub healthy: bool,
    /// New to a running health-checked pool, it has not yet passed its first check
    /// ([`crate::health::BackendHealth::awaiting_check`]).
    pub awaiting_check: bool,
    /// Whether its next hop is resolved.
    pub reachable: bool,
    /// The operator's drain.
    pub drain: crate::health::Drain,
    /// Its circuit breaker's phase.
    pub breaker: crate::breaker::Phase,
    /// Its adaptive weight as last computed (`None`: its pool has no adaptive weights).
    pub weight_computed: Option<f64>,
    /// The weight the pool's live table holds (0: not in it).
    pub weight_effective: u32,
}

/// What the runtime hands `/metrics` at scrape time.
pub struct Scrape {
    /// The program's per-CPU counters, summed.
    pub counters: counters::Snapshot,
    /// Service names and slots.
    pub services: Vec<(String, u32)>,
    /// Every backend of every pool.
    pub backends: Vec<BackendRow>,
    /// Every bool (0/1) and number variable and built-in.
    pub state: Vec<(String, f64)>,
    /// Decision groups under an override.
    pub overrides: usize,
    /// Each virtual IP and whether it is announced (empty without `announce:`).
    pub announced: Vec<(std::net::IpAddr, bool)>,
    /// Each decision group's canary ramp.
    pub canaries: Vec<(String, rules::engine::RampStatus)>,
    /// The client classes with their new flows by side (empty without `classes:`).
    pub classes: Vec<super::classes::ClassView>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrape")
    }
}

/// A registry holding `metrics` and the values of one scrape.
#[must_use]
pub fn registry(metrics: &Metrics, scrape: Scrape) -> Registry {
    let mut r = Registry::with_prefix("switchyard");
    r.register(
        "health_check_duration_seconds",
        "Health-check probe latency",
        metrics.health_check.clone(),
    );
    r.register(
        "map_write_duration_seconds",
        "Time to write one change into the maps",
        metrics.map_write.clone(),
    );
    r.register(
        "fleet_stale",
        "1 while etcd does not answer this fleet member (it keeps the last decisions)",
        metrics.fleet_stale.clone(),
    );
    r.register(
        "fleet_switch_latency_seconds",
        "From the fleet leader's decision to this node's map write",
        metrics.fleet_switch_latency.clone(),
    );
    r.register(
        "config_generation",
        "Generation of the applied configuration",
        metrics.generation.clone(),
    );
    r.register(
        "config_rejected",
        "Configuration changes rejected",
        metrics.rejected.clone(),
    );
    r.register(
        "config_applied",
        "Configuration changes applied",
        metrics.applied.clone(),
    );
    r.register(
        "history_errors",
        "Applied versions the history store failed to record",
        metrics.history_errors.clone(),
    );
    r.register(
        "decision_evaluation_seconds",
        "Time to evaluate one decision group",
        metrics.evaluation.clone(),
    );
    r.register(
        "decision_write_latency_seconds",
        "From the triggering event to the completed decision-word write",
        metrics.decision_latency.clone(),
    );
    r.register(
        "next_hop_unresolved",
        "Times a backend's next hop was found unresolved (no new flows until it resolves)",
        metrics.unresolved.clone(),
    );
    r.register(
        "decision_switches",
        "Switches of decision groups by group, from and to",
        metrics.switches.clone(),
    );
    r.register(
        "decision_vetoes",
        "Candidates of decision groups vetoed by require",
        metrics.vetoes.clone(),
    );
    r.register(
        "breaker_transitions",
        "Circuit-breaker transitions by pool, backend and the phase entered",
        metrics.breaker_transitions.clone(),
    );
    r.register(
        "failback_open_flows",
        "Open flows on a pool a decision group failed back away from, as /status last counted",
        metrics.failback_open_flows.clone(),
    );
    r.register(
        "hook_runs",
        "Runs of each hook by result (ok, failed, timeout), and its events dropped on a full queue",
        metrics.hook_runs.clone(),
    );
    r.register_collector(Box::new(ScrapeCollector(scrape)));
    r
}

/// The values of one scrape, as metric families.
#[derive(Debug)]
struct ScrapeCollector(Scrape);

fn family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: &[(Labels, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in rows {
        match kind {
            MetricType::Gauge => {
                ConstGauge::new(i64::try_from(*v).unwrap_or(i64::MAX))
                    .encode(m.encode_family(labels)?)?;
            }
            _ => ConstCounter::new(*v).encode(m.encode_family(labels)?)?,
        }
    }
    Ok(())
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        dataplane(&self.0, &mut encoder)?;
        let announced: Vec<(Labels, u64)> = self
            .0
            .announced
            .iter()
            .map(|(vip, on)| (vec![("vip", vip.to_string())], u64::from(*on)))
            .collect();
        if !announced.is_empty() {
            family(
                &mut encoder,
                "vip_announced",
                "Whether the virtual IP is announced (its route is on the announcement interface)",
                MetricType::Gauge,
                &announced,
            )?;
        }
        canaries(&self.0, &mut encoder)?;
        if !self.0.classes.is_empty() {
            let rows: Vec<(Labels, u64)> = self
                .0
                .classes
                .iter()
                .flat_map(|c| {
                    c.sides.iter().map(|(pool, n)| {
                        (vec![("class", c.name.clone()), ("pool", pool.clone())], *n)
                    })
                })
                .collect();
            family(
                &mut encoder,
                "class_new_flows",
                "New flows of services that act per client class, by class and pool side",
                MetricType::Counter,
                &rows,
            )?;
        }
        state(&self.0, &mut encoder)
    }
}

/// Each canary ramp: its share (a ratio, 0 to 1) and its state (1 for the state it is in, 0
/// for the others).
fn canaries(scrape: &Scrape, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    if scrape.canaries.is_empty() {
        return Ok(());
    }
    let mut m = encoder.encode_descriptor(
        "canary_share",
        "Share of new flows a decision group's canary ramp sends to its canary pool (0 to 1)",
        None,
        MetricType::Gauge,
    )?;
    for (group, ramp) in &scrape.canaries {
        let labels: Labels = vec![("group", group.clone())];
        ConstGauge::new(f64::from(ramp.share.0) / f64::from(rules::engine::SHARE_SCALE))
            .encode(m.encode_family(&labels)?)?;
    }
    let mut rows = Vec::new();
    for (group, ramp) in &scrape.canaries {
        for phase in rules::engine::RampPhase::ALL {
            let labels = vec![("group", group.clone()), ("state", phase.name().to_owned())];
            rows.push((labels, u64::from(ramp.state == phase)));
        }
    }
    family(
        encoder,
        "canary_state",
        "1 for the state a decision group's canary ramp is in, 0 for the others",
        MetricType::Gauge,
        &rows,
    )
}

/// The program's counters by reason and by service, then [`backends`].
fn dataplane(scrape: &Scrape, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let snap = &scrape.counters;
    let (mut pk, mut by) = (Vec::new(), Vec::new());
    for (r, t) in &snap.reasons {
        pk.push((vec![("reason", r.name().to_owned())], t.packets));
        by.push((vec![("reason", r.name().to_owned())], t.bytes));
    }
    family(
        encoder,
        "packets",
        "Packets by reason",
        MetricType::Counter,
        &pk,
    )?;
    family(
        encoder,
        "bytes",
        "Bytes by reason",
        MetricType::Counter,
        &by,
    )?;

    let (mut pk, mut by) = (Vec::new(), Vec::new());
    for (slot, verdict, t) in &snap.services {
        let Some((name, _)) = scrape.services.iter().find(|(_, s)| s == slot) else {
            continue;
        };
        let labels = vec![
            ("service", name.clone()),
            ("action", verdict.name().to_owned()),
        ];
        pk.push((labels.clone(), t.packets));
        by.push((labels, t.bytes));
    }
    family(
        encoder,
        "service_packets",
        "Packets by service and action",
        MetricType::Counter,
        &pk,
    )?;
    family(
        encoder,
        "service_bytes",
        "Bytes by service and action",
        MetricType::Counter,
        &by,
    )?;
    backends(scrape, encoder)
}

/// Each backend's counters and state.
fn backends(scrape: &Scrape, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let snap = &scrape.counters;
    let (mut pk, mut by, mut up, mut hop) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut awaiting, mut drained) = (Vec::new(), Vec::new());
    let (mut effective, mut computed) = (Vec::new(), Vec::<(Labels, f64)>::new());
    for b in &scrape.backends {
        let labels = vec![("pool", b.pool.clone()), ("backend", b.address.to_string())];
        let t = snap
            .backends
            .iter()
            .find(|(s, _)| *s == b.slot)
            .map(|(_, t)| *t)
            .unwrap_or_default();
        pk.push((labels.clone(), t.packets));
        by.push((labels.clone(), t.bytes));
        up.push((labels.clone(), u64::from(b.healthy)));
        awaiting.push((labels.clone(), u64::from(b.awaiting_check)));
        hop.push((labels.clone(), u64::from(b.reachable)));
        let drain = match b.drain {
            crate::health::Drain::Off => 0,
            crate::health::Drain::Draining => 1,
            crate::health::Drain::Evicted => 2,
        };
        drained.push((labels.clone(), drain));
        effective.push((labels.clone(), u64::from(b.weight_effective)));
        if let Some(w) = b.weight_computed {
            computed.push((labels, w));
        }
    }
    family(
        encoder,
        "backend_packets",
        "Packets forwarded to each backend",
        MetricType::Counter,
        &pk,
    )?;
    family(
        encoder,
        "backend_bytes",
        "Bytes forwarded to each backend",
        MetricType::Counter,
        &by,
    )?;
    family(
        encoder,
        "backend_healthy",
        "1 if the backend passes its health check",
        MetricType::Gauge,
        &up,
    )?;
    family(
        encoder,
        "backend_awaiting_check",
        "1 while a backend added to a running health-checked pool has not yet passed its first \
         check (no new flows until it does)",
        MetricType::Gauge,
        &awaiting,
    )?;
    family(
        encoder,
        "backend_next_hop_resolved",
        "1 if the backend's next hop is resolved (0: no new flows)",
        MetricType::Gauge,
        &hop,
    )?;
    family(
        encoder,
        "backend_drained",
        "The operator's drain: 0 none, 1 draining (no new flows), 2 evicted (its flows \
         re-selected too)",
        MetricType::Gauge,
        &drained,
    )?;
    family(
        encoder,
        "backend_weight_effective",
        "The weight the pool's live Maglev table holds for the backend (0: not in it; below \
         the configured or adaptive weight during a slow start)",
        MetricType::Gauge,
        &effective,
    )?;
    let mut m = encoder.encode_descriptor(
        "backend_weight_computed",
        "The backend's adaptive weight as last computed (pools with adaptive weights only)",
        None,
        MetricType::Gauge,
    )?;
    for (labels, w) in &computed {
        ConstGauge::new(*w).encode(m.encode_family(labels)?)?;
    }
    breakers(scrape, encoder)
}

/// Each backend's circuit breaker and the program's failure signals for it.
fn breakers(scrape: &Scrape, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let (mut breaker, mut rsts, mut retransmits) = (Vec::new(), Vec::new(), Vec::new());
    for b in &scrape.backends {
        let labels = vec![("pool", b.pool.clone()), ("backend", b.address.to_string())];
        let phase = match b.breaker {
            crate::breaker::Phase::Closed => 0,
            crate::breaker::Phase::Open => 1,
            crate::breaker::Phase::HalfOpen => 2,
        };
        breaker.push((labels.clone(), phase));
        let s = scrape
            .counters
            .signals
            .iter()
            .find(|(s, _)| *s == b.slot)
            .map(|(_, s)| *s)
            .unwrap_or_default();
        rsts.push((labels.clone(), s.rsts));
        retransmits.push((labels, s.syn_retransmits));
    }
    family(
        encoder,
        "backend_breaker",
        "The backend's circuit breaker: 0 closed, 1 open (no new flows), 2 half-open (a trial \
         share)",
        MetricType::Gauge,
        &breaker,
    )?;
    family(
        encoder,
        "backend_rsts",
        "RSTs the backend sent to NAT clients",
        MetricType::Counter,
        &rsts,
    )?;
    family(
        encoder,
        "backend_syn_retransmits",
        "SYNs retransmitted to the backend (its SYN-ACK never came)",
        MetricType::Counter,
        &retransmits,
    )
}

/// State and decision metrics read at scrape time: `switchyard_state_value{name}` (bool as 0/1,
/// strings and unset omitted) and `switchyard_decision_overrides_active`.
fn state(scrape: &Scrape, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(
        "state_value",
        "Value of each state variable and built-in (bool as 0/1)",
        None,
        MetricType::Gauge,
    )?;
    for (name, x) in &scrape.state {
        let labels: Labels = vec![("name", name.clone())];
        ConstGauge::new(*x).encode(m.encode_family(&labels)?)?;
    }
    let m = encoder.encode_descriptor(
        "decision_overrides_active",
        "Decision groups under a manual override",
        None,
        MetricType::Gauge,
    )?;
    ConstGauge::new(i64::try_from(scrape.overrides).unwrap_or(i64::MAX)).encode(m)
}
