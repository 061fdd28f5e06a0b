//! Hooks (`hooks:`): a command run, or an `http://` URL posted to, with the JSON of every
//! switch, health transition and rejected config change it asks for.
//!
//! The event loop never waits for a hook. Each hook has a queue of [`QUEUE`] events and a task
//! of its own that runs them one at a time, in order; the loop only offers an event to the queue
//! of each hook that asked for its kind ([`Hooks::emit`], a `try_send`). When a hook's queue is
//! full the event is dropped for that hook and counted. A run is bounded by the hook's
//! `timeout`: a command still running then is killed with its process group, a POST abandoned.
//! A run that fails or times out is logged with the hook's name and counted; it is not retried,
//! and nothing else in the agent depends on it.
//!
//! A command runs without a shell, with the event's JSON on its standard input and, when it is
//! at most [`ENV_LIMIT`] bytes, in the environment variable `SWITCHYARD_EVENT`; its standard
//! output is discarded and its standard error goes to the agent's. It succeeds when it exits
//! with status 0. A POST (`Content-Type: application/json`, no redirects, no proxy) succeeds on
//! a `2xx` status.
//!
//! Counted in `switchyard_hook_runs_total{hook, result}` (`ok`, `failed`, `timeout`, `dropped`)
//! and shown by `status` ([`HookStatus`]). A reload keeps the queue and task of every hook whose
//! definition it does not change; a hook it removes or changes stops at once (a command it runs
//! is killed, its queued events are dropped uncounted).

use std::{
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use log::warn;
use prometheus_client::metrics::{counter::Counter, family::Family};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::config::{Hook, HookEvent, HookTarget};

/// Events one hook's queue holds while it runs another; more are dropped and counted.
pub const QUEUE: usize = 64;

/// The largest event put in a command's environment (`SWITCHYARD_EVENT`), bytes; a larger
/// one (a config rejected with many problems) is on standard input only.
pub const ENV_LIMIT: usize = 32 * 1024;

/// One event, as its JSON reaches a hook: `kind` (`switch`, `health`, `config_rejected`),
/// `time` (nanoseconds since the Unix epoch), then the kind's fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A decision group's new action, written into the maps.
    Switch {
        /// When it was written, ns since the Unix epoch.
        time: u64,
        /// The group.
        group: String,
        /// The action before (`pool=dc1`, `split=dc1:95,dc1-canary:5`), `None` when the group
        /// had none.
        from: Option<String>,
        /// The action now.
        to: String,
        /// What chose it: `rule`, `default`, `override` or `kept`.
        by: String,
        /// The id of the rule that chose it, when `by` is `rule`.
        rule: Option<String>,
        /// What triggered the evaluation (`dc1_api_healthy`, `state set x=1`, `timer`, …).
        cause: String,
    },
    /// A backend's health-check verdict changed.
    Health {
        /// When the agent took it, ns since the Unix epoch.
        time: u64,
        /// The pool.
        pool: String,
        /// The backend's address.
        backend: IpAddr,
        /// `up` or `down`: the verdict before.
        from: String,
        /// `up` or `down`: the verdict now.
        to: String,
        /// What the last probe saw (`connection refused`, `status 503`).
        detail: String,
    },
    /// A change of the config refused; the running config stays.
    ConfigRejected {
        /// When, ns since the Unix epoch.
        time: u64,
        /// What asked for it: `watch`, `sighup`, `ctl apply`, `rollback to N`.
        source: String,
        /// Every problem, one an entry (`10-web.yaml:14 services[0].to.pool: unknown pool …`).
        errors: Vec<String>,
    },
}

impl Event {
    /// Which `events` word asks for it.
    #[must_use]
    pub fn kind(&self) -> HookEvent {
        match self {
            Self::Switch { .. } => HookEvent::Switch,
            Self::Health { .. } => HookEvent::Health,
            Self::ConfigRejected { .. } => HookEvent::ConfigRejected,
        }
    }

    /// `errors` of a [`Event::ConfigRejected`] from the text of a rejection: one entry a
    /// problem, a problem's indented lines (an expression's source and caret) kept with it.
    #[must_use]
    pub fn problems(text: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for line in text.lines() {
            match out.last_mut() {
                Some(last) if line.starts_with([' ', '\t']) => {
                    last.push('\n');
                    last.push_str(line);
                }
                _ if line.trim().is_empty() => {}
                _ => out.push(line.to_owned()),
            }
        }
        out
    }
}

