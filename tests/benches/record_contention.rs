//! Decision latency while configuration applies, with their history records, run: the real
//! agent in the namespace topology, a decision group switched through the local API, with
//! nothing else happening and while another client applies changes back to back.
//!
//! ```text
//! cargo build --release -p router-userspace && \
//!     cargo bench -p router-tests --bench record_contention
//! cargo bench -p router-tests --bench record_contention -- --disk-load
//! ```
//!
//! The first command builds the `switchyard` binary the agent runs, `target/release/switchyard`
//! beside the bench executable (`cargo bench` of this package does not build it; rebuild it
//! after changing the agent). Needs root and BPF. Options, after `--`: `--flips N` (500),
//! `--gap-ms MS` (10), `--pools N` (8), `--apply-gap-ms MS` (0), `--disk-load`,
//! `--disk-burst-mib N` (64), `--agent-log PATH` (a copy of the agent's log at the end).
//!
//! **Setup.** The agent (`switchyard attach` in the lb namespace of a [`Topology`] with one
//! backend) runs a configuration from [`large_config`]: `--pools` pools of 50 backends, 25
//! services per pool, 4 decision groups of 5 rules, over 20 fragments, without its health
//! checks (every backend counts as healthy: no probe traffic or health event competes with the
//! measurement). A route and a permanent neighbour entry in the lb namespace for each backend
//! give them next hops; no frame is sent to them. Beside it, a fragment of the bench's own:
//! the agent section, a push variable `bench_flip`, the decision group `bench-flip` (pool `p00`
//! while the variable is false, `p01` while it is true, `switch: { stable_for: 0s, cooldown:
//! 0s, failback_after: 0s }`, so that every change of the variable switches it) and a service
//! following the group.
//!
//! **Flips.** A flip is one `POST /state` (`{"name":"bench_flip","value":…}`, the opposite of
//! the current value) over a kept-alive connection, after a random pause uniform in
//! 0..2×`--gap-ms`, so that flips arrive at moments unrelated to the applies. Each flip's
//! latency is read twice:
//!
//! - **audit**: the agent's own `latency_us` of the switch's audit record, from the moment the
//!   `POST /state` handler took the request (before it locks the agent's state) to the
//!   completed decision-word map write. The records are read from the audit file
//!   (`<state_dir>/audit.jsonl`, the trail `GET /decisions` serves, which holds only the last
//!   1,024 records);
//! - **round trip**: the client's time from writing the request to reading the whole answer.
//!
//! **Phases**, each `--flips` flips, after 20 unmeasured flips at the start:
//!
//! - **idle**: flips, nothing else;
//! - **recording**: the same while another thread applies changes: it rewrites the fragment
//!   `000-large.yaml` (written beside the directory, renamed into it) alternately as the base
//!   version and as [`Version::OneWeight`] (one backend's weight), each time with a comment
//!   naming the apply, and sends `POST /apply`; then, `--apply-gap-ms` after the answer, the
//!   next one. Every apply is a change and records a new version: the slot ledger and one new
//!   fragment text. The applies run from before the phase's first flip until after its last;
//!   with no gap the agent is applying all the time, and nearly every flip meets an apply;
//! - with `--disk-load`, two more: **idle + disk** and **recording + disk**, the same two
//!   while a thread writes a file on the state directory's filesystem (256 MiB, rewritten in
//!   circles, 1 MiB per write) and `fsync`s it after every `--disk-burst-mib` MiB, as another
//!   process of a loaded host would. On ext4 an `fsync` waits for the journal commit, which
//!   writes the other file's dirty data out first: the history's `fsync`s then wait for up to
//!   a burst of someone else's data. An `fsync` after every MiB (`--disk-burst-mib 1`) leaves
//!   little dirty data behind and barely slows them.
//!
//! **Output.** Per phase: audit and round-trip p50, p90, p99 and max; for a recording phase
//! also the flips whose round trip overlapped an apply's, and those answered only after two or
//! more applies had been answered (they waited for more than the apply under way); the slowest
//! flip, and the apply it met; the `switchyard_decision_write_latency_seconds` count and mean
//! from `GET /metrics`, to compare with the audit records. Per recording phase, the applies:
//! the client's round trip of `POST /apply`, its `took_us` (the agent's time from the start of
//! the apply to its last map write) and the rest (the read of the directory, the history record,
//! the hops), with the round trip of 20 `POST /apply` with nothing to change afterwards (read,
//! hash, hops: what of the rest is not the record). Then the disk load's rate and `fsync` times,
//! the history's size and what one version's record holds, and the agent log's warnings.
//!
//! **Checks.** After each phase: every flip so far switched the group once, in order, to the
//! pool its value selects, and no other cause switched it; every apply's version was recorded
//! (`GET /versions`; `switchyard_history_errors` zero). A run that fails them is an error.
//! Nothing asserts on speed.
//!
//! The process runs at nice -20 in a session of its own, and so does the agent it starts. It is
//! not pinned: the agent's runtime uses every CPU.
#![expect(
    clippy::cast_precision_loss,
    reason = "latencies in µs, counts and sizes in bytes, far below 2^52, as f64 for the report"
)]

