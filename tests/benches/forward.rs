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
//! - **Counting**: each backend's veth has an `XDP_DROP` sink for IPv4 frames (ARP and IPv6
//!   pass, so the lb resolves its neighbours) instead of the topology's `XDP_PASS`, and its
//!   receive counter (read over rtnetlink, as `ip -s link` shows it) counts the frames that
//!   reached it. The rate is the counters' growth over `--secs` seconds after
//!   a one-second warm-up.
//! - **Per lb CPU-second**: the same count divided by the CPU time the lb's NAPI thread had in
//!   the window (`/proc/TID/schedstat`), i.e. what one CPU given wholly to the lb forwards.
//!   On a quiet machine the thread gets ~100 % of CPU 0 and both rates agree; on a busy shared
//!   one it gets less, the delivered rate drops with it, and this one does not. The thread's
//!   share and CPU 0's time (`/proc/stat`) are printed with each window.
//!
//! `--only routing|nftables|switchyard` runs one mode, e.g. under `perf record -C 0`.
//!
//! `--only apply` measures instead the forwarding rate while configurations are applied
//! (the config lifecycle): this process loads the program itself (private maps, not pinned), attaches it to
//! the lb's interfaces and publishes the large configuration of
//! `router_tests::bench::large_config` (1,000 services, 5,000 backends, 200 rules) plus the
//! flooded service, whose pool holds the two real backends. The flood is the same; in each
//! round, one flood, four windows: idle ("before"); while a thread applies the two versions of
//! the configuration alternately, back to back, on the generator's CPU (the agent on a CPU of
//! its own); the same on the lb's CPU (the agent sharing the forwarding CPU); idle again
//! ("after"). Every apply is a change (1 % of the backends replaced, 10 reweighted: every pool's
//! Maglev table rebuilt, written and flipped). The configurations are parsed once beforehand:
//! the loop is `Publisher::apply` alone, the part of an apply that touches the data plane, as
//! densely as it can run. The flooded service's backends never change, so its flows stay on
//! them. The ratios are each applying window over the "before" window of its round.
//!
//! Nothing asserts on speed; a mode that delivers nothing is an error.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use aya::{Ebpf, programs::XdpMode};
use router_tests::{
    addrs::{
        BACKEND_IF, CLIENT_IF, CLIENT_MAC, CLIENT_V4, LB_CLIENT_IF, LB_CLIENT_SIDE_MAC, VIP_V4,
        backend_v4, lb_backend_if,
    },
    agent::{Agent, unique_pin_path},
    bench::{
        self, Summary,
        flood::{Flood, udp_v4_frame},
        host::{self, CpuTimes, LinkCounters, cpu_times, load_average, machine, task_runtime_ns},
        large_config::{Shape, Version, fragments},
    },
    netns::Topology,
    nft::{self, NftDnat, Selector},
    privileged, xdp_pass,
};
use switchyard::{
    config::{Config, load_files},
    dataplane::{attach::ifindex, load, maps::KernelMaps},
    publish::Publisher,
};

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
    /// Switchyard's XDP program loaded and attached by this process, with the large
    /// configuration (`--only apply`); `dsr-l2`.
    InProcess,
}

impl Mode {
    const ALL: [Self; 3] = [Self::Routing, Self::Nftables, Self::Switchyard];

