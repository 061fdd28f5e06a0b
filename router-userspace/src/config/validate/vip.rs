//! Checking `vips:`: each entry on its own (address, echo, host ports), then against the whole
//! configuration (one entry per address, the address a service's vip, no host port that is a
//! service's).

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use super::{Field, ServiceDraft, leaf, required};
use crate::config::{
    load::Parsed,
    model::{MAX_HOST_PORTS, Protocol, Vip},
    report::{Item, Report, index_path},
    spec::VipSpec,
    values::{self, Bad},
};

/// A host port: `(protocol, port)`.
type HostPort = (Protocol, u16);

/// What could be read of one `vips[]` entry.
pub(super) struct Draft {
    /// Its address.
    address: Option<IpAddr>,
    /// `(index, host port)` of each host port read, a repeated one once.
    host_ports: Vec<(usize, HostPort)>,
    /// The entry, when every key of it is right.
    pub value: Option<Vip>,
}

pub(super) fn entry(it: &Item<VipSpec>, report: &mut Report) -> Draft {
    let s = &it.spec;
    let address = required(
        it,
        report,
        s.address.as_deref(),
        "",
        "address",
        values::address,
    );
    let quoted = it.quoted.iter().any(|q| q == "echo");
    let echo = leaf(it, report, s.echo.as_deref(), "echo", |v| {
        boolean(v, "echo", quoted)
    })
    .or(true);
    let (ok, read) = host_ports(it, report);
    let rate = leaf(
        it,
        report,
        s.new_flows_per_second.as_deref(),
        "new_flows_per_second",
        |v| values::number(v, "new_flows_per_second", 1, 100_000_000).map(Some),
    );
    let value = (|| {
        Some(Vip {
            address: address?,
            echo: echo?,
            host_ports: ok.then(|| read.iter().map(|&(_, h)| h).collect())?,
            new_flows_per_second: rate.or(None)?,
        })
    })();
    Draft {
        address,
        host_ports: read,
        value,
    }
}

/// `host_ports`: at most [`MAX_HOST_PORTS`] different `tcp/PORT` or `udp/PORT` (default none).
/// Whether all is right, and `(index, host port)` of each one read (a repeated one once).
fn host_ports(it: &Item<VipSpec>, report: &mut Report) -> (bool, Vec<(usize, HostPort)>) {
    let mut read: Vec<(usize, HostPort)> = Vec::new();
    let list = match &it.spec.host_ports {
        _ if it.is_broken("host_ports") => return (false, read),
        None => return (true, read),
        Some(list) => list,
    };
    let mut ok = true;
    if list.len() > MAX_HOST_PORTS {
        let message = format!(
            "too many host ports: {}, a virtual IP passes at most {MAX_HOST_PORTS} to the host",
            list.len()
        );
        let hint = Some("VIP_HOST_PORTS in router-common".to_owned());
        it.err(report, "host_ports", message, hint);
        ok = false;
    }
    for (i, text) in list.iter().enumerate() {
        let rel = index_path("host_ports", i);
        let Field::Ok((protocol, port)) = leaf(it, report, Some(text), &rel, host_port) else {
            ok = false;
            continue;
        };
        if let Some(&(first, _)) = read.iter().find(|&&(_, h)| h == (protocol, port)) {
            let first = index_path("host_ports", first);
            let hint = format!("first listed at {}", it.location(report, &first));
            let message = format!("duplicate host port {}/{port}", word(protocol));
            it.err(report, &rel, message, Some(hint));
            ok = false;
        } else {
            read.push((i, (protocol, port)));
        }
    }
    (ok, read)
}

/// A host port: `tcp/PORT` or `udp/PORT`, the port 1–65535.
fn host_port(s: &str) -> Result<HostPort, Bad> {
    let Some((protocol, port)) = s.split_once('/') else {
        return Err((
            format!("{s:?} is not a host port"),
            Some("write tcp/PORT or udp/PORT, such as tcp/22".to_owned()),
        ));
    };
    let protocols = [("tcp", Protocol::Tcp), ("udp", Protocol::Udp)];
    let protocol = values::choice(protocol, "protocol", &protocols, &[])?;
    Ok((protocol, values::port(port)?))
}

fn word(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

/// `true` or `false`, unquoted (`"false"` is text); `what` names the key.
fn boolean(s: &str, what: &str, quoted: bool) -> Result<bool, Bad> {
    match s {
        "true" if !quoted => Ok(true),
        "false" if !quoted => Ok(false),
        _ if quoted => Err((
            format!("{what} must be true or false, not the string {s:?}"),
            Some("write it without quotes".to_owned()),
        )),
        _ => Err((format!("{what} must be true or false, not {s:?}"), None)),
    }
}

/// Checks the entries together and against the services: one entry per address, each address
/// the vip of a service, and no host port that is a service's `(protocol, port)` on it.
pub(super) fn check(
    parsed: &Parsed,
    drafts: &[Draft],
    services: &[ServiceDraft],
    report: &mut Report,
) {
    // A service whose vip could not be read (already reported) may be the one an entry names.
    let every_vip_read = services.iter().all(|s| s.vip.is_some());
    let vips: HashSet<IpAddr> = services.iter().filter_map(|s| s.vip).collect();
    let unparsed_hint = super::unparsed_hint(parsed, report, "it may be the vip of a service in");
    let mut seen: HashMap<IpAddr, usize> = HashMap::new();
    for (i, (it, draft)) in parsed.vips.iter().zip(drafts).enumerate() {
        let Some(address) = draft.address else {
            continue;
        };
        if let Some(first) = seen.get(&address).and_then(|&j| parsed.vips.get(j)) {
            let hint = format!(
                "first listed at {}; give each address one entry",
                first.location(report, "address")
            );
            let message = format!("duplicate vips address {address}");
            it.err(report, "address", message, Some(hint));
            continue;
        }
        seen.insert(address, i);
        if !vips.contains(&address) {
            if every_vip_read {
                let message = format!("{address} is no service's vip");
                let hint = unparsed_hint.clone().or_else(|| {
                    Some(
                        "an entry changes how the vip of one or more services is handled; add \
                         the service, or remove the entry"
                            .to_owned(),
                    )
                });
                it.err(report, "address", message, hint);
            }
            continue;
        }
        for &(h, (protocol, port)) in &draft.host_ports {
            let clash = services.iter().enumerate().find(|(_, s)| {
                s.vip == Some(address) && s.protocol == Some(protocol) && s.port == Some(port)
            });
            let Some((s, service)) = clash else {
                continue;
            };
            let name = service.name.as_deref().unwrap_or("?");
            let at = parsed
                .services
                .get(s)
                .map(|x| x.location(report, "port"))
                .unwrap_or_default();
            let message = format!(
                "{}/{port} on {address} is the port of service {name:?} ({at})",
                word(protocol)
            );
            let hint = Some(
                "that traffic belongs to the service; pass only other ports to the host".to_owned(),
            );
            it.err(report, &index_path("host_ports", h), message, hint);
        }
    }
}