use std::fmt::Write as _;
use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail, ensure};
use router_tests::{
    addrs::lb_backend_if,
    agent::{Agent, unique_pin_path},
    bench::{
        self,
        host::{self, load_average, machine},
        large_config::{self, Shape, Version, fragments},
    },
    netns::{Netns, Topology},
    privileged,
};
use rules::engine::{Action, AuditKind, AuditRecord};
use switchyard::agent::Outcome;

/// Nice value of this process and the agent (see `host::own_session`).
const NICE: i32 = -20;
/// The bench's decision group and the push variable that switches it.
const GROUP: &str = "bench-flip";
const VARIABLE: &str = "bench_flip";
/// The pools the group chooses while the variable is false and true.
const POOL_OFF: usize = 0;
const POOL_ON: usize = 1;
/// The bench's own fragment (agent section, variable, group, service).
const FLIP_FRAGMENT: &str = "100-flip.yaml";
/// The fragment the applies rewrite: the only one [`Version::OneWeight`] changes.
const CHANGING: &str = "000-large.yaml";
/// Flips made before the first phase, not measured.
const WARMUP_FLIPS: usize = 20;
/// `POST /apply` with nothing to change, after a recording phase's applies.
const UNCHANGED_APPLIES: usize = 20;
/// Applies made before a recording phase's first flip.
const WARMUP_APPLIES: usize = 2;
/// The disk load's write, and the size of the file it rewrites.
const DISK_BLOCK: usize = 1 << 20;
const DISK_FILE: u64 = 256 << 20;
/// How long the disk load runs before a phase's first flip.
const DISK_WARMUP: Duration = Duration::from_secs(1);
/// Slack allowed between the client's wall clock around a flip and the time of its audit record.
const CLOCK_SLACK: Duration = Duration::from_millis(2);

/// The generated part of the configuration: `pools` pools of 50 backends.
fn shape(pools: usize) -> Shape {
    Shape {
        services: 25 * pools,
        pools,
        backends_per_pool: 50,
        groups: 4,
        rules_per_group: 5,
        fragments: 20,
    }
}

/// `text` without its `health_check:` lines (each is one line in [`large_config`]).
fn without_health_checks(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("health_check:"))
        .fold(String::with_capacity(text.len()), |mut out, l| {
            let _ = writeln!(out, "{l}");
            out
        })
}

/// The generated fragments of `version`, without health checks.
fn generated(shape: &Shape, version: Version) -> Vec<(String, String)> {
    fragments(shape, version)
        .into_iter()
        .map(|(name, text)| (name, without_health_checks(&text)))
        .collect()
}

/// Makes the generated backends reachable from the lb namespace, as an agent's backends are:
/// a route for each pool's /24 on the interface towards b1, and a permanent neighbour entry
/// for each backend (no frame is ever sent to them). The agent's next hops then resolve, its
/// pools are healthy and its decision groups publish; without this every backend would be
/// without a next hop and every group's `require` would veto all it could choose.
fn reachable(topo: &Topology, shape: &Shape) -> Result<()> {
    let dev = lb_backend_if(1);
    let mut lines = Vec::new();
    for p in 0..shape.pools {
        lines.push(format!("route add 198.18.{}.0/24 dev {dev}", 100 + p));
        for i in 0..shape.backends_per_pool {
            let addr = large_config::backend_address(shape, p, i, Version::Base);
            lines.push(format!(
                "neigh replace {addr} lladdr 02:00:00:00:99:01 dev {dev} nud permanent"
            ));
        }
    }
    topo.lb().ip_batch(&lines)
}

/// The bench's fragment: agent section, the variable, the group and a service following it.
fn flip_fragment(pin: &str) -> String {
    let off = large_config::pool_name(POOL_OFF);
    let on = large_config::pool_name(POOL_ON);
    format!(
        r#"agent:
  pin_path: {pin}
services:
  - {{ name: flip, vip: "198.19.255.1", port: 80, protocol: tcp, forward: dsr-l2, to: {{ decide: {GROUP} }} }}
state:
  {VARIABLE}: {{ push: {{ default: false }} }}
decisions:
  - name: {GROUP}
    rules:
      - {{ id: flipped, priority: 100, when: "{VARIABLE}", then: {{ pool: {on} }} }}
      - {{ id: unflipped, priority: 90, when: "NOT {VARIABLE}", then: {{ pool: {off} }} }}
    default: {{ pool: {off} }}
    switch: {{ stable_for: 0s, cooldown: 0s, failback_after: 0s }}
"#
    )
}

/// One HTTP/1.1 connection to the agent's local API, kept alive between requests. The socket
/// is opened in the lb namespace and may be used from any thread.
struct Api {
    stream: TcpStream,
    /// Bytes read past the last answer (none, with a server that answers one request at a
    /// time).
    buf: Vec<u8>,
}

