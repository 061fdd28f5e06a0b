//! Static against adaptive weights at L4, in namespaces: the comparison of the dynamic-weights
//! design `pools[].weights: adaptive` adapts (an L7 router's write-up: 43 % lower mean latency,
//! failed connections from 0.8 % to 0.12 %), on the real agent and data path.
//!
//! ```text
//! cargo build --release -p router-userspace && cargo bench -p router-tests --bench weights \
//!     [-- --secs 60 --rate 100]
//! ```
//!
//! - **Backends**: ten, behind one `dsr-l2` TCP service. Each runs this bench's own servers in
//!   its namespace (the kernel here has no `netem`, so latency is added by the servers): a TCP
//!   greeter on port 80 (it writes its name, then echoes) and an HTTP health endpoint on 8080.
//!   Backends 1–3 are **slow** (40 ms before the greeting and the health answer), backend 4 is
//!   **flaky** (it resets one connection in five at once), backend 5 **spikes** (150 ms for one
//!   second in every five), 6–10 are healthy.
//! - **Load**: the same in both phases: `--rate` connections a second (100), opened on a
//!   fixed schedule by a pool of client threads; each connects to the VIP, reads the greeting
//!   and closes. Its latency is connect plus greeting; a failure is a refused, reset or
//!   timed-out (1 s) connection.
//! - **Phases**: static weights (every backend 100), then adaptive weights on the same topology
//!   (a reload), each for `--secs` (60) after a 5 s warm-up. The health check probes every
//!   500 ms in both.
//! - **Settling**: the slow backends' share of the live Maglev table (`GET /weights/web`,
//!   every 250 ms); the settle time is when it last moved by more than 1 % (relative) of its
//!   final value, after the reload that turned adaptive weights on.
//!
//! Nothing asserts on speed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use router_tests::{
    addrs::{HEALTH_PORT, TCP_ECHO_PORT, VIP_V4, backend_name, backend_v4},
    agent::Agent,
    bench::{self, host},
    netns::Topology,
    privileged,
};

const BACKENDS: usize = 10;
const SLOW: [usize; 3] = [1, 2, 3];
const FLAKY: usize = 4;
const SPIKY: usize = 5;
const SLOW_DELAY: Duration = Duration::from_millis(40);
const SPIKE_DELAY: Duration = Duration::from_millis(150);
const TIMEOUT: Duration = Duration::from_secs(1);
const WARMUP: Duration = Duration::from_secs(5);

/// The adaptive phases: the reference config's coefficients, then a latency-weighted set;
/// both recompute every 2 s so that a one-minute phase settles.
const ADAPTIVE: [(&str, &str); 2] = [
    (
        "adaptive (reference: alpha 0.6, beta 0.2, gamma 0.2)",
        "{ adaptive: { alpha: 0.6, beta: 0.2, gamma: 0.2, interval: 2s, smoothing: 0.3, \
         max_decrease_per_second: 0.05 } }",
    ),
    (
        "adaptive (latency-weighted: alpha 0.2, beta 0.3, gamma 0.5)",
        "{ adaptive: { alpha: 0.2, beta: 0.3, gamma: 0.5, interval: 2s, smoothing: 0.3, \
         max_decrease_per_second: 0.05 } }",
    ),
];

/// One backend's behaviour.
#[derive(Clone, Copy)]
enum Kind {
    Healthy,
    Slow,
    Flaky,
    Spiky,
}

fn kind(i: usize) -> Kind {
    if SLOW.contains(&i) {
        Kind::Slow
    } else if i == FLAKY {
        Kind::Flaky
    } else if i == SPIKY {
        Kind::Spiky
    } else {
        Kind::Healthy
    }
}

/// The delay `kind` adds now (`epoch` the bench's start).
fn delay(kind: Kind, epoch: Instant) -> Duration {
    match kind {
        Kind::Slow => SLOW_DELAY,
        Kind::Spiky if epoch.elapsed().as_secs().is_multiple_of(5) => SPIKE_DELAY,
        _ => Duration::ZERO,
    }
}

/// Starts backend `i`'s greeter and health endpoint in its namespace; they stop when `stop`
/// is set.
fn serve(topo: &Topology, i: usize, epoch: Instant, stop: &Arc<AtomicBool>) -> Result<()> {
    let any = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let (tcp, health) = topo.backend(i).run(|| -> Result<_> {
        Ok((
            TcpListener::bind((any, TCP_ECHO_PORT)).context("bind greeter")?,
            TcpListener::bind((any, HEALTH_PORT)).context("bind health")?,
        ))
    })??;
    let (k, name) = (kind(i), backend_name(i));
    let accepted = Arc::new(AtomicU64::new(0));
    for (listener, is_health) in [(tcp, false), (health, true)] {
        listener.set_nonblocking(true)?;
        let (stop, name, accepted) = (stop.clone(), name.clone(), accepted.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let name = name.clone();
                let n = if is_health {
                    0
                } else {
                    accepted.fetch_add(1, Ordering::Relaxed)
                };
                thread::spawn(move || {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(TIMEOUT));
                    if !is_health && matches!(k, Kind::Flaky) && n % 5 == 0 {
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                        return;
                    }
                    thread::sleep(delay(k, epoch));
                    if is_health {
                        let mut buf = [0u8; 512];
                        let _ = s.read(&mut buf);
                        let _ = s.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                    } else {
                        let _ = s.write_all(format!("{name}\n").as_bytes());
                        let mut buf = [0u8; 256];
                        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
                    }
                });
            }
        });
    }
    Ok(())
}

