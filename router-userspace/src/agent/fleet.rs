//! The runtime's side of a fleet (`crate::fleet`): what the etcd task reports becomes changes
//! through [`Runtime::execute`], like every other change.
//!
//! A node decides only the groups it leads; it follows the others: a published decision is
//! written into its maps as it comes ([`Runtime::on_fleet`]) and its driver goes on from it, so
//! a node elected later starts from the published action with the hysteresis and cooldown it
//! implies. While etcd is unreachable the node leads nothing and keeps every map as it is.
//!
//! The applied config goes through etcd too: an apply (watch, SIGHUP, `ctl apply`, `ctl
//! rollback`) validates the whole config here and writes only its shared fragments to etcd
//! ([`Runtime::fleet_apply_directory`]); every node, this one included, applies them when the
//! watch brings them, combined with its own node-local files, through the one apply path
//! ([`Runtime::on_shared_config`]).

use std::{collections::BTreeMap, time::Instant};

use log::{info, warn};
use rules::engine::{Action, OverrideRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::{
    apply::Outcome,
    command::{Command, Published, Reply},
    runtime::Runtime,
};
use crate::{
    config::{self, Fragments},
    fleet::{
        FleetEvent, FleetOut, NodeRecord, OverrideDoc, PublishedDecision, SharedConfig, now_ns,
    },
};

/// The fleet as one node runs it.
pub struct FleetLink {
    /// This node's name.
    pub node: String,
    /// To the etcd task.
    pub out: mpsc::Sender<FleetOut>,
    /// Since when (ns since the epoch) etcd has not answered; `None` while it does.
    pub stale_since: Option<u64>,
    /// Whether etcd answered at least once.
    pub connected: bool,
    /// The groups this node leads, with their election revisions.
    pub leading: BTreeMap<String, i64>,
    /// The last published decision of each group, with its revision.
    pub published: BTreeMap<String, (i64, PublishedDecision)>,
    /// What this node last asked to publish per group (not yet seen back).
    pub sent: BTreeMap<String, Action>,
    /// What this node recorded last.
    pub record: NodeRecord,
    /// The decision groups last handed to the etcd task.
    pub groups: Vec<String>,
    /// The fleet's shared config as etcd last gave it, with its mod revision.
    pub shared: Option<(i64, SharedConfig)>,
    /// The shared fragments of the config directory at its last read: the watch writes them
    /// to etcd only when they changed on this node, so a node whose files are older than the
    /// fleet's does not write them back when only its local files change.
    pub read_shared: Fragments,
    /// A write of `read_shared` was refused: the next read writes it again, changed or not.
    pub retry: bool,
    /// The shared fragments (by content hash) sent to etcd and not yet seen back, with the
    /// `ctl apply` or `ctl rollback` that waits for them: answered when the watch brings them
    /// back and this node applied them, or when etcd refused them. The same fragments are not
    /// sent twice meanwhile (the watch and a `ctl apply` of one edit would race each other's
    /// compare-and-set). The `i64` is the revision the write was made against: a later
    /// revision that is not these fragments means they were overwritten before this node saw
    /// them (a reconnection reads only the newest), and the caller is told so.
    pub pending: Option<(String, i64, Option<Reply<Outcome>>)>,
}

impl FleetLink {
    /// A link to the etcd task through `out`, nothing known yet (stale from `now`).
    #[must_use]
    pub fn new(node: String, out: mpsc::Sender<FleetOut>) -> Self {
        Self {
            node,
            out,
            stale_since: Some(now_ns()),
            connected: false,
            leading: BTreeMap::new(),
            published: BTreeMap::new(),
            sent: BTreeMap::new(),
            record: NodeRecord::default(),
            groups: Vec::new(),
            shared: None,
            read_shared: Fragments::default(),
            retry: false,
            pending: None,
        }
    }
}

/// The fleet in `/status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetStatus {
    /// This node.
    pub node: String,
    /// `connecting` until the first session with etcd, `connected`, or `stale since <RFC 3339
    /// time>` while etcd does not answer (the node keeps the last decisions and maps).
    pub etcd: String,
    /// Since when etcd has not answered, s since the epoch.
    pub stale_since: Option<u64>,
    /// Per decision group.
    pub groups: Vec<FleetGroupStatus>,
    /// The revision of the fleet's shared config this node runs (`None`: none from etcd yet,
    /// or its local files never combined with one).
    pub config_revision: Option<i64>,
    /// Its content hash.
    pub config_hash: Option<String>,
    /// The revision of the shared config in etcd, as this node last saw it; another than
    /// `config_revision` while this node has not applied it (`rejected` says why).
    pub config_in_etcd: Option<i64>,
}