    fn name(self) -> &'static str {
        match self {
            Self::Routing => "routing (1 backend)",
            Self::Nftables => "nftables DNAT",
            Self::Switchyard => "switchyard dsr-l2",
            Self::InProcess => "switchyard, 1,001 services",
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
            Self::Nftables | Self::Switchyard | Self::InProcess => VIP_V4,
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
    /// What the window is called in the output.
    label: &'static str,
    secs: f64,
    offered: u64,
    lb_rx: u64,
    delivered: Vec<u64>,
    cpu: CpuTimes,
    napi_ns: u64,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "packet counts and nanoseconds of a window, far below 2^52, as f64 rates"
)]
impl Sample {
    fn between(mode: Mode, label: &'static str, a: &Snapshot, b: &Snapshot) -> Self {
        Self {
            mode,
            label,
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
            self.label,
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
    /// The topology with IPv4 `XDP_DROP` sinks on the backends and the lb's client-facing NAPI
    /// threaded and pinned to [`LB_CPU`].
    fn new(secs: Duration) -> Result<Self> {
        let topo = Topology::builder().backends(BACKENDS).build()?;
        // Drops IPv4 frames and passes the rest, so ARP (and IPv6 neighbour discovery) still
        // reach the backend's kernel: nobody writes the lb's neighbour table for it.
        let sink = xdp_pass::load_raw(
            "sy_bench_sink",
            &[
                xdp_pass::insn(0x61, 0x12, 0, 0),      // r2 = ctx->data
                xdp_pass::insn(0x61, 0x13, 4, 0),      // r3 = ctx->data_end
                xdp_pass::insn(0xbf, 0x24, 0, 0),      // r4 = r2
                xdp_pass::insn(0x07, 0x04, 0, 14),     // r4 += 14
                xdp_pass::insn(0x2d, 0x34, 4, 0),      // if r4 > r3 goto pass
                xdp_pass::insn(0x69, 0x25, 12, 0),     // r5 = eth.h_proto
                xdp_pass::insn(0x55, 0x05, 2, 0x0008), // if r5 != htons(0x0800) goto pass
                xdp_pass::insn(0xb7, 0x00, 0, 1),      // r0 = XDP_DROP
                xdp_pass::insn(0x95, 0x00, 0, 0),      // exit
                xdp_pass::insn(0xb7, 0x00, 0, 2),      // pass: r0 = XDP_PASS
                xdp_pass::insn(0x95, 0x00, 0, 0),      // exit
            ],
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
            at: start + start.elapsed() / 2,
            offered: client.tx_packets + client.tx_dropped,
            lb_rx,
            backends,
            cpu,
            napi_ns,
        })
    }

    /// Floods `mode`'s destination for the warm-up and the window; the forwarder must be set up.
    fn measure(&self, mode: Mode) -> Result<Sample> {
        self.flood(mode, || self.window(mode, mode.name()))
    }

    /// One window of `self.secs` seconds; the flood must run.
    fn window(&self, mode: Mode, label: &'static str) -> Result<Sample> {
        let a = self.snapshot()?;
        std::thread::sleep(self.secs);
        let b = self.snapshot()?;
        let sample = Sample::between(mode, label, &a, &b);
        ensure!(
            sample.delivered_pps() > 0.0,
            "{label}: nothing reached the backends"
        );
        Ok(sample)
    }

    /// Floods `mode`'s destination, and runs `during` after the warm-up; the forwarder must be
    /// set up.
    fn flood<T>(&self, mode: Mode, during: impl FnOnce() -> Result<T>) -> Result<T> {
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
        std::thread::sleep(WARMUP);
        let out = during();
        drop(stop);
        for g in generators {
            match g.join() {
                Ok(r) => r?,
                Err(_) => bail!("a flood generator panicked"),
            }
        }
        out
    }

    fn run(&self, mode: Mode) -> Result<Sample> {
        match mode {
            Mode::Routing => {
                // Plain routing is the lb's kernel forwarding, which the topology leaves off.
                nft::set_forwarding(self.topo.lb(), true)?;
                let sample = self.measure(mode);
                nft::set_forwarding(self.topo.lb(), false)?;
                sample
            }
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
            Mode::InProcess => bail!("the in-process program is measured by `--only apply`"),
        }
    }
}

/// The flooded service and its pool of the real backends, beside the large configuration.
fn flood_fragment() -> String {
    let backends: Vec<String> = (1..=BACKENDS)
        .map(|i| format!("      - {{ address: {} }}", backend_v4(i)))
        .collect();
    format!(
        "services:\n  - {{ name: flood, vip: {VIP_V4}, port: {PORT}, protocol: udp, forward: \
         dsr-l2, to: {{ pool: web }} }}\npools:\n  - name: web\n    backends:\n{}\n",
        backends.join("\n")
    )
}

/// Switchyard's program loaded and attached by this process (`--only apply`), its maps, the
/// publisher that writes them and the two versions of the configuration. Dropping it detaches
/// the program (aya owns the links).
struct InProcess {
    maps: KernelMaps,
    publisher: Publisher,
    /// The base and the changed version, each with the flooded service.
    versions: [Config; 2],
    _ebpf: Ebpf,
}

impl InProcess {
    /// Loads the program, publishes the base version and attaches to the lb's interfaces.
    fn attach(topo: &Topology) -> Result<Self> {
        let version = |v: Version| -> Result<Config> {
            let mut files = fragments(&Shape::LARGE, v);
            files.push(("zz-flood.yaml".into(), flood_fragment()));
            load_files(&files).map_err(|e| anyhow::anyhow!("the large config ({v:?}):\n{e}"))
        };
        let versions = [version(Version::Base)?, version(Version::Changed)?];
        let mut ebpf = load::load(None)?;
        let mut maps = KernelMaps::take(&mut ebpf)?;
        let mut publisher = Publisher::new();
        publisher.apply(&mut maps, &versions[0])?;
        let mut names = vec![LB_CLIENT_IF.to_string()];
        names.extend((1..=BACKENDS).map(lb_backend_if));
        // Interface indexes, the redirect map and the links belong to the lb's namespace.
        topo.lb().run(|| -> Result<()> {
            let prog = load::program_mut(&mut ebpf)?;
            for name in &names {
                let index = ifindex(name)?;
                maps.tx_ports
                    .insert(index, index, None, 0)
                    .context("TX_PORTS")?;
                prog.attach_to_if_index(index, XdpMode::Driver)
                    .with_context(|| format!("attaching to {name}"))?;
            }
            Ok(())
        })??;
        Ok(Self {
            maps,
            publisher,
            versions,
            _ebpf: ebpf,
        })
    }
}

/// What an apply loop did during a window.
#[derive(Debug, Default)]
struct Applies {
    count: u32,
    busy: Duration,
    max: Duration,
}

impl Applies {
    fn print(&self, secs: f64) {
        println!(
            "  {:<20} {} applies ({:.1}/s), {:.1} ms each on average, max {:.1} ms",
            "",
            self.count,
            f64::from(self.count) / secs,
            self.busy.as_secs_f64() * 1e3 / f64::from(self.count.max(1)),
            self.max.as_secs_f64() * 1e3
        );
    }
}

/// Applies the two versions alternately until `stop`.
fn apply_loop(stop: &AtomicBool, program: &mut InProcess) -> Result<Applies> {
    let InProcess {
        maps,
        publisher,
        versions,
        ..
    } = program;
    let mut done = Applies::default();
    while !stop.load(Ordering::Relaxed) {
        // The base version is live at the start of every loop (an even count of applies).
        let cfg = &versions[(done.count as usize + 1) % 2];
        let start = Instant::now();
        publisher.apply(maps, cfg)?;
        let took = start.elapsed();
        done.count += 1;
        done.busy += took;
        done.max = done.max.max(took);
    }
    // Back to the base version, for the next window.
    if done.count % 2 == 1 {
        publisher.apply(maps, &versions[0])?;
    }
    Ok(done)
}

/// Computes until `stop`, touching no memory: a CPU-bound thread that is not an apply.
fn busy_loop(stop: &AtomicBool) {
    // Plain arithmetic, no `pause` (a spin-wait hint a hypervisor may answer by descheduling
    // the virtual CPU).
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
}

/// What runs beside the flood during a window of `--only apply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Beside {
    /// Nothing.
    Idle,
    /// [`busy_loop`] on the generator's CPU.
    BusyOwn,
    /// [`apply_loop`] on the generator's CPU (the agent on a CPU of its own).
    ApplyOwn,
    /// [`busy_loop`] on the lb's CPU.
    BusyLb,
    /// [`apply_loop`] on the lb's CPU (the agent sharing the forwarding CPU).
    ApplyLb,
}

