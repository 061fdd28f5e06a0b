//! Checking one pool: its backends and its health check.

use std::{collections::HashMap, net::IpAddr, time::Duration};

use router_common::{MAX_BACKENDS, MAX_POOLS, MAX_SERVICES};

use super::{Field, leaf, missing, protocols, required};
use crate::config::load::Parsed;
use crate::config::{
    model::{
        Backend, Backoff, Breaker, CheckKind, DEFAULT_BACKOFF_FACTOR, DEFAULT_BREAKER_SUCCESSES,
        DEFAULT_BREAKER_TRIAL_WEIGHT, DEFAULT_BREAKER_WINDOW, DEFAULT_HEALTHY_THRESHOLD,
        DEFAULT_HTTP_EXPECT, DEFAULT_HTTP_PATH, DEFAULT_INTERVAL, DEFAULT_TIMEOUT,
        DEFAULT_UNHEALTHY_THRESHOLD, DEFAULT_WEIGHT, HealthCheck, MAX_WEIGHT, Pool, WhenAllDown,
    },
    report::{Item, Report, index_path, key_path},
    spec::{BackoffSpec, BreakerSpec, ExecCheckSpec, HealthCheckSpec, HttpCheckSpec, PoolSpec},
    values::{self, Bad, show},
};

/// What could be read of one pool.
pub(super) struct Draft {
    /// Its name.
    pub name: Option<String>,
    /// `(index, address)` of each backend with a valid address.
    pub backends: Vec<(usize, IpAddr)>,
    /// The pool, when every key of it is right.
    pub value: Option<Pool>,
}

pub(super) fn pool(it: &Item<PoolSpec>, report: &mut Report) -> Draft {
    let p = &it.spec;
    let name = required(it, report, p.name.as_deref(), "", "name", values::name);
    let (backends, addresses) = backends(it, report);
    let health_check = match &p.health_check {
        _ if it.is_broken("health_check") => Field::Bad,
        None => Field::Absent,
        Some(hc) => match health_check(it, report, hc) {
            Some(hc) => Field::Ok(Some(hc)),
            None => Field::Bad,
        },
    };
    let choices = [("drop", WhenAllDown::Drop), ("pass", WhenAllDown::Pass)];
    let when_all_down = leaf(
        it,
        report,
        p.when_all_down.as_deref(),
        "when_all_down",
        |v| values::choice(v, "when_all_down", &choices, &[]),
    )
    .or(WhenAllDown::Drop);
    let on_backend_down =
        super::flow_policy(it, report, p.on_backend_down.as_deref(), "on_backend_down");
    let slow_start = leaf(it, report, p.slow_start.as_deref(), "slow_start", |v| {
        values::duration(v, "slow_start").map(Some)
    });
    let breaker = match &p.breaker {
        _ if it.is_broken("breaker") => Field::Bad,
        None => Field::Absent,
        Some(b) => match breaker(it, report, b) {
            Some(b) => Field::Ok(Some(b)),
            None => Field::Bad,
        },
    };
    // A bad health check was reported already: adaptive weights are not told they lack one.
    let checked = !matches!(health_check, Field::Absent);
    let adaptive = super::weights::weights(it, report, p.weights.as_ref(), checked);
    let value = (|| {
        Some(Pool {
            name: name.clone()?,
            backends: backends?,
            health_check: health_check.or(None)?,
            when_all_down: when_all_down?,
            slow_start: slow_start.or(None)?,
            breaker: breaker.or(None)?,
            adaptive: adaptive.or(None)?,
            on_backend_down: on_backend_down?,
        })
    })();
    Draft {
        name,
        backends: addresses,
        value,
    }
}

