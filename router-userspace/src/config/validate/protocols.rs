//! The keys of the `dns`, `udp`, `tls` and `https` probes, shared by pools' health checks and
//! state probes. A pool's probe names a `port` on each backend; a state probe names the one
//! `address` (`IP:port`) it probes. Everything else is spelled the same in both.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
};

use super::{Field, leaf, pool::http_path, required};
use crate::config::{
    model::{CheckKind, DEFAULT_HTTP_PATH, DNS_RECORD_TYPES, TlsOptions},
    report::{Item, Report, key_path},
    spec::{DnsCheckSpec, HttpsCheckSpec, TlsCheckSpec, UdpCheckSpec},
    values::{self, Bad, suggest},
};

/// Default port of a `dns` probe.
pub(in crate::config) const DNS_PORT: u16 = 53;
/// Default port of an `https` probe.
pub(in crate::config) const HTTPS_PORT: u16 = 443;

/// Where a probe goes: `port` on each backend (`pool`), or the one `address` of a state probe.
/// `default` is the port taken when none is written. `None` when reported wrong.
pub(in crate::config) fn target<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    port: Option<&str>,
    address: Option<&str>,
    pool: bool,
    default: Option<u16>,
) -> Option<(Option<IpAddr>, u16)> {
    if pool {
        if address.is_some() {
            let message =
                "a pool's check probes each backend: give a port, not an address".to_owned();
            it.err(report, &key_path(rel, "address"), message, None);
            return None;
        }
        let port = match default {
            Some(d) => leaf(it, report, port, &key_path(rel, "port"), values::port).or(d)?,
            None => required(it, report, port, rel, "port", values::port)?,
        };
        return Some((None, port));
    }
    if port.is_some() {
        let message = "a state probe names its address and port in address".to_owned();
        let hint = Some("such as address: \"198.18.1.53:53\"".to_owned());
        it.err(report, &key_path(rel, "port"), message, hint);
        return None;
    }
    let sa = required(it, report, address, rel, "address", |s| {
        socket_address(s, default)
    })?;
    Some((Some(sa.ip()), sa.port()))
}

/// `IP:port` or `[IPv6]:port`; a bare IP takes `default` when there is one.
fn socket_address(s: &str, default: Option<u16>) -> Result<SocketAddr, Bad> {
    if let (Some(port), Ok(ip)) = (default, s.parse::<IpAddr>()) {
        values::address(&ip.to_string())?;
        return Ok(SocketAddr::new(ip, port));
    }
    let sa: SocketAddr = s.parse().map_err(|_| {
        (
            format!("{s:?} is not an address and port"),
            Some("write IP:port, such as 198.18.1.53:53 or [2001:db8::53]:53".to_owned()),
        )
    })?;
    values::address(&sa.ip().to_string())?;
    values::port(&sa.port().to_string())?;
    Ok(sa)
}

/// `dns: { query, record, expect }` (the port or address already read).
pub(in crate::config) fn dns<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    d: &DnsCheckSpec,
    port: Option<u16>,
) -> Option<CheckKind> {
    let query = required(it, report, d.query.as_deref(), rel, "query", dns_name);
    let record = leaf(
        it,
        report,
        d.record.as_deref(),
        &key_path(rel, "record"),
        record_type,
    )
    .or("A".to_owned());
    let expect_rel = key_path(rel, "expect");
    let expect = match (&record, &d.expect) {
        _ if it.is_broken(&expect_rel) => None,
        (_, None) => Some(Vec::new()),
        (None, Some(_)) => None,
        (Some(record), Some(values)) => {
            let mut out = Some(Vec::new());
            for (i, v) in values.iter().enumerate() {
                let at = format!("{expect_rel}[{i}]");
                match leaf(it, report, Some(v), &at, |v| record_value(record, v)) {
                    Field::Ok(v) => {
                        if let Some(out) = &mut out {
                            out.push(v);
                        }
                    }
                    _ => out = None,
                }
            }
            out
        }
    };
    Some(CheckKind::Dns {
        port: port?,
        query: query?,
        record: record?,
        expect: expect?,
    })
}

