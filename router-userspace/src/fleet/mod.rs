//! A fleet of balancers on etcd: one leader per decision group, decisions published once,
//! pushed state and overrides shared, and each node's convergence recorded.
//!
//! Keys, under `fleet.prefix` (`P`):
//!
//! | key | value | lease | written by |
//! |---|---|---|---|
//! | `P/leader/GROUP` | the leader's node name | the leader's | a create-if-absent transaction |
//! | `P/decision/GROUP` | [`PublishedDecision`] (JSON) | none | the leader, fenced on its election |
//! | `P/state/NAME` | the pushed value, as text | none | any node's `ctl state set` |
//! | `P/override/GROUP` | [`OverrideDoc`] (JSON) | none | any node's `ctl override` |
//! | `P/node/NODE` | [`NodeRecord`] (JSON) | the node's | the node, after each map write |
//! | `P/config/shared` | [`SharedConfig`] (JSON) | none | any node's apply or rollback, by compare-and-set |
//!
//! The election key's create revision is the leader's fencing token: a decision is written only
//! by a transaction that compares it, so a leader whose lease expired (and whose group another
//! node took) cannot overwrite its successor's decision.
//!
//! This module is the etcd side ([`run`]): a task that talks to etcd and hands everything it
//! learns to the agent's event loop as [`Command::Fleet`] (the one command queue); the loop
//! hands it what to write ([`FleetOut`]). Nothing here changes the maps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use log::{info, warn};
use rules::engine::{Action, By};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::{
    agent::command::{Command, Published, Reply},
    config::Fleet,
};

/// Nanoseconds since the Unix epoch, now.
#[must_use]
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Who chose a published action, in a form that reads back ([`By`] is shown, not parsed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Chooser {
    /// A rule, by id.
    Rule(String),
    /// The group's default.
    Default,
    /// An override.
    Override,
    /// Kept (an override that ended, a resumed action).
    Kept,
}

impl From<&By> for Chooser {
    fn from(by: &By) -> Self {
        match by {
            By::Rule(id) => Self::Rule(id.clone()),
            By::Default => Self::Default,
            By::Override => Self::Override,
            By::Kept => Self::Kept,
        }
    }
}

impl From<&Chooser> for By {
    fn from(c: &Chooser) -> Self {
        match c {
            Chooser::Rule(id) => Self::Rule(id.clone()),
            Chooser::Default => Self::Default,
            Chooser::Override => Self::Override,
            Chooser::Kept => Self::Kept,
        }
    }
}

/// A group's decision as its leader publishes it under `P/decision/GROUP`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedDecision {
    /// The chosen pool or split.
    pub action: Action,
    /// The decision word the leader wrote into its own maps.
    pub word: u64,
    /// What chose it: the reason.
    pub by: Chooser,
    /// The event that caused it (`state set …`, `timer`, …).
    pub cause: String,
    /// The leader's node name.
    pub leader: String,
    /// The create revision of the leader's election key: its fencing token.
    pub election_revision: i64,
    /// When the leader decided, ns since the Unix epoch (the start of the fleet's switch
    /// latency).
    pub decided_at_ns: u64,
    /// When the group switched to `action`, ns since the Unix epoch: the cooldown counts from
    /// it (equal to `decided_at_ns` for a switch, earlier when a new leader republishes).
    pub switched_at_ns: u64,
    /// The leader's config generation.
    pub generation: u64,
}

/// An override as it is shared under `P/override/GROUP`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideDoc {
    /// The forced action.
    pub action: Action,
    /// Why (required by `ctl override set`).
    pub reason: String,
    /// When it ends, ns since the Unix epoch; `None`: until cleared.
    pub expires_at_ns: Option<u64>,
    /// It overrides `require`.
    pub force: bool,
}