/// One group in [`FleetStatus`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetGroupStatus {
    /// The group.
    pub group: String,
    /// `leader` or `follower`.
    pub role: String,
    /// The node that published the last decision.
    pub leader: Option<String>,
    /// The revision of the published decision this node's maps hold.
    pub revision: Option<i64>,
}

/// The text form of a time in ns since the epoch.
fn rfc3339(ns: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns))
        .to_string()
}

impl Runtime {
    /// Handles what the etcd task reported.
    pub(super) fn on_fleet(&mut self, ev: FleetEvent) {
        if self.fleet.is_none() {
            return;
        }
        match ev {
            FleetEvent::Reachable(true) => {
                if let Some(f) = &mut self.fleet {
                    f.stale_since = None;
                    f.connected = true;
                }
                self.metrics.fleet_stale.set(0);
                self.sync_fleet();
                // The first node to reach etcd seeds the fleet's shared config with its own
                // (create-if-absent: the others lose the race quietly and take it).
                if let Some(f) = &self.fleet
                    && f.shared.is_none()
                {
                    let shared = f.read_shared.clone();
                    let _ = self.fleet_write(shared, "first node", None, true);
                }
            }
            FleetEvent::Reachable(false) => {
                let newly = self.fleet.as_ref().is_some_and(|f| f.stale_since.is_none());
                if let Some(f) = &mut self.fleet {
                    f.stale_since.get_or_insert_with(now_ns);
                    f.leading.clear();
                }
                // Lead nothing: the maps keep the last decisions until etcd answers again.
                self.driver.follow_all_but(&[]);
                self.metrics.fleet_stale.set(1);
                if newly {
                    warn!("fleet: etcd unreachable; keeping the last decisions and maps");
                }
            }
            FleetEvent::Leading { group, revision } => {
                if let Some(f) = &mut self.fleet {
                    f.leading.insert(group.clone(), revision);
                    f.sent.remove(&group);
                }
                self.driver.set_leading(&group, true);
                info!("decision group {group}: this node leads it (revision {revision})");
                self.decide(&[], true, "leader elected", Instant::now());
                self.republish(&group);
            }
            FleetEvent::NotLeading(group) => {
                if let Some(f) = &mut self.fleet {
                    f.leading.remove(&group);
                }
                self.driver.set_leading(&group, false);
            }
            FleetEvent::Decision {
                group,
                revision,
                decision,
            } => self.follow_published(&group, revision, decision),
            FleetEvent::Config { revision, doc } => self.on_shared_config(revision, doc),
            FleetEvent::ConfigRefused { hash, error } => {
                let text = format!("the shared config was not written to etcd: {error}");
                warn!("{text}");
                self.metrics.rejected.inc();
                self.rejected = Some(text.clone());
                // Unwritten: the next read of the directory tries again.
                self.seen.clear();
                if let Some(f) = &mut self.fleet {
                    f.retry = true;
                }
                if let Some(f) = &mut self.fleet
                    && let Some((_, _, Some(reply))) = f.pending.take_if(|(h, _, _)| *h == hash)
                {
                    let _ = reply.send(Err(text));
                }
            }
            FleetEvent::State { name, value } => match self.store.set_push(&name, &value) {
                Ok(slots) => {
                    let cause = format!("state set {name}={value}");
                    self.decide(&slots, false, &cause, Instant::now());
                }
                Err(e) => warn!("fleet: pushed state {name}={value} not taken: {e}"),
            },
            FleetEvent::Override { group, doc } => {
                let request = match doc {
                    None => None,
                    Some(d) => {
                        let now = now_ns();
                        let ttl = match d.expires_at_ns {
                            Some(at) if at <= now => return,
                            Some(at) => Some(std::time::Duration::from_nanos(at - now)),
                            None => None,
                        };
                        let mut r = OverrideRequest::new(d.action, d.reason);
                        if let Some(t) = ttl {
                            r = r.ttl(t);
                        }
                        if d.force {
                            r = r.force();
                        }
                        Some(r)
                    }
                };
                if let Err(e) = self.set_override(&group, request, Instant::now()) {
                    warn!("fleet: override of group {group} not taken: {e}");
                }
            }
        }
    }

