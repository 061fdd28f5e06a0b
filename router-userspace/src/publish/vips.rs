//! The `VIPS` map: every service's address is a virtual IP. The program drops what reaches one
//! and no service takes, answers its echo requests while one of its services can reach a
//! usable backend ([`VIP_F_LIVE`]), and passes the ports its `vips:` entry gives the host.
//! `VIP_F_LIVE` follows backend health: it is rewritten whenever usability changes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use router_common::{
    RATE_WINDOW_TICKS, TICK_SHIFT, VIP_F_ECHO, VIP_F_LIVE, Vip, VipKey, host_port,
};

use super::{PublishError, Publisher, addr16, family};
use crate::{
    config::{Config, Protocol, Target},
    dataplane::Dataplane,
};

/// A virtual IP as published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipState {
    /// The pools its services may send new flows to.
    pub pools: BTreeSet<String>,
    /// Its entry, without [`VIP_F_LIVE`].
    pub base: Vip,
    /// What `VIPS` holds for it, as this process wrote it (`None`: not written yet).
    pub written: Option<Vip>,
}

/// The `VIPS` key of `address`.
#[must_use]
pub fn vip_key(address: IpAddr) -> VipKey {
    VipKey {
        addr: addr16(address),
        family: family(address),
        _pad: [0; 3],
    }
}

/// A rate of new flows a second as flows per `RATE_WINDOW_TICKS` window of the program's
/// clock (2^30 ns, a little over a second), rounded up.
fn per_window(per_second: u32) -> u32 {
    let window_ns = u64::from(RATE_WINDOW_TICKS) << TICK_SHIFT;
    let n = (u64::from(per_second) * window_ns).div_ceil(1_000_000_000);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Every virtual IP of `cfg`, with the pools its services reach and its entry without
/// [`VIP_F_LIVE`].
fn wanted(cfg: &Config) -> BTreeMap<IpAddr, (BTreeSet<String>, Vip)> {
    let mut out: BTreeMap<IpAddr, (BTreeSet<String>, Vip)> = BTreeMap::new();
    for s in &cfg.services {
        let entry = out.entry(s.vip).or_insert_with(|| {
            let settings = cfg.vips.iter().find(|v| v.address == s.vip);
            let mut base = Vip {
                flags: if settings.is_none_or(|v| v.echo) {
                    VIP_F_ECHO
                } else {
                    0
                },
                new_flows: settings
                    .and_then(|v| v.new_flows_per_second)
                    .map_or(0, per_window),
                ..Vip::default()
            };
            for (slot, (protocol, port)) in base
                .host_ports
                .iter_mut()
                .zip(settings.iter().flat_map(|v| &v.host_ports))
            {
                let proto = match protocol {
                    Protocol::Tcp => router_common::PROTO_TCP,
                    Protocol::Udp => router_common::PROTO_UDP,
                };
                *slot = host_port(port.to_be(), proto);
            }
            (BTreeSet::new(), base)
        });
        match &s.to {
            Target::Pool(p) => {
                entry.0.insert(p.clone());
            }
            Target::Split(shares) => entry.0.extend(shares.iter().map(|x| x.pool.clone())),
            Target::Decide(g) => {
                for group in cfg.decisions.iter().filter(|d| &d.name == g) {
                    let actions = group
                        .rules
                        .iter()
                        .map(|r| &r.then)
                        .chain(group.default.iter());
                    for a in actions {
                        entry.0.extend(a.live_pools().map(str::to_owned));
                    }
                    // A canary ramp sends new flows to its pool too.
                    entry.0.extend(group.canary.iter().map(|c| c.pool.clone()));
                }
            }
        }
    }
    out
}

impl Publisher {
    /// Takes `cfg`'s virtual IPs: removes from `VIPS` the ones it no longer has (and, the
    /// first time, any an earlier process left), then writes every entry that changed.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; what was written is kept.
    pub fn configure_vips(
        &mut self,
        dp: &mut dyn Dataplane,
        cfg: &Config,
    ) -> Result<(), PublishError> {
        let wanted = wanted(cfg);
        let mut gone: Vec<VipKey> = self
            .vips
            .keys()
            .filter(|a| !wanted.contains_key(a))
            .map(|a| vip_key(*a))
            .collect();
        // What an earlier process wrote: kept where it still holds (an unchanged config after
        // a restart rewrites nothing), removed where the config has no such address.
        let mut held = BTreeMap::new();
        if !self.vips_read {
            let keep: Vec<VipKey> = wanted.keys().map(|a| vip_key(*a)).collect();
            for (key, value) in dp.read_vips() {
                if keep.contains(&key) {
                    // The window and count are the program's: not a difference to write.
                    let value = Vip {
                        window: 0,
                        count: 0,
                        ..value
                    };
                    held.insert(key, value);
                } else {
                    gone.push(key);
                }
            }
            self.vips_read = true;
        }
        for key in gone {
            dp.set_vip(key, None)?;
        }
        let old = std::mem::take(&mut self.vips);
        self.vips = wanted
            .into_iter()
            .map(|(addr, (pools, base))| {
                let written = old
                    .get(&addr)
                    .and_then(|o| o.written)
                    .or_else(|| held.get(&vip_key(addr)).copied());
                (
                    addr,
                    VipState {
                        pools,
                        base,
                        written,
                    },
                )
            })
            .collect();
        self.write_vips(dp)
    }

    /// Writes each virtual IP's entry whose [`VIP_F_LIVE`] (any of its pools has a usable
    /// backend of a weight above 0) or settings changed.
    ///
    /// # Errors
    ///
    /// [`PublishError`] when a map write fails; what was written is kept.
    pub(super) fn write_vips(&mut self, dp: &mut dyn Dataplane) -> Result<(), PublishError> {
        let (health, pools) = (&self.health, &self.pools);
        for (addr, v) in &mut self.vips {
            // A usable backend of weight 0 is in no table: it takes no new flow.
            let live = v.pools.iter().any(|p| {
                pools.get(p).is_some_and(|state| {
                    state.backends.iter().any(|b| {
                        b.weight > 0 && health.get(p, b.address).is_some_and(|h| h.usable())
                    })
                })
            });
            let value = Vip {
                flags: v.base.flags | if live { VIP_F_LIVE } else { 0 },
                ..v.base
            };
            if v.written != Some(value) {
                dp.set_vip(vip_key(*addr), Some(value))?;
                v.written = Some(value);
            }
        }
        Ok(())
    }

    /// The virtual IPs as published.
    #[must_use]
    pub fn vips(&self) -> &BTreeMap<IpAddr, VipState> {
        &self.vips
    }
}