/// What one node runs, under `P/node/NODE` (on the node's lease: it disappears with the node).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's config generation.
    pub generation: u64,
    /// Per group, the revision of the published decision the node's maps hold.
    pub decisions: std::collections::BTreeMap<String, i64>,
    /// When the node last wrote a published decision, a config generation or a shared config
    /// into its maps, ns since the Unix epoch; 0: not yet.
    pub applied_at_ns: u64,
    /// From that decision's `decided_at_ns` to this node's map write, µs.
    pub latency_us: Option<u64>,
    /// The revision of the fleet's shared config the node runs (`None`: none from etcd yet).
    #[serde(default)]
    pub config_revision: Option<i64>,
    /// Its content hash.
    #[serde(default)]
    pub config_hash: Option<String>,
    /// From its `written_at_ns` to the end of this node's apply, µs.
    #[serde(default)]
    pub config_latency_us: Option<u64>,
}

/// The fleet's shared config under `P/config/shared`: the fragments that are not node-local
/// (`crate::config::Fragments::shared`), as one apply wrote them. Every node combines them with
/// its own local files and applies the result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedConfig {
    /// `(file name, text)` in name order.
    pub files: Vec<(String, String)>,
    /// Their content hash (`Fragments::hash`): what `status` shows each node runs.
    pub hash: String,
    /// The node that wrote it.
    pub written_by: String,
    /// When that node asked etcd to write it, ns since the Unix epoch (the start of each
    /// node's apply latency).
    pub written_at_ns: u64,
    /// What wrote it on that node: `ctl apply`, `watch`, `sighup`, `rollback to N`, `first node`.
    pub source: String,
}

/// What the etcd task tells the event loop.
#[derive(Debug)]
pub enum FleetEvent {
    /// etcd answers again (`true`), or stopped answering (`false`).
    Reachable(bool),
    /// This node leads `group`, elected at `revision` (its fencing token).
    Leading {
        /// The group.
        group: String,
        /// The election key's create revision.
        revision: i64,
    },
    /// This node no longer leads `group` (a fenced write failed).
    NotLeading(String),
    /// A group's published decision, at its key's mod revision.
    Decision {
        /// The group.
        group: String,
        /// The decision key's mod revision.
        revision: i64,
        /// The decision.
        decision: PublishedDecision,
    },
    /// A pushed state value.
    State {
        /// Variable.
        name: String,
        /// Value as text.
        value: String,
    },
    /// An override set (`Some`) or cleared (`None`).
    Override {
        /// The group.
        group: String,
        /// The override.
        doc: Option<OverrideDoc>,
    },
    /// A write of the shared config this node asked for was refused (etcd unreachable, or
    /// the key changed meanwhile): nothing changed anywhere.
    ConfigRefused {
        /// The content hash of the shared fragments that were not written.
        hash: String,
        /// Why.
        error: String,
    },
    /// The fleet's shared config, at its key's mod revision.
    Config {
        /// The key's mod revision.
        revision: i64,
        /// The shared fragments.
        doc: SharedConfig,
    },
}

/// What the event loop asks the etcd task to write.
#[derive(Debug)]
pub enum FleetOut {
    /// The decision groups of the running config: the ones to campaign for.
    Groups(Vec<String>),
    /// Publish a decision of a group this node leads (fenced on `election_revision`).
    Publish {
        /// The group.
        group: String,
        /// The decision.
        decision: PublishedDecision,
    },
    /// `ctl state set`, fleet-wide.
    SetState {
        /// Variable.
        name: String,
        /// Value as text (already checked).
        value: String,
        /// Answered once etcd took it.
        reply: Reply<bool>,
    },
    /// `ctl override set/clear`, fleet-wide.
    Override {
        /// The group.
        group: String,
        /// The override, `None` to clear.
        doc: Option<OverrideDoc>,
        /// Answered once etcd took it.
        reply: Reply<Option<Published>>,
    },
    /// This node's record, to write under its lease.
    Record(NodeRecord),
    /// Write the fleet's shared config, if `P/config/shared` is still at mod revision
    /// `expected` (0: absent): two nodes applying at once cannot both win, and the one that
    /// lost is told so rather than overwriting what it never saw.
    Config {
        /// The shared fragments.
        doc: SharedConfig,
        /// The mod revision the writer last saw.
        expected: i64,
        /// The new revision once etcd took it, or why not (unreachable, changed meanwhile).
        reply: Reply<i64>,
    },
    /// The agent stops (SIGTERM, SIGINT): revoke the lease, so that its elections end now
    /// rather than when the lease expires; answered when done (or failed).
    Resign(tokio::sync::oneshot::Sender<()>),
}

