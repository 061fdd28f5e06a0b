//! Helpers for the benchmarks in `tests/benches` (how to run them and the results:
//! docs/performance.md). They measure and print; nothing here asserts on speed.
//!
//! - [`testrun`] — time an XDP program with `BPF_PROG_TEST_RUN`, and the baseline program
//! - [`flood`] — an in-kernel UDP flood generator (`BPF_PROG_TEST_RUN` in live-frames mode)
//! - [`host`] — CPU pinning, CPU and thread time counters, interface counters, the machine
//! - [`large_config`] — generated configurations of 1,000 services, 5,000 backends and 200
//!   rules, and a changed version of each

pub mod flood;
pub mod host;
pub mod large_config;
pub mod testrun;

/// Whether `cargo bench` started this binary: it passes `--bench` to `harness = false`
/// targets, `cargo test --benches` does not. The benchmarks do nothing without it, so a test
/// run over all targets stays fast.
#[must_use]
pub fn invoked_by_cargo_bench() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The value after `--name` on the command line (`cargo bench … -- --name VALUE`), parsed.
#[must_use]
pub fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let flag = format!("--{name}");
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

/// Median, minimum and maximum of a set of measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The median (the mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Summary {
    /// Summarizes `values`; all zero for an empty set.
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            f64::midpoint(v[n / 2 - 1], v[n / 2])
        };
        Self {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// The arithmetic mean; 0 for an empty set.
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    reason = "a count of measurements, far below 2^52"
)]
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[expect(
        clippy::float_cmp,
        reason = "medians and means of small whole numbers, exact in f64"
    )]
    fn summary_takes_the_middle_value() {
        let s = Summary::of(&[5.0, 1.0, 3.0]);
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 5.0));
        assert_eq!(Summary::of(&[1.0, 2.0, 4.0, 8.0]).median, 3.0);
        assert_eq!(Summary::of(&[]).median, 0.0);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
    }
}
