//! The health policy of one backend: thresholds and probe spacing, as a pure state machine.
//!
//! No clock, no tokio and no randomness: the scheduler in [`super`] feeds it probe results and a
//! jitter value, so every rule here is tested without sleeping.
//!
//! Rules:
//! - [`HealthState::new`] starts **up**, as keepalived's real servers do: a pool configured at a
//!   cold start serves at once, and a dead backend is taken out after `unhealthy_threshold`
//!   failed probes (`unhealthy_threshold · interval`, about 3 s with the defaults). The agent
//!   starts every probe with [`HealthState::resume`] from the health table's verdict
//!   ([`crate::health`]): a backend a reload keeps resumes its published health, and one a
//!   reload adds to a running pool starts **down**, so only `healthy_threshold` passed probes
//!   in a row put it in service.
//! - Up → down after `unhealthy_threshold` *consecutive* failures; any success resets the count.
//! - Down → up after `healthy_threshold` *consecutive* successes; any failure resets the count.
//! - Each crossing is reported once, as a [`Transition`], by the probe that crosses it.
//! - While up (including while failing below the threshold) the next probe comes after
//!   `interval` ± 10 % jitter.
//! - While down it comes after `interval · factor^n`, capped at `backoff.max`, without jitter,
//!   where `n` counts the failures recorded since the backend went down. A success while down
//!   resets `n` to 0: the backend shows signs of life, so it is probed at `interval` until it
//!   either comes up or fails again (as `HAProxy`'s `fastinter` does for transitional states).
//!
//! Thresholds of 0 act as 1, a backoff factor below 1 (or NaN) acts as 1; config validation
//! rejects both, so this is only a guard.

use std::time::Duration;

use crate::config::HealthCheck;

/// Fraction of `interval` by which the spacing of probes to a healthy backend varies.
pub const JITTER_FRACTION: f64 = 0.1;

/// A change of a backend's health, reported by the probe that causes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transition {
    /// The backend was up and has now failed `unhealthy_threshold` probes in a row.
    Down,
    /// The backend was down and has now passed `healthy_threshold` probes in a row.
    Up,
}

/// The health of one backend and the counters that decide its next change.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthState {
    healthy: bool,
    consecutive_failures: u32,
    consecutive_successes: u32,
    /// Failures since going down (or since the last success while down): the backoff exponent.
    down_failures: u32,
    interval: Duration,
    unhealthy_threshold: u32,
    healthy_threshold: u32,
    backoff_factor: f64,
    backoff_max: Duration,
}

impl HealthState {
    /// A backend that is up, with no probe recorded yet, under `check`'s thresholds and spacing.
    #[must_use]
    pub fn new(check: &HealthCheck) -> Self {
        Self {
            healthy: true,
            consecutive_failures: 0,
            consecutive_successes: 0,
            down_failures: 0,
            interval: check.interval,
            unhealthy_threshold: check.unhealthy_threshold.max(1),
            healthy_threshold: check.healthy_threshold.max(1),
            // f64::max returns the other operand for NaN, so NaN becomes 1.
            backoff_factor: check.backoff.factor.max(1.0),
            backoff_max: check.backoff.max,
        }
    }

    /// A backend already known to be `healthy` or not (its health before the probes restarted,
    /// say on a reload), with no probe recorded yet.
    #[must_use]
    pub fn resume(check: &HealthCheck, healthy: bool) -> Self {
        Self {
            healthy,
            ..Self::new(check)
        }
    }

    /// Whether the backend currently counts as healthy.
    #[must_use]
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    /// Failed probes in a row, up to and including the last one (0 after a success).
    #[must_use]
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Passed probes in a row, up to and including the last one (0 after a failure).
    #[must_use]
    pub fn consecutive_successes(&self) -> u32 {
        self.consecutive_successes
    }

    /// Records one probe result; returns the transition it causes, if any.
    pub fn record(&mut self, success: bool) -> Option<Transition> {
        if success {
            self.consecutive_failures = 0;
            self.consecutive_successes = self.consecutive_successes.saturating_add(1);
            self.down_failures = 0;
            if !self.healthy && self.consecutive_successes >= self.healthy_threshold {
                self.healthy = true;
                return Some(Transition::Up);
            }
        } else {
            self.consecutive_successes = 0;
            self.consecutive_failures = self.consecutive_failures.saturating_add(1);
            if self.healthy {
                if self.consecutive_failures >= self.unhealthy_threshold {
                    self.healthy = false;
                    self.down_failures = 0;
                    return Some(Transition::Down);
                }
            } else {
                self.down_failures = self.down_failures.saturating_add(1);
            }
        }
        None
    }

