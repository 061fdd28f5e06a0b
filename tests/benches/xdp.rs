//! Nanoseconds per packet of Switchyard's XDP program under `BPF_PROG_TEST_RUN`, beside the
//! baseline program (parse Ethernet and IPv4/IPv6, swap MACs, `XDP_TX`) measured in the same
//! run, on the same frames, on the same pinned CPU.
//!
//! ```text
//! cargo bench -p router-tests --bench xdp [-- --repeat 1000000 --flows 20000 --rounds 5]
//! ```
//!
//! The program runs with private maps filled by the real publisher (next hops included, as the
//! agent resolves them), inside the lb namespace of a standard topology, on TCP frames to a
//! `dsr-l2` service with two backends:
//!
//! - **conntrack hit**: one flow's ACK, tracked by a first run, then run `--repeat` times in
//!   one call; the kernel reports the mean per run. The baseline runs the same frame the same
//!   way.
//! - **conntrack miss**: `--flows` SYNs of distinct new flows (distinct source ports, empty
//!   conntrack), each run once (`repeat = 1`) and followed by its ACK, run once (the packet
//!   that tracks the flow), and the kernel-reported durations averaged. A
//!   single run's time also holds clock reads, the test loop's entry and exit, and the cold
//!   caches and branch predictors a system call leaves, so the baseline and the tracked flow
//!   are run once per frame the same way, as many times. The miss is reported raw (beside the
//!   baseline timed alike) and as a steady-state estimate: the tracked flow's repeated time
//!   plus the difference between a new flow and the tracked flow, both run once — the
//!   single-run overheads are in both and cancel.
//! - **not a service**: a UDP frame to an unserved port of a VIP (dropped: a VIP is the
//!   balancer's, decision 0020), and one to an address that is no VIP (passed to the kernel);
//!   beside the baseline and the baseline plus one hash-map
//!   lookup (the `lookup` program of the baseline object), run on the same frame in the same
//!   round, which give the target "twice the baseline plus one lookup".
//!
//! - **a classed service**: the same new flows and tracked flow on a service with client
//!   classes and the split by client (`SVC_F_CLASSES | SVC_F_SPLIT_CLIENT`, decision 0036),
//!   whose client has no class among a few published prefixes and no answer: a new flow pays
//!   the trie lookup, the answer lookup and the client hash; a tracked one nothing more.
//!
//! Each of `--rounds` rounds measures every row once; the table gives the median and the range.
//! Nothing asserts on speed; a wrong verdict (the program not forwarding) is an error, because
//! the numbers would then describe another path.

use anyhow::{Context as _, Result, ensure};
use router_common::Reason;
use router_tests::{
    addrs::{CLIENT_V4, CLIENT_V6, LB_CLIENT_IF, VIP_V4, VIP_V6, backend_v4, backend_v6},
    bench::{
        self, Summary,
        host::{self, load_average, machine},
        testrun::{Baseline, time},
    },
    lab::Lab,
    packets, privileged,
};
use switchyard::config::{
    Agent, Config, Conntrack, Forward, HashMode, Pool, Protocol, Service, SourceRange, Target,
    WhenAllDown,
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

const BACKENDS: usize = 2;
const PORT: u16 = 80;
/// Source port of the tracked flow; miss flows use ports from `MISS_PORT_BASE` up.
const HIT_PORT: u16 = 50_000;
const MISS_PORT_BASE: u16 = 1_024;
/// Port of the `ipip` service on the IPv4 VIP.
const IPIP_PORT: u16 = 8_000;
/// Port of the classed service on the IPv4 VIP.
const CLASSED_PORT: u16 = 81;
/// A destination that is no virtual IP: what most packets on a busy host are.
const NOT_A_VIP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 18, 7, 7);

fn pool(name: &str, addrs: Vec<std::net::IpAddr>) -> Pool {
    router_tests::lab::pool(name, addrs, WhenAllDown::Drop)
}

fn service(name: &str, vip: std::net::IpAddr, pool: &str) -> Service {
    Service {
        name: name.into(),
        vip,
        port: PORT,
        protocol: Protocol::Tcp,
        forward: Forward::DsrL2,
        hash: HashMode::FiveTuple,
        to: Target::Pool(pool.into()),
    }
}

