//! The running agent: load the config, load and attach the program, publish, probe, serve the
//! local API, and apply health transitions and reloads as they come.
//!
//! Start order (each step changes nothing if it fails): read and validate the config → bind
//! the API socket → lock the pin directory (one agent per set of maps) → record where it
//! answers ([`crate::record`]) → load the program with its pinned maps → attach to every interface
//! (on a failure, undo the attachments made so far and remove the map pins this run created)
//! → publish → start health checks. An earlier agent's pinned link is adopted only while it is
//! live on its interface here; a defunct one is replaced ([`attach::attach`]). An adopted link
//! keeps the mode it runs in, read from the kernel; when `--mode` asked for another, the agent
//! warns (log and `status`) and keeps it ([`attach::ModeMismatch`]). On SIGINT or
//! SIGTERM the agent first withdraws its announcement routes (`announce:`,
//! [`crate::announce`]), then exits (removing its record), and the program **stays attached** with the
//! last maps (pinned link and maps); `switchyard detach` removes it. SIGHUP re-reads the config
//! directory; a broken config is logged, counted and shown by `status`, and the running config
//! stays. Under systemd ([`crate::service`]) the agent says `READY=1` once started,
//! `RELOADING=1` … `READY=1` around a SIGHUP's apply, and `STOPPING=1` as it exits.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    path::PathBuf,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use log::{info, warn};
use tokio::sync::mpsc;

mod announcer;
pub mod apply;
mod breakers;
mod classes;
pub mod command;
mod drains;
mod failback;
pub mod fleet;
mod flows;
mod next_hops;
mod queries;
mod rates;
pub mod recorder;
pub mod runtime;
mod watch;

pub use apply::{ApplyError, Outcome, Running};

use command::Command;
use recorder::Recorder;
use runtime::Runtime;

use crate::{
    api::{self, metrics::Metrics},
    config::{self, Config},
    dataplane::{
        Dataplane as _, DataplaneError,
        attach::{self, Attached, Mode},
        clock::Clock,
        load,
        maps::KernelMaps,
    },
    decision::{AUDIT_CAPACITY, Audit, AuditFile, Driver},
    history::History,
    nexthop::{self, NextHopEvent},
    probe::HealthEvent,
    publish::{Ledger, PublishError, Publisher, RestoreError},
    record::{self, Record},
    state::Store,
};

