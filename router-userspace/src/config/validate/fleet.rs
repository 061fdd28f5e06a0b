//! `fleet:`: the node's name, the etcd endpoints, the key prefix, the lease TTL and the
//! timeouts.

use super::{Field, leaf};
use crate::config::{
    model::{
        DEFAULT_DIAL_TIMEOUT, DEFAULT_FLEET_PREFIX, DEFAULT_LEASE_TTL, DEFAULT_REQUEST_TIMEOUT,
        FLEET_TIMEOUT_RANGE, Fleet, LEASE_TTL_RANGE,
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
    let endpoints = endpoints(it, report);
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
    })
}

/// `endpoints`: required, at least one, each `HOST:PORT` or `http://HOST:PORT`.
fn endpoints(it: &Item<FleetSpec>, report: &mut Report) -> Option<Vec<String>> {
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
    let mut read = Vec::new();
    for (i, text) in list.iter().enumerate() {
        let rel = index_path("endpoints", i);
        match leaf(it, report, Some(text), &rel, endpoint) {
            Field::Ok(e) => read.push(e),
            _ => ok = false,
        }
    }
    ok.then_some(read)
}

/// One endpoint: `HOST:PORT` or `http://HOST:PORT` (TLS is not supported).
fn endpoint(s: &str) -> Result<String, Bad> {
    let hint = || Some("write HOST:PORT or http://HOST:PORT, such as 198.18.0.1:2379".to_owned());
    if s.starts_with("https://") {
        return Err((
            format!("{s:?}: TLS to etcd is not supported"),
            Some("use http:// on a network only the balancers reach".to_owned()),
        ));
    }
    let rest = s.strip_prefix("http://").unwrap_or(s);
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err((format!("{s:?} is not an etcd endpoint"), hint()));
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_[]:".contains(c));
    if !host_ok {
        return Err((format!("{s:?} is not an etcd endpoint"), hint()));
    }
    values::port(port).map_err(|(m, _)| (format!("{s:?}: {m}"), hint()))?;
    Ok(if s.starts_with("http://") {
        s.to_owned()
    } else {
        format!("http://{s}")
    })
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