/// The agent's config: pins under `pin_path` (the bench's own, removed when it ends), the
/// service over the ten backends, with `weights` on the pool if given.
fn config(pin_path: &str, weights: Option<&str>) -> String {
    let mut text = format!(
        "agent:\n  pin_path: {pin_path}\nservices:\n  - {{ name: web, vip: {VIP_V4}, port: {TCP_ECHO_PORT}, protocol: tcp, \
         forward: dsr-l2, to: {{ pool: web }} }}\npools:\n  - name: web\n    backends:\n"
    );
    for i in 1..=BACKENDS {
        let _ = writeln!(
            text,
            "      - {{ address: {}, weight: 100 }}",
            backend_v4(i)
        );
    }
    let _ = writeln!(
        text,
        "    health_check: {{ http: {{ port: {HEALTH_PORT}, path: /health }}, interval: 500ms, \
         timeout: 400ms, unhealthy_threshold: 3, healthy_threshold: 2 }}"
    );
    if let Some(w) = weights {
        let _ = writeln!(text, "    weights: {w}");
    }
    text
}

/// One connection's outcome: the backend that greeted and the latency, or a failure.
type Outcome = Option<(String, Duration)>;

/// One connection to the VIP: connect, read the greeting, close.
fn connect_once() -> Outcome {
    let start = Instant::now();
    let addr = SocketAddr::from((VIP_V4, TCP_ECHO_PORT));
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).ok()?;
    s.set_read_timeout(Some(TIMEOUT)).ok()?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(1) if b[0] == b'\n' => break,
            Ok(1) => line.push(b[0]),
            _ => return None,
        }
    }
    Some((String::from_utf8_lossy(&line).into_owned(), start.elapsed()))
}

/// Runs the load for `secs` after the warm-up: `(second since start, outcome)` of each
/// connection.
fn load(topo: &Topology, secs: u64, rate: u32) -> Result<Vec<(u64, Outcome)>> {
    let results: Arc<Mutex<Vec<(u64, Outcome)>>> = Arc::default();
    let total = WARMUP + Duration::from_secs(secs);
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let workers = 16;
    topo.client().run(|| {
        let start = Instant::now();
        thread::scope(|scope| {
            for w in 0..workers {
                let results = results.clone();
                scope.spawn(move || {
                    // Worker `w` takes every `workers`-th slot of the schedule.
                    let mut slot: u32 = w;
                    loop {
                        let at = interval * slot;
                        if at >= total {
                            break;
                        }
                        if let Some(wait) = at.checked_sub(start.elapsed()) {
                            thread::sleep(wait);
                        }
                        let outcome = connect_once();
                        if let Some(since) = at.checked_sub(WARMUP) {
                            let second = since.as_secs();
                            results
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push((second, outcome));
                        }
                        slot += workers;
                    }
                });
            }
        });
    })?;
    let out = results
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok(out)
}

/// The slow backends' share of the live table over a phase: `(seconds since the phase's
/// config was applied, share)`, from `GET /weights/web` every 250 ms until `done`.
fn table_shares(agent: &Agent, done: &AtomicBool) -> Vec<(f64, f64)> {
    let start = Instant::now();
    let slow: Vec<String> = SLOW.iter().map(|&i| backend_v4(i).to_string()).collect();
    let mut out = Vec::new();
    while !done.load(Ordering::Relaxed) {
        if let Ok(text) = agent.api_get("/weights/web")
            && let Ok(view) =
                serde_json::from_str::<switchyard::api::weights::PoolWeightsView>(&text)
        {
            let (mut of_slow, mut all) = (0u64, 0u64);
            for b in &view.backends {
                let w = u64::from(b.effective.unwrap_or(0));
                all += w;
                if slow.contains(&b.address.to_string()) {
                    of_slow += w;
                }
            }
            #[expect(clippy::cast_precision_loss, reason = "weights below 2^32")]
            out.push((
                start.elapsed().as_secs_f64(),
                of_slow as f64 / all.max(1) as f64,
            ));
        }
        thread::sleep(Duration::from_millis(250));
    }
    out
}

/// When the table share last moved by more than 1 % (relative) of its final value, seconds
/// after the phase's config was applied, and that final value.
fn settled(shares: &[(f64, f64)]) -> Option<(f64, f64)> {
    let &(_, last) = shares.last()?;
    let at = shares
        .iter()
        .rev()
        .find(|(_, s)| (s - last).abs() > 0.01 * last.max(1e-6))
        .map_or(0.0, |(t, _)| *t);
    Some((at, last))
}

