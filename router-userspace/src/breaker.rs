//! Each backend's L4 circuit breaker (`pools[].breaker`), as a pure state machine over engine
//! time (`Duration` since the agent started; tests inject it).
//!
//! The states are the classic breaker's (Nygard, *Release It!*; Envoy's outlier detection
//! ejects and returns hosts alike):
//! - **closed**: the backend takes its share of new flows. `failure_threshold` failures within
//!   the last `window` open it;
//! - **open**: it takes no new flows (its tracked flows stay, as in a drain), for
//!   `recovery_timeout`;
//! - **half-open**: it takes a trial share of new flows (`trial_weight` percent of its
//!   weight). `success_threshold` successes in a row close it; one failure opens it again.
//!
//! Failures are failed health-check probes and the program's signals: RSTs the backend sends
//! to NAT clients, SYNs retransmitted to it (a connection whose SYN got no answer: the "new
//! flow that never sends a second packet" every forward mode sees). Successes are passed
//! probes and, on a backend that had signals counted, a sampled second without any.

use std::{collections::VecDeque, time::Duration};

use crate::config::model::Breaker as Config;

/// Where a breaker stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Takes its share of new flows.
    #[default]
    Closed,
    /// Takes no new flows.
    Open,
    /// Takes a trial share of new flows.
    HalfOpen,
}

impl Phase {
    /// The word `status`, metrics and the audit log use.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// One backend's breaker.
#[derive(Clone, Debug)]
pub struct Breaker {
    config: Config,
    phase: Phase,
    /// When the current phase began.
    since: Duration,
    /// Times of the failures within the window, oldest first (closed only).
    failures: VecDeque<Duration>,
    /// Successes in a row (half-open only).
    successes: u32,
}

impl Breaker {
    /// A closed breaker at `now`.
    #[must_use]
    pub fn new(config: Config, now: Duration) -> Self {
        Self {
            config,
            phase: Phase::Closed,
            since: now,
            failures: VecDeque::new(),
            successes: 0,
        }
    }

    /// Its phase.
    #[must_use]
    pub const fn phase(&self) -> Phase {
        self.phase
    }

    /// When its phase began.
    #[must_use]
    pub const fn since(&self) -> Duration {
        self.since
    }

    /// Failures counted within the window (closed), as of the last call.
    #[must_use]
    pub fn failures(&self) -> usize {
        self.failures.len()
    }

    /// Takes a new config, keeping the phase (an apply that changes the thresholds).
    pub fn reconfigure(&mut self, config: Config) {
        self.config = config;
    }

    /// Counts `n` failures at `now`. Returns the new phase when it changed.
    pub fn failure(&mut self, now: Duration, n: u64) -> Option<Phase> {
        if n == 0 {
            return None;
        }
        match self.phase {
            Phase::Open => None,
            Phase::HalfOpen => Some(self.enter(Phase::Open, now)),
            Phase::Closed => {
                let threshold = usize::try_from(self.config.failure_threshold).unwrap_or(1);
                // At most `threshold` are kept: more add nothing to the decision.
                let n = usize::try_from(n).unwrap_or(usize::MAX).min(threshold);
                self.failures.extend(std::iter::repeat_n(now, n));
                self.expire(now);
                (self.failures.len() >= threshold).then(|| self.enter(Phase::Open, now))
            }
        }
    }

    /// Counts a success at `now`. Returns the new phase when it changed.
    pub fn success(&mut self, now: Duration) -> Option<Phase> {
        if self.phase != Phase::HalfOpen {
            return None;
        }
        self.successes += 1;
        if self.successes >= self.config.success_threshold {
            return Some(self.enter(Phase::Closed, now));
        }
        None
    }

    /// Moves an open breaker whose recovery timeout passed by `now` to half-open, and forgets
    /// failures older than the window. Returns the new phase when it changed.
    pub fn tick(&mut self, now: Duration) -> Option<Phase> {
        self.expire(now);
        if self.phase == Phase::Open
            && now.saturating_sub(self.since) >= self.config.recovery_timeout
        {
            return Some(self.enter(Phase::HalfOpen, now));
        }
        None
    }