/// One hook in `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookStatus {
    /// The hook's name.
    pub name: String,
    /// What it runs: `command PROGRAM ARGS…` or `POST URL`.
    pub runs: String,
    /// The events it gets.
    pub events: Vec<String>,
    /// Its timeout, ms.
    pub timeout_ms: u64,
    /// Events waiting in its queue.
    pub queued: usize,
    /// Runs that succeeded.
    pub ok: u64,
    /// Runs that failed (could not start, non-zero exit, a status other than `2xx`).
    pub failed: u64,
    /// Runs stopped at the timeout.
    pub timeout: u64,
    /// Events dropped because its queue was full.
    pub dropped: u64,
    /// Why its last failed or timed-out run did not succeed, if one did not.
    pub last_failure: Option<String>,
}

/// The counters of one hook: its series of `switchyard_hook_runs_total`.
#[derive(Clone, Debug)]
struct Counts {
    ok: Counter,
    failed: Counter,
    timeout: Counter,
    dropped: Counter,
}

impl Counts {
    fn of(runs: &Family<Vec<(&'static str, String)>, Counter>, hook: &str) -> Self {
        let get = |result: &str| {
            runs.get_or_create(&vec![
                ("hook", hook.to_owned()),
                ("result", result.to_owned()),
            ])
            .clone()
        };
        Self {
            ok: get("ok"),
            failed: get("failed"),
            timeout: get("timeout"),
            dropped: get("dropped"),
        }
    }
}

/// A running hook: its queue and the task that drains it (aborted when this is dropped).
struct Running {
    hook: Hook,
    queue: mpsc::Sender<Arc<str>>,
    counts: Counts,
    last_failure: Arc<Mutex<Option<String>>>,
    /// Whether the last event offered was dropped: a full queue is logged once, when it fills.
    dropping: bool,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The hooks of the running config. Owned by the event loop.
pub struct Hooks {
    running: Vec<Running>,
    runs: Family<Vec<(&'static str, String)>, Counter>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.running.iter().map(|r| &r.hook.name))
            .finish()
    }
}

impl Hooks {
    /// No hooks yet; runs are counted in `runs` (`switchyard_hook_runs_total`).
    #[must_use]
    pub fn new(runs: Family<Vec<(&'static str, String)>, Counter>) -> Self {
        Self {
            running: Vec::new(),
            runs,
        }
    }

    /// Runs `hooks` from now on: a hook whose definition is unchanged keeps its queue and task,
    /// a new or changed one starts, and one no longer there stops (its command killed). Must be
    /// called within the tokio runtime.
    pub fn configure(&mut self, hooks: &[Hook]) {
        let mut old = std::mem::take(&mut self.running);
        for hook in hooks {
            let kept = old
                .iter()
                .position(|r| r.hook == *hook)
                .map(|i| old.swap_remove(i));
            let running = kept.unwrap_or_else(|| self.start(hook.clone()));
            self.running.push(running);
        }
    }

    fn start(&self, hook: Hook) -> Running {
        let counts = Counts::of(&self.runs, &hook.name);
        let (queue, events) = mpsc::channel(QUEUE);
        let last_failure = Arc::new(Mutex::new(None));
        let task = tokio::spawn(serve(
            hook.clone(),
            events,
            counts.clone(),
            Arc::clone(&last_failure),
        ));
        Running {
            hook,
            queue,
            counts,
            last_failure,
            dropping: false,
            task,
        }
    }

    /// Offers `event` to every hook that asked for its kind, without waiting: an event a full
    /// queue cannot take is dropped for that hook and counted.
    pub fn emit(&mut self, event: &Event) {
        let kind = event.kind();
        if !self.running.iter().any(|r| r.hook.events.contains(&kind)) {
            return;
        }
        let json: Arc<str> = match serde_json::to_string(event) {
            Ok(json) => json.into(),
            Err(e) => {
                warn!("hooks: the {} event cannot be encoded: {e}", kind.name());
                return;
            }
        };
        for r in self
            .running
            .iter_mut()
            .filter(|r| r.hook.events.contains(&kind))
        {
            match r.queue.try_send(Arc::clone(&json)) {
                Ok(()) => r.dropping = false,
                Err(TrySendError::Full(_) | TrySendError::Closed(_)) => {
                    r.counts.dropped.inc();
                    if !r.dropping {
                        warn!(
                            "hook {}: {QUEUE} events wait already; dropping events until it \
                             catches up",
                            r.hook.name
                        );
                    }
                    r.dropping = true;
                }
            }
        }
    }

    /// Each hook's counters, in config order.
    #[must_use]
    pub fn status(&self) -> Vec<HookStatus> {
        self.running
            .iter()
            .map(|r| HookStatus {
                name: r.hook.name.clone(),
                runs: r.hook.target.to_string(),
                events: r.hook.events.iter().map(|e| e.name().to_owned()).collect(),
                timeout_ms: u64::try_from(r.hook.timeout.as_millis()).unwrap_or(u64::MAX),
                queued: QUEUE.saturating_sub(r.queue.capacity()),
                ok: r.counts.ok.get(),
                failed: r.counts.failed.get(),
                timeout: r.counts.timeout.get(),
                dropped: r.counts.dropped.get(),
                last_failure: r.last_failure.lock().map_or(None, |last| last.clone()),
            })
            .collect()
    }
}

/// How one run ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Failed(String),
    Timeout,
}

/// A hook's task: runs its events one at a time until its queue closes.
async fn serve(
    hook: Hook,
    mut events: mpsc::Receiver<Arc<str>>,
    counts: Counts,
    last_failure: Arc<Mutex<Option<String>>>,
) {
    let client = match &hook.target {
        HookTarget::Url(_) => match client() {
            Ok(c) => Some(c),
            Err(e) => {
                warn!("hook {}: cannot build an HTTP client: {e}", hook.name);
                None
            }
        },
        HookTarget::Command(_) => None,
    };
    while let Some(event) = events.recv().await {
        let outcome = match &hook.target {
            HookTarget::Command(argv) => command(&hook.name, argv, &event, hook.timeout).await,
            HookTarget::Url(url) => match &client {
                Some(client) => post(client, url, &event, hook.timeout).await,
                None => Outcome::Failed("no HTTP client".to_owned()),
            },
        };
        let failure = match outcome {
            Outcome::Ok => {
                counts.ok.inc();
                continue;
            }
            Outcome::Failed(why) => {
                counts.failed.inc();
                why
            }
            Outcome::Timeout => {
                counts.timeout.inc();
                format!(
                    "timed out after {}",
                    humantime::format_duration(hook.timeout)
                )
            }
        };
        warn!("hook {} ({}): {failure}", hook.name, hook.target);
        if let Ok(mut last) = last_failure.lock() {
            *last = Some(failure);
        }
    }
}

/// Kills a process group when dropped, unless disarmed: a run abandoned at its timeout, or
/// whose task is aborted, leaves nothing of the command behind.
struct ProcessGroup(Option<i32>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            // SAFETY: kill(2) with a negative pid signals the process group the child leads
            // (it was started with `process_group(0)`); no memory is involved.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
}

/// Bytes of one run's standard error that reach the log, at most; the rest is counted.
const STDERR_LIMIT: usize = 8 * 1024;
/// Bytes of one line of standard error that reach the log, at most.
const STDERR_LINE_LIMIT: usize = 512;

/// Logs a hook run's standard error ([`stderr_lines`]), each line prefixed with the hook's
/// name, then how much of it was left out.
async fn log_stderr(hook: String, stderr: tokio::process::ChildStderr) {
    let unlogged = stderr_lines(stderr, |line| log::info!("hook {hook}: {line}")).await;
    if unlogged > 0 {
        warn!(
            "hook {hook}: {unlogged} more bytes of standard error not logged (at most \
             {STDERR_LIMIT} a run, {STDERR_LINE_LIMIT} a line)"
        );
    }
}

/// Reads `input` to its end and gives `out` each line, control characters escaped, up to
/// [`STDERR_LIMIT`] bytes in all and [`STDERR_LINE_LIMIT`] a line: a chatty or hostile command
/// can neither flood the log nor forge its lines, and memory is bounded by one line. Returns
/// the bytes left out.
async fn stderr_lines(
    mut input: impl tokio::io::AsyncRead + Unpin,
    mut out: impl FnMut(&str),
) -> usize {
    use tokio::io::AsyncReadExt as _;
    let mut chunk = [0u8; 4096];
    let mut line = Vec::with_capacity(STDERR_LINE_LIMIT);
    let (mut logged, mut unlogged) = (0usize, 0usize);
    let mut emit = |line: &mut Vec<u8>, unlogged: &mut usize| {
        if logged + line.len() < STDERR_LIMIT {
            logged += line.len() + 1;
            out(&String::from_utf8_lossy(line).escape_debug().to_string());
        } else {
            *unlogged += line.len() + 1;
        }
        line.clear();
    };
    loop {
        let n = match input.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &b in &chunk[..n] {
            if b == b'\n' {
                emit(&mut line, &mut unlogged);
            } else if line.len() < STDERR_LINE_LIMIT {
                line.push(b);
            } else {
                unlogged += 1;
            }
        }
    }
    if !line.is_empty() {
        emit(&mut line, &mut unlogged);
    }
    unlogged
}

/// Runs `argv` with `event` on its standard input (and in `SWITCHYARD_EVENT`), for at most
/// `timeout`; its standard error goes to the log under hook `name` ([`log_stderr`]).
async fn command(name: &str, argv: &[String], event: &str, timeout: Duration) -> Outcome {
    use tokio::io::AsyncWriteExt as _;
    let Some((program, arguments)) = argv.split_first() else {
        return Outcome::Failed("empty command".to_owned());
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(arguments)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if event.len() <= ENV_LIMIT {
        cmd.env("SWITCHYARD_EVENT", event);
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return Outcome::Failed(format!("cannot run {program}: {e}")),
    };
    let mut group = ProcessGroup(child.id().and_then(|id| i32::try_from(id).ok()));
    // Read while the command runs (a full pipe would stall it); what it left running in the
    // background may hold the pipe open, so the reader is given a moment after the command
    // ends, then dropped.
    let stderr = child
        .stderr
        .take()
        .map(|e| tokio::spawn(log_stderr(name.to_owned(), e)));
    let stdin = child.stdin.take();
    let run = async {
        if let Some(mut stdin) = stdin {
            // A command that does not read its input may exit first: a broken pipe is its
            // business, its exit status says how it went.
            let _ = stdin.write_all(event.as_bytes()).await;
        }
        child.wait().await
    };
    let outcome = tokio::time::timeout(timeout, run).await;
    let finish_stderr = async {
        if let Some(mut reader) = stderr
            && tokio::time::timeout(Duration::from_millis(100), &mut reader)
                .await
                .is_err()
        {
            reader.abort();
        }
    };
    match outcome {
        Ok(Ok(status)) => {
            finish_stderr.await;
            // It exited: what it left running in the background is its own.
            group.0 = None;
            if status.success() {
                Outcome::Ok
            } else {
                Outcome::Failed(format!("{program}: {status}"))
            }
        }
        Ok(Err(e)) => {
            finish_stderr.await;
            Outcome::Failed(format!("waiting for {program}: {e}"))
        }
        Err(_) => {
            drop(group);
            // Reaped here, so no zombie waits for tokio's orphan reaper.
            let _ = child.wait().await;
            finish_stderr.await;
            Outcome::Timeout
        }
    }
}

/// The client of a URL hook: HTTP/1.1 only, no proxy, redirects not followed.
fn client() -> reqwest::Result<reqwest::Client> {
    crate::probe::protocols::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .retry(reqwest::retry::never())
        .user_agent(concat!("switchyard-hook/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Posts `event` to `url` for at most `timeout`; a `2xx` status is success.
async fn post(client: &reqwest::Client, url: &str, event: &str, timeout: Duration) -> Outcome {
    let request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(event.to_owned())
        .send();
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(response)) if response.status().is_success() => Outcome::Ok,
        Ok(Ok(response)) => Outcome::Failed(format!("status {}", response.status().as_u16())),
        Ok(Err(e)) => Outcome::Failed(describe(&e)),
        Err(_) => Outcome::Timeout,
    }
}

/// A reqwest error with its causes (`error sending request: … Connection refused`).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests;
