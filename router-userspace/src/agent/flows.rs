//! The event loop's side of `switchyard flows` and `switchyard trace`: the names of what the
//! publisher holds, and a trace through the live maps between two commands.

use std::net::SocketAddr;

use router_common::{Decision, FAMILY_V4, FAMILY_V6, FlowKey, NO_POOL};

use super::runtime::Runtime;
use crate::{
    config,
    flows::{Catalog, protocol_name, state_name},
    publish::addr16,
    trace::{self, Trace},
};

impl Runtime {
    /// The published service and backend slots, named.
    pub(super) fn flow_catalog(&self) -> Catalog {
        Catalog {
            services: self
                .publisher
                .services()
                .iter()
                .map(|(name, s)| (s.value.id, (name.clone(), s.key)))
                .collect(),
            backends: self
                .publisher
                .pools()
                .iter()
                .flat_map(|(pool, p)| {
                    p.backends
                        .iter()
                        .map(move |b| (b.slot, (pool.clone(), b.address)))
                })
                .collect(),
            classes: self
                .config
                .class_prefixes()
                .into_iter()
                .filter_map(|(prefix, id)| {
                    let class = self
                        .config
                        .classes
                        .get(usize::try_from(id).ok()?.checked_sub(1)?)?;
                    Some((prefix, class.name.clone()))
                })
                .collect(),
        }
    }

    /// The name of pool slot `slot`.
    fn pool_name(&self, slot: u16) -> Option<String> {
        self.publisher
            .pools()
            .iter()
            .find(|(_, p)| p.slot == u32::from(slot))
            .map(|(n, _)| n.clone())
    }

    /// Decision word `w`, its pools named.
    fn word_text(&self, w: u64) -> String {
        let d = Decision::decode(w);
        let name = |p: u16| {
            if p == NO_POOL {
                "-".to_owned()
            } else {
                self.pool_name(p).unwrap_or_else(|| format!("slot {p}"))
            }
        };
        format!(
            "pool A {}, pool B {} ({} of {} to B), fallback {}",
            name(d.pool_a),
            name(d.pool_b),
            d.split_b,
            router_common::SPLIT_SCALE,
            name(d.fallback)
        )
    }

    /// The client's class as a trace shows it: `vip (id 2)`, `none (the default)`, with
    /// `, from a classifier answer` when an answer gave it; `None` when the service does not
    /// look classes up.
    fn class_text(&self, path: &trace::Path) -> Option<String> {
        let c = path.class?;
        let name = match c {
            0 => "none (the default)".to_owned(),
            c => usize::try_from(c - 1)
                .ok()
                .and_then(|i| self.config.classes.get(i))
                .map_or_else(|| format!("id {c}"), |k| format!("{} (id {c})", k.name)),
        };
        Some(if path.class_from_answer {
            format!("{name}, from a classifier answer")
        } else {
            name
        })
    }

    /// Where a new flow `client` → `vip` of protocol `proto` goes, from the live maps.
    ///
    /// # Errors
    ///
    /// The two addresses are of different families.
    pub(super) fn trace(
        &self,
        client: SocketAddr,
        vip: SocketAddr,
        proto: u8,
    ) -> Result<Trace, String> {
        if client.is_ipv4() != vip.is_ipv4() {
            return Err(format!(
                "client {client} and virtual IP {vip} are of different address families"
            ));
        }
        let key = FlowKey {
            src: addr16(client.ip()),
            dst: addr16(vip.ip()),
            sport: client.port().to_be(),
            dport: vip.port().to_be(),
            proto,
            family: if vip.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 },
            _pad: [0; 2],
        };
        let pin_dir = crate::dataplane::load::pin_dir(&self.config.agent.pin_path);
        // Without the clock, time 0: a tracked flow is judged by its own `seen` only.
        let now = crate::dataplane::clock::pinned_now(&pin_dir).unwrap_or(0);
        let timeouts = self
            .maps
            .config()
            .map(|c| c.timeouts)
            .map_err(|e| e.to_string())?;
        let path = trace::path(&self.maps, &key, now, &timeouts);
        let catalog = self.flow_catalog();
        let service = path
            .service
            .and_then(|s| catalog.services.get(&s))
            .map(|(n, _)| n.clone());
        let group = service.as_ref().and_then(|name| {
            self.config
                .services
                .iter()
                .find(|s| &s.name == name)
                .and_then(|s| match &s.to {
                    config::Target::Decide(g) => Some(g.clone()),
                    _ => None,
                })
        });
        let action = group
            .as_ref()
            .and_then(|g| self.publisher.groups().get(g))
            .and_then(|g| g.action.as_ref())
            .map(ToString::to_string);
        let rule = group
            .as_ref()
            .and_then(|g| self.driver.active(g))
            .map(|a| a.by.to_string());
        let word = path.decision.map(|(_, w)| self.word_text(w));
        let class = self.class_text(&path);
        let fallback = if path.fallback {
            path.decision
                .and_then(|(_, w)| self.pool_name(Decision::decode(w).fallback))
        } else {
            None
        };
        let answer = path.backend().and_then(|b| catalog.backends.get(&b));
        let by = match (path.service, path.backend()) {
            (None, _) => match path.vip_host_port {
                None => "no service",
                Some(true) => "no service: host port",
                Some(false) => "no service: dropped (vip_no_service)",
            },
            (Some(_), Some(_)) if path.tracked_overrides => "tracked flow",
            (Some(_), Some(_)) => "new flow",
            (Some(_), None) if path.all_down_pass => "no backend: passed to the kernel",
            (Some(_), None) => "no backend: dropped",
        };
        let tracked = path.tracked.map(|e| {
            let at = catalog.backends.get(&e.backend).map_or_else(
                || format!("slot {}", e.backend),
                |(p, a)| format!("{a} in pool {p}"),
            );
            format!("{} flow on {at}", state_name(e.state))
        });
        Ok(Trace {
            client: client.to_string(),
            vip: format!("{vip}/{}", protocol_name(proto)),
            service,
            group,
            action,
            class,
            rule,
            word,
            pool: path.pool.and_then(|p| self.pool_name(p)),
            fallback,
            backend: answer.map(|(_, a)| a.to_string()),
            backend_pool: answer.map(|(p, _)| p.clone()),
            by: by.to_owned(),
            tracked,
            path,
        })
    }
}
