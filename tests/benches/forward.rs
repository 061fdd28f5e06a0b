//! Forwarded packets per second on the veth topology with one load-balancer CPU: Switchyard
//! (the real agent, a `dsr-l2` UDP service over two backends) beside the nftables DNAT
//! baseline (`router_tests::nft`, jhash) and plain IP forwarding to one backend, in one run.
//!
//! ```text
//! cargo build --release -p router-userspace && \
//!     cargo bench -p router-tests --bench forward [-- --secs 5 --rounds 4 --only MODE]
//! ```
//!
//! (The first command builds the `switchyard` binary the agent runs; `cargo bench` of this
//! package does not.)
//!
//! How (docs/performance.md explains the choices and their limits):
//!
//! - **Traffic**: an in-kernel generator ([`router_tests::bench::flood`]) in the client
//!   namespace sends 60-byte UDP frames to port 80 from 16,384 random source ports out of the
//!   client's veth, as fast as it can, from two threads on the last CPU. It offers several
//!   times what any of the three forwarders can take; the excess is refused at the lb's
//!   receive ring.
//! - **One balancer CPU**: the lb's client-facing veth runs threaded NAPI (GRO on, so it runs
//!   NAPI without an XDP program too) and its NAPI thread is pinned to CPU 0. Everything the lb
//!   does per packet — Switchyard's XDP program and redirect, or the kernel's receive path,
//!   conntrack, DNAT and forwarding — runs in that thread. The backends' NAPI polls, scheduled
//!   from it, run on CPU 0 too, inside it. The NAPI thread, the generators and this process run
//!   at nice -20, and this process in a session of its own whose scheduler group has nice -20
//!   too ([`host::own_session`]), so other work on a shared machine takes little of the two
//!   CPUs during a window.
//! - **Counting**: each backend's veth has an XDP_DROP sink instead of the topology's
//!   XDP_PASS, and its receive counter (read over rtnetlink, as `ip -s link` shows it) counts
//!   the frames that reached it. The rate is the counters' growth over `--secs` seconds after
//!   a one-second warm-up.
//! - **Per lb CPU-second**: the same count divided by the CPU time the lb's NAPI thread had in
//!   the window (`/proc/TID/schedstat`), i.e. what one CPU given wholly to the lb forwards.
//!   On a quiet machine the thread gets ~100 % of CPU 0 and both rates agree; on a busy shared
//!   one it gets less, the delivered rate drops with it, and this one does not. The thread's
//!   share and CPU 0's time (`/proc/stat`) are printed with each window.
//!
//! `--only routing|nftables|switchyard` runs one mode, e.g. under `perf record -C 0`.
//!
//! Nothing asserts on speed; a mode that delivers nothing is an error.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::{
        BACKEND_IF, CLIENT_IF, CLIENT_MAC, CLIENT_V4, LB_CLIENT_IF, LB_CLIENT_SIDE_MAC, VIP_V4,
        backend_v4,
    },
    agent::{Agent, unique_pin_path},
    bench::{
        self, Summary,
        flood::{Flood, udp_v4_frame},
        host::{self, CpuTimes, LinkCounters, cpu_times, load_average, machine, task_runtime_ns},
    },
    netns::Topology,
    nft::{NftDnat, Selector},
    privileged, xdp_pass,
};
use switchyard::dataplane::attach::ifindex;

const BACKENDS: usize = 2;
const PORT: u16 = 80;
/// The CPU that runs the lb's NAPI thread.
const LB_CPU: usize = 0;
/// Frames per generator call. Each `BPF_PROG_TEST_RUN` of an XDP program registers it with
/// the kernel's XDP dispatcher on entry and unregisters it on exit, and each change waits for
/// an RCU grace period (milliseconds under load): calls must be long (hundreds of milliseconds
/// here) for that to be small, and two generator threads take turns so one sends while the other waits.
const CHUNK: u32 = 1 << 22;
const GENERATORS: usize = 2;
const WARMUP: Duration = Duration::from_secs(1);
/// Nice value of the lb's NAPI thread, the generators and this process: on a shared machine
/// they keep (nearly) all of their CPU against ordinary processes during a window.
const NICE: i32 = -20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain IP forwarding to backend 1's own address: no XDP, no nftables.
    Routing,
    /// nftables DNAT of the VIP to the backends (conntrack, jhash).
    Nftables,
    /// Switchyard's XDP program attached by the real agent; `dsr-l2`.
    Switchyard,
}