impl Api {
    fn connect(lb: &Netns, addr: SocketAddr) -> Result<Self> {
        let stream =
            lb.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3)))??;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_mins(1)))?;
        Ok(Self {
            stream,
            buf: Vec::new(),
        })
    }

    /// Sends one request and reads its answer: status and body.
    fn call(&mut self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: agent\r\n");
        match body {
            Some(b) => {
                let _ = write!(
                    req,
                    "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                    b.len()
                );
            }
            None => req += "Content-Length: 0\r\n\r\n",
        }
        self.stream.write_all(req.as_bytes())?;
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            self.fill(method, path)?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("{method} {path}: no status in {head:?}"))?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .with_context(|| format!("{method} {path}: no Content-Length in {head:?}"))?;
        while self.buf.len() < head_end + length {
            self.fill(method, path)?;
        }
        let body = String::from_utf8_lossy(&self.buf[head_end..head_end + length]).into_owned();
        self.buf.drain(..head_end + length);
        Ok((status, body))
    }

    fn fill(&mut self, method: &str, path: &str) -> Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self
            .stream
            .read(&mut chunk)
            .with_context(|| format!("{method} {path}"))?;
        if n == 0 {
            bail!("{method} {path}: the agent closed the connection");
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// A request that must answer 200; its body.
    fn ok(&mut self, method: &str, path: &str, body: Option<&str>) -> Result<String> {
        let (status, text) = self.call(method, path, body)?;
        ensure!(status == 200, "{method} {path}: {status} {text}");
        Ok(text)
    }
}

/// `d` in whole microseconds (`u64::MAX` beyond, some 584,000 years).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Microseconds since the Unix epoch.
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, micros)
}

/// A small pseudo-random generator (xorshift64*), for the pauses between flips.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        Self(wall_us() | 1)
    }

    /// Uniform in `0..n` (n > 0), near enough.
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// One flip as the client saw it.
#[derive(Debug, Clone, Copy)]
struct Flip {
    /// The value set.
    value: bool,
    sent: Instant,
    done: Instant,
    /// Wall clock (µs since the epoch) just before sending and just after the answer.
    sent_wall: u64,
    done_wall: u64,
}

impl Flip {
    fn round_trip_us(&self) -> u64 {
        micros(self.done - self.sent)
    }
}

/// The flipping client: the value it set last.
struct Flipper {
    api: Api,
    value: bool,
    rng: Rng,
    gap: Duration,
}

impl Flipper {
    /// One flip: sets the opposite of the current value; the agent must answer that it changed.
    fn flip(&mut self) -> Result<Flip> {
        let value = !self.value;
        let body = format!(r#"{{"name":"{VARIABLE}","value":"{value}"}}"#);
        let sent_wall = wall_us();
        let sent = Instant::now();
        let (status, text) = self.api.call("POST", "/state", Some(&body))?;
        let done = Instant::now();
        let done_wall = wall_us();
        ensure!(status == 200, "POST /state {body}: {status} {text}");
        let answer: serde_json::Value = serde_json::from_str(&text)?;
        ensure!(
            answer["changed"] == true,
            "POST /state {body} changed nothing: {text}"
        );
        self.value = value;
        Ok(Flip {
            value,
            sent,
            done,
            sent_wall,
            done_wall,
        })
    }

    /// `n` flips, each after a random pause of 0..2×gap.
    fn flips(&mut self, n: usize) -> Result<Vec<Flip>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let gap_us = micros(self.gap);
            if gap_us > 0 {
                thread::sleep(Duration::from_micros(self.rng.below(2 * gap_us)));
            }
            out.push(self.flip()?);
        }
        Ok(out)
    }
}

/// One apply as the applying client saw it.
#[derive(Debug, Clone, Copy)]
struct ApplyRun {
    sent: Instant,
    done: Instant,
    /// The agent's `took_us` (start of the apply to its last map write).
    took_us: u64,
}

impl ApplyRun {
    fn round_trip_us(&self) -> u64 {
        micros(self.done - self.sent)
    }
}

/// What the applying thread did.
#[derive(Debug, Default)]
struct Applied {
    runs: Vec<ApplyRun>,
    /// `POST /apply` answers with nothing changed: the directory watch had applied the
    /// change first (it records the version too).
    unchanged: usize,
}

/// The applying thread: rewrites [`CHANGING`] and sends `POST /apply`, each after the
/// answer to the last one and a pause (none by default), until stopped.
struct Applier {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<Applied>>,
}

impl Applier {
    fn start(mut api: Api, dir: PathBuf, texts: [String; 2], first: u64, gap: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || -> Result<Applied> {
            let mut out = Applied::default();
            let target = dir.join(CHANGING);
            let staging = dir.with_extension("next");
            let mut n = first;
            while !flag.load(Ordering::Relaxed) {
                n += 1;
                // A new text each time (the comment), so every record stores one.
                let text = format!("{}# bench apply {n}\n", texts[(n % 2) as usize]);
                fs::write(&staging, text)?;
                fs::rename(&staging, &target)?;
                let sent = Instant::now();
                let body = api.ok("POST", "/apply", None)?;
                let done = Instant::now();
                let o: Outcome = serde_json::from_str(&body)
                    .with_context(|| format!("POST /apply answered {body}"))?;
                if o.changed {
                    out.runs.push(ApplyRun {
                        sent,
                        done,
                        took_us: o.took_us,
                    });
                } else {
                    out.unchanged += 1;
                }
                if !gap.is_zero() {
                    thread::sleep(gap);
                }
            }
            Ok(out)
        });
        Self { stop, handle }
    }

    fn finish(self) -> Result<Applied> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

