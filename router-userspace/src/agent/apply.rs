//! The one apply path. Start, the directory watch, SIGHUP, `ctl apply` and `ctl rollback` all
//! come here with a set of fragments:
//!
//! read the fragments → parse → validate → compile (once: the rules come with the validated
//! config) → diff against the running config → write the maps in the publisher's safe order
//! (new backends and pool tables, then decisions, then services; removals in reverse) → bump
//! the generation → hand the version to the history thread ([`super::recorder`]). The loop
//! goes on at once: the version number reaches `status` (and an API caller's answer) when the
//! record is done.
//!
//! A failure before the first map write (any config problem, not enough free slots) leaves the
//! running config and the maps untouched. When it was the config directory that was rejected,
//! the error is kept, with every problem, in the runtime's `rejected`
//! for `status` until the directory applies; a refused `ctl rollback` is answered to its caller
//! and says nothing about the directory. Every refusal is logged, counted and offered to the
//! hooks as a `config_rejected` event ([`crate::hooks`]). Fragments whose content
//! hash is the running version's are not applied again: an editor's temporary file, a `touch`
//! or a SIGHUP with nothing changed is a no-op.

use std::time::Instant;

use log::{error, info, warn};
use serde::{Deserialize, Serialize};

use super::{
    command::{Command, Reply},
    now_secs,
    runtime::Runtime,
};
use crate::{
    config::{self, Config, ConfigError, Diff, Fragments},
    decision::Driver,
    history::NewVersion,
    publish::PublishError,
    state::Store,
};

