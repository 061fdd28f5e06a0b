//! Checking a pool's `weights`: the coefficients of its adaptive weights, their timing and
//! the agent-check.

use std::time::Duration;

use super::{Field, leaf, missing, required};
use crate::config::{
    model::{
        Adaptive, AgentCheck, DEFAULT_AGENT_INTERVAL, DEFAULT_AGENT_TIMEOUT,
        DEFAULT_MAX_DECREASE_PER_SECOND, DEFAULT_WEIGHT_INTERVAL, DEFAULT_WEIGHT_SMOOTHING,
        DEFAULT_WEIGHT_TOLERANCE, DEFAULT_WEIGHT_WINDOW,
    },
    report::{Item, Report, key_path},
    spec::{AdaptiveSpec, AgentCheckSpec, PoolSpec, WeightsSpec},
    values::{self, show},
};

const W: &str = "weights";
const A: &str = "weights.adaptive";

/// How far the coefficients' sum may be from 1 (they are written as decimals).
const SUM_SLACK: f64 = 1e-9;

/// `weights`: `Field::Ok(None)` when absent, `Field::Bad` when anything in it was reported.
/// `checked`: whether the pool has a health check, which adaptive weights read.
pub(super) fn weights(
    it: &Item<PoolSpec>,
    report: &mut Report,
    spec: Option<&WeightsSpec>,
    checked: bool,
) -> Field<Option<Adaptive>> {
    if it.is_broken(W) {
        return Field::Bad;
    }
    let Some(spec) = spec else {
        return Field::Absent;
    };
    let Some(adaptive_spec) = &spec.adaptive else {
        if !it.is_broken(A) {
            missing(it, report, W, "adaptive");
        }
        return Field::Bad;
    };
    let value = adaptive(it, report, adaptive_spec);
    if !checked {
        let message = "adaptive weights need the pool's health check".to_owned();
        let hint = Some(
            "they follow its pass rate and round-trip time: add a health_check, such as \
             `health_check: { tcp: { port: 80 } }`"
                .to_owned(),
        );
        it.err(report, A, message, hint);
        return Field::Bad;
    }
    match value {
        Some(a) => Field::Ok(Some(a)),
        None => Field::Bad,
    }
}

fn adaptive(it: &Item<PoolSpec>, report: &mut Report, a: &AdaptiveSpec) -> Option<Adaptive> {
    let rel = |key: &str| key_path(A, key);
    let coefficient = |value: Option<&str>, key: &str, report: &mut Report| {
        required(it, report, value, A, key, |v| values::fraction(v, key))
    };
    let alpha = coefficient(a.alpha.as_deref(), "alpha", report);
    let beta = coefficient(a.beta.as_deref(), "beta", report);
    let gamma = coefficient(a.gamma.as_deref(), "gamma", report);
    let delta = leaf(it, report, a.delta.as_deref(), &rel("delta"), |v| {
        values::fraction(v, "delta")
    })
    .or(0.0);
    // A computation at most ten times a second, at least once an hour: the recompute is a
    // deadline of the event loop and may rebuild a table.
    let interval = leaf(it, report, a.interval.as_deref(), &rel("interval"), |v| {
        values::duration_within(
            v,
            "interval",
            Duration::from_millis(100),
            Duration::from_hours(1),
        )
    })
    .or(DEFAULT_WEIGHT_INTERVAL);
    let smoothing = leaf(it, report, a.smoothing.as_deref(), &rel("smoothing"), |v| {
        values::fraction_below_one(v, "smoothing")
    })
    .or(DEFAULT_WEIGHT_SMOOTHING);
    let max_decrease = leaf(
        it,
        report,
        a.max_decrease_per_second.as_deref(),
        &rel("max_decrease_per_second"),
        |v| values::positive(v, "max_decrease_per_second"),
    )
    .or(DEFAULT_MAX_DECREASE_PER_SECOND);
    let tolerance = leaf(it, report, a.tolerance.as_deref(), &rel("tolerance"), |v| {
        values::fraction_below_one(v, "tolerance")
    })
    .or(DEFAULT_WEIGHT_TOLERANCE);
    let window = match leaf(it, report, a.window.as_deref(), &rel("window"), |v| {
        values::duration_within(
            v,
            "window",
            Duration::from_millis(100),
            Duration::from_hours(24),
        )
    }) {
        Field::Absent => Some(DEFAULT_WEIGHT_WINDOW.max(interval.unwrap_or_default())),
        Field::Bad => None,
        Field::Ok(window) => match interval {
            Some(interval) if window < interval => {
                let message = format!(
                    "window ({}) must be at least interval ({})",
                    show(window),
                    show(interval)
                );
                let hint = Some("each computation reads the probes of one window".to_owned());
                it.err(report, &rel("window"), message, hint);
                None
            }
            _ => Some(window),
        },
    };
    let agent_check = match &a.agent_check {
        _ if it.is_broken(&rel("agent_check")) => None,
        None => Some(None),
        Some(spec) => agent_check(it, report, spec).map(Some),
    };
    let delta = delta?;
    if let (Some(None), true) = (&agent_check, delta > 0.0) {
        let message =
            "delta weighs the agent-check's answers, and there is no agent_check".to_owned();
        let hint = Some("add `agent_check: { port: N }`, or leave delta out".to_owned());
        it.err(report, &rel("delta"), message, hint);
        return None;
    }
    let (alpha, beta, gamma) = (alpha?, beta?, gamma?);
    let sum = alpha + beta + gamma + delta;
    if (sum - 1.0).abs() > SUM_SLACK {
        let message = format!(
            "alpha + beta + gamma + delta must add up to 1, not {}",
            (sum * 1e6).round() / 1e6
        );
        let hint = Some(
            "a backend that passes every probe and is the pool's fastest keeps its configured \
             weight; for example alpha: 0.6, beta: 0.2, gamma: 0.2"
                .to_owned(),
        );
        it.err(report, A, message, hint);
        return None;
    }
    Some(Adaptive {
        alpha,
        beta,
        gamma,
        delta,
        interval: interval?,
        smoothing: smoothing?,
        max_decrease_per_second: max_decrease?,
        window: window?,
        tolerance: tolerance?,
        agent_check: agent_check?,
    })
}

fn agent_check(it: &Item<PoolSpec>, report: &mut Report, a: &AgentCheckSpec) -> Option<AgentCheck> {
    let base = key_path(A, "agent_check");
    let rel = |key: &str| key_path(&base, key);
    let port = required(it, report, a.port.as_deref(), &base, "port", values::port);
    // An agent asked at most ten times a second, at least once an hour.
    let interval = leaf(it, report, a.interval.as_deref(), &rel("interval"), |v| {
        values::duration_within(
            v,
            "interval",
            Duration::from_millis(100),
            Duration::from_hours(1),
        )
    })
    .or(DEFAULT_AGENT_INTERVAL);
    let timeout = match leaf(it, report, a.timeout.as_deref(), &rel("timeout"), |v| {
        values::duration(v, "timeout")
    }) {
        Field::Absent => interval.map(|i: Duration| i.min(DEFAULT_AGENT_TIMEOUT)),
        Field::Bad => None,
        Field::Ok(timeout) => match interval {
            Some(interval) if timeout > interval => {
                let message = format!(
                    "timeout ({}) must not exceed interval ({})",
                    show(timeout),
                    show(interval)
                );
                it.err(report, &rel("timeout"), message, None);
                None
            }
            _ => Some(timeout),
        },
    };
    Some(AgentCheck {
        port: port?,
        interval: interval?,
        timeout: timeout?,
    })
}
