//! The one-second counter sampler: per-second packet and byte rates of every service and
//! backend, from the program's per-CPU counters, into the state the rules read
//! (`service.<name>.packets_per_second`, metric variables).

use std::{collections::HashMap, net::IpAddr, time::Instant};

use super::runtime::Runtime;
use crate::{config::schema, dataplane::counters};

/// Counter totals at the last sample.
#[derive(Default)]
pub struct RateSampler {
    prev: Option<(Instant, HashMap<String, u64>)>,
}

impl Runtime {
    /// Samples the counters and feeds the per-second rates since the last sample to the
    /// store; the groups that read a changed rate are evaluated.
    pub(super) fn sample(&mut self) {
        let service_slots: Vec<(String, u32)> = self
            .publisher
            .services()
            .iter()
            .map(|(n, v)| (n.clone(), v.value.id))
            .collect();
        let backend_slots: Vec<(IpAddr, u32)> = self
            .publisher
            .pools()
            .values()
            .flat_map(|p| p.backends.iter().map(|b| (b.address, b.slot)))
            .collect();
        let snap = counters::snapshot(
            &self.maps,
            service_slots.iter().map(|x| x.1),
            backend_slots.iter().map(|x| x.1),
        );
        self.breaker_signals(&snap);
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
        if let Some((then, prev)) = &self.sampler.prev {
            let secs = now.duration_since(*then).as_secs_f64().max(1e-3);
            #[expect(
                clippy::cast_precision_loss,
                reason = "a rate for the rules: a delta between samples is exact up to 2^53"
            )]
            let rates: HashMap<String, f64> = totals
                .iter()
                .map(|(k, v)| {
                    let before = prev.get(k).copied().unwrap_or(*v);
                    (k.clone(), v.saturating_sub(before) as f64 / secs)
                })
                .collect();
            let slots = self.store.observe_rates(self.now(), &rates);
            if !slots.is_empty() {
                self.decide(&slots, false, "counters", now);
            }
        }
        self.sampler.prev = Some((now, totals));
    }
}