/// The fleet's keys under `prefix`.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys under `prefix` (no trailing `/`).
    #[must_use]
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }
    /// `P/` — every key.
    #[must_use]
    pub fn all(&self) -> String {
        format!("{}/", self.prefix)
    }
    /// `P/leader/GROUP`.
    #[must_use]
    pub fn leader(&self, group: &str) -> String {
        format!("{}/leader/{group}", self.prefix)
    }
    /// `P/decision/GROUP`.
    #[must_use]
    pub fn decision(&self, group: &str) -> String {
        format!("{}/decision/{group}", self.prefix)
    }
    /// `P/state/NAME`.
    #[must_use]
    pub fn state(&self, name: &str) -> String {
        format!("{}/state/{name}", self.prefix)
    }
    /// `P/override/GROUP`.
    #[must_use]
    pub fn override_key(&self, group: &str) -> String {
        format!("{}/override/{group}", self.prefix)
    }
    /// `P/config/shared`.
    #[must_use]
    pub fn config(&self) -> String {
        format!("{}/config/shared", self.prefix)
    }
    /// `P/node/NODE`.
    #[must_use]
    pub fn node(&self, node: &str) -> String {
        format!("{}/node/{node}", self.prefix)
    }
    /// `(kind, name)` of a key under the prefix: `("decision", "web")`.
    #[must_use]
    pub fn parse<'a>(&self, key: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        rest.split_once('/')
    }
}

/// Why a session with etcd ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Lost(String),
    #[error("the agent stopped")]
    Stopped,
}

/// The etcd task: sessions with etcd, one after the other, for as long as the agent runs. A
/// session that fails (etcd unreachable, a request past `request_timeout`, the lease lost)
/// tells the loop [`FleetEvent::Reachable`]`(false)` and the next one starts after a short
/// pause; meanwhile requests to write are answered with the error.
pub async fn run(cfg: Fleet, commands: mpsc::Sender<Command>, mut out: mpsc::Receiver<FleetOut>) {
    let mut s = Session {
        keys: Keys::new(&cfg.prefix),
        cfg,
        commands,
        groups: Vec::new(),
        lease: None,
        record: None,
        next: 0,
        leading: std::collections::BTreeMap::new(),
    };
    loop {
        match Box::pin(s.run(&mut out)).await {
            Err(SessionError::Stopped) => return,
            Err(e) => warn!("fleet: etcd session ended: {e}; keeping the last decisions"),
            Ok(()) => {}
        }
        s.leading.clear();
        if s.commands
            .send(Command::Fleet(FleetEvent::Reachable(false)))
            .await
            .is_err()
        {
            return;
        }
        // Pause before the next session, answering writes with the error meanwhile.
        let pause = tokio::time::sleep(Duration::from_millis(250));
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                msg = out.recv() => match msg {
                    None => return,
                    Some(m) => s.offline(m),
                },
            }
        }
    }
}

/// The election of `node` for `group`: a transaction that creates `P/leader/GROUP` = `node`
/// under `lease` if no one holds it (`create_revision == 0`). It succeeded when this node leads;
/// the response header's revision is then its fencing token.
#[must_use]
pub fn campaign_txn(keys: &Keys, node: &str, group: &str, lease: i64) -> Txn {
    let key = keys.leader(group);
    Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            node.to_owned(),
            Some(PutOptions::new().with_lease(lease)),
        )])
}

