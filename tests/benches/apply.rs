//! Apply time for a large configuration (the config lifecycle's target: "1,000 services, 5,000 backends and 200 rules
//! (parse, validate, compile, write maps) — target under 200 ms").
//!
//! ```text
//! cargo bench -p router-tests --bench apply [-- --runs 20]
//! ```
//!
//! The configuration is [`Shape::LARGE`] (`router_tests::bench::large_config`): 100 fragment
//! files in a temporary directory, and a second directory with its [`Version::Changed`] (1 % of
//! the backends replaced, 10 reweighted). One apply is the work of the agent's apply
//! path (`Runtime::apply` in `agent::apply`, the one every entry point takes), step by step
//! with the same calls, timed in five stages (the record synchronously here; the agent hands it
//! to its history thread):
//!
//! - **read**: `config::read_dir` and the fragments' content hash (equal to the running
//!   version's: nothing else is done, the apply is a no-op);
//! - **load**: `Fragments::load` — parse, validate, compile every rule expression;
//! - **engine**: the new configuration's state store and decision driver, carrying over what the
//!   running ones know (`state::Store::new`, `carry_over`, `decision::Driver::new`, `resume`), and
//!   the resource diff against the running configuration (`config::Diff::between`);
//! - **maps**: `initial_actions`, `Publisher::apply_decided` (backends, Maglev tables built and
//!   written, pool flips, decision words, services, removals, generation) and the driver's first
//!   pass (`on_change` over all groups, which publishes the groups' decision words) — the
//!   configuration is live at the end of this stage;
//! - **record**: the version and the publisher's slot ledger recorded in the history store
//!   (`history::History::record`, `SQLite` in a temporary state directory);
//!
//! **live** is the first four, **total** all five. (Not included: what the agent does after
//! the apply — restarting probes, logging, keeping overrides.)
//!
//! Four scenarios, each `--runs` times after one untimed run:
//!
//! - **first**: the base configuration with empty maps, a new publisher and a new history, as
//!   an agent's first start. For the kernel, the object is loaded afresh before each run (not
//!   timed);
//! - **unchanged**: the base configuration again: its hash is the running one's, a no-op;
//! - **changed**: the two versions alternately, each over the other. After the first two, the
//!   history already holds every fragment text (it stores each text once), so a record writes
//!   the version's row and ledger only;
//! - **one weight**: the base and [`Version::OneWeight`] alternately (one backend's weight).
//!
//! Each scenario runs on two data planes: the in-memory one (`dataplane::memory`, the map
//! writes are `HashMap` inserts: the agent's own work) and the real maps of the loaded XDP
//! program (private, unpinned, not attached: `dataplane::load::load(None)`), which needs root
//! and BPF and is skipped with a message otherwise. The difference is the cost of the map
//! writes themselves (system calls, and the Maglev tables copied into the mapped array).
//!
//! The process runs at nice -20 in a session of its own, pinned to the last CPU. Nothing
//! asserts on speed; a run that does not leave the expected maps behind is an error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, ensure};
use router_tests::{
    bench::{
        self,
        host::{self, load_average, machine},
        large_config::{Shape, Version, changes, fragments},
    },
    privileged,
};
use switchyard::{
    config::{self, Config, Diff},
    dataplane::{
        Dataplane, load,
        maps::KernelMaps,
        memory::{MemoryDataplane, Write},
    },
    decision::{Driver, View},
    history::{History, NewVersion},
    publish::Publisher,
    state::Store,
};

/// Nice value of this process (see `host::own_session`).
const NICE: i32 = -20;

/// One apply's stages.
#[derive(Debug, Clone, Copy, Default)]
struct Stages {
    read: Duration,
    load: Duration,
    engine: Duration,
    maps: Duration,
    record: Duration,
}

impl Stages {
    /// Until the configuration is live.
    fn live(&self) -> Duration {
        self.read + self.load + self.engine + self.maps
    }

    fn total(&self) -> Duration {
        self.live() + self.record
    }
}

/// What the agent keeps between applies (the parts of its `Runtime` an apply reads and
/// writes).
struct Running {
    publisher: Publisher,
    config: Config,
    store: Store,
    /// Content hash of the running fragments (empty before the first apply).
    hash: String,
    history: History,
    started: Instant,
}