/// What the disk-load thread did.
#[derive(Debug, Default)]
struct DiskStats {
    blocks: u64,
    /// Blocks written between two `fsync`s.
    burst: u64,
    elapsed: Duration,
    fsync_us: Vec<u64>,
}

/// The disk-load thread: 1 MiB writes into `path`, an `fsync` after every `burst`; the file is
/// removed when it stops.
struct DiskLoad {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<DiskStats>>,
}

impl DiskLoad {
    fn start(path: PathBuf, burst: u64) -> Result<Self> {
        let file = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || -> Result<DiskStats> {
            // Its CPU time is not the point; it must not take the CPU from the agent.
            let _ = host::renice(0, 10);
            #[expect(
                clippy::cast_possible_truncation,
                reason = "a filler pattern: the low byte of i · 7 + 13"
            )]
            let block: Vec<u8> = (0..DISK_BLOCK).map(|i| (i * 7 + 13) as u8).collect();
            let mut stats = DiskStats {
                burst,
                ..DiskStats::default()
            };
            let start = Instant::now();
            let mut at = 0u64;
            let result = (|| -> Result<()> {
                while !flag.load(Ordering::Relaxed) {
                    file.write_all_at(&block, at)?;
                    stats.blocks += 1;
                    at = (at + DISK_BLOCK as u64) % DISK_FILE;
                    if stats.blocks.is_multiple_of(burst) {
                        let t = Instant::now();
                        file.sync_all()?;
                        stats.fsync_us.push(micros(t.elapsed()));
                    }
                }
                Ok(())
            })();
            stats.elapsed = start.elapsed();
            drop(file);
            let _ = fs::remove_file(&path);
            result.map(|()| stats)
        });
        Ok(Self { stop, handle })
    }

    fn finish(self) -> Result<DiskStats> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

/// The value of the unlabelled sample `name` in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.split_whitespace().next()?.parse().ok())?
    })
}

/// What `GET /metrics` and `GET /versions` say, at a phase's edges.
#[derive(Debug, Clone, Copy)]
struct Counters {
    /// `switchyard_decision_write_latency_seconds` count and sum.
    decisions: f64,
    decision_seconds: f64,
    history_errors: f64,
    /// Versions in the history.
    versions: usize,
}

fn counters(api: &mut Api) -> Result<Counters> {
    let text = api.ok("GET", "/metrics", None)?;
    let get = |name: &str| {
        metric(&text, name).with_context(|| format!("no {name} in GET /metrics:\n{text}"))
    };
    let versions: serde_json::Value = serde_json::from_str(&api.ok("GET", "/versions", None)?)?;
    Ok(Counters {
        decisions: get("switchyard_decision_write_latency_seconds_count")?,
        decision_seconds: get("switchyard_decision_write_latency_seconds_sum")?,
        history_errors: get("switchyard_history_errors_total")?,
        versions: versions["versions"]
            .as_array()
            .context("GET /versions: no versions")?
            .len(),
    })
}

/// The switches of the bench's group caused by a `POST /state` of its variable, oldest first,
/// and the number of its switches with another cause.
fn flip_switches(audit: &Path) -> Result<(Vec<AuditRecord>, usize)> {
    let text = fs::read_to_string(audit).with_context(|| format!("reading {}", audit.display()))?;
    let cause = format!("state set {VARIABLE}=");
    let mut flips = Vec::new();
    let mut other = 0;
    for line in text.lines() {
        let Ok(r) = AuditRecord::from_json_line(line) else {
            continue;
        };
        if r.group != GROUP || r.kind != AuditKind::Switch {
            continue;
        }
        if r.cause.starts_with(&cause) {
            flips.push(r);
        } else {
            other += 1;
        }
    }
    Ok((flips, other))
}

/// One phase's measurements.
struct Phase {
    name: &'static str,
    flips: Vec<Flip>,
    /// The audit records' `latency_us`, one per flip.
    audit_us: Vec<u64>,
    /// Flips whose audit record's time is outside the flip's round trip (± [`CLOCK_SLACK`]).
    out_of_window: usize,
    applied: Option<Applied>,
    /// Round trips (µs) of `POST /apply` with nothing to change, after the applies.
    unchanged: Vec<u64>,
    disk: Option<DiskStats>,
    before: Counters,
    after: Counters,
    elapsed: Duration,
}

/// `a - b` in milliseconds, negative when `a` is earlier.
fn signed_ms(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64() * 1e3
    } else {
        -(b - a).as_secs_f64() * 1e3
    }
}

