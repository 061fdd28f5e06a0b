//! Adaptive weights (`pools[].weights.adaptive`): each backend's weight follows what its health
//! check and its agent say, computed from samples the runtime records, at engine times it
//! gives (no clock here).
//!
//! Every `interval`, for each backend of the pool:
//!
//! ```text
//! W_new = base × (alpha + beta·pass_rate + gamma·latency_score + delta·agent_score)
//! W     = max(smoothing·W_prev + (1 − smoothing)·W_new,  W_prev·(1 − max_decrease_per_second·Δt))
//! ```
//!
//! Each term is a share of the configured weight `base`: the coefficients add up to 1
//! (validation), so a backend whose scores are all 1 keeps `base`, and one whose scores are all
//! 0 keeps `alpha·base`. The scores, each 0 to 1:
//!
//! - `pass_rate`: passed / all probes of its health check within `window`; 1 without probes.
//! - `latency_score`: `min_p99 / p99`, where `p99` is the round-trip time of its passed probes
//!   within `window` and `min_p99` the lowest of the pool's: the fastest backend scores 1. A
//!   backend without passed probes in the window scores 1 (neutral: its pass rate already
//!   says it fails).
//! - `agent_score`: the agent's last `NN%` as NN/100; 1 until the agent answers one.
//!
//! `Δt` is the time since the pool's previous computation: a weight falls by at most
//! `max_decrease_per_second` of its value per second, so one slow probe cannot empty a
//! backend; it rises without limit (slow start ramps a backend that joins the table).
//! `W_prev` starts at `base`.
//!
//! The table is given each backend's weight `W` as of the last computation that moved some
//! backend of the pool by `tolerance` or more of the weight it was last given ([`Weights::compute`]
//! says whether): smaller moves rebuild nothing. Its integer weight ([`BackendWeights::table_weight`])
//! is `W` rounded, at least 1 while `base > 0`, and 0 while its agent says `drain`, `maint` or
//! `down` (at once, not at the next computation; the computation goes on underneath).

pub mod answer;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, VecDeque},
    net::IpAddr,
    time::Duration,
};

pub use answer::{Admin, Answer, AnswerError};

use crate::config::{Adaptive, Pool};

/// The most probes kept per backend (the oldest leave first): a `window` of 5 minutes at a
/// 100 ms health check interval is 3,000.
pub const MAX_SAMPLES: usize = 4_096;

/// One probe of a backend's health check.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Probe {
    /// Engine time.
    at: Duration,
    passed: bool,
    rtt: Duration,
}

/// What a backend's agent said, as it stands after every answer so far.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct AgentState {
    /// The last line answered, as read.
    pub last: Option<String>,
    /// Why the last connection or answer failed, until one succeeds (the state stands).
    pub error: Option<String>,
    /// `NN%` as a share, 1 until an answer has one.
    pub score: Option<f64>,
    /// `ready`, `drain` or `maint` (`ready` until an answer says otherwise).
    pub admin: Admin,
    /// `down` until `up`.
    pub down: bool,
    /// Engine time of the last answer that was read.
    #[serde(skip)]
    pub at: Option<Duration>,
}

impl AgentState {
    /// Whether the agent holds the backend out of the table (`drain`, `maint`, `down`).
    #[must_use]
    pub fn holds_out(&self) -> bool {
        self.admin != Admin::Ready || self.down
    }
}

/// One backend's adaptive weight.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendWeights {
    /// Address.
    pub address: IpAddr,
    /// The configured weight.
    pub base: u32,
    probes: VecDeque<Probe>,
    /// Its agent's answers.
    pub agent: AgentState,
    /// `W` of the last computation (`base` before the first).
    pub computed: f64,
    /// `W` as last given to the table.
    pub given: f64,
    /// Engine time [`table_weight`](Self::table_weight) last changed (`None`: never).
    pub changed_at: Option<Duration>,
    /// The scores of the last computation: pass rate, RTT p99 (`None`: no passed probe),
    /// latency score.
    pub pass_rate: f64,
    /// See `pass_rate`.
    pub rtt_p99: Option<Duration>,
    /// See `pass_rate`.
    pub latency_score: f64,
}

impl BackendWeights {
    fn new(address: IpAddr, base: u32) -> Self {
        let w = f64::from(base);
        Self {
            address,
            base,
            probes: VecDeque::new(),
            agent: AgentState::default(),
            computed: w,
            given: w,
            changed_at: None,
            pass_rate: 1.0,
            rtt_p99: None,
            latency_score: 1.0,
        }
    }