/// `breaker`: `failure_threshold` and `recovery_timeout` are required (their right values
/// depend on the service: 3 and 60 s for payment-like services, 10 and 30 s for content).
fn breaker(it: &Item<PoolSpec>, report: &mut Report, b: &BreakerSpec) -> Option<Breaker> {
    const B: &str = "breaker";
    let hour = Duration::from_hours(1);
    let second = Duration::from_secs(1);
    let failure_threshold = required(
        it,
        report,
        b.failure_threshold.as_deref(),
        B,
        "failure_threshold",
        |v| values::number(v, "failure_threshold", 1, 1000),
    );
    let recovery_timeout = required(
        it,
        report,
        b.recovery_timeout.as_deref(),
        B,
        "recovery_timeout",
        |v| values::duration_within(v, "recovery_timeout", second, hour),
    );
    let window = leaf(
        it,
        report,
        b.window.as_deref(),
        &key_path(B, "window"),
        |v| values::duration_within(v, "window", second, hour),
    )
    .or(DEFAULT_BREAKER_WINDOW);
    let success_threshold = leaf(
        it,
        report,
        b.success_threshold.as_deref(),
        &key_path(B, "success_threshold"),
        |v| values::number(v, "success_threshold", 1, 100),
    )
    .or(DEFAULT_BREAKER_SUCCESSES);
    let trial_weight = leaf(
        it,
        report,
        b.trial_weight.as_deref(),
        &key_path(B, "trial_weight"),
        |v| values::number(v, "trial_weight", 1, 100),
    )
    .or(DEFAULT_BREAKER_TRIAL_WEIGHT);
    Some(Breaker {
        failure_threshold: failure_threshold?,
        window: window?,
        recovery_timeout: recovery_timeout?,
        success_threshold: success_threshold?,
        trial_weight: trial_weight?,
    })
}

/// `backends`: at least one, unique addresses. Also returns every valid address.
fn backends(
    it: &Item<PoolSpec>,
    report: &mut Report,
) -> (Option<Vec<Backend>>, Vec<(usize, IpAddr)>) {
    let mut addresses = Vec::new();
    let specs = match &it.spec.backends {
        _ if it.is_broken("backends") => return (None, addresses),
        None => {
            missing(it, report, "", "backends");
            return (None, addresses);
        }
        Some(specs) => specs,
    };
    if specs.is_empty() {
        let message = "a pool needs at least one backend".to_owned();
        let hint = Some("add one, such as `- { address: 198.18.1.11 }`".to_owned());
        it.err(report, "backends", message, hint);
        return (None, addresses);
    }
    let mut ok = true;
    let mut seen: HashMap<IpAddr, usize> = HashMap::new();
    let mut backends = Vec::new();
    for (i, b) in specs.iter().enumerate() {
        let rel = index_path("backends", i);
        let address = required(
            it,
            report,
            b.address.as_deref(),
            &rel,
            "address",
            values::address,
        );
        let weight = leaf(
            it,
            report,
            b.weight.as_deref(),
            &key_path(&rel, "weight"),
            |v| values::number(v, "weight", 0, MAX_WEIGHT),
        )
        .or(DEFAULT_WEIGHT);
        if let Some(address) = address {
            if let Some(&first) = seen.get(&address) {
                let first = key_path(&index_path("backends", first), "address");
                let hint = format!("first listed at {}", it.location(report, &first));
                let message = format!("duplicate backend address {address}");
                it.err(report, &key_path(&rel, "address"), message, Some(hint));
                ok = false;
            } else {
                seen.insert(address, i);
                addresses.push((i, address));
            }
        }
        match (address, weight) {
            (Some(address), Some(weight)) => backends.push(Backend { address, weight }),
            _ => ok = false,
        }
    }
    (ok.then_some(backends), addresses)
}

const HC: &str = "health_check";

