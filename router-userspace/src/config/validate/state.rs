//! Checking one `state.<name>` entry on its own: its name and its one source. Expressions are
//! compiled later, with the whole configuration (`decisions.rs`).

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use rules::Type;

use super::{
    Field, leaf,
    pool::{Timing, exec_check, expect_codes, http_path, timed},
    protocols, required,
};
use crate::config::{
    model::{CheckKind, MetricSpec, PushValue, StateProbe, StateSource, StateVar},
    report::{Item, Report, key_path},
    schema::{RESERVED, state_type},
    spec::{MetricSpecSpec, PushSpec, StateProbeSpec, StateVarSpec},
    values::{self, Bad},
};

/// What could be read of one state variable.
pub(super) struct Draft {
    /// The name (the key), whether valid or not.
    pub name: String,
    /// Whether the name can be written in an expression.
    pub name_ok: bool,
    /// Its type, when its source could be read.
    pub ty: Option<Type>,
    /// The text of `expr`, for derived variables.
    pub expr: Option<String>,
    /// The variable, when every key of it is right.
    pub value: Option<StateVar>,
}

/// Checks `state.<name>`.
pub(super) fn var(name: &str, it: &Item<StateVarSpec>, report: &mut Report) -> Draft {
    let name_ok = check_name(name, it, report);
    let s = &it.spec;
    let given: Vec<&str> = [
        ("probe", s.probe.is_some() || it.is_broken("probe")),
        ("push", s.push.is_some() || it.is_broken("push")),
        ("expr", s.expr.is_some() || it.is_broken("expr")),
        ("metric", s.metric.is_some() || it.is_broken("metric")),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    let source = match (given.as_slice(), s) {
        ([], _) => {
            let message = "a state variable needs one of probe, push, expr, metric".to_owned();
            let hint = Some("for example `push: { default: false }`".to_owned());
            it.err(report, "", message, hint);
            None
        }
        ([_], StateVarSpec { probe: Some(p), .. }) => probe(it, report, p).map(StateSource::Probe),
        ([_], StateVarSpec { push: Some(p), .. }) => push(it, report, p).map(StateSource::Push),
        ([_], StateVarSpec { expr: Some(e), .. }) => {
            if e.trim().is_empty() {
                it.err(report, "expr", "expr must not be empty".to_owned(), None);
                None
            } else {
                Some(StateSource::Expr(e.clone()))
            }
        }
        (
            [_],
            StateVarSpec {
                metric: Some(m), ..
            },
        ) => metric(it, report, m).map(StateSource::Metric),
        ([_], _) => None,
        (many, _) => {
            let message = format!(
                "a state variable has one source, found {}",
                many.join(" and ")
            );
            it.err(report, "", message, None);
            None
        }
    };
    // The type is known from the kind of source even when the source has a problem, so
    // expressions reading the variable are not also reported.
    let ty = match (given.as_slice(), &source) {
        (_, Some(source)) => Some(state_type(source)),
        (["probe" | "expr" | "metric"], None) => Some(Type::Bool),
        _ => None,
    };
    let expr = match &source {
        Some(StateSource::Expr(e)) => Some(e.clone()),
        _ => None,
    };
    let value = source.filter(|_| name_ok).map(|source| StateVar {
        name: name.to_owned(),
        source,
    });
    Draft {
        name: name.to_owned(),
        name_ok,
        ty,
        expr,
        value,
    }
}

/// A state variable's name must be writable in an expression and not in a built-in's
/// namespace (`pool.`, `backend.`, `service.`, `target.`).
fn check_name(name: &str, it: &Item<StateVarSpec>, report: &mut Report) -> bool {
    if !rules::syntax::is_name(name) {
        let message = format!("{name:?} cannot be used in an expression");
        let hint = Some(
            "use letters, digits, '_' and '-' in dot-separated segments, starting with a letter \
             or '_', and not a keyword (AND, OR, NOT, in, true, false)"
                .to_owned(),
        );
        it.err(report, "", message, hint);
        return false;
    }
    let first = name.split('.').next().unwrap_or(name);
    if let Some(reserved) = RESERVED.iter().find(|r| r.eq_ignore_ascii_case(first)) {
        let message = format!("{name:?} is in the namespace of the built-ins `{reserved}.*`");
        let hint = Some(
            "choose a name that does not start with pool., backend., service. or target."
                .to_owned(),
        );
        it.err(report, "", message, hint);
        return false;
    }
    true
}

/// `probe:` — one of tcp, http, exec, with timing as for pools.
fn probe(it: &Item<StateVarSpec>, report: &mut Report, p: &StateProbeSpec) -> Option<StateProbe> {
    let rel = |k: &str| key_path("probe", k);
    let given: Vec<&str> = [
        ("tcp", p.tcp.is_some() || it.is_broken(&rel("tcp"))),
        ("http", p.http.is_some() || it.is_broken(&rel("http"))),
        ("exec", p.exec.is_some() || it.is_broken(&rel("exec"))),
        ("dns", p.dns.is_some() || it.is_broken(&rel("dns"))),
        ("udp", p.udp.is_some() || it.is_broken(&rel("udp"))),
        ("tls", p.tls.is_some() || it.is_broken(&rel("tls"))),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    if p.expect.is_some() && p.http.is_none() {
        let message = "expect applies to http probes only".to_owned();
        it.err(report, &rel("expect"), message, None);
    }
    let https = p.http.as_deref().is_some_and(|u| u.starts_with("https://"));
    for (key, set) in [("sni", &p.sni), ("verify", &p.verify), ("ca", &p.ca)] {
        if set.is_some() && !https {
            let message = format!("{key} applies to https:// URLs in http only");
            let hint = Some("a tls probe takes it inside tls: { … }".to_owned());
            it.err(report, &rel(key), message, hint);
        }
    }
    let (address, kind) = match (given.as_slice(), &p.tcp, &p.http, &p.exec) {
        ([_], ..) if p.dns.is_some() || p.udp.is_some() || p.tls.is_some() => {
            more_probe(it, report, p)
        }
        ([_], _, Some(_), _) if https => {
            let url = leaf(it, report, p.http.as_deref(), &rel("http"), https_url);
            let expect = expect_codes(it, report, &rel("expect"), p.expect.as_deref());
            let tls = protocols::tls_options(
                it,
                report,
                "probe",
                p.sni.as_deref(),
                p.verify.as_deref(),
                p.ca.as_deref(),
            );
            match (url, expect, tls) {
                (Field::Ok((sa, path)), Some(expect), Some(tls)) => (
                    Some(sa.ip()),
                    Some(CheckKind::Https {
                        port: sa.port(),
                        path,
                        expect,
                        tls,
                    }),
                ),
                _ => (None, None),
            }
        }
        ([], ..) => {
            let message = "probe needs one of tcp, http, exec, dns, udp, tls".to_owned();
            let hint = Some("for example `tcp: \"198.18.1.50:5432\"`".to_owned());
            it.err(report, "probe", message, hint);
            (None, None)
        }
        ([_], Some(_), ..) => match leaf(it, report, p.tcp.as_deref(), &rel("tcp"), tcp_target) {
            Field::Ok(sa) => (Some(sa.ip()), Some(CheckKind::Tcp { port: sa.port() })),
            _ => (None, None),
        },
        ([_], _, Some(_), _) => {
            let url = leaf(it, report, p.http.as_deref(), &rel("http"), http_url);
            let expect = expect_codes(it, report, &rel("expect"), p.expect.as_deref());
            match (url, expect) {
                (Field::Ok((sa, path)), Some(expect)) => (
                    Some(sa.ip()),
                    Some(CheckKind::Http {
                        port: sa.port(),
                        path,
                        expect,
                    }),
                ),
                _ => (None, None),
            }
        }
        ([_], _, _, Some(exec)) => (None, exec_check(it, report, &rel("exec"), exec, false)),
        ([_], ..) => (None, None),
        (many, ..) => {
            let message = format!(
                "probe has {}: give exactly one of tcp, http, exec, dns, udp, tls",
                many.join(" and ")
            );
            it.err(report, "probe", message, None);
            (None, None)
        }
    };
    let timing = Timing {
        interval: &p.interval,
        timeout: &p.timeout,
        unhealthy_threshold: &p.unhealthy_threshold,
        healthy_threshold: &p.healthy_threshold,
        backoff: &p.backoff,
    };
    // A state probe may take longer than its interval (the next probe starts an interval after
    // the previous one ends), as the reference's 100 ms probes with a 200 ms timeout do.
    let check = timed(it, report, "probe", &timing, kind, false)?;
    Some(StateProbe { address, check })
}

/// `dns`, `udp` or `tls` (whichever is given) of a state probe, with the address it names.
fn more_probe(
    it: &Item<StateVarSpec>,
    report: &mut Report,
    p: &StateProbeSpec,
) -> (Option<IpAddr>, Option<CheckKind>) {
    let rel = |k: &str| key_path("probe", k);
    let (target, kind) = if let Some(d) = &p.dns {
        let target = protocols::target(
            it,
            report,
            &rel("dns"),
            d.port.as_deref(),
            d.address.as_deref(),
            false,
            Some(protocols::DNS_PORT),
        );
        let kind = protocols::dns(it, report, &rel("dns"), d, target.map(|(_, p)| p));
        (target, kind)
    } else if let Some(u) = &p.udp {
        let target = protocols::target(
            it,
            report,
            &rel("udp"),
            u.port.as_deref(),
            u.address.as_deref(),
            false,
            None,
        );
        let kind = protocols::udp(it, report, &rel("udp"), u, target.map(|(_, p)| p));
        (target, kind)
    } else if let Some(t) = &p.tls {
        let target = protocols::target(
            it,
            report,
            &rel("tls"),
            t.port.as_deref(),
            t.address.as_deref(),
            false,
            None,
        );
        let kind = protocols::tls(it, report, &rel("tls"), t, target.map(|(_, p)| p));
        (target, kind)
    } else {
        (None, None)
    };
    match (target, kind) {
        (Some((address, _)), Some(kind)) => (address, Some(kind)),
        _ => (None, None),
    }
}

/// `http: "https://198.18.1.11[:port]/path"`: as [`http_url`], with port 443 by default.
fn https_url(s: &str) -> Result<(SocketAddr, String), Bad> {
    let rest = s.strip_prefix("https://").unwrap_or(s);
    let explicit_port = {
        let authority = rest.split('/').next().unwrap_or(rest);
        match authority.rsplit_once(']') {
            Some((_, after)) => after.starts_with(':'),
            None => authority.contains(':'),
        }
    };
    let (sa, path) = http_url(&format!("http://{rest}")).map_err(|(m, _)| {
        (
            m.replace("http://", "https://"),
            Some(
                "such as https://198.18.1.11/health or https://[2001:db8::11]:8443/health"
                    .to_owned(),
            ),
        )
    })?;
    let port = if explicit_port {
        sa.port()
    } else {
        protocols::HTTPS_PORT
    };
    Ok((SocketAddr::new(sa.ip(), port), path))
}

/// `tcp: "198.18.1.50:5432"` or `"[2001:db8::50]:5432"`.
fn tcp_target(s: &str) -> Result<SocketAddr, Bad> {
    let sa: SocketAddr = s.parse().map_err(|_| {
        (
            format!("{s:?} is not an address and port"),
            Some("write IP:port, such as 198.18.1.50:5432 or [2001:db8::50]:5432".to_owned()),
        )
    })?;
    values::address(&sa.ip().to_string())?;
    values::port(&sa.port().to_string())?;
    Ok(sa)
}

/// `http: "http://198.18.1.11[:port]/path"`: the address and port (default 80) and the path.
fn http_url(s: &str) -> Result<(SocketAddr, String), Bad> {
    let hint = || {
        Some("such as http://198.18.1.11/health or http://[2001:db8::11]:8080/health".to_owned())
    };
    let Some(rest) = s.strip_prefix("http://") else {
        let message = format!("{s:?} is not an http:// or https:// URL");
        return Err((message, hint()));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let with_port = |host: &str, port: Option<&str>| -> Result<SocketAddr, Bad> {
        let ip: IpAddr = values::address(host).map_err(|(m, _)| {
            (
                format!("{m} (the URL must name the host by its IP address)"),
                hint(),
            )
        })?;
        let port = port.map_or(Ok(80), values::port)?;
        Ok(SocketAddr::new(ip, port))
    };
    let sa = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| (format!("{s:?} has an unclosed '['"), hint()))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| (format!("{s:?} is not a URL"), hint()))?,
            ),
        };
        with_port(host, port)?
    } else {
        match authority.split_once(':') {
            Some((host, port)) => with_port(host, Some(port))?,
            None => with_port(authority, None)?,
        }
    };
    Ok((sa, http_path(path)?))
}

