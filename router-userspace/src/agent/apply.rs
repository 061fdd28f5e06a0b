//! The one apply path. Start, the directory watch, SIGHUP, `ctl apply` and `ctl rollback` all
//! come here with a set of fragments:
//!
//! read the fragments → parse → validate → compile (state and decision groups) → diff against
//! the running config → write the maps in the publisher's safe order (new backends and pool
//! tables, then decisions, then services; removals in reverse) → bump the generation → record
//! the version in the history store.
//!
//! A failure before the first map write (any config problem, a rule that does not compile, not
//! enough free slots) leaves the running config and the maps untouched. When it was the config
//! directory that was rejected, the error is kept, with every problem, in `Shared::rejected`
//! for `status` until the directory applies; a refused `ctl rollback` is answered to its caller
//! and says nothing about the directory. Fragments whose content
//! hash is the running version's are not applied again: an editor's temporary file, a `touch`
//! or a SIGHUP with nothing changed is a no-op.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use log::{error, info, warn};
use serde::{Deserialize, Serialize};

use super::{Shared, decisions, targets};
use crate::{
    config::{self, Config, ConfigError, Diff, Fragments},
    engine::{AuditFile, Driver},
    history::NewVersion,
    probe::{self, HealthEvent, ProbeSet},
    publish::PublishError,
    state::Store,
};

/// Why a change was not applied; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The fragments are not a valid config: every problem, one per line.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// State variables or decision groups could not be built.
    #[error("state and decisions: {0}")]
    Decisions(String),
    /// The maps could not be written (see [`PublishError`]: a refusal for want of slots
    /// changes nothing).
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// `ctl rollback N` named a version the history does not have.
    #[error("no version {0} in the history (`switchyard ctl versions` lists them)")]
    NoSuchVersion(u64),
    /// The history store failed.
    #[error("history: {0}")]
    History(String),
}

/// What the running config is and where it came from.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Running {
    /// Its version in the history store (`None` if it could not be recorded).
    pub version: Option<u64>,
    /// Content hash of its fragments (hex SHA-256).
    pub hash: String,
    /// Its fragments' file names.
    pub files: Vec<String>,
    /// What applied it: `start`, `watch`, `sighup`, `ctl apply`, `rollback to N`.
    pub source: String,
    /// When it was applied, seconds since the Unix epoch.
    pub applied_at: u64,
}

/// The result of one apply.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    /// Whether anything was applied (`false`: the fragments are the running version's).
    pub changed: bool,
    /// The version recorded (or the running one when unchanged).
    pub version: Option<u64>,
    /// The generation now in the maps.
    pub generation: u64,
    /// The resource-level changes, one line each (`+`, `-`, `~`).
    pub diff: Vec<String>,
    /// From the start of the apply to the last map write, µs.
    pub took_us: u64,
}