    /// The weight its pool's table is built with: `given` rounded, at least 1 while `base > 0`;
    /// 0 with `base` 0 or while its agent holds it out.
    #[must_use]
    pub fn table_weight(&self) -> u32 {
        if self.base == 0 || self.agent.holds_out() {
            return 0;
        }
        let max = f64::from(crate::config::model::MAX_WEIGHT);
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "clamped to 1..=MAX_WEIGHT first (a NaN clamps to NaN, which casts to 0 and \
                      is then raised to 1)"
        )]
        let w = self.given.round().clamp(1.0, max) as u32;
        w.max(1)
    }

    /// Forgets probes older than `window` before `now`.
    fn prune(&mut self, now: Duration, window: Duration) {
        let since = now.saturating_sub(window);
        while self.probes.front().is_some_and(|p| p.at < since) {
            self.probes.pop_front();
        }
    }

    fn score_pass_rate(&self) -> f64 {
        let passed = self.probes.iter().filter(|p| p.passed).count();
        #[expect(
            clippy::cast_precision_loss,
            reason = "at most MAX_SAMPLES probes, exact in an f64"
        )]
        match self.probes.len() {
            0 => 1.0,
            n => passed as f64 / n as f64,
        }
    }

    /// The p99 (nearest rank) of the passed probes' round-trip times.
    fn p99(&self) -> Option<Duration> {
        let mut rtts: Vec<Duration> = self
            .probes
            .iter()
            .filter(|p| p.passed)
            .map(|p| p.rtt)
            .collect();
        rtts.sort_unstable();
        // ceil(n · 0.99) in integers: the nearest rank, 1-based.
        let rank = (rtts.len() * 99).div_ceil(100);
        rtts.get(rank.checked_sub(1)?).copied()
    }
}

/// One pool's adaptive weights.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolWeights {
    /// Its `weights.adaptive`.
    pub params: Adaptive,
    /// Its backends, in configuration order.
    pub backends: Vec<BackendWeights>,
    /// Engine time of the last computation, or when the pool was configured before the first.
    pub computed_at: Duration,
}

impl PoolWeights {
    /// When the next computation is due.
    #[must_use]
    pub fn due(&self) -> Duration {
        self.computed_at.saturating_add(self.params.interval)
    }

    /// Computes every backend's `W` at `now` (see the module's doc); returns whether the table
    /// is to be rebuilt: some backend moved by `tolerance` or more of the weight it was last
    /// given. Then every backend's `given` becomes its `W`.
    pub fn compute(&mut self, now: Duration) -> bool {
        let p = &self.params;
        let elapsed = now.saturating_sub(self.computed_at).as_secs_f64();
        self.computed_at = now;
        for b in &mut self.backends {
            b.prune(now, p.window);
            b.pass_rate = b.score_pass_rate();
            b.rtt_p99 = b.p99();
        }
        let fastest = self.backends.iter().filter_map(|b| b.rtt_p99).min();
        let mut rebuild = false;
        for b in &mut self.backends {
            b.latency_score = match (b.rtt_p99, fastest) {
                (Some(p99), Some(min)) if !p99.is_zero() => min.as_secs_f64() / p99.as_secs_f64(),
                _ => 1.0,
            };
            let agent = b.agent.score.unwrap_or(1.0);
            let share =
                p.alpha + p.beta * b.pass_rate + p.gamma * b.latency_score + p.delta * agent;
            let fresh = f64::from(b.base) * share;
            let prev = b.computed;
            let smoothed = p.smoothing * prev + (1.0 - p.smoothing) * fresh;
            let floor = prev * (1.0 - p.max_decrease_per_second * elapsed).max(0.0);
            b.computed = smoothed.max(floor);
            let moved = if b.given == 0.0 {
                b.computed != 0.0
            } else {
                ((b.computed - b.given) / b.given).abs() >= p.tolerance
            };
            rebuild |= moved;
        }
        if rebuild {
            for b in &mut self.backends {
                let before = b.table_weight();
                b.given = b.computed;
                if b.table_weight() != before {
                    b.changed_at = Some(now);
                }
            }
        }
        rebuild
    }

    fn backend(&mut self, address: IpAddr) -> Option<&mut BackendWeights> {
        self.backends.iter_mut().find(|b| b.address == address)
    }
}

/// Every pool's adaptive weights.
#[derive(Clone, Debug, Default)]
pub struct Weights {
    pools: BTreeMap<String, PoolWeights>,
}