/// `health_check`: exactly one probe, and timing that makes sense.
fn health_check(
    it: &Item<PoolSpec>,
    report: &mut Report,
    hc: &HealthCheckSpec,
) -> Option<HealthCheck> {
    let rel = |key: &str| key_path(HC, key);
    let given: Vec<&str> = [
        ("tcp", hc.tcp.is_some() || it.is_broken(&rel("tcp"))),
        ("http", hc.http.is_some() || it.is_broken(&rel("http"))),
        ("exec", hc.exec.is_some() || it.is_broken(&rel("exec"))),
        ("dns", hc.dns.is_some() || it.is_broken(&rel("dns"))),
        ("udp", hc.udp.is_some() || it.is_broken(&rel("udp"))),
        ("tls", hc.tls.is_some() || it.is_broken(&rel("tls"))),
        ("https", hc.https.is_some() || it.is_broken(&rel("https"))),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    let kind = match (given.as_slice(), &hc.tcp, &hc.http, &hc.exec) {
        ([_], ..)
            if hc.dns.is_some() || hc.udp.is_some() || hc.tls.is_some() || hc.https.is_some() =>
        {
            more_check(it, report, hc)
        }
        ([], ..) => {
            let message =
                "health_check needs one of tcp, http, exec, dns, udp, tls, https".to_owned();
            let hint = Some("for example `tcp: { port: 80 }`".to_owned());
            it.err(report, HC, message, hint);
            None
        }
        ([_], Some(tcp), ..) => {
            let port = required(
                it,
                report,
                tcp.port.as_deref(),
                &rel("tcp"),
                "port",
                values::port,
            );
            port.map(|port| CheckKind::Tcp { port })
        }
        ([_], _, Some(http), _) => http_check(it, report, http),
        ([_], _, _, Some(exec)) => exec_check(it, report, &rel("exec"), exec, true),
        ([_], ..) => None,
        (many, ..) => {
            let message = format!(
                "health_check has {}: give exactly one of tcp, http, exec, dns, udp, tls, https",
                many.join(" and ")
            );
            it.err(report, HC, message, None);
            None
        }
    };
    let timing = Timing {
        interval: &hc.interval,
        timeout: &hc.timeout,
        unhealthy_threshold: &hc.unhealthy_threshold,
        healthy_threshold: &hc.healthy_threshold,
        backoff: &hc.backoff,
    };
    timed(it, report, HC, &timing, kind, true)
}

/// `dns`, `udp`, `tls` or `https` (whichever is given) of a pool's check.
fn more_check(it: &Item<PoolSpec>, report: &mut Report, hc: &HealthCheckSpec) -> Option<CheckKind> {
    let rel = |key: &str| key_path(HC, key);
    if let Some(d) = &hc.dns {
        let port = protocols::target(
            it,
            report,
            &rel("dns"),
            d.port.as_deref(),
            d.address.as_deref(),
            true,
            Some(protocols::DNS_PORT),
        );
        protocols::dns(it, report, &rel("dns"), d, port.map(|(_, p)| p))
    } else if let Some(u) = &hc.udp {
        let port = protocols::target(
            it,
            report,
            &rel("udp"),
            u.port.as_deref(),
            u.address.as_deref(),
            true,
            None,
        );
        protocols::udp(it, report, &rel("udp"), u, port.map(|(_, p)| p))
    } else if let Some(t) = &hc.tls {
        let port = protocols::target(
            it,
            report,
            &rel("tls"),
            t.port.as_deref(),
            t.address.as_deref(),
            true,
            None,
        );
        protocols::tls(it, report, &rel("tls"), t, port.map(|(_, p)| p))
    } else {
        let h = hc.https.as_ref()?;
        protocols::https(it, report, &rel("https"), h)
    }
}

/// `exec: { command: [...] }`: a program and its arguments, run without a shell. `{address}` is
/// replaced by the backend's address; it is allowed only where there is one (`pool`).
pub(in crate::config) fn exec_check<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    exec: &ExecCheckSpec,
    pool: bool,
) -> Option<CheckKind> {
    let command_rel = key_path(rel, "command");
    let command = match &exec.command {
        _ if it.is_broken(&command_rel) => return None,
        None => {
            missing(it, report, rel, "command");
            return None;
        }
        Some(command) => command,
    };
    if command.first().is_none_or(|c| c.trim().is_empty()) {
        let message = "command needs a program to run".to_owned();
        let hint = Some("such as [\"/usr/local/bin/check-dns\", \"{address}\"]".to_owned());
        it.err(report, &command_rel, message, hint);
        return None;
    }
    if !pool && command.iter().any(|a| a.contains("{address}")) {
        let message = "{address} is replaced only in pool health checks".to_owned();
        let hint = Some("write the address the command should check".to_owned());
        it.err(report, &command_rel, message, hint);
        return None;
    }
    Some(CheckKind::Exec {
        command: command.clone(),
    })
}

