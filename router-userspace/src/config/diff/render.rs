//! How a configuration's items read in a diff line: the one-line forms `Change` shows.

use std::{fmt, net::SocketAddr, time::Duration};

use super::super::model::{
    Adaptive, CheckKind, DecisionGroup, DecisionRule, Forward, HashMode, HealthCheck, Pool,
    Protocol, PushValue, Service, StateSource, Target, Vip, WhenAllDown,
};

pub(super) fn service(s: &Service) -> String {
    format!(
        "{}/{}, forward {}, hash {}, to {}",
        SocketAddr::new(s.vip, s.port),
        protocol(s.protocol),
        forward(s.forward),
        hash(s.hash),
        target(&s.to)
    )
}

/// `echo false, host_ports [tcp/22]`, and `, new_flows_per_second N` when it has a limit.
pub(super) fn vip(v: &Vip) -> String {
    let limit = v
        .new_flows_per_second
        .map_or(String::new(), |n| format!(", new_flows_per_second {n}"));
    format!(
        "echo {}, host_ports {}{limit}",
        v.echo,
        host_ports(&v.host_ports)
    )
}

/// `[tcp/22, udp/161]`: TCP before UDP, each by port (their order in the file means nothing).
pub(super) fn host_ports(ports: &[(Protocol, u16)]) -> String {
    let mut ports: Vec<(&str, u16)> = ports.iter().map(|&(p, n)| (protocol(p), n)).collect();
    ports.sort_unstable();
    let ports: Vec<String> = ports.iter().map(|(p, n)| format!("{p}/{n}")).collect();
    format!("[{}]", ports.join(", "))
}

pub(super) fn pool(p: &Pool) -> String {
    let n = p.backends.len();
    let plural = if n == 1 { "" } else { "s" };
    let mut out = format!(
        "{n} backend{plural}, health_check {}, when_all_down {}",
        opt_health(p.health_check.as_ref()),
        when_all_down(p.when_all_down)
    );
    if p.adaptive.is_some() {
        out.push_str(", weights ");
        out.push_str(&weights(p.adaptive.as_ref()));
    }
    out
}

/// A pool's `weights`: `adaptive (…every setting…)`, or `none`.
pub(super) fn weights(a: Option<&Adaptive>) -> String {
    let Some(a) = a else {
        return "none".to_owned();
    };
    let agent = a.agent_check.as_ref().map_or("none".to_owned(), |c| {
        format!(
            "port {} every {} timeout {}",
            c.port,
            dur(c.interval),
            dur(c.timeout)
        )
    });
    format!(
        "adaptive (alpha {}, beta {}, gamma {}, delta {}, interval {}, smoothing {}, \
         max_decrease_per_second {}, window {}, tolerance {}, agent_check {agent})",
        a.alpha,
        a.beta,
        a.gamma,
        a.delta,
        dur(a.interval),
        a.smoothing,
        a.max_decrease_per_second,
        dur(a.window),
        a.tolerance,
    )
}

pub(super) fn group(g: &DecisionGroup) -> String {
    use std::fmt::Write as _;
    let n = g.rules.len();
    let plural = if n == 1 { "" } else { "s" };
    let mut out = format!(
        "{n} rule{plural}, default {}",
        opt_action(g.default.as_ref())
    );
    let s = &g.switch;
    if s.stable_for != Duration::ZERO || s.cooldown != Duration::ZERO {
        let _ = write!(out, ", switch.stable_for {}", dur(s.stable_for));
        let _ = write!(out, ", switch.cooldown {}", dur(s.cooldown));
    }
    if s.failback_after != Duration::ZERO {
        let _ = write!(out, ", switch.failback_after {}", dur(s.failback_after));
    }
    if let Some(require) = &g.require {
        let _ = write!(out, ", require {require:?}");
    }
    if let Some(automatic) = &g.automatic {
        let _ = write!(out, ", automatic {automatic}");
    }
    out
}

pub(super) fn rule(r: &DecisionRule) -> String {
    format!(
        "priority {}, when {:?}, then {}",
        r.priority,
        r.when,
        action(&r.then)
    )
}

pub(super) fn source(s: &StateSource) -> String {
    match s {
        StateSource::Probe(p) => match p.address {
            Some(address) => format!("probe {} on {address}", health(&p.check)),
            None => format!("probe {}", health(&p.check)),
        },
        StateSource::Push(v) => format!("push default {}", push(v)),
        StateSource::Expr(e) => format!("expr {e:?}"),
        StateSource::Metric(m) => format!(
            "metric {} above {} below {} for {}",
            m.of,
            m.above,
            m.below,
            dur(m.hold)
        ),
    }
}

pub(super) fn push(v: &PushValue) -> String {
    match v {
        PushValue::Bool(b) => b.to_string(),
        PushValue::Number(n) => n.to_string(),
        PushValue::String(s) => format!("{s:?}"),
    }
}

/// `tcp port 80 every 1s`.
pub(super) fn health(h: &HealthCheck) -> String {
    format!("{} every {}", probe(&h.kind), dur(h.interval))
}

pub(super) fn opt_health(h: Option<&HealthCheck>) -> String {
    h.map_or_else(|| "none".to_owned(), health)
}