    /// Time to wait before the next probe.
    ///
    /// `jitter` is a random value in `[-1, 1]` supplied by the caller (values outside are
    /// clamped, NaN counts as 0). While up the result is `interval · (1 + 0.1 · jitter)`; while
    /// down it is `interval · factor^n` capped at `backoff.max`, and `jitter` is ignored.
    #[must_use]
    pub fn next_delay(&self, jitter: f64) -> Duration {
        if self.healthy {
            let jitter = if jitter.is_nan() {
                0.0
            } else {
                jitter.clamp(-1.0, 1.0)
            };
            let secs = self.interval.as_secs_f64() * (1.0 + JITTER_FRACTION * jitter);
            Duration::try_from_secs_f64(secs).unwrap_or(self.interval)
        } else {
            let exponent = i32::try_from(self.down_failures).unwrap_or(i32::MAX);
            let secs = self.interval.as_secs_f64() * self.backoff_factor.powi(exponent);
            // An overflow (infinite seconds) is past any cap.
            Duration::try_from_secs_f64(secs).map_or(self.backoff_max, |d| d.min(self.backoff_max))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Backoff, CheckKind};

    const INTERVAL: Duration = Duration::from_secs(1);

    fn check(unhealthy: u32, healthy: u32, factor: f64, max: Duration) -> HealthCheck {
        HealthCheck {
            kind: CheckKind::Tcp { port: 80 },
            interval: INTERVAL,
            timeout: Duration::from_millis(500),
            unhealthy_threshold: unhealthy,
            healthy_threshold: healthy,
            backoff: Backoff { factor, max },
        }
    }

    fn state(unhealthy: u32, healthy: u32) -> HealthState {
        HealthState::new(&check(unhealthy, healthy, 1.0, INTERVAL))
    }

    #[test]
    fn a_resumed_down_backend_needs_healthy_threshold_successes_to_come_up() {
        let mut s = HealthState::resume(&check(3, 2, 1.0, INTERVAL), false);
        assert!(!s.is_healthy());
        assert_eq!(feed(&mut s, &[false, true, true]), [(2, Transition::Up)]);
        let mut up = HealthState::resume(&check(3, 2, 1.0, INTERVAL), true);
        assert_eq!(up, state(3, 2));
        assert_eq!(feed(&mut up, &[true, true]), []);
    }

    /// Records `results` and returns the transitions, each with the index of its probe.
    fn feed(state: &mut HealthState, results: &[bool]) -> Vec<(usize, Transition)> {
        results
            .iter()
            .enumerate()
            .filter_map(|(i, &ok)| state.record(ok).map(|t| (i, t)))
            .collect()
    }

    fn down_state(factor: f64, max: Duration) -> HealthState {
        let mut s = HealthState::new(&check(3, 2, factor, max));
        assert_eq!(feed(&mut s, &[false; 3]), [(2, Transition::Down)]);
        s
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn starts_healthy_with_no_counts() {
        let s = state(3, 2);
        assert!(s.is_healthy());
        assert_eq!(s.consecutive_failures(), 0);
        assert_eq!(s.consecutive_successes(), 0);
    }

    #[test]
    fn successes_while_up_cause_no_transition() {
        let mut s = state(3, 2);
        assert!(feed(&mut s, &[true; 10]).is_empty());
        assert!(s.is_healthy());
    }

    #[test]
    fn goes_down_exactly_at_unhealthy_threshold() {
        let mut s = state(3, 2);
        assert_eq!(s.record(false), None);
        assert_eq!(s.record(false), None);
        assert!(s.is_healthy());
        assert_eq!(s.record(false), Some(Transition::Down));
        assert!(!s.is_healthy());
    }

    #[test]
    fn stays_down_without_repeating_the_transition() {
        let mut s = state(3, 2);
        assert_eq!(feed(&mut s, &[false; 20]), [(2, Transition::Down)]);
        assert!(!s.is_healthy());
        assert_eq!(s.consecutive_failures(), 20);
    }

    #[test]
    fn failure_flaps_below_threshold_never_go_down() {
        let mut s = state(3, 2);
        let flaps = [false, false, true].repeat(20);
        assert!(feed(&mut s, &flaps).is_empty());
        assert!(s.is_healthy());
    }

    #[test]
    fn comes_up_exactly_at_healthy_threshold() {
        let mut s = state(3, 2);
        feed(&mut s, &[false; 3]);
        assert_eq!(s.record(true), None);
        assert!(!s.is_healthy());
        assert_eq!(s.record(true), Some(Transition::Up));
        assert!(s.is_healthy());
        assert!(feed(&mut s, &[true; 5]).is_empty());
    }

    #[test]
    fn success_flaps_below_threshold_never_come_up() {
        let mut s = state(3, 3);
        feed(&mut s, &[false; 3]);
        let flaps = [true, true, false].repeat(20);
        assert!(feed(&mut s, &flaps).is_empty());
        assert!(!s.is_healthy());
    }

    #[test]
    fn full_cycle_reports_one_down_then_one_up() {
        let mut s = state(2, 2);
        let results = [
            true, false, true, false, false, false, true, false, true, true, true,
        ];
        assert_eq!(
            feed(&mut s, &results),
            [(4, Transition::Down), (9, Transition::Up)]
        );
    }

    #[test]
    fn thresholds_of_one_switch_on_a_single_probe() {
        let mut s = state(1, 1);
        assert_eq!(s.record(false), Some(Transition::Down));
        assert_eq!(s.record(true), Some(Transition::Up));
    }

    #[test]
    fn zero_thresholds_act_as_one() {
        let mut s = state(0, 0);
        assert_eq!(s.record(true), None);
        assert_eq!(s.record(false), Some(Transition::Down));
        assert_eq!(s.record(true), Some(Transition::Up));
    }

    #[test]
    fn up_delay_is_interval_at_zero_jitter() {
        assert_eq!(state(3, 2).next_delay(0.0), INTERVAL);
    }

    #[test]
    fn up_delay_jitter_spans_plus_minus_ten_percent() {
        let s = state(3, 2);
        assert_eq!(s.next_delay(1.0), ms(1100));
        assert_eq!(s.next_delay(-1.0), ms(900));
        assert_eq!(s.next_delay(0.5), ms(1050));
    }

    #[test]
    fn out_of_range_and_nan_jitter_are_clamped() {
        let s = state(3, 2);
        assert_eq!(s.next_delay(7.0), ms(1100));
        assert_eq!(s.next_delay(-7.0), ms(900));
        assert_eq!(s.next_delay(f64::INFINITY), ms(1100));
        assert_eq!(s.next_delay(f64::NAN), INTERVAL);
    }

    #[test]
    fn failing_below_threshold_keeps_the_up_spacing() {
        let mut s = HealthState::new(&check(3, 2, 2.0, Duration::from_secs(30)));
        feed(&mut s, &[false, false]);
        assert_eq!(s.next_delay(0.0), INTERVAL);
        assert_eq!(s.next_delay(1.0), ms(1100));
    }

    #[test]
    fn down_delay_starts_at_interval_and_grows_by_factor_per_failure() {
        let mut s = down_state(2.0, Duration::from_mins(1));
        let mut seen = vec![s.next_delay(0.0)];
        for _ in 0..4 {
            s.record(false);
            seen.push(s.next_delay(0.0));
        }
        assert_eq!(seen, [ms(1000), ms(2000), ms(4000), ms(8000), ms(16000)]);
    }

    #[test]
    fn down_delay_is_capped_at_backoff_max() {
        let mut s = down_state(3.0, ms(5000));
        feed(&mut s, &[false; 2]); // 1 s · 3² = 9 s > 5 s
        assert_eq!(s.next_delay(0.0), ms(5000));
        feed(&mut s, &[false; 10]);
        assert_eq!(s.next_delay(0.0), ms(5000));
    }

    #[test]
    fn down_delay_ignores_jitter() {
        let mut s = down_state(2.0, Duration::from_mins(1));
        s.record(false);
        assert_eq!(s.next_delay(1.0), ms(2000));
        assert_eq!(s.next_delay(-1.0), ms(2000));
    }

    #[test]
    fn endless_failures_saturate_at_max_without_overflow() {
        let mut s = down_state(2.0, Duration::from_secs(30));
        feed(&mut s, &vec![false; 5000]); // 2^5000 is infinite in f64
        assert_eq!(s.next_delay(0.0), Duration::from_secs(30));
        let mut huge = down_state(f64::MAX, Duration::MAX);
        huge.record(false);
        assert_eq!(huge.next_delay(0.0), Duration::MAX);
    }

    #[test]
    fn factor_one_means_no_backoff() {
        let mut s = down_state(1.0, INTERVAL);
        feed(&mut s, &[false; 10]);
        assert_eq!(s.next_delay(0.0), INTERVAL);
    }

    #[test]
    fn factor_below_one_or_nan_acts_as_one() {
        for factor in [0.5, 0.0, -2.0, f64::NAN] {
            let mut s = down_state(factor, Duration::from_mins(1));
            feed(&mut s, &[false; 4]);
            assert_eq!(s.next_delay(0.0), INTERVAL, "factor {factor}");
        }
    }

    #[test]
    fn success_while_down_resets_backoff_to_interval() {
        let mut s = down_state(2.0, Duration::from_mins(1));
        feed(&mut s, &[false; 3]);
        assert_eq!(s.next_delay(0.0), ms(8000));
        assert_eq!(s.record(true), None);
        assert!(!s.is_healthy());
        assert_eq!(s.next_delay(0.0), INTERVAL);
        s.record(false);
        assert_eq!(s.next_delay(0.0), ms(2000));
    }

    #[test]
    fn going_down_again_restarts_backoff_from_interval() {
        let mut s = down_state(2.0, Duration::from_mins(1));
        feed(&mut s, &[false; 4]);
        assert_eq!(feed(&mut s, &[true, true]), [(1, Transition::Up)]);
        assert_eq!(s.next_delay(0.0), INTERVAL);
        assert_eq!(feed(&mut s, &[false; 3]), [(2, Transition::Down)]);
        assert_eq!(s.next_delay(0.0), INTERVAL);
        s.record(false);
        assert_eq!(s.next_delay(0.0), ms(2000));
    }
}