fn config() -> Result<Config> {
    Ok(Config {
        agent: Agent {
            pin_path: "/sys/fs/bpf/unused".into(),
            ..Agent::default()
        },
        fleet: None,
        conntrack: Conntrack::default(),
        announce: None,
        hooks: Vec::new(),
        vips: vec![],
        services: vec![
            service("web", VIP_V4.into(), "web"),
            service("web6", VIP_V6.into(), "web6"),
            Service {
                name: "tunnel".into(),
                port: IPIP_PORT,
                forward: Forward::Ipip(SourceRange {
                    network: "198.18.250.0".parse()?,
                    prefix: 24,
                }),
                ..service("tunnel", VIP_V4.into(), "web")
            },
            Service {
                port: CLASSED_PORT,
                ..service("classed", VIP_V4.into(), "web")
            },
        ],
        pools: vec![
            pool(
                "web",
                (1..=BACKENDS).map(|i| backend_v4(i).into()).collect(),
            ),
            pool(
                "web6",
                (1..=BACKENDS).map(|i| backend_v6(i).into()).collect(),
            ),
        ],
        state: vec![],
        decisions: vec![],
        classes: Vec::new(),
        rules: std::sync::Arc::default(),
    })
}

/// The kernel's mean per run of `prog` on `frame` over `repeat` runs; checks the verdict.
fn repeated(
    prog: &aya::programs::Xdp,
    frame: &[u8],
    ingress: u32,
    repeat: u32,
    want: u32,
) -> Result<f64> {
    let t = time(prog, frame, ingress, repeat)?;
    ensure!(t.action == want, "verdict {} instead of {want}", t.action);
    Ok(t.ns)
}

/// The mean of the kernel-reported times of `prog` run once on each frame; checks verdicts.
fn once_each<'a>(
    prog: &aya::programs::Xdp,
    frames: impl Iterator<Item = &'a [u8]>,
    ingress: u32,
    want: u32,
) -> Result<f64> {
    let mut ns = Vec::new();
    for f in frames {
        let t = time(prog, f, ingress, 1)?;
        ensure!(t.action == want, "verdict {} instead of {want}", t.action);
        ns.push(t.ns);
    }
    Ok(bench::mean(&ns))
}

/// One family's frames.
struct Frames {
    name: &'static str,
    /// An ACK of the tracked flow.
    hit: Vec<u8>,
    /// SYNs of distinct new flows.
    misses: Vec<Vec<u8>>,
    /// The ACK that follows each SYN of `misses`: the packet that tracks its flow.
    confirms: Vec<Vec<u8>>,
}

impl Frames {
    fn new(
        name: &'static str,
        client: std::net::IpAddr,
        vip: std::net::IpAddr,
        flows: u16,
    ) -> Self {
        Self::to_port(name, client, vip, PORT, flows)
    }

    fn to_port(
        name: &'static str,
        client: std::net::IpAddr,
        vip: std::net::IpAddr,
        port: u16,
        flows: u16,
    ) -> Self {
        let ports = || (0..flows).map(|k| MISS_PORT_BASE + k);
        Self {
            name,
            hit: packets::tcp(client, HIT_PORT, vip, port),
            misses: ports()
                .map(|p| packets::syn(client, p, vip, port))
                .collect(),
            confirms: ports()
                .map(|p| packets::tcp(client, p, vip, port))
                .collect(),
        }
    }
}

/// Gives the `classed` service client classes and the split by client: a few prefixes (none
/// holds the bench's client), every class word, and a split of `web` with itself (so the split
/// point is computed and either side is `web`), then the flags.
fn classify(lab: &mut Lab) -> Result<()> {
    use router_common::{
        Decision, FAMILY_V4, MAX_CLASSES, PROTO_TCP, SVC_F_CLASSES, SVC_F_SPLIT_CLIENT, ServiceKey,
    };
    use switchyard::{
        dataplane::Dataplane as _,
        publish::classes::{ClientPrefix, replace_class_prefixes, write_class_words},
    };
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&VIP_V4.octets());
    let key = ServiceKey {
        addr,
        port: CLASSED_PORT.to_be(),
        proto: PROTO_TCP,
        family: FAMILY_V4,
    };
    let mut svc = lab.maps.service(&key).context("the classed service")?;
    let web = Decision::decode(lab.maps.decision(svc.decision)?).pool_a;
    let word = Decision {
        pool_a: web,
        pool_b: web,
        split_b: 5_000,
        fallback: router_common::NO_POOL,
    }
    .encode();
    lab.maps.set_decision(svc.decision, word)?;
    write_class_words(&mut lab.maps, svc.decision, &[word; MAX_CLASSES as usize])?;
    let p = |a: &str, bits| ClientPrefix::new(a.parse().expect("address"), bits).expect("prefix");
    let prefixes = [
        (p("198.19.0.0", 16), 1),
        (p("198.19.6.0", 24), 2),
        (p("198.18.128.0", 17), 3),
        (p("2001:db8:a::", 48), 1),
    ]
    .into();
    replace_class_prefixes(
        &mut lab.maps,
        &mut std::collections::BTreeMap::new(),
        &prefixes,
    )?;
    svc.flags |= SVC_F_CLASSES | SVC_F_SPLIT_CLIENT;
    lab.maps.set_service(key, svc)?;
    Ok(())
}