/// A name to ask for: what a DNS message can carry.
fn dns_name(s: &str) -> Result<String, Bad> {
    let hint = || Some("such as example.org".to_owned());
    if s.trim().is_empty() {
        return Err(("query must name a domain".to_owned(), hint()));
    }
    hickory_proto::rr::Name::from_ascii(s)
        .map(|_| s.to_owned())
        .map_err(|e| (format!("{s:?} is not a domain name: {e}"), hint()))
}

/// One of [`DNS_RECORD_TYPES`], in any case; kept upper case.
fn record_type(s: &str) -> Result<String, Bad> {
    let upper = s.to_ascii_uppercase();
    if DNS_RECORD_TYPES.contains(&upper.as_str()) {
        Ok(upper)
    } else {
        Err((
            format!("unknown record type {s:?}"),
            suggest(s, DNS_RECORD_TYPES),
        ))
    }
}

/// An expected value of a `record` record: an address of the record's family for A and AAAA
/// (kept canonical, as answers are written), any non-empty text otherwise.
fn record_value(record: &str, s: &str) -> Result<String, Bad> {
    let bad = |family: &str| {
        (
            format!("{s:?} is not an {family} address, which {record} records hold"),
            None,
        )
    };
    match record {
        "A" => s
            .parse::<Ipv4Addr>()
            .map(|a| a.to_string())
            .map_err(|_| bad("IPv4")),
        "AAAA" => s
            .parse::<Ipv6Addr>()
            .map(|a| a.to_string())
            .map_err(|_| bad("IPv6")),
        _ if s.trim().is_empty() => Err(("an expected value must not be empty".to_owned(), None)),
        _ => Ok(s.to_owned()),
    }
}

/// `udp: { send | send_hex, expect | expect_hex }` (the port or address already read).
pub(in crate::config) fn udp<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    u: &UdpCheckSpec,
    port: Option<u16>,
) -> Option<CheckKind> {
    let send = bytes(
        it,
        report,
        rel,
        ("send", u.send.as_deref()),
        ("send_hex", u.send_hex.as_deref()),
    );
    let send = match send {
        Field::Ok(send) => Some(send),
        Field::Bad => None,
        Field::Absent => {
            let message = "udp needs send or send_hex: the datagram to send".to_owned();
            let hint = Some("such as send: \"ping\" or send_hex: \"0001\"".to_owned());
            it.err(report, rel, message, hint);
            None
        }
    };
    let expect = bytes(
        it,
        report,
        rel,
        ("expect", u.expect.as_deref()),
        ("expect_hex", u.expect_hex.as_deref()),
    );
    let expect = match expect {
        Field::Ok(expect) => Some(Some(expect)),
        Field::Bad => None,
        Field::Absent => Some(None),
    };
    Some(CheckKind::Udp {
        port: port?,
        send: send?,
        expect: expect?,
    })
}

/// Bytes written as text under one key or as hex under another, not both.
fn bytes<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    (text_key, text): (&str, Option<&str>),
    (hex_key, hex): (&str, Option<&str>),
) -> Field<Vec<u8>> {
    match (text, hex) {
        (Some(_), Some(_)) => {
            let message = format!("give {text_key} or {hex_key}, not both");
            it.err(report, &key_path(rel, hex_key), message, None);
            Field::Bad
        }
        (Some(text), None) => leaf(it, report, Some(text), &key_path(rel, text_key), |t| {
            Ok(t.as_bytes().to_vec())
        }),
        (None, Some(hex)) => leaf(it, report, Some(hex), &key_path(rel, hex_key), hex_bytes),
        (None, None) => {
            let broken =
                it.is_broken(&key_path(rel, text_key)) || it.is_broken(&key_path(rel, hex_key));
            if broken { Field::Bad } else { Field::Absent }
        }
    }
}