impl Running {
    /// A starting agent's: nothing published, the empty configuration, a history in
    /// `state_dir`.
    fn new(state_dir: &Path) -> Result<Self> {
        let config = config::load_files(&[])?;
        let publisher = Publisher::new();
        let store = Store::new(&config, publisher.health());
        Ok(Self {
            publisher,
            config,
            store,
            hash: String::new(),
            history: History::open(state_dir)?,
            started: Instant::now(),
        })
    }
}

/// The agent's apply path on `dir`, timed by stage.
fn apply(dir: &Path, run: &mut Running, dp: &mut dyn Dataplane) -> Result<Stages> {
    let t0 = Instant::now();
    let fragments = config::read_dir(dir)?.fragments()?;
    let hash = fragments.hash();
    let t1 = Instant::now();
    if hash == run.hash {
        return Ok(Stages {
            read: t1 - t0,
            ..Stages::default()
        });
    }
    let cfg = fragments.load()?;
    let t2 = Instant::now();
    let mut health = run.publisher.health().clone();
    health.configure(&cfg);
    let mut store = Store::new(&cfg, &health);
    store.carry_over(&run.store);
    let mut driver = Driver::new(&cfg);
    let now = run.started.elapsed();
    driver.resume(&cfg, &run.publisher, now);
    let diff = Diff::between(&run.config, &cfg);
    let t3 = Instant::now();
    let first = driver.initial_actions(View {
        state: store.state(),
        health: &health,
        now,
    });
    let generation = run.publisher.apply_decided(dp, &cfg, &first)?;
    let view = View {
        state: store.state(),
        health: run.publisher.health(),
        now,
    };
    for d in driver.on_change(&[], true, view, "apply") {
        if let Some(to) = &d.switch_to {
            run.publisher.publish_decision(dp, &d.group, to)?;
        }
    }
    let t4 = Instant::now();
    let ledger = serde_json::to_string(&run.publisher.ledger())?;
    let time = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    run.history.record(NewVersion {
        fragments,
        source: "bench".into(),
        generation,
        ledger,
        time,
    })?;
    let t5 = Instant::now();
    std::hint::black_box(diff);
    run.config = cfg;
    run.store = store;
    run.hash = hash;
    Ok(Stages {
        read: t1 - t0,
        load: t2 - t1,
        engine: t3 - t2,
        maps: t4 - t3,
        record: t5 - t4,
    })
}

/// The configuration's two versions, each written into a directory of its own, and state
/// directories for the histories; removed on drop.
struct Dirs {
    root: PathBuf,
    states: std::cell::Cell<u32>,
}