/// `push: { default }`: the default's type is the variable's. A quoted default is a string;
/// `true`/`false` a bool; a number a number; other plain text a string.
fn push(it: &Item<StateVarSpec>, report: &mut Report, p: &PushSpec) -> Option<PushValue> {
    let rel = "push.default";
    let quoted = it.quoted.iter().any(|q| q == rel);
    required(it, report, p.default.as_deref(), "push", "default", |v| {
        Ok(match v {
            _ if quoted => PushValue::String(v.to_owned()),
            "true" => PushValue::Bool(true),
            "false" => PushValue::Bool(false),
            "True" | "TRUE" | "False" | "FALSE" | "yes" | "no" | "on" | "off" => {
                return Err((
                    format!("ambiguous default {v:?}"),
                    Some("write true or false for a bool, or quote it for a string".to_owned()),
                ));
            }
            _ => match v.parse::<f64>() {
                Ok(n) if n.is_finite() => PushValue::Number(n),
                Ok(_) => return Err((format!("default {v:?} is not a finite number"), None)),
                Err(_) => PushValue::String(v.to_owned()),
            },
        })
    })
}

/// `metric: { of, above, below, for }`.
fn metric(it: &Item<StateVarSpec>, report: &mut Report, m: &MetricSpecSpec) -> Option<MetricSpec> {
    let rel = |k: &str| key_path("metric", k);
    let rate = |v: &str| match v.parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => Ok(n),
        _ => Err((
            format!("a rate must be a number of at least 0, not {v:?}"),
            None,
        )),
    };
    let of = required(it, report, m.of.as_deref(), "metric", "of", |v| {
        Ok(v.to_owned())
    });
    let above = required(it, report, m.above.as_deref(), "metric", "above", rate);
    let below = match leaf(it, report, m.below.as_deref(), &rel("below"), rate) {
        Field::Absent => above,
        Field::Bad => None,
        Field::Ok(below) => match above {
            Some(above) if below > above => {
                let message = format!("below ({below}) must not exceed above ({above})");
                let hint = Some("below is where the variable turns false again".to_owned());
                it.err(report, &rel("below"), message, hint);
                None
            }
            _ => Some(below),
        },
    };
    let hold = leaf(it, report, m.hold.as_deref(), &rel("for"), |v| {
        zero_or_duration(v, "for")
    })
    .or(Duration::ZERO);
    Some(MetricSpec {
        of: of?,
        above: above?,
        below: below?,
        hold: hold?,
    })
}

