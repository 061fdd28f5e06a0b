//! The thin shell around the state store and the engine driver: state probes, the one-second
//! counter sampler, and applying state changes (evaluate the affected groups, write the maps).

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex},
    time::Instant,
};

use rules::Slot;

use super::Shared;
use crate::{
    config::{Config, model::StateSource, schema},
    dataplane::counters,
    probe::ProbeTarget,
};

/// Probe targets of `state:` probe variables are named `state:<variable>` in the pool field.
pub const STATE_PROBE_PREFIX: &str = "state:";

/// The probes of `cfg`'s probe variables.
pub fn state_probe_targets(cfg: &Config) -> Vec<ProbeTarget> {
    cfg.state
        .iter()
        .filter_map(|v| match &v.source {
            StateSource::Probe(p) => Some(ProbeTarget {
                pool: format!("{STATE_PROBE_PREFIX}{}", v.name),
                address: p.address.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                check: p.check.clone(),
                healthy: true,
            }),
            _ => None,
        })
        .collect()
}

/// Re-evaluates the groups that read `changed` and writes their switches.
pub fn changed(s: &mut Shared, changed: &[Slot], all: bool, cause: &str, event: Instant) {
    if changed.is_empty() && !all {
        return;
    }
    let now = s.started.elapsed();
    let Shared {
        store,
        driver,
        publisher,
        maps,
        metrics,
        ..
    } = s;
    let published = driver.on_change(changed, all, store, publisher, maps, now, cause, event);
    record(metrics, driver, &published);
}

/// Evaluates the groups whose deadline (stable_for, cooldown, failback, override TTL) has
/// passed and writes their switches. (`changed` with no slot returns at once, so the timer
/// must not go through it: a due deadline was then applied only by the next unrelated event,
/// and the loop spun on the past deadline meanwhile.)
pub fn timer(s: &mut Shared) {
    let now = s.started.elapsed();
    let Shared {
        store,
        driver,
        publisher,
        maps,
        metrics,
        ..
    } = s;
    let published = driver.on_timer(store, publisher, maps, now);
    record(metrics, driver, &published);
}

/// Metrics of what the driver did.
pub fn record(
    metrics: &crate::api::metrics::Metrics,
    driver: &mut crate::engine::Driver,
    published: &[crate::engine::Published],
) {
    for (group, secs) in driver.evaluations.drain(..) {
        metrics
            .evaluation
            .get_or_create(&vec![("group", group)])
            .observe(secs);
    }
    for p in published {
        metrics.decision_latency.observe(p.latency_us as f64 / 1e6);
    }
}

/// Counter rates between two samples.
#[derive(Default)]
pub struct RateSampler {
    prev: Option<(Instant, HashMap<String, u64>)>,
}

impl RateSampler {
    /// Samples the counters and feeds the per-second rates to the store.
    pub fn sample(&mut self, shared: &Arc<Mutex<Shared>>) {
        let Ok(mut s) = shared.lock() else { return };
        let service_slots: Vec<(String, u32)> = s
            .publisher
            .services()
            .iter()
            .map(|(n, v)| (n.clone(), v.value.id))
            .collect();
        let backend_slots: Vec<(IpAddr, u32)> = s
            .publisher
            .pools()
            .values()
            .flat_map(|p| p.backends.iter().map(|b| (b.address, b.slot)))
            .collect();
        let snap = counters::snapshot(
            &s.maps,
            service_slots.iter().map(|x| x.1),
            backend_slots.iter().map(|x| x.1),
        );
        let mut totals: HashMap<String, u64> = HashMap::new();
        for (name, slot) in &service_slots {
            let (mut p, mut b) = (0, 0);
            for (_, _, t) in snap.services.iter().filter(|(x, _, _)| x == slot) {
                p += t.packets;
                b += t.bytes;
            }
            totals.insert(schema::service_name(name, "packets_per_second"), p);
            totals.insert(schema::service_name(name, "bytes_per_second"), b);
        }
        for (addr, slot) in &backend_slots {
            let (p, b) = snap
                .backends
                .iter()
                .find(|(x, _)| x == slot)
                .map_or((0, 0), |(_, t)| (t.packets, t.bytes));
            *totals
                .entry(schema::backend_name(*addr, "packets_per_second"))
                .or_default() += p;
            *totals
                .entry(schema::backend_name(*addr, "bytes_per_second"))
                .or_default() += b;
        }
        let now = Instant::now();
        if let Some((then, prev)) = &self.prev {
            let secs = now.duration_since(*then).as_secs_f64().max(1e-3);
            let rates: HashMap<String, f64> = totals
                .iter()
                .map(|(k, v)| {
                    let before = prev.get(k).copied().unwrap_or(*v);
                    (k.clone(), v.saturating_sub(before) as f64 / secs)
                })
                .collect();
            let at = s.started.elapsed();
            let slots = s.store.observe_rates(at, &rates);
            changed(&mut s, &slots, false, "counters", now);
        }
        self.prev = Some((now, totals));
    }
}
