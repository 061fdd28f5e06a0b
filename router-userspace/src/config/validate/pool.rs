//! Checking one pool: its backends and its health check.

use std::{collections::HashMap, net::IpAddr, time::Duration};

use super::{Field, leaf, missing, required};
use crate::config::{
    model::*,
    report::{Item, Report, index_path, key_path},
    spec::{BackoffSpec, HealthCheckSpec, HttpCheckSpec, PoolSpec},
    values::{self, Bad, Later, not_yet, show},
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
    let name = required(it, report, &p.name, "", "name", values::name);
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
    let when_all_down = leaf(it, report, &p.when_all_down, "when_all_down", |v| {
        values::choice(v, "when_all_down", &choices, &[])
    })
    .or(WhenAllDown::Drop);
    if p.weights.is_some() {
        let (message, hint) = not_yet(Later::Weights);
        it.err(report, "weights", message, hint);
    }
    let value = (|| {
        Some(Pool {
            name: name.clone()?,
            backends: backends?,
            health_check: health_check.or(None)?,
            when_all_down: when_all_down?,
        })
    })();
    Draft {
        name,
        backends: addresses,
        value,
    }
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
        let address = required(it, report, &b.address, &rel, "address", values::address);
        let weight = leaf(it, report, &b.weight, &key_path(&rel, "weight"), |v| {
            values::number(v, "weight", 0, MAX_WEIGHT)
        })
        .or(DEFAULT_WEIGHT);
        if let Some(address) = address {
            match seen.get(&address) {
                Some(&first) => {
                    let first = key_path(&index_path("backends", first), "address");
                    let hint = format!("first listed at {}", it.location(report, &first));
                    let message = format!("duplicate backend address {address}");
                    it.err(report, &key_path(&rel, "address"), message, Some(hint));
                    ok = false;
                }
                None => {
                    seen.insert(address, i);
                    addresses.push((i, address));
                }
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
    if hc.exec.is_some() {
        let (message, hint) = not_yet(Later::Exec);
        it.err(report, &rel("exec"), message, hint);
    }
    let tcp = hc.tcp.is_some() || it.is_broken(&rel("tcp"));
    let http = hc.http.is_some() || it.is_broken(&rel("http"));
    let kind = match (&hc.tcp, &hc.http) {
        _ if tcp && http => {
            let message = "health_check has both tcp and http: give exactly one".to_owned();
            it.err(report, HC, message, None);
            None
        }
        (Some(tcp), None) => {
            let port = required(it, report, &tcp.port, &rel("tcp"), "port", values::port);
            port.map(|port| CheckKind::Tcp { port })
        }
        (None, Some(http)) => http_check(it, report, http),
        _ => {
            if !tcp && !http && hc.exec.is_none() {
                let message = "health_check needs one of tcp, http".to_owned();
                let hint = Some("for example `tcp: { port: 80 }`".to_owned());
                it.err(report, HC, message, hint);
            }
            None
        }
    };
    let interval = leaf(it, report, &hc.interval, &rel("interval"), |v| {
        values::duration(v, "interval")
    })
    .or(DEFAULT_INTERVAL);
    let timeout = match leaf(it, report, &hc.timeout, &rel("timeout"), |v| {
        values::duration(v, "timeout")
    }) {
        Field::Absent => interval.map(|i| i.min(DEFAULT_TIMEOUT)),
        Field::Bad => None,
        Field::Ok(timeout) => {
            if let Some(interval) = interval.filter(|&i| timeout > i) {
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
    let threshold = |value: &Option<String>, key: &str, default: u32, report: &mut Report| {
        leaf(it, report, value, &rel(key), |v| {
            values::number(v, key, 1, u32::MAX)
        })
        .or(default)
    };
    let unhealthy = threshold(
        &hc.unhealthy_threshold,
        "unhealthy_threshold",
        DEFAULT_UNHEALTHY_THRESHOLD,
        report,
    );
    let healthy = threshold(
        &hc.healthy_threshold,
        "healthy_threshold",
        DEFAULT_HEALTHY_THRESHOLD,
        report,
    );
    let backoff = match &hc.backoff {
        _ if it.is_broken(&rel("backoff")) => None,
        None => interval.map(|max| Backoff {
            factor: DEFAULT_BACKOFF_FACTOR,
            max,
        }),
        Some(backoff) => self::backoff(it, report, backoff, interval),
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
    let port = required(it, report, &http.port, &rel, "port", values::port);
    let path = leaf(it, report, &http.path, &key_path(&rel, "path"), http_path)
        .or(DEFAULT_HTTP_PATH.to_owned());
    let expect_rel = key_path(&rel, "expect");
    let expect = match &http.expect {
        _ if it.is_broken(&expect_rel) => None,
        None => Some(DEFAULT_HTTP_EXPECT.to_vec()),
        Some(codes) if codes.is_empty() => {
            let message = "expect needs at least one status code".to_owned();
            it.err(
                report,
                &expect_rel,
                message,
                Some("such as [200]".to_owned()),
            );
            None
        }
        Some(codes) => {
            let mut out = Some(Vec::new());
            for (i, code) in codes.iter().enumerate() {
                let value = &Some(code.clone());
                let code = leaf(it, report, value, &index_path(&expect_rel, i), |v| {
                    values::number(v, "status code", 100, 599)
                });
                match (code, out.as_mut()) {
                    (Field::Ok(code), Some(out)) => out.push(code as u16),
                    _ => out = None,
                }
            }
            out
        }
    };
    Some(CheckKind::Http {
        port: port?,
        path: path?,
        expect: expect?,
    })
}

fn http_path(s: &str) -> Result<String, Bad> {
    if s.starts_with('/') && !s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Ok(s.to_owned())
    } else {
        Err((
            format!("path must start with '/' and have no spaces, not {s:?}"),
            Some("such as /health".to_owned()),
        ))
    }
}

/// `health_check.backoff`: factor ≥ 1, max ≥ interval.
fn backoff(
    it: &Item<PoolSpec>,
    report: &mut Report,
    backoff: &BackoffSpec,
    interval: Option<Duration>,
) -> Option<Backoff> {
    let rel = |key: &str| key_path(&key_path(HC, "backoff"), key);
    let factor = leaf(it, report, &backoff.factor, &rel("factor"), |v| {
        match v.parse::<f64>() {
            Ok(f) if f.is_finite() && f >= 1.0 => Ok(f),
            _ => Err((
                format!("backoff factor must be a number of at least 1, not {v:?}"),
                Some("1 means no backoff; 2 doubles the spacing after each failure".to_owned()),
            )),
        }
    })
    .or(DEFAULT_BACKOFF_FACTOR);
    let max = match leaf(it, report, &backoff.max, &rel("max"), |v| {
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