/// The timing keys of a health check or a state probe.
pub(in crate::config) struct Timing<'a> {
    pub interval: &'a Option<String>,
    pub timeout: &'a Option<String>,
    pub unhealthy_threshold: &'a Option<String>,
    pub healthy_threshold: &'a Option<String>,
    pub backoff: &'a Option<BackoffSpec>,
}

/// A health check of `kind` with the timing at `base`: defaults applied, thresholds ≥ 1,
/// backoff max ≥ interval, and timeout ≤ interval when `timeout_within_interval`.
pub(in crate::config) fn timed<S>(
    it: &Item<S>,
    report: &mut Report,
    base: &str,
    t: &Timing<'_>,
    kind: Option<CheckKind>,
    timeout_within_interval: bool,
) -> Option<HealthCheck> {
    let rel = |key: &str| key_path(base, key);
    let interval = leaf(it, report, t.interval.as_deref(), &rel("interval"), |v| {
        values::duration(v, "interval")
    })
    .or(DEFAULT_INTERVAL);
    let timeout = match leaf(it, report, t.timeout.as_deref(), &rel("timeout"), |v| {
        values::duration(v, "timeout")
    }) {
        Field::Absent => interval.map(|i| i.min(DEFAULT_TIMEOUT)),
        Field::Bad => None,
        Field::Ok(timeout) => {
            if let Some(interval) = interval.filter(|&i| timeout > i && timeout_within_interval) {
                let message = format!(
                    "timeout ({}) must not exceed interval ({})",
                    show(timeout),
                    show(interval)
                );
                it.err(report, &rel("timeout"), message, None);
                None
            } else {
                Some(timeout)
            }
        }
    };
    let threshold = |value: Option<&str>, key: &str, default: u32, report: &mut Report| {
        leaf(it, report, value, &rel(key), |v| {
            values::number(v, key, 1, u32::MAX)
        })
        .or(default)
    };
    let unhealthy = threshold(
        t.unhealthy_threshold.as_deref(),
        "unhealthy_threshold",
        DEFAULT_UNHEALTHY_THRESHOLD,
        report,
    );
    let healthy = threshold(
        t.healthy_threshold.as_deref(),
        "healthy_threshold",
        DEFAULT_HEALTHY_THRESHOLD,
        report,
    );
    let backoff = match t.backoff {
        _ if it.is_broken(&rel("backoff")) => None,
        None => interval.map(|max| Backoff {
            factor: DEFAULT_BACKOFF_FACTOR,
            max,
        }),
        Some(backoff) => self::backoff(it, report, &rel("backoff"), backoff, interval),
    };
    Some(HealthCheck {
        kind: kind?,
        interval: interval?,
        timeout: timeout?,
        unhealthy_threshold: unhealthy?,
        healthy_threshold: healthy?,
        backoff: backoff?,
    })
}

/// `health_check.http`.
fn http_check(it: &Item<PoolSpec>, report: &mut Report, http: &HttpCheckSpec) -> Option<CheckKind> {
    let rel = key_path(HC, "http");
    let port = required(it, report, http.port.as_deref(), &rel, "port", values::port);
    let path = leaf(
        it,
        report,
        http.path.as_deref(),
        &key_path(&rel, "path"),
        http_path,
    )
    .or(DEFAULT_HTTP_PATH.to_owned());
    let expect_rel = key_path(&rel, "expect");
    let expect = expect_codes(it, report, &expect_rel, http.expect.as_deref());
    Some(CheckKind::Http {
        port: port?,
        path: path?,
        expect: expect?,
    })
}