/// Per-round measurements of one family, in nanoseconds.
#[derive(Default)]
struct Rows {
    hit: Vec<f64>,
    base: Vec<f64>,
    miss_once: Vec<f64>,
    confirm_once: Vec<f64>,
    base_once: Vec<f64>,
    hit_once: Vec<f64>,
}

fn measure_round(
    lab: &mut Lab,
    baseline: &Baseline,
    f: &Frames,
    repeat: u32,
    rows: &mut Rows,
) -> Result<()> {
    let ingress = lab.ifindex(LB_CLIENT_IF)?;
    // Steady state: the tracked flow, repeated.
    let hits_before = lab.reason(Reason::ConntrackHit);
    {
        let sy = lab.program()?;
        let base = baseline.program()?;
        let (hit, b) = lab.topo.lb().run(|| -> Result<(f64, f64)> {
            // The first run tracks the flow (if an earlier round has not).
            time(sy, &f.hit, ingress, 1)?;
            let hit = repeated(sy, &f.hit, ingress, repeat, XDP_REDIRECT)?;
            let b = repeated(base, &f.hit, ingress, repeat, XDP_TX)?;
            Ok((hit, b))
        })??;
        rows.hit.push(hit);
        rows.base.push(b);
    }
    let hits = lab.reason(Reason::ConntrackHit) - hits_before;
    ensure!(
        hits >= u64::from(repeat),
        "{}: {hits} conntrack hits counted for {repeat} repeated runs",
        f.name
    );
    // New flows, once each, from an empty conntrack table (then the hit flow again, re-tracked).
    lab.flush_conntrack();
    let new_before = lab.reason(Reason::NewFlow);
    {
        let sy = lab.program()?;
        let base = baseline.program()?;
        let n = f.misses.len();
        let (miss, confirm, b, hit) =
            lab.topo.lb().run(|| -> Result<(f64, f64, f64, f64)> {
                // Each SYN, then its ACK: the ACK finds the SYN's record in the flow cache, as
                // a connection's does a round trip later.
                let (mut syns, mut acks) = (Vec::new(), Vec::new());
                for (syn, ack) in f.misses.iter().zip(&f.confirms) {
                    for (frame, times) in [(syn, &mut syns), (ack, &mut acks)] {
                        let t = time(sy, frame, ingress, 1)?;
                        ensure!(t.action == XDP_REDIRECT, "verdict {}", t.action);
                        times.push(t.ns);
                    }
                }
                let (miss, confirm) = (bench::mean(&syns), bench::mean(&acks));
                let b = once_each(base, f.misses.iter().map(Vec::as_slice), ingress, XDP_TX)?;
                // The hit flow's ACK is tracked by its first run after the flush.
                time(sy, &f.hit, ingress, 1)?;
                let hit = once_each(
                    sy,
                    std::iter::repeat_n(f.hit.as_slice(), n),
                    ingress,
                    XDP_REDIRECT,
                )?;
                Ok((miss, confirm, b, hit))
            })??;
        rows.miss_once.push(miss);
        rows.confirm_once.push(confirm);
        rows.base_once.push(b);
        rows.hit_once.push(hit);
    }
    let new_flows = lab.reason(Reason::NewFlow) - new_before;
    ensure!(
        new_flows == f.misses.len() as u64 + 1,
        "{}: {new_flows} new flows counted for {} distinct flows plus the re-tracked one",
        f.name,
        f.misses.len()
    );
    let tracked = lab.maps.conntrack.keys().count();
    ensure!(
        tracked == f.misses.len() + 1,
        "{}: {tracked} tracked flows for {} confirmed ones plus the re-tracked one",
        f.name,
        f.misses.len()
    );
    Ok(())
}

