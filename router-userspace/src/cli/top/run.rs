//! The terminal and the polling of `switchyard top`: a thread polls the API once a second and
//! hands each [`Sample`] (or [`PollError`]) to the drawing loop, which reads keys in between.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use super::{Counters, Flow, Group, Key, PollError, Sample, View, groups_of, switches};
use crate::{
    api::status::Status,
    cli::{LocateError, Target, locate},
    record,
};

/// How often the API is polled.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// How long one request may take before the poll counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Why `top` ended other than by `q`.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// The agent cannot be asked from here.
    #[error(transparent)]
    Locate(#[from] LocateError),
    /// The agent went away, refused `top`, or stopped answering.
    #[error("lost the agent at {url} (from {from}): {why}")]
    Lost {
        /// The API's base URL.
        url: String,
        /// Where the address came from.
        from: String,
        /// What happened.
        why: String,
    },
    /// The terminal could not be set up or drawn on.
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
}

/// `e` and each of its causes (`… : tcp connect error: Connection refused`).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// `GET path` of the agent as text.
async fn get(c: &reqwest::Client, target: &Target, path: &str) -> Result<String, PollError> {
    let url = format!("{}{path}", target.base);
    let req = target
        .authorize(c.get(&url).timeout(REQUEST_TIMEOUT))
        .map_err(|e| PollError::Refused(format!("agent.api_token_file: {e}")))?;
    let resp = req.send().await.map_err(|e| {
        if e.is_connect() {
            PollError::Gone(format!("GET {url}: {}", with_causes(&e)))
        } else {
            PollError::Failed(format!("GET {url}: {}", with_causes(&e)))
        }
    })?;
    if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
        let body = resp.text().await.unwrap_or_default();
        return Err(PollError::Refused(crate::cli::refusal(&body)));
    }
    if !resp.status().is_success() {
        return Err(PollError::Failed(format!("GET {url}: {}", resp.status())));
    }
    resp.text()
        .await
        .map_err(|e| PollError::Failed(format!("GET {url}: {e}")))
}

/// One poll: `/status`, `/metrics`, `/explain/{group}` of each group, `/decisions`.
async fn poll(c: &reqwest::Client, target: &Target) -> Result<Sample, PollError> {
    let status: Status = serde_json::from_str(&get(c, target, "/status").await?)
        .map_err(|e| PollError::Failed(format!("/status: {e}")))?;
    let metrics = get(c, target, "/metrics").await?;
    let at = Instant::now();
    let mut groups = Vec::new();
    // A group the agent cannot explain is shown with why, rather than failing the poll: the
    // services and pools still matter.
    for g in groups_of(&status) {
        let explained = match get(c, target, &format!("/explain/{g}")).await {
            Ok(text) => Group::parse(&g, &text),
            Err(PollError::Failed(why)) => Err(why),
            Err(lost) => return Err(lost),
        };
        groups.push(explained.unwrap_or_else(|why| Group::unexplained(&g, &why)));
    }
    let switches = if groups.is_empty() {
        Vec::new()
    } else {
        switches(&get(c, target, "/decisions").await?).map_err(PollError::Failed)?
    };
    Ok(Sample {
        at,
        status,
        counters: Counters::parse(&metrics),
        groups,
        switches,
    })
}

/// Polls every [`INTERVAL`] until the receiver is gone.
fn poller(target: &Target, tx: &mpsc::Sender<Result<Sample, PollError>>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = tx.send(Err(PollError::Gone(format!("starting the runtime: {e}"))));
            return;
        }
    };
    rt.block_on(async {
        let c = reqwest::Client::new();
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if tx.send(poll(&c, target).await).is_err() {
                return;
            }
        }
    });
}

/// A crossterm key as the view's [`Key`], for a press (not a release or repeat).
fn key_of(e: &Event) -> Option<Key> {
    let Event::Key(k) = e else { return None };
    if k.kind != KeyEventKind::Press {
        return None;
    }
    match k.code {
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Some(Key::Interrupt),
        KeyCode::Char(c) => Some(Key::Char(c)),
        KeyCode::Esc => Some(Key::Esc),
        KeyCode::Enter => Some(Key::Enter),
        KeyCode::Backspace => Some(Key::Backspace),
        _ => None,
    }
}

/// Runs `switchyard top` for the agent serving `dir` (found by [`locate`]; `api` overrides)
/// until `q`, Esc or Control-C (`Ok`), or until the agent is lost (`Err`, after the terminal is
/// restored, for the caller to print).
///
/// # Errors
///
/// [`TopError::Locate`] when the agent cannot be asked from here; [`TopError::Lost`] when its
/// connection is refused, it refuses the token, or [`super::MAX_FAILED_POLLS`] polls in a row
/// fail; [`TopError::Terminal`] when the terminal cannot be used.
pub fn run(dir: &Path, api: Option<&str>) -> Result<(), TopError> {
    let target = locate(dir, api, Path::new(record::RUN_DIR))?;
    let lost = |why: String| TopError::Lost {
        url: target.base.clone(),
        from: target.from.clone(),
        why,
    };
    let (tx, rx) = mpsc::channel();
    {
        let target = target.clone();
        std::thread::spawn(move || poller(&target, &tx));
    }
    // The first poll decides before the screen is taken: an agent that is not there is an
    // error on a plain terminal.
    let mut view = View::new();
    loop {
        match rx.recv() {
            Ok(Ok(sample)) => {
                view.update(sample);
                break;
            }
            Ok(Err(e)) => {
                if let Some(why) = view.failed(e) {
                    return Err(lost(why));
                }
            }
            Err(_) => return Err(lost("the poller stopped".into())),
        }
    }
    let mut terminal = ratatui::try_init()?;
    let ended = screen(&mut terminal, &mut view, &rx, &target.base);
    ratatui::try_restore()?;
    ended?.map_err(lost)
}

/// Draws and handles keys until `q` (`Ok(Ok)`) or a lost agent (`Ok(Err(why))`).
fn screen(
    terminal: &mut ratatui::DefaultTerminal,
    view: &mut View,
    rx: &mpsc::Receiver<Result<Sample, PollError>>,
    base: &str,
) -> std::io::Result<Result<(), String>> {
    loop {
        loop {
            match rx.try_recv() {
                Ok(Ok(sample)) => view.update(sample),
                Ok(Err(e)) => {
                    if let Some(why) = view.failed(e) {
                        return Ok(Err(why));
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Ok(Err("the poller stopped".into()));
                }
            }
        }
        terminal.draw(|f| super::draw::draw(f, view, base))?;
        if event::poll(Duration::from_millis(100))?
            && let Some(key) = key_of(&event::read()?)
            && view.key(key) == Flow::Quit
        {
            return Ok(Ok(()));
        }
    }
}
