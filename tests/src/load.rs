//! A steady TCP load from the client namespace, for tests that change the system under traffic:
//! `persistent` long-lived connections to the echo servers, each exchanging a payload every
//! `period` and checking the echo, plus one loop opening short connections back to back
//! (connect, name line, echo, close).
//!
//! Nothing fails the load itself: every broken exchange and every connection that could not be
//! opened is recorded as a [`Failure`] (with the phase it was seen in, the backend the
//! connection had reached and when it was opened), and the test judges them. A persistent
//! connection that broke is replaced by a new one, so the load stays at `persistent`
//! connections. The test marks the steps of its scenario with [`Load::set_phase`]; counts are
//! kept per phase.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::client::{Tally, TcpSession, payload};
use crate::netns::Netns;

/// Most phases a [`Load`] counts separately; later phases count into the last one.
pub const MAX_PHASES: usize = 8;

/// Shape of the load.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Where to connect (a VIP and the echo port).
    pub addr: SocketAddr,
    /// Long-lived connections kept open.
    pub persistent: usize,
    /// Time between two exchanges on one persistent connection (the connections are spread
    /// evenly over it).
    pub period: Duration,
    /// Bytes per exchange.
    pub payload: usize,
    /// Pause between two short connections (0: back to back).
    pub new_pause: Duration,
    /// Connect timeout of every connection, persistent or short (reads and writes time out
    /// after [`crate::client::TIMEOUT`]).
    pub connect_timeout: Duration,
}

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// An exchange on a persistent connection broke (error, timeout or wrong bytes).
    Persistent,
    /// A short connection was opened but its exchange or close broke.
    Short,
    /// A new connection (short, or a persistent one's first or replacement) could not be
    /// opened: refused, reset or timed out before the backend's name arrived.
    Refused,
}

/// One failure.
#[derive(Debug, Clone)]
pub struct Failure {
    /// What failed.
    pub kind: FailureKind,
    /// The phase in which it was seen.
    pub phase: usize,
    /// The backend the connection had reached (`None` for [`FailureKind::Refused`]).
    pub backend: Option<String>,
    /// When the connection was opened (or the attempt started).
    pub opened: Instant,
    /// When the failure was seen.
    pub at: Instant,
    /// The error, with its causes.
    pub error: String,
}

/// Counts of one phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseCounts {
    /// Exchanges that came back intact on persistent connections.
    pub exchanges: u64,
    /// Short connections opened, exchanged and closed cleanly.
    pub short_ok: u64,
    /// Connection attempts of any kind.
    pub attempts: u64,
    /// Slowest intact exchange on a persistent connection, in microseconds.
    pub max_exchange_us: u64,
}

#[derive(Default)]
struct PhaseCounters {
    exchanges: AtomicU64,
    short_ok: AtomicU64,
    attempts: AtomicU64,
    max_exchange_us: AtomicU64,
}

struct Shared {
    spec: LoadSpec,
    stop: AtomicBool,
    phase: AtomicUsize,
    phases: [PhaseCounters; MAX_PHASES],
    failures: Mutex<Vec<Failure>>,
    /// Persistent connections open right now.
    open: AtomicUsize,
    /// Short connections per backend.
    short_backends: Mutex<Tally>,
    /// Persistent connections (first and replacements) per backend.
    persistent_backends: Mutex<Tally>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn counters(&self) -> &PhaseCounters {
        let p = self.phase.load(Ordering::SeqCst).min(MAX_PHASES - 1);
        &self.phases[p]
    }