/// Nearest-rank percentile `p` (0..=1) of `sorted`.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a rank into the sorted samples: ⌈p · len⌉ for p in 0..=1, clamped to 1..=len"
)]
fn rank(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[i - 1]
}

/// `p50 p90 p99 max` of `values`, each right-aligned in `width`, divided by `div`.
fn stats(values: &[u64], div: f64, width: usize, decimals: usize) -> String {
    let mut v = values.to_vec();
    v.sort_unstable();
    [0.5, 0.9, 0.99, 1.0]
        .iter()
        .map(|&p| format!("{:>width$.decimals$}", rank(&v, p) as f64 / div))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Phase {
    /// Whether flip `f`'s round trip overlapped an apply's.
    fn met_apply(&self, f: &Flip) -> bool {
        self.applied
            .as_ref()
            .is_some_and(|a| a.runs.iter().any(|r| r.sent < f.done && f.sent < r.done))
    }

    /// How many applies were answered while flip `f` was under way: 1 when it waited for
    /// the apply that held the agent's state, more when it also waited for the ones after it.
    fn answers_during(&self, f: &Flip) -> usize {
        self.applied.as_ref().map_or(0, |a| {
            a.runs
                .iter()
                .filter(|r| f.sent < r.done && r.done < f.done)
                .count()
        })
    }

    fn print_flips(&self) {
        let rtt: Vec<u64> = self.flips.iter().map(Flip::round_trip_us).collect();
        println!(
            "  {:<16} {:>5}  audit      {}",
            self.name,
            self.flips.len(),
            stats(&self.audit_us, 1.0, 8, 0)
        );
        println!(
            "  {:<16} {:>5}  round trip {}",
            "",
            "",
            stats(&rtt, 1.0, 8, 0)
        );
        if self.applied.is_some() {
            let (met, audit): (Vec<usize>, Vec<u64>) = self
                .flips
                .iter()
                .zip(&self.audit_us)
                .enumerate()
                .filter(|(_, (f, _))| self.met_apply(f))
                .map(|(i, (_, a))| (i, *a))
                .unzip();
            println!(
                "  {:<16} {:>5}  audit of the {} flips that met an apply: {}",
                "",
                "",
                met.len(),
                stats(&audit, 1.0, 8, 0)
            );
            let spans: Vec<usize> = self.flips.iter().map(|f| self.answers_during(f)).collect();
            let several = spans.iter().filter(|&&n| n >= 2).count();
            println!(
                "  {:<16} {:>5}  {several} flips answered only after two or more applies had \
                 been answered (most: {})",
                "",
                "",
                spans.iter().max().copied().unwrap_or(0)
            );
        }
        if let Some((i, f)) = self
            .flips
            .iter()
            .enumerate()
            .max_by_key(|(i, _)| self.audit_us[*i])
        {
            let met = self.applied.as_ref().and_then(|a| {
                a.runs
                    .iter()
                    .position(|r| r.sent < f.done && f.sent < r.done)
                    .map(|k| (k, a.runs[k]))
            });
            let with = match met {
                Some((k, r)) => format!(
                    "; it was sent {:+.2} ms after apply {k} of the phase (round trip {:.2} ms, \
                     took_us {:.2} ms) and answered {:+.2} ms after it",
                    signed_ms(f.sent, r.sent),
                    r.round_trip_us() as f64 / 1e3,
                    r.took_us as f64 / 1e3,
                    signed_ms(f.done, r.done)
                ),
                None => String::new(),
            };
            println!(
                "  {:<16} {:>5}  slowest: flip {i}, audit {:.2} ms, round trip {:.2} ms{with}",
                "",
                "",
                self.audit_us[i] as f64 / 1e3,
                f.round_trip_us() as f64 / 1e3
            );
        }
        let n = self.after.decisions - self.before.decisions;
        let mean = if n > 0.0 {
            (self.after.decision_seconds - self.before.decision_seconds) / n * 1e6
        } else {
            0.0
        };
        let audit_mean = bench::mean(&self.audit_us.iter().map(|&u| u as f64).collect::<Vec<_>>());
        println!(
            "  {:<16} {:>5}  metrics: {n} switches written, mean {mean:.0} µs (audit mean \
             {audit_mean:.0} µs); {} records outside their flip's round trip; {:.1} s",
            "",
            "",
            self.out_of_window,
            self.elapsed.as_secs_f64()
        );
    }

    fn print_applies(&self) {
        let Some(a) = &self.applied else { return };
        let rtt: Vec<u64> = a.runs.iter().map(ApplyRun::round_trip_us).collect();
        let took: Vec<u64> = a.runs.iter().map(|r| r.took_us).collect();
        let rest: Vec<u64> = a
            .runs
            .iter()
            .map(|r| r.round_trip_us().saturating_sub(r.took_us))
            .collect();
        let span = match (a.runs.first(), a.runs.last()) {
            (Some(f), Some(l)) => (l.done - f.sent).as_secs_f64(),
            _ => 0.0,
        };
        println!(
            "  {:<16} {:>5} applies, {:.1}/s, {} versions recorded, {} taken by the watch",
            self.name,
            a.runs.len(),
            a.runs.len() as f64 / span.max(1e-9),
            self.after.versions - self.before.versions,
            a.unchanged
        );
        println!(
            "  {:<16} round trip            {}",
            "",
            stats(&rtt, 1e3, 8, 2)
        );
        println!(
            "  {:<16} took_us (live)        {}",
            "",
            stats(&took, 1e3, 8, 2)
        );
        println!(
            "  {:<16} rest (record, …)      {}",
            "",
            stats(&rest, 1e3, 8, 2)
        );
        println!(
            "  {:<16} unchanged, round trip {}   ({} after the applies: read, hash, hops)",
            "",
            stats(&self.unchanged, 1e3, 8, 2),
            self.unchanged.len()
        );
    }

    fn print_disk(&self) {
        let Some(d) = &self.disk else { return };
        let mb = d.blocks as f64 * DISK_BLOCK as f64 / 1e6;
        println!(
            "  {:<16} disk load: {:.0} MB/s ({} MiB in {:.1} s), fsync after {} MiB, ms: {}",
            self.name,
            mb / d.elapsed.as_secs_f64().max(1e-9),
            d.blocks,
            d.elapsed.as_secs_f64(),
            d.burst,
            stats(&d.fsync_us, 1e3, 7, 1)
        );
    }
}

/// The running experiment: topology, agent, clients, and what was flipped so far.
struct Bench {
    flipper: Flipper,
    /// For `GET /metrics` and `GET /versions`.
    probe: Api,
    texts: [String; 2],
    /// Applies made so far (they number the comments).
    applies: u64,
    /// Every flip so far, warm-up included, in order.
    all_flips: Vec<Flip>,
    flips: usize,
    /// Pause between one apply's answer and the next apply.
    apply_gap: Duration,
    /// MiB the disk load writes between two `fsync`s.
    disk_burst: u64,
    // Dropped last: the agent before the namespaces.
    agent: Agent,
    topo: Topology,
}

impl Bench {
    fn api(&self) -> Result<Api> {
        let addr = switchyard::cli::agent_settings(self.agent.dir()).api;
        Api::connect(self.topo.lb(), addr)
    }

    /// Runs one phase: flips, with applies and the disk load if asked.
    #[expect(
        clippy::similar_names,
        reason = "the applying thread (`applier`) and what it did (`applied`)"
    )]
    fn phase(&mut self, name: &'static str, applying: bool, disk: bool) -> Result<Phase> {
        let load = if disk {
            let path = self.agent.state_dir().with_extension("load");
            let l = DiskLoad::start(path, self.disk_burst)?;
            thread::sleep(DISK_WARMUP);
            Some(l)
        } else {
            None
        };
        let before = counters(&mut self.probe)?;
        let start = Instant::now();
        let applier = if applying {
            let a = Applier::start(
                self.api()?,
                self.agent.dir().to_owned(),
                self.texts.clone(),
                self.applies,
                self.apply_gap,
            );
            // Applies under way before the first flip.
            let deadline = Instant::now() + Duration::from_mins(1);
            while counters(&mut self.probe)?.versions < before.versions + WARMUP_APPLIES {
                ensure!(Instant::now() < deadline, "no apply recorded within 60 s");
                thread::sleep(Duration::from_millis(5));
            }
            Some(a)
        } else {
            None
        };
        let flipped = self.flipper.flips(self.flips);
        let applied = applier.map(Applier::finish).transpose();
        let elapsed = start.elapsed();
        // What an apply costs without a change (read and hash the directory, the hops), under
        // the same disk load.
        let unchanged = if applying && applied.is_ok() {
            self.unchanged_applies()
        } else {
            Ok(Vec::new())
        };
        let disk = load.map(DiskLoad::finish).transpose();
        let (flips, applied, unchanged, disk) = (flipped?, applied?, unchanged?, disk?);
        self.all_flips.extend_from_slice(&flips);
        if let Some(a) = &applied {
            self.applies += (a.runs.len() + a.unchanged) as u64;
        }
        // Every apply's version recorded (the record may finish after the answer).
        let want = before.versions + applied.as_ref().map_or(0, |a| a.runs.len() + a.unchanged);
        let deadline = Instant::now() + Duration::from_secs(30);
        let after = loop {
            let c = counters(&mut self.probe)?;
            if c.versions >= want || Instant::now() > deadline {
                break c;
            }
            thread::sleep(Duration::from_millis(20));
        };
        ensure!(
            after.versions >= want,
            "{name}: {} versions recorded for {} applies",
            after.versions - before.versions,
            want - before.versions
        );
        ensure!(
            after.history_errors == 0.0,
            "{name}: the agent failed to record {} versions",
            after.history_errors
        );
        let (audit_us, out_of_window) = self.check_switches(&flips)?;
        Ok(Phase {
            name,
            flips,
            audit_us,
            out_of_window,
            applied,
            unchanged,
            disk,
            before,
            after,
            elapsed,
        })
    }

    /// The history's size, what the last version's record held, and the agent log's warnings
    /// and errors.
    fn print_history(&mut self) -> Result<()> {
        let list: serde_json::Value =
            serde_json::from_str(&self.probe.ok("GET", "/versions", None)?)?;
        let running = list["running"]
            .as_u64()
            .context("GET /versions: no running version")?;
        let count = list["versions"].as_array().map_or(0, Vec::len);
        let version: serde_json::Value = serde_json::from_str(&self.probe.ok(
            "GET",
            &format!("/versions/{running}"),
            None,
        )?)?;
        let ledger = version["ledger"].as_str().map_or(0, str::len);
        let texts: usize = version["texts"].as_array().map_or(0, |t| {
            t.iter().filter_map(|f| f[1].as_str()).map(str::len).sum()
        });
        let path = self.agent.state_dir().join(switchyard::history::FILE_NAME);
        let size = fs::metadata(&path).map_or(0, |m| m.len());
        println!(
            "history: {count} versions, {:.1} MiB ({}); a version's record: ledger {} KiB, \
             fragments {} KiB (one new text per apply)",
            size as f64 / f64::from(1 << 20),
            path.display(),
            ledger / 1024,
            texts / 1024
        );
        let log = self.agent.log_text();
        let notable: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        // By the module that logged them (`[time LEVEL module] message`), with the first one.
        let mut by: std::collections::BTreeMap<&str, (usize, &str)> =
            std::collections::BTreeMap::new();
        for l in &notable {
            let module = l
                .split(']')
                .next()
                .and_then(|h| h.split_whitespace().last())
                .unwrap_or("?");
            by.entry(module).or_insert((0, l)).0 += 1;
        }
        println!("agent log: {} warnings and errors", notable.len());
        for (module, (n, first)) in &by {
            println!("  {n} from {module}, the first: {first}");
        }
        Ok(())
    }

    /// Round trips (µs) of [`UNCHANGED_APPLIES`] `POST /apply` with the directory as applied.
    fn unchanged_applies(&mut self) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(UNCHANGED_APPLIES);
        for _ in 0..UNCHANGED_APPLIES {
            let sent = Instant::now();
            let body = self.probe.ok("POST", "/apply", None)?;
            out.push(micros(sent.elapsed()));
            let o: Outcome = serde_json::from_str(&body)?;
            ensure!(
                !o.changed,
                "POST /apply of the applied directory changed something"
            );
        }
        Ok(out)
    }

    /// Checks that every flip so far switched the group once, in order, to the pool its value
    /// selects; returns the audit latencies of `flips` (the last ones) and how many of their
    /// records lie outside the flip's round trip.
    fn check_switches(&self, flips: &[Flip]) -> Result<(Vec<u64>, usize)> {
        let audit = self.agent.state_dir().join("audit.jsonl");
        let (records, other) = flip_switches(&audit)?;
        ensure!(
            records.len() == self.all_flips.len(),
            "{} flips so far, {} switches of {GROUP} by them in {} ({other} by other causes)",
            self.all_flips.len(),
            records.len(),
            audit.display()
        );
        ensure!(
            other <= 1,
            "{GROUP} switched {other} times by something else than a flip (the start's \
             switch is the one expected)"
        );
        let mine = &records[records.len() - flips.len()..];
        let mut latencies = Vec::with_capacity(flips.len());
        let mut outside = 0;
        let slack = micros(CLOCK_SLACK);
        for (i, (f, r)) in flips.iter().zip(mine).enumerate() {
            let pool = large_config::pool_name(if f.value { POOL_ON } else { POOL_OFF });
            ensure!(
                r.cause == format!("state set {VARIABLE}={}", f.value)
                    && r.to == Some(Action::pool(&pool)),
                "flip {i} set {VARIABLE}={} (→ {pool}), its switch record says: {r:?}",
                f.value
            );
            let latency = r
                .latency_us
                .with_context(|| format!("flip {i}: no latency_us in {r:?}"))?;
            latencies.push(latency);
            let at = micros(r.at);
            if at + slack < f.sent_wall || at > f.done_wall + slack {
                outside += 1;
            }
        }
        Ok((latencies, outside))
    }
}