impl Dirs {
    fn write() -> Result<Self> {
        let root = std::env::temp_dir().join(format!("sy-apply-{}", std::process::id()));
        let dirs = Self {
            root,
            states: std::cell::Cell::new(0),
        };
        for version in [Version::Base, Version::Changed, Version::OneWeight] {
            let dir = dirs.of(version);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, text) in fragments(&Shape::LARGE, version) {
                std::fs::write(dir.join(&name), text).with_context(|| format!("writing {name}"))?;
            }
        }
        Ok(dirs)
    }

    fn of(&self, version: Version) -> PathBuf {
        self.root.join(match version {
            Version::Base => "base",
            Version::Changed => "changed",
            Version::OneWeight => "one-weight",
        })
    }

    /// A new, empty state directory (the history store goes there).
    fn new_state(&self) -> PathBuf {
        let n = self.states.get() + 1;
        self.states.set(n);
        self.root.join(format!("state-{n}"))
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A data plane the scenarios run on.
trait Plane {
    /// What the report calls it.
    const NAME: &'static str;
    /// Empty maps.
    fn fresh() -> Result<Self>
    where
        Self: Sized;
    fn dp(&mut self) -> &mut dyn Dataplane;
    /// Checks that the maps hold what `publisher` published (a sample of it).
    fn check(&self, publisher: &Publisher) -> Result<()>;
}

impl Plane for MemoryDataplane {
    const NAME: &'static str = "in-memory";

    fn fresh() -> Result<Self> {
        Ok(Self::default())
    }

    fn dp(&mut self) -> &mut dyn Dataplane {
        // The write log would grow without bound over the runs; only the last apply's is kept.
        self.log.clear();
        self
    }

    fn check(&self, publisher: &Publisher) -> Result<()> {
        ensure!(
            self.services.len() == publisher.services().len(),
            "{} services in the map, {} published",
            self.services.len(),
            publisher.services().len()
        );
        for pool in publisher.pools().values() {
            for b in &pool.backends {
                ensure!(
                    self.backends.contains_key(&b.slot),
                    "backend slot {} not written",
                    b.slot
                );
            }
        }
        ensure!(self.config.generation == publisher.generation());
        Ok(())
    }
}

/// The program's own maps, loaded (verified) but not attached; dropped with it.
struct Kernel {
    maps: KernelMaps,
    _ebpf: aya::Ebpf,
}

impl Plane for Kernel {
    const NAME: &'static str = "kernel maps";

    fn fresh() -> Result<Self> {
        let mut ebpf = load::load(None)?;
        let maps = KernelMaps::take(&mut ebpf)?;
        Ok(Self { maps, _ebpf: ebpf })
    }

    fn dp(&mut self) -> &mut dyn Dataplane {
        &mut self.maps
    }

    fn check(&self, publisher: &Publisher) -> Result<()> {
        let services = self.maps.services().len();
        ensure!(
            services == publisher.services().len(),
            "{services} services in the map, {} published",
            publisher.services().len()
        );
        for pool in publisher.pools().values() {
            ensure!(self.maps.pool(pool.slot)?.active <= 1);
            for b in &pool.backends {
                let entry = self.maps.backend(b.slot)?;
                ensure!(
                    entry.addr == switchyard::publish::addr16(b.address),
                    "backend slot {} holds another address",
                    b.slot
                );
            }
        }
        ensure!(self.maps.config()?.generation == publisher.generation());
        Ok(())
    }
}

/// Every run's stages of one scenario on one data plane.
struct Scenario {
    name: &'static str,
    plane: &'static str,
    runs: Vec<Stages>,
    /// Map writes of the last run, by kind (in-memory data plane only).
    writes: Option<BTreeMap<&'static str, usize>>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Scenario {
    fn print(&self) {
        let stages: [fn(&Stages) -> Duration; 7] = [
            |s| s.read,
            |s| s.load,
            |s| s.engine,
            |s| s.maps,
            |s| s.record,
            Stages::live,
            Stages::total,
        ];
        let cols: Vec<Vec<f64>> = stages
            .iter()
            .map(|f| {
                let mut v: Vec<f64> = self.runs.iter().map(|s| ms(f(s))).collect();
                v.sort_by(f64::total_cmp);
                v
            })
            .collect();
        // p50 is the nearest-rank median: a value some run took.
        for (stat, at) in [("p50", 0.5), ("max", 1.0)] {
            let row: Vec<String> = cols
                .iter()
                .map(|v| {
                    #[expect(
                        clippy::cast_precision_loss,
                        clippy::cast_possible_truncation,
                        clippy::cast_sign_loss,
                        reason = "an index into the sorted samples: (len − 1) · at rounded, for \
                                  at in 0..=1"
                    )]
                    let i = ((v.len() - 1) as f64 * at).round() as usize;
                    format!("{:>8.2}", v[i.min(v.len() - 1)])
                })
                .collect();
            let (name, plane) = if stat == "p50" {
                (self.name, self.plane)
            } else {
                ("", "")
            };
            println!("  {name:<10} {plane:<12} {stat} {}", row.join(" "));
        }
        if let Some(w) = &self.writes {
            let list: Vec<String> = w.iter().map(|(k, n)| format!("{n} {k}")).collect();
            let list = if list.is_empty() {
                "none".to_owned()
            } else {
                list.join(", ")
            };
            println!("  {:<10} {:<12} map writes: {list}", "", "");
        }
    }
}

fn count_writes(log: &[Write]) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for w in log {
        let kind = match w {
            Write::Backend(..) => "backend",
            Write::NextHop(..) => "next hop",
            Write::Table(..) => "table",
            Write::Pool(..) => "pool",
            Write::Decision(..) => "decision",
            Write::Service(..) => "service",
            Write::RemoveService(..) => "service removal",
            Write::FreeServiceSlot(..) => "service slot freed",
            Write::Filter(..) => "filter word",
            Write::Config(..) => "generation",
            Write::Vip(..) => "virtual IP",
            Write::ClassPrefix(..) => "class prefix",
            Write::ClassDecision(..) => "class decision",
            Write::ClientAnswer(..) => "client answer",
        };
        *out.entry(kind).or_insert(0) += 1;
    }
    out
}