fn report(f: &Frames, rows: &Rows, repeat: u32) {
    let hit = Summary::of(&rows.hit);
    let base = Summary::of(&rows.base);
    let miss = Summary::of(&rows.miss_once);
    let confirm = Summary::of(&rows.confirm_once);
    let base_once = Summary::of(&rows.base_once);
    let hit_once = Summary::of(&rows.hit_once);
    // A new flow's steady-state cost: the tracked flow's repeated time plus what a new flow
    // costs over a tracked one when both are run once (the clock reads and the cold start of
    // a single run are in both and cancel).
    let est: Vec<f64> = (0..rows.hit.len())
        .map(|i| rows.hit[i] + rows.miss_once[i] - rows.hit_once[i])
        .collect();
    let est = Summary::of(&est);
    let confirm_est: Vec<f64> = (0..rows.hit.len())
        .map(|i| rows.hit[i] + rows.confirm_once[i] - rows.hit_once[i])
        .collect();
    let confirm_est = Summary::of(&confirm_est);
    let show = |s: Summary| format!("{:7.1} ({:.1}–{:.1})", s.median, s.min, s.max);
    println!(
        "\n{} — ns per packet, median of {} rounds (range)",
        f.name,
        rows.hit.len()
    );
    println!(
        "  conntrack hit, repeat {repeat:<9}       switchyard {}  baseline {}  ratio {:.2}×",
        show(hit),
        show(base),
        hit.median / base.median
    );
    println!("  repeat 1, mean over {} frames:", f.misses.len());
    println!(
        "    new flows (SYN)                     switchyard {}  baseline {}  ratio {:.2}×",
        show(miss),
        show(base_once),
        miss.median / base_once.median
    );
    println!(
        "    their ACKs (tracking the flow)      switchyard {}",
        show(confirm)
    );
    println!(
        "    the tracked flow (conntrack hit)    switchyard {}",
        show(hit_once)
    );
    println!(
        "  conntrack miss, steady state (est.)   switchyard {}  baseline {}  ratio {:.2}×",
        show(est),
        show(base),
        est.median / base.median
    );
    println!("    (= hit at repeat {repeat} + new flow at repeat 1 − tracked flow at repeat 1)");
    println!(
        "  second packet, steady state (est.)    switchyard {}  baseline {}  ratio {:.2}×",
        show(confirm_est),
        show(base),
        confirm_est.median / base.median
    );
    println!("  per round: hit, baseline | repeat 1: SYN, its ACK, baseline, hit");
    for i in 0..rows.hit.len() {
        println!(
            "    {:7.1} {:7.1} | {:7.1} {:7.1} {:7.1} {:7.1}",
            rows.hit[i],
            rows.base[i],
            rows.miss_once[i],
            rows.confirm_once[i],
            rows.base_once[i],
            rows.hit_once[i]
        );
    }
}

/// The frames of the rows beyond the two families: ipip, and traffic for no service.
struct ExtraFrames {
    tun: Vec<u8>,
    dsr: Vec<u8>,
    tun_misses: Vec<Vec<u8>>,
    not_served: Vec<u8>,
    not_vip: Vec<u8>,
}

impl ExtraFrames {
    fn new(flows: u16) -> Self {
        Self {
            tun: packets::tcp(CLIENT_V4.into(), HIT_PORT, VIP_V4.into(), IPIP_PORT),
            dsr: packets::tcp(CLIENT_V4.into(), HIT_PORT, VIP_V4.into(), PORT),
            tun_misses: (0..flows)
                .map(|k| {
                    packets::syn(
                        CLIENT_V4.into(),
                        MISS_PORT_BASE + k,
                        VIP_V4.into(),
                        IPIP_PORT,
                    )
                })
                .collect(),
            not_served: packets::udp(CLIENT_V4.into(), HIT_PORT, VIP_V4.into(), 9),
            not_vip: packets::udp(CLIENT_V4.into(), HIT_PORT, NOT_A_VIP.into(), PORT),
        }
    }
}

/// Per-round measurements of the extra rows, in nanoseconds.
#[derive(Default)]
struct Extras {
    pass: Vec<f64>,
    other: Vec<f64>,
    lookup: Vec<f64>,
    base_pass: Vec<f64>,
    tun_hit: Vec<f64>,
    tun_new: Vec<f64>,
    dsr_hit: Vec<f64>,
    /// The ipip hit repeated through the reset wrapper, and the wrapper's own cost.
    tun_wrapped: Vec<f64>,
    wrapper: Vec<f64>,
}

