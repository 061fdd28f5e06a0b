//! `metric` variables: a bool with hysteresis over a rate, pure, time injected.

use std::time::Duration;

/// Turns true once the rate has stayed above `above` for `hold`, false once it has stayed
/// below `below` for `hold`. Starts false.
#[derive(Clone, Debug, PartialEq)]
pub struct Hysteresis {
    above: f64,
    below: f64,
    hold: Duration,
    value: bool,
    /// Since when the rate has been past the threshold that would flip the value.
    since: Option<Duration>,
}

impl Hysteresis {
    /// A false value with these thresholds.
    #[must_use]
    pub fn new(above: f64, below: f64, hold: Duration) -> Self {
        Self {
            above,
            below,
            hold,
            value: false,
            since: None,
        }
    }

    /// The current value.
    #[must_use]
    pub fn value(&self) -> bool {
        self.value
    }

    /// One sample of the rate at `now`; returns the value after it.
    pub fn observe(&mut self, now: Duration, rate: f64) -> bool {
        let past = if self.value {
            rate < self.below
        } else {
            rate > self.above
        };
        if !past {
            self.since = None;
            return self.value;
        }
        let since = *self.since.get_or_insert(now);
        if now.saturating_sub(since) >= self.hold {
            self.value = !self.value;
            self.since = None;
        }
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn turns_on_after_holding_above_and_off_after_holding_below() {
        let mut h = Hysteresis::new(500.0, 200.0, s(5));
        assert!(!h.observe(s(0), 600.0));
        assert!(!h.observe(s(4), 600.0));
        assert!(h.observe(s(5), 600.0));
        // Between the thresholds: stays on.
        assert!(h.observe(s(6), 300.0));
        assert!(h.observe(s(7), 100.0));
        assert!(h.observe(s(11), 100.0));
        assert!(!h.observe(s(12), 100.0));
    }

    #[test]
    fn a_dip_restarts_the_hold() {
        let mut h = Hysteresis::new(500.0, 200.0, s(5));
        h.observe(s(0), 600.0);
        h.observe(s(3), 400.0);
        assert!(!h.observe(s(6), 600.0));
        assert!(!h.observe(s(10), 600.0));
        assert!(h.observe(s(11), 600.0));
    }
}