    /// Closes a breaker that was about to open at `now` and may not (its pool would lose too
    /// many backends), forgetting its failures: it counts afresh.
    pub fn hold(&mut self, now: Duration) {
        self.enter(Phase::Closed, now);
    }

    /// When [`tick`](Self::tick) has something to do: an open breaker's end.
    #[must_use]
    pub fn deadline(&self) -> Option<Duration> {
        (self.phase == Phase::Open).then(|| self.since + self.config.recovery_timeout)
    }

    /// The weight a backend of weight `weight` takes in this phase: all of it closed, none
    /// open, the trial share (at least 1) half-open.
    #[must_use]
    pub fn weight(&self, weight: u32) -> u32 {
        trial(self.phase, weight, self.config.trial_weight)
    }

    fn expire(&mut self, now: Duration) {
        while self
            .failures
            .front()
            .is_some_and(|t| now.saturating_sub(*t) >= self.config.window)
        {
            self.failures.pop_front();
        }
    }

    fn enter(&mut self, phase: Phase, now: Duration) -> Phase {
        self.phase = phase;
        self.since = now;
        self.failures.clear();
        self.successes = 0;
        phase
    }
}

/// The weight a backend of weight `weight` takes in `phase`, `percent` its half-open share.
#[must_use]
pub fn trial(phase: Phase, weight: u32, percent: u32) -> u32 {
    match phase {
        Phase::Closed => weight,
        Phase::Open => 0,
        Phase::HalfOpen if weight == 0 => 0,
        Phase::HalfOpen => {
            let share = u64::from(weight) * u64::from(percent) / 100;
            u32::try_from(share).unwrap_or(weight).clamp(1, weight)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            failure_threshold: 3,
            window: Duration::from_secs(10),
            recovery_timeout: Duration::from_mins(1),
            success_threshold: 2,
            trial_weight: 10,
        }
    }

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn failures_within_the_window_open_it_and_older_ones_do_not_count() {
        let mut b = Breaker::new(config(), s(0));
        assert_eq!(b.failure(s(1), 1), None);
        assert_eq!(b.failure(s(2), 1), None);
        // The first two fell out of the window.
        assert_eq!(b.failure(s(15), 1), None);
        assert_eq!(b.failures(), 1);
        assert_eq!(b.failure(s(16), 2), Some(Phase::Open));
        assert_eq!(b.weight(100), 0);
        // An open breaker counts nothing more.
        assert_eq!(b.failure(s(17), 5), None);
    }

    #[test]
    fn it_goes_half_open_after_the_recovery_timeout_and_closes_after_successes() {
        let mut b = Breaker::new(config(), s(0));
        assert_eq!(b.failure(s(5), 3), Some(Phase::Open));
        assert_eq!(b.deadline(), Some(s(65)));
        assert_eq!(b.tick(s(64)), None);
        assert_eq!(b.success(s(64)), None, "successes while open do nothing");
        assert_eq!(b.tick(s(65)), Some(Phase::HalfOpen));
        assert_eq!(b.weight(100), 10);
        assert_eq!(b.weight(5), 1, "a trial share is at least 1");
        assert_eq!(b.success(s(66)), None);
        assert_eq!(b.success(s(67)), Some(Phase::Closed));
        assert_eq!(b.weight(100), 100);
        assert_eq!(b.deadline(), None);
    }

    #[test]
    fn a_failure_while_half_open_opens_it_again_for_a_whole_timeout() {
        let mut b = Breaker::new(config(), s(0));
        b.failure(s(0), 3);
        b.tick(s(60));
        assert_eq!(b.success(s(61)), None);
        assert_eq!(b.failure(s(62), 1), Some(Phase::Open));
        assert_eq!(b.deadline(), Some(s(122)));
        // The successes before the failure do not carry over.
        b.tick(s(122));
        assert_eq!(b.success(s(123)), None);
        assert_eq!(b.success(s(124)), Some(Phase::Closed));
    }

    #[test]
    fn a_burst_counts_as_that_many_failures() {
        let mut b = Breaker::new(config(), s(0));
        assert_eq!(b.failure(s(1), 0), None);
        assert_eq!(b.failure(s(1), u64::MAX), Some(Phase::Open));
    }
}