    fn fail(&self, kind: FailureKind, backend: Option<&str>, opened: Instant, e: &anyhow::Error) {
        lock(&self.failures).push(Failure {
            kind,
            phase: self.phase.load(Ordering::SeqCst),
            backend: backend.map(str::to_owned),
            opened,
            at: Instant::now(),
            error: format!("{e:#}"),
        });
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Opens a connection (in the calling thread's namespace); a failure is recorded.
    fn connect(&self) -> Option<(TcpSession, Instant)> {
        let opened = Instant::now();
        self.counters().attempts.fetch_add(1, Ordering::Relaxed);
        match TcpSession::connect_with_timeout(self.spec.addr, self.spec.connect_timeout) {
            Ok(s) => Some((s, opened)),
            Err(e) => {
                self.fail(FailureKind::Refused, None, opened, &e);
                None
            }
        }
    }

    /// Sleeps `d` in short steps; false once the load is stopping.
    fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        while !self.stopped() {
            let now = Instant::now();
            if now >= until {
                return true;
            }
            thread::sleep((until - now).min(Duration::from_millis(20)));
        }
        false
    }
}

/// A running load; [`Load::stop`] ends it and returns what happened.
pub struct Load {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
}

/// What a load saw, from [`Load::stop`].
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Counts per phase (index = phase).
    pub phases: Vec<PhaseCounts>,
    /// Every failure, in the order seen.
    pub failures: Vec<Failure>,
    /// Short connections per backend.
    pub short_backends: Tally,
    /// Persistent connections (first and replacements) per backend.
    pub persistent_backends: Tally,
    /// How long the load ran.
    pub duration: Duration,
}

impl LoadReport {
    /// The sum over all phases.
    #[must_use]
    pub fn total(&self) -> PhaseCounts {
        self.phases
            .iter()
            .fold(PhaseCounts::default(), |acc, p| PhaseCounts {
                exchanges: acc.exchanges + p.exchanges,
                short_ok: acc.short_ok + p.short_ok,
                attempts: acc.attempts + p.attempts,
                max_exchange_us: acc.max_exchange_us.max(p.max_exchange_us),
            })
    }

    /// Failures of `kind`.
    pub fn failures_of(&self, kind: FailureKind) -> impl Iterator<Item = &Failure> {
        self.failures.iter().filter(move |f| f.kind == kind)
    }
}