impl Weights {
    /// No pool.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the pools of a new configuration at `now`: a backend its pool keeps (with adaptive
    /// weights still) keeps its probes, agent state and weight, with its new `base`; a new one
    /// starts at its `base`; pools without adaptive weights are forgotten. A pool that keeps
    /// adaptive weights keeps its schedule; a new one computes first `interval` after `now`.
    pub fn configure(&mut self, pools: &[Pool], now: Duration) {
        let mut old = std::mem::take(&mut self.pools);
        for pool in pools {
            let Some(params) = &pool.adaptive else {
                continue;
            };
            let mut before = old.remove(&pool.name);
            let backends = pool
                .backends
                .iter()
                .map(|b| {
                    let kept = before.as_mut().and_then(|p| {
                        let i = p.backends.iter().position(|k| k.address == b.address)?;
                        Some(p.backends.swap_remove(i))
                    });
                    match kept {
                        Some(k) if k.base == b.weight => k,
                        Some(mut k) => {
                            // A new base scales what was computed from the old one.
                            let scale = if k.base == 0 {
                                1.0
                            } else {
                                f64::from(b.weight) / f64::from(k.base)
                            };
                            k.base = b.weight;
                            k.computed = if k.computed == 0.0 {
                                f64::from(b.weight)
                            } else {
                                k.computed * scale
                            };
                            k.given = k.computed;
                            k
                        }
                        None => BackendWeights::new(b.address, b.weight),
                    }
                })
                .collect();
            let computed_at = before.map_or(now, |p| p.computed_at);
            self.pools.insert(
                pool.name.clone(),
                PoolWeights {
                    params: params.clone(),
                    backends,
                    computed_at,
                },
            );
        }
    }

    /// One probe of `address` in `pool` at `now`: passed or not, and its round-trip time.
    pub fn record_probe(
        &mut self,
        pool: &str,
        address: IpAddr,
        passed: bool,
        rtt: Duration,
        now: Duration,
    ) {
        let Some(p) = self.pools.get_mut(pool) else {
            return;
        };
        let window = p.params.window;
        if let Some(b) = p.backend(address) {
            if b.probes.len() >= MAX_SAMPLES {
                b.probes.pop_front();
            }
            b.probes.push_back(Probe {
                at: now,
                passed,
                rtt,
            });
            b.prune(now, window);
        }
    }

    /// What the agent of `address` in `pool` answered at `now`: the line read, or why there
    /// was none. A failed connection or a refused line leaves the state as it was (`HAProxy`
    /// does not take an agent's failure for the backend's). Returns whether the backend's
    /// table weight changed (it entered or left `drain`, `maint` or `down`): the pool's table
    /// is to be rebuilt now.
    pub fn record_agent(
        &mut self,
        pool: &str,
        address: IpAddr,
        read: Result<Vec<u8>, String>,
        now: Duration,
    ) -> bool {
        let Some(b) = self.pools.get_mut(pool).and_then(|p| p.backend(address)) else {
            return false;
        };
        let line = match read {
            Ok(line) => line,
            Err(e) => {
                b.agent.error = Some(e);
                return false;
            }
        };
        let answer = match answer::parse(&line) {
            Ok(a) => a,
            Err(e) => {
                b.agent.error = Some(format!("{e}: {:?}", String::from_utf8_lossy(&line).trim()));
                return false;
            }
        };
        let before = b.table_weight();
        let a = &mut b.agent;
        a.last = Some(String::from_utf8_lossy(&line).trim().to_owned());
        a.error = None;
        a.at = Some(now);
        if let Some(p) = answer.percent {
            a.score = Some(f64::from(p) / 100.0);
        }
        if let Some(admin) = answer.admin {
            a.admin = admin;
        }
        if let Some(up) = answer.up {
            a.down = !up;
        }
        let changed = b.table_weight() != before;
        if changed {
            b.changed_at = Some(now);
        }
        changed
    }

    /// When the next computation of any pool is due.
    #[must_use]
    pub fn next_due(&self) -> Option<Duration> {
        self.pools.values().map(PoolWeights::due).min()
    }

    /// Computes every pool whose computation is due at `now`; returns the pools whose tables
    /// are to be rebuilt.
    pub fn compute_due(&mut self, now: Duration) -> Vec<String> {
        self.pools
            .iter_mut()
            .filter(|(_, p)| p.due() <= now)
            .filter_map(|(name, p)| p.compute(now).then(|| name.clone()))
            .collect()
    }

    /// The weight each backend of `pool` is to have in its table (`None`: the pool has no
    /// adaptive weights).
    #[must_use]
    pub fn table_weights(&self, pool: &str) -> Option<Vec<(IpAddr, u32)>> {
        let p = self.pools.get(pool)?;
        Some(
            p.backends
                .iter()
                .map(|b| (b.address, b.table_weight()))
                .collect(),
        )
    }

    /// One pool's weights, for `ctl weights` and the metrics.
    #[must_use]
    pub fn pool(&self, name: &str) -> Option<&PoolWeights> {
        self.pools.get(name)
    }

    /// Every pool with adaptive weights.
    #[must_use]
    pub fn pools(&self) -> &BTreeMap<String, PoolWeights> {
        &self.pools
    }
}