impl Mode {
    const ALL: [Self; 3] = [Self::Routing, Self::Nftables, Self::Switchyard];

    fn name(self) -> &'static str {
        match self {
            Self::Routing => "routing (1 backend)",
            Self::Nftables => "nftables DNAT",
            Self::Switchyard => "switchyard dsr-l2",
        }
    }

    /// The mode called `name` on the command line (`routing`, `nftables`, `switchyard`).
    fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|m| format!("{m:?}").eq_ignore_ascii_case(name))
    }

    fn destination(self) -> Ipv4Addr {
        match self {
            Self::Routing => backend_v4(1),
            Self::Nftables | Self::Switchyard => VIP_V4,
        }
    }
}

/// Counters at one moment.
struct Snapshot {
    at: Instant,
    /// Frames the client's veth tried to pass to the lb (taken plus refused: ring full).
    offered: u64,
    lb_rx: u64,
    backends: Vec<u64>,
    cpu: CpuTimes,
    /// CPU time of the lb's NAPI thread, ns.
    napi_ns: u64,
}

/// One measurement window.
#[derive(Debug)]
struct Sample {
    mode: Mode,
    secs: f64,
    offered: u64,
    lb_rx: u64,
    delivered: Vec<u64>,
    cpu: CpuTimes,
    napi_ns: u64,
}

impl Sample {
    fn between(mode: Mode, a: &Snapshot, b: &Snapshot) -> Self {
        Self {
            mode,
            secs: (b.at - a.at).as_secs_f64(),
            offered: b.offered - a.offered,
            lb_rx: b.lb_rx - a.lb_rx,
            delivered: b
                .backends
                .iter()
                .zip(&a.backends)
                .map(|(y, x)| y - x)
                .collect(),
            cpu: b.cpu.since(&a.cpu),
            napi_ns: b.napi_ns - a.napi_ns,
        }
    }

    fn delivered_pps(&self) -> f64 {
        self.delivered.iter().sum::<u64>() as f64 / self.secs
    }

    /// The share of a CPU the lb's NAPI thread got (1.0: all of it).
    fn napi_share(&self) -> f64 {
        self.napi_ns as f64 / 1e9 / self.secs
    }

    /// Delivered packets per second of the NAPI thread's CPU time: what one CPU given wholly
    /// to the lb forwards. On a shared machine the thread does not always get all of CPU 0
    /// (see `napi_share`); this rate does not depend on how much it got.
    fn per_cpu_pps(&self) -> f64 {
        self.delivered.iter().sum::<u64>() as f64 / (self.napi_ns as f64 / 1e9)
    }

    fn print(&self) {
        let mpps = |n: u64| n as f64 / self.secs / 1e6;
        let per_backend: Vec<String> = self
            .delivered
            .iter()
            .map(|d| format!("{:.3}", mpps(*d)))
            .collect();
        println!(
            "  {:<20} delivered {:.3} Mpps [{}]  per lb CPU-second {:.3} Mpps  lb received {:.3} \
             Mpps  offered {:.3} Mpps  NAPI thread {:.0}% of CPU{LB_CPU} (CPU{LB_CPU} busy {:.0}%, \
             softirq {:.0}%, steal {:.0}%)",
            self.mode.name(),
            self.delivered_pps() / 1e6,
            per_backend.join(" + "),
            self.per_cpu_pps() / 1e6,
            mpps(self.lb_rx),
            mpps(self.offered),
            100.0 * self.napi_share(),
            self.cpu.percent(self.cpu.busy),
            self.cpu.percent(self.cpu.softirq),
            self.cpu.percent(self.cpu.steal),
        );
    }
}

/// Sets the flag when dropped: the generator threads stop at their next call.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Bench {
    topo: Topology,
    napi: i32,
    secs: Duration,
    /// The client's veth: frames it passed to the lb plus frames refused (ring full).
    client: LinkCounters,
    /// The lb's client-facing veth.
    lb: LinkCounters,
    /// Each backend's veth.
    backends: Vec<LinkCounters>,
}

