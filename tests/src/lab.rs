//! The program under `BPF_PROG_TEST_RUN`: the real object, loaded with private (unpinned) maps,
//! filled by the real publisher from a config, and run on crafted frames inside the lb
//! namespace of a standard [`Topology`] (so redirects name real interfaces). Each backend of
//! the topology gets the next hop the agent would resolve for it (its veth's ifindex, its fixed
//! MAC and the lb side's), written through the publisher.
//!
//! The topology's interfaces are only used as routing context: nothing is attached, and in
//! test-run mode `XDP_TX` / `XDP_REDIRECT` are verdicts, not transmissions.

use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use router_common::{CachedFlow, NH_F_RESOLVED, NextHop, Reason, Traffic};
use switchyard::{
    config::{Backend, Config, Pool, WhenAllDown},
    dataplane::{attach::ifindex, counters, load, maps::KernelMaps},
    publish::Publisher,
};

use crate::{
    addrs::{
        LB_CLIENT_IF, backend_mac, backend_v4, backend_v6, lb_backend_if, lb_backend_side_mac,
    },
    netns::Topology,
};

/// One run of the program on one frame.
#[derive(Debug)]
pub struct Run {
    /// The XDP action returned.
    pub action: u32,
    /// The frame as the program left it.
    pub out: Vec<u8>,
}

/// The loaded program, its maps and the namespace topology that gives it routes.
pub struct Lab {
    /// The namespaces (torn down on drop).
    pub topo: Topology,
    /// The maps, typed.
    pub maps: KernelMaps,
    /// The publisher that wrote them.
    pub publisher: Publisher,
    ifindex: HashMap<String, u32>,
    ebpf: Ebpf,
    /// The CPU every run of this lab runs on: the flow cache and first-packet records are
    /// per CPU, as they are per receive queue on a NIC.
    cpu: usize,
}

impl Lab {
    /// Builds a topology with `backends` backends, loads the program and applies `cfg`.
    ///
    /// # Errors
    ///
    /// When the topology cannot be built, the program cannot be loaded, or its maps cannot be
    /// written (an interface, the next hops, `cfg`).
    pub fn new(tag: &str, backends: usize, cfg: &Config) -> Result<Self> {
        let _ = tag;
        let topo = Topology::builder().backends(backends).build()?;
        let mut ebpf = load::load(None)?;
        let mut maps = KernelMaps::take(&mut ebpf)?;
        let mut publisher = Publisher::new().requiring_next_hops();
        let mut names = vec![LB_CLIENT_IF.to_string()];
        names.extend((1..=backends).map(lb_backend_if));
        // Device maps resolve an ifindex in the writer's namespace: write from inside the lb.
        let index = topo.lb().run(|| -> Result<HashMap<String, u32>> {
            let mut index = HashMap::new();
            for name in names {
                let i = ifindex(&name)?;
                maps.tx_ports.insert(i, i, None, 0).context("TX_PORTS")?;
                index.insert(name, i);
            }
            Ok(index)
        })??;
        let mut hops = Vec::new();
        for i in 1..=backends {
            let hop = next_hop(index[&lb_backend_if(i)], i);
            hops.push((backend_v4(i).into(), Some(hop)));
            hops.push((backend_v6(i).into(), Some(hop)));
        }
        publisher.set_next_hops(&mut maps, &hops)?;
        publisher.apply(&mut maps, cfg)?;
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
        Ok(Self {
            topo,
            maps,
            publisher,
            ifindex: index,
            ebpf,
            cpu,
        })
    }