/// What one phase measured.
struct Phase {
    mean_ms: f64,
    p99_ms: f64,
    failed: f64,
    slow_share: f64,
    shares: BTreeMap<String, usize>,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "counts of connections, far below 2^52"
)]
fn summarize(results: &[(u64, Outcome)], secs: u64) -> Phase {
    let mut latencies: Vec<f64> = results
        .iter()
        .filter_map(|(_, o)| o.as_ref().map(|(_, l)| l.as_secs_f64() * 1e3))
        .collect();
    latencies.sort_by(f64::total_cmp);
    let p99 = latencies
        .get(latencies.len() * 99 / 100)
        .or(latencies.last())
        .copied()
        .unwrap_or(0.0);
    let failed =
        results.iter().filter(|(_, o)| o.is_none()).count() as f64 / results.len().max(1) as f64;
    let slow_names: Vec<String> = SLOW.iter().map(|&i| backend_name(i)).collect();
    let mut shares: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_second = vec![(0usize, 0usize); usize::try_from(secs).unwrap_or(0)];
    for (s, o) in results {
        if let Some((name, _)) = o {
            *shares.entry(name.clone()).or_default() += 1;
            if let Some(x) = per_second.get_mut(usize::try_from(*s).unwrap_or(usize::MAX)) {
                x.1 += 1;
                if slow_names.contains(name) {
                    x.0 += 1;
                }
            }
        }
    }
    let total_slow: usize = per_second.iter().map(|x| x.0).sum();
    let total: usize = per_second.iter().map(|x| x.1).sum();
    Phase {
        mean_ms: bench::mean(&latencies),
        p99_ms: p99,
        failed,
        slow_share: total_slow as f64 / total.max(1) as f64,
        shares,
    }
}

fn print(name: &str, p: &Phase) {
    println!(
        "{name:<9} mean {:>7.2} ms  p99 {:>7.2} ms  failed {:>6.3} %  slow backends' share of \
         connections {:>5.1} %",
        p.mean_ms,
        p.p99_ms,
        p.failed * 100.0,
        p.slow_share * 100.0,
    );
    println!("          connections by backend: {:?}", p.shares);
}

fn main() -> Result<()> {
    if !bench::invoked_by_cargo_bench() {
        return Ok(());
    }
    if privileged::require_root_and_bpf("bench weights").is_err() {
        return Ok(());
    }
    let secs: u64 = bench::arg("secs").unwrap_or(60);
    let rate: u32 = bench::arg("rate").unwrap_or(100);
    println!("{}; load average {}", host::machine(), host::load_average());
    println!(
        "10 backends: 1-3 slow (+{SLOW_DELAY:?}), 4 resets 1 in 5, 5 spikes (+{SPIKE_DELAY:?} \
         1 s in 5), 6-10 healthy; {rate} connections/s for {secs} s after {WARMUP:?} per phase"
    );
    let topo = Topology::builder().backends(BACKENDS).build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    for i in 1..=BACKENDS {
        serve(&topo, i, epoch, &stop)?;
    }
    let pin_path = router_tests::agent::unique_pin_path();
    let agent = Agent::start(&topo, &[("10-web.yaml", config(&pin_path, None))])?;
    let results = load(&topo, secs, rate)?;
    let stat = summarize(&results, secs);
    println!("static weights (every backend 100)");
    print("", &stat);
    for (name, weights) in ADAPTIVE {
        let before = agent.status()?.generation;
        agent.write_file("10-web.yaml", &config(&pin_path, Some(weights)))?;
        agent.reload()?;
        agent.wait_for(Duration::from_secs(10), |s| {
            s.generation != before || s.rejected.is_some()
        })?;
        let s = agent.status()?;
        anyhow::ensure!(
            s.rejected.is_none(),
            "the adaptive config was rejected: {:?}",
            s.rejected
        );
        let done = AtomicBool::new(false);
        let (results, shares) = thread::scope(|scope| {
            let monitor = scope.spawn(|| table_shares(&agent, &done));
            let results = load(&topo, secs, rate);
            done.store(true, Ordering::Relaxed);
            (results, monitor.join().unwrap_or_default())
        });
        let adaptive = summarize(&results?, secs);
        println!("{name}");
        print("", &adaptive);
        if let Some((at, share)) = settled(&shares) {
            println!(
                "          the slow backends' share of the live table settled at {:.1} % \
                 {at:.1} s after the reload",
                share * 100.0
            );
        }
        println!(
            "          against static: mean {:.2}×, p99 {:.2}×, failed {:.3} % → {:.3} %",
            adaptive.mean_ms / stat.mean_ms.max(1e-9),
            adaptive.p99_ms / stat.p99_ms.max(1e-9),
            stat.failed * 100.0,
            adaptive.failed * 100.0
        );
    }
    stop.store(true, Ordering::Relaxed);
    Ok(())
}