impl Bench {
    /// The topology with XDP_DROP sinks on the backends and the lb's client-facing NAPI
    /// threaded and pinned to [`LB_CPU`].
    fn new(secs: Duration) -> Result<Self> {
        let topo = Topology::builder().backends(BACKENDS).build()?;
        // r0 = XDP_DROP; exit
        let sink = xdp_pass::load_raw(
            "sy_bench_sink",
            &[xdp_pass::insn(0xb7, 0, 0, 1), xdp_pass::insn(0x95, 0, 0, 0)],
        )
        .context("loading the sink")?;
        for b in topo.backends() {
            xdp_pass::attach(b, BACKEND_IF, &sink)?;
        }
        topo.lb()
            .exec(&["ethtool", "-K", LB_CLIENT_IF, "gro", "on"])?;
        let napi = host::threaded_napi(topo.lb(), LB_CLIENT_IF)?;
        host::pin(napi, LB_CPU)?;
        host::renice(napi, NICE)?;
        println!(
            "topology {}: lb NAPI thread {napi} (\"{}\")",
            topo.tag(),
            host::comm(napi).unwrap_or_default()
        );
        let client = LinkCounters::open(topo.client(), CLIENT_IF)?;
        let lb = LinkCounters::open(topo.lb(), LB_CLIENT_IF)?;
        let backends = topo
            .backends()
            .iter()
            .map(|b| LinkCounters::open(b, BACKEND_IF))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            topo,
            napi,
            secs,
            client,
            lb,
            backends,
        })
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let start = Instant::now();
        let client = self.client.read()?;
        let lb_rx = self.lb.read()?.rx_packets;
        let backends = self
            .backends
            .iter()
            .map(|b| Ok(b.read()?.rx_packets))
            .collect::<Result<Vec<_>>>()?;
        let cpu = cpu_times(LB_CPU)?;
        let napi_ns = task_runtime_ns(self.napi).context("the lb's NAPI thread is gone")?;
        Ok(Snapshot {
            at: start + (Instant::now() - start) / 2,
            offered: client.tx_packets + client.tx_dropped,
            lb_rx,
            backends,
            cpu,
            napi_ns,
        })
    }

    /// Floods `mode`'s destination for the warm-up and the window; the forwarder must be set up.
    fn measure(&self, mode: Mode) -> Result<Sample> {
        let frame = udp_v4_frame(
            CLIENT_MAC,
            LB_CLIENT_SIDE_MAC,
            CLIENT_V4,
            mode.destination(),
            PORT,
        );
        // Stops the generators however this function returns.
        let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
        let mut generators = Vec::new();
        for _ in 0..GENERATORS {
            let flood = Flood::new(frame)?;
            let stop = stop.0.clone();
            generators.push(self.topo.client().spawn(move || -> Result<()> {
                host::renice(0, NICE)?;
                let out = ifindex(CLIENT_IF)?;
                while !stop.load(Ordering::Relaxed) {
                    flood.send(out, CHUNK).context("flood generator")?;
                }
                Ok(())
            })?);
        }
        let window = (|| -> Result<Sample> {
            std::thread::sleep(WARMUP);
            let a = self.snapshot()?;
            std::thread::sleep(self.secs);
            let b = self.snapshot()?;
            Ok(Sample::between(mode, &a, &b))
        })();
        drop(stop);
        for g in generators {
            match g.join() {
                Ok(r) => r?,
                Err(_) => bail!("a flood generator panicked"),
            }
        }
        let sample = window?;
        ensure!(
            sample.delivered_pps() > 0.0,
            "{}: nothing reached the backends",
            mode.name()
        );
        Ok(sample)
    }

    fn run(&self, mode: Mode) -> Result<Sample> {
        match mode {
            Mode::Routing => self.measure(mode),
            Mode::Nftables => {
                let nft = NftDnat::install(&self.topo, PORT, Selector::Jhash)?;
                let sample = self.measure(mode);
                nft.remove()?;
                sample
            }
            Mode::Switchyard => {
                let pin = unique_pin_path();
                let agent = Agent::start(&self.topo, &[("10-bench.yaml", agent_config(&pin))])?;
                let sample = self
                    .measure(mode)
                    .with_context(|| format!("agent log:\n{}", agent.log_text()));
                drop(agent);
                // The agent removes its pins and versioned directory on detach; the
                // per-run pin path itself is ours to remove.
                let _ = std::fs::remove_dir(&pin);
                sample
            }
        }
    }
}