/// The windows of one `--only apply` round, in order. The busy loops are the controls: on
/// this two-CPU machine the applying thread shares a CPU with the generator or with the lb,
/// and a busy loop in its place shows what sharing that CPU alone costs.
const APPLY_WINDOWS: [(&str, Beside); 6] = [
    ("idle (before)", Beside::Idle),
    ("busy loop, own CPU", Beside::BusyOwn),
    ("applying, own CPU", Beside::ApplyOwn),
    ("busy loop, lb's CPU", Beside::BusyLb),
    ("applying, lb's CPU", Beside::ApplyLb),
    ("idle (after)", Beside::Idle),
];

impl Bench {
    /// One round of `--only apply`: one flood, the [`APPLY_WINDOWS`].
    fn apply_round(&self, program: &mut InProcess, gen_cpu: usize) -> Result<Vec<Sample>> {
        let mode = Mode::InProcess;
        self.flood(mode, || {
            let mut out = Vec::new();
            for (label, beside) in APPLY_WINDOWS {
                let (cpu, applying) = match beside {
                    Beside::Idle => {
                        let s = self.window(mode, label)?;
                        s.print();
                        out.push(s);
                        continue;
                    }
                    Beside::BusyOwn => (gen_cpu, false),
                    Beside::ApplyOwn => (gen_cpu, true),
                    Beside::BusyLb => (LB_CPU, false),
                    Beside::ApplyLb => (LB_CPU, true),
                };
                let stop = AtomicBool::new(false);
                let (sample, applies) = std::thread::scope(|scope| {
                    let worker = scope.spawn(|| -> Result<Option<Applies>> {
                        host::pin(0, cpu)?;
                        if applying {
                            apply_loop(&stop, program).map(Some)
                        } else {
                            busy_loop(&stop);
                            Ok(None)
                        }
                    });
                    let sample = self.window(mode, label);
                    stop.store(true, Ordering::Relaxed);
                    let applies = worker
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p));
                    (sample, applies)
                });
                let (sample, applies) = (sample?, applies?);
                sample.print();
                if let Some(applies) = applies {
                    ensure!(
                        applies.count > 0,
                        "{label}: no apply finished in the window"
                    );
                    applies.print(sample.secs);
                }
                out.push(sample);
            }
            Ok(out)
        })
    }
}