impl Extras {
    fn measure(
        &mut self,
        lab: &mut Lab,
        baseline: &mut Baseline,
        f: &ExtraFrames,
        repeat: u32,
    ) -> Result<()> {
        let ingress = lab.ifindex(LB_CLIENT_IF)?;
        let sy = lab.program()?;
        let (yard, base) = (baseline.lookup()?, baseline.program()?);
        let row = lab.topo.lb().run(|| -> Result<[f64; 4]> {
            Ok([
                repeated(sy, &f.not_served, ingress, repeat, XDP_DROP)?,
                repeated(sy, &f.not_vip, ingress, repeat, XDP_PASS)?,
                repeated(yard, &f.not_vip, ingress, repeat, XDP_PASS)?,
                repeated(base, &f.not_vip, ingress, repeat, XDP_TX)?,
            ])
        })??;
        self.pass.push(row[0]);
        self.other.push(row[1]);
        self.lookup.push(row[2]);
        self.base_pass.push(row[3]);
        // ipip grows the frame, so a repeated run would see its own output: every ipip row is
        // run once per frame, beside the dsr-l2 tracked flow run the same way.
        lab.flush_conntrack();
        let sy = lab.program()?;
        let n = f.tun_misses.len();
        let once = lab.topo.lb().run(|| -> Result<[f64; 3]> {
            let new = once_each(
                sy,
                f.tun_misses.iter().map(Vec::as_slice),
                ingress,
                XDP_REDIRECT,
            )?;
            time(sy, &f.tun, ingress, 1)?;
            time(sy, &f.dsr, ingress, 1)?;
            let hit = once_each(
                sy,
                std::iter::repeat_n(f.tun.as_slice(), n),
                ingress,
                XDP_REDIRECT,
            )?;
            let d = once_each(
                sy,
                std::iter::repeat_n(f.dsr.as_slice(), n),
                ingress,
                XDP_REDIRECT,
            )?;
            Ok([new, hit, d])
        })??;
        self.tun_new.push(once[0]);
        self.tun_hit.push(once[1]);
        self.dsr_hit.push(once[2]);
        // The tracked ipip flow repeated through the reset wrapper (the Katran harness's
        // method), beside the wrapper in front of the baseline on the same frame.
        baseline.set_reset_target(lab.program()?.fd()?)?;
        let wrapped = lab
            .topo
            .lb()
            .run(|| repeated(baseline.reset()?, &f.tun, ingress, repeat, XDP_REDIRECT))??;
        let base_fd = baseline.program()?.fd()?.try_clone()?;
        baseline.set_reset_target(&base_fd)?;
        let (through, alone) = lab.topo.lb().run(|| -> Result<(f64, f64)> {
            Ok((
                repeated(baseline.reset()?, &f.tun, ingress, repeat, XDP_TX)?,
                repeated(baseline.program()?, &f.tun, ingress, repeat, XDP_TX)?,
            ))
        })??;
        self.tun_wrapped.push(wrapped);
        self.wrapper.push(through - alone);
        Ok(())
    }

