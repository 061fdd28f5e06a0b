//! `fleet:`: the node's name, the etcd endpoints, the key prefix, the lease TTL, the
//! timeouts and TLS.

use std::path::{Path, PathBuf};

use super::{Field, leaf};
use crate::config::{
    model::{
        DEFAULT_DIAL_TIMEOUT, DEFAULT_FLEET_PREFIX, DEFAULT_LEASE_TTL, DEFAULT_REQUEST_TIMEOUT,
        FLEET_TIMEOUT_RANGE, Fleet, FleetTls, LEASE_TTL_RANGE,
    },
    report::{Item, Report, index_path},
    spec::FleetSpec,
    values::{self, Bad},
};

/// The fleet: `None` without `fleet:` or when a problem was reported (validation then builds no
/// config), or the one `fleet:` (more than one is an error).
pub(super) fn fleets(items: &[Item<FleetSpec>], report: &mut Report) -> Option<Fleet> {
    let mut result = None;
    let mut first: Option<String> = None;
    for it in items {
        let fleet = fleet(it, report);
        match &first {
            None => {
                first = Some(it.location(report, ""));
                result = fleet;
            }
            Some(first) => {
                let hint = format!("first set at {first}; set it in one file");
                let message = "fleet is set in more than one file".to_owned();
                it.err(report, "", message, Some(hint));
            }
        }
    }
    result
}

fn fleet(it: &Item<FleetSpec>, report: &mut Report) -> Option<Fleet> {
    let s = &it.spec;
    let node = match leaf(it, report, s.node.as_deref(), "node", node_name) {
        Field::Ok(n) => Some(n),
        Field::Bad => None,
        Field::Absent => {
            let name = host_name();
            if name.is_none() {
                let message = "the host name cannot be read or is not a node name".to_owned();
                let hint = Some("set fleet.node".to_owned());
                it.err(report, "", message, hint);
            }
            name
        }
    };
    let tls = match tls(it, report) {
        Field::Ok(t) => Some(Some(t)),
        Field::Absent => Some(None),
        Field::Bad => None,
    };
    let endpoints = endpoints(it, report, tls.as_ref().map(Option::is_some));
    let prefix =
        leaf(it, report, s.prefix.as_deref(), "prefix", prefix).or(DEFAULT_FLEET_PREFIX.to_owned());
    let lease_ttl = leaf(it, report, s.lease_ttl.as_deref(), "lease_ttl", |v| {
        let d = values::duration_within(v, "lease_ttl", LEASE_TTL_RANGE.0, LEASE_TTL_RANGE.1)?;
        if d.subsec_nanos() == 0 {
            Ok(d)
        } else {
            Err((
                format!("lease_ttl must be whole seconds, not {v:?}"),
                Some("etcd counts a lease's TTL in seconds".to_owned()),
            ))
        }
    })
    .or(DEFAULT_LEASE_TTL);
    let mut timeout = |value: Option<&str>, key: &str, default| {
        leaf(it, report, value, key, |v| {
            values::duration_within(v, key, FLEET_TIMEOUT_RANGE.0, FLEET_TIMEOUT_RANGE.1)
        })
        .or(default)
    };
    let dial_timeout = timeout(
        s.dial_timeout.as_deref(),
        "dial_timeout",
        DEFAULT_DIAL_TIMEOUT,
    );
    let request_timeout = timeout(
        s.request_timeout.as_deref(),
        "request_timeout",
        DEFAULT_REQUEST_TIMEOUT,
    );
    Some(Fleet {
        node: node?,
        endpoints: endpoints?,
        prefix: prefix?,
        lease_ttl: lease_ttl?,
        dial_timeout: dial_timeout?,
        request_timeout: request_timeout?,
        tls: tls?,
    })
}

/// `tls`: absent is plain HTTP.
fn tls(it: &Item<FleetSpec>, report: &mut Report) -> Field<FleetTls> {
    if it.is_broken("tls") {
        return Field::Bad;
    }
    let Some(spec) = &it.spec.tls else {
        return Field::Absent;
    };
    let file = |report: &mut Report, value: Option<&str>, key: &str, kind: Pem| {
        leaf(it, report, value, &format!("tls.{key}"), |v| {
            pem_file(v, kind)
        })
    };
    let ca = match file(report, spec.ca.as_deref(), "ca", Pem::Certificate) {
        Field::Ok(ca) => Some(ca),
        Field::Bad => None,
        Field::Absent => {
            super::missing(it, report, "tls", "ca");
            None
        }
    };
    let cert = file(report, spec.cert.as_deref(), "cert", Pem::Certificate);
    let key = file(report, spec.key.as_deref(), "key", Pem::PrivateKey);
    let identity = match (cert, key) {
        (Field::Ok(c), Field::Ok(k)) => Some(Some((c, k))),
        (Field::Absent, Field::Absent) => Some(None),
        (Field::Ok(_), Field::Absent) | (Field::Absent, Field::Ok(_)) => {
            let message = "tls.cert and tls.key go together".to_owned();
            let hint = Some("set both for a client certificate, or neither".to_owned());
            it.err(report, "tls", message, hint);
            None
        }
        _ => None,
    };
    let server_name = leaf(
        it,
        report,
        spec.server_name.as_deref(),
        "tls.server_name",
        |v| {
            let ok = !v.is_empty()
                && v.len() <= 253
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c));
            if ok {
                Ok(v.to_owned())
            } else {
                Err((
                    format!("{v:?} is not a DNS name"),
                    Some(
                        "the name etcd's server certificate carries, such as etcd.example"
                            .to_owned(),
                    ),
                ))
            }
        },
    );
    let server_name = match server_name {
        Field::Ok(n) => Some(Some(n)),
        Field::Absent => Some(None),
        Field::Bad => None,
    };
    match (ca, identity, server_name) {
        (Some(ca), Some(identity), Some(server_name)) => Field::Ok(FleetTls {
            ca,
            identity,
            server_name,
        }),
        _ => Field::Bad,
    }
}