/// The publication of `decision` by `node`, fenced: `P/decision/GROUP` is written only while
/// `P/leader/GROUP` is the key this node's election created (its create revision is
/// `decision.election_revision`, and it names `node`). A leader whose lease expired fails the
/// comparison even once it is elected again (a new election has a new create revision); the
/// response then carries the election key as it is (the leader now, if any).
#[must_use]
pub fn publish_txn(keys: &Keys, node: &str, group: &str, decision: &PublishedDecision) -> Txn {
    let leader = keys.leader(group);
    let json = serde_json::to_string(decision).unwrap_or_default();
    Txn::new()
        .when([
            Compare::create_revision(leader.clone(), CompareOp::Equal, decision.election_revision),
            Compare::value(leader.clone(), CompareOp::Equal, node.to_owned()),
        ])
        .and_then([TxnOp::put(keys.decision(group), json, None)])
        .or_else([TxnOp::get(leader, None)])
}

/// The write of the fleet's shared config `doc`, by compare-and-set: `P/config/shared` is
/// written only while its mod revision is `expected` (0: the key does not exist); otherwise the
/// response carries the key as it is.
#[must_use]
pub fn config_txn(keys: &Keys, doc: &SharedConfig, expected: i64) -> Txn {
    let key = keys.config();
    let json = serde_json::to_string(doc).unwrap_or_default();
    Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            expected,
        )])
        .and_then([TxnOp::put(key.clone(), json, None)])
        .or_else([TxnOp::get(key, None)])
}

/// The client options of `cfg`: its dial timeout, `request` per request, and its TLS, whose
/// files are read here (so a certificate renewed in place is taken at the next connection).
///
/// # Errors
///
/// A TLS file cannot be read (the error names it).
fn options(cfg: &Fleet, request: Duration) -> Result<ConnectOptions, String> {
    let options = ConnectOptions::new()
        .with_connect_timeout(cfg.dial_timeout)
        .with_timeout(request);
    let Some(tls) = &cfg.tls else {
        return Ok(options);
    };
    let read = |path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| format!("fleet.tls: {} cannot be read: {e}", path.display()))
    };
    let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(options.with_tls(config))
}

/// A client of one member: the first of `endpoints`, from `first` on, that answers a status
/// request within `limit`; with the index of its endpoint. One member per session, not a
/// client balanced over all of them: a balanced client sends some requests to a dead member
/// and fails them, where one member's failure here ends the session and the next one starts
/// on another member.
async fn connect(
    endpoints: &[String],
    first: usize,
    options: &ConnectOptions,
    limit: Duration,
) -> Result<(Client, usize), SessionError> {
    let mut last = SessionError::Lost("no etcd endpoint".into());
    for k in 0..endpoints.len() {
        let at = (first + k) % endpoints.len();
        let attempt = async {
            let mut c = Client::connect([&endpoints[at]], Some(options.clone())).await?;
            c.status().await?;
            Ok::<_, etcd_client::Error>(c)
        };
        match tokio::time::timeout(limit * 2, attempt).await {
            Ok(Ok(c)) => return Ok((c, at)),
            Ok(Err(e)) => last = SessionError::Etcd(e),
            Err(_) => last = SessionError::Timeout(limit * 2),
        }
    }
    Err(last)
}

struct Session {
    cfg: Fleet,
    keys: Keys,
    commands: mpsc::Sender<Command>,
    groups: Vec<String>,
    /// The lease of the last session: reused while it lives, so a reconnection (an etcd
    /// member gone) keeps this node's elections.
    lease: Option<i64>,
    record: Option<NodeRecord>,
    /// The endpoint the next session tries first.
    next: usize,
    /// The groups this node leads, with their election revisions.
    leading: std::collections::BTreeMap<String, i64>,
}

impl Session {
    fn offline(&mut self, m: FleetOut) {
        let err = || "etcd is unreachable: nothing was changed".to_owned();
        match m {
            FleetOut::Groups(g) => self.groups = g,
            FleetOut::Record(r) => self.record = Some(r),
            FleetOut::Publish { .. } => {}
            FleetOut::Resign(done) => {
                let _ = done.send(());
            }
            FleetOut::SetState { reply, .. } => {
                let _ = reply.send(Err(err()));
            }
            FleetOut::Override { reply, .. } => {
                let _ = reply.send(Err(err()));
            }
            FleetOut::Config { reply, .. } => {
                let _ = reply.send(Err(
                    "etcd is unreachable: the shared config was not written; the running \
                     config stays"
                        .to_owned(),
                ));
            }
        }
    }