    /// Tells the etcd task the groups of the running config and this node's record, when
    /// they changed (after an apply, on the one-second tick).
    pub(super) fn sync_fleet(&mut self) {
        let groups: Vec<String> = self
            .config
            .decisions
            .iter()
            .map(|g| g.name.clone())
            .collect();
        let generation = self.publisher.generation();
        let Some(f) = &mut self.fleet else { return };
        if f.groups != groups {
            f.groups.clone_from(&groups);
            let _ = f.out.try_send(FleetOut::Groups(groups));
        }
        if f.record.generation != generation {
            f.record.generation = generation;
            f.record.applied_at_ns = now_ns();
            let _ = f.out.try_send(FleetOut::Record(f.record.clone()));
        }
    }

    /// Publishes the active action of `group`, which this node leads, unless it is what etcd
    /// already holds (a new leader republishes only what it changed).
    fn republish(&mut self, group: &str) {
        let Some(active) = self.driver.active(group).cloned() else {
            return;
        };
        // What this node's maps hold: the active action at its canary ramp's share.
        let action = self
            .driver
            .published(group)
            .cloned()
            .unwrap_or_else(|| active.action.clone());
        let Some(f) = &self.fleet else { return };
        let same = f
            .published
            .get(group)
            .is_some_and(|(_, d)| d.action == action);
        if !same && f.sent.get(group) != Some(&action) {
            let word = self.publisher.action_word(Some(&action), None);
            self.send_decision(group, &action, &active.by, word, "leader elected", None);
        }
    }

    /// After this node (leading `group`) wrote a switch into its maps: publish it.
    pub(super) fn send_decision(
        &mut self,
        group: &str,
        action: &Action,
        by: &rules::engine::By,
        word: u64,
        cause: &str,
        switched_now: Option<u64>,
    ) {
        let generation = self.publisher.generation();
        let Some(f) = &mut self.fleet else { return };
        let Some(&revision) = f.leading.get(group) else {
            return;
        };
        let now = now_ns();
        let decision = PublishedDecision {
            action: action.clone(),
            word,
            by: by.into(),
            cause: cause.to_owned(),
            leader: f.node.clone(),
            election_revision: revision,
            decided_at_ns: switched_now.unwrap_or(now),
            switched_at_ns: switched_now.unwrap_or_else(|| {
                f.published
                    .get(group)
                    .filter(|(_, d)| &d.action == action)
                    .map_or(now, |(_, d)| d.switched_at_ns)
            }),
            generation,
        };
        f.sent.insert(group.to_owned(), action.clone());
        if f.out
            .try_send(FleetOut::Publish {
                group: group.to_owned(),
                decision,
            })
            .is_err()
        {
            warn!("fleet: the etcd task is behind; decision of {group} not published");
        }
    }