    /// `v4` is the IPv4 dsr-l2 family's rows, the base of the ipip estimate.
    fn report(&self, v4: &Rows, repeat: u32) {
        // ipip's steady state: the dsr-l2 hit at `repeat` plus what ipip adds to it, both run once.
        let est = |once: &[f64]| -> Vec<f64> {
            (0..once.len())
                .map(|i| v4.hit[i] + once[i] - self.dsr_hit[i])
                .collect()
        };
        let (th, tn) = (
            Summary::of(&est(&self.tun_hit)),
            Summary::of(&est(&self.tun_new)),
        );
        let hit: Vec<f64> = (0..self.tun_wrapped.len())
            .map(|i| self.tun_wrapped[i] - self.wrapper[i])
            .collect();
        let (wh, ww, wc) = (
            Summary::of(&hit),
            Summary::of(&self.tun_wrapped),
            Summary::of(&self.wrapper),
        );
        println!(
            "\nIPv4 TCP, ipip — conntrack hit, repeat {repeat}, through the reset wrapper (it undoes the previous run's encapsulation)"
        );
        println!(
            "  conntrack hit                       switchyard {:7.1} ({:.1}–{:.1})",
            wh.median, wh.min, wh.max
        );
        println!(
            "    = reset → switchyard {:.1} ({:.1}–{:.1}) − the wrapper's cost {:.1} ({:.1}–{:.1}), (reset → baseline) − baseline",
            ww.median, ww.min, ww.max, wc.median, wc.min, wc.max
        );
        println!(
            "\nIPv4 TCP, ipip — steady state (est.: dsr-l2 hit at repeat {repeat} + ipip − dsr-l2, both run once per frame)"
        );
        println!(
            "  conntrack hit                       switchyard {:7.1} ({:.1}–{:.1})",
            th.median, th.min, th.max
        );
        println!(
            "  new flow                            switchyard {:7.1} ({:.1}–{:.1})",
            tn.median, tn.min, tn.max
        );
        let show = |s: Summary| format!("{:5.1} ({:.1}–{:.1})", s.median, s.min, s.max);
        let (p, o) = (Summary::of(&self.pass), Summary::of(&self.other));
        let (l, b) = (Summary::of(&self.lookup), Summary::of(&self.base_pass));
        // "Twice the baseline plus one lookup": the lookup is what the yardstick adds to the
        // baseline's parse, measured in the same rounds.
        let target = 2.0 * b.median + (l.median - b.median);
        println!("\nnot a service, repeat {repeat} — ns per packet, median (range)");
        println!(
            "  to a VIP, unserved port (UDP 9, XDP_DROP) switchyard {}",
            show(p)
        );
        println!(
            "  to another address (XDP_PASS)       switchyard {}",
            show(o)
        );
        println!(
            "  baseline                                       {}",
            show(b)
        );
        println!(
            "  baseline + one hash lookup (miss)              {}",
            show(l)
        );
        println!(
            "  target 2 × baseline + one lookup = {target:.1}: {:.2}× of it (VIP), {:.2}× (other)",
            p.median / target,
            o.median / target
        );
    }
}

fn main() -> Result<()> {
    if !bench::invoked_by_cargo_bench() {
        println!("xdp: a benchmark; run it with `cargo bench -p router-tests --bench xdp`");
        return Ok(());
    }
    if privileged::require_root_and_bpf("bench xdp").is_err() {
        return Ok(());
    }
    let repeat: u32 = bench::arg("repeat").unwrap_or(1_000_000);
    let flows: u16 = bench::arg("flows").unwrap_or(20_000);
    let rounds: usize = bench::arg("rounds").unwrap_or(5);
    ensure!(
        flows <= HIT_PORT - MISS_PORT_BASE,
        "--flows must be at most {}",
        HIT_PORT - MISS_PORT_BASE
    );
    // One CPU for everything this process does (test runs execute on the caller's CPU).
    let cpu = host::cpu_count() - 1;
    host::pin(0, cpu)?;
    println!("machine: {}", machine());
    println!("load average at start: {}", load_average());
    println!(
        "pinned to CPU {cpu}; repeat {repeat}, {flows} new flows per miss round, {rounds} rounds"
    );

    let mut lab = Lab::new("bench-xdp", BACKENDS, &config()?).context("building the lab")?;
    println!("topology {}", lab.topo.tag());
    classify(&mut lab)?;
    let mut baseline = Baseline::load()?;
    let families = [
        Frames::new("IPv4 TCP, dsr-l2", CLIENT_V4.into(), VIP_V4.into(), flows),
        Frames::new("IPv6 TCP, dsr-l2", CLIENT_V6.into(), VIP_V6.into(), flows),
        Frames::to_port(
            "IPv4 TCP, dsr-l2, classed (no class, split by client)",
            CLIENT_V4.into(),
            VIP_V4.into(),
            CLASSED_PORT,
            flows,
        ),
    ];
    let mut rows: Vec<Rows> = families.iter().map(|_| Rows::default()).collect();
    let extra = ExtraFrames::new(flows);
    let mut extras = Extras::default();
    for _ in 0..rounds {
        for (f, r) in families.iter().zip(rows.iter_mut()) {
            measure_round(&mut lab, &baseline, f, repeat, r).with_context(|| f.name.to_string())?;
        }
        extras.measure(&mut lab, &mut baseline, &extra, repeat)?;
    }
    for (f, r) in families.iter().zip(&rows) {
        report(f, r, repeat);
    }
    extras.report(&rows[0], repeat);
    println!("load average at end: {}", load_average());
    Ok(())
}