    async fn tell(&self, ev: FleetEvent) -> Result<(), SessionError> {
        self.commands
            .send(Command::Fleet(ev))
            .await
            .map_err(|_| SessionError::Stopped)
    }

    async fn timed<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, SessionError> {
        let limit = self.cfg.request_timeout;
        match tokio::time::timeout(limit, f).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(SessionError::Timeout(limit)),
        }
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one session: connect, lease, snapshot, campaigns, then the loop over the \
                  watch, the writes and the keep-alives"
    )]
    async fn run(&mut self, out: &mut mpsc::Receiver<FleetOut>) -> Result<(), SessionError> {
        let options = options(&self.cfg, self.cfg.request_timeout)
            .map_err(SessionError::Lost)?
            .with_keep_alive(self.cfg.request_timeout, self.cfg.request_timeout);
        let (mut client, at) = connect(
            &self.cfg.endpoints,
            self.next,
            &options,
            self.cfg.request_timeout,
        )
        .await?;
        // The next session starts with the member after this one: if this one fails, it is
        // the likely cause.
        self.next = at + 1;
        let ttl = i64::try_from(self.cfg.lease_ttl.as_secs()).unwrap_or(60);
        // The last session's lease, while it lives; otherwise a new one.
        let (mut keeper, mut alive) = {
            let mut reused = None;
            if let Some(id) = self.lease {
                let mut c = client.clone();
                if let Ok((mut k, mut s)) = self.timed(c.lease_keep_alive(id)).await
                    && self.timed(k.keep_alive()).await.is_ok()
                    && let Ok(Some(r)) = self.timed(s.message()).await
                    && r.ttl() > 0
                {
                    reused = Some((k, s));
                }
            }
            if let Some(ks) = reused {
                ks
            } else {
                let id = self.timed(client.lease_grant(ttl, None)).await?.id();
                self.lease = Some(id);
                let mut c = client.clone();
                self.timed(c.lease_keep_alive(id)).await?
            }
        };
        let lease = self.lease.unwrap_or_default();
        // Everything there is, then the changes from the revision after it.
        let snapshot = self
            .timed(
                client
                    .clone()
                    .get(self.keys.all(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let revision = snapshot
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let mut holders = std::collections::BTreeMap::new();
        for kv in snapshot.kvs() {
            let (Ok(key), Ok(value)) = (kv.key_str(), kv.value_str()) else {
                continue;
            };
            if let Some(("leader", group)) = self.keys.parse(key) {
                holders.insert(
                    group.to_owned(),
                    (
                        value == self.cfg.node && kv.lease() == lease,
                        kv.create_revision(),
                    ),
                );
            } else {
                self.event(key, Some(value), kv.mod_revision()).await?;
            }
        }
        self.tell(FleetEvent::Reachable(true)).await?;
        info!(
            "fleet: connected to etcd as node {} (lease {lease:x}, revision {revision})",
            self.cfg.node
        );
        if let Some(r) = self.record.clone() {
            self.write_record(&mut client, &r, lease).await?;
        }
        for group in self.groups.clone() {
            match holders.get(&group) {
                Some(&(true, rev)) => {
                    self.leading.insert(group.clone(), rev);
                    self.tell(FleetEvent::Leading {
                        group,
                        revision: rev,
                    })
                    .await?;
                }
                Some(_) => {}
                None => self.campaign(&mut client, &group, lease).await?,
            }
        }
        let mut watch = self
            .timed(
                client.clone().watch(
                    self.keys.all(),
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(revision + 1),
                    ),
                ),
            )
            .await?;
        let mut tick = tokio::time::interval(self.cfg.lease_ttl / 3);
        loop {
            tokio::select! {
                msg = watch.message() => {
                    let Some(resp) = msg? else {
                        return Err(SessionError::Lost("the watch ended".into()));
                    };
                    if resp.canceled() {
                        return Err(SessionError::Lost(format!(
                            "the watch was cancelled: {}", resp.cancel_reason()
                        )));
                    }
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let Ok(key) = kv.key_str() else { continue };
                        match (ev.event_type(), self.keys.parse(key)) {
                            (EventType::Delete, Some(("leader", group))) => {
                                let group = group.to_owned();
                                if self.leading.remove(&group).is_some() {
                                    self.tell(FleetEvent::NotLeading(group.clone())).await?;
                                }
                                if self.groups.contains(&group) {
                                    self.campaign(&mut client, &group, lease).await?;
                                }
                            }
                            (EventType::Delete, Some(("override", _))) => {
                                self.event(key, None, kv.mod_revision()).await?;
                            }
                            (EventType::Put, _) => {
                                let value = kv.value_str().unwrap_or_default().to_owned();
                                self.event(key, Some(&value), kv.mod_revision()).await?;
                            }
                            _ => {}
                        }
                    }
                }
                msg = out.recv() => {
                    let Some(m) = msg else { return Err(SessionError::Stopped) };
                    self.write(&mut client, m, lease).await?;
                }
                _ = tick.tick() => {
                    self.timed(keeper.keep_alive()).await?;
                    match self.timed(alive.message()).await? {
                        Some(r) if r.ttl() > 0 => {}
                        _ => {
                            self.lease = None;
                            return Err(SessionError::Lost("the lease expired".into()));
                        }
                    }
                }
            }
        }
    }

    /// Tries to become the leader of `group`: creates its election key under `lease` if no one
    /// holds it.
    async fn campaign(
        &mut self,
        client: &mut Client,
        group: &str,
        lease: i64,
    ) -> Result<(), SessionError> {
        let txn = campaign_txn(&self.keys, &self.cfg.node, group, lease);
        let resp = self.timed(client.txn(txn)).await?;
        if resp.succeeded() {
            let revision = resp
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
            info!("fleet: this node leads decision group {group} (election revision {revision})");
            self.leading.insert(group.to_owned(), revision);
            self.tell(FleetEvent::Leading {
                group: group.to_owned(),
                revision,
            })
            .await?;
        }
        Ok(())
    }

    /// A key's value (`None`: deleted) as an event for the loop.
    async fn event(
        &mut self,
        key: &str,
        value: Option<&str>,
        revision: i64,
    ) -> Result<(), SessionError> {
        let ev = match (self.keys.parse(key), value) {
            (Some(("decision", group)), Some(v)) => match serde_json::from_str(v) {
                Ok(decision) => FleetEvent::Decision {
                    group: group.to_owned(),
                    revision,
                    decision,
                },
                Err(e) => {
                    warn!("fleet: {key}: not a decision: {e}");
                    return Ok(());
                }
            },
            (Some(("config", "shared")), Some(v)) => match serde_json::from_str(v) {
                Ok(doc) => FleetEvent::Config { revision, doc },
                Err(e) => {
                    warn!("fleet: {key}: not a shared config: {e}");
                    return Ok(());
                }
            },
            (Some(("state", name)), Some(v)) => FleetEvent::State {
                name: name.to_owned(),
                value: v.to_owned(),
            },
            (Some(("override", group)), v) => FleetEvent::Override {
                group: group.to_owned(),
                doc: match v.map(serde_json::from_str::<OverrideDoc>) {
                    None => None,
                    Some(Ok(d)) => Some(d),
                    Some(Err(e)) => {
                        warn!("fleet: {key}: not an override: {e}");
                        return Ok(());
                    }
                },
            },
            _ => return Ok(()),
        };
        self.tell(ev).await
    }

    async fn write_record(
        &self,
        client: &mut Client,
        r: &NodeRecord,
        lease: i64,
    ) -> Result<(), SessionError> {
        let json = serde_json::to_string(r).unwrap_or_default();
        self.timed(client.put(
            self.keys.node(&self.cfg.node),
            json,
            Some(PutOptions::new().with_lease(lease)),
        ))
        .await?;
        Ok(())
    }

    /// The compare-and-set of the shared config; `reply` gets the new revision or why not.
    async fn write_config(
        &self,
        client: &mut Client,
        doc: &SharedConfig,
        expected: i64,
        reply: Reply<i64>,
    ) -> Result<(), SessionError> {
        let r = self
            .timed(client.txn(config_txn(&self.keys, doc, expected)))
            .await;
        let answer = match &r {
            Ok(resp) if resp.succeeded() => Ok(resp
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision)),
            Ok(resp) => {
                let now = resp.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Get(g) => {
                        g.kvs().first().map(etcd_client::KeyValue::mod_revision)
                    }
                    _ => None,
                });
                Err(format!(
                    "the fleet's shared config changed meanwhile (revision {} where this node \
                     saw {expected}); nothing was written: apply again",
                    now.unwrap_or(0)
                ))
            }
            Err(e) => Err(format!("etcd: {e}; the running config stays")),
        };
        let _ = reply.send(answer);
        r?;
        Ok(())
    }

    async fn write(
        &mut self,
        client: &mut Client,
        m: FleetOut,
        lease: i64,
    ) -> Result<(), SessionError> {
        match m {
            FleetOut::Groups(groups) => {
                let new: Vec<String> = groups
                    .iter()
                    .filter(|g| !self.groups.contains(g))
                    .cloned()
                    .collect();
                self.groups = groups;
                for g in new {
                    self.campaign(client, &g, lease).await?;
                }
            }
            FleetOut::Record(r) => {
                self.write_record(client, &r, lease).await?;
                self.record = Some(r);
            }
            FleetOut::Resign(done) => {
                let revoked = self.timed(client.lease_revoke(lease)).await;
                if let Err(e) = &revoked {
                    warn!("fleet: revoking the lease on exit: {e}; it expires by itself");
                } else {
                    info!("fleet: lease revoked; this node's elections are over");
                }
                self.lease = None;
                let _ = done.send(());
                return Err(SessionError::Stopped);
            }
            FleetOut::Publish { group, decision } => {
                let txn = publish_txn(&self.keys, &self.cfg.node, &group, &decision);
                let resp = self.timed(client.txn(txn)).await?;
                if !resp.succeeded() {
                    let holder = resp.op_responses().into_iter().find_map(|r| match r {
                        TxnOpResponse::Get(g) => g
                            .kvs()
                            .first()
                            .and_then(|kv| kv.value_str().ok().map(str::to_owned)),
                        _ => None,
                    });
                    warn!(
                        "fleet: decision of group {group} not published: this node's election \
                         (revision {}) is over (leader now {})",
                        decision.election_revision,
                        holder.as_deref().unwrap_or("none")
                    );
                    self.leading.remove(&group);
                    self.tell(FleetEvent::NotLeading(group.clone())).await?;
                    if holder.is_none() {
                        self.campaign(client, &group, lease).await?;
                    }
                }
            }
            FleetOut::SetState { name, value, reply } => {
                let r = self
                    .timed(client.put(self.keys.state(&name), value, None))
                    .await;
                let failed = r.as_ref().err().map(ToString::to_string);
                let _ = reply.send(match &failed {
                    None => Ok(true),
                    Some(e) => Err(format!("etcd: {e}")),
                });
                r?;
            }
            FleetOut::Config {
                doc,
                expected,
                reply,
            } => self.write_config(client, &doc, expected, reply).await?,
            FleetOut::Override { group, doc, reply } => {
                let key = self.keys.override_key(&group);
                let r = match doc {
                    Some(d) => {
                        let json = serde_json::to_string(&d).unwrap_or_default();
                        self.timed(client.put(key, json, None)).await.map(|_| ())
                    }
                    None => self.timed(client.delete(key, None)).await.map(|_| ()),
                };
                let failed = r.as_ref().err().map(ToString::to_string);
                let _ = reply.send(match &failed {
                    None => Ok(None),
                    Some(e) => Err(format!("etcd: {e}")),
                });
                r?;
            }
        }
        Ok(())
    }
}