/// `--only apply`: the forwarding rate while configurations are applied, over the rate before.
fn apply_bench(bench: &Bench, rounds: usize, gen_cpu: usize) -> Result<()> {
    let mut program = InProcess::attach(&bench.topo)?;
    println!(
        "program loaded and attached by this process; {} services, {} pools, {} backends in \
         the maps",
        program.publisher.services().len(),
        program.publisher.pools().len(),
        program
            .publisher
            .pools()
            .values()
            .map(|p| p.backends.len())
            .sum::<usize>()
    );
    let mut windows = Vec::new();
    for round in 1..=rounds {
        println!("round {round}:");
        windows.push(bench.apply_round(&mut program, gen_cpu)?);
    }
    let index = |b: Beside| APPLY_WINDOWS.iter().position(|(_, x)| *x == b).unwrap_or(0);
    let before = index(Beside::Idle);
    println!(
        "\nsummary over {rounds} rounds, median (per round): each window over another of its \
         round"
    );
    let ratio = |label: &str, top: usize, bottom: usize| {
        for (what, f) in [
            ("delivered", Sample::delivered_pps as fn(&Sample) -> f64),
            ("per lb CPU-second", Sample::per_cpu_pps),
        ] {
            let r: Vec<f64> = windows.iter().map(|w| f(&w[top]) / f(&w[bottom])).collect();
            println!(
                "  {label:<42} {what:<18} {:.3} ({})",
                Summary::of(&r).median,
                r.iter()
                    .map(|x| format!("{x:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    };
    for (i, (label, _)) in APPLY_WINDOWS.iter().enumerate().skip(1) {
        ratio(&format!("{label} / before"), i, before);
    }
    ratio(
        "applying / busy loop, own CPU",
        index(Beside::ApplyOwn),
        index(Beside::BusyOwn),
    );
    ratio(
        "applying / busy loop, lb's CPU",
        index(Beside::ApplyLb),
        index(Beside::BusyLb),
    );
    let rates: Vec<f64> = windows
        .iter()
        .map(|w| w[before].delivered_pps() / 1e6)
        .collect();
    let b = Summary::of(&rates);
    println!(
        "  before: delivered {:.3} Mpps median ({:.3}–{:.3})",
        b.median, b.min, b.max
    );
    Ok(())
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

#[expect(
    clippy::too_many_lines,
    reason = "the run in order: options, the machine, the rounds, the summary"
)]
fn main() -> Result<()> {
    if !bench::invoked_by_cargo_bench() {
        println!("forward: a benchmark; run it with `cargo bench -p router-tests --bench forward`");
        return Ok(());
    }
    if privileged::require("bench forward", &["nft"]).is_err() {
        return Ok(());
    }
    let secs: f64 = bench::arg("secs").unwrap_or(5.0);
    let rounds: usize = bench::arg("rounds").unwrap_or(4);
    // `--only MODE` runs one mode (e.g. to profile it with `perf record -C 0`); `--only
    // apply`, the forwarding rate during applies.
    let only = bench::arg::<String>("only");
    let apply = only.as_deref() == Some("apply");
    let modes: Vec<Mode> = match only {
        Some(_) if apply => Vec::new(),
        Some(name) => vec![Mode::parse(&name).context("--only routing|nftables|switchyard|apply")?],
        None => Mode::ALL.to_vec(),
    };
    if modes.contains(&Mode::Switchyard) {
        router_tests::agent::binary()?;
    }
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
    if apply {
        apply_bench(&bench, rounds, gen_cpu)?;
        println!("load average at end: {}", load_average());
        return Ok(());
    }
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