/// The outcome of an apply that found nothing to do.
fn unchanged(s: &Shared) -> Outcome {
    Outcome {
        changed: false,
        version: s.running.version,
        generation: s.publisher.generation(),
        diff: Vec::new(),
        took_us: 0,
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Applies `fragments` (name, text) as the running config. `probe_tx` receives the health
/// events of the new probe set; the returned [`ProbeSet`] replaces the running one (`None`
/// when nothing changed). On error nothing changed.
pub fn apply(
    s: &mut Shared,
    fragments: Fragments,
    source: &str,
    probe_tx: &tokio::sync::mpsc::Sender<HealthEvent>,
) -> Result<(Outcome, Option<ProbeSet>), ApplyError> {
    let result = try_apply(s, fragments, source, probe_tx);
    match &result {
        Ok((o, _)) if o.changed => {
            info!(
                "config generation {} applied ({source}, version {}, {} µs){}",
                o.generation,
                o.version
                    .map_or_else(|| "not recorded".into(), |v| v.to_string()),
                o.took_us,
                if o.diff.is_empty() {
                    String::new()
                } else {
                    format!(":\n  {}", o.diff.join("\n  "))
                }
            );
        }
        Ok(_) => {}
        Err(e) => {
            warn!("config change rejected ({source}); the running config stays:\n{e}");
            s.metrics.rejected.inc();
        }
    }
    result
}

fn try_apply(
    s: &mut Shared,
    fragments: Fragments,
    source: &str,
    probe_tx: &tokio::sync::mpsc::Sender<HealthEvent>,
) -> Result<(Outcome, Option<ProbeSet>), ApplyError> {
    let hash = fragments.hash();
    if hash == s.running.hash {
        return Ok((unchanged(s), None));
    }
    let started = Instant::now();
    let cfg = running_agent(s, fragments.load()?);
    let (store, driver) = build(&cfg, s)?;
    let diff = Diff::between(&s.config, &cfg);
    let overrides = s.driver.override_requests(s.started.elapsed());
    let generation = publish(s, &cfg, store, driver, started, overrides)?;
    let took_us = started.elapsed().as_micros() as u64;
    s.metrics.map_write.observe(started.elapsed().as_secs_f64());
    s.metrics.generation.set(generation as i64);
    s.metrics.applied.inc();
    let version = record(s, &fragments, source, generation);
    s.config = cfg;
    let probes = spawn_probes(s, probe_tx);
    s.probes.clear();
    s.running = Running {
        version,
        hash,
        files: fragments.names().map(str::to_owned).collect(),
        source: source.to_owned(),
        applied_at: now_secs(),
    };
    Ok((
        Outcome {
            changed: true,
            version,
            generation,
            diff: diff.changes.iter().map(ToString::to_string).collect(),
            took_us,
        },
        Some(probes),
    ))
}

/// `cfg` with the agent settings the running agent started with. They change only on restart:
/// the API socket, the pin directory and the history store are open already, so an apply that
/// took a new `state_dir` would write the audit log (and seed `ctl decisions`) elsewhere than
/// the history, and `status` would look for the pinned links under another `pin_path`.
fn running_agent(s: &Shared, mut cfg: Config) -> Config {
    if cfg.agent != s.config.agent {
        warn!(
            "agent settings (api, pin_path, state_dir) change only on restart; this agent keeps \
             api {}, pin_path {}, state_dir {}",
            s.config.agent.api,
            s.config.agent.pin_path.display(),
            s.config.agent.state_dir.display()
        );
        cfg.agent = s.config.agent.clone();
    }
    cfg
}

/// The state store and decision groups of `cfg`, carrying over what the running ones know
/// (pushed values, probe verdicts, each group's published action).
fn build(cfg: &Config, s: &Shared) -> Result<(Store, Driver), ApplyError> {
    let mut store = Store::new(cfg).map_err(|e| ApplyError::Decisions(e.to_string()))?;
    store.carry_over(&s.store, &s.publisher, cfg);
    let audit = AuditFile::open(&cfg.agent.state_dir);
    let mut driver =
        Driver::new(cfg, &store, Some(audit)).map_err(|e| ApplyError::Decisions(e.to_string()))?;
    driver.resume(cfg, &s.publisher, s.started.elapsed());
    Ok((store, driver))
}

/// Writes `cfg` into the maps and makes `store` and `driver` the running ones, with
/// `overrides` (those in force before) set again. Returns the new generation.
fn publish(
    s: &mut Shared,
    cfg: &Config,
    store: Store,
    driver: Driver,
    started: Instant,
    overrides: Vec<(String, rules::engine::OverrideRequest)>,
) -> Result<u64, ApplyError> {
    let now = s.started.elapsed();
    let first = driver.initial_actions(&store, &s.publisher, now);
    let generation = s.publisher.apply_decided(&mut s.maps, cfg, &first)?;
    s.store = store;
    s.driver = driver;
    // The overrides go back before the groups are evaluated: evaluated first, a resumed group
    // under an override switched to its rules' choice and the override switched it back a
    // moment later — new flows in between went to the pool the operator had forced them off.
    keep_overrides(s, overrides);
    let Shared {
        publisher,
        maps,
        store,
        driver,
        ..
    } = &mut *s;
    driver.on_change(&[], true, store, publisher, maps, now, "apply", started);
    Ok(generation)
}

/// Sets again, on the new decision groups, the overrides that were in force before the apply
/// (with the TTL they had left): an operator's override outlives an unrelated config change.
/// One whose group is gone, or whose action the new config cannot publish, ends (logged).
fn keep_overrides(s: &mut Shared, overrides: Vec<(String, rules::engine::OverrideRequest)>) {
    let now = s.started.elapsed();
    for (group, request) in overrides {
        let Shared {
            driver,
            store,
            publisher,
            maps,
            ..
        } = &mut *s;
        if let Err(e) = driver.set_override(
            &group,
            Some(request),
            store,
            publisher,
            maps,
            now,
            "override kept across apply",
        ) {
            warn!("decision group {group}: the override in force ends with this change: {e}");
        }
    }
}

/// Records the applied version with the publisher's slot assignment; `None` (logged and
/// counted) if the store fails — the config is live either way, but a restart will then not
/// find the slots of this generation and renumbers.
fn record(s: &mut Shared, fragments: &Fragments, source: &str, generation: u64) -> Option<u64> {
    let ledger = match serde_json::to_string(&s.publisher.ledger()) {
        Ok(l) => l,
        Err(e) => {
            error!("serializing the slot ledger: {e}");
            return None;
        }
    };
    let v = NewVersion {
        fragments: fragments.clone(),
        source: source.to_owned(),
        generation,
        ledger,
        time: now_secs(),
    };
    match s.history.record(v) {
        Ok(n) => Some(n),
        Err(e) => {
            error!("recording the applied config in the history failed: {e}");
            s.metrics.history_errors.inc();
            None
        }
    }
}

/// The fragments of version `n`, for `ctl rollback N`.
pub fn version_fragments(s: &Shared, n: u64) -> Result<Fragments, ApplyError> {
    s.history
        .get(n)
        .map_err(|e| ApplyError::History(e.to_string()))?
        .map(|v| v.fragments())
        .ok_or(ApplyError::NoSuchVersion(n))
}

/// Whether the fragments in the config directory differ from the running config (a rollback,
/// or a change that was rejected), as of the agent's last read of the directory (the watch
/// reads it after every change). `None` when that read failed. Answered from the hash kept at
/// the read, so `status` does not read and hash the directory on every request.
pub fn differs_from_files(s: &Shared) -> Option<bool> {
    (!s.seen.is_empty()).then(|| s.seen != s.running.hash)
}

/// The first apply of a starting agent. When it resumed the pinned maps and the directory
/// holds the version that wrote them, nothing is rewritten: the state and decision groups are
/// built (each group resuming its published action) and probes start. Otherwise this is an
/// ordinary [`apply`]. Returns the probe set.
pub fn start(
    s: &mut Shared,
    fragments: Fragments,
    probe_tx: &tokio::sync::mpsc::Sender<HealthEvent>,
) -> Result<ProbeSet, ApplyError> {
    if !s.running.hash.is_empty() && fragments.hash() == s.running.hash {
        let cfg = running_agent(s, fragments.load()?);
        let (store, mut driver) = build(&cfg, s)?;
        let now = s.started.elapsed();
        let Shared {
            publisher, maps, ..
        } = &mut *s;
        driver.on_change(
            &[],
            true,
            &store,
            publisher,
            maps,
            now,
            "start",
            Instant::now(),
        );
        s.store = store;
        s.driver = driver;
        s.config = cfg;
        s.metrics.generation.set(s.publisher.generation() as i64);
        info!(
            "config unchanged since version {} (generation {}): nothing rewritten",
            s.running.version.unwrap_or(0),
            s.publisher.generation()
        );
    } else if let (_, Some(probes)) = apply(s, fragments, "start", probe_tx)? {
        // The apply started the probes of what it applied.
        return Ok(probes);
    }
    Ok(spawn_probes(s, probe_tx))
}

/// The probes of the running config (backends and `state:` probes), each backend starting
/// from the health the publisher has for it.
/// The resolver follows the running config's backends from here on too.
fn spawn_probes(s: &Shared, probe_tx: &tokio::sync::mpsc::Sender<HealthEvent>) -> ProbeSet {
    if let Some(resolver) = &s.resolver {
        resolver.set_targets(super::backend_addresses(&s.config));
    }
    let mut all = targets(&s.config, &s.publisher);
    all.extend(decisions::state_probe_targets(&s.config));
    probe::spawn(all, probe_tx.clone())
}

/// What an API caller asks the event loop to apply.
#[derive(Debug)]
pub enum What {
    /// The config directory as it is now (`ctl apply`).
    Directory,
    /// Version `n` of the history, as a new version (`ctl rollback N`).
    Rollback(u64),
}

/// An apply asked for through the API, answered on `reply`.
#[derive(Debug)]
pub struct Request {
    /// What to apply.
    pub what: What,
    /// The outcome, or every problem.
    pub reply: tokio::sync::oneshot::Sender<Result<Outcome, String>>,
}

/// Reads the config directory and applies it (SIGHUP). Returns the new probe set when
/// something was applied.
pub fn directory(
    shared: &std::sync::Mutex<Shared>,
    source: &str,
    probe_tx: &tokio::sync::mpsc::Sender<HealthEvent>,
) -> Option<ProbeSet> {
    let mut s = shared.lock().ok()?;
    read_and_apply(&mut s, source, false, probe_tx).ok()?.1
}

/// [`directory`] for the watch: applies the directory only when its fragments changed since it
/// was last read. An event that changes no fragment (an editor's swap file, a README, the
/// agent's own files in a state directory that is this one) then applies nothing — above all
/// it does not apply the files again after a `ctl rollback`, which they differ from on purpose.
pub fn watched(
    shared: &std::sync::Mutex<Shared>,
    probe_tx: &tokio::sync::mpsc::Sender<HealthEvent>,
) -> Option<ProbeSet> {
    let mut s = shared.lock().ok()?;
    read_and_apply(&mut s, "watch", true, probe_tx).ok()?.1
}

fn read_and_apply(
    s: &mut Shared,
    source: &str,
    only_if_changed: bool,
    probe_tx: &tokio::sync::mpsc::Sender<HealthEvent>,
) -> Result<(Outcome, Option<ProbeSet>), ApplyError> {
    // Every problem at once: unreadable fragments and the others' (`DirFragments::load`).
    let read = config::read_dir(&s.config_dir).and_then(|d| match d.fragments() {
        Ok(f) => Ok(f),
        Err(e) => Err(d.load().err().unwrap_or(e)),
    });
    match read {
        Ok(fragments) => {
            let hash = fragments.hash();
            if only_if_changed && hash == s.seen {
                return Ok((unchanged(s), None));
            }
            s.seen = hash;
            let result = apply(s, fragments, source, probe_tx);
            // What `status` says about the directory: its last read, applied or rejected.
            s.rejected = result.as_ref().err().map(ToString::to_string);
            result
        }
        Err(e) => {
            warn!("config change rejected ({source}); the running config stays:\n{e}");
            s.metrics.rejected.inc();
            s.rejected = Some(e.to_string());
            // Unread: the next read applies whatever it finds, and `status` says so.
            s.seen.clear();
            Err(e.into())
        }
    }
}

/// Carries out an API [`Request`]. Returns the new probe set when something was applied.
pub fn serve(
    shared: &std::sync::Mutex<Shared>,
    req: Request,
    probe_tx: &tokio::sync::mpsc::Sender<HealthEvent>,
) -> Option<ProbeSet> {
    let Ok(mut s) = shared.lock() else {
        let _ = req.reply.send(Err("agent state unavailable".into()));
        return None;
    };
    let result = match req.what {
        What::Directory => read_and_apply(&mut s, "ctl apply", false, probe_tx),
        What::Rollback(n) => version_fragments(&s, n)
            .and_then(|files| apply(&mut s, files, &format!("rollback to {n}"), probe_tx)),
    };
    match result {
        Ok((outcome, probes)) => {
            let _ = req.reply.send(Ok(outcome));
            probes
        }
        Err(e) => {
            let _ = req.reply.send(Err(e.to_string()));
            None
        }
    }
}