/// What `switchyard attach` was asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Interfaces to attach to (at least one).
    pub interfaces: Vec<String>,
    /// The XDP mode asked for (`--mode`), `None` when not given: a new attachment is then
    /// native, and an adopted one is reported in whatever mode it runs without a warning.
    pub mode: Option<Mode>,
    /// The config directory (`/etc/switchyard`).
    pub config_dir: PathBuf,
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration is invalid: every problem, one per line.
    // Transparent: `switchyard attach` prints the whole error chain (`{:#}`), and each problem
    // must appear in it once (a `"{0}"` message with the error also as its source repeats it).
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// Loading, pinning or attaching failed.
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    /// Publishing the config failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The first apply failed.
    #[error(transparent)]
    Apply(#[from] apply::ApplyError),
    /// The history store under `agent.state_dir` cannot be used.
    #[error(transparent)]
    History(#[from] crate::history::HistoryError),
    /// The config directory cannot be watched.
    #[error(transparent)]
    Watch(#[from] watch::WatchError),
    /// The next-hop resolver could not start (no netlink socket).
    #[error("starting the next-hop resolver: {0}")]
    NextHops(#[from] nexthop::NextHopError),
    /// A signal handler could not be installed.
    #[error("installing a signal handler: {0}")]
    Signal(#[source] std::io::Error),
    /// The history store's thread could not be started.
    #[error("starting the history store's thread: {0}")]
    HistoryThread(#[source] std::io::Error),
    /// The API socket could not be bound.
    #[error("binding the API on {addr}: {source}")]
    Api {
        /// Address from `agent.api`.
        addr: std::net::SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// `agent.api_token_file` could not be read (it was readable when validated).
    #[error("agent.api_token_file: {0}")]
    Token(String),
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Every backend address of `cfg`: what the resolver follows.
#[must_use]
pub fn backend_addresses(cfg: &Config) -> BTreeSet<IpAddr> {
    cfg.pools
        .iter()
        .flat_map(|p| p.backends.iter().map(|b| b.address))
        .collect()
}

/// Aborts a task when dropped: a task of an agent's run never outlives it.
struct Aborting(tokio::task::JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the agent until SIGINT/SIGTERM.
///
/// # Errors
///
/// Only while starting (once running, it returns `Ok` on SIGINT or SIGTERM), in start order:
/// [`AgentError::Signal`] if the SIGHUP or SIGTERM handler cannot be installed;
/// [`AgentError::Config`] for a config directory that cannot be read or is invalid;
/// [`AgentError::History`] if the history store under `agent.state_dir` cannot be opened;
/// [`AgentError::Watch`] if the config directory cannot be watched; [`AgentError::Api`] if
/// `agent.api` cannot be bound; [`AgentError::Dataplane`] if another agent holds the pin
/// directory, its pins cannot be adopted, or the program cannot be loaded, its maps taken or
/// attached to an interface (the attachments of this run are undone, and the map pins it
/// created removed); [`AgentError::NextHops`] if the resolver's netlink socket cannot be
/// opened; [`AgentError::HistoryThread`] if the history thread cannot be started;
/// [`AgentError::Apply`] if the first apply fails (the attachments of this run are undone);
/// [`AgentError::Dataplane`] again if a service an earlier agent left in adopted maps cannot
/// be removed.
#[expect(
    clippy::too_many_lines,
    reason = "the start steps in the order the module documentation gives, each changing \
              nothing if it fails, then the event loop over what they opened"
)]
pub async fn run(opts: Options) -> Result<(), AgentError> {
    // Before anything else: until a handler is installed, SIGHUP's default action terminates
    // the process, and a reload asked for while the agent starts must not end it. Signals that
    // arrive during the start are kept and handled by the event loop: a reload then, or an
    // orderly exit.
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).map_err(AgentError::Signal)?;
    let mut term = signal(SignalKind::terminate()).map_err(AgentError::Signal)?;
    // Everything that can be checked is checked before the first change to the machine.
    let (fragments, cfg) = config::read_dir(&opts.config_dir)?.load()?;
    let history = History::open(&cfg.agent.state_dir)?;
    let (mut watch, mut watch_rx) = watch::Watch::new(&opts.config_dir)?;
    // The token as the file holds it now; a changed file is taken at the next start.
    let auth = api::Auth {
        token: match &cfg.agent.api_token_file {
            Some(path) => Some(config::api_token(path).map_err(AgentError::Token)?.into()),
            None => None,
        },
        open_read: cfg.agent.api_open_read,
    };
    let listener = tokio::net::TcpListener::bind(cfg.agent.api)
        .await
        .map_err(|source| AgentError::Api {
            addr: cfg.agent.api,
            source,
        })?;
    let pin_dir = load::pin_dir(&cfg.agent.pin_path);
    // One agent per pin directory, for as long as it runs; taken before the record
    // below, so an agent refused here never replaces (and, exiting, removes) a running one's.
    let _lock = attach::lock_pin_dir(&pin_dir)?;
    // Where `status` and `ctl` find this agent from the config directory alone, whatever its
    // fragments come to hold; removed when `run` returns. Without it they fall back to the
    // directory's `agent.api`.
    let api_addr = listener.local_addr().unwrap_or(cfg.agent.api);
    let record = Record::of_this_process(api_addr, &opts.config_dir, &cfg.agent.pin_path);
    let _record = match record::write(std::path::Path::new(record::RUN_DIR), &record) {
        Ok(written) => Some(written),
        Err(e) => {
            warn!(
                "cannot record where this agent answers under {}: {e}; `switchyard status` and \
                 `ctl` find it only through agent.api of the directory",
                record::RUN_DIR
            );
            None
        }
    };
    // Maps pinned by an earlier agent are adopted and kept whatever happens; maps this run
    // pins are removed again if it fails to attach.
    let adopting_maps = attach::maps_pinned(&pin_dir);
    attach::check_adoptable(&pin_dir)?;
    let mut ebpf = load::load(Some(&pin_dir))?;
    let mut maps = KernelMaps::take(&mut ebpf)?;
    // The program's clock runs while this agent does, from where the last one left it.
    let _clock = Aborting(tokio::spawn(Clock::take(&mut ebpf)?.run()));
    let mut interfaces = Vec::new();
    for iface in &opts.interfaces {
        let new_mode = opts.mode.unwrap_or(Mode::Native);
        match attach::attach(&mut ebpf, &mut maps, iface, new_mode, &pin_dir) {
            Ok(how) => {
                let mode = new_mode.name();
                match &how {
                    Attached::New => info!("{iface}: attached ({mode} mode)"),
                    Attached::Adopted(running) => {
                        match attach::ModeMismatch::of(opts.mode, *running) {
                            None => info!(
                                "{iface}: adopted the program already attached ({running} mode)"
                            ),
                            Some(mismatch) => warn!(
                                "{iface}: adopted the program already attached ({running} mode), \
                                 NOT IN THE MODE ASKED FOR: {}",
                                mismatch.describe(iface)
                            ),
                        }
                    }
                    Attached::Replaced(why) => warn!(
                        "{iface}: link_{iface} was defunct ({why}): attached anew ({mode} mode)"
                    ),
                }
                interfaces.push((iface.clone(), how));
            }
            Err(e) => {
                // Leave the machine as it was: undo what this run attached.
                for (done, how) in &interfaces {
                    if how.attached_now() {
                        let _ = attach::detach(&pin_dir, done, true);
                    }
                }
                if !adopting_maps && attach::attached_interfaces(&pin_dir).is_empty() {
                    attach::remove_map_pins(&pin_dir);
                }
                return Err(e.into());
            }
        }
    }
    let resumed = if adopting_maps {
        resume(&history, &maps)
    } else {
        None
    };
    let epoch = Instant::now();
    let (publisher, running, mut previous) = if let Some(r) = resumed {
        r
    } else {
        // Nothing published yet: the running config is the empty one.
        let empty = config::load_files(&[]).map_err(AgentError::Config)?;
        (Publisher::new(), Running::default(), empty)
    };
    // A backend takes new flows only once the resolver has found its next hop; a resumed
    // publisher keeps the next hops the pinned maps hold until the resolver reports.
    let publisher = publisher.requiring_next_hops();
    let mut egress = BTreeMap::new();
    for (iface, _) in &interfaces {
        if let Ok(index) = attach::ifindex(iface) {
            egress.insert(index, iface.clone());
        }
    }
    let (hop_tx, mut hop_rx) = mpsc::channel::<Vec<NextHopEvent>>(64);
    let resolver = nexthop::spawn(hop_tx)?;
    // The agent settings this process runs with are the ones it started with (the API bound,
    // the pins and history opened above), whatever a resumed version recorded: applies keep
    // them (`Runtime::running_agent`), and they are not a change.
    previous.agent = cfg.agent.clone();
    previous.fleet = cfg.fleet.clone();
    // The announcement settings the earlier agent ran with: killed (its routes stay, decision
    // 0026), it may have left routes under settings this config no longer has.
    let announced_before = previous.announce.clone();
    let store = Store::new(&previous, publisher.health());
    let mut driver = Driver::new(&previous);
    // A fleet member leads no group until etcd elects it.
    let (fleet_tx, fleet_rx) = mpsc::channel(256);
    let fleet = cfg.fleet.as_ref().map(|f| {
        driver.follow_all_but(&[]);
        fleet::FleetLink::new(f.node.clone(), fleet_tx)
    });
    let recorder = Recorder::spawn(history).map_err(AgentError::HistoryThread)?;
    let (probe_tx, mut probe_rx) = mpsc::channel::<HealthEvent>(1024);
    let (commands, mut command_rx) = mpsc::channel::<Command>(64);
    let metrics = Metrics::default();
    let mut rt = Runtime {
        publisher,
        maps,
        config: previous,
        config_dir: opts.config_dir.clone(),
        interfaces,
        mode: opts.mode,
        probes: HashMap::new(),
        probe_set: None,
        probe_tx,
        rejected: None,
        metrics: metrics.clone(),
        store,
        driver,
        audit: Audit::new(AUDIT_CAPACITY, Some(AuditFile::open(&cfg.agent.state_dir))),
        started: epoch,
        running,
        recorder: recorder.clone(),
        commands: commands.clone(),
        seen: fragments.hash(),
        resolver: Some(resolver),
        next_hops: BTreeMap::new(),
        egress,
        sampler: rates::RateSampler::default(),
        drains: drains::Drains::new(),
        breakers: breakers::Breakers::default(),
        weights: crate::weights::Weights::new(),
        agent_checks: None,
        left: BTreeMap::new(),
        announced: None,
        fleet,
        hooks: crate::hooks::Hooks::new(metrics.hook_runs.clone()),
    };
    next_hops::first_round(&mut rt, &cfg, &mut hop_rx).await;
    // What the first node to reach etcd seeds the fleet's shared config with.
    if let Some(f) = &mut rt.fleet {
        f.read_shared = fragments.shared();
    }
    if let Err(e) = rt.start(fragments) {
        // Nothing this run attached may stay behind a config that never applied.
        for (iface, how) in &rt.interfaces {
            if how.attached_now() {
                let _ = attach::detach(&pin_dir, iface, true);
            }
        }
        return Err(e.into());
    }
    // Adopted maps may hold services an earlier agent published and this config no longer
    // has (removed while no agent ran, with no ledger to resume): the publisher does not know
    // them, so nothing else would ever remove them.
    remove_unknown_services(&rt.publisher, &mut rt.maps)?;
    // Routes an earlier agent left under other settings (another interface, protocol or
    // table, or `announce:` removed) are this agent's to withdraw: it never looks there again,
    // and `switchyard detach` follows the directory's settings, so they would stay forever.
    if let Some(old) = announced_before.filter(|old| rt.config.announce.as_ref() != Some(old)) {
        match crate::announce::withdraw(&old).await {
            Ok(0) => {}
            Ok(n) => info!(
                "withdrew {n} routes an earlier agent left on {}",
                old.interface
            ),
            Err(e) => warn!(
                "withdrawing the routes an earlier agent left on {}: {e}",
                old.interface
            ),
        }
    }
    // Announced only now: the first apply and the removals above have written the maps.
    let mut announcer = announcer::Announcer::default();
    announcer.follow(&mut rt, false).await;
    // The etcd side of the fleet, once the first apply has made the maps this node's.
    let _fleet = cfg.fleet.clone().map(|f| {
        rt.sync_fleet();
        Aborting(tokio::spawn(crate::fleet::run(
            f,
            commands.clone(),
            fleet_rx,
        )))
    });
    let api = tokio::spawn(api::serve(
        listener,
        api::Api {
            commands,
            recorder,
            metrics,
            pin_dir: pin_dir.clone(),
            auth,
        },
    ));
    // The service manager learns the agent is up only now: attached, the first config in the
    // maps, the API serving.
    let attached_to = opts.interfaces.join(", ");
    crate::service::ready(&format!("attached to {attached_to}"));
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    // When the directory has been quiet for the debounce after its last event.
    let mut settle: Option<tokio::time::Instant> = None;
    loop {
        let deadline = rt.next_deadline().map(tokio::time::Instant::from_std);
        let timer = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let settled = async {
            match settle {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let command = tokio::select! {
            Some(command) = command_rx.recv() => command,
            Some(ev) = probe_rx.recv() => Command::Health(ev),
            Some(events) = hop_rx.recv() => Command::NextHops(events),
            () = timer => Command::Deadline,
            _ = tick.tick() => {
                if watch.follow() {
                    settle = Some(tokio::time::Instant::now() + watch::DEBOUNCE);
                }
                Command::Sample
            }
            Some(()) = watch_rx.recv() => {
                settle = Some(tokio::time::Instant::now() + watch::DEBOUNCE);
                continue;
            }
            () = settled => {
                if watch.writing().is_some() {
                    // A fragment is still being written: read it once it is closed.
                    settle = Some(tokio::time::Instant::now() + watch::DEBOUNCE);
                    continue;
                }
                settle = None;
                Command::ApplyDirectory { source: "watch", only_if_changed: true, reply: None }
            }
            _ = hup.recv() => {
                crate::service::reloading();
                Command::ApplyDirectory {
                    source: "sighup",
                    only_if_changed: false,
                    reply: None,
                }
            }
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let refresh = matches!(command, Command::Sample);
        // A reload ends once the directory is applied (or rejected, which the log and
        // `status` say): the agent then runs what it will run until the next change.
        let reload = matches!(
            command,
            Command::ApplyDirectory {
                source: "sighup",
                ..
            }
        );
        rt.execute(command);
        announcer.follow(&mut rt, refresh).await;
        if reload {
            crate::service::ready(&format!("attached to {attached_to}; reloaded"));
        }
    }
    crate::service::stopping();
    // Withdrawn before anything else stops: the router moves the addresses to other nodes
    // while this one still forwards what reaches it.
    announcer.withdraw(&mut rt).await;
    drop(watch);
    rt.stop();
    // A fleet member resigns: its groups get a new leader now, not when its lease expires.
    if let Some(f) = &rt.fleet {
        let (done, resigned) = tokio::sync::oneshot::channel();
        if f.out.try_send(crate::fleet::FleetOut::Resign(done)).is_ok() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), resigned).await;
        }
    }
    api.abort();
    // The versions this run applied are recorded before it exits (the history's busy timeout
    // is 2 s; a record that still waits after 5 s is lost, as in a crash).
    let recorder = rt.recorder.clone();
    if !tokio::task::block_in_place(|| recorder.drain(std::time::Duration::from_secs(5))) {
        warn!("exiting with a version still unrecorded: a restart resumes from the last one");
    }
    // Keep `ebpf` alive until here: the maps and program stay pinned and attached after exit.
    drop(ebpf);
    info!("exiting; the program stays attached (`switchyard detach` removes it)");
    Ok(())
}

/// The publisher that wrote the adopted `maps`, from the ledger of the last recorded version,
/// with that version and its config; `None` (logged) when there is no version or the maps are
/// not its generation — the agent then starts from an empty publisher and renumbers.
fn resume(history: &History, maps: &KernelMaps) -> Option<(Publisher, Running, Config)> {
    let latest = match history.latest() {
        Ok(Some(v)) => v,
        Ok(None) => {
            warn!("adopting pinned maps with no recorded version: slots are renumbered");
            return None;
        }
        Err(e) => {
            warn!("reading the last version from the history: {e}; slots are renumbered");
            return None;
        }
    };
    // Whether the maps are exactly that version's (or an unrecorded apply went further).
    let mut exact = true;
    let restored = serde_json::from_str::<Ledger>(&latest.ledger)
        .map_err(|e| e.to_string())
        .and_then(|l| match Publisher::restore(&l, maps) {
            Err(RestoreError::Generation { maps: m, ledger }) if m > ledger => {
                warn!(
                    "the pinned maps carry generation {m}, newer than version {}'s {ledger}: \
                     an apply was not recorded; resuming from version {}'s slots",
                    latest.info.number, latest.info.number
                );
                exact = false;
                Publisher::restore_behind(&l, maps).map_err(|e| e.to_string())
            }
            r => r.map_err(|e| e.to_string()),
        })
        .and_then(|p| {
            latest
                .fragments()
                .load()
                .map(|c| (p, c))
                .map_err(|e| e.to_string())
        });
    match restored {
        Ok((publisher, cfg)) => {
            info!(
                "resumed the pinned maps at generation {} (version {})",
                publisher.generation(),
                latest.info.number
            );
            let running = Running {
                version: Some(latest.info.number),
                // Maps ahead of the version: no known hash, so the start applies the
                // directory over them whatever it holds (`apply::start`).
                hash: if exact {
                    latest.info.hash.clone()
                } else {
                    String::new()
                },
                files: latest.info.files.clone(),
                source: latest.info.source.clone(),
                applied_at: latest.info.time,
            };
            Some((publisher, running, cfg))
        }
        Err(e) => {
            warn!(
                "cannot resume the pinned maps from version {}: {e}; slots are renumbered",
                latest.info.number
            );
            None
        }
    }
}

/// Removes from the `SERVICES` map every service `publisher` did not publish, and frees its
/// slot unless a published service holds it; then frees every `SERVICE_SLOTS` entry no
/// published service holds. Run once an agent that could not resume the adopted maps has
/// applied its config over them: a service it renumbered left its old slot holding its key
/// and old value, and a tracked flow naming that slot would be forwarded on it (with the old
/// flags) instead of re-selected.
///
/// # Errors
///
/// A failed map write.
pub fn remove_unknown_services(
    publisher: &Publisher,
    maps: &mut KernelMaps,
) -> Result<(), DataplaneError> {
    for (key, value) in maps.services() {
        if !publisher.services().values().any(|s| s.key == key) {
            info!("removing a service of an earlier config from the adopted maps: {key:?}");
            maps.remove_service(&key)?;
            if publisher
                .services()
                .values()
                .all(|s| s.value.id != value.id)
            {
                maps.free_service_slot(value.id)?;
            }
        }
    }
    for (slot, _) in maps.held_service_slots() {
        if publisher.services().values().all(|s| s.value.id != slot) {
            info!("freeing a service slot of an earlier config in the adopted maps: {slot}");
            maps.free_service_slot(slot)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