impl Load {
    /// Starts the load from `ns` and returns once every persistent connection has been opened
    /// (or `limit` has passed: then it fails, after stopping what it started). The short
    /// connection loop starts then too. Starts in phase 0.
    ///
    /// # Errors
    ///
    /// When a thread cannot be started in `ns`, or not every persistent connection is open
    /// within `limit` (the error gives the first failure).
    pub fn start(ns: &Netns, spec: LoadSpec, limit: Duration) -> Result<Self> {
        let shared = Arc::new(Shared {
            spec,
            stop: AtomicBool::new(false),
            phase: AtomicUsize::new(0),
            phases: Default::default(),
            failures: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            short_backends: Mutex::new(Tally::new()),
            persistent_backends: Mutex::new(Tally::new()),
        });
        let spec = &shared.spec;
        let mut load = Self {
            shared: shared.clone(),
            threads: Vec::new(),
            started: Instant::now(),
        };
        for k in 0..spec.persistent {
            let s = shared.clone();
            // Spread the connections' exchanges evenly over the period.
            #[expect(
                clippy::cast_precision_loss,
                reason = "connection counts, far below 2^52"
            )]
            let offset = spec
                .period
                .mul_f64(k as f64 / spec.persistent.max(1) as f64);
            match ns.spawn(move || persistent(&s, k, offset)) {
                Ok(t) => load.threads.push(t),
                Err(e) => {
                    load.stop();
                    return Err(e);
                }
            }
        }
        let start = Instant::now();
        while shared.open.load(Ordering::SeqCst) < spec.persistent {
            if start.elapsed() > limit {
                let open = shared.open.load(Ordering::SeqCst);
                let report = load.stop();
                bail!(
                    "only {open} of {} persistent connections opened within {limit:?}: {:?}",
                    spec.persistent,
                    report.failures.first()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        let s = shared.clone();
        match ns.spawn(move || short(&s)) {
            Ok(t) => load.threads.push(t),
            Err(e) => {
                load.stop();
                return Err(e);
            }
        }
        load.started = Instant::now();
        Ok(load)
    }

    /// Counts and failures from now on belong to phase `phase` (< [`MAX_PHASES`]).
    pub fn set_phase(&self, phase: usize) {
        self.shared.phase.store(phase, Ordering::SeqCst);
    }

    /// Persistent connections open right now.
    #[must_use]
    pub fn open(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Failures so far.
    #[must_use]
    pub fn failures(&self) -> usize {
        lock(&self.shared.failures).len()
    }

    /// Counts of `phase` so far.
    #[must_use]
    pub fn counts(&self, phase: usize) -> PhaseCounts {
        read(&self.shared.phases[phase.min(MAX_PHASES - 1)])
    }

    /// Stops the load: persistent connections close cleanly (a broken close is a failure of the
    /// current phase), threads are joined. Returns what happened.
    pub fn stop(mut self) -> LoadReport {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let duration = self.started.elapsed();
        LoadReport {
            phases: self.shared.phases.iter().map(read).collect(),
            failures: lock(&self.shared.failures).clone(),
            short_backends: lock(&self.shared.short_backends).clone(),
            persistent_backends: lock(&self.shared.persistent_backends).clone(),
            duration,
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn read(c: &PhaseCounters) -> PhaseCounts {
    PhaseCounts {
        exchanges: c.exchanges.load(Ordering::SeqCst),
        short_ok: c.short_ok.load(Ordering::SeqCst),
        attempts: c.attempts.load(Ordering::SeqCst),
        max_exchange_us: c.max_exchange_us.load(Ordering::SeqCst),
    }
}

/// One persistent connection's thread (inside the client namespace): open, then exchange every
/// period; on a failure, record it and open a replacement.
fn persistent(s: &Shared, k: usize, offset: Duration) {
    let mut seq = 0usize;
    let mut first = true;
    while !s.stopped() {
        let Some((mut session, opened)) = s.connect() else {
            if !s.sleep(Duration::from_millis(100)) {
                return;
            }
            continue;
        };
        *lock(&s.persistent_backends)
            .entry(session.backend().to_owned())
            .or_default() += 1;
        s.open.fetch_add(1, Ordering::SeqCst);
        if first {
            first = false;
            if !s.sleep(offset) {
                let _ = session.finish();
                s.open.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
        loop {
            if !s.sleep(s.spec.period) {
                // Stopping: a clean close is part of the connection's life.
                let backend = session.backend().to_owned();
                if let Err(e) = session.finish() {
                    s.fail(FailureKind::Persistent, Some(&backend), opened, &e);
                }
                s.open.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            seq += 1;
            let data = payload(k.wrapping_mul(7919).wrapping_add(seq), s.spec.payload);
            let t = Instant::now();
            match session.echo(&data) {
                Ok(()) => {
                    let c = s.counters();
                    c.exchanges.fetch_add(1, Ordering::Relaxed);
                    let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                    c.max_exchange_us.fetch_max(us, Ordering::Relaxed);
                }
                Err(e) => {
                    s.fail(FailureKind::Persistent, Some(session.backend()), opened, &e);
                    s.open.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
            }
        }
    }
}

/// The short connections' thread (inside the client namespace).
fn short(s: &Shared) {
    let mut seq = 0usize;
    while !s.stopped() {
        seq += 1;
        if let Some((mut session, opened)) = s.connect() {
            let backend = session.backend().to_owned();
            let data = payload(seq, s.spec.payload);
            match session.echo(&data).and_then(|()| session.finish()) {
                Ok(()) => {
                    s.counters().short_ok.fetch_add(1, Ordering::Relaxed);
                    *lock(&s.short_backends).entry(backend).or_default() += 1;
                }
                Err(e) => s.fail(FailureKind::Short, Some(&backend), opened, &e),
            }
        }
        if !s.spec.new_pause.is_zero() && !s.sleep(s.spec.new_pause) {
            return;
        }
    }
}