/// One node's line in `switchyard fleet status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeView {
    /// The node.
    pub node: String,
    /// What it recorded.
    pub record: NodeRecord,
    /// Groups whose published decision is newer than the one the node runs.
    pub behind: Vec<String>,
    /// Generations behind the newest one in the fleet.
    pub generations_behind: u64,
    /// Whether the node runs another shared config than etcd's (an older one, or none: its
    /// local files do not combine with it, or it has not caught up yet).
    pub config_behind: bool,
}

/// One group's line in `switchyard fleet status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupView {
    /// The group.
    pub group: String,
    /// Its leader (`None`: no one holds the election key).
    pub leader: Option<String>,
    /// The revision of its published decision.
    pub revision: Option<i64>,
    /// The published action.
    pub action: Option<Action>,
}

/// What `switchyard fleet status` shows, read from etcd.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetView {
    /// The revision of the fleet's shared config, its hash, and the node that wrote it
    /// (`None`: no node wrote one yet).
    pub config: Option<(i64, String, String)>,
    /// Every group that has a leader or a published decision.
    pub groups: Vec<GroupView>,
    /// Every node with a live record.
    pub nodes: Vec<NodeView>,
}

/// Reads the fleet's convergence from etcd.
///
/// # Errors
///
/// etcd could not be reached or did not answer within `cfg.request_timeout`.
pub async fn view(cfg: &Fleet) -> Result<FleetView, String> {
    let keys = Keys::new(&cfg.prefix);
    // A one-off read, not on a decision's path: a fresh connection's first request may take
    // longer than the agents' `request_timeout`.
    let request = cfg.request_timeout.max(Duration::from_secs(2));
    let options = options(cfg, request)?;
    let (mut c, _) = connect(&cfg.endpoints, 0, &options, request)
        .await
        .map_err(|e| format!("etcd: {e}"))?;
    let got = tokio::time::timeout(
        request,
        c.get(keys.all(), Some(GetOptions::new().with_prefix())),
    )
    .await
    .map_err(|_| format!("etcd did not answer within {request:?}"))?
    .map_err(|e| format!("etcd: {e}"))?;
    let mut leaders = std::collections::BTreeMap::new();
    let mut decisions = std::collections::BTreeMap::new();
    let mut records = Vec::new();
    let mut config = None;
    for kv in got.kvs() {
        let (Ok(key), Ok(value)) = (kv.key_str(), kv.value_str()) else {
            continue;
        };
        match keys.parse(key) {
            Some(("leader", g)) => {
                leaders.insert(g.to_owned(), value.to_owned());
            }
            Some(("decision", g)) => {
                if let Ok(d) = serde_json::from_str::<PublishedDecision>(value) {
                    decisions.insert(g.to_owned(), (kv.mod_revision(), d));
                }
            }
            Some(("node", n)) => {
                if let Ok(r) = serde_json::from_str::<NodeRecord>(value) {
                    records.push((n.to_owned(), r));
                }
            }
            Some(("config", "shared")) => {
                if let Ok(d) = serde_json::from_str::<SharedConfig>(value) {
                    config = Some((kv.mod_revision(), d.hash, d.written_by));
                }
            }
            _ => {}
        }
    }
    let newest = records.iter().map(|(_, r)| r.generation).max().unwrap_or(0);
    let mut names: std::collections::BTreeSet<String> = leaders.keys().cloned().collect();
    names.extend(decisions.keys().cloned());
    let groups = names
        .iter()
        .map(|g| {
            let d = decisions.get(g);
            GroupView {
                group: g.clone(),
                leader: leaders.get(g).cloned(),
                revision: d.map(|(r, _)| *r),
                action: d.map(|(_, d)| d.action.clone()),
            }
        })
        .collect();
    let nodes = records
        .into_iter()
        .map(|(node, record)| NodeView {
            behind: decisions
                .iter()
                .filter(|(g, (rev, _))| record.decisions.get(*g).is_none_or(|r| r < rev))
                .map(|(g, _)| g.clone())
                .collect(),
            generations_behind: newest.saturating_sub(record.generation),
            config_behind: config
                .as_ref()
                .is_some_and(|(rev, _, _)| record.config_revision != Some(*rev)),
            node,
            record,
        })
        .collect();
    Ok(FleetView {
        config,
        groups,
        nodes,
    })
}