/// Hex digits, two per byte; spaces between bytes are allowed (`"de ad be ef"`).
fn hex_bytes(s: &str) -> Result<Vec<u8>, Bad> {
    let digits: Vec<char> = s.chars().filter(|c| *c != ' ').collect();
    let hint = || Some("two hex digits per byte, such as \"0a1b2c\"".to_owned());
    if !digits.len().is_multiple_of(2) {
        return Err((format!("{s:?} has an odd number of hex digits"), hint()));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let text: String = pair.iter().collect();
            u8::from_str_radix(&text, 16)
                .map_err(|_| (format!("{s:?} is not hex: {text:?}"), hint()))
        })
        .collect()
}

/// `tls: { sni, verify, ca }` (the port or address already read).
pub(in crate::config) fn tls<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    t: &TlsCheckSpec,
    port: Option<u16>,
) -> Option<CheckKind> {
    let tls = tls_options(
        it,
        report,
        rel,
        t.sni.as_deref(),
        t.verify.as_deref(),
        t.ca.as_deref(),
    );
    Some(CheckKind::Tls {
        port: port?,
        tls: tls?,
    })
}

/// `https: { port, path, expect, sni, verify, ca }` of a pool's check.
pub(in crate::config) fn https<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    h: &HttpsCheckSpec,
) -> Option<CheckKind> {
    let port = leaf(
        it,
        report,
        h.port.as_deref(),
        &key_path(rel, "port"),
        values::port,
    )
    .or(HTTPS_PORT);
    let path = leaf(
        it,
        report,
        h.path.as_deref(),
        &key_path(rel, "path"),
        http_path,
    )
    .or(DEFAULT_HTTP_PATH.to_owned());
    let expect_rel = key_path(rel, "expect");
    let expect = super::pool::expect_codes(it, report, &expect_rel, h.expect.as_deref());
    let tls = tls_options(
        it,
        report,
        rel,
        h.sni.as_deref(),
        h.verify.as_deref(),
        h.ca.as_deref(),
    );
    Some(CheckKind::Https {
        port: port?,
        path: path?,
        expect: expect?,
        tls: tls?,
    })
}

/// `sni`, `verify` (default true) and `ca` under `rel`.
pub(in crate::config) fn tls_options<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    sni: Option<&str>,
    verify: Option<&str>,
    ca: Option<&str>,
) -> Option<TlsOptions> {
    let sni = match leaf(it, report, sni, &key_path(rel, "sni"), server_name) {
        Field::Ok(s) => Some(Some(s)),
        Field::Absent => Some(None),
        Field::Bad => None,
    };
    let verify = leaf(it, report, verify, &key_path(rel, "verify"), |v| match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err((format!("verify is true or false, not {v:?}"), None)),
    })
    .or(true);
    let ca = match leaf(it, report, ca, &key_path(rel, "ca"), ca_path) {
        Field::Ok(p) => Some(Some(p)),
        Field::Absent => Some(None),
        Field::Bad => None,
    };
    Some(TlsOptions {
        sni: sni?,
        verify: verify?,
        ca: ca?,
    })
}

/// A DNS name a TLS client can send and check. Not an address: without `sni` the backend's
/// address is what the certificate must name, and an https request's URL names its host by
/// `sni`, which the client resolves to the backend.
fn server_name(s: &str) -> Result<String, Bad> {
    let hint = || Some("such as api.example.org".to_owned());
    if s.parse::<IpAddr>().is_ok() {
        let message = format!("sni names a host, not an address ({s:?})");
        return Err((
            message,
            Some("leave sni out to check the certificate against the address".to_owned()),
        ));
    }
    match rustls::pki_types::ServerName::try_from(s) {
        Ok(rustls::pki_types::ServerName::DnsName(_)) => Ok(s.to_owned()),
        _ => Err((format!("{s:?} is not a server name"), hint())),
    }
}

/// An absolute path (the agent's working directory is no place for trust anchors). Whether the
/// file holds certificates is known when the probe is prepared; a probe of a check whose file
/// cannot be read fails with the reason.
fn ca_path(s: &str) -> Result<PathBuf, Bad> {
    let path = PathBuf::from(s);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err((
            format!("ca must be an absolute path, not {s:?}"),
            Some("such as /etc/switchyard/ca.pem".to_owned()),
        ))
    }
}