pub(super) fn probe(kind: &CheckKind) -> String {
    match kind {
        CheckKind::Tcp { port } => format!("tcp port {port}"),
        CheckKind::Http { port, path, expect } => {
            let expect: Vec<String> = expect.iter().map(u16::to_string).collect();
            format!("http port {port} path {path} expect {}", expect.join(","))
        }
        CheckKind::Exec { command } => format!("exec {command:?}"),
        CheckKind::Dns {
            port,
            query,
            record,
            expect,
        } => format!(
            "dns port {port} {record} {query} expect [{}]",
            expect.join(",")
        ),
        CheckKind::Udp { port, send, expect } => format!(
            "udp port {port} send {} bytes{}",
            send.len(),
            expect
                .as_ref()
                .map_or_else(String::new, |e| format!(" expect {} bytes", e.len()))
        ),
        CheckKind::Tls { port, tls } => format!("tls port {port}{}", tls_options(tls)),
        CheckKind::Https {
            port,
            path,
            expect,
            tls,
        } => {
            let expect: Vec<String> = expect.iter().map(u16::to_string).collect();
            format!(
                "https port {port} path {path} expect {}{}",
                expect.join(","),
                tls_options(tls)
            )
        }
    }
}

fn tls_options(tls: &crate::config::TlsOptions) -> String {
    let sni = tls
        .sni
        .as_ref()
        .map_or_else(String::new, |sni| format!(" sni {sni}"));
    let verify = if tls.verify { "" } else { " verify off" };
    let ca = tls
        .ca
        .as_ref()
        .map_or_else(String::new, |ca| format!(" ca {}", ca.display()));
    format!("{sni}{verify}{ca}")
}

pub(super) fn target(t: &Target) -> String {
    match t {
        Target::Pool(p) => format!("pool {p}"),
        Target::Split(shares) => {
            let shares: Vec<String> = shares
                .iter()
                .map(|s| format!("{}:{}", s.pool, s.weight))
                .collect();
            format!("split {}", shares.join(","))
        }
        Target::Decide(g) => format!("decide {g}"),
    }
}

/// `pool dc1` or `split dc1:95,dc2:5`, as a service's target reads.
pub(super) fn action(a: &rules::engine::Action) -> String {
    match a {
        rules::engine::Action::Pool(p) => format!("pool {p}"),
        rules::engine::Action::Split(shares) => {
            let shares: Vec<String> = shares.iter().map(|(p, w)| format!("{p}:{w}")).collect();
            format!("split {}", shares.join(","))
        }
        rules::engine::Action::ByClass(classes) => {
            let default = rules::engine::DEFAULT_CLASS;
            let named = classes.iter().filter(|(c, _)| c.as_str() != default);
            let classes: Vec<String> = named
                .chain(classes.get_key_value(default))
                .map(|(c, a)| format!("{c}: {}", action(a)))
                .collect();
            format!("by_class {}", classes.join("; "))
        }
    }
}

pub(super) fn opt_action(a: Option<&rules::engine::Action>) -> String {
    a.map_or_else(|| "none".to_owned(), action)
}

pub(super) fn opt(value: Option<impl fmt::Display>) -> String {
    value.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

pub(super) fn opt_quoted(value: Option<&str>) -> String {
    value.map_or_else(|| "none".to_owned(), |v| format!("{v:?}"))
}

pub(super) fn dur(d: Duration) -> String {
    if d.is_zero() {
        "0s".to_owned()
    } else {
        humantime::format_duration(d).to_string()
    }
}

pub(super) fn protocol(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

pub(super) fn forward(f: Forward) -> String {
    match f {
        Forward::DsrL2 => "dsr-l2".to_owned(),
        Forward::Nat => "nat".to_owned(),
        Forward::Ipip(range) => format!("ipip from {range}"),
    }
}

pub(super) fn hash(h: HashMode) -> &'static str {
    match h {
        HashMode::FiveTuple => "five_tuple",
        HashMode::SourceIp => "source_ip",
    }
}

/// A pool's `breaker`: its settings, or `none`.
pub(super) fn breaker(b: Option<crate::config::model::Breaker>) -> String {
    b.map_or("none".to_owned(), |b| {
        format!(
            "failure_threshold {} within {}, recovery_timeout {}, success_threshold {}, \
             trial_weight {}%",
            b.failure_threshold,
            humantime::format_duration(b.window),
            humantime::format_duration(b.recovery_timeout),
            b.success_threshold,
            b.trial_weight
        )
    })
}

/// A pool's `slow_start`: its duration, or `none`.
pub(super) fn slow_start(d: Option<std::time::Duration>) -> String {
    d.map_or("none".to_owned(), |d| {
        humantime::format_duration(d).to_string()
    })
}

pub(super) fn when_all_down(w: WhenAllDown) -> &'static str {
    match w {
        WhenAllDown::Drop => "drop",
        WhenAllDown::Pass => "pass",
    }
}

/// A `canary:` block: `pool canary steps 5%,25% hold 10m rollback_when "…"`, or `none`.
pub(super) fn canary(c: Option<&crate::config::model::CanaryRamp>) -> String {
    let Some(c) = c else {
        return "none".to_owned();
    };
    let steps: Vec<String> = c
        .steps
        .iter()
        .map(|s| rules::engine::Percent(*s).to_string())
        .collect();
    format!(
        "pool {} steps {} hold {} rollback_when {}",
        c.pool,
        steps.join(","),
        dur(c.hold),
        opt_quoted(c.rollback_when.as_deref())
    )
}