fn agent_config(pin: &str) -> String {
    let backends: Vec<String> = (1..=BACKENDS)
        .map(|i| format!("      - {{ address: {} }}", backend_v4(i)))
        .collect();
    format!(
        "agent:\n  pin_path: {pin}\nservices:\n  - {{ name: flood, vip: {VIP_V4}, port: {PORT}, \
         protocol: udp, forward: dsr-l2, to: {{ pool: web }} }}\npools:\n  - name: web\n    \
         backends:\n{}\n",
        backends.join("\n")
    )
}

fn main() -> Result<()> {
    if !bench::invoked_by_cargo_bench() {
        println!("forward: a benchmark; run it with `cargo bench -p router-tests --bench forward`");
        return Ok(());
    }
    if privileged::require("bench forward", &["nft"]).is_err() {
        return Ok(());
    }
    router_tests::agent::binary()?;
    let secs: f64 = bench::arg("secs").unwrap_or(5.0);
    let rounds: usize = bench::arg("rounds").unwrap_or(4);
    // `--only MODE` runs one mode (e.g. to profile it with `perf record -C 0`).
    let modes: Vec<Mode> = match bench::arg::<String>("only") {
        Some(name) => vec![Mode::parse(&name).context("--only routing|nftables|switchyard")?],
        None => Mode::ALL.to_vec(),
    };
    let cpus = host::cpu_count();
    ensure!(
        cpus >= 2,
        "needs two CPUs: one for the lb, one for the generator"
    );
    let gen_cpu = cpus - 1;
    // This thread's CPU and priority are inherited by the generator threads and by every
    // process it starts (the agent, `ip`, `nft`): they must not wait behind the generators.
    host::own_session(NICE)?;
    host::pin(0, gen_cpu)?;
    host::renice(0, NICE)?;
    println!("machine: {}", machine());
    println!("load average at start: {}", load_average());
    println!(
        "lb NAPI thread on CPU {LB_CPU}; generator, agent and this process on CPU {gen_cpu}; \
         {secs} s windows after {} s warm-up; {rounds} rounds",
        WARMUP.as_secs()
    );
    let bench = Bench::new(Duration::from_secs_f64(secs))?;
    let mut samples = Vec::new();
    for round in 1..=rounds {
        println!("round {round}:");
        // Each round starts with the next mode, so no mode always runs first or last.
        for &mode in modes.iter().cycle().skip(round - 1).take(modes.len()) {
            let s = bench.run(mode).with_context(|| mode.name())?;
            s.print();
            samples.push((round, s));
        }
    }
    println!("\nsummary, median of {rounds} rounds (range), Mpps:");
    println!(
        "  {:<20} {:<24} {:<24}",
        "", "delivered", "per lb CPU-second"
    );
    let summary = |mode: Mode, f: fn(&Sample) -> f64| {
        let v: Vec<f64> = samples
            .iter()
            .filter(|(_, s)| s.mode == mode)
            .map(|(_, s)| f(s) / 1e6)
            .collect();
        Summary::of(&v)
    };
    let show = |s: Summary| format!("{:.3} ({:.3}–{:.3})", s.median, s.min, s.max);
    for &mode in &modes {
        println!(
            "  {:<20} {:<24} {:<24}",
            mode.name(),
            show(summary(mode, Sample::delivered_pps)),
            show(summary(mode, Sample::per_cpu_pps))
        );
    }
    // Switchyard over nftables, each round's pair measured within a minute.
    let ratios = |f: fn(&Sample) -> f64| -> Vec<f64> {
        let rate = |round: usize, mode: Mode| {
            samples
                .iter()
                .find(|(r, s)| *r == round && s.mode == mode)
                .map(|(_, s)| f(s))
        };
        (1..=rounds)
            .filter_map(|r| Some(rate(r, Mode::Switchyard)? / rate(r, Mode::Nftables)?))
            .collect()
    };
    for (what, f) in [
        ("delivered", Sample::delivered_pps as fn(&Sample) -> f64),
        ("per lb CPU-second", Sample::per_cpu_pps),
    ] {
        let r = ratios(f);
        if !r.is_empty() {
            println!(
                "  switchyard / nftables, {what}: {:.2}× (per round: {})",
                Summary::of(&r).median,
                r.iter()
                    .map(|x| format!("{x:.2}×"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    println!("load average at end: {}", load_average());
    Ok(())
}