    /// A group's published decision: written into the maps unless this node leads the group,
    /// then recorded under this node's lease with the latency from the leader's decision.
    fn follow_published(&mut self, group: &str, revision: i64, d: PublishedDecision) {
        let leads = self.driver.leads(group);
        let mut latency_us = None;
        if !leads {
            let now = self.now();
            let wall = now_ns();
            let switched_at = now.checked_sub(std::time::Duration::from_nanos(
                wall.saturating_sub(d.switched_at_ns),
            ));
            if let Err(e) =
                self.driver
                    .follow(group, d.action.clone(), (&d.by).into(), switched_at, now)
            {
                warn!("fleet: decision of group {group} not followed: {e}");
                return;
            }
            match self
                .publisher
                .publish_decision(&mut self.maps, group, &d.action)
            {
                Ok(written) => {
                    let us = now_ns().saturating_sub(d.decided_at_ns) / 1000;
                    if written.is_some() {
                        #[expect(
                            clippy::cast_precision_loss,
                            reason = "a latency in µs, far below 2^52, as seconds"
                        )]
                        self.metrics.fleet_switch_latency.observe(us as f64 / 1e6);
                        info!(
                            "decision group {group}: {} published by {} (revision {revision}) \
                             written {us} µs after its decision",
                            d.action, d.leader
                        );
                    }
                    latency_us = Some(us);
                }
                Err(e) => {
                    warn!("decision group {group}: writing the published switch failed: {e}");
                    return;
                }
            }
        }
        let generation = self.publisher.generation();
        let Some(f) = &mut self.fleet else { return };
        if leads {
            // Written into this node's maps when it decided.
            latency_us = Some(0);
        }
        if f.sent.get(group) == Some(&d.action) {
            f.sent.remove(group);
        }
        f.published.insert(group.to_owned(), (revision, d));
        f.record.generation = generation;
        f.record.decisions.insert(group.to_owned(), revision);
        f.record.applied_at_ns = now_ns();
        f.record.latency_us = latency_us;
        let _ = f.out.try_send(FleetOut::Record(f.record.clone()));
    }

    /// `ctl state set` on a fleet member: checked here, then written to etcd; every node
    /// (this one too) takes it from there.
    pub(super) fn fleet_set_state(&mut self, name: String, value: String, reply: Reply<bool>) {
        if let Err(e) = self.store.check_push(&name, &value) {
            let _ = reply.send(Err(e.to_string()));
            return;
        }
        if let Some(f) = &self.fleet
            && let Err(mpsc::error::TrySendError::Full(m) | mpsc::error::TrySendError::Closed(m)) =
                f.out.try_send(FleetOut::SetState { name, value, reply })
            && let FleetOut::SetState { reply, .. } = m
        {
            let _ = reply.send(Err("the etcd task is busy; try again".into()));
        }
    }

    /// `ctl override set/clear` on a fleet member: checked here, then written to etcd.
    pub(super) fn fleet_override(
        &mut self,
        group: String,
        request: Option<OverrideRequest>,
        reply: Reply<Option<Published>>,
    ) {
        if let Err(e) = self.driver.index(&group) {
            let _ = reply.send(Err(e.to_string()));
            return;
        }
        if let Some(r) = &request {
            let known = |p: &str| self.publisher.pools().contains_key(p);
            if let Some(p) = r.action.live_pools().find(|p| !known(p)) {
                let _ = reply.send(Err(format!("unknown pool {p:?}")));
                return;
            }
            if r.reason.trim().is_empty() {
                let _ = reply.send(Err("an override needs a reason".into()));
                return;
            }
        }
        let doc = request.map(|r| OverrideDoc {
            expires_at_ns: r
                .ttl
                .map(|t| now_ns().saturating_add(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))),
            action: r.action,
            reason: r.reason,
            force: r.force,
        });
        if let Some(f) = &self.fleet {
            let _ = f.out.try_send(FleetOut::Override { group, doc, reply });
        }
    }

    /// The fleet in `/status`.
    pub(super) fn fleet_status(&self) -> Option<FleetStatus> {
        let f = self.fleet.as_ref()?;
        Some(FleetStatus {
            node: f.node.clone(),
            etcd: match (f.stale_since, f.connected) {
                (Some(ns), _) => format!("stale since {}", rfc3339(ns)),
                (None, true) => "connected".into(),
                (None, false) => "connecting".into(),
            },
            stale_since: f.stale_since.map(|ns| ns / 1_000_000_000),
            groups: self
                .config
                .decisions
                .iter()
                .map(|g| FleetGroupStatus {
                    group: g.name.clone(),
                    role: if self.driver.leads(&g.name) {
                        "leader".into()
                    } else {
                        "follower".into()
                    },
                    leader: f.published.get(&g.name).map(|(_, d)| d.leader.clone()),
                    revision: f.record.decisions.get(&g.name).copied(),
                })
                .collect(),
            config_revision: f.record.config_revision,
            config_hash: f.record.config_hash.clone(),
            config_in_etcd: f.shared.as_ref().map(|(r, _)| *r),
        })
    }

    /// An apply of the config directory `dir` on a fleet member (watch, SIGHUP, `ctl apply`).
    ///
    /// When its shared fragments are to be written (they changed since the directory was last
    /// read, or SIGHUP and `ctl apply` ask for it, and etcd holds others), the whole directory
    /// is validated and, only if valid, its shared fragments go to etcd; the apply happens
    /// when the watch brings them back ([`Self::on_shared_config`]), and `reply` is answered
    /// then. Otherwise only this node's local files changed: they are applied with the shared
    /// config etcd gave (or, before etcd gave one, the directory as it is).
    ///
    /// # Errors
    ///
    /// Why nothing was applied nor written (also sent to `reply`): the directory is invalid,
    /// or etcd is unreachable.
    pub(super) fn fleet_apply_directory(
        &mut self,
        dir: Fragments,
        source: &str,
        only_if_changed: bool,
        reply: Option<Reply<Outcome>>,
    ) -> Result<(), String> {
        let shared = dir.shared();
        let Some(f) = &mut self.fleet else {
            return self.apply(dir, source, reply);
        };
        let changed_here = shared != f.read_shared || f.retry;
        let in_etcd = f.shared.as_ref().map(|(_, d)| d.hash.clone());
        let write = (changed_here || !only_if_changed) && in_etcd != Some(shared.hash());
        if !write {
            f.read_shared = shared;
            f.retry = false;
            return if f.shared.is_some() {
                self.apply_with_shared(&dir.local(), source, reply)
            } else {
                self.apply(dir, source, reply)
            };
        }
        // The whole config, local and shared, is valid before anything reaches the fleet.
        if let Err(e) = dir.load() {
            let text = e.to_string();
            if let Some(r) = reply {
                let _ = r.send(Err(text.clone()));
            }
            return Err(text);
        }
        // Read for the watch only once it is on its way: a shared change that was invalid or
        // refused is written by the next read that finds it valid.
        self.fleet_write(shared.clone(), source, reply, false)?;
        if let Some(f) = &mut self.fleet {
            f.read_shared = shared;
            f.retry = false;
        }
        Ok(())
    }

    /// `ctl rollback` on a fleet member: the shared fragments of the recorded version
    /// `version` are validated with this node's local files and written to etcd, so the whole
    /// fleet rolls back; `reply` is answered when this node applied them.
    pub(super) fn fleet_rollback(
        &mut self,
        version: &Fragments,
        source: &str,
        reply: Reply<Outcome>,
    ) {
        let local = match config::read_dir(&self.config_dir).and_then(|d| d.fragments()) {
            Ok(dir) => dir.local(),
            Err(e) => {
                let _ = reply.send(Err(e.to_string()));
                return;
            }
        };
        let shared = version.shared();
        if let Err(e) = Fragments::combine(&local, &shared).load() {
            let _ = reply.send(Err(e.to_string()));
            return;
        }
        if let Err(e) = self.fleet_write(shared, source, Some(reply), false) {
            warn!("{source} refused; the running config stays: {e}");
        }
    }

    /// Sends `shared` to etcd (compare-and-set on the revision this node last saw). `reply`
    /// waits for the apply the watch brings back. A refusal comes back as
    /// [`FleetEvent::ConfigRefused`], except for a `seed` (the first node's create-if-absent,
    /// which another node may win), only logged.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or the etcd task is busy (also sent to `reply`).
    fn fleet_write(
        &mut self,
        shared: Fragments,
        source: &str,
        reply: Option<Reply<Outcome>>,
        seed: bool,
    ) -> Result<(), String> {
        let Some(f) = &mut self.fleet else {
            return Err("not a fleet member".into());
        };
        let refuse = |reply: Option<Reply<Outcome>>, text: &str| {
            if let Some(r) = reply {
                let _ = r.send(Err(text.to_owned()));
            }
            Err(text.to_owned())
        };
        if f.stale_since.is_some() {
            return refuse(
                reply,
                "etcd is unreachable: the shared config cannot be written to the fleet; the \
                 running config stays",
            );
        }
        let hash = shared.hash();
        if let Some((sent, _, waiting)) = &mut f.pending
            && *sent == hash
        {
            if let Some(r) = reply
                && let Some(older) = waiting.replace(r)
            {
                let _ = older.send(Err("superseded by a later apply on this node".into()));
            }
            return Ok(());
        }
        let doc = SharedConfig {
            files: shared.into_files(),
            hash: hash.clone(),
            written_by: f.node.clone(),
            written_at_ns: now_ns(),
            source: source.to_owned(),
        };
        let expected = if seed {
            0
        } else {
            f.shared.as_ref().map_or(0, |(r, _)| *r)
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        if f.out
            .try_send(FleetOut::Config {
                doc,
                expected,
                reply: tx,
            })
            .is_err()
        {
            return refuse(reply, "the etcd task is busy; try again");
        }
        if !seed
            && let Some((_, _, Some(older))) = f.pending.replace((hash.clone(), expected, reply))
        {
            let _ = older.send(Err("superseded by a later apply on this node".into()));
        }
        info!(
            "fleet: shared config {} sent to etcd ({source})",
            short(&hash)
        );
        let commands = self.commands.clone();
        tokio::spawn(async move {
            let error = match rx.await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => e,
                Err(_) => "the etcd task stopped".to_owned(),
            };
            if seed {
                info!("fleet: not the first node to write the shared config: {error}");
                return;
            }
            let _ = commands
                .send(Command::Fleet(FleetEvent::ConfigRefused { hash, error }))
                .await;
        });
        Ok(())
    }

    /// The fleet's shared config, from etcd (written by any node, this one included): applied
    /// combined with this node's local files. A combination that fails keeps the running
    /// config, and `status` says why (`rejected`) and which revision this node runs.
    fn on_shared_config(&mut self, revision: i64, doc: SharedConfig) {
        let Some(f) = &mut self.fleet else { return };
        let reply = f
            .pending
            .take_if(|(h, _, _)| *h == doc.hash)
            .and_then(|(_, _, r)| r);
        if let Some((_, _, waiting)) = f.pending.take_if(|(_, against, _)| revision > *against)
            && let Some(r) = waiting
        {
            let _ = r.send(Err(format!(
                "the fleet's shared config is now revision {revision} from {}: this apply was \
                 overwritten before it ran here",
                doc.written_by
            )));
        }
        let source = format!(
            "fleet revision {revision}: {} on {}",
            doc.source, doc.written_by
        );
        f.shared = Some((revision, doc));
        let local = config::read_dir(&self.config_dir)
            .and_then(|d| d.fragments())
            .map(|dir| dir.local());
        let result = match local {
            Ok(local) => self.apply_with_shared(&local, &source, reply),
            Err(e) => {
                let text = e.to_string();
                if let Some(r) = reply {
                    let _ = r.send(Err(text.clone()));
                }
                Err(text)
            }
        };
        match result {
            Ok(()) => self.rejected = None,
            Err(e) => {
                let text = format!(
                    "the fleet's shared config (revision {revision}) with this node's local \
                     files is not applied; the running config stays:\n{e}"
                );
                warn!("{text}");
                self.metrics.rejected.inc();
                self.rejected = Some(text);
            }
        }
    }

    /// Applies this node's `local` fragments with the shared config etcd last gave (which
    /// must be there), and records the revision it runs under its lease.
    fn apply_with_shared(
        &mut self,
        local: &Fragments,
        source: &str,
        reply: Option<Reply<Outcome>>,
    ) -> Result<(), String> {
        let Some((revision, doc)) = self.fleet.as_ref().and_then(|f| f.shared.clone()) else {
            return Err("no shared config from etcd yet".into());
        };
        let combined = Fragments::combine(local, &Fragments::new(doc.files));
        self.apply(combined, source, reply)?;
        let generation = self.publisher.generation();
        let Some(f) = &mut self.fleet else {
            return Ok(());
        };
        if f.record.config_revision != Some(revision) {
            let us = now_ns().saturating_sub(doc.written_at_ns) / 1000;
            info!(
                "fleet: shared config revision {revision} ({}) runs here, generation \
                 {generation}, {us} µs after it was written",
                short(&doc.hash)
            );
            f.record.config_revision = Some(revision);
            f.record.applied_at_ns = now_ns();
            f.record.config_hash = Some(doc.hash);
            f.record.config_latency_us = Some(us);
        }
        f.record.generation = generation;
        let _ = f.out.try_send(FleetOut::Record(f.record.clone()));
        Ok(())
    }
}

/// The first 12 hex digits of a content hash, for logs.
fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}