/// A duration with a unit, zero allowed (`0s`).
pub(super) fn zero_or_duration(s: &str, what: &str) -> Result<Duration, Bad> {
    humantime::parse_duration(s).map_err(|_| {
        (
            format!("{what} must be a duration with a unit, not {s:?}"),
            Some("for example 50ms, 3s or 0s".to_owned()),
        )
    })
}

/// Whether `of` names a rate the program exports for this configuration:
/// `service.<name>.{packets,bytes}_per_second` or `backend.<address>.{…}_per_second`.
pub(super) fn metric_of_ok(of: &str, services: &[&str], backends: &[IpAddr]) -> Result<(), Bad> {
    let rates = ["packets_per_second", "bytes_per_second"];
    let hint = || {
        Some(
            "write service.<service>.packets_per_second (or bytes_per_second), or \
             backend.<address>.packets_per_second"
                .to_owned(),
        )
    };
    let Some((head, rate)) = of.rsplit_once('.') else {
        return Err((format!("{of:?} is not a rate"), hint()));
    };
    if !rates.contains(&rate) {
        return Err((format!("{of:?} is not a rate"), hint()));
    }
    if let Some(svc) = head.strip_prefix("service.") {
        if services.contains(&svc) {
            return Ok(());
        }
        let message = format!("{of:?} names unknown service {svc:?}");
        return Err((message, values::did_you_mean(svc, services)));
    }
    if let Some(addr) = head.strip_prefix("backend.") {
        let known = backends
            .iter()
            .any(|b| crate::config::schema::address_segment(*b) == addr);
        if known {
            return Ok(());
        }
        return Err((format!("{of:?} names no configured backend"), None));
    }
    Err((format!("{of:?} is not a rate"), hint()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_give_address_port_and_path() {
        let ok = |s: &str| http_url(s).ok().map(|(sa, p)| (sa.to_string(), p));
        assert_eq!(
            ok("http://198.18.1.11/health"),
            Some(("198.18.1.11:80".into(), "/health".into()))
        );
        assert_eq!(
            ok("http://198.18.1.11:8080"),
            Some(("198.18.1.11:8080".into(), "/".into()))
        );
        assert_eq!(
            ok("http://[2001:db8::11]:81/x"),
            Some(("[2001:db8::11]:81".into(), "/x".into()))
        );
        for bad in [
            "https://198.18.1.11/",
            "http://example.com/",
            "198.18.1.11/x",
            "http://[::1/",
        ] {
            assert!(http_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn metric_of_names_a_configured_rate() {
        let b: IpAddr = [198, 18, 1, 11].into();
        assert!(metric_of_ok("service.web.packets_per_second", &["web"], &[]).is_ok());
        assert!(metric_of_ok("backend.198.18.1.11.bytes_per_second", &[], &[b]).is_ok());
        assert!(metric_of_ok("service.wbe.packets_per_second", &["web"], &[]).is_err());
        assert!(metric_of_ok("service.web.healthy", &["web"], &[]).is_err());
    }
}