/// What a PEM file must hold.
#[derive(Clone, Copy)]
enum Pem {
    Certificate,
    PrivateKey,
}

/// An absolute path to a readable PEM file holding `kind`.
fn pem_file(v: &str, kind: Pem) -> Result<PathBuf, Bad> {
    let path = Path::new(v);
    if !path.is_absolute() {
        return Err((
            format!("{v:?} is not an absolute path"),
            Some("such as /etc/switchyard/etcd/ca.pem".to_owned()),
        ));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| (format!("{v} cannot be read: {e}"), None))?;
    let (ok, what) = match kind {
        Pem::Certificate => (
            text.contains("-----BEGIN CERTIFICATE-----"),
            "a PEM certificate",
        ),
        Pem::PrivateKey => (
            text.lines()
                .any(|l| l.starts_with("-----BEGIN ") && l.ends_with("PRIVATE KEY-----")),
            "PEM private key",
        ),
    };
    if ok {
        Ok(path.to_path_buf())
    } else {
        Err((format!("{v} holds no {what}"), None))
    }
}

/// `endpoints`: required, at least one, no duplicates, each `HOST:PORT`, `http://HOST:PORT` or
/// `https://HOST:PORT`. `tls`: whether `fleet.tls` is set (`None`: it is broken), which
/// decides the scheme a bare `HOST:PORT` takes and which one an endpoint must have.
fn endpoints(it: &Item<FleetSpec>, report: &mut Report, tls: Option<bool>) -> Option<Vec<String>> {
    if it.is_broken("endpoints") {
        return None;
    }
    let Some(list) = &it.spec.endpoints else {
        super::missing(it, report, "", "endpoints");
        return None;
    };
    if list.is_empty() {
        let message = "endpoints must list at least one etcd endpoint".to_owned();
        let hint = Some("such as [\"198.18.0.1:2379\"]".to_owned());
        it.err(report, "endpoints", message, hint);
        return None;
    }
    let mut ok = true;
    let mut read: Vec<String> = Vec::new();
    for (i, text) in list.iter().enumerate() {
        let rel = index_path("endpoints", i);
        match leaf(it, report, Some(text), &rel, |s| endpoint(s, tls)) {
            Field::Ok(e) if read.contains(&e) => {
                let message = format!("{text:?} is listed twice");
                it.err(report, &rel, message, None);
                ok = false;
            }
            Field::Ok(e) => read.push(e),
            _ => ok = false,
        }
    }
    ok.then_some(read)
}

/// One endpoint, `[SCHEME://]HOST:PORT`, as a URL: `https://` with TLS, `http://` without
/// (`tls: None`: TLS is broken, either scheme passes).
fn endpoint(s: &str, tls: Option<bool>) -> Result<String, Bad> {
    let hint = || {
        Some(
            "write HOST:PORT (or http:// or https:// before it), such as 198.18.0.1:2379"
                .to_owned(),
        )
    };
    let (scheme, rest) = match s.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (Some(scheme), rest),
        Some((other, _)) => {
            return Err((format!("{s:?}: {other}:// is not an etcd scheme"), hint()));
        }
        None => (None, s),
    };
    if rest.contains('/') {
        return Err((
            format!("{s:?}: an etcd endpoint has no path"),
            Some(format!("write {}", rest.split('/').next().unwrap_or(rest))),
        ));
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err((format!("{s:?} has no port"), hint()));
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_[]:".contains(c));
    if !host_ok {
        return Err((format!("{s:?}: {host:?} is not a host"), hint()));
    }
    values::port(port).map_err(|(m, _)| (format!("{s:?}: {m}"), hint()))?;
    match (scheme, tls) {
        (Some("https"), Some(false)) => Err((
            format!("{s:?}: https:// needs fleet.tls"),
            Some("set fleet.tls.ca to the CA that signed etcd's certificate".to_owned()),
        )),
        (Some("http"), Some(true)) => Err((
            format!("{s:?}: http:// with fleet.tls set"),
            Some("every endpoint uses TLS when fleet.tls is set: write https://".to_owned()),
        )),
        (Some(_), _) => Ok(s.to_owned()),
        (None, tls) => Ok(format!(
            "{}://{rest}",
            if tls == Some(true) { "https" } else { "http" }
        )),
    }
}

/// A node name: 1 to 63 letters, digits, `.`, `_` or `-` (it is part of etcd keys).
fn node_name(s: &str) -> Result<String, Bad> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c));
    if ok {
        Ok(s.to_owned())
    } else {
        Err((
            format!("{s:?} is not a node name"),
            Some("1 to 63 letters, digits, '.', '_' or '-'".to_owned()),
        ))
    }
}

/// The key prefix: starts with `/`, does not end with one, no spaces or control characters.
fn prefix(s: &str) -> Result<String, Bad> {
    let ok = s.starts_with('/')
        && s.len() > 1
        && !s.ends_with('/')
        && !s.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(s.to_owned())
    } else {
        Err((
            format!("{s:?} is not a key prefix"),
            Some(format!(
                "start with '/', no trailing '/', no spaces, such as {DEFAULT_FLEET_PREFIX}"
            )),
        ))
    }
}

/// The host name, when it is a valid node name.
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    node_name(name.trim()).ok()
}