/// `expect`: status codes 100–599, at least one (default `[200]`).
#[expect(
    clippy::cast_possible_truncation,
    reason = "a status code is parsed within 100–599, so it fits a u16"
)]
pub(in crate::config) fn expect_codes<S>(
    it: &Item<S>,
    report: &mut Report,
    expect_rel: &str,
    expect: Option<&[String]>,
) -> Option<Vec<u16>> {
    match expect {
        _ if it.is_broken(expect_rel) => None,
        None => Some(DEFAULT_HTTP_EXPECT.to_vec()),
        Some([]) => {
            let message = "expect needs at least one status code".to_owned();
            it.err(
                report,
                expect_rel,
                message,
                Some("such as [200]".to_owned()),
            );
            None
        }
        Some(codes) => {
            let mut out = Some(Vec::new());
            for (i, code) in codes.iter().enumerate() {
                let code = leaf(
                    it,
                    report,
                    Some(code.as_str()),
                    &index_path(expect_rel, i),
                    |v| values::number(v, "status code", 100, 599),
                );
                match (code, out.as_mut()) {
                    (Field::Ok(code), Some(out)) => out.push(code as u16),
                    _ => out = None,
                }
            }
            out
        }
    }
}

pub(in crate::config) fn http_path(s: &str) -> Result<String, Bad> {
    if s.starts_with('/') && !s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Ok(s.to_owned())
    } else {
        Err((
            format!("path must start with '/' and have no spaces, not {s:?}"),
            Some("such as /health".to_owned()),
        ))
    }
}

/// `backoff` at `base`: factor ≥ 1, max ≥ interval.
fn backoff<S>(
    it: &Item<S>,
    report: &mut Report,
    base: &str,
    backoff: &BackoffSpec,
    interval: Option<Duration>,
) -> Option<Backoff> {
    let rel = |key: &str| key_path(base, key);
    let factor = leaf(
        it,
        report,
        backoff.factor.as_deref(),
        &rel("factor"),
        |v| match v.parse::<f64>() {
            Ok(f) if f.is_finite() && f >= 1.0 => Ok(f),
            _ => Err((
                format!("backoff factor must be a number of at least 1, not {v:?}"),
                Some("1 means no backoff; 2 doubles the spacing after each failure".to_owned()),
            )),
        },
    )
    .or(DEFAULT_BACKOFF_FACTOR);
    let max = match leaf(it, report, backoff.max.as_deref(), &rel("max"), |v| {
        values::duration(v, "backoff max")
    }) {
        Field::Absent => interval,
        Field::Bad => None,
        Field::Ok(max) => match interval {
            Some(interval) if max < interval => {
                let message = format!(
                    "backoff max ({}) must be at least interval ({})",
                    show(max),
                    show(interval)
                );
                it.err(report, &rel("max"), message, None);
                None
            }
            _ => Some(max),
        },
    };
    Some(Backoff {
        factor: factor?,
        max: max?,
    })
}

/// Checks the data plane's limits: service, pool and backend slots.
pub(super) fn limits(parsed: &Parsed, report: &mut Report) {
    let services = parsed.services.len();
    if let Some(it) = parsed.services.get(MAX_SERVICES as usize) {
        let message = format!(
            "too many services: {services}, the data plane has {MAX_SERVICES} service slots"
        );
        it.err(
            report,
            "",
            message,
            Some("MAX_SERVICES in router-common".to_owned()),
        );
    }
    let pools = parsed.pools.len();
    if let Some(it) = parsed.pools.get(MAX_POOLS as usize) {
        let message = format!("too many pools: {pools}, the data plane has {MAX_POOLS} pool slots");
        it.err(
            report,
            "",
            message,
            Some("MAX_POOLS in router-common".to_owned()),
        );
    }
    let count = |it: &Item<PoolSpec>| it.spec.backends.as_ref().map_or(0, Vec::len);
    let total: usize = parsed.pools.iter().map(count).sum();
    let mut sum = 0;
    for it in &parsed.pools {
        let before = sum;
        sum += count(it);
        if before <= MAX_BACKENDS as usize && sum > MAX_BACKENDS as usize {
            let message = format!(
                "too many backends: {total} in all pools, the data plane has {MAX_BACKENDS} \
                 backend slots"
            );
            let hint = Some("MAX_BACKENDS in router-common".to_owned());
            it.err(report, "backends", message, hint);
        }
    }
}