    /// Runs the program on `frame` as if it arrived on the lb's interface `iface`.
    ///
    /// # Errors
    ///
    /// When `iface` is not one of the lb's, the lb namespace cannot be entered, or
    /// `BPF_PROG_TEST_RUN` fails.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a frame's length, at most a page, as the u32 `data_end`"
    )]
    pub fn run_on(&self, iface: &str, frame: &[u8]) -> Result<Run> {
        let ingress = *self.ifindex.get(iface).context("unknown interface")?;
        let prog = load::program(&self.ebpf)?;
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex (kernel bpf_prog_test_run_xdp requires data_end = frame length).
        let md: Vec<u8> = [0u32, frame.len() as u32, 0, ingress, 0, 0]
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect();
        let cpu = self.cpu;
        self.topo.lb().run(|| {
            crate::bench::host::pin(0, cpu)?;
            let mut out = vec![0u8; frame.len() + 256];
            let opts = TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: Some(&md),
                ..TestRunOptions::default()
            };
            let r = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
            out.truncate(r.data_size_out as usize);
            Ok(Run {
                action: r.return_value,
                out,
            })
        })?
    }

    /// The loaded program, for callers that run it themselves inside the lb namespace (the
    /// benchmarks time it with `BPF_PROG_TEST_RUN`'s `repeat`).
    ///
    /// # Errors
    ///
    /// Never once [`Lab::new`] succeeded: the loaded object has the program.
    pub fn program(&self) -> Result<&Xdp> {
        Ok(load::program(&self.ebpf)?)
    }

    /// The ifindex of the lb's interface `iface` (in the lb namespace).
    ///
    /// # Errors
    ///
    /// When `iface` is not one of the lb's.
    pub fn ifindex(&self, iface: &str) -> Result<u32> {
        self.ifindex
            .get(iface)
            .copied()
            .context("unknown interface")
    }

    /// Runs the program on `frame` arriving from the client.
    ///
    /// # Errors
    ///
    /// As [`Lab::run_on`].
    pub fn run(&self, frame: &[u8]) -> Result<Run> {
        self.run_on(LB_CLIENT_IF, frame)
    }

    /// Packets counted for `reason` so far.
    #[must_use]
    pub fn reason(&self, reason: Reason) -> u64 {
        counters::sum(&self.maps.reason_stats, reason as u32).packets
    }

    /// Runs `frame` and returns its verdict and the reasons it was counted under (for test
    /// failure messages).
    ///
    /// # Errors
    ///
    /// As [`Lab::run`].
    pub fn explain(&self, frame: &[u8]) -> Result<(u32, Vec<Reason>)> {
        let before: Vec<u64> = Reason::ALL.iter().map(|r| self.reason(*r)).collect();
        let run = self.run(frame)?;
        let reasons = Reason::ALL
            .iter()
            .zip(before)
            .filter(|(r, b)| self.reason(**r) != *b)
            .map(|(r, _)| *r)
            .collect();
        Ok((run.action, reasons))
    }

    /// Packets and bytes counted for backend slot `slot`.
    #[must_use]
    pub fn backend_traffic(&self, slot: u32) -> Traffic {
        counters::sum(&self.maps.backend_stats, slot)
    }

    /// Empties connection tracking and the program's flow cache (its copies of conntrack
    /// entries), so the next packet of every flow is a fresh selection.
    pub fn flush_conntrack(&mut self) {
        let keys: Vec<_> = self.maps.conntrack.keys().filter_map(Result::ok).collect();
        for k in keys {
            let _ = self.maps.conntrack.remove(&k);
        }
        if let Ok(mut cache) = self.flow_cache() {
            for i in 0..cache.len() {
                let _ = cache.set(i, CachedFlow::default(), 0);
            }
        }
    }

    /// Runs every later run of this lab on CPU `cpu` (each CPU has its own flow cache).
    pub fn set_cpu(&mut self, cpu: usize) {
        self.cpu = cpu;
    }

    /// Moves the program's clock forward by `by` (the `CLOCK` map): tracked flows age as if
    /// that much time had passed.
    ///
    /// # Errors
    ///
    /// When the object has no `CLOCK` map, or it cannot be written.
    pub fn advance_clock(&mut self, by: std::time::Duration) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(router_common::maps::CLOCK)
            .context("no CLOCK map in the object")?;
        let mut clock: aya::maps::Array<_, u64> = aya::maps::Array::try_from(map)?;
        let now = clock.get(&router_common::CLOCK_OFFSET, 0)?;
        let by = u64::try_from(by.as_nanos()).context("too far")?;
        clock.set(router_common::CLOCK_OFFSET, now + by, 0)?;
        Ok(())
    }

    /// The program's time, in ticks (`router_common::TICK_SHIFT`): no agent advances a lab's
    /// clock, so it is 0 plus what [`Lab::advance_clock`] added.
    ///
    /// # Errors
    ///
    /// When the object has no `CLOCK` map, or it cannot be read.
    pub fn now(&mut self) -> Result<u32> {
        let map = self
            .ebpf
            .map_mut(router_common::maps::CLOCK)
            .context("no CLOCK map in the object")?;
        let clock: aya::maps::Array<_, u64> = aya::maps::Array::try_from(map)?;
        Ok(switchyard::dataplane::clock::ticks(
            clock.get(&router_common::CLOCK_AGENT, 0)?,
            clock.get(&router_common::CLOCK_OFFSET, 0)?,
        ))
    }

    /// The program's flow cache (`router_common::maps::FLOW_CACHE`).
    ///
    /// # Errors
    ///
    /// When the object has no such map, or not of this type.
    pub fn flow_cache(&mut self) -> Result<aya::maps::Array<&mut aya::maps::MapData, CachedFlow>> {
        let map = self
            .ebpf
            .map_mut(router_common::maps::FLOW_CACHE)
            .context("no flow cache in the object")?;
        Ok(aya::maps::Array::try_from(map)?)
    }

    /// Applies `cfg` through the publisher, as the agent applies a change.
    ///
    /// # Errors
    ///
    /// When the publisher cannot write the maps.
    pub fn apply(&mut self, cfg: &Config) -> Result<()> {
        self.publisher.apply(&mut self.maps, cfg)?;
        Ok(())
    }

    /// Reports next hops through the publisher, as the agent's resolver does.
    ///
    /// # Errors
    ///
    /// When the publisher cannot write the maps.
    pub fn set_next_hops(&mut self, hops: &[(std::net::IpAddr, Option<NextHop>)]) -> Result<()> {
        self.publisher.set_next_hops(&mut self.maps, hops)?;
        Ok(())
    }

    /// Records a health verdict through the publisher.
    ///
    /// # Errors
    ///
    /// When `address` is not an IP address, or the publisher cannot write the maps (an
    /// unknown pool or address is ignored, as the agent ignores it).
    pub fn set_health(&mut self, pool: &str, address: &str, healthy: bool) -> Result<()> {
        self.publisher
            .set_health(&mut self.maps, pool, address.parse()?, healthy)?;
        Ok(())
    }

    /// An operator's drain of `address` in `pool`, written as the agent writes it.
    ///
    /// # Errors
    ///
    /// When `address` is not an address of `pool`, or a map write fails.
    pub fn set_drain(
        &mut self,
        pool: &str,
        address: &str,
        drain: switchyard::health::Drain,
    ) -> Result<()> {
        self.publisher
            .set_drain(&mut self.maps, pool, address.parse()?, drain)?
            .ok_or_else(|| anyhow::anyhow!("pool {pool} has no backend {address}"))?;
        Ok(())
    }
}

/// Backend `i`'s resolved next hop: out of `ifindex` (the lb's veth towards it), to its MAC,
/// from the lb side's, at veth's default MTU (the lab leaves it).
#[must_use]
pub fn next_hop(ifindex: u32, i: usize) -> NextHop {
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(&backend_mac(i));
    macs[6..].copy_from_slice(&lb_backend_side_mac(i));
    NextHop {
        ifindex,
        flags: NH_F_RESOLVED,
        macs,
        mtu: 1500,
    }
}

/// A pool of `addrs`, weight 100 each, no health check: the fixtures' pools.
#[must_use]
pub fn pool(name: &str, addrs: Vec<std::net::IpAddr>, when_all_down: WhenAllDown) -> Pool {
    Pool {
        name: name.into(),
        backends: addrs
            .into_iter()
            .map(|address| Backend {
                address,
                weight: 100,
            })
            .collect(),
        health_check: None,
        when_all_down,
        slow_start: None,
        breaker: None,
        adaptive: None,
        on_backend_down: switchyard::config::FlowPolicy::Keep,
    }
}