/// The pause `--NAME MS` gives (`default_ms` without it), in whole microseconds.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "milliseconds from the command line to whole µs, saturating (a negative pause is \
              none)"
)]
fn pause_arg(name: &str, default_ms: f64) -> Duration {
    Duration::from_micros((bench::arg::<f64>(name).unwrap_or(default_ms) * 1e3) as u64)
}

#[expect(
    clippy::too_many_lines,
    reason = "the run in order: options, the configuration, the agent, the phases, the report"
)]
fn main() -> Result<()> {
    if !bench::invoked_by_cargo_bench() {
        println!(
            "record_contention: a benchmark; run it with `cargo bench -p router-tests --bench \
             record_contention`"
        );
        return Ok(());
    }
    if privileged::require_root_and_bpf("bench record_contention").is_err() {
        return Ok(());
    }
    router_tests::agent::binary()?;
    let flips: usize = bench::arg("flips").unwrap_or(500).max(1);
    let gap = pause_arg("gap-ms", 10.0);
    let apply_gap = pause_arg("apply-gap-ms", 0.0);
    let pools: usize = bench::arg("pools").unwrap_or(8).clamp(2, 155);
    let disk_load = std::env::args().any(|a| a == "--disk-load");
    let disk_burst: u64 = bench::arg("disk-burst-mib").unwrap_or(64).clamp(1, 256);
    if let Err(e) = host::own_session(NICE).and_then(|()| host::renice(0, NICE)) {
        println!("(not prioritized: {e:#})");
    }

    let shape = shape(pools);
    let base = generated(&shape, Version::Base);
    let changed = generated(&shape, Version::OneWeight);
    let differing: Vec<&str> = base
        .iter()
        .zip(&changed)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.0.as_str())
        .collect();
    ensure!(
        differing == [CHANGING],
        "the one-weight version differs in {differing:?}, not in {CHANGING} alone"
    );
    let texts = [
        base.iter()
            .find(|(n, _)| n == CHANGING)
            .context(CHANGING)?
            .1
            .clone(),
        changed
            .iter()
            .find(|(n, _)| n == CHANGING)
            .context(CHANGING)?
            .1
            .clone(),
    ];
    let mut files: Vec<(&str, String)> =
        base.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    files.push((FLIP_FRAGMENT, flip_fragment(&unique_pin_path())));
    let bytes: usize = files.iter().map(|(_, t)| t.len()).sum();

    println!("machine: {}", machine());
    println!("load average at start: {}", load_average());
    println!(
        "config: {} services, {} pools, {} backends, {} decision groups + {GROUP}, in {} \
         fragments ({} KiB), no health checks",
        shape.services + 1,
        shape.pools,
        shape.backends(),
        shape.groups,
        files.len(),
        bytes / 1024
    );

    let topo = Topology::builder().backends(1).build()?;
    reachable(&topo, &shape)?;
    let agent = Agent::start(&topo, &files)?;
    let mut bench = Bench {
        flipper: Flipper {
            api: Api::connect(topo.lb(), switchyard::cli::agent_settings(agent.dir()).api)?,
            value: false,
            rng: Rng::new(),
            gap,
        },
        probe: Api::connect(topo.lb(), switchyard::cli::agent_settings(agent.dir()).api)?,
        texts,
        applies: 0,
        all_flips: Vec::new(),
        flips,
        apply_gap,
        disk_burst,
        agent,
        topo,
    };
    let state_dir = bench.agent.state_dir();
    let dev = |p: &Path| fs::metadata(p).map(|m| m.dev());
    println!(
        "state_dir {} (device {:#x}); {flips} flips per phase after {WARMUP_FLIPS} unmeasured, \
         pauses 0..{:.0} ms; {:.0} ms between applies; audit and round trip in µs, applies in ms",
        state_dir.display(),
        dev(&state_dir)?,
        2.0 * gap.as_secs_f64() * 1e3,
        apply_gap.as_secs_f64() * 1e3,
    );
    if disk_load {
        let parent = state_dir.parent().context("state_dir has no parent")?;
        ensure!(
            dev(parent)? == dev(&state_dir)?,
            "{} is not on the state directory's filesystem",
            parent.display()
        );
    }

    let result = (|| -> Result<Vec<Phase>> {
        let warm = bench.flipper.flips(WARMUP_FLIPS)?;
        bench.all_flips.extend_from_slice(&warm);
        let mut phases = vec![
            bench.phase("idle", false, false)?,
            bench.phase("recording", true, false)?,
        ];
        if disk_load {
            phases.push(bench.phase("idle + disk", false, true)?);
            phases.push(bench.phase("recording + disk", true, true)?);
        }
        // The records of the warm-up and every phase, checked once more at the end.
        bench.check_switches(&[])?;
        Ok(phases)
    })();
    let phases = match result {
        Ok(p) => p,
        Err(e) => {
            let log = bench.agent.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(e.context(format!("agent log (last 40 lines):\n{}", tail.join("\n"))));
        }
    };

    println!();
    println!(
        "flips: {:<16} {:>5}  {:<10} {:>8} {:>8} {:>8} {:>8}",
        "phase", "n", "µs", "p50", "p90", "p99", "max"
    );
    for p in &phases {
        p.print_flips();
    }
    println!();
    println!(
        "applies: {:<14} {:<21} {:>8} {:>8} {:>8} {:>8}",
        "phase", "ms", "p50", "p90", "p99", "max"
    );
    for p in &phases {
        p.print_applies();
    }
    if disk_load {
        println!();
        for p in &phases {
            p.print_disk();
        }
    }
    println!();
    bench.print_history()?;
    if let Some(path) = bench::arg::<PathBuf>("agent-log") {
        fs::write(&path, bench.agent.log_text())
            .with_context(|| format!("writing {}", path.display()))?;
        println!("agent log copied to {}", path.display());
    }
    println!("load average at end: {}", load_average());
    Ok(())
}