/// Why a change was not applied; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The fragments are not a valid config: every problem, one per line.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The maps could not be written (see [`PublishError`]: a refusal for want of slots
    /// changes nothing).
    #[error(transparent)]
    Publish(#[from] PublishError),
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

impl Runtime {
    /// The outcome of an apply that found nothing to do.
    fn unchanged(&self) -> Outcome {
        Outcome {
            changed: false,
            version: self.running.version,
            generation: self.publisher.generation(),
            diff: Vec::new(),
            took_us: 0,
        }
    }

    /// Applies `fragments` (name, text) as the running config, logging the outcome. On error
    /// nothing changed. When something was applied, `reply` gets the outcome once the version
    /// is recorded; otherwise at once.
    pub(super) fn apply_fragments(
        &mut self,
        fragments: Fragments,
        source: &str,
        reply: Option<Reply<Outcome>>,
    ) {
        if let Err(e) = self.apply(fragments, source, reply) {
            self.rejected_change(source, &e);
        }
    }

    /// A change refused (`text`: every problem, one a line): logged, counted and handed to the
    /// hooks; the running config stays.
    fn rejected_change(&mut self, source: &str, text: &str) {
        warn!("config change rejected ({source}); the running config stays:\n{text}");
        self.metrics.rejected.inc();
        self.hooks.emit(&crate::hooks::Event::ConfigRejected {
            time: crate::fleet::now_ns(),
            source: source.to_owned(),
            errors: crate::hooks::Event::problems(text),
        });
    }

    /// [`apply_fragments`](Self::apply_fragments) without the logging of a rejection: the
    /// error goes to `reply` (when there is one) and to the caller.
    pub(super) fn apply(
        &mut self,
        fragments: Fragments,
        source: &str,
        reply: Option<Reply<Outcome>>,
    ) -> Result<(), String> {
        let hash = fragments.hash();
        if hash == self.running.hash {
            if let Some(r) = reply {
                let _ = r.send(Ok(self.unchanged()));
            }
            return Ok(());
        }
        let started = Instant::now();
        let result = fragments
            .load()
            .map_err(ApplyError::from)
            .and_then(|cfg| self.go_live(self.running_agent(cfg), started));
        let (generation, diff) = match result {
            Ok(live) => live,
            Err(e) => {
                let text = e.to_string();
                if let Some(r) = reply {
                    let _ = r.send(Err(text.clone()));
                }
                return Err(text);
            }
        };
        let took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        info!(
            "config generation {generation} applied ({source}, {took_us} µs){}",
            if diff.is_empty() {
                String::new()
            } else {
                format!(":\n  {}", diff.join("\n  "))
            }
        );
        self.running = Running {
            version: None,
            hash: hash.clone(),
            files: fragments.names().map(str::to_owned).collect(),
            source: source.to_owned(),
            applied_at: now_secs(),
        };
        let outcome = Outcome {
            changed: true,
            version: None,
            generation,
            diff,
            took_us,
        };
        self.record(fragments, source, generation, hash, outcome, reply);
        self.forget_removed_drains();
        self.recheck_left();
        self.start_probes();
        self.probes.clear();
        Ok(())
    }

    /// Builds the state and decisions of `cfg`, writes it into the maps and makes it the
    /// running config. Returns the new generation and the diff's lines.
    fn go_live(&mut self, cfg: Config, started: Instant) -> Result<(u64, Vec<String>), ApplyError> {
        let diff = Diff::between(&self.config, &cfg);
        let overrides = self.driver.override_requests(self.now());
        // The health table as the apply will leave it, for the new state and first decisions.
        let mut health = self.publisher.health().clone();
        health.configure(&cfg);
        let (store, driver) = self.build(&cfg, &health);
        let first = driver.initial_actions(crate::decision::View {
            state: store.state(),
            health: &health,
            now: self.now(),
        });
        let generation = self.publisher.apply_decided(&mut self.maps, &cfg, &first)?;
        self.store = store;
        self.driver = driver;
        self.config = cfg;
        // Before the first decisions: the new config's hooks get its switches.
        self.hooks.configure(&self.config.hooks);
        // The overrides go back before the groups are evaluated: evaluated first, a resumed
        // group under an override would switch to its rules' choice, and the override switch it
        // back a moment later, sending new flows in between to the pool the operator had
        // forced them off.
        self.keep_overrides(overrides);
        self.decide(&[], true, "apply", started);
        self.metrics
            .map_write
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        self.metrics.applied.inc();
        Ok((
            generation,
            diff.changes.iter().map(ToString::to_string).collect(),
        ))
    }

    /// `cfg` with the agent settings the running agent started with. They change only on
    /// restart: the API socket, the pin directory and the history store are open already, so
    /// an apply that took a new `state_dir` would write the audit log elsewhere than the
    /// history, and `status` would look for the pinned links under another `pin_path`.
    fn running_agent(&self, mut cfg: Config) -> Config {
        if cfg.agent != self.config.agent {
            warn!(
                "agent settings (api and its token, pin_path, state_dir) change only on \
                 restart; this agent keeps api {}, pin_path {}, state_dir {}",
                self.config.agent.api,
                self.config.agent.pin_path.display(),
                self.config.agent.state_dir.display()
            );
            cfg.agent = self.config.agent.clone();
        }
        if cfg.fleet != self.config.fleet {
            warn!(
                "fleet settings change only on restart; this agent keeps the ones it started with"
            );
            cfg.fleet.clone_from(&self.config.fleet);
        }
        cfg
    }

    /// The state store and decision groups of `cfg`, carrying over what the running ones know
    /// (pushed values, probe verdicts, each group's published action).
    fn build(&self, cfg: &Config, health: &crate::health::Health) -> (Store, Driver) {
        let mut store = Store::new(cfg, health);
        store.carry_over(&self.store);
        let mut driver = Driver::new(cfg);
        // Before resume: it matches the maps' words at the ramps' shares.
        driver.carry_ramps(&self.driver);
        driver.resume(cfg, &self.publisher, self.now());
        if self.fleet.is_some() {
            driver.follow_all_but(&self.driver.leading());
        }
        (store, driver)
    }

    /// Sets again, on the new decision groups, the overrides that were in force before the
    /// apply (with the TTL they had left): an operator's override outlives an unrelated config
    /// change. One whose group is gone, or whose action the new config cannot publish, ends
    /// (logged).
    fn keep_overrides(&mut self, overrides: Vec<(String, rules::engine::OverrideRequest)>) {
        for (group, request) in overrides {
            let view = crate::decision::View {
                state: self.store.state(),
                health: self.publisher.health(),
                now: self.now(),
            };
            match self.driver.set_override(
                &group,
                Some(request),
                view,
                "override kept across apply",
            ) {
                Ok(d) => {
                    self.publish(d, Instant::now());
                }
                Err(e) => warn!(
                    "decision group {group}: the override in force ends with this change: {e}"
                ),
            }
        }
    }

    /// Hands the applied version to the history thread. When it is recorded, the loop learns
    /// its number ([`Command::Recorded`]) and then `reply` gets the outcome with it; a version
    /// that could not be recorded is live all the same (logged and counted), but a restart
    /// will not find the slots of this generation and renumbers.
    fn record(
        &self,
        fragments: Fragments,
        source: &str,
        generation: u64,
        hash: String,
        mut outcome: Outcome,
        reply: Option<Reply<Outcome>>,
    ) {
        let version = NewVersion {
            fragments,
            source: source.to_owned(),
            generation,
            ledger: String::new(),
            time: now_secs(),
        };
        let done = self.recorder.record(version, self.publisher.ledger());
        let commands = self.commands.clone();
        tokio::spawn(async move {
            let version = match done.await {
                Ok(Ok(n)) => Some(n),
                Ok(Err(e)) => {
                    error!("recording the applied config in the history failed: {e}");
                    None
                }
                Err(_) => None,
            };
            let _ = commands.send(Command::Recorded { hash, version }).await;
            if let Some(r) = reply {
                outcome.version = version;
                let _ = r.send(Ok(outcome));
            }
        });
    }

    /// A version recorded (or not) for the apply of `hash`: the running version, if that
    /// apply is still the running one.
    pub(super) fn recorded(&mut self, hash: &str, version: Option<u64>) {
        if version.is_none() {
            self.metrics.history_errors.inc();
        }
        if self.running.hash == hash {
            self.running.version = version;
        }
    }

    /// Whether the fragments in the config directory differ from the running config (a
    /// rollback, or a change that was rejected), as of the agent's last read of the directory
    /// (the watch reads it after every change). `None` when that read failed. Answered from
    /// the hash kept at the read, so `status` does not read and hash the directory on every
    /// request.
    pub(super) fn differs_from_files(&self) -> Option<bool> {
        (!self.seen.is_empty()).then(|| self.seen != self.running.hash)
    }

    /// The first apply of a starting agent. When it resumed the pinned maps and the directory
    /// holds the version that wrote them, nothing is rewritten: the state and decision groups
    /// are built (each group resuming its published action) and probes start. Otherwise this
    /// is an ordinary apply.
    ///
    /// # Errors
    ///
    /// Why the first apply failed; nothing was written.
    pub(super) fn start(&mut self, fragments: Fragments) -> Result<(), ApplyError> {
        if !self.running.hash.is_empty() && fragments.hash() == self.running.hash {
            let cfg = self.running_agent(fragments.load()?);
            // The virtual IPs are the publisher's to keep live from here on: it learns them
            // from the config (their entries are rewritten only where they differ).
            if let Err(e) = self.publisher.configure_vips(&mut self.maps, &cfg) {
                warn!("resuming the virtual IPs: {e}");
            }
            self.publisher.resume_settings(&cfg);
            let (store, driver) = self.build(&cfg, self.publisher.health());
            self.store = store;
            self.driver = driver;
            self.config = cfg;
            self.hooks.configure(&self.config.hooks);
            self.decide(&[], true, "start", Instant::now());
            self.metrics
                .generation
                .set(i64::try_from(self.publisher.generation()).unwrap_or(i64::MAX));
            info!(
                "config unchanged since version {} (generation {}): nothing rewritten",
                self.running.version.unwrap_or(0),
                self.publisher.generation()
            );
            self.start_probes();
            return Ok(());
        }
        let cfg = self.running_agent(fragments.load()?);
        let started = Instant::now();
        let (generation, diff) = self.go_live(cfg, started)?;
        let hash = fragments.hash();
        info!(
            "config generation {generation} applied (start){}",
            if diff.is_empty() {
                String::new()
            } else {
                format!(":\n  {}", diff.join("\n  "))
            }
        );
        self.running = Running {
            version: None,
            hash: hash.clone(),
            files: fragments.names().map(str::to_owned).collect(),
            source: "start".into(),
            applied_at: now_secs(),
        };
        let outcome = Outcome {
            changed: true,
            version: None,
            generation,
            diff,
            took_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        };
        self.record(fragments, "start", generation, hash, outcome, None);
        self.start_probes();
        Ok(())
    }

    /// Reads the config directory and applies it (the watch, SIGHUP, `ctl apply`). With
    /// `only_if_changed` (the watch), only when its fragments changed since it was last read:
    /// an event that changes no fragment (an editor's swap file, a README, the agent's own
    /// files in a state directory that is this one) then applies nothing — above all it does
    /// not apply the files again after a `ctl rollback`, which they differ from on purpose.
    pub(super) fn apply_directory(
        &mut self,
        source: &str,
        only_if_changed: bool,
        reply: Option<Reply<Outcome>>,
    ) {
        // Every problem at once: unreadable fragments and the others' (`DirFragments::load`).
        let read = config::read_dir(&self.config_dir).and_then(|d| match d.fragments() {
            Ok(f) => Ok(f),
            Err(e) => Err(d.load().err().unwrap_or(e)),
        });
        match read {
            Ok(fragments) => {
                let hash = fragments.hash();
                if only_if_changed && hash == self.seen {
                    if let Some(r) = reply {
                        let _ = r.send(Ok(self.unchanged()));
                    }
                    return;
                }
                self.seen = hash;
                // A fleet member writes the shared fragments to etcd and applies them when
                // the watch brings them back (`agent::fleet`).
                let result = if self.fleet.is_some() {
                    self.fleet_apply_directory(fragments, source, only_if_changed, reply)
                } else {
                    self.apply(fragments, source, reply)
                };
                if let Err(e) = &result {
                    self.rejected_change(source, e);
                }
                // What `status` says about the directory: its last read, applied or rejected.
                self.rejected = result.err();
            }
            Err(e) => {
                self.rejected_change(source, &e.to_string());
                self.rejected = Some(e.to_string());
                // Unread: the next read applies whatever it finds, and `status` says so.
                self.seen.clear();
                if let Some(r) = reply {
                    let _ = r.send(Err(e.to_string()));
                }
            }
        }
    }
}