/// The four scenarios on data plane `P`; `writes` reads a plane's write log, where it has one.
fn scenarios<P: Plane>(
    dirs: &Dirs,
    runs: usize,
    writes: fn(&P) -> Option<BTreeMap<&'static str, usize>>,
) -> Result<Vec<Scenario>> {
    let base = dirs.of(Version::Base);
    let changed = dirs.of(Version::Changed);
    let one_weight = dirs.of(Version::OneWeight);
    let mut out = Vec::new();

    // First apply: new maps, new publisher, new history, every run (one more, untimed, first).
    let mut first = Vec::new();
    let mut last_writes = None;
    for run in 0..=runs {
        let mut plane = P::fresh()?;
        let mut agent = Running::new(&dirs.new_state())?;
        let s = apply(&base, &mut agent, plane.dp())?;
        plane.check(&agent.publisher)?;
        last_writes = writes(&plane);
        if run > 0 {
            first.push(s);
        }
    }
    out.push(Scenario {
        name: "first",
        plane: P::NAME,
        runs: first,
        writes: last_writes,
    });

    // Unchanged and changed: one agent and one set of maps, the base applied first.
    let mut plane = P::fresh()?;
    let mut agent = Running::new(&dirs.new_state())?;
    apply(&base, &mut agent, plane.dp())?;
    let generation = agent.publisher.generation();
    let mut unchanged = Vec::new();
    for run in 0..=runs {
        let s = apply(&base, &mut agent, plane.dp())?;
        if run > 0 {
            unchanged.push(s);
        }
    }
    ensure!(
        agent.publisher.generation() == generation,
        "an unchanged config was applied again"
    );
    plane.check(&agent.publisher)?;
    out.push(Scenario {
        name: "unchanged",
        plane: P::NAME,
        runs: unchanged,
        writes: writes(&plane),
    });
    for (name, other) in [("changed", &changed), ("one weight", &one_weight)] {
        let mut change = Vec::new();
        for run in 0..=runs {
            // Even runs go to the other version, odd ones back: every run is a change.
            let dir = if run % 2 == 0 { other } else { &base };
            let s = apply(dir, &mut agent, plane.dp())?;
            plane.check(&agent.publisher)?;
            if run > 0 {
                change.push(s);
            }
        }
        // The last run (number `runs`) went to the other version if `runs` is even: back to
        // the base for the next scenario.
        if runs.is_multiple_of(2) {
            apply(&base, &mut agent, plane.dp())?;
        }
        out.push(Scenario {
            name,
            plane: P::NAME,
            runs: change,
            writes: writes(&plane),
        });
    }
    Ok(out)
}

fn main() -> Result<()> {
    if !bench::invoked_by_cargo_bench() {
        println!("apply: a benchmark; run it with `cargo bench -p router-tests --bench apply`");
        return Ok(());
    }
    let runs: usize = bench::arg("runs").unwrap_or(20).max(1);
    // A nice -20 session and one CPU: other jobs of a shared machine take less of the runs.
    if let Err(e) = host::own_session(NICE).and_then(|()| host::renice(0, NICE)) {
        println!("(not prioritized: {e:#})");
    }
    host::pin(0, host::cpu_count() - 1)?;

    let shape = Shape::LARGE;
    let (replaced, reweighted) = changes(&shape);
    let dirs = Dirs::write()?;
    let bytes: usize = fragments(&shape, Version::Base)
        .iter()
        .map(|(_, t)| t.len())
        .sum();
    println!("machine: {}", machine());
    println!("load average at start: {}", load_average());
    println!(
        "config: {} services, {} pools, {} backends, {} decision groups, {} rules, {} state \
         variables in {} fragments ({} KiB); changed version: {replaced} backends replaced, \
         {reweighted} reweighted",
        shape.services,
        shape.pools,
        shape.backends(),
        shape.groups,
        shape.rules(),
        shape.state_variables(),
        shape.fragments,
        bytes / 1024,
    );
    println!("{runs} runs per scenario after one untimed run; milliseconds");
    println!(
        "  {:<10} {:<12}     {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "scenario", "data plane", "read", "load", "engine", "maps", "record", "live", "total"
    );

    for s in scenarios::<MemoryDataplane>(&dirs, runs, |p| Some(count_writes(&p.log)))? {
        s.print();
    }
    if privileged::require_root_and_bpf("bench apply (kernel maps)").is_ok() {
        for s in scenarios::<Kernel>(&dirs, runs, |_| None)? {
            s.print();
        }
    } else {
        println!("  kernel maps: skipped (needs root and BPF; see the message above)");
    }
    println!("load average at end: {}", load_average());
    Ok(())
}
